"""The bridge to TensorFlow's private names: one contract test per operation,
the import-time check of every name, and its refusals."""

import inspect
import os
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import _tf_bridge

import oracle
from multi_worker import free_ports


def test_pushes_onto_tensorflows_own_stack():
  strategy = tfd.OneDeviceStrategy("CPU:0")
  depth = len(_tf_bridge.strategy_stack())
  with strategy.scope():
    assert len(_tf_bridge.strategy_stack()) == depth + 1
    assert _tf_bridge.strategy_stack()[-1].strategy is strategy
  assert len(_tf_bridge.strategy_stack()) == depth


def test_refuses_tensorflow_without_the_stack(monkeypatch):
  monkeypatch.delattr(tf.Graph, _tf_bridge._STACK_ATTRIBUTE)
  monkeypatch.setattr(tf, "__version__", "2.99.0")
  with pytest.raises(ImportError, match=r"TensorFlow 2\.99\.0.*_distribution_strategy_stack"):
    _tf_bridge._check_tensorflow()


def test_refuses_tensorflow_1(monkeypatch):
  monkeypatch.setattr(tf, "__version__", "1.15.5")
  with pytest.raises(ImportError, match=r"TensorFlow 1\.15\.5"):
    _tf_bridge._check_tensorflow()


def test_saving_context_is_seen(tmp_path):
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    v = tf.Variable(3.0)
  module = tf.Module()
  module.v = v
  seen = []
  module.f = tf.function(lambda: seen.append(_tf_bridge.saving_without_distribution()) or v + 1.0,
                         input_signature=[])
  assert not _tf_bridge.saving_without_distribution()
  tf.saved_model.save(module, str(tmp_path))
  assert True in seen
  assert tf.saved_model.load(str(tmp_path)).f().numpy() == 4.0


def test_functions_marked_unsaveable_are_refused_by_saving(tmp_path):
  """A function traced before saving and marked is refused with TF's
  ValueError giving the reason; the mark is ignored eagerly and while
  saving traces."""
  _tf_bridge.mark_function_unsaveable("eagerly: ignored")
  module = tf.Module()
  module.marked = tf.function(
      lambda: _tf_bridge.mark_function_unsaveable("the reason") or tf.constant(1.0),
      input_signature=[])
  module.traced_by_saving = tf.function(
      lambda: _tf_bridge.mark_function_unsaveable("ignored") or tf.constant(2.0),
      input_signature=[])
  tf.saved_model.save(module, str(tmp_path / "saved"),
                      signatures=module.traced_by_saving)
  assert tf.saved_model.load(str(tmp_path / "saved")).traced_by_saving().numpy() == 2.0
  with pytest.raises(ValueError, match="Unable to save function .*\n.*the reason"):
    tf.saved_model.save(module, str(tmp_path / "refused"),
                        signatures=module.marked.get_concrete_function())


def test_plain_variable_ignores_variable_creators():
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    token = _tf_bridge.plain_variable(3, "/cpu:1", "counter")
  assert type(token).__name__ == "ResourceVariable"
  assert token.device.endswith("CPU:1")
  assert token.dtype == tf.int32 and int(token) == 3


def _recording_creator(name, calls):
  def creator(next_creator, **kwargs):
    calls.append(name)
    return next_creator(**kwargs)
  return creator


def test_variable_creator_scope_nests_with_tensorflows():
  calls = []
  with tf.variable_creator_scope(_recording_creator("outer", calls)):
    with _tf_bridge.VariableCreatorScope(_recording_creator("bridge", calls)):
      with tf.variable_creator_scope(_recording_creator("inner", calls)):
        tf.Variable(1.0)
      tf.Variable(1.0)
    tf.Variable(1.0)
  tf.Variable(1.0)
  assert calls == ["inner", "bridge", "outer", "bridge", "outer", "outer"]


def test_variable_creator_scope_keeps_priorities_and_nesting():
  from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
  calls = []
  graph = ops.get_default_graph()
  with graph._variable_creator_scope(_recording_creator("high", calls), priority=200):  # pylint: disable=protected-access
    with _tf_bridge.VariableCreatorScope(_recording_creator("bridge", calls)):
      tf.Variable(1.0)
  assert calls == ["high", "bridge"]  # a higher priority runs first, as in TF
  before = _tf_bridge._creator_stack(graph)  # pylint: disable=protected-access
  scope = _tf_bridge.VariableCreatorScope(_recording_creator("left open", calls))
  scope.__enter__()
  try:
    with pytest.raises(RuntimeError, match="without proper nesting"):
      with tf.variable_creator_scope(_recording_creator("inner", calls)):
        scope.__exit__(None, None, None)
  finally:
    _tf_bridge._set_creator_stack(graph, before)  # pylint: disable=protected-access


def test_autograph_leaves_the_package_alone():
  from tensorflow.python.autograph.impl import conversion  # pylint: disable=g-import-not-at-top
  assert conversion.is_allowlisted(tfd.MirroredStrategy.run)
  assert conversion.is_allowlisted(tfd.ReplicaContext.all_reduce)
  assert not conversion.is_allowlisted(test_autograph_leaves_the_package_alone)


def test_flat_tensor_specs_of_composite_elements():
  spec = (tf.TensorSpec([None, 3], tf.float32),
          tf.RaggedTensorSpec([None, None], tf.int32))
  flat = _tf_bridge.flat_tensor_specs(spec)
  assert [s.dtype for s in flat] == [tf.float32, tf.variant]
  assert flat[0].shape.as_list() == [None, 3]


def test_copy_to_device_moves_an_eager_tensor():
  with tf.device("CPU:0"):
    value = tf.constant([1.0, 2.0])
  copy = _tf_bridge.copy_to_device(value, "/job:localhost/replica:0/task:0/device:CPU:2")
  assert copy.device.endswith("CPU:2")
  assert copy.numpy().tolist() == [1.0, 2.0]



def test_gradient_tape_active():
  assert not _tf_bridge.gradient_tape_active()
  with tf.GradientTape():
    assert _tf_bridge.gradient_tape_active()

  @tf.function
  def traced():
    with tf.GradientTape():
      inside = _tf_bridge.gradient_tape_active()
    return tf.constant([inside, _tf_bridge.gradient_tape_active()])
  assert traced().numpy().tolist() == [True, False]


def test_error_notes_reach_the_error_autograph_raises_at_the_end_of_a_trace():
  """Eagerly the error carries the note; a traced function's error is
  rebuilt by AutoGraph from its message, which then ends with the note."""
  def fail():
    raise ValueError("bad value")

  def noted():
    try:
      fail()
    except ValueError as error:  # traced: AutoGraph has recorded its message
      _tf_bridge.add_error_note(error, "(raised by replica 2 of 4)")
      raise
  with pytest.raises(ValueError) as eager:
    noted()
  assert str(eager.value) == "bad value"
  assert eager.value.__notes__ == ["(raised by replica 2 of 4)"]
  with pytest.raises(ValueError) as traced:
    tf.function(noted)()
  assert traced.value is not eager.value
  assert str(traced.value).rstrip().endswith("ValueError: bad value\n    (raised by replica 2 of 4)")


def test_control_flow_kind_tells_branches_loops_and_functions():
  kinds = {}

  @tf.function
  def traced(x):
    def branch():
      kinds["cond"] = _tf_bridge.control_flow_kind(tf.compat.v1.get_default_graph())
      return x
    def body(i):
      kinds["while"] = _tf_bridge.control_flow_kind(tf.compat.v1.get_default_graph())
      return [i + 1.0]
    kinds["function"] = _tf_bridge.control_flow_kind(tf.compat.v1.get_default_graph())
    return tf.cond(x > 0, branch, lambda: -x) + tf.while_loop(lambda i: i < x, body, [0.0])[0]
  traced(tf.constant(2.0))
  assert kinds == {"cond": "cond", "while": "while", "function": None}
  assert _tf_bridge.control_flow_kind(tf.Graph()) is None


def test_eager_context_config_carries_the_logical_devices():
  config = _tf_bridge.eager_context_config()
  assert isinstance(config, tf.compat.v1.ConfigProto)
  assert config.device_count["CPU"] == len(tf.config.list_logical_devices("CPU"))
  config.device_filters.append("/job:changed")  # a copy: the context keeps its own
  assert not _tf_bridge.eager_context_config().device_filters


def test_collective_ops_are_enabled_through_the_eager_context():
  """What `enable_collective_ops` calls (it starts a server, so the
  multi-worker tests exercise it in worker processes)."""
  import inspect  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  assert list(inspect.signature(context.context().enable_collective_ops).parameters) == [
      "server_def"]


def test_topology_proto_parses_what_the_tpu_system_returns():
  topology = tf.tpu.experimental.Topology(
      mesh_shape=[2, 2, 1, 2],
      device_coordinates=[[[x, y, 0, c] for y in range(2) for x in range(2) for c in range(2)]])
  proto = _tf_bridge.parse_topology_proto(topology.serialized())
  assert list(proto.mesh_shape) == [2, 2, 1, 2]
  assert proto.num_tasks == 1 and proto.num_tpu_devices_per_task == 8
  assert proto.HasField("tpu_hardware_feature") is False


@pytest.mark.parametrize("kind, detail, proto_type, tiles", [
    ("maximal", 1, "MAXIMAL", [1]),
    ("tiled", [1, 2, 4, 1], "OTHER", [1, 2, 4, 1]),
    ("replicated", None, "REPLICATED", [])])
def test_xla_sharding_annotations_carry_op_sharding(kind, detail, proto_type, tiles):
  from tensorflow.compiler.xla import xla_data_pb2  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    annotated = _tf_bridge.xla_sharding_annotation(
        tf.compat.v1.placeholder(tf.float32, [8, 4, 8, 3]), kind, detail)
    assert annotated.op.type == "XlaSharding"
    proto = xla_data_pb2.OpSharding.FromString(annotated.op.get_attr("_XlaSharding"))
  assert xla_data_pb2.OpSharding.Type.Name(proto.type) == proto_type
  assert list(proto.tile_assignment_dimensions) == tiles
  if kind == "tiled":
    assert list(proto.tile_assignment_devices) == list(range(8))


def test_a_variable_over_an_existing_handle_reads_updates_and_differentiates():
  with tf.Graph().as_default():
    original = tf.Variable([1.0, 2.0], name="original")
    view = _tf_bridge.variable_of_handle(original.handle, original)
    assert isinstance(view, tf.Variable) and view.dtype == tf.float32
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(view * 3.0)
    grad = tape.gradient(loss, view)
    update = view.assign_sub([0.5, 0.5])
    with tf.compat.v1.Session() as session:
      session.run(original.initializer)
      assert session.run(grad).tolist() == [3.0, 3.0]
      session.run(update)
      assert session.run(original.read_value()).tolist() == [0.5, 1.5]


def test_hlo_text_lowers_with_the_captured_values_given():
  device = "/job:localhost/replica:0/task:0/device:CPU:0"
  v = tf.Variable([1.0, 2.0])
  traced = tf.function(lambda x: x * v, jit_compile=True).get_concrete_function(
      tf.TensorSpec([None, 2]))
  hlo = _tf_bridge.hlo_text(traced, [tf.TensorSpec([3, 2])], traced.captured_inputs, device)
  assert "f32[3,2]" in hlo and "multiply" in hlo
  uncompilable = tf.function(tf.strings.as_string, jit_compile=True).get_concrete_function(
      tf.TensorSpec([]))
  with pytest.raises(ValueError, match="AsString"):
    _tf_bridge.hlo_text(uncompilable, [tf.TensorSpec([])], [], device)


def test_tf1_saveable_saves_and_restores_through_a_saver(tmp_path):
  with tf.Graph().as_default():
    v = tf.Variable([1.0, 2.0])
    restored = []

    def restore(tensor):
      restored.append(tensor)
      return v.assign(tensor * 10.0)
    saveable = _tf_bridge.tf1_saveable(v, "saved_as", v.device, v.read_value, restore)
    saver = tf.compat.v1.train.Saver({"saved_as": saveable})
    with tf.compat.v1.Session() as session:
      session.run(v.initializer)
      path = saver.save(session, str(tmp_path / "ckpt"))
      saver.restore(session, path)
      assert session.run(v).tolist() == [10.0, 20.0] and len(restored) == 1
  assert tf.train.list_variables(path) == [("saved_as", [2])]


def test_record_summaries_if_decides_where_summaries_record(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  never = _tf_bridge.RecordSummariesIf(lambda: tf.constant(False))
  with writer.as_default(step=3):
    with never:
      assert not tf.summary.should_record_summaries()
      with _tf_bridge.RecordSummariesIf(lambda: tf.constant(True)):
        assert tf.summary.should_record_summaries()
      assert not tf.summary.should_record_summaries()
    assert tf.summary.should_record_summaries()
    with never:  # reusable
      assert not tf.summary.should_record_summaries()


def test_thread_state_carries_creators_and_summaries_to_another_thread(tmp_path):
  calls = []
  writer = tf.summary.create_file_writer(str(tmp_path))
  with tf.variable_creator_scope(_recording_creator("caller's", calls)):
    with writer.as_default(step=7), tf.summary.record_if(False):
      state = _tf_bridge.ThreadState()
  seen = {}
  together = threading.Barrier(2, timeout=60)

  def replica(name):
    with state:
      together.wait()  # both threads inside at once
      tf.Variable(1.0)
      seen[name] = (int(tf.summary.experimental.get_step()),
                    bool(tf.summary.should_record_summaries()))
      together.wait()
    tf.Variable(1.0)
    seen[name + " after"] = tf.summary.experimental.get_step()
  threads = [threading.Thread(target=replica, args=(name,)) for name in "ab"]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(60)
  assert calls == ["caller's", "caller's"]
  assert seen == {"a": (7, False), "b": (7, False), "a after": None, "b after": None}


def test_tensorflow_default_strategy_is_the_one_outside_every_scope():
  default = tf.distribute.get_strategy()
  assert _tf_bridge.tensorflow_default_strategy() is default
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    assert _tf_bridge.tensorflow_default_strategy() is default
    assert _tf_bridge.strategy_stack()[-1].strategy is strategy
  assert not isinstance(default, tfd.Strategy)


def test_update_context_is_tensorflows():
  """TensorFlow's own distributed variables read the state: inside
  `update_context(1)` TF's MirroredVariable updates only its component 1."""
  strategy = oracle.TF.pair
  with strategy.scope():
    v = tf.Variable(1.0)
  assert _tf_bridge.update_replica_id() is None
  with strategy.scope(), _tf_bridge.update_context(1):
    with _tf_bridge.update_context(0):
      assert _tf_bridge.update_replica_id() == 0
    assert _tf_bridge.update_replica_id() == 1
    v.assign_add(1.0)
  assert _tf_bridge.update_replica_id() is None
  assert [float(c) for c in strategy.experimental_local_results(v)] == [1.0, 2.0]


@pytest.fixture
def control_flow_v1():
  """TF 1.x control flow (as with TF 2.x behaviour disabled) for a test."""
  was_v2 = tf.compat.v1.control_flow_v2_enabled()
  tf.compat.v1.disable_control_flow_v2()
  yield
  if was_v2:
    tf.compat.v1.enable_control_flow_v2()


def test_control_flow_context_is_the_tf1_loop_being_built(control_flow_v1):
  with tf.Graph().as_default():
    assert _tf_bridge.control_flow_context() is None
    seen = []

    def body(i):
      seen.append(_tf_bridge.control_flow_context())
      return i + 1
    tf.compat.v1.while_loop(lambda i: i < 2, body, [0])
    (loop,) = seen
    assert type(loop).__name__ == "WhileContext"
    loop.Enter()
    try:
      assert _tf_bridge.control_flow_context() is loop
    finally:
      loop.Exit()
    assert _tf_bridge.control_flow_context() is None


def test_parameter_server_contacts(tmp_path):
  """A SavedModel stores a variable with no value as a variable; a traced
  function reads a value given at each call; an executor scope runs ops."""
  variable = _tf_bridge.uninitialized_variable([2], tf.float32, "whole", True)
  assert variable.shape == [2] and variable.dtype == tf.float32
  module = tf.Module()
  module.v = tf.Variable([1.0, 2.0])
  assert not _tf_bridge.in_save_context()
  seen = []

  @tf.function(input_signature=[])
  def f():
    seen.append(_tf_bridge.in_save_context())
    return module.v + 0.0
  module.f = f
  tf.saved_model.save(module, str(tmp_path / "m"))
  assert True in seen
  calls = iter([3, 5])

  @tf.function
  def g():
    return _tf_bridge.call_time_value(lambda: next(calls), tf.TensorSpec([], tf.int64)) + 0
  assert [int(g()), int(g())] == [3, 5]
  with _tf_bridge.worker_executor()():
    assert float(tf.reduce_sum(module.v)) == 3.0


def test_tensorflow_sharded_variable_is_the_class_tf_keras_legacy_optimizers_ask_for():
  """tf_keras's legacy optimizers give the slot of an instance of this class
  as a sharded variable over its shards' slots (else the variable itself)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  sharded_class = _tf_bridge.TENSORFLOW_SHARDED_VARIABLE
  assert sharded_class is tf.__internal__.distribute.ShardedVariable
  sharded = sharded_class([tf.Variable([[1.0]], name="w/part_0"),
                           tf.Variable([[2.0]], name="w/part_1")])
  optimizer = tf_keras.optimizers.legacy.SGD(0.1, momentum=0.5)
  optimizer.apply_gradients(zip([tf.ones([1, 1])] * 2, sharded.variables))
  slot = optimizer.get_slot(sharded, "momentum")
  assert isinstance(slot, sharded_class) and slot is not sharded
  np.testing.assert_allclose(slot.numpy(), [[-0.1], [-0.1]])


def test_coordination_service_contacts_reach_tensorflows_context():
  """Without a cluster there is no coordination service: each contact gets
  TensorFlow's own answer for that. (The multi-worker tests of the
  preemption handler use them on a cluster.)"""
  for contact in (lambda: _tf_bridge.coordination_set("key", "value"),
                  lambda: _tf_bridge.coordination_get("key", 0.1),
                  lambda: _tf_bridge.report_error_to_cluster(
                      tf.errors.InternalError(None, None, "lost"))):
    with pytest.raises(tf.errors.FailedPreconditionError, match="[Cc]oordination service"):
      contact()


def test_task_answers_reaches_tensorflows_peer_health_check():
  """Without a cluster TensorFlow refuses the check (the preemption watcher
  calls it only on a cluster, where its multi-worker test uses it)."""
  with pytest.raises(tf.errors.InternalError, match="local collectives"):
    _tf_bridge.task_answers("/job:worker/replica:0/task:1", 0.1)


def test_rpc_kernels_serve_list_and_call():
  """TensorFlow's RPC ops: a server serves a concrete function, a client
  lists it as a `RegisteredMethod` proto and calls it."""
  kernels = _tf_bridge.rpc_kernels()
  double = tf.function(lambda x: x * 2).get_concrete_function(tf.TensorSpec([], tf.int32))
  encoded = lambda s: tf.__internal__.saved_model.encode_structure(s).SerializeToString()
  address = f"127.0.0.1:{free_ports(1)[0]}"
  server = kernels.rpc_server(server_address=address)
  client = None
  try:
    kernels.rpc_server_register(
        server, method_name="double", captured_inputs=[], f=double,
        input_specs=encoded(double.structured_input_signature[0]),
        output_specs=encoded(tf.TensorSpec([], tf.int32)))
    kernels.rpc_server_start(server)
    client, listed = kernels.rpc_client(server_address=address, timeout_in_ms=10000,
                                        list_registered_methods=True)
    method = _tf_bridge.parse_registered_method(listed.numpy()[0])
    assert method.method == "double"
    decoded = tf.__internal__.saved_model.decode_proto
    assert decoded(method.output_specs) == tf.TensorSpec([], tf.int32)
    assert decoded(method.input_specs) == (tf.TensorSpec([], tf.int32, name="x"),)
    future, deleter = kernels.rpc_call(client, method_name="double", args=[tf.constant(21)],
                                       timeout_in_ms=10000)
    assert int(kernels.rpc_check_status(future)[0]) == 0
    assert kernels.rpc_get_value(future, Tout=[tf.int32])[0].numpy() == 42
    kernels.delete_rpc_future_resource(handle=future, deleter=deleter)
  finally:
    for handle in [h for h in (client, server) if h is not None]:
      tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def test_registered_type_specs_are_saved_and_loaded_as_their_class(tmp_path):
  @_tf_bridge.register_type_spec("tf_distribute_lite_tests.PairSpec")
  class PairSpec(tf.TypeSpec):  # pylint: disable=unused-variable
    value_type = property(lambda self: tuple)
    _component_specs = property(lambda self: (self._spec, self._spec))

    def __init__(self, spec):
      self._spec = spec

    def _serialize(self):
      return (self._spec,)

    def _to_components(self, value):
      return value

    def _from_components(self, components):
      return tuple(components)

  spec = PairSpec(tf.TensorSpec([], tf.float32))
  encoded = tf.__internal__.saved_model.encode_structure(spec)
  decoded = tf.__internal__.saved_model.decode_proto(encoded)
  assert type(decoded) is PairSpec and decoded == spec


def test_rpc_specs_encode_and_decode_as_tensorflows_structures():
  specs = (tf.TensorSpec([None, 2], tf.float32, name="x"), {"y": tf.TensorSpec([], tf.int64)})
  encoded = _tf_bridge.encode_specs(specs)
  assert encoded == tf.__internal__.saved_model.encode_structure(specs).SerializeToString()
  proto = type(tf.__internal__.saved_model.encode_structure(specs)).FromString(encoded)
  assert _tf_bridge.decode_specs(proto) == specs


def test_every_private_name_is_found_in_the_installed_tensorflow():
  assert not _tf_bridge.missing_names(_tf_bridge._REQUIRED)  # pylint: disable=protected-access
  for feature, (_, names) in _tf_bridge._OPTIONAL.items():  # pylint: disable=protected-access
    assert not _tf_bridge.missing_names(names), feature
  assert _tf_bridge._check_tensorflow() == {}  # pylint: disable=protected-access


def test_has_name_reads_attributes_instance_attributes_and_names_in_code():
  module = "tensorflow.python.ops.resource_variable_ops"
  assert _tf_bridge.has_name(module, "BaseResourceVariable._as_graph_element")
  assert _tf_bridge.has_name(module, "ResourceVariable()._unique_id")  # set in a method
  assert not _tf_bridge.has_name(module, "ResourceVariable()._gone")
  assert not _tf_bridge.has_name(module, "Gone()._unique_id")
  assert _tf_bridge.has_name("tensorflow.python.eager.context",
                             "async_wait(TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY)")
  assert not _tf_bridge.has_name("tensorflow.python.eager.context", "async_wait(TF_GONE)")
  assert not _tf_bridge.has_name("tensorflow.python.gone", "anything")
  assert _tf_bridge.missing_names({module: "gone UninitializedVariable"}) == [f"{module}.gone"]


def test_a_missing_required_name_refuses_tensorflow_naming_it(monkeypatch):
  monkeypatch.setitem(_tf_bridge._REQUIRED, "tensorflow.python.framework.tensor_shape",  # pylint: disable=protected-access
                      "Graph._gone")
  with pytest.raises(ImportError, match=r"missing: tensorflow\.python\.framework\.tensor_shape\.Graph\._gone"):
    _tf_bridge._check_tensorflow()  # pylint: disable=protected-access


def test_a_missing_optional_name_fails_only_its_feature_naming_it(monkeypatch):
  names = dict(_tf_bridge._OPTIONAL["RPC ops"][1])  # pylint: disable=protected-access
  names["tensorflow"] += " __internal__.gone"
  monkeypatch.setitem(_tf_bridge._OPTIONAL, "RPC ops", ("RPC cannot run", names))  # pylint: disable=protected-access
  unavailable = _tf_bridge._check_tensorflow()  # pylint: disable=protected-access
  assert unavailable == {"RPC ops": ["tensorflow.__internal__.gone"]}
  monkeypatch.setattr(_tf_bridge, "_UNAVAILABLE", unavailable)
  with pytest.raises(ImportError, match=r"no RPC ops \(tensorflow.__internal__.gone\): RPC cannot run"):
    _tf_bridge.rpc_kernels()
  assert _tf_bridge.eager_context_config() is not None  # other features work


def test_autograph_convert_converts_only_where_the_caller_is_converted():
  def python_loop(x):
    while x < 10:  # a tensor condition: only AutoGraph makes it a tf.while_loop
      x = x * 2
    return x
  assert _tf_bridge.autograph_convert(python_loop) is python_loop  # eagerly
  converted = tf.function(lambda x: _tf_bridge.autograph_convert(python_loop)(x))
  assert int(converted(tf.constant(3))) == 12
  unconverted = tf.function(lambda x: _tf_bridge.autograph_convert(python_loop)(x),
                            autograph=False)
  with pytest.raises(TypeError, match="tf.Tensor.*bool"):
    unconverted(tf.constant(3))


def test_is_function_graph_tells_traced_graphs_from_tf1_graphs():
  seen = []
  tf.function(lambda: seen.append(_tf_bridge.is_function_graph(
      tf.compat.v1.get_default_graph())))()
  assert seen == [True]
  assert not _tf_bridge.is_function_graph(tf.Graph())


def test_base_classes_are_tensorflows():
  assert isinstance(tf.RaggedTensor.from_row_splits([1, 2], [0, 2]), _tf_bridge.CompositeTensor)
  assert isinstance(tf.constant(1.0), _tf_bridge.EagerTensor)
  assert isinstance(tf.Variable(1.0), (_tf_bridge.TensorBase, _tf_bridge.Trackable))
  assert issubclass(tf.Variable, _tf_bridge.Trackable)



def test_checkpoint_initial_value_is_what_a_deferred_restore_creates_with(tmp_path):
  """A layer built after its checkpoint was restored creates its variables
  from the checkpoint's values: the creators see `CheckpointInitialValue`."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  saved = tf_keras.layers.Dense(1, kernel_initializer="ones")
  saved.build((None, 2))
  path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "c"))
  seen = []

  def creator(next_creator, **kwargs):
    initial = kwargs["initial_value"]
    seen.append(initial() if callable(initial) else initial)
    return next_creator(**kwargs)
  restored = tf_keras.layers.Dense(1)
  tf.train.Checkpoint(layer=restored).restore(path)
  with tf.variable_creator_scope(creator):
    restored.build((None, 2))
  assert all(isinstance(value, _tf_bridge.CheckpointInitialValue) for value in seen)
  assert seen[0].wrapped_value.numpy().tolist() == [[1.0], [1.0]]


def test_variable_keys_strategy_and_graph_element_are_a_variables():
  v = tf.Variable(1.0, name="keyed")
  assert _tf_bridge.variable_key(v, "_shared_name") == "keyed"
  assert _tf_bridge.variable_key(v, "_unique_id").startswith("keyed_")
  assert _tf_bridge.variable_key(v, "_graph_key").startswith("graph-key-")
  with pytest.raises(ValueError, match="`name` must be one of.*'_name'"):
    _tf_bridge.variable_key(v, "_name")
  assert _tf_bridge.variable_strategy(v) is None
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    mirrored = tf.Variable(1.0)
  assert _tf_bridge.variable_strategy(mirrored.values[0]) is strategy
  value = tf.constant(1.0)
  assert _tf_bridge.graph_element(value) is value
  with tf.Graph().as_default():
    graph_variable = tf.Variable(2.0)
    element = _tf_bridge.graph_element(graph_variable)
    assert isinstance(element, tf.Tensor) and element.op.type == "ReadVariableOp"


def test_a_variable_exports_and_writes_itself_into_a_saved_model():
  from tensorflow.core.protobuf import saved_object_graph_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import object_identity  # pylint: disable=g-import-not-at-top
  v = tf.Variable([1.0, 2.0], name="exported")
  object_map = object_identity.ObjectIdentityDictionary()
  tensor_map = object_identity.ObjectIdentityDictionary()
  with tf.Graph().as_default():
    resources = _tf_bridge.export_to_saved_model(
        v, object_map, tensor_map, tf.saved_model.SaveOptions())
  assert resources[0] is v.handle
  assert object_map[v] is not v and object_map[v].name == "exported:0"
  assert tensor_map[v.handle] is object_map[v].handle
  proto = saved_object_graph_pb2.SavedObject()
  _tf_bridge.write_object_proto(v, proto, tf.saved_model.SaveOptions())
  assert proto.variable.name == "exported" and proto.variable.trainable
  whole = _tf_bridge.uninitialized_variable([2], tf.float32, "whole", True)
  proto = saved_object_graph_pb2.SavedObject()
  _tf_bridge.write_variable_proto(whole, proto, tf.saved_model.SaveOptions())
  assert proto.variable.name == "whole" and list(proto.variable.shape.dim) != []


def test_replace_capture_makes_a_function_capture_another_value():
  v = tf.Variable(1.0)
  function = tf.function(lambda: v + 1.0).get_concrete_function()
  placeholder = function.graph.internal_captures[0]
  other = tf.Variable(5.0)
  _tf_bridge.replace_capture(function, other.handle, placeholder)
  assert any(external is other.handle and internal is placeholder
             for external, internal in function.graph.captures)


def test_containers_are_found_where_tensorflow_and_tf_keras_look():
  from tensorflow.python.distribute import distribute_utils  # pylint: disable=g-import-not-at-top
  component, container = tf.Variable(1.0), tf.Variable(2.0)
  assert _tf_bridge.distributed_container_of(component) is None
  _tf_bridge.set_distributed_container(component, container)
  assert distribute_utils.value_container(component) is container
  assert _tf_bridge.distributed_container_of(component) is container
  assert component.handle._distributed_container() is container  # Keras: pylint: disable=protected-access
  shard = tf.Variable([1.0])
  _tf_bridge.set_sharded_container(shard, container)
  assert shard._sharded_container() is container  # pylint: disable=protected-access


def test_is_jit_compiled_reads_the_functions_option():
  assert _tf_bridge.is_jit_compiled(tf.function(lambda: 1.0, jit_compile=True))
  assert not _tf_bridge.is_jit_compiled(tf.function(lambda: 1.0))


def test_clone_function_keeps_the_options_around_another_function():
  original = tf.function(lambda x: x + 1, jit_compile=True, reduce_retracing=True)
  clone = _tf_bridge.clone_function(original, lambda x: x * 10)
  assert _tf_bridge.is_jit_compiled(clone)
  assert int(clone(tf.constant(2))) == 20 and int(original(tf.constant(2))) == 3


def test_eager_device_name_is_the_innermost_device_scope():
  assert _tf_bridge.eager_device_name() == ""
  with tf.device("CPU:1"):
    assert _tf_bridge.eager_device_name().endswith("device:CPU:1")


def test_trace_mapper_guard_restores_the_threads_stacks_after_a_failure():
  from tensorflow.python.util import tf_stack  # pylint: disable=g-import-not-at-top
  key = threading.get_ident()
  stacks = [tf_stack._source_mapper_stacks[key], tf_stack._source_filter_stacks[key]]  # pylint: disable=protected-access
  depths = [len(s) for s in stacks]
  with pytest.raises(RuntimeError):
    with _tf_bridge.TraceMapperGuard():
      for stack in stacks:
        stack.append(stack[-1])  # what a failed AutoGraph conversion leaves
      raise RuntimeError("replica failed")
  assert [len(s) for s in stacks] == depths


def test_remote_ops_run_synchronously_sets_the_knobs_tensorflow_reads(monkeypatch):
  for name in ("TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE", "TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"):
    monkeypatch.delenv(name, raising=False)
  _tf_bridge.remote_ops_run_synchronously()
  assert os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] == "False"
  assert os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] == "True"
  source = inspect.getsource(__import__(
      "tensorflow.python.distribute.parameter_server_strategy_v2", fromlist=["_"]))
  assert 'os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] = "False"' in source
  assert 'os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] = "True"' in source
