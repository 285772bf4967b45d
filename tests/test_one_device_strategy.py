"""`OneDeviceStrategy`: placement, contexts, `run` and `reduce` on one device,
compared with `tf.distribute.OneDeviceStrategy`."""

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle

DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))
MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])


def _strategy(mod):
  """The OneDeviceStrategy on CPU:1 of `mod`, made once."""
  return oracle.api(mod).one_device("/cpu:1")


def _both(snippet, run_mode=None):
  """`oracle.compare` of `snippet(mod, strategy)` with TF and tfd by repr;
  returns tfd's outcome."""
  return oracle.compare(snippet, (tf.distribute, _strategy(tf.distribute)),
                        (tfd, _strategy(tfd)), run_mode, alike=oracle.same_repr, ours=True)


# --- Construction and placement.

@MODULES
@pytest.mark.parametrize("device", [
    "/cpu:1", "CPU:1", "cpu:1", "/device:CPU:1", DEVICES[1], "/job:localhost/device:CPU:1"])
def test_device_spellings_canonicalise_alike(mod, device):
  strategy = mod.OneDeviceStrategy(device)
  assert strategy.extended.worker_devices == (DEVICES[1],)
  assert strategy.extended.parameter_devices == (DEVICES[1],)
  assert strategy.num_replicas_in_sync == 1


@MODULES
def test_variables_are_plain_and_on_the_device(mod):
  with _strategy(mod).scope():
    v = tf.Variable(1.0)
  assert type(v).__name__ == "ResourceVariable"
  assert v.device == DEVICES[1]
  assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"
  assert _strategy(mod).extended.variable_created_in_scope(v)


def test_ops_in_scope_are_placed_like_tensorflow():
  devices = []
  for mod in (tf.distribute, tfd):
    with _strategy(mod).scope():
      devices.append((tf.identity(1.0).device,
                      tf.function(lambda: tf.identity(1.0).device)().numpy()))
  assert devices[1] == devices[0] == (DEVICES[0], b"")


def test_run_places_ops_on_the_device(run_mode):
  device = _both(lambda mod, s: s.run(lambda: tf.identity(1.0).device), run_mode)
  assert (device.numpy().decode() if tf.is_tensor(device) else device) == DEVICES[1]


# --- Contexts.

@MODULES
def test_contexts_in_scope_and_run(mod, run_mode):
  strategy = _strategy(mod)
  seen = {}

  def replica_fn():
    context = mod.get_replica_context()
    seen["run"] = (mod.get_strategy(), mod.in_cross_replica_context(), context.strategy,
                   int(tf.get_static_value(context.replica_id_in_sync_group)),
                   context.num_replicas_in_sync, context.devices)
    return tf.constant(0)

  with strategy.scope():
    seen["scope"] = (mod.get_strategy(), mod.in_cross_replica_context(),
                     mod.get_replica_context())
  run_mode(lambda: strategy.run(replica_fn))
  assert seen["scope"] == (strategy, True, None)
  assert seen["run"] == (strategy, False, strategy, 0, 1, (DEVICES[1],))
  assert not mod.has_strategy()


# --- run.

def test_run_returns_plain_values(run_mode):
  result = _both(lambda mod, s: s.run(
      lambda x: {"y": x + 1.0, "pair": (x, "label")}, args=(tf.constant(1.0),)), run_mode)
  assert float(result["y"]) == 2.0
  assert result["pair"][1] in ("label", b"label")


def test_collectives_in_run_return_their_input(run_mode):
  def snippet(mod, strategy):
    def replica_fn():
      context = mod.get_replica_context()
      x = tf.constant([4.0, 2.0])
      return (context.all_reduce("SUM", x), context.all_reduce("MEAN", {"x": x}),
              context.all_gather(x, axis=0))
    return strategy.run(replica_fn)
  summed, mean, gathered = _both(snippet, run_mode)
  assert summed.numpy().tolist() == [4.0, 2.0]
  assert mean["x"].numpy().tolist() == [4.0, 2.0]
  assert gathered.numpy().tolist() == [4.0, 2.0]


def test_merge_call_passes_plain_values(run_mode):
  def snippet(mod, strategy):
    def merge_fn(merge_strategy, x):
      assert merge_strategy is strategy
      assert not isinstance(x, tf.distribute.DistributedValues)
      return x * 2.0
    return strategy.run(lambda: mod.get_replica_context().merge_call(
        merge_fn, args=(tf.constant(1.0),)))
  assert float(_both(snippet, run_mode)) == 2.0


def test_distribute_values_from_function_gives_a_plain_value():
  result = _both(lambda mod, s: s.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(10.0 * ctx.num_replicas_in_sync + ctx.replica_id_in_sync_group)))
  assert float(result) == 10.0


def test_run_with_per_replica_args_of_another_replica_count_raises():
  four = tfd.MirroredStrategy().experimental_distribute_values_from_function(
      lambda ctx: ctx.replica_id_in_sync_group)
  with pytest.raises(ValueError, match=r"4 per-replica values.*1 replicas"):
    _strategy(tfd).run(lambda x: x, args=(four,))


# --- reduce, gather, local results.

@pytest.mark.parametrize("op, axis, expected", [
    ("SUM", None, [1.0, 2.0]), ("MEAN", None, [1.0, 2.0]),
    ("SUM", 0, 3.0), ("MEAN", 0, 1.5), ("MEAN", -1, 1.5)])
def test_reduce(run_mode, op, axis, expected):
  result = _both(lambda mod, s: s.reduce(op, s.run(lambda: tf.constant([1.0, 2.0])), axis=axis),
                 run_mode)
  assert result.numpy().tolist() == expected


def test_reduce_with_an_axis_out_of_range_raises():
  for mod in (tf.distribute, tfd):
    with pytest.raises(ValueError):
      _strategy(mod).reduce("SUM", tf.constant([1.0, 2.0]), axis=1)
  with pytest.raises(ValueError, match=r"`axis` = 1\b.*rank 1"):
    _strategy(tfd).reduce("SUM", tf.constant([1.0, 2.0]), axis=1)


def test_reduce_with_an_unknown_op_raises():
  for mod in (tf.distribute, tfd):
    with pytest.raises(ValueError):
      _strategy(mod).reduce("MAX", tf.constant(1.0), axis=None)


def test_gather_and_local_results():
  def snippet(mod, strategy):
    x = tf.constant([[1.0, 2.0]])
    return strategy.gather(x, axis=1), strategy.experimental_local_results(x)
  gathered, components = _both(snippet)
  assert gathered.numpy().tolist() == [[1.0, 2.0]]
  assert isinstance(components, tuple) and len(components) == 1


# --- extended.

def test_update_assigns_the_variable(run_mode):
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    run_mode(lambda: strategy.extended.update(v, lambda c, x: c.assign_add(x), args=(2.0,)))
    run_mode(lambda: strategy.run(lambda: strategy.extended.update(
        v, lambda c, x: c.assign_add(x), args=(3.0,))))
    return v
  assert float(_both(snippet)) == 6.0


def test_reduce_to_and_broadcast_to_return_the_value():
  def snippet(mod, strategy):
    x = tf.constant(1.0)
    return (strategy.extended.reduce_to("SUM", x, destinations="/cpu:1"),
            strategy.extended.broadcast_to(x, destinations="/cpu:1"))
  reduced, broadcast = _both(snippet)
  assert float(reduced) == 1.0
  assert float(broadcast) == 1.0


# --- Devices that are missing or malformed.

@pytest.mark.parametrize("bad", ["foo:bar:baz", "CPU:x"])
def test_malformed_device_raises(bad):
  with pytest.raises(ValueError):
    tf.distribute.OneDeviceStrategy(bad)
  with pytest.raises(ValueError, match=f"Malformed device string '{bad}'"):
    tfd.OneDeviceStrategy(bad)


def test_an_absent_device_uses_soft_placement(run_mode):
  def snippet(mod, _):
    strategy = mod.OneDeviceStrategy("GPU:0")
    with strategy.scope():
      v = tf.Variable(1.0)
    return strategy.extended.worker_devices, run_mode(lambda: strategy.run(lambda: v + 1.0))
  devices, result = _both(snippet)
  assert devices == ("/job:localhost/replica:0/task:0/device:GPU:0",)
  assert float(result) == 2.0
