"""The public namespaces mirror TensorFlow's: same names, where TF has them."""

import inspect

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
import strategies

TOP_LEVEL = [
    "Strategy", "StrategyExtended", "MirroredStrategy", "OneDeviceStrategy",
    "ReduceOp", "ReplicaContext", "RunOptions", "InputReplicationMode",
    "DistributedValues", "CrossDeviceOps", "ReductionToOneDevice",
    "HierarchicalCopyAllReduce", "NcclAllReduce", "get_strategy",
    "has_strategy", "get_replica_context", "in_cross_replica_context",
    "experimental_set_strategy", "InputContext", "InputOptions",
    "DistributedDataset", "DistributedIterator", "MultiWorkerMirroredStrategy",
    "Server", "TPUStrategy", "ParameterServerStrategy"]
EXPERIMENTAL = ["ValueContext", "CommunicationOptions",
                "CommunicationImplementation", "CollectiveCommunication",
                "CollectiveHints", "CentralStorageStrategy",
                "MultiWorkerMirroredStrategy", "TPUStrategy",
                "ParameterServerStrategy", "PreemptionCheckpointHandler",
                "PreemptionWatcher", "TerminationConfig"]
COORDINATOR = ["ClusterCoordinator", "PerWorkerValue", "RemoteValue",
               "experimental_get_current_worker_index"]
EXPERIMENTAL_COORDINATOR = ["ClusterCoordinator", "PerWorkerValues", "RemoteValue"]
RPC = ["Server", "Client"]
PARTITIONERS = ["Partitioner", "FixedShardsPartitioner", "MinSizePartitioner",
                "MaxSizePartitioner"]
COMPAT_V1_EXPERIMENTAL = ["CommunicationOptions", "CommunicationImplementation",
                          "CollectiveCommunication", "CollectiveHints",
                          "CentralStorageStrategy", "MultiWorkerMirroredStrategy",
                          "TPUStrategy", "ParameterServerStrategy"]
COMPAT_V1 = [
    "MirroredStrategy", "OneDeviceStrategy", "Strategy", "StrategyExtended",
    "ReplicaContext", "ReduceOp", "RunOptions", "InputReplicationMode",
    "CrossDeviceOps", "ReductionToOneDevice", "HierarchicalCopyAllReduce",
    "NcclAllReduce", "get_strategy", "has_strategy", "get_replica_context",
    "in_cross_replica_context", "experimental_set_strategy", "InputContext", "Server"]

CLUSTER_RESOLVER = [
    "ClusterResolver", "SimpleClusterResolver", "UnionResolver",
    "TFConfigClusterResolver", "SlurmClusterResolver", "KubernetesClusterResolver",
    "KubernetesExecutableLocation", "GCEClusterResolver", "TPUClusterResolver"]
TPU_EXPERIMENTAL = ["initialize_tpu_system", "shutdown_tpu_system", "Topology",
                    "DeviceAssignment", "TPUSystemMetadata", "HardwareFeature",
                    "DeviceOrderMode"]
TPU = ["XLAOptions"]

NAMESPACES = [
    (tfd, tf.distribute, TOP_LEVEL),
    (tfd.experimental, tf.distribute.experimental, EXPERIMENTAL),
    (tfd.compat.v1, tf.compat.v1.distribute, COMPAT_V1),
    (tfd.experimental.partitioners, tf.distribute.experimental.partitioners,
     PARTITIONERS),
    (tfd.compat.v1.experimental, tf.compat.v1.distribute.experimental,
     COMPAT_V1_EXPERIMENTAL),
    (tfd.cluster_resolver, tf.distribute.cluster_resolver, CLUSTER_RESOLVER),
    (tfd.compat.v1.cluster_resolver, tf.compat.v1.distribute.cluster_resolver,
     CLUSTER_RESOLVER),
    (tfd.tpu.experimental, tf.tpu.experimental, TPU_EXPERIMENTAL),
    (tfd.tpu, tf.tpu, TPU),
    (tfd.coordinator, tf.distribute.coordinator, COORDINATOR),
    (tfd.experimental.coordinator, tf.distribute.experimental.coordinator,
     EXPERIMENTAL_COORDINATOR),
    (tfd.experimental.rpc, tf.distribute.experimental.rpc, RPC),
]


def _public_names(namespace):
  return sorted(name for name in dir(namespace) if not name.startswith("_"))


@pytest.mark.parametrize("ours, theirs", [
    (tfd.cluster_resolver, tf.distribute.cluster_resolver),
    (tfd.compat.v1.cluster_resolver, tf.compat.v1.distribute.cluster_resolver),
    (tfd.tpu, tf.tpu),
    (tfd.tpu.experimental, tf.tpu.experimental),
    (tfd.coordinator, tf.distribute.coordinator),
    (tfd.experimental.coordinator, tf.distribute.experimental.coordinator),
    (tfd.experimental.rpc, tf.distribute.experimental.rpc)],
                         ids=["cluster_resolver", "compat.v1.cluster_resolver", "tpu",
                              "tpu.experimental", "coordinator", "experimental.coordinator",
                              "experimental.rpc"])
def test_namespace_has_exactly_tensorflows_names(ours, theirs):
  assert _public_names(ours) == _public_names(theirs)


def test_tpu_names_we_do_not_rewrite_are_tensorflows():
  assert tfd.tpu.XLAOptions is tf.tpu.XLAOptions
  assert tfd.tpu.experimental.HardwareFeature is tf.tpu.experimental.HardwareFeature
  assert tfd.tpu.experimental.DeviceOrderMode is tf.tpu.experimental.DeviceOrderMode
  assert tfd.tpu.experimental.embedding.TPUEmbedding is (
      tf.tpu.experimental.embedding.TPUEmbedding)


def test_cluster_resolver_modules_stay_importable_by_their_full_names():
  from tf_distribute_lite.cluster_resolver import tpu_cluster_resolver  # pylint: disable=g-import-not-at-top
  assert tpu_cluster_resolver.__name__ == "tf_distribute_lite.cluster_resolver.tpu_cluster_resolver"
  assert "tpu_cluster_resolver" not in dir(tfd.cluster_resolver)


@pytest.mark.parametrize("ours, theirs, name", [
    (ours, theirs, name) for ours, theirs, names in NAMESPACES for name in names])
def test_name_exists_like_tensorflows(ours, theirs, name):
  assert hasattr(theirs, name), f"TensorFlow has no {theirs.__name__}.{name}"
  ours_obj, theirs_obj = getattr(ours, name), getattr(theirs, name)
  assert inspect.isclass(ours_obj) == inspect.isclass(theirs_obj)
  assert callable(ours_obj)


def _public_names(module):
  return {name for name in dir(module)
          if not name.startswith("_") and getattr(module, name) is not tf}


@pytest.mark.parametrize("ours, theirs", [
    (tfd.compat.v1, tf.compat.v1.distribute),
    (tfd.compat.v1.experimental, tf.compat.v1.distribute.experimental),
], ids=["compat.v1", "compat.v1.experimental"])
def test_compat_v1_has_tensorflows_names_and_no_others(ours, theirs):
  assert _public_names(ours) == _public_names(theirs)


def test_experimental_has_every_name_of_tensorflows():
  assert _public_names(tf.distribute.experimental) <= _public_names(tfd.experimental)
  assert inspect.ismodule(tfd.experimental.rpc)


@pytest.mark.parametrize("name", ["run", "reduce", "scope", "gather",
                                  "experimental_local_results",
                                  "experimental_distribute_values_from_function",
                                  "experimental_distribute_dataset",
                                  "distribute_datasets_from_function",
                                  "experimental_distribute_datasets_from_function"])
def test_strategy_method_signatures_match(name):
  ours = inspect.signature(getattr(tfd.Strategy, name))
  theirs = inspect.signature(getattr(tf.distribute.Strategy, name))
  assert list(ours.parameters) == list(theirs.parameters)
  assert [p.default for p in ours.parameters.values()] == [
      p.default for p in theirs.parameters.values()]


def test_v1_reduce_defaults_axis_to_none():
  signature = inspect.signature(tfd.compat.v1.Strategy.reduce)
  assert signature.parameters["axis"].default is None


def test_enum_values_match():
  assert [m.value for m in tfd.ReduceOp] == [m.value for m in tf.distribute.ReduceOp]
  assert [m.value for m in tfd.InputReplicationMode] == [
      m.value for m in tf.distribute.InputReplicationMode]
  assert [m.value for m in tfd.experimental.CommunicationImplementation] == [
      m.value for m in tf.distribute.experimental.CommunicationImplementation]


def test_v1_make_numpy_dataset_signature_matches():
  ours = inspect.signature(tfd.compat.v1.Strategy.experimental_make_numpy_dataset)
  theirs = inspect.signature(
      tf.compat.v1.distribute.Strategy.experimental_make_numpy_dataset)
  assert list(ours.parameters) == list(theirs.parameters)


@pytest.mark.parametrize("ours, theirs", [
    (tfd.DistributedDataset, tf.distribute.DistributedDataset),
    (tfd.DistributedIterator, tf.distribute.DistributedIterator)])
def test_input_classes_subclass_tensorflow_interfaces(ours, theirs):
  assert issubclass(ours, theirs)


def test_partitioners_is_a_module_as_in_tensorflow():
  assert inspect.ismodule(tf.distribute.experimental.partitioners)
  assert inspect.ismodule(tfd.experimental.partitioners)
  assert tfd.experimental.partitioners.__name__ == (
      "tf_distribute_lite.experimental.partitioners")


def test_parameter_server_names_are_tensorflows():
  assert tfd.ParameterServerStrategy is tfd.experimental.ParameterServerStrategy
  assert tfd.ParameterServerStrategy.__name__ == tf.distribute.ParameterServerStrategy.__name__
  assert tfd.coordinator.PerWorkerValue is tfd.experimental.coordinator.PerWorkerValues


@pytest.mark.parametrize("name", ["MultiWorkerMirroredStrategy", "TPUStrategy"])
def test_strategy_classes_carry_tensorflows_class_names(name):
  """`type(strategy).__name__` prints TF's CollectiveAllReduceStrategy and
  TPUStrategyV2, in the experimental and compat.v1 namespaces too."""
  for ours, theirs in [(tfd, tf.distribute),
                       (tfd.experimental, tf.distribute.experimental),
                       (tfd.compat.v1.experimental, tf.compat.v1.distribute.experimental)]:
    assert getattr(ours, name).__name__ == getattr(theirs, name).__name__
  assert tfd.MultiWorkerMirroredStrategy.__name__ == "CollectiveAllReduceStrategy"
  assert tfd.TPUStrategy.__name__ == "TPUStrategyV2"


def _type_names(strategy):
  """Class names of the strategy, its extended and its replica context."""
  seen = []
  strategy.run(lambda: seen.append(type(tf.distribute.get_replica_context()).__name__))
  return type(strategy).__name__, type(strategy.extended).__name__, seen[0]


@pytest.mark.parametrize("name", ["mirrored", "one_device", "central_storage", "default"])
def test_strategy_extended_and_replica_context_class_names_are_tensorflows(name):
  oracle.compare(lambda ours: _type_names(strategies.shared(name, ours)), (False,), (True,))
