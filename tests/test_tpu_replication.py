"""TPUStrategy on a real TPU, by the graphs it builds (no TPU needed): the
spec's examples traced for a v3-8 topology, checked for `tpu.replicate`'s
metadata, replicated inputs and outputs, and XLA sharding attributes."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.compiler.xla import xla_data_pb2

import tf_distribute_lite as tfd
from tf_distribute_lite import tpu_emulation
from tf_distribute_lite import tpu_replication

TOPOLOGY = tpu_emulation.PRESETS["v3-8"].topology()


def _tpu_resolver():
  """A resolver of a v3-8 TPU host at a gRPC address (a test double: the
  system metadata a TPU reports)."""
  devices = tuple(tf.config.LogicalDevice(f"/job:worker/replica:0/task:0/device:TPU:{i}", "TPU")
                  for i in range(8))
  return SimpleNamespace(
      emulated_slice=None, master=lambda *args, **kwargs: "grpc://10.0.0.2:8470",
      get_tpu_system_metadata=lambda: tf.tpu.experimental.TPUSystemMetadata(
          8, 1, 8, None, devices))


def _ops(graph, op_type):
  """(op type, attrs) of the graph's ops of `op_type`, in functions too."""
  found = [op.node_def for op in graph.get_operations() if op.type == op_type]
  for function in graph.as_graph_def().library.function:
    found += [node for node in function.node_def if node.op == op_type]
  return found


def _sharding(node):
  return xla_data_pb2.OpSharding.FromString(node.attr["_XlaSharding"].s)


def _metadata(graph):
  (metadata,) = _ops(graph, "TPUReplicateMetadata")
  return metadata.attr


def test_spec_assign_to_logical_device_two_cores_four_replicas():
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      TOPOLOGY, computation_shape=[1, 1, 2], num_replicas=4)
  with tf.Graph().as_default() as graph:
    strategy = tfd.experimental.TPUStrategy(_tpu_resolver(), device_assignment=assignment)
    inputs = strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
        lambda ctx: tf.compat.v1.placeholder(tf.float32, [4]))

    @tf.function()
    def step_fn(inputs):
      output = tf.add(inputs, inputs)
      return strategy.experimental_assign_to_logical_device(output, 0)
    result = strategy.run(step_fn, args=(inputs,))
  assert len(strategy.experimental_local_results(result)) == 4
  metadata = _metadata(graph)
  assert (metadata["num_replicas"].i, metadata["num_cores_per_replica"].i) == (4, 2)
  assert list(metadata["device_assignment"].list.i) == assignment.core_assignment.flatten().tolist()
  assert metadata["topology"].s == TOPOLOGY.serialized()
  (replicated_input,) = _ops(graph, "TPUReplicatedInput")
  assert replicated_input.attr["N"].i == 4
  (replicated_output,) = _ops(graph, "TPUReplicatedOutput")
  assert replicated_output.attr["num_replicas"].i == 4
  (annotation,) = _ops(graph, "XlaSharding")
  sharding = _sharding(annotation)
  assert xla_data_pb2.OpSharding.Type.Name(sharding.type) == "MAXIMAL"
  assert list(sharding.tile_assignment_devices) == [0]


def test_spec_split_to_logical_devices_eight_cores_one_replica():
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      TOPOLOGY, computation_shape=[2, 2, 2], num_replicas=1)
  with tf.Graph().as_default() as graph:
    strategy = tfd.experimental.TPUStrategy(_tpu_resolver(), device_assignment=assignment)
    with strategy.scope():
      kernel = tf.Variable(tf.ones([3, 3, 3, 4]))
    images = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3])
    labels = tf.compat.v1.placeholder(tf.int32, [2])

    def step_fn(inputs):
      images, labels = inputs
      images = strategy.experimental_split_to_logical_devices(images, [1, 2, 4, 1])
      output = tf.reduce_mean(tf.nn.conv2d(images, kernel, 1, "SAME"), axis=[1, 2])
      labels = strategy.experimental_replicate_to_logical_devices(labels)
      output = strategy.experimental_replicate_to_logical_devices(output)
      return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, output))
    strategy.run(step_fn, args=((images, labels),))
  metadata = _metadata(graph)
  assert (metadata["num_replicas"].i, metadata["num_cores_per_replica"].i) == (1, 8)
  shardings = [_sharding(node) for node in _ops(graph, "XlaSharding")]
  tiled = [s for s in shardings if xla_data_pb2.OpSharding.Type.Name(s.type) == "OTHER"]
  assert [list(s.tile_assignment_dimensions) for s in tiled] == [[1, 2, 4, 1]]
  assert list(tiled[0].tile_assignment_devices) == list(range(8))
  assert sum(xla_data_pb2.OpSharding.Type.Name(s.type) == "REPLICATED" for s in shardings) == 2


def test_ops_on_a_logical_device_are_on_its_replicated_core():
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      TOPOLOGY, computation_shape=[1, 1, 2], num_replicas=4)
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver(), assignment)

    def step_fn():
      context = tfd.get_replica_context()
      with context.experimental_logical_device(1):
        return tf.identity(tf.constant(2.0), name="on_core_1")
    strategy.run(step_fn)
  (node,) = [n for n in _ops(graph, "Identity") if n.name.endswith("on_core_1")]
  assert node.device == "/device:TPU_REPLICATED_CORE:1"


def test_all_reduce_and_replica_id_are_tpu_ops():
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver())

    def step_fn():
      context = tfd.get_replica_context()
      replica = tf.cast(context.replica_id_in_sync_group, tf.float32)
      return context.all_reduce("MEAN", replica)
    result = strategy.run(step_fn)
  assert len(strategy.experimental_local_results(result)) == 8
  assert len(_ops(graph, "CrossReplicaSum")) == 1
  assert [n.attr["N"].i for n in _ops(graph, "TPUReplicatedInput")] == [8]
  assert _metadata(graph)["num_replicas"].i == 8


def test_an_eager_run_on_a_tpu_is_a_function():
  strategy = tfd.TPUStrategy(_tpu_resolver())
  with pytest.raises(tf.errors.OpError):  # no TPU here to run it on
    strategy.run(tf.function(lambda: tf.constant(1.0) + 1.0))
  with pytest.raises(NotImplementedError, match="does not support pure eager") as raised:
    strategy.run(lambda: tf.constant(1.0) + 1.0)
  assert "TFD_EMULATED_TPU_EAGER" not in str(raised.value)  # only for emulated slices


def test_variables_are_each_replicas_own_component():
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver())
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])

    def step_fn(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * x)
      grad = tfd.get_replica_context().all_reduce("SUM", tape.gradient(loss, v))
      v.assign_sub(0.1 * grad)
      return v.read_value()
    x = strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
        lambda ctx: tf.compat.v1.placeholder(tf.float32, [2]))
    strategy.run(step_fn, args=(x,))
  component_handles = {c.handle.name for c in strategy.experimental_local_results(v)}
  replicated = [op for op in graph.get_operations() if op.type == "TPUReplicatedInput"
                and op.get_attr("is_mirrored_variable")]
  assert len(replicated) == 1
  assert {t.name for t in replicated[0].inputs} == component_handles
  users = {op.type for op in graph.get_operations()
           if replicated[0].outputs[0] in list(op.inputs)}
  assert {"ReadVariableOp", "AssignSubVariableOp"} <= users
  assert [op.type for op in graph.get_operations() if op.type == "CrossReplicaSum"] == [
      "CrossReplicaSum"]


def test_a_variable_passed_to_the_step_stays_a_variable():
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver())
    with strategy.scope():
      v = tf.Variable(1.0)
    seen = []

    def step_fn(variable):
      seen.append(variable)
      return variable.assign_add(1.0)
    strategy.run(step_fn, args=(v,))
  assert seen == [v]
  replicated = [op.get_attr("is_mirrored_variable") for op in graph.get_operations()
                if op.type == "TPUReplicatedInput"]
  assert replicated == [True]


def test_each_computation_reads_a_variable_through_its_own_replicated_handle():
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver())
    with strategy.scope():
      v = tf.Variable(1.0)
    for _ in range(2):
      strategy.run(lambda: v.assign_add(1.0))
  clusters = []
  for replicated in graph.get_operations():
    if replicated.type == "TPUReplicatedInput" and replicated.get_attr("is_mirrored_variable"):
      clusters.append({op.get_attr("_tpu_replicate") for op in graph.get_operations()
                       if replicated.outputs[0] in list(op.inputs)})
  assert clusters == [{b"cluster"}, {b"cluster_1"}]


def _traced_run(fn, shape, dtype=tf.float32, options=None, **strategy_kwargs):
  """The graph of `strategy.run(fn)` on a v3-8, each replica's input a
  placeholder of `shape`; and the replicas' results."""
  with tf.Graph().as_default() as graph:
    strategy = tfd.TPUStrategy(_tpu_resolver(), **strategy_kwargs)
    x = strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
        lambda ctx: tf.compat.v1.placeholder(dtype, shape))
    result = strategy.run(fn, args=(x,), options=options)
  return graph, strategy.experimental_local_results(result)


@pytest.mark.parametrize("dtype, collective", [(tf.float32, "CrossReplicaSum"),
                                               (tf.int64, "AllToAll")])
def test_all_gather_is_a_tpu_collective(dtype, collective):
  graph, results = _traced_run(
      lambda x: tfd.get_replica_context().all_gather({"a": x, "b": [x]}, axis=1),
      [2, 3], dtype)
  assert [r["a"].shape.as_list() for r in results] == [[2, 24]] * 8
  assert results[0]["b"][0].shape.as_list() == [2, 24]
  assert len(_ops(graph, collective)) == 2
  # Replica i's value lands at its own offset: one-hot of its id, or tiled.
  assert _ops(graph, "OneHot" if collective == "CrossReplicaSum" else "Tile")


@pytest.mark.parametrize("collect", [
    lambda context, x: context.all_reduce("SUM", x),
    lambda context, x: context.all_gather(x, axis=1)], ids=["all_reduce", "all_gather"])
def test_tf_gradients_of_collectives_sum_over_the_replicas(collect):
  """`tf.gradients` through a collective: the backward pass sums over the
  replicas with a `CrossReplicaSum` of its own, as in TensorFlow."""
  def step_fn(x):
    return tf.gradients(collect(tfd.get_replica_context(), x) * 2.0, [x])[0]
  graph, results = _traced_run(step_fn, [2, 3])
  assert [r.shape.as_list() for r in results] == [[2, 3]] * 8
  assert len(_ops(graph, "CrossReplicaSum")) == 2


def test_all_gather_refuses_what_it_cannot_gather():
  with pytest.raises(NotImplementedError, match="IndexedSlices"):
    _traced_run(lambda x: tfd.get_replica_context().all_gather(
        tf.IndexedSlices(x, tf.constant([0, 1])), axis=0), [2, 3])
  with pytest.raises(ValueError, match=r"axis=2 for shape \(2, 3\)"):
    _traced_run(lambda x: tfd.get_replica_context().all_gather(x, axis=2), [2, 3])


@pytest.mark.parametrize("strategy_kwargs, options, spmd", [
    ({}, None, False),
    ({"experimental_spmd_xla_partitioning": True}, None, True),
    ({}, tfd.RunOptions(experimental_xla_options=tf.tpu.XLAOptions(
        use_spmd_for_xla_partitioning=True)), True),
    ({"experimental_spmd_xla_partitioning": True},
     tf.distribute.RunOptions(experimental_xla_options=tf.tpu.XLAOptions(
         use_spmd_for_xla_partitioning=False)), False)])
def test_spmd_partitioning_reaches_the_metadata(strategy_kwargs, options, spmd):
  graph, _ = _traced_run(lambda x: x * 2.0, [2, 3], options=options, **strategy_kwargs)
  assert _metadata(graph)["use_spmd_for_xla_partitioning"].b is spmd


@pytest.mark.parametrize("options, padded, bucketized", [
    (None, True, False),
    (tfd.RunOptions(experimental_enable_dynamic_batch_size=False), False, False),
    (tfd.RunOptions(experimental_bucketizing_dynamic_shape=True), True, True)])
def test_run_options_pad_dynamic_batches(options, padded, bucketized):
  graph, results = _traced_run(lambda x: x * 2.0, [None, 3], options=options)
  assert results[0].shape.as_list() == [None, 3]
  assert bool(_ops(graph, "XlaSetDynamicDimensionSize")) is padded
  assert bool(_ops(graph, "Log")) is bucketized  # rounding up to a power of two


def test_inputs_of_unknown_rank_are_refused_with_dynamic_batches():
  with pytest.raises(ValueError, match="to TPUStrategy.run.. has unknown rank"):
    _traced_run(lambda x: x * 2.0, None)
  graph, _ = _traced_run(lambda x: x * 2.0, None,
                         options=tfd.RunOptions(experimental_enable_dynamic_batch_size=False))
  assert _metadata(graph)["num_replicas"].i == 8


def test_a_step_being_traced_leaves_other_threads_runs_alone():
  """What a TPU step needs while it is traced lives in its replica context,
  and its options come with the call: while one thread is inside its step,
  another's `run` keeps its own options and its reduction is an ordinary
  one (not a `CrossReplicaSum`, which would belong in a TPU computation)."""
  strategy = tfd.TPUStrategy(_tpu_resolver())
  inside, resume = threading.Event(), threading.Event()
  traced = {}

  def paused_step(x):
    inside.set()
    assert resume.wait(timeout=60)
    return x * 2.0

  def run_paused_step():
    with tf.Graph().as_default() as graph:
      x = strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
          lambda ctx: tf.compat.v1.placeholder(tf.float32, [None, 3]))
      strategy.run(paused_step, args=(x,),
                   options=tfd.RunOptions(experimental_enable_dynamic_batch_size=False))
    traced["graph"] = graph

  thread = threading.Thread(target=run_paused_step, daemon=True)
  thread.start()
  try:
    assert inside.wait(timeout=60)
    with tf.Graph().as_default() as graph:
      value = tf.constant(1.0)
      assert strategy.reduce("MEAN", value, axis=None) is value
      x = strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
          lambda ctx: tf.compat.v1.placeholder(tf.float32, None))
      with pytest.raises(ValueError, match="has unknown rank"):  # default options
        strategy.run(lambda x: x, args=(x,))
    assert not _ops(graph, "CrossReplicaSum")
  finally:
    resume.set()
    thread.join(timeout=60)
  assert not thread.is_alive()
  assert not _ops(traced["graph"], "XlaSetDynamicDimensionSize")  # its own options
  assert _metadata(traced["graph"])["num_replicas"].i == 8


def test_run_options_must_be_run_options():
  with pytest.raises(TypeError, match="`options` must be a tf_distribute_lite.RunOptions"):
    _traced_run(lambda x: x, [2], options={"experimental_xla_options": None})


def test_all_gather_places_each_replica_at_its_offset(monkeypatch):
  """The sum path's arithmetic, with `CrossReplicaSum` done by hand: each
  replica's contribution is recorded, then every replica gets their sum."""
  strategy = tfd.TPUStrategy(tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8"))
  values = [tf.reshape(tf.range(6.0), [2, 3]) + 10.0 * i for i in range(4)]

  class Replica(tpu_replication.TPUReplicaContext):

    def __init__(self, replica_id):
      super().__init__(strategy)
      self.replica_id = replica_id

    @property
    def replica_id_in_sync_group(self):
      return tf.constant(self.replica_id)

  contributions = []
  monkeypatch.setattr(tpu_replication, "cross_replica",
                      lambda op, value, count: contributions.append(value) or value)
  for i in range(4):
    Replica(i).all_gather(values[i], axis=1)
  total = tf.add_n(contributions)
  monkeypatch.setattr(tpu_replication, "cross_replica", lambda op, value, count: total)
  gathered = Replica(2).all_gather(values[2], axis=1)
  np.testing.assert_array_equal(gathered.numpy(), tf.concat(values, axis=1).numpy())
