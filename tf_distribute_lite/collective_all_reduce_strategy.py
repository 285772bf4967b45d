"""`MultiWorkerMirroredStrategy`: `MirroredStrategy` on each worker, its
reductions across workers (`communicator.ClusterCommunicator`)."""

import copy
import functools

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import deprecation
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import executors
from tf_distribute_lite import variable_policy
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite.cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions


class CollectiveAllReduceStrategy(distribute_lib.Strategy,
                                  stands_for=tf.distribute.MultiWorkerMirroredStrategy):
  """Synchronous training on the devices of several machines.

  Args:
    cluster_resolver: the cluster and this task; by default `TF_CONFIG`'s.
    communication_options: `CommunicationOptions` for every reduction (by
      default timing out after `DEFAULT_COLLECTIVE_TIMEOUT_SECONDS`).

  Make it first: it joins the cluster. A worker has a replica per GPU, else one.

  >>> strategy = CollectiveAllReduceStrategy()  # no TF_CONFIG: this machine only
  >>> strategy.num_replicas_in_sync, strategy.extended._in_multi_worker_mode()
  (1, False)
  >>> with strategy.scope():
  ...   v = tf.Variable(2.0)
  >>> strategy.reduce("SUM", strategy.run(lambda: v * 3.0), axis=None)
  <tf.Tensor: shape=(), dtype=float32, numpy=6.0>
  """

  def __init__(self, cluster_resolver=None, communication_options=None):
    super().__init__(CollectiveAllReduceExtended(
        self, cluster_resolver,
        CommunicationOptions() if communication_options is None else communication_options))


class ExperimentalMultiWorkerMirroredStrategy(
    CollectiveAllReduceStrategy, covers_parent=True,
    stands_for=tf.distribute.experimental.MultiWorkerMirroredStrategy):
  """Deprecated `tf.distribute.experimental.MultiWorkerMirroredStrategy`;
  every `MultiWorkerMirroredStrategy` is one to `isinstance`, as in TensorFlow.

  >>> strategy = ExperimentalMultiWorkerMirroredStrategy("RING")
  >>> strategy.extended._communication_options.implementation
  <CommunicationImplementation.RING: 'RING'>
  >>> isinstance(CollectiveAllReduceStrategy(), ExperimentalMultiWorkerMirroredStrategy)
  True
  """

  def __init__(self, communication=CommunicationImplementation.AUTO, cluster_resolver=None):
    deprecation.warn_once(
        "tf.distribute.experimental.MultiWorkerMirroredStrategy",
        "use tf_distribute_lite.MultiWorkerMirroredStrategy instead.")
    super().__init__(cluster_resolver, CommunicationOptions(implementation=communication))


ExperimentalMultiWorkerMirroredStrategy.__name__ = "CollectiveAllReduceStrategy"


class CollectiveAllReduceExtended(mirrored_strategy.MirroredExtended):
  """`strategy.extended` of `MultiWorkerMirroredStrategy`."""

  _between_graph = True

  def __init__(self, container_strategy, cluster_resolver, communication_options):
    if not isinstance(communication_options, CommunicationOptions):
      raise ValueError(
          f"communication_options must be an instance of "
          f"tf.distribute.experimental.CommunicationOptions; got "
          f"{communication_options!r}.")
    self._cluster_resolver = cluster_resolver or TFConfigClusterResolver()
    cluster_resolver_lib.check_resolver(self._cluster_resolver)
    self._communication_options = communication_options
    layout = cluster_runtime.join(self._cluster_resolver)
    if layout.task:  # read by tf_keras (docs/client_private_names.md)
      self._std_server_started = True
    multi_worker = layout.num_workers > 1
    if multi_worker:
      communicator = communicator_lib.ClusterCommunicator(layout, communication_options)
    else:
      communicator = communicator_lib.Communicator(layout, cross_device_ops_lib.CollectiveAllReduce(
          layout.devices, options=communication_options))
    super().__init__(
        container_strategy, layout, communicator,
        variable_policy.MirroredPolicy(container_strategy,
                                       self._chief_value if multi_worker else None),
        executors.LocalReplicas(
            container_strategy, layout.devices,
            functools.partial(_MirroredReplicaContext, first_replica=layout.replica_offset),
            layout.replica_offset, layout.num_replicas))
    self.experimental_enable_get_next_as_optional = True  # also in TF1 graphs
    self._worker_sync = input_lib.WorkerSync(communicator.any_worker) if multi_worker else None

  # Read by tf_keras (docs/client_private_names.md).
  _task_id = property(lambda self: self._layout.task_id)

  def _in_multi_worker_mode(self):
    return self._layout.num_workers > 1

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """`configure` may name the cluster and task joined again, not others."""
    resolver = self._cluster_resolver
    if (cluster_spec.as_dict() != resolver.cluster_spec().as_dict() or
        (task_type, task_id) != (resolver.task_type, resolver.task_id)):
      raise ValueError(
          f"MultiWorkerMirroredStrategy joins its cluster when it is made: "
          f"make it with cluster_resolver=tf.distribute.cluster_resolver."
          f"SimpleClusterResolver(cluster_spec, task_type=..., task_id=...) "
          f"rather than configuring it later. It was made for "
          f"cluster_spec={resolver.cluster_spec().as_dict()}, "
          f"task_type={resolver.task_type!r}, task_id={resolver.task_id!r}; "
          f"got cluster_spec={cluster_spec.as_dict()}, "
          f"task_type={task_type!r}, task_id={task_id!r}.")

  def _update_config_proto(self, config_proto):
    updated = copy.deepcopy(config_proto)
    if not self._layout.task:
      cluster_runtime.configure_collectives(updated)
    else:
      cluster_runtime.configure_collectives(
          updated, self._cluster_resolver.cluster_spec(), self._layout.task_type,
          self._layout.task_id)
    return updated

  def _input_context(self):
    return input_context_lib.InputContext(
        self._layout.num_workers, self._layout.worker_index, self._num_replicas_in_sync)

  def _experimental_distribute_dataset(self, dataset, options):
    input_context_lib.refuse_per_replica(options)
    return input_lib.distribute_dataset(
        dataset, self._devices, self._input_host, options,
        input_context=self._input_context(), workers=self._worker_sync)

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    input_context_lib.refuse_per_replica(options)
    return super()._distribute_datasets_from_function(dataset_fn, options, partial_steps)

  def _chief_value(self, initial_value, dtype):
    """A callable giving the chief's `initial_value` on every worker."""
    def value():
      given = initial_value() if callable(initial_value) else initial_value
      if isinstance(given, _tf_bridge.CheckpointInitialValue):
        given = given.wrapped_value
      return self._communicator.from_chief(tf.convert_to_tensor(given, dtype=dtype))
    return value


class _MirroredReplicaContext(executors._MirroredReplicaContext):  # pylint: disable=protected-access
  """A replica context whose id counts the previous workers' replicas."""

  def __init__(self, strategy, local_replica_id, runner, first_replica):
    super().__init__(strategy, local_replica_id, runner)
    self._first_replica = first_replica

  @property
  def replica_id_in_sync_group(self):
    """This replica's index in the cluster, a scalar int32 tensor."""
    return tf.constant(self._first_replica + self._replica_id, tf.int32,
                       name="replica_id_in_sync_group")

