"""The bridge to TensorFlow's strategy stack: what it relies on, and its refusal."""

import contextlib
import inspect
import os
import tempfile

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
  before = _tf_bridge.variable_creator_stack(graph)
  scope = _tf_bridge.VariableCreatorScope(_recording_creator("left open", calls))
  scope.__enter__()
  try:
    with pytest.raises(RuntimeError, match="without proper nesting"):
      with tf.variable_creator_scope(_recording_creator("inner", calls)):
        scope.__exit__(None, None, None)
  finally:
    _tf_bridge.set_variable_creator_stack(graph, before)


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



def test_keras_3_takes_our_distributed_datasets_for_tensorflows():
  """The check `KERAS_DATASET_BASES` answers: Keras 3 picks its dataset
  adapter by base-class name and module, and accepts ours only with them."""
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.trainers import data_adapters  # pylint: disable=g-import-not-at-top
  assert _tf_bridge._keras_major_version() == int(keras.__version__.split(".")[0]) >= 3
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  dataset = tf.data.Dataset.range(4).batch(2)
  for distributed in [
      strategy.experimental_distribute_dataset(dataset),
      strategy.distribute_datasets_from_function(lambda _: dataset)]:
    assert data_adapters.is_tf_dataset(distributed)
    adapter = data_adapters.get_data_adapter(distributed)
    assert type(adapter).__name__ == "TFDatasetAdapter"
    assert adapter.get_tf_dataset() is distributed
    assert adapter.num_batches == 2

  class PublicInterfaceOnly(tf.distribute.DistributedDataset):
    pass
  assert not data_adapters.is_tf_dataset(PublicInterfaceOnly())


def test_keras_2_and_no_keras_need_no_extra_base():
  assert _tf_bridge._keras_dataset_bases(None) == ()
  assert _tf_bridge._keras_dataset_bases(2) == ()
  (base,) = _tf_bridge._keras_dataset_bases(3)
  assert base.__name__ == "DistributedDataset"
  assert "tensorflow.python." in base.__module__


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


def test_keras_reduce_per_replica_is_routed_for_chosen_strategies():
  import inspect  # pylint: disable=g-import-not-at-top
  trainer = __import__(_tf_bridge._KERAS_TRAINER, fromlist=["_"])  # pylint: disable=protected-access
  for make in ("_make_function", "make_predict_function"):
    assert "reduce_per_replica(" in inspect.getsource(getattr(trainer.TensorFlowTrainer, make))
  chosen = tfd.OneDeviceStrategy("CPU:0")
  _tf_bridge.route_keras_reduce_per_replica(
      lambda strategy: strategy is chosen, lambda values, strategy, reduction: ("ours", reduction))
  assert trainer.reduce_per_replica({"loss": 1.0}, chosen, "auto") == ("ours", "auto")
  other = tfd.OneDeviceStrategy("CPU:1")
  assert trainer.reduce_per_replica({"loss": tf.constant(2.0)}, other, "auto")["loss"] == 2.0


def test_tf_keras_save_before_preemption_is_routed_for_chosen_strategies(tmp_path, monkeypatch):
  """tf_keras's backup state turns `save_before_preemption` on where
  `distributed_file_utils._on_gcp()` says Google Cloud; for a strategy that
  the bridge is told saves before preemption it is driven by the handler
  registered with the bridge, made
  from the strategy's cluster resolver and the manager that reads the
  backup, through the handler's names tf_keras reads. `BackupAndRestore` then asks for the
  batch hooks, where tf_keras checks for a notice."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import distributed_file_utils  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import distributed_training_utils  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import worker_training_state  # pylint: disable=g-import-not-at-top
  state_class = worker_training_state.WorkerTrainingState
  assert list(inspect.signature(state_class.__init__).parameters) == [
      "self", "model", "checkpoint_dir", "save_freq", "save_before_preemption_arg"]
  for routed in ((state_class, "__init__"), (state_class, "_tfd_routed"),
                 (tf_keras.callbacks.BackupAndRestore, "_implements_train_batch_hooks"),
                 (tf_keras.callbacks.BackupAndRestore, "_tfd_routed")):
    monkeypatch.setattr(*routed, getattr(*routed, None), raising=False)
  monkeypatch.setattr(distributed_file_utils, "_on_gcp", lambda: 200)
  made = []

  class Handler:

    def __init__(self, cluster_resolver, checkpoint_manager):
      made.append(self)
      self.made_with = (cluster_resolver, checkpoint_manager)
      self._run_counter = 0
      self.checks = self.scopes = 0

    def _check_preemption_and_maybe_checkpoint(self):
      self.checks += 1

    @contextlib.contextmanager
    def watch_preemption_scope(self):
      self.scopes += 1
      yield

  monkeypatch.setitem(_tf_bridge._preemption_handler, "class", Handler)  # pylint: disable=protected-access
  _tf_bridge.route_tf_keras(lambda strategy: True)
  model = tf_keras.Sequential([tf_keras.Input((1,)), tf_keras.layers.Dense(1)])
  backup = tf_keras.callbacks.BackupAndRestore(str(tmp_path), save_before_preemption=True)
  backup.set_model(model)
  assert backup._implements_train_batch_hooks()  # pylint: disable=protected-access
  state = state_class(model, str(tmp_path), "epoch", True)
  (handler,) = made
  assert handler.made_with == (model.distribute_strategy.cluster_resolver,
                               state.read_checkpoint_manager)
  assert model._preemption_handler is handler  # pylint: disable=protected-access
  state.backup_if_preempted()
  with distributed_training_utils.maybe_preemption_handler_scope(model):
    pass
  assert (handler._run_counter, handler.checks, handler.scopes) == (1, 1, 1)  # pylint: disable=protected-access
  monkeypatch.setattr(distributed_file_utils, "_on_gcp", lambda: False)
  assert not state_class(model, str(tmp_path), "epoch", True)._enable_save_before_preemption  # pylint: disable=protected-access
  assert len(made) == 1


def test_keras_checkpoint_writes_are_routed_for_chosen_strategies(tmp_path, monkeypatch):
  """Keras 3 callbacks save through `_save_model` to the paths the bridge
  names; for a chosen strategy they save into a temporary directory that
  is removed, and `BackupAndRestore` leaves the backup alone at the end."""
  import keras  # pylint: disable=g-import-not-at-top
  from keras_models import classification_data, classifier  # pylint: disable=g-import-not-at-top
  chosen = tfd.OneDeviceStrategy("CPU:0")
  _tf_bridge.route_keras_checkpoint_writes(lambda strategy: strategy is chosen)
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  saved = []
  save_weights = keras.Model.save_weights

  def recorded_save_weights(model, filepath, **kwargs):
    saved.append(os.path.dirname(filepath))
    return save_weights(model, filepath, **kwargs)
  monkeypatch.setattr(keras.Model, "save_weights", recorded_save_weights)

  def fit(strategy, directory):
    with strategy.scope():
      model = classifier()
      model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    backup = keras.callbacks.BackupAndRestore(str(directory / "backup"), delete_checkpoint=False)
    model.fit(*classification_data(8), epochs=2, verbose=0, callbacks=[
        backup, keras.callbacks.ModelCheckpoint(str(directory / "e{epoch}.weights.h5"),
                                                save_weights_only=True)])
    assert {name: getattr(backup, name)
            for name in _tf_bridge._KERAS_CHECKPOINT_PATHS["BackupAndRestore"]} == {  # pylint: disable=protected-access
                "backup_dir": str(directory / "backup"),
                "_weights_path": str(directory / "backup" / "latest.weights.h5"),
                "_training_metadata_path": str(directory / "backup" / "training_metadata.json"),
                "_prev_weights_path": str(directory / "backup" / "latest.weights.h5.bkp"),
                "_prev_training_metadata_path":
                    str(directory / "backup" / "training_metadata.json.bkp")}

  fit(chosen, tmp_path / "chosen")
  assert not (tmp_path / "chosen").exists() and not list(scratch.iterdir())
  assert len(saved) == 4 and all(path.startswith(str(scratch)) for path in saved)
  fit(tfd.OneDeviceStrategy("CPU:1"), tmp_path / "other")
  assert sorted(p.name for p in (tmp_path / "other").iterdir()) == [
      "backup", "e1.weights.h5", "e2.weights.h5"]


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


def test_summary_state_decides_where_summaries_record(tmp_path):
  state = _tf_bridge.summary_state()
  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default(step=3):
    assert state.writer is writer
    assert int(state.step) == 3
    outer = state.is_recording_distribution_strategy
    state.is_recording_distribution_strategy = lambda: tf.constant(False)
    try:
      assert not tf.summary.should_record_summaries()
    finally:
      state.is_recording_distribution_strategy = outer
    assert tf.summary.should_record_summaries()


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


def test_a_missing_rpc_module_is_an_import_error_naming_it():
  with pytest.raises(ImportError, match=r"no RPC ops \(tensorflow.distribute.experimental"
                                        r".rpc.kernels.gone\)"):
    _tf_bridge._rpc_module("kernels.gone")  # pylint: disable=protected-access
