"""Which strategy and context is current: outside every scope, in `scope()`,
in `run`, in `merge_call`, and what TensorFlow's own `tf.distribute` sees.

Most tests run once against `tf.distribute` and once against
`tf_distribute_lite`, with the same expectations.
"""

import threading

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
from oracle import TF, TFD

DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))


@pytest.fixture(params=[TF, TFD], ids=lambda a: a.name)
def api(request):
  return request.param


def _state(mod):
  """What the context functions of `mod` answer here."""
  return (mod.get_strategy(), mod.has_strategy(), mod.in_cross_replica_context(),
          mod.get_replica_context())


def _observe(run_mode, fn):
  """The Python value `fn` returns, called eagerly or while tracing."""
  seen = []

  def body():
    seen.append(fn())
    return tf.constant(0)
  run_mode(body)
  assert len(seen) == 1
  return seen[0]


def _replica_id(replica_context):
  return int(tf.get_static_value(replica_context.replica_id_in_sync_group))


# --- Outside every scope.

def test_outside_any_scope_the_default_strategy_is_current(api, run_mode):
  strategy, has, cross, replica_context = _observe(run_mode, lambda: _state(api.mod))
  assert not has
  assert not cross
  assert strategy.num_replicas_in_sync == 1
  assert replica_context is not None
  assert replica_context.strategy is strategy
  assert replica_context.num_replicas_in_sync == 1
  assert _replica_id(replica_context) == 0


def test_default_strategy_is_one_object(api):
  assert api.mod.get_strategy() is api.mod.get_strategy()
  assert api.mod.get_replica_context() is api.mod.get_replica_context()


def test_default_replica_context_devices(api):
  assert api.mod.get_replica_context().devices == ("",)
  with tf.device("CPU:1"):
    assert api.mod.get_replica_context().devices == (DEVICES[1],)


def test_default_strategy_has_no_worker_devices(api):
  with pytest.raises(RuntimeError, match="unsupported by default"):
    api.mod.get_strategy().extended.worker_devices  # pylint: disable=expression-not-assigned


# --- Inside `strategy.scope()`.

def test_inside_scope_the_strategy_is_current_in_cross_replica_context(api, run_mode):
  strategy = api.mirrored
  with strategy.scope() as entered:
    assert entered is strategy
    current, has, cross, replica_context = _observe(run_mode, lambda: _state(api.mod))
  assert current is strategy
  assert has and cross
  assert replica_context is None
  assert not api.mod.has_strategy()


def test_nested_scopes_of_one_strategy(api):
  strategy = api.mirrored
  with strategy.scope():
    with strategy.scope():
      assert _state(api.mod) == (strategy, True, True, None)
    assert _state(api.mod) == (strategy, True, True, None)
  assert not api.mod.has_strategy()
  assert not api.mod.in_cross_replica_context()


def test_scope_of_another_strategy_inside_a_scope_raises(api):
  with api.mirrored.scope():
    with pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy objects"):
      with api.one_device("CPU:0").scope():
        pass
    assert api.mod.get_strategy() is api.mirrored
  assert not api.mod.has_strategy()


def test_scope_is_per_thread(api):
  seen = []
  with api.mirrored.scope():
    thread = threading.Thread(target=lambda: seen.append(_state(api.mod)[1:3]))
    thread.start()
    thread.join()
    assert api.mod.has_strategy()
  assert seen == [(False, False)]


# --- Inside `strategy.run`.

def test_inside_run_each_replica_has_its_replica_context(api, run_mode):
  strategy = api.mirrored
  seen = {}

  def replica_fn():
    replica_context = api.mod.get_replica_context()
    seen[_replica_id(replica_context)] = (replica_context,) + _state(api.mod)
    return replica_context.replica_id_in_sync_group

  result = run_mode(lambda: strategy.run(replica_fn))
  assert sorted(seen) == [0, 1, 2, 3]
  for replica_context, current, has, cross, current_context in seen.values():
    assert current_context is replica_context
    assert replica_context.strategy is strategy
    assert replica_context.num_replicas_in_sync == 4
    assert current is strategy
    assert has and not cross
  assert len({id(entry[0]) for entry in seen.values()}) == 4
  ids = [int(t) for t in strategy.experimental_local_results(result)]
  assert ids == [0, 1, 2, 3]
  assert sum(ids) == 6
  assert not api.mod.has_strategy()


def test_replica_id_is_an_int32_tensor(api, run_mode):
  result = run_mode(lambda: api.mirrored.run(
      lambda: api.mod.get_replica_context().replica_id_in_sync_group))
  assert [t.dtype for t in api.mirrored.experimental_local_results(result)] == [tf.int32] * 4


def test_replica_context_devices(api):
  seen = {}

  def replica_fn():
    replica_context = api.mod.get_replica_context()
    seen[_replica_id(replica_context)] = replica_context.devices
    return tf.constant(0)

  api.mirrored.run(replica_fn)
  assert seen == {i: [[d]] for i, d in enumerate(DEVICES)}


def test_replica_context_devices_outside_its_replica_raises(api):
  replica_context = api.mirrored.run(api.mod.get_replica_context).values[0]
  with pytest.raises(RuntimeError, match="Mismatching tf.distribute.Strategy objects"):
    replica_context.devices  # pylint: disable=pointless-statement


@pytest.mark.parametrize("which, message", [
    ("same", "Method requires being in cross-replica context"),
    ("other", "Mixing different tf.distribute.Strategy objects"),
])
def test_scope_inside_run_raises(api, run_mode, which, message):
  target = api.mirrored if which == "same" else api.one_device("CPU:0")

  def replica_fn():
    with target.scope():
      pass
    return tf.constant(0)

  with pytest.raises(RuntimeError, match=message):
    run_mode(lambda: api.mirrored.run(replica_fn))
  assert not api.mod.has_strategy()


# --- Inside `merge_call`.

def test_merge_fn_runs_once_in_cross_replica_context(api, run_mode):
  strategy = api.mirrored
  merged, after = [], []

  def merge_fn(merge_strategy, value):
    merged.append((merge_strategy,) + _state(api.mod))
    return value

  def replica_fn():
    replica_context = api.mod.get_replica_context()
    result = replica_context.merge_call(
        merge_fn, args=(replica_context.replica_id_in_sync_group,))
    after.append(api.mod.get_replica_context() is replica_context and
                 not api.mod.in_cross_replica_context())
    return result

  result = run_mode(lambda: strategy.run(replica_fn))
  assert merged == [(strategy, strategy, True, True, None)]
  assert after == [True] * 4
  assert [int(t) for t in strategy.experimental_local_results(result)] == [0, 1, 2, 3]


# --- tf.summary in replicas.

def _summary_events(directory):
  """(tag, step, value) of every summary written into `directory`."""
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top
  events = []
  for path in sorted(tf.io.gfile.glob(f"{directory}/*")):
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      events += [(v.tag, event.step, float(tf.make_ndarray(v.tensor)))
                 for v in event.summary.value]
  return events


def test_only_replica_zero_records_summaries(api, run_mode, tmp_path):
  """Every replica writes; replica 0's summary alone is recorded, before and
  after a `merge_call`, with the writer and step of the caller."""
  strategy = api.mirrored
  writer = tf.summary.create_file_writer(str(tmp_path))

  def replica_fn():
    replica_context = api.mod.get_replica_context()
    value = tf.cast(replica_context.replica_id_in_sync_group, tf.float32) + 1.0
    before = tf.summary.write("before", value, step=1)
    replica_context.merge_call(lambda _: None)
    after = tf.summary.write("after", value)
    return before, after, tf.summary.should_record_summaries()

  with writer.as_default(step=7):
    results = run_mode(lambda: strategy.run(replica_fn))
    assert tf.summary.should_record_summaries()
  writer.flush()
  for result in results:
    assert [bool(r) for r in strategy.experimental_local_results(result)] == [
        True, False, False, False]
  assert _summary_events(tmp_path) == [("before", 1, 1.0), ("after", 7, 1.0)]


# --- experimental_set_strategy.

def test_experimental_set_strategy_sets_switches_and_resets(api, run_mode):
  strategy, other = api.mirrored, api.one_device("CPU:0")
  try:
    api.mod.experimental_set_strategy(strategy)
    assert _state(api.mod) == (strategy, True, True, None)
    assert _observe(run_mode, lambda: _state(api.mod)) == (strategy, True, True, None)
    with strategy.scope():
      assert api.mod.get_strategy() is strategy
    assert api.mod.get_strategy() is strategy
    result = strategy.run(lambda: api.mod.get_replica_context().replica_id_in_sync_group)
    assert [int(t) for t in strategy.experimental_local_results(result)] == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="Mixing different"):
      with other.scope():
        pass
    api.mod.experimental_set_strategy(other)
    assert _state(api.mod) == (other, True, True, None)
  finally:
    api.mod.experimental_set_strategy(None)
  assert not api.mod.has_strategy()
  assert not api.mod.in_cross_replica_context()
  assert api.mod.get_replica_context() is not None


def test_experimental_set_strategy_none_without_a_strategy_is_a_no_op(api):
  api.mod.experimental_set_strategy(None)
  assert not api.mod.has_strategy()


def test_experimental_set_strategy_inside_a_scope_raises(api):
  with api.mirrored.scope():
    with pytest.raises(RuntimeError, match="Must not be called inside a `tf.distribute.Strategy`"):
      api.mod.experimental_set_strategy(api.one_device("CPU:0"))
    assert api.mod.get_strategy() is api.mirrored
  assert not api.mod.has_strategy()


# --- The contract: TensorFlow's own functions see our strategies.

def _tf_state():
  return _state(tf.distribute)


def test_tensorflow_sees_our_scope(run_mode):
  strategy = TFD.mirrored
  with strategy.scope():
    seen = _observe(run_mode, _tf_state)
  assert seen == (strategy, True, True, None)
  assert not tf.distribute.has_strategy()
  assert not isinstance(tf.distribute.get_strategy(), tfd.Strategy)


def test_tensorflow_sees_our_replica_contexts(run_mode):
  strategy = TFD.mirrored
  seen = {}

  def replica_fn():
    replica_context = tf.distribute.get_replica_context()
    assert replica_context is tfd.get_replica_context()
    seen[_replica_id(replica_context)] = (replica_context,) + _tf_state()
    return replica_context.replica_id_in_sync_group

  result = run_mode(lambda: strategy.run(replica_fn))
  assert sorted(seen) == [0, 1, 2, 3]
  for replica_context, current, has, cross, current_context in seen.values():
    assert isinstance(replica_context, tfd.ReplicaContext)
    assert current_context is replica_context
    assert replica_context.strategy is strategy
    assert replica_context.num_replicas_in_sync == 4
    assert (current, has, cross) == (strategy, True, False)
  assert [int(t) for t in strategy.experimental_local_results(result)] == [0, 1, 2, 3]


def test_tensorflow_sees_our_merge_call(run_mode):
  strategy = TFD.mirrored
  merged = []

  def replica_fn():
    return tf.distribute.get_replica_context().merge_call(
        lambda s: merged.append((s,) + _tf_state()) or tf.constant(1))

  run_mode(lambda: strategy.run(replica_fn))
  assert merged == [(strategy, strategy, True, True, None)]


def test_tensorflow_sees_our_experimental_set_strategy(run_mode):
  strategy = TFD.mirrored
  try:
    tfd.experimental_set_strategy(strategy)
    seen = _observe(run_mode, _tf_state)
  finally:
    tfd.experimental_set_strategy(None)
  assert seen == (strategy, True, True, None)
  assert not tf.distribute.has_strategy()


@pytest.mark.parametrize("devices, expected", [(None, 0.5), (["CPU:0", "CPU:1"], 1.0)])
def test_compute_average_loss_in_our_run_uses_our_replica_count(run_mode, devices, expected):
  strategy = TFD.mirrored if devices is None else tfd.MirroredStrategy(devices)
  result = run_mode(lambda: strategy.run(
      lambda: tf.nn.compute_average_loss(tf.constant([1.0, 3.0]))))
  values = [float(t) for t in strategy.experimental_local_results(result)]
  assert values == [expected] * strategy.num_replicas_in_sync


def test_compute_average_loss_matches_tensorflows_strategy():
  oracle.compare(lambda a: a.mirrored.run(
      lambda: tf.nn.compute_average_loss(tf.constant([1.0, 3.0]))), (TF,), (TFD,),
                 alike=oracle.same_repr)


def test_tensorflows_default_run_uses_a_strategys_variables(api, run_mode):
  """Keras steps a model built outside every scope on TensorFlow's default
  strategy, which pushes its replica context onto the stack we share: no
  strategy is in effect there, and distributed variables read as one value."""
  with api.mirrored.scope():
    mirrored = tf.Variable(3.0)
    on_read = tf.Variable(2.0, synchronization=tf.VariableSynchronization.ON_READ,
                          aggregation=tf.VariableAggregation.SUM)

  def replica_fn():
    assert not api.mod.has_strategy()
    return mirrored.assign_add(1.0) * 2.0, on_read * 1.0

  doubled, summed = run_mode(lambda: tf.distribute.get_strategy().run(replica_fn))
  assert (float(doubled), float(summed)) == (8.0, 8.0)
  assert [float(v) for v in mirrored.values] == [4.0] * 4


# --- The default strategy's scope.

def test_default_scope_stays_in_the_default_replica_context(api, run_mode):
  default = api.mod.get_strategy()

  def observe():
    with default.scope() as entered:
      assert entered is default
      return (api.mod.in_cross_replica_context(), api.mod.has_strategy(),
              type(api.mod.get_replica_context()).__name__,
              api.mod.get_strategy() is default)
  assert _observe(run_mode, observe) == (False, False, "_DefaultReplicaContext", True)


def test_default_scope_nests_in_itself(api):
  default = api.mod.get_strategy()
  with default.scope():
    with default.scope():
      assert not api.mod.in_cross_replica_context()
      assert type(tf.Variable(1.0)).__name__ == "ResourceVariable"


def test_default_scope_inside_another_strategys_scope_raises(api):
  default = api.mod.get_strategy()
  with api.mirrored.scope():
    with pytest.raises(RuntimeError, match="Must not nest tf.distribute.Strategy scopes"):
      with default.scope():
        pass


def test_a_strategys_scope_inside_the_default_scope_makes_its_variables():
  # TF 2.21 allows entering the scope but then refuses every variable
  # ("Mixing different tf.distribute.Strategy objects").
  strategy = TFD.pair
  with tfd.get_strategy().scope():
    with strategy.scope():
      v = tf.Variable(1.0)
  assert type(v).__name__ == "MirroredVariable"
