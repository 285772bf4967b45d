"""TPUStrategy on emulated slices: the spec's programs give the numbers of
the same computation without a strategy, and of MirroredStrategy on the
same devices; the logical-device annotations are checked as on a TPU."""

import inspect
import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import tpu_system

from tensorflow.python.distribute import tpu_strategy as tf_tpu_strategy

import oracle
from conftest import DEVICES
from keras_models import classification_data
from keras_models import classifier
from keras_models import TOLERANCE
import oracle

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def resolver():
  return tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8")


@pytest.fixture(scope="module")
def strategy(resolver):
  return tfd.TPUStrategy(resolver)


@pytest.mark.parametrize("ours, theirs", [
    (tfd.TPUStrategy, tf.distribute.TPUStrategy),
    (tfd.experimental.TPUStrategy, tf.distribute.experimental.TPUStrategy),
    (tfd.compat.v1.experimental.TPUStrategy, tf.compat.v1.distribute.experimental.TPUStrategy)])
def test_constructors_take_tensorflows_arguments(ours, theirs):
  assert inspect.signature(ours.__init__) == inspect.signature(theirs.__init__)
  assert ours.__name__ == theirs.__name__


def test_one_replica_per_core_of_the_slice(strategy):
  assert strategy.num_replicas_in_sync == 4
  assert strategy.extended.worker_devices == DEVICES
  assert (strategy.extended.num_hosts, strategy.extended.num_replicas_per_host,
          strategy.extended.steps_per_run) == (1, 4, 1)
  assert strategy.cluster_resolver.emulated_slice.name == "v4-8"
  # TF's class name; Keras looks for one that starts with "TPUStrategy".
  assert type(strategy).__name__ == "TPUStrategyV2"


def test_run_reduce_and_variables_match_a_plain_computation(strategy):
  with strategy.scope():
    v = tf.Variable([1.0, 2.0])
  assert [c.device for c in v.values] == list(DEVICES)
  values = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group)))

  @tf.function
  def step(x):
    def replica(x):
      v.assign_add(tf.distribute.get_replica_context().all_reduce("SUM", x) * tf.ones([2]))
      return v * x
    return strategy.run(replica, args=(x,))
  result = step(values)
  assert v.numpy().tolist() == [7.0, 8.0]  # 1 + (0 + 1 + 2 + 3)
  assert [r.numpy().tolist() for r in strategy.experimental_local_results(result)] == [
      [7.0 * i, 8.0 * i] for i in range(4)]
  assert strategy.reduce("SUM", result, axis=None).numpy().tolist() == [42.0, 48.0]
  assert len(strategy.experimental_run_v2(tf.function(lambda: tf.constant(1))).values) == 4


def test_ungrouped_update_in_a_step_gives_a_tuple(strategy):
  """`extended.update(..., group=False)` in a merge_call of the step gives
  a tuple (one result per replica it updated), as in TensorFlow: tf_keras's
  legacy optimizers extend a list with it."""
  with strategy.scope():
    v = tf.Variable(1.0)
  results = []

  def merge_fn(s):
    results.append(s.extended.update(v, lambda var, d: var.assign_add(d), args=(1.0,),
                                     group=False))

  @tf.function
  def step():
    strategy.run(lambda: tfd.get_replica_context().merge_call(merge_fn))
  step()
  assert results and all(isinstance(r, tuple) for r in results), results
  assert v.numpy() == 2.0


def test_merge_call_gets_one_of_each_python_object(strategy):
  """On a TPU the replica function is traced once, so `merge_fn` gets the
  one Python object passed (TensorFlow's TPU replica context hands it over
  as it is): here a `zip` of variables it consumes, as the Model Garden's
  EMA optimizer swaps its weights. Tensors still come per replica."""
  with strategy.scope():
    targets = [tf.Variable(1.0), tf.Variable(2.0)]
    sources = [tf.Variable(10.0), tf.Variable(20.0)]
  seen = []

  def swap(s, pairs, scale):
    seen.append((type(pairs), len(s.experimental_local_results(scale))))
    for target, source in pairs:
      s.extended.update(target, lambda v, w: v.assign(w), args=(source,))

  def replica():
    scale = tf.cast(tfd.get_replica_context().replica_id_in_sync_group, tf.float32)
    tfd.get_replica_context().merge_call(
        swap, args=(zip(targets, sources),), kwargs={"scale": scale})

  tf.function(lambda: strategy.run(replica))()
  assert seen[0] == (zip, 4)
  assert [v.numpy() for v in targets] == [10.0, 20.0]


def test_datasets_are_split_across_the_cores(strategy):
  dataset = tf.data.Dataset.range(16).batch(8)
  dist = strategy.experimental_distribute_dataset(dataset)
  first = strategy.experimental_local_results(next(iter(dist)))
  assert [t.numpy().tolist() for t in first] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  per_replica = strategy.distribute_datasets_from_function(
      lambda ctx: tf.data.Dataset.from_tensors(ctx.input_pipeline_id).repeat(2).batch(
          ctx.get_per_replica_batch_size(8)))
  assert len(strategy.experimental_local_results(next(iter(per_replica)))) == 4
  numpy_dataset = strategy.experimental_make_numpy_dataset(np.ones([4, 2], np.float32))
  assert next(iter(numpy_dataset)).numpy().tolist() == [1.0, 1.0]


def test_the_v1_strategy_keeps_steps_per_run(resolver):
  strategy = tfd.compat.v1.experimental.TPUStrategy(resolver, steps_per_run=5)
  assert strategy.steps_per_run == strategy.extended.steps_per_run == 5
  assert strategy.reduce("SUM", strategy.run(tf.function(lambda: tf.constant(2.0)))).numpy() == 8.0


# --- Logical devices: annotations checked as on a TPU.

@pytest.fixture(scope="module")
def two_core_strategy(resolver):
  topology = tfd.tpu.experimental.initialize_tpu_system(resolver)
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[2, 1, 1, 1], num_replicas=2)
  return tfd.TPUStrategy(resolver, assignment)


def test_device_assignment_gives_replicas_and_cores(two_core_strategy):
  extended = two_core_strategy.extended
  assert two_core_strategy.num_replicas_in_sync == 2
  assert extended.num_logical_devices_per_replica == 2
  assert extended.num_replicas_per_host == 2
  assert len(set(extended.worker_devices)) == 2


def test_tpu_devices_are_tensorflows_array(strategy, two_core_strategy):
  """TensorFlow's TPU embedding reads `extended._tpu_devices`: a 2-D NumPy
  array of device names indexed [replica][logical core]
  (docs/client_private_names.md)."""
  cores = strategy.extended._tpu_devices  # pylint: disable=protected-access
  assert isinstance(cores, np.ndarray) and cores.dtype == object
  assert cores.tolist() == [[device] for device in DEVICES]
  two_cores = two_core_strategy.extended._tpu_devices  # pylint: disable=protected-access
  assert two_cores.shape == (2, 2) and two_cores.size == 4
  assert two_cores[:, 0].tolist() == list(two_core_strategy.extended.worker_devices)
  assert len(set(two_cores.flatten())) == 4


def test_tf1_session_manager_initializes_the_tpu_system(resolver, strategy):
  """TensorFlow's `SessionManager` initializes the TPU system through the
  strategy (`extended._experimental_initialize_system`) before its session
  restores variables onto the TPU."""
  tfd.tpu.experimental.shutdown_tpu_system(resolver)
  assert tpu_system.initialized_topology(resolver) is None
  with tf.Graph().as_default(), strategy.scope():
    v = tf.compat.v1.get_variable("v", initializer=2.0)
    session = tf.compat.v1.train.SessionManager().prepare_session(
        "", init_op=tf.compat.v1.global_variables_initializer())
    assert session.run(v) == 2.0
  assert tpu_system.initialized_topology(resolver).mesh_shape.tolist() == [2, 2, 1, 1]


def test_annotations_keep_values(two_core_strategy):
  x = tf.reshape(tf.range(24.0), [2, 3, 4])

  @tf.function
  def step():
    def replica():
      a = two_core_strategy.experimental_assign_to_logical_device(x * 2.0, 1)
      b = two_core_strategy.experimental_split_to_logical_devices(x, [1, 1, 2])
      c = two_core_strategy.experimental_replicate_to_logical_devices(x)
      return a + b + c
    return two_core_strategy.run(replica)
  for value in two_core_strategy.experimental_local_results(step()):
    np.testing.assert_array_equal(value.numpy(), (x * 4.0).numpy())


@pytest.mark.parametrize("call, message", [
    (lambda s: s.experimental_assign_to_logical_device(tf.ones([2]), 2),
     "Received logical device id 2 but there are only total of 2 logical devices"),
    (lambda s: s.experimental_assign_to_logical_device(tf.ones([2]), -1),
     "Received logical device id -1"),
    (lambda s: s.experimental_split_to_logical_devices(tf.ones([4, 2]), [2]),
     r"rank of `tensor.shape` \(2\). Received len\(partition_dimensions\)=1"),
    (lambda s: s.experimental_split_to_logical_devices(tf.ones([4, 2]), [2, 2]),
     r"number of logical devices \(=2\). Received `partition_dimensions`=\[2, 2\],"
     "and their product is 4"),
    (lambda s: s.experimental_split_to_logical_devices(tf.ones([3, 2]), [2, 1]),
     r"`partition_dimensions\[0\]` must be divisible by corresponding value "
     r"specified by `partition_dimensions` \(2\). Received: 3"),
])
def test_annotation_errors_name_the_numbers(two_core_strategy, call, message):
  with pytest.raises(ValueError, match=message):
    call(two_core_strategy)


def test_variables_and_ops_on_a_logical_device(two_core_strategy, tmp_path):
  extended = two_core_strategy.extended
  with two_core_strategy.scope():
    v = tf.Variable(2.0)
    with extended.experimental_logical_device(1):
      w = tf.Variable(3.0)
      second_cores = extended.worker_devices
  first_cores = extended.worker_devices
  assert [c.device for c in two_core_strategy.experimental_local_results(v)] == list(first_cores)
  assert [c.device for c in two_core_strategy.experimental_local_results(w)] == list(second_cores)
  assert not set(first_cores) & set(second_cores)

  @tf.function
  def step(x):
    context = tfd.get_replica_context()
    with tf.GradientTape() as tape:
      with context.experimental_logical_device(0):
        y = v * x
      with context.experimental_logical_device(1):
        z = w * y
    return z, tape.gradient(z, [v, w])
  z, (dv, dw) = two_core_strategy.run(step, args=(5.0,))
  local = two_core_strategy.experimental_local_results
  assert [float(t) for t in local(z) + local(dv) + local(dw)] == [30.0] * 2 + [15.0] * 2 + [10.0] * 2
  path = tf.train.Checkpoint(v=v, w=w).save(str(tmp_path / "ckpt"))
  plain_v, plain_w = tf.Variable(0.0), tf.Variable(0.0)
  tf.train.Checkpoint(v=plain_v, w=plain_w).restore(path).assert_consumed()
  assert (float(plain_v), float(plain_w)) == (2.0, 3.0)
  with pytest.raises(ValueError, match=r"not in range \(was 2, but there are only 2"):
    with extended.experimental_logical_device(2):
      pass


def test_assignment_is_refused_in_spmd_mode(resolver):
  strategy = tfd.TPUStrategy(resolver, experimental_spmd_xla_partitioning=True)
  with pytest.raises(ValueError, match="Cannot assign a tensor to a logical device in SPMD mode"):
    strategy.experimental_assign_to_logical_device(tf.ones([2]), 0)


@pytest.mark.parametrize("shape, expected", [
    ([1, 1, 2], [[[0, 0, 0, 0], [0, 0, 0, 1]]] * 1),
    ([2, 2, 2], None)])
def test_three_element_computation_shapes(shape, expected):
  topology = tfd.tpu_emulation.PRESETS["v3-8"].topology()
  num_replicas = 4 if shape == [1, 1, 2] else 1
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=shape, num_replicas=num_replicas)
  assert isinstance(assignment, tf.tpu.experimental.DeviceAssignment)
  assert assignment.num_cores_per_replica == np.prod(shape)
  if expected:
    assert assignment.core_assignment[:1].tolist() == expected
  with pytest.raises(ValueError, match="computation_shape must have shape"):
    tf.tpu.experimental.DeviceAssignment.build(topology, computation_shape=shape,
                                               num_replicas=num_replicas)


# --- Keras.

def _keras_run(strategy):
  with strategy.scope():
    model = classifier()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  x, y = classification_data(64)
  history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
  evaluation = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
  predictions = model.predict(x[:24], batch_size=8, verbose=0)
  return history, evaluation, predictions, model.get_weights()


def test_keras_under_tpu_strategy_matches_mirrored_strategy(strategy):
  ours = _keras_run(strategy)
  mirrored = _keras_run(tfd.MirroredStrategy(list(DEVICES)))
  for name, values in mirrored[0].items():
    np.testing.assert_allclose(ours[0][name], values, atol=TOLERANCE)
  for name, value in mirrored[1].items():
    assert ours[1][name] == pytest.approx(value, abs=TOLERANCE)
  np.testing.assert_allclose(ours[2], mirrored[2], atol=TOLERANCE)
  for a, b in zip(ours[3], mirrored[3]):
    np.testing.assert_allclose(a, b, atol=TOLERANCE)


# --- The spec's programs on an emulated v3-8 (8 devices: a fresh process).

@pytest.fixture(scope="module")
def v3_8_programs():
  env = dict(os.environ, TPU_NAME="emulated:v3-8")
  result = subprocess.run([sys.executable, str(HERE / "tpu_programs.py")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_spec_programs_on_emulated_v3_8(v3_8_programs):
  assert v3_8_programs["devices"] == 8
  assert v3_8_programs["assign"] == {"replicas": 4, "cores_per_replica": 2, "equal": True}
  assert v3_8_programs["split"] == {"replicas": 1, "cores_per_replica": 8, "equal": True}
  assert v3_8_programs["values"] == {"replicas": 8, "on_worker_devices": True, "sum": 28.0}
  assert v3_8_programs["training"] == {"losses_equal": True, "weights_equal": True,
                                       "loss_fell": True}


def test_tf_2_0_spec_examples_on_emulated_v3_8(v3_8_programs):
  assert v3_8_programs["spec_2_0"] == {"sums": [120.0, 376.0], "from_function": [16.0, 16.0],
                                       "numpy": [16.0]}


def test_use_tpus_guide_trains_as_keras_fit_without_a_strategy(v3_8_programs):
  trained = {"iterations": 4, "loss_fell": True, "like_fit": True}
  assert v3_8_programs["use_tpus_guide"] == {
      "replicas": 8, "fit": True, "fit_steps_per_execution": True,
      "custom_loop": trained, "custom_loop_tf_range": trained}


def test_tensorflows_tpu_strategy_docstring_examples_match_plain_computations(v3_8_programs):
  docstring = dict(v3_8_programs["tensorflow_docstring"])
  assert docstring.pop("examples") >= 15
  assert docstring == {"failures": [], "trained_like_plain": True, "model_changed": True,
                       "run_like_plain": True}


_EMULATED = "emulated:v4-8"


@pytest.mark.parametrize("make, fragments", [
    (lambda mod: mod.TPUStrategy(_EMULATED),
     ["tpu_cluster_resolver must be an instance of "
      "tf.distribute.cluster_resolver.TPUClusterResolver", "got the str 'emulated:v4-8'"]),
    (lambda mod: mod.experimental.TPUStrategy(
        mod.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))),
     ["TPUClusterResolver", "got the SimpleClusterResolver"]),
], ids=["tpu_name", "other_resolver"])
def test_what_is_not_a_tpu_resolver_is_a_value_error(make, fragments):
  """TF's TPUStrategy fails on the missing `get_tpu_system_metadata` with an
  AttributeError; its MultiWorkerMirroredStrategy says ValueError for its
  resolver. Ours is both."""
  oracle.check_misuse(make, AttributeError, (ValueError, AttributeError), fragments,
                      apis=(tf.distribute, tfd))


_NOT_AN_ASSIGNMENT = (ValueError, AttributeError)


@pytest.mark.parametrize("make, errors, fragments", [
    (lambda r: tfd.TPUStrategy(r, experimental_device_assignment="2x2"), _NOT_AN_ASSIGNMENT,
     ["`experimental_device_assignment`", "tf.tpu.experimental.DeviceAssignment",
      "got the str '2x2'"]),
    (lambda r: tfd.experimental.TPUStrategy(r, device_assignment=[[0], [1]]),
     _NOT_AN_ASSIGNMENT,
     ["`device_assignment`", "DeviceAssignment.build(", "got the list [[0], [1]]"]),
    (lambda r: tfd.compat.v1.experimental.TPUStrategy(r, steps_per_run=0), (ValueError,),
     ["`steps_per_run`", "at least 1", "steps_per_run=0"]),
], ids=["string_assignment", "list_assignment", "no_steps_per_run"])
def test_bad_arguments_raise_a_clear_error(make, errors, fragments):
  """TF's TPUStrategy cannot be made without a TPU. Read from its source: on
  a device assignment that is not a `DeviceAssignment` it fails with an
  AttributeError (`num_replicas`), and its `DeviceAssignment` raises
  ValueError for arguments of the wrong type ("topology must be a Topology
  object"); ours is both. TF keeps any `steps_per_run`."""
  resolver = tfd.cluster_resolver.TPUClusterResolver(_EMULATED)
  with pytest.raises(errors) as raised:
    make(resolver)
  assert all(isinstance(raised.value, error) for error in errors)
  for fragment in fragments:
    assert fragment in str(raised.value)


def test_no_tpu_cores_is_a_clear_error():
  with pytest.raises(ValueError, match="TPUStrategy found no TPU cores.*emulated:v3-8"):
    tfd.TPUStrategy(tfd.cluster_resolver.TPUClusterResolver("local"))


# --- XLA: what a TPU cannot compile fails on the emulation too.

def test_a_step_xla_cannot_compile_fails_naming_the_op(strategy):
  @tf.function
  def step():
    return strategy.run(lambda x: tf.strings.length(tf.strings.format("{}", x)),
                        args=(tf.constant(1.0),))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"XLA cannot compile the step, as a TPU must.*StringFormat"):
    step()


def test_ops_inside_called_functions_are_checked_too(strategy):
  @tf.function
  def inner(x):
    return tf.strings.length(tf.strings.as_string(x))

  with pytest.raises(tf.errors.InvalidArgumentError, match="AsString"):
    strategy.run(inner, args=(tf.constant(1.0),))


class _CallIsAFunction:
  @tf.function
  def __call__(self, x):
    return x * 2.0


# Steps `run` is given eagerly, and what each returns for 1.0.
_EAGER_STEPS = {
    "plain": (lambda x: x * 2.0, None),
    "function": (tf.function(lambda x: x - 1.0), 0.0),
    "concrete": (tf.function(lambda x: x + 1.0).get_concrete_function(
        tf.TensorSpec([], tf.float32)), 2.0),
    "call_is_a_function": (_CallIsAFunction(), 2.0),
}


@pytest.mark.parametrize("name", sorted(_EAGER_STEPS))
def test_an_eager_run_of_a_plain_function_is_refused_as_on_a_tpu(strategy, name):
  """TF's TPUStrategy refuses a "pure eager" step, so the emulation does
  too; a `tf.function`, a concrete function, or an object whose `__call__`
  is one runs. (TF makes no TPUStrategy without a TPU: its check itself is
  the oracle.)"""
  step, expected = _EAGER_STEPS[name]
  try:
    tf_tpu_strategy.validate_run_function(step)
  except NotImplementedError as e:
    refused = str(e)
  else:
    refused = None
  for run in (strategy.run, strategy.experimental_run_v2):
    if refused:
      with pytest.raises(NotImplementedError) as raised:
        run(step, args=(tf.constant(1.0),))
      assert str(raised.value).startswith(refused)
      assert "TFD_EMULATED_TPU_EAGER=1" in str(raised.value)
    else:
      result = run(step, args=(tf.constant(1.0),))
      assert [float(t) for t in strategy.experimental_local_results(result)] == [expected] * 4
  assert (refused is None) == (expected is not None)


def _star(*args):
  return args[0]


def _named_and_star(x, *args):
  del args
  return x


def _positional_only(x, /):
  return x


@pytest.mark.parametrize("fn, args", [
    (lambda x: x, lambda v: (1.0, 2.0)), (_star, lambda v: (v,)),
    (_named_and_star, lambda v: (v, 1.0)), (_positional_only, lambda v: (v,)),
    (_named_and_star, lambda v: (v,)), (_named_and_star, lambda v: (1.0, 2.0))],
                         ids=["too_many", "variable_to_star_args", "variable_and_star_args",
                              "variable_to_positional_only", "variable_named", "star_args"])
def test_arguments_tensorflows_tpu_strategy_cannot_pass_are_refused(strategy, fn, args):
  """TF's TPUStrategy.run refuses these arguments with ValueErrors (its own
  check is the oracle, with a variable of TF's MirroredStrategy)."""
  with oracle.tf_mirrored().scope():
    theirs = tf.Variable(1.0)
  with strategy.scope():
    ours = tf.Variable(1.0)
  try:
    tf_tpu_strategy._maybe_partial_apply_variables(fn, args(theirs), {})  # pylint: disable=protected-access
  except ValueError as e:
    with pytest.raises(ValueError) as raised:
      strategy.run(tf.function(fn), args=args(ours))
    assert str(raised.value) == str(e)
  else:
    result = strategy.run(tf.function(fn), args=args(ours))
    assert {float(t) for t in strategy.experimental_local_results(result)} == {1.0}


def test_what_a_tpu_cannot_run_is_refused(strategy):
  """Per-replica input pipelines (TF's NotImplementedError) and Python
  code in the step (XLA cannot compile it, as on a TPU)."""
  options = tfd.InputOptions(experimental_replication_mode=tfd.InputReplicationMode.PER_REPLICA)
  with pytest.raises(NotImplementedError, match="PER_REPLICA is only supported in"):
    strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.range(4).batch(1), options)
  with pytest.raises(NotImplementedError, match="PER_REPLICA is only supported in"):
    strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(4), options)
  for python_op in (tf.py_function, tf.numpy_function):
    with pytest.raises(tf.errors.InvalidArgumentError, match="XLA cannot compile"):
      strategy.run(tf.function(lambda: python_op(lambda: 1.0, [], tf.float32)))  # pylint: disable=cell-var-from-loop


def test_an_eager_run_for_debugging_is_a_function_as_on_a_tpu(strategy, monkeypatch):
  """With TFD_EMULATED_TPU_EAGER=1 the emulation runs a plain function
  given eagerly, as one traced step, still compiled by XLA."""
  monkeypatch.setenv("TFD_EMULATED_TPU_EAGER", "1")
  traced = []

  def step(x):
    traced.append(1)
    return x * 2.0
  for _ in range(3):
    result = strategy.run(step, args=(tf.constant(1.0),))
  # Traced once: one call per replica, and one for XLA's compilation.
  assert len(traced) == len(DEVICES) + 1
  assert [float(t) for t in strategy.experimental_local_results(result)] == [2.0] * 4
  with pytest.raises(tf.errors.InvalidArgumentError, match="PrintV2"):
    strategy.run(lambda: tf.print("not on a TPU"))


def test_a_shape_xla_cannot_know_at_compile_time_fails(strategy):
  def step(x):
    return tf.reshape(x, [tf.cast(tf.reduce_sum(x), tf.int32)])
  with pytest.raises(tf.errors.InvalidArgumentError, match="compile-time constant"):
    strategy.run(tf.function(step), args=(tf.constant([1.0]),))


def test_an_input_of_unknown_rank_needs_a_static_batch_as_on_a_tpu(strategy):
  def step(x):
    return strategy.run(lambda x: x * 2.0, args=(x,), options=options)
  traced = tf.function(step, input_signature=[tf.TensorSpec(None, tf.float32)])
  options = tfd.RunOptions()
  with pytest.raises(ValueError, match="has unknown rank, which is not allowed"):
    traced(tf.constant([1.0, 2.0]))
  options = tfd.RunOptions(experimental_enable_dynamic_batch_size=False)
  results = strategy.experimental_local_results(traced(tf.constant([1.0, 2.0])))
  assert [r.numpy().tolist() for r in results] == [[2.0, 4.0]] * 4


def test_a_step_function_is_checked_for_the_options_of_each_run(strategy):
  """Run options reach the step through the call: a `tf.function` step run
  under other options is traced again under them, not reused unchecked."""
  step = tf.function(lambda x: x * 2.0)

  def run_with(options):
    return tf.function(lambda x: strategy.run(step, args=(x,), options=options),
                       input_signature=[tf.TensorSpec(None, tf.float32)])
  static = tfd.RunOptions(experimental_enable_dynamic_batch_size=False)
  results = strategy.experimental_local_results(run_with(static)(tf.constant([1.0])))
  assert [r.numpy().tolist() for r in results] == [[2.0]] * 4
  with pytest.raises(ValueError, match="has unknown rank, which is not allowed"):
    run_with(tfd.RunOptions())(tf.constant([1.0]))


def test_a_string_input_fails_saying_so(strategy):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"a TPU computes no strings.*tf.string inputs"):
    strategy.run(tf.function(tf.strings.length), args=(tf.constant("abc"),))


def test_sparse_and_ragged_batches_must_stay_on_the_host(strategy):
  ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1, 2], [3]] * 4)).batch(8)
  sparse = lambda _: tf.data.Dataset.from_tensors(
      tf.sparse.SparseTensor([[0, 0], [1, 1]], [1, 2], [2, 2])).repeat(8).batch(2)
  message = "TPUStrategy does not support distributed datasets with device prefetch"
  with pytest.raises(ValueError, match=message):
    strategy.experimental_distribute_dataset(ragged)
  with pytest.raises(ValueError, match=message):
    strategy.distribute_datasets_from_function(sparse)
  on_host = tfd.InputOptions(experimental_fetch_to_device=False)
  batch = next(iter(strategy.experimental_distribute_dataset(ragged, on_host)))
  sums = strategy.run(tf.function(tf.reduce_sum), args=(batch,))
  assert [int(t) for t in strategy.experimental_local_results(sums)] == [6] * 4
  batch = next(iter(strategy.distribute_datasets_from_function(sparse, on_host)))
  sums = strategy.run(tf.function(tf.sparse.reduce_sum), args=(batch,))
  assert [int(t) for t in strategy.experimental_local_results(sums)] == [6] * 4


def test_a_variable_passed_to_the_step_stays_a_variable(strategy):
  with strategy.scope():
    v = tf.Variable(1.0)

  def step(variable, x):
    variable.assign_add(x)
    return variable * 2.0
  result = strategy.run(tf.function(step), args=(v, tf.constant(1.0)))
  assert [float(r) for r in strategy.experimental_local_results(result)] == [4.0] * 4
  assert v.numpy() == 2.0


def test_a_captured_tensor_is_an_input_of_the_step_not_a_constant(strategy):
  @tf.function
  def step(x, size):
    doubled = x * 2.0
    length = size + 0
    values = strategy.run(lambda: doubled + 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="compile-time constant"):
      strategy.run(lambda: tf.reshape(x, [length]))
    return values
  results = strategy.experimental_local_results(step(tf.constant(1.0), tf.constant(1)))
  assert [float(r) for r in results] == [3.0] * 4


def test_a_jit_compiled_step_runs_as_on_a_tpu(strategy):
  with strategy.scope():
    v = tf.Variable([1.0, 2.0])

  @tf.function(jit_compile=True)
  def step(x):
    v.assign_add(x)
    return v * 2.0
  result = strategy.run(step, args=(tf.constant([1.0, 1.0]),))
  assert [r.numpy().tolist() for r in strategy.experimental_local_results(result)] == [
      [4.0, 6.0]] * 4
  with pytest.raises(tf.errors.InvalidArgumentError, match="AsString"):
    strategy.run(tf.function(lambda: tf.strings.as_string(v), jit_compile=True))


# --- Steps that make variables: run whole, never stopped partway, checked.

@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.Adam(0.1), lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: keras.optimizers.RMSprop(0.1), lambda: keras.optimizers.AdamW(0.1)],
                         ids=["Adam", "SGD_momentum", "RMSprop", "AdamW"])
def test_optimizers_that_make_slots_on_their_first_step(strategy, make_optimizer):
  with strategy.scope():
    w = tf.Variable([1.0, 2.0])
    optimizer = make_optimizer()

  @tf.function
  def train():
    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
      optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    strategy.run(step)
  plain_w = tf.Variable([1.0, 2.0])
  plain_optimizer = make_optimizer()
  for _ in range(3):
    train()
    # Without a strategy: the 4 replicas' gradients summed.
    plain_optimizer.apply_gradients([(4 * 2 * plain_w, plain_w)])
  for component in w.values:
    np.testing.assert_allclose(component.numpy(), plain_w.numpy(), rtol=1e-6)


def test_variables_made_in_the_step_or_its_function(strategy):
  made_in_function = []

  @tf.function
  def in_function():
    if not made_in_function:
      with strategy.scope():
        made_in_function.append(tf.Variable(3.0))
    return strategy.run(lambda: made_in_function[0] * 2.0)
  made_in_step = []

  def in_step():
    if not made_in_step:
      made_in_step.append(tf.Variable(4.0))
    return made_in_step[0] * 2.0
  with strategy.scope():
    layer = keras.layers.Dense(2, kernel_initializer="ones")
  built_lazily = tf.function(lambda x: strategy.run(layer, args=(x,)))
  local = strategy.experimental_local_results
  assert [float(r) for r in local(in_function())] == [6.0] * 4
  assert [float(r) for r in local(strategy.run(tf.function(in_step)))] == [8.0] * 4
  assert [r.numpy().tolist() for r in local(built_lazily(tf.ones([1, 3])))] == [[[3.0, 3.0]]] * 4
  assert len(made_in_step[0].values) == 4 and len(layer.weights) == 2


def test_a_step_that_makes_variables_is_still_compiled(strategy):
  made = []

  def step():
    if not made:
      made.append(tf.Variable(3.0))
    return tf.strings.as_string(made[0])
  with pytest.raises(tf.errors.InvalidArgumentError, match="XLA cannot compile.*AsString"):
    strategy.run(tf.function(step))


# --- Errors of the step's own code keep their class, as on a TPU.

@pytest.mark.parametrize("step", [
    lambda: int("x"), lambda: tf.ones([2]) + tf.ones([3]),
    lambda: tf.reshape(tf.ones([4]), [3]), lambda: {}["missing"]],
                         ids=["python", "shapes", "reshape", "key"])
def test_errors_of_the_step_keep_their_class(strategy, step):
  with pytest.raises(Exception) as expected:
    tf.distribute.OneDeviceStrategy("CPU:0").run(tf.function(step))
  with pytest.raises(type(expected.value)) as raised:
    strategy.run(tf.function(step))
  assert "XLA" not in str(raised.value)


@pytest.mark.parametrize("call, message", [
    (lambda s, x: s.experimental_split_to_logical_devices(x, [2, 2]),
     r"number of logical devices \(=2\)"),
    (lambda s, x: s.experimental_split_to_logical_devices(x, [2]), "rank of `tensor.shape`"),
    (lambda s, x: s.experimental_assign_to_logical_device(x, 2), "logical device id 2")])
def test_annotation_errors_inside_run(two_core_strategy, call, message):
  with pytest.raises(ValueError, match=message):
    two_core_strategy.run(tf.function(lambda x: call(two_core_strategy, x)),
                          args=(tf.ones([4, 4]),))


# --- Collectives.

def test_all_gather_gives_every_replica_the_whole(strategy):
  @tf.function
  def step():
    def replica():
      context = tfd.get_replica_context()
      replica_id = tf.cast(context.replica_id_in_sync_group, tf.float32)
      gathered = context.all_gather({"rows": tf.fill([1, 2], replica_id),
                                     "ids": tf.cast([replica_id], tf.int64)}, axis=0)
      return tf.reshape(gathered["rows"], [8]), gathered["ids"]
    return strategy.run(replica)
  rows, ids = step()
  for r, i in zip(strategy.experimental_local_results(rows),
                  strategy.experimental_local_results(ids)):
    assert r.numpy().tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert i.numpy().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("path", ["replica_function", "outer_function", "tape"])
@pytest.mark.parametrize("collective", ["all_gather", "all_reduce_sum", "all_reduce_mean"])
def test_gradients_of_collectives_match_mirrored_strategy(strategy, collective, path):
  """`tf.gradients` in the step (no tape) takes the collectives' gradients,
  summed over the replicas, as TF's MirroredStrategy on the same devices
  does; so does a tape."""
  def differentiate(strategy, module):
    c = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group + 1.0))

    def replica_fn(c):
      x = tf.constant([[3.0], [5.0]])
      context = module.get_replica_context()
      collect = {"all_gather": lambda: context.all_gather(x, axis=1),
                 "all_reduce_sum": lambda: context.all_reduce("SUM", x),
                 "all_reduce_mean": lambda: context.all_reduce("MEAN", x)}[collective]
      if path != "tape":
        return tf.gradients(collect() * c, [x])[0]
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = collect() * c
      return tape.gradient(y, x)
    if path == "replica_function":
      result = strategy.run(tf.function(replica_fn), args=(c,))
    else:
      result = tf.function(lambda c: strategy.run(replica_fn, args=(c,)))(c)
    return [r.numpy().tolist() for r in strategy.experimental_local_results(result)]
  expected = differentiate(oracle.tf_mirrored(), tf.distribute)
  assert differentiate(strategy, tfd) == expected
  gradient = 2.5 if collective == "all_reduce_mean" else 10.0  # c summed: 10
  assert expected == [[[gradient], [gradient]]] * 4


def test_gathering_indexed_slices_raises_as_in_tensorflow(strategy):
  """`NotImplementedError`, as TF's TPUStrategy (and every TF strategy)
  raises; an IndexedSlices input to the step is taken as it is."""
  def slices():
    return tf.IndexedSlices(tf.fill([1, 2], 1.0), tf.constant([0]), tf.constant([2, 2]))
  with pytest.raises(NotImplementedError, match="gather does not support IndexedSlices"):
    strategy.gather(slices(), axis=0)
  with pytest.raises(NotImplementedError, match="all_gather does not support IndexedSlices"):
    tf.function(lambda: strategy.run(
        lambda: tfd.get_replica_context().all_gather([slices()], axis=0)))()
  doubled = tf.function(lambda: strategy.run(lambda x: x.values * 2.0, args=(slices(),)))()
  assert [r.numpy().tolist() for r in strategy.experimental_local_results(doubled)] == [
      [[2.0, 2.0]]] * 4
