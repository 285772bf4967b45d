"""`MirroredStrategy`: devices, the default cross-device ops, placement, and
bad device lists, compared with `tf.distribute.MirroredStrategy`."""

import logging
import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib

import oracle
from oracle import new_mirrored, tf_default_cross_device_ops

DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))
MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])


def _cross_device_ops(strategy):
  """The algorithm a strategy reduces with (private in TF; here its
  communicator's)."""
  extended = strategy.extended
  if hasattr(extended, "_communicator"):
    return extended._communicator.cross_device_ops  # pylint: disable=protected-access
  return extended._cross_device_ops  # pylint: disable=protected-access


def _replica_ids_all_reduced(mod, strategy, run_mode):
  def replica_fn():
    context = mod.get_replica_context()
    return context.all_reduce("SUM", tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0)
  result = run_mode(lambda: strategy.run(replica_fn))
  return [float(t) for t in strategy.experimental_local_results(result)]


# --- Devices.

@MODULES
@pytest.mark.parametrize("devices", [None, []], ids=["None", "empty"])
def test_no_devices_means_every_cpu(mod, devices):
  strategy = new_mirrored(mod, devices)
  assert strategy.extended.worker_devices == DEVICES
  assert strategy.extended.parameter_devices == DEVICES
  assert strategy.num_replicas_in_sync == 4


@MODULES
@pytest.mark.parametrize("devices", [
    ["CPU:0", "CPU:1"],
    ["cpu:0", "cpu:1"],
    ["/cpu:0", "/cpu:1"],
    ["/CPU:0", "/device:CPU:1"],
    [DEVICES[0], DEVICES[1]],
    ("/job:localhost/device:CPU:0", "/job:localhost/device:CPU:1"),
], ids=str)
def test_device_spellings_canonicalise_alike(mod, devices):
  strategy = new_mirrored(mod, devices)
  assert strategy.extended.worker_devices == DEVICES[:2]
  assert strategy.num_replicas_in_sync == 2


@MODULES
def test_devices_keep_their_order(mod):
  strategy = new_mirrored(mod, ["CPU:2", "CPU:0"])
  assert strategy.extended.worker_devices == (DEVICES[2], DEVICES[0])
  result = strategy.run(lambda: tf.identity(
      tf.cast(mod.get_replica_context().replica_id_in_sync_group, tf.float32)))
  assert [t.device for t in result.values] == [DEVICES[2], DEVICES[0]]


@pytest.mark.parametrize("devices", [None, ["CPU:0", "CPU:1"], ["CPU:1", "CPU:2", "CPU:3"]],
                         ids=["all", "two", "three"])
def test_cpus_reduce_on_one_device_by_default(devices):
  # TF 2.21 picks its ring collective here, 3-4x slower on one machine's CPUs.
  assert type(tf_default_cross_device_ops(devices)).__name__ == "CollectiveAllReduce"
  ours = _cross_device_ops(tfd.MirroredStrategy(devices))
  assert type(ours) is cross_device_ops_lib.ReductionToOneDevice


def test_default_reduction_on_cpus_adds_once_and_shares(run_mode):
  strategy = tfd.MirroredStrategy()
  ids = oracle.TFD.replica_ids(strategy)
  graph_ops = []

  def all_reduce():
    result = strategy.run(lambda x: tfd.get_replica_context().all_reduce("SUM", x),
                          args=(ids,))
    if not tf.executing_eagerly():
      graph_ops.extend(op.type for op in tf.compat.v1.get_default_graph().get_operations())
    return strategy.experimental_local_results(result)
  assert [float(t) for t in run_mode(all_reduce)] == [6.0] * 4
  if graph_ops:
    assert graph_ops.count("AddN") == 1 and "CollectiveReduceV2" not in graph_ops


def test_default_reduction_on_cpus_gives_the_bits_of_tensorflows_one_device_reduction(run_mode):
  """Sums whose rounding depends on the order of the additions come out as
  TensorFlow's `ReductionToOneDevice` gives them, bit for bit."""
  rng = np.random.default_rng(0)
  parts = [(rng.standard_normal(1000) * 10.0 ** rng.integers(-6, 7, 1000)).astype(np.float32)
           for _ in DEVICES]
  results = {}
  for mod, strategy in ((tf.distribute, oracle.new_tf_mirrored()), (tfd, tfd.MirroredStrategy())):
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))

    def all_reduce(mod=mod, strategy=strategy, values=values):
      return strategy.experimental_local_results(strategy.run(
          lambda x: mod.get_replica_context().all_reduce("SUM", x), args=(values,)))
    results[mod] = [t.numpy() for t in run_mode(all_reduce)]
  for ours, theirs in zip(results[tfd], results[tf.distribute]):
    np.testing.assert_array_equal(ours, theirs)
  in_order = ((parts[0] + parts[1]) + parts[2]) + parts[3]
  in_another_order = ((parts[3] + parts[2]) + parts[1]) + parts[0]
  assert not np.array_equal(in_order, in_another_order)  # the order shows


@MODULES
@pytest.mark.parametrize("ops", ["ReductionToOneDevice", "HierarchicalCopyAllReduce"])
def test_given_cross_device_ops_are_used(mod, ops, run_mode):
  cross_device_ops = getattr(mod, ops)()
  strategy = new_mirrored(mod, cross_device_ops=cross_device_ops)
  assert _cross_device_ops(strategy) is cross_device_ops
  assert _replica_ids_all_reduced(mod, strategy, run_mode) == [10.0] * 4


def test_strategies_of_different_sizes_all_reduce_in_one_process(run_mode):
  sizes = {2: ["CPU:0", "CPU:1"], 3: ["CPU:1", "CPU:2", "CPU:3"], 4: None}
  strategies = {n: _collective_strategy(devices or DEVICES) for n, devices in sizes.items()}
  for _ in range(2):
    for n, strategy in strategies.items():
      assert _replica_ids_all_reduced(tfd, strategy, run_mode) == [n * (n + 1) / 2] * n


# --- Placement.

@MODULES
def test_variables_are_mirrored_on_every_device(mod):
  strategy = new_mirrored(mod)
  with strategy.scope():
    v = tf.Variable(2.0)
  assert [c.device for c in v.values] == list(DEVICES)
  assert repr(v) == (
      "MirroredVariable:{\n"
      "  0: <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=2.0>,\n"
      "  1: <tf.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=2.0>,\n"
      "  2: <tf.Variable 'Variable/replica_2:0' shape=() dtype=float32, numpy=2.0>,\n"
      "  3: <tf.Variable 'Variable/replica_3:0' shape=() dtype=float32, numpy=2.0>\n"
      "}")


@MODULES
def test_each_replica_runs_on_its_device(mod, run_mode):
  strategy = new_mirrored(mod)
  seen = {}

  def replica_fn():
    context = mod.get_replica_context()
    seen[int(tf.get_static_value(context.replica_id_in_sync_group))] = tf.identity(1.0).device
    return tf.constant(0)

  run_mode(lambda: strategy.run(replica_fn))
  assert seen == dict(enumerate(DEVICES))


@MODULES
@pytest.mark.parametrize("batched", [False, True], ids=["one", "list"])
def test_all_reduce_of_function_arguments_lands_on_every_replica(mod, batched):
  """Per-replica arguments of a `tf.function` have no device; the all-reduce
  still gives each replica its result on its own device."""
  strategy = new_mirrored(mod)
  values = strategy.experimental_distribute_values_from_function(
      lambda ctx: [tf.constant(float(ctx.replica_id_in_sync_group))] * 2)
  seen = {}

  def replica_fn(value):
    context = mod.get_replica_context()
    reduced = context.all_reduce("SUM", value if batched else value[0])
    seen[int(tf.get_static_value(context.replica_id_in_sync_group))] = [
        t.device for t in tf.nest.flatten(reduced)]
    return reduced

  result = tf.function(lambda v: strategy.run(replica_fn, args=(v,)))(values)
  assert seen == {i: [d] * (2 if batched else 1) for i, d in enumerate(DEVICES)}
  assert [float(t) for t in strategy.experimental_local_results(
      tf.nest.flatten(result)[0])] == [6.0] * 4


@MODULES
def test_ops_in_scope_are_not_placed(mod):
  strategy = new_mirrored(mod)
  with strategy.scope():
    assert tf.identity(1.0).device == DEVICES[0]
    with tf.device("CPU:3"):
      assert tf.identity(1.0).device == DEVICES[3]


@MODULES
def test_reduce_and_all_reduce_on_a_subset_of_devices(mod, run_mode):
  strategy = new_mirrored(mod, ["CPU:1", "CPU:3"])
  assert _replica_ids_all_reduced(mod, strategy, run_mode) == [3.0, 3.0]
  ids = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group) + 1.0))
  assert float(run_mode(lambda: strategy.reduce("SUM", ids, axis=None))) == 3.0


# --- Bad device lists.

@pytest.mark.parametrize("bad", ["foo:bar:baz", "CPU:x", "/job:localhost/xyz:0"])
def test_malformed_device_strings_raise(bad):
  with pytest.raises(ValueError):
    new_mirrored(tf.distribute, ["CPU:0", bad])
  with pytest.raises(ValueError, match=f"Malformed device string '{bad}'"):
    tfd.MirroredStrategy(["CPU:0", bad])


@MODULES
def test_a_single_string_instead_of_a_list_raises(mod):
  with pytest.raises(ValueError):
    new_mirrored(mod, "CPU:0")


def test_a_single_string_error_suggests_a_list():
  with pytest.raises(ValueError, match=r"did you mean \['CPU:0'\]"):
    tfd.MirroredStrategy("CPU:0")


@pytest.mark.parametrize("devices", [
    ["CPU:0", "CPU:0"], ["CPU:0", "/cpu:0"], ["cpu:1", "/device:CPU:1"]], ids=str)
def test_duplicated_devices_raise_value_error_naming_them(devices):
  with pytest.raises(AssertionError):
    new_mirrored(tf.distribute, devices)
  with pytest.raises(ValueError, match="No duplicates allowed") as raised:
    tfd.MirroredStrategy(devices)
  assert repr(devices[0]) in str(raised.value)
  assert repr(devices[1]) in str(raised.value)
  assert DEVICES[int(devices[0][-1])] in str(raised.value)


class _Records(logging.Handler):

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.fixture
def tf_warnings():
  """The warnings TensorFlow's logger emits during the test."""
  handler = _Records()
  tf.get_logger().addHandler(handler)
  yield handler.messages
  tf.get_logger().removeHandler(handler)


@pytest.fixture
def absent_gpus(tf_warnings):
  """Our strategy on two GPUs this machine does not have (never TF's: it hangs)."""
  strategy = tfd.MirroredStrategy(["GPU:0", "GPU:1"])
  return strategy, list(tf_warnings)


def test_absent_devices_are_accepted_with_a_warning(absent_gpus):
  strategy, warnings = absent_gpus
  gpus = ("/job:localhost/replica:0/task:0/device:GPU:0",
          "/job:localhost/replica:0/task:0/device:GPU:1")
  assert strategy.extended.worker_devices == gpus
  assert strategy.num_replicas_in_sync == 2
  assert len(warnings) == 1
  assert all(gpu in warnings[0] for gpu in gpus)
  assert "soft placement" in warnings[0]
  assert "ReductionToOneDevice" in warnings[0]
  assert isinstance(_cross_device_ops(strategy), tfd.ReductionToOneDevice)


def test_absent_devices_run_and_all_reduce(absent_gpus, run_mode):
  strategy, _ = absent_gpus
  assert _replica_ids_all_reduced(tfd, strategy, run_mode) == [3.0, 3.0]
  with strategy.scope():
    v = tf.Variable(1.0)
  result = run_mode(lambda: strategy.reduce("SUM", strategy.run(lambda: v * 2.0), axis=None))
  assert float(result) == 4.0


def test_absent_devices_run_after_a_tf1_graph_made_a_function():
  """A test process's runtime starts eagerly (conftest.py): started inside
  this TF1 graph, TensorFlow would keep soft placement off for good."""
  with tf.Graph().as_default():
    tf.data.Dataset.range(2).map(lambda x: x + 1)
  strategy = tfd.MirroredStrategy(["GPU:0", "GPU:1"])
  assert _replica_ids_all_reduced(tfd, strategy, lambda fn: fn()) == [3.0, 3.0]

def test_present_devices_give_no_warning(tf_warnings):
  tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  assert not [m for m in tf_warnings if "not present" in m]


# --- Bad arguments.

PAIR = ["CPU:0", "CPU:1"]


@pytest.mark.parametrize("snippet, theirs, ours, fragments", [
    # TF keeps a string or a class and fails at the first all-reduce.
    (lambda a: a.mod.MirroredStrategy(PAIR, cross_device_ops="nccl"), None, TypeError,
     ["`cross_device_ops`", "instance of tf.distribute.CrossDeviceOps", "str 'nccl'"]),
    (lambda a: a.mod.MirroredStrategy(PAIR, cross_device_ops=tf.distribute.ReductionToOneDevice),
     None, TypeError, ["`cross_device_ops`", "not the class ReductionToOneDevice",
                       "ReductionToOneDevice()"]),
    (lambda a: a.v1.MirroredStrategy(PAIR, cross_device_ops=3), None, TypeError,
     ["`cross_device_ops`", "CrossDeviceOps", "int 3"]),
    # TF fails inside its device parser.
    (lambda a: a.mod.MirroredStrategy(["CPU:0", 3]), AttributeError, TypeError,
     ["`device`", "device name string", "got 3"]),
], ids=["string_ops", "ops_class", "v1_int_ops", "int_device"])
def test_bad_arguments_raise_a_clear_error(snippet, theirs, ours, fragments):
  oracle.check_misuse(snippet, theirs, ours, fragments)


@pytest.mark.parametrize("ops", [tf.distribute.ReductionToOneDevice(),
                                 tf.distribute.NcclAllReduce(), tfd.NcclAllReduce()],
                         ids=["tf_one_device", "tf_nccl", "tfd_nccl"])
def test_cross_device_ops_instances_are_accepted(ops):
  assert _cross_device_ops(tfd.MirroredStrategy(PAIR, cross_device_ops=ops)) is ops


@pytest.mark.parametrize("devices", [
    [tf.config.LogicalDevice(f"/device:CPU:{i}", "CPU") for i in range(2)], [None]],
                         ids=["logical_devices", "none"])
def test_logical_devices_and_none_are_accepted_as_in_tf(devices):
  theirs = new_mirrored(tf.distribute, devices).extended.worker_devices
  assert tfd.MirroredStrategy(devices).extended.worker_devices == theirs == DEVICES[:len(devices)]


# --- Values every replica shares.
#
# A value that is the same object in every replica is already in sync: batch
# reduction (all_reduce, batch_reduce_to) returns it unchanged for SUM and
# MEAN alike. `reduce` and `reduce_to` of one with SUM stay an error, as in TF.

def _shared_all_reduce(mod, reduce_op, run_mode):
  strategy = oracle.mirrored(mod)
  shared = tf.constant([1.0, 2.0, 3.0])
  result = run_mode(lambda: strategy.run(
      lambda x: mod.get_replica_context().all_reduce(reduce_op, x), args=(shared,)))
  return [t.numpy().tolist() for t in strategy.experimental_local_results(result)]


@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
def test_all_reduce_of_a_shared_value_returns_it_like_tf(reduce_op, run_mode):
  expected = _shared_all_reduce(tf.distribute, reduce_op, run_mode)
  assert expected == [[1.0, 2.0, 3.0]] * 4
  assert _shared_all_reduce(tfd, reduce_op, run_mode) == expected


def test_all_reduce_of_shared_and_per_replica_values_together(run_mode):
  strategy = oracle.mirrored(tfd)
  shared = tf.constant(5.0)

  def replica_fn():
    context = tfd.get_replica_context()
    own = tf.cast(context.replica_id_in_sync_group, tf.float32)
    return context.all_reduce("SUM", {"shared": shared, "own": own})
  result = run_mode(lambda: strategy.run(replica_fn))
  assert [float(t) for t in strategy.experimental_local_results(result["own"])] == [6.0] * 4
  assert [float(t) for t in strategy.experimental_local_results(result["shared"])] == [5.0] * 4


def test_all_reduce_of_a_python_number_sums_each_replicas_own():
  # As TF 2.21 in a tf.function; eagerly it raises AttributeError ('float'
  # object has no attribute 'dtype').
  strategy = oracle.mirrored(tfd)
  result = strategy.run(lambda: tfd.get_replica_context().all_reduce("SUM", 2.0))
  assert [float(t) for t in strategy.experimental_local_results(result)] == [8.0] * 4


@MODULES
@pytest.mark.parametrize("destinations", ["value", "CPU:0"])
def test_batch_reduce_to_of_a_shared_value_returns_it(mod, destinations):
  strategy = oracle.mirrored(mod)
  with tf.device("CPU:0"):
    shared = tf.constant([1.0, 2.0])
  destinations = shared if destinations == "value" else destinations
  (result,) = strategy.extended.batch_reduce_to("SUM", [(shared, destinations)])
  assert result.numpy().tolist() == [1.0, 2.0]


def test_batch_reduce_to_copies_a_shared_value_onto_other_devices():
  # TF 2.21 raises IndexError here.
  strategy = oracle.mirrored(tfd)
  with tf.device("CPU:0"):
    shared = tf.constant([1.0, 2.0])
  (one,) = strategy.extended.batch_reduce_to("SUM", [(shared, "CPU:1")])
  assert one.device == DEVICES[1] and one.numpy().tolist() == [1.0, 2.0]
  (both,) = strategy.extended.batch_reduce_to("SUM", [(shared, ["CPU:2", "CPU:3"])])
  assert [c.device for c in both.values] == list(DEVICES[2:])
  assert [c.numpy().tolist() for c in both.values] == [[1.0, 2.0]] * 2


@pytest.mark.parametrize("shared_first", [True, False])
def test_batch_reduce_to_of_shared_next_to_per_replica_values(shared_first):
  # TF 2.21 returns the per-replica values unreduced when the shared value
  # comes first, and raises IndexError when it comes second.
  strategy = oracle.mirrored(tfd)
  shared = tf.constant(7.0)
  own = oracle.TFD.replica_ids()
  pairs = [(shared, shared), (own, own)]
  results = strategy.extended.batch_reduce_to("SUM", pairs if shared_first else pairs[::-1])
  shared_result, own_result = results if shared_first else results[::-1]
  assert float(shared_result) == 7.0
  assert [float(t) for t in own_result.values] == [6.0] * 4


@MODULES
def test_reduce_of_a_shared_value(mod):
  strategy = oracle.mirrored(mod)
  shared = tf.constant([1.0, 2.0])
  assert strategy.reduce("MEAN", shared, axis=None).numpy().tolist() == [1.0, 2.0]
  assert float(strategy.reduce("SUM", shared, axis=0)) == 12.0
  with pytest.raises(ValueError, match="cannot be reduced with the given reduce op"):
    strategy.reduce("SUM", shared, axis=None)
  with pytest.raises(ValueError, match="cannot be reduced with the given reduce op"):
    strategy.extended.reduce_to("SUM", shared, "CPU:0")


# --- Concurrent steps.

def _run_in_threads(work, num_threads=3):
  errors = []

  def guarded():
    try:
      work()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  threads = [threading.Thread(target=guarded) for _ in range(num_threads)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(timeout=120)
  assert not any(t.is_alive() for t in threads), "a thread did not finish"
  assert not errors, errors


def _collective_strategy(devices=DEVICES):
  return tfd.MirroredStrategy(
      devices, cross_device_ops=cross_device_ops_lib.CollectiveAllReduce(devices))


@pytest.mark.parametrize("mode", ["eager", "function", "nested_function"])
def test_threads_running_one_step_at_once(mode):
  strategy = _collective_strategy()
  with strategy.scope():
    offset = tf.Variable(1.0)
  ids = oracle.TFD.replica_ids(strategy)

  def replica_fn(x):
    return tfd.get_replica_context().all_reduce("SUM", x) + offset

  step = lambda x: strategy.run(replica_fn, args=(x,))
  if mode == "function":
    step = tf.function(step)
  elif mode == "nested_function":
    step = tf.function(tf.function(step))

  def work():
    for _ in range(20):
      result = strategy.experimental_local_results(step(ids))
      assert [float(t) for t in result] == [7.0] * 4
  _run_in_threads(work)
  # The strategy's collectives keep working afterwards.
  work()


def test_step_called_from_another_functions_loop_and_branch(run_mode):
  # Keras runs its step function in a loop (steps_per_execution); TF 2.21's
  # collectives fail there ("You must feed a value for placeholder").
  strategy = _collective_strategy()
  ids = oracle.TFD.replica_ids(strategy)
  step = tf.function(lambda x: strategy.run(
      lambda x: tfd.get_replica_context().all_reduce("SUM", x), args=(x,)))

  def loop_and_branch():
    total = tf.constant(0.0)
    for _ in tf.range(3):
      result = tf.cond(tf.constant(True), lambda: step(ids), lambda: step(ids))
      total += strategy.experimental_local_results(result)[0]
    return total
  assert float(run_mode(loop_and_branch)) == 18.0


@pytest.mark.parametrize("work", ["light", "heavy"])
def test_a_step_whose_input_runs_out_updates_no_replica(work):
  # TF 2.21 gives [6, 1, 1, 1] for "heavy": the end of input aborts the
  # copies to the other replicas after replica 0's update already ran.
  strategy = tfd.MirroredStrategy()
  with strategy.scope():
    count = tf.Variable(0.0, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  matrix = tf.random.stateless_normal([300, 300], seed=[1, 2])

  def replica_fn(x):
    increment = tf.constant(1.0)
    if work == "heavy":
      product = matrix
      for _ in range(3):
        product = tf.matmul(product, matrix)
      increment += 0.0 * tf.reduce_sum(product)
    count.assign_add(increment)
    return x

  @tf.function
  def step(iterator):
    return strategy.run(replica_fn, args=(next(iterator),))
  iterator = iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.range(4).batch(4)))
  step(iterator)
  for _ in range(3):
    with pytest.raises(tf.errors.OutOfRangeError):
      step(iterator)
  assert [float(c) for c in count.values] == [1.0] * 4


@pytest.mark.parametrize("mod", [tf.compat.v1.distribute, tfd.compat.v1])
def test_tf1_graph_variables_initialize_equal_and_run(mod):
  """In a TF1 graph, `global_variables_initializer` gives every component
  the primary's (random) initial value in one run."""
  with tf.Graph().as_default():
    strategy = mod.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                    cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
      v = tf.Variable(tf.random.uniform([3]))
      total = strategy.reduce("SUM", strategy.run(lambda: v * 2.0))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      first, second = session.run(strategy.experimental_local_results(v))
      np.testing.assert_array_equal(first, second)
      np.testing.assert_allclose(session.run(total), first * 4.0, rtol=1e-6)


@pytest.mark.parametrize("names, shares", [
    (("foo", "bar"), False),
    (("foo", "foo_1"), True),
    (("foo", "foo"), True),
])
def test_replicas_share_variables_by_name_as_in_tensorflow(names, shares):
  """Replicas after the first get the variable replica 0 made under the same
  name (less a uniquifying `_<n>`); another name is TF's RuntimeError."""
  def snippet(mod):
    strategy = oracle.mirrored(mod, ("CPU:0", "CPU:1"))
    per_replica_names = strategy.experimental_distribute_values_from_function(
        lambda ctx: names[ctx.replica_id_in_sync_group])
    with strategy.scope():
      made = strategy.run(lambda n: tf.Variable(1.0, name=n).name,
                          args=(per_replica_names,))
    return [str(name) for name in strategy.experimental_local_results(made)]
  outcome = oracle.compare(snippet, (tf.distribute,), (tfd,))
  assert isinstance(outcome, oracle.Raised) != shares
