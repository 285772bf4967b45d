"""`Strategy`, `StrategyExtended` and `ReplicaContext`, compared with
`tf.distribute`: each snippet runs against both and must give the same reprs,
values and exception classes, in eager mode and inside a `tf.function`.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
from oracle import TF, TFD, new_mirrored, new_tf_mirrored

DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4))

Pair = collections.namedtuple("Pair", ["first", "second"])


def _is_eager(run_mode):
  return bool(run_mode(tf.executing_eagerly))


def both(snippet, run_mode=None, oracle_in_function=True):
  """`oracle.compare` of `snippet(api)` with TF and tfd by repr; returns
  tfd's result (its exception, if it raised).

  Where TensorFlow is slow, `oracle_in_function=False` runs only tfd inside
  a `tf.function`.
  """
  if run_mode and not oracle_in_function and not _is_eager(run_mode):
    return run_mode(lambda: snippet(TFD))
  result = oracle.compare(snippet, (TF,), (TFD,), run_mode, alike=oracle.same_repr, ours=True)
  return result.error if isinstance(result, oracle.Raised) else result


def local(strategy, value):
  """The per-replica components of `value` as numpy values."""
  return [np.asarray(v).tolist() for v in strategy.experimental_local_results(value)]


# --- run.

def test_run_replica_ids(run_mode):
  result = both(lambda a: a.mirrored.run(
      lambda: a.mod.get_replica_context().replica_id_in_sync_group), run_mode)
  assert isinstance(result, tfd.values.PerReplica)
  assert local(TFD.mirrored, result) == [0, 1, 2, 3]


def test_run_with_per_replica_args_and_kwargs(run_mode):
  def snippet(a):
    ids = a.replica_ids()
    return a.mirrored.run(lambda x, y, scale=1.0: x * y + scale,
                          args=(ids, 10.0), kwargs={"scale": ids})
  result = both(snippet, run_mode)
  assert local(TFD.mirrored, result) == [0.0, 11.0, 22.0, 33.0]


def test_run_regroups_nested_structures_per_element(run_mode):
  def snippet(a):
    ids = a.replica_ids()

    def replica_fn(x):
      return (x + 1.0, {"double": x * 2.0, "one": tf.constant(1.0)},
              Pair(x, "label"), [x - 1.0])
    return a.mirrored.run(replica_fn, args=(ids,))
  result = both(snippet, run_mode)
  plus_one, as_dict, pair, as_list = result
  assert local(TFD.mirrored, plus_one) == [1.0, 2.0, 3.0, 4.0]
  assert local(TFD.mirrored, as_dict["double"]) == [0.0, 2.0, 4.0, 6.0]
  assert local(TFD.mirrored, as_dict["one"]) == [1.0] * 4
  assert isinstance(pair, Pair)
  assert local(TFD.mirrored, pair.first) == [0.0, 1.0, 2.0, 3.0]
  assert isinstance(as_list, list)
  assert local(TFD.mirrored, as_list[0]) == [-1.0, 0.0, 1.0, 2.0]


def test_run_keeps_python_values_every_replica_shares():
  pair = both(lambda a: a.mirrored.run(lambda: Pair("label", None)))
  assert pair == Pair("label", None)
  assert both(lambda a: a.mirrored.run(lambda: 5)) == 5


def test_run_returns_a_captured_tensor_unwrapped(run_mode):
  captured = tf.constant(3.0)
  result = both(lambda a: a.mirrored.run(lambda: captured), run_mode)
  assert float(result) == 3.0


def test_run_with_one_replica_returns_plain_values(run_mode):
  def snippet(a):
    return (a.one_device().run(lambda x: {"y": x + 1.0}, args=(tf.constant(1.0),)),
            a.mod.get_strategy().run(lambda: tf.constant(2.0)))
  on_device, default = both(snippet, run_mode)
  assert float(on_device["y"]) == 2.0
  assert float(default) == 2.0


def test_run_with_one_device_mirrored_strategy_returns_plain_values():
  def snippet(a):
    strategy = new_mirrored(a.mod, ["CPU:0"], cross_device_ops=a.mod.ReductionToOneDevice())
    return strategy.run(lambda: tf.constant(1.0))
  assert float(both(snippet)) == 1.0


def test_run_a_tf_function(run_mode):
  double = tf.function(lambda x: x * 2.0)
  result = both(lambda a: a.mirrored.run(double, args=(a.replica_ids(),)), run_mode)
  assert local(TFD.mirrored, result) == [0.0, 2.0, 4.0, 6.0]


def test_run_a_tf_function_that_all_reduces(run_mode):
  def snippet(a):
    @tf.function
    def step(x):
      return a.mod.get_replica_context().all_reduce("SUM", x)
    return a.mirrored.run(step, args=(a.replica_ids(),))
  result = both(snippet, run_mode)
  assert local(TFD.mirrored, result) == [6.0] * 4


def test_run_inside_a_function_taking_per_replica_values():
  def snippet(a):
    step = tf.function(lambda x: a.mirrored.run(lambda y: y * y, args=(x,)))
    return step(a.replica_ids())
  assert local(TFD.mirrored, both(snippet)) == [0.0, 1.0, 4.0, 9.0]


def test_run_places_each_replica_on_its_device():
  result = both(lambda a: a.mirrored.run(lambda: tf.identity(a.replica_id()).device))
  assert list(result.values) == list(DEVICES)


def test_run_with_per_replica_args_of_another_replica_count_raises():
  two = TFD.replica_ids(TFD.pair)
  with pytest.raises(ValueError, match=r"2 per-replica values.*4 replicas"):
    TFD.mirrored.run(lambda x: x, args=(two,))
  with pytest.raises(ValueError, match=r"`kwargs`\['x'\].*2 per-replica values.*4 replicas"):
    TFD.mirrored.run(lambda x: x, kwargs={"x": two})
  with pytest.raises(ValueError, match=r"2 per-replica values.*4 replicas"):
    tf.function(lambda: TFD.mirrored.run(lambda x: x, args=((1.0, two),)))()


def test_run_returning_a_python_object_from_a_function_raises():
  def snippet(a):
    return tf.function(lambda: a.mirrored.run(object))()
  assert isinstance(both(snippet), TypeError)


def test_run_takes_keras_variables_as_arguments(run_mode):
  """Keras variables, tensors to `tf.is_tensor` but not to `tf.group`, go
  through args, kwargs, nests and `call_for_each_replica` in a merge."""
  def results(a):
    with a.mirrored.scope():
      mirrored = keras.Variable([1.0, 2.0])
    plain = keras.Variable([3.0, 4.0])

    def merge_fn(strategy, v):
      return strategy.extended.call_for_each_replica(lambda w: w + 1.0, args=(v,))

    def replica_fn(v, nested, w=None):
      merged = a.mod.get_replica_context().merge_call(merge_fn, args=(v,))
      return v * 2.0, nested[0][0] + w, merged
    step = lambda: a.mirrored.run(replica_fn, args=(mirrored, [[plain]]),
                                  kwargs={"w": mirrored})
    return [local(a.mirrored, r) for r in run_mode(step)]
  assert results(TFD) == results(TF) == [
      [[2.0, 4.0]] * 4, [[4.0, 6.0]] * 4, [[2.0, 3.0]] * 4]


def test_replica_ops_of_every_run_in_a_graph_share_one_scope():
  """A second `run` in one graph names replica 1's ops `replica_1/..._1`,
  as TF does, not `replica_1_1/...`."""
  def names(a):
    traced = []

    @tf.function
    def two_runs():
      for _ in range(2):
        result = a.pair.run(lambda: tf.identity(a.replica_id(), name="own"))
        traced.append(result.values[1].op.name)
    two_runs.get_concrete_function()
    return traced
  assert names(TFD) == names(TF) == ["replica_1/own", "replica_1/own_1"]


@pytest.mark.parametrize("strategy", ["pair", "one_device"])
def test_run_gives_each_replica_its_own_argument_containers(run_mode, strategy):
  """A replica may mutate its inputs, as Orbit's trainers do
  (`inputs.pop(label_key)`): MirroredStrategy gives each replica (and so
  the caller) its own containers; OneDeviceStrategy passes them as given."""
  def snippet(a):
    chosen = a.pair if strategy == "pair" else a.one_device()
    features = {"x": tf.constant(1.0), "label": tf.constant(2.0)}
    nested = [tf.constant(3.0), Pair([tf.constant(4.0)], {"y": tf.constant(5.0)})]

    def replica_fn(inputs, more):
      label = tf.identity(inputs.pop("label"))
      more.append(None)
      more[1].first.append(None)
      more[1].second.clear()
      return label
    labels = run_mode(lambda: chosen.run(replica_fn, args=(features, nested)))
    return local(chosen, labels), sorted(features), len(nested), nested[1]
  labels, keys, length, pair = both(snippet)
  assert labels == ([2.0] * 2 if strategy == "pair" else [2.0])
  if strategy == "pair":
    assert (keys, length, len(pair.first), sorted(pair.second)) == (["label", "x"], 2, 1, ["y"])
  else:
    assert (keys, length, len(pair.first), pair.second) == (["x"], 3, 2, {})


def test_variables_made_after_merge_call_are_shared_by_the_replicas():
  """After a `merge_call` the replicas run on threads; eagerly each thread
  has a default graph of its own, which the strategy's variable creators
  must reach too."""
  def snippet(a):
    def replica_fn():
      a.mod.get_replica_context().merge_call(lambda strategy: None)
      with tf.compat.v1.variable_scope("shared", reuse=tf.compat.v1.AUTO_REUSE):
        by_name = tf.compat.v1.get_variable("w", shape=[], initializer=tf.compat.v1.ones_initializer())
      return by_name, tf.Variable(2.0, name="v")
    with a.pair.scope():
      return a.pair.extended.call_for_each_replica(replica_fn)
  by_name, plain = both(snippet)
  for variable in (by_name, plain):
    assert type(variable).__name__ == "MirroredVariable"
    assert [c.device[-5:] for c in variable.values] == ["CPU:0", "CPU:1"]


def test_replica_threads_keep_the_callers_variable_scope_eagerly():
  """Replicas that run on threads after a merge_call create their variables
  in the variable scope `call_for_each_replica` was called in, and share
  replica 0's, as in TensorFlow."""
  def snippet(a):
    def replica_fn():
      first = tf.compat.v1.get_variable("first", [1])
      with tf.compat.v1.variable_scope("inner"):
        a.mod.get_replica_context().merge_call(lambda strategy: None)
        after = tf.compat.v1.get_variable("after", [1])
      return first, after, tf.Variable(1.0, name="plain")
    with a.pair.scope(), tf.compat.v1.variable_scope("outer"):
      made = a.pair.extended.call_for_each_replica(replica_fn)
    return [[c.name for c in variable.values] for variable in made]
  assert both(snippet) == [[f"outer/{name}:0", f"outer/{name}/replica_1:0"]
                           for name in ("first", "inner/after", "plain")]


# --- experimental_distribute_values_from_function.

def test_distribute_values_from_function_passes_a_value_context():
  result = both(lambda a: a.mirrored.experimental_distribute_values_from_function(
      lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, str(ctx))))
  assert local(TFD.mirrored, result[0]) == [0, 1, 2, 3]
  assert local(TFD.mirrored, result[1]) == [4] * 4
  assert result[2].values[2] == (
      "tf.distribute.ValueContext(replica id 2,  total replicas in sync: 4)")


def test_distribute_values_from_function_always_wraps():
  result = both(lambda a: a.mirrored.experimental_distribute_values_from_function(lambda ctx: 7))
  assert isinstance(result, tfd.values.PerReplica)
  assert list(result.values) == [7] * 4


def test_distribute_values_from_function_does_not_place_values():
  result = both(lambda a: [v.device for v in a.replica_ids().values])
  assert result == [DEVICES[0]] * 4


# --- reduce.

@pytest.mark.parametrize("op, expected", [("SUM", 6.0), ("MEAN", 1.5)])
def test_reduce_across_replicas(run_mode, op, expected):
  result = both(lambda a: a.mirrored.reduce(op, a.replica_ids(), axis=None), run_mode)
  assert float(result) == expected


def _blocks(a):
  """Per replica a [2, 3] block: arange(6) + 10 * replica id."""
  return a.mirrored.experimental_distribute_values_from_function(
      lambda ctx: tf.reshape(tf.range(6.0), [2, 3]) + 10.0 * ctx.replica_id_in_sync_group)


@pytest.mark.parametrize("op, axis, expected", [
    ("SUM", None, [[60.0, 64.0, 68.0], [72.0, 76.0, 80.0]]),
    ("MEAN", None, [[15.0, 16.0, 17.0], [18.0, 19.0, 20.0]]),
    ("SUM", 0, [132.0, 140.0, 148.0]),
    ("MEAN", 0, [16.5, 17.5, 18.5]),
    ("SUM", 1, [192.0, 228.0]),
    ("MEAN", -1, [16.0, 19.0]),
    ("MEAN", -2, [16.5, 17.5, 18.5]),
])
def test_reduce_along_an_axis(run_mode, op, axis, expected):
  result = both(lambda a: a.mirrored.reduce(op, _blocks(a), axis=axis), run_mode)
  assert np.asarray(result).tolist() == expected


def _partial_batch(a):
  """The spec's last batch of 6 examples: [0, 1, 2, 3] and [4, 5]."""
  return a.pair.experimental_distribute_values_from_function(
      lambda ctx: [tf.constant([0.0, 1.0, 2.0, 3.0]), tf.constant([4.0, 5.0])][
          ctx.replica_id_in_sync_group])


@pytest.mark.parametrize("op, axis, expected", [
    ("MEAN", 0, 2.5), ("SUM", 0, 15.0), ("MEAN", -1, 2.5)])
def test_reduce_partial_batch_divides_by_the_true_count(run_mode, op, axis, expected):
  result = both(lambda a: a.pair.reduce(op, _partial_batch(a), axis=axis), run_mode)
  assert float(result) == expected


def _ragged_rows(a, dtype=tf.float32):
  """Replica i holds a [2, i + 1] block: rows of different lengths."""
  return a.mirrored.experimental_distribute_values_from_function(
      lambda ctx: tf.cast(tf.reshape(tf.range(2 * (ctx.replica_id_in_sync_group + 1)),
                                     [2, -1]), dtype))


@pytest.mark.parametrize("op, axis", [("SUM", [0, 1]), ("MEAN", [0, 1]),
                                      ("MEAN", [1, 0]), ("SUM", 1)])
def test_reduce_along_axes_of_blocks_of_different_widths(run_mode, op, axis):
  # TF 2.21 takes only one axis (a list raises TypeError: unhashable type).
  reduce = lambda a: a.mirrored.reduce(op, _ragged_rows(a), axis=axis)
  result = both(reduce, run_mode) if axis == 1 else run_mode(lambda: reduce(TFD))
  widths = [1, 2, 3, 4]
  totals = [sum(range(2 * w)) for w in widths]
  if axis == 1:
    assert result.numpy().tolist() == [
        sum(sum(range(w)) for w in widths), sum(sum(range(w, 2 * w)) for w in widths)]
  elif op == "SUM":
    assert float(result) == sum(totals)
  else:
    assert float(result) == pytest.approx(sum(totals) / (2 * sum(widths)))


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.float64])
def test_reduce_mean_along_an_axis_keeps_tf_dtypes(dtype, run_mode):
  result = both(lambda a: a.mirrored.reduce(
      "MEAN", _ragged_rows(a, dtype), axis=1), run_mode)
  assert result.dtype == tf.float64
  assert result.numpy().tolist() == [1.0, 4.0]


def test_reduce_partial_batch_without_axis_raises():
  error = both(lambda a: a.pair.reduce("MEAN", _partial_batch(a), axis=None))
  assert isinstance(error, tf.errors.InvalidArgumentError)


@pytest.mark.parametrize("op", [
    tfd.ReduceOp.SUM, tf.distribute.ReduceOp.SUM, "SUM", "sum",
    tfd.ReduceOp.MEAN, tf.distribute.ReduceOp.MEAN, "MEAN", "mean"],
    ids=lambda op: f"{type(op).__module__.split('.')[0]}.{op}")
def test_reduce_accepts_every_spelling_of_the_op(op):
  is_sum = "SUM" in str(op).upper()
  assert float(TFD.mirrored.reduce(op, TFD.replica_ids(), axis=None)) == (6.0 if is_sum else 1.5)
  along = TFD.mirrored.reduce(op, _blocks(TFD), axis=0).numpy().tolist()
  assert along == ([132.0, 140.0, 148.0] if is_sum else [16.5, 17.5, 18.5])


def test_reduce_a_nest():
  result = both(lambda a: a.mirrored.reduce(
      "SUM", {"a": a.replica_ids(), "b": (a.replica_ids(),)}, axis=None))
  assert float(result["a"]) == 6.0
  assert float(result["b"][0]) == 6.0


def _messages_start_alike(snippet, error_class):
  """Runs `snippet(api)` with TF and tfd: both raise `error_class`, and
  ours says what TF's says first."""
  messages = []
  for api in (TF, TFD):
    with pytest.raises(error_class) as raised:
      snippet(api)
    messages.append(str(raised.value))
  theirs, ours = messages
  assert ours.startswith(theirs), f"\nTF: {theirs}\nours: {ours}"


def test_reduce_a_value_every_replica_shares():
  assert float(both(lambda a: a.mirrored.reduce("MEAN", tf.constant(2.0), axis=None))) == 2.0
  _messages_start_alike(
      lambda a: a.mirrored.reduce("SUM", tf.ones([3]), axis=None), ValueError)
  _messages_start_alike(
      lambda a: a.mirrored.extended.reduce_to("SUM", tf.ones([3]), "CPU:0"), ValueError)


@pytest.mark.parametrize("op", ["MAX", "max", ""])
def test_reduce_with_an_unknown_op_raises(op):
  _messages_start_alike(
      lambda a: a.mirrored.reduce(op, a.replica_ids(), axis=None), ValueError)
  _messages_start_alike(
      lambda a: a.mirrored.reduce(op, a.replica_ids(), axis=0), ValueError)
  _messages_start_alike(
      lambda a: a.mirrored.extended.reduce_to(op, a.replica_ids(), "CPU:0"), ValueError)
  _messages_start_alike(lambda a: a.mirrored.run(
      lambda: a.mod.get_replica_context().all_reduce(op, tf.constant(1.0))), ValueError)
  with pytest.raises(ValueError, match="use tf.distribute.ReduceOp.SUM or MEAN"):
    TFD.mirrored.reduce(op, TFD.replica_ids(), axis=None)


@pytest.mark.parametrize("axis", [2, -3])
def test_reduce_with_an_axis_out_of_range_raises(axis):
  assert isinstance(both(lambda a: a.mirrored.reduce("MEAN", _blocks(a), axis=axis)),
                    ValueError)
  with pytest.raises(ValueError, match=rf"`axis` = {axis}\b.*rank 2"):
    TFD.mirrored.reduce("SUM", _blocks(TFD), axis=axis)


@pytest.mark.parametrize("axis, theirs, ours, fragment", [
    (np.int64(1), None, None, None),
    # TF hashes the axis: a list is a TypeError, whatever it holds.
    ([1, -1], TypeError, ValueError, "`axis` = [1, -1] names an axis more than once"),
    (tf.constant(0), TypeError, TypeError, "`axis` must be None, an int or a list of ints"),
], ids=["numpy_int", "repeated", "tensor"])
def test_reduce_axis_of_other_types(axis, theirs, ours, fragment):
  def snippet(a):
    return a.mirrored.reduce("SUM", _blocks(a), axis=axis)
  if ours is None:
    assert float(tf.reduce_sum(snippet(TF))) == float(tf.reduce_sum(snippet(TFD))) == 420.0
  else:
    oracle.check_misuse(snippet, theirs, ours, [fragment])


def test_reduce_in_a_replica_context_raises(run_mode):
  error = both(lambda a: a.mirrored.run(
      lambda: a.mirrored.reduce("SUM", tf.constant(1.0), axis=None)), run_mode)
  assert isinstance(error, RuntimeError)
  assert "cross-replica context" in str(error)


# --- gather and experimental_local_results.

@pytest.mark.parametrize("axis, shape", [(0, [8, 3]), (1, [2, 12])])
def test_gather(run_mode, axis, shape):
  result = both(lambda a: a.mirrored.gather(_blocks(a), axis=axis), run_mode)
  assert result.shape.as_list() == shape
  assert float(tf.reduce_sum(result)) == 4 * 15.0 + 6 * 60.0


def test_gather_of_a_nest_gathers_each_element(run_mode):
  # TF 2.21 returns replica 0's components of a nest, so each element is
  # compared with TF's gather of it alone.
  def elements(a):
    return [_blocks(a), a.mirrored.run(lambda: tf.reshape(a.replica_id(), [1])),
            tf.constant([7.0])]
  ours = run_mode(lambda: TFD.mirrored.gather(
      dict(zip("abc", elements(TFD))), axis=0))
  theirs = [TF.mirrored.gather(e, axis=0) for e in elements(TF)]
  assert sorted(ours) == ["a", "b", "c"]
  for name, expected in zip("abc", theirs):
    assert ours[name].numpy().tolist() == expected.numpy().tolist()
  assert ours["b"].numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def _slices(value=0.0):
  return tf.IndexedSlices(tf.fill([1, 2], value), tf.constant([0]), tf.constant([2, 2]))


@pytest.mark.parametrize("strategy", ["mirrored", "one_device", "default"])
@pytest.mark.parametrize("call", ["gather", "all_gather", "all_gather_of_a_nest"])
def test_gathering_indexed_slices_raises_like_tf(strategy, call, run_mode):
  def snippet(a):
    chosen = {"mirrored": a.pair, "one_device": a.one_device(),
              "default": a.mod.get_strategy()}[strategy]
    if call == "gather":
      return run_mode(lambda: chosen.gather(_slices(), axis=0))
    value = _slices() if call == "all_gather" else {"a": tf.ones([1]), "b": _slices()}
    return run_mode(lambda: chosen.run(
        lambda: a.mod.get_replica_context().all_gather(value, axis=0)))
  error = both(snippet)
  assert isinstance(error, NotImplementedError)
  assert "gather does not support IndexedSlices" in str(error)


def test_gather_of_distributed_indexed_slices_is_dense_like_tf(run_mode):
  result = both(lambda a: run_mode(lambda: a.pair.gather(
      a.pair.experimental_distribute_values_from_function(
          lambda ctx: _slices(tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)),
      axis=0)))
  assert result.numpy().tolist() == [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]


def test_gather_in_a_replica_context_raises():
  error = both(lambda a: a.mirrored.run(lambda: a.mirrored.gather(tf.constant([1.0]), axis=0)))
  assert isinstance(error, RuntimeError)


def test_experimental_local_results():
  def snippet(a):
    ids = a.replica_ids()
    return (a.mirrored.experimental_local_results(ids),
            a.mirrored.experimental_local_results(tf.constant(1.0)),
            a.mirrored.experimental_local_results((ids, "x")))
  components, plain, nest = both(snippet)
  assert isinstance(components, tuple)
  assert [float(c) for c in components] == [0.0, 1.0, 2.0, 3.0]
  assert len(plain) == 1
  assert [(float(x), s) for x, s in nest] == [(0.0, "x"), (1.0, "x"), (2.0, "x"), (3.0, "x")]


def test_experimental_local_results_of_a_mirrored_variable():
  def snippet(a):
    with a.mirrored.scope():
      v = tf.Variable(2.0)
    return [c.device for c in a.mirrored.experimental_local_results(v)]
  assert both(snippet) == list(DEVICES)


# --- ReplicaContext.all_reduce, all_gather, merge_call.

@pytest.mark.parametrize("op, expected", [("SUM", 10.0), ("MEAN", 2.5)])
def test_all_reduce_a_tensor(run_mode, op, expected):
  result = both(lambda a: a.mirrored.run(
      lambda: a.mod.get_replica_context().all_reduce(op, a.replica_id() + 1.0)), run_mode)
  assert local(TFD.mirrored, result) == [expected] * 4


def test_all_reduce_a_nest(run_mode):
  def snippet(a):
    def replica_fn():
      x = a.replica_id() + 1.0
      return a.mod.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.MEAN, {"a": x, "b": [x * 2.0, tf.fill([2], x)]})
    return a.mirrored.run(replica_fn)
  result = both(snippet, run_mode)
  assert local(TFD.mirrored, result["a"]) == [2.5] * 4
  assert local(TFD.mirrored, result["b"][0]) == [5.0] * 4
  assert local(TFD.mirrored, result["b"][1]) == [[2.5, 2.5]] * 4


def test_all_reduce_of_python_numbers_sums_each_replicas_own():
  """`all_reduce("SUM", 1)` counts the replicas, as in a TensorFlow
  tf.function; a tensor all replicas share stays as it is (TensorFlow 2.21
  fails on a nest holding both)."""
  def snippet(a, value):
    return tf.function(lambda: a.mirrored.run(
        lambda: a.mod.get_replica_context().all_reduce("SUM", value)))()
  assert local(TFD.mirrored, both(lambda a: snippet(a, 1))) == [4] * 4
  result = both(lambda a: snippet(a, (2.0, np.float32(0.5), [1.0, 2.0])))
  assert [local(TFD.mirrored, r) for r in tf.nest.flatten(result)] == [
      [8.0] * 4, [2.0] * 4, [4.0] * 4, [8.0] * 4]
  shared = tf.constant(5.0)
  assert local(TFD.mirrored, both(lambda a: snippet(a, shared))) == [5.0] * 4
  eagerly = TFD.mirrored.run(lambda: tfd.get_replica_context().all_reduce("MEAN", 3))
  assert local(TFD.mirrored, eagerly) == [3] * 4  # TensorFlow 2.21 fails here


def test_all_reduce_int32(run_mode):
  result = both(lambda a: a.mirrored.run(lambda: a.mod.get_replica_context().all_reduce(
      "SUM", a.mod.get_replica_context().replica_id_in_sync_group)), run_mode)
  assert local(TFD.mirrored, result) == [6] * 4


@pytest.mark.parametrize("op, scale", [("SUM", 1.0), ("MEAN", 0.25)])
def test_all_reduce_indexed_slices(run_mode, op, scale):
  def snippet(a):
    def replica_fn():
      x = a.replica_id()
      rows = tf.IndexedSlices(tf.fill([1, 2], x + 1.0), tf.cast([x], tf.int32),
                              tf.constant([4, 2]))
      reduced = a.mod.get_replica_context().all_reduce(op, rows)
      assert isinstance(reduced, tf.IndexedSlices)
      return tf.convert_to_tensor(reduced)
    return a.mirrored.run(replica_fn)
  result = both(snippet, run_mode, oracle_in_function=False)
  dense = [[scale * (i + 1)] * 2 for i in range(4)]
  assert local(TFD.mirrored, result) == [dense] * 4


def test_all_gather(run_mode):
  def snippet(a):
    def replica_fn():
      context = a.mod.get_replica_context()
      x = a.replica_id()
      return (context.all_gather(tf.fill([1, 2], x), axis=0),
              context.all_gather({"q": tf.fill([2], x)}, axis=0))
    return a.mirrored.run(replica_fn)
  rows, flat = both(snippet, run_mode, oracle_in_function=False)
  assert local(TFD.mirrored, rows) == [[[0.0] * 2, [1.0] * 2, [2.0] * 2, [3.0] * 2]] * 4
  assert local(TFD.mirrored, flat["q"]) == [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]] * 4


def test_all_gather_of_a_shared_value_gives_each_replica_a_copy(run_mode):
  shared = tf.constant([1.0])
  result = both(lambda a: a.mirrored.run(
      lambda: a.mod.get_replica_context().all_gather(shared, axis=0)), run_mode)
  assert isinstance(result, tfd.values.PerReplica)
  assert local(TFD.mirrored, result) == [[1.0]] * 4


def _gather_weights(axis):
  """The weights of the gathered value in `_gathered_loss`: 10 rows (or
  columns) of 2, for replicas holding 1, 2, 3 and 4 of them."""
  weights = np.arange(20.0, dtype=np.float32).reshape(10, 2)
  return weights if axis == 0 else weights.T


@pytest.mark.parametrize("axis", [0, 1])
def test_gradient_of_all_gather_is_its_slice_of_the_summed_gradients(run_mode, axis):
  def snippet(a):
    def replica_fn():
      context = a.mod.get_replica_context()
      scale = a.replica_id() + 1.0
      rows = context.replica_id_in_sync_group + 1
      x = tf.ones([rows, 2] if axis == 0 else [2, rows]) * scale
      with tf.GradientTape() as tape:
        tape.watch(x)
        gathered = context.all_gather(x, axis=axis)
        loss = tf.reduce_sum(gathered * _gather_weights(axis)) * scale
      return tape.gradient(loss, x)
    return a.mirrored.run(replica_fn)
  gradients = local(TFD.mirrored, both(snippet, run_mode))
  # Replica i's loss weighs the gathered value by i + 1: 10 in all.
  summed = 10.0 * _gather_weights(axis)
  begin = 0
  for i, gradient in enumerate(gradients):
    own = summed[begin:begin + i + 1] if axis == 0 else summed[:, begin:begin + i + 1]
    assert gradient == own.tolist()
    begin += i + 1


def test_gradient_of_all_gather_of_shared_and_mixed_rank_values(run_mode):
  # TF 2.21 fails on both: it slices the shared value's gradient as if every
  # replica had gathered its own, and packs gradients of different ranks.
  shared = tf.constant([1.0, 2.0])

  def replica_fn():
    context = tfd.get_replica_context()
    scale = TFD.replica_id() + 1.0
    own = tf.constant([[3.0]]) * scale
    with tf.GradientTape() as tape:
      tape.watch([shared, own])
      gathered_shared, gathered_own = context.all_gather([shared, own], axis=0)
      loss = (tf.reduce_sum(gathered_shared * [1.0, 10.0]) * scale
               + tf.reduce_sum(gathered_own * [[1.0], [2.0], [3.0], [4.0]]))
    return tape.gradient(loss, [shared, own])
  shared_gradient, own_gradient = run_mode(lambda: TFD.mirrored.run(replica_fn))
  assert local(TFD.mirrored, shared_gradient) == [[i, 10.0 * i] for i in (1.0, 2.0, 3.0, 4.0)]
  assert local(TFD.mirrored, own_gradient) == [[[4.0 * i]] for i in (1.0, 2.0, 3.0, 4.0)]


def test_merge_call_regroups_arguments_and_distributes_the_result(run_mode):
  def snippet(a):
    def merge_fn(strategy, value, scale=1.0):
      assert isinstance(value, tf.distribute.DistributedValues)
      assert len(value.values) == 4
      total = strategy.reduce("SUM", value, axis=None)
      return total * scale, value
    def replica_fn():
      return a.mod.get_replica_context().merge_call(
          merge_fn, args=(a.replica_id(),), kwargs={"scale": 2.0})
    return a.mirrored.run(replica_fn)
  total, each = both(snippet, run_mode)
  assert float(total) == 12.0
  assert local(TFD.mirrored, each) == [0.0, 1.0, 2.0, 3.0]


def test_merge_call_on_a_branch_of_each_replica_raises_like_tf():
  """Each replica's `tf.cond` branch is a graph of its own, which the merge
  cannot read: a RuntimeError, as in TF (Keras optimizers with gradient
  accumulation do this)."""
  def snippet(a):
    def replica_fn(x):
      return tf.cond(x > -1.0,
                     lambda: a.mod.get_replica_context().all_reduce("SUM", x * 2.0),
                     lambda: x)
    return tf.function(lambda: a.mirrored.run(replica_fn, args=(a.replica_ids(),)))()
  error = both(snippet)
  assert isinstance(error, RuntimeError)
  assert "`merge_call` called while defining a new graph" in str(error)


def test_merge_fn_waits_for_every_replicas_control_dependencies_in_a_tf1_graph():
  """A merge made under each replica's `tf.control_dependencies` runs after
  every replica's dependencies, not only the first's, as in TF: a tf_keras
  metric's result after each replica's update."""
  def snippet(a):
    with tf.Graph().as_default():
      strategy = new_mirrored(a.mod, ["CPU:0", "CPU:1"])
      with strategy.scope():
        total = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)

      def replica_fn():
        with tf.control_dependencies([total.assign_add(a.replica_id() + 1.0)]):
          return a.mod.get_replica_context().merge_call(
              lambda merged: tf.identity(merged.extended.read_var(total)))
      result = strategy.experimental_local_results(strategy.run(replica_fn))[0]
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        return float(session.run(result))
  assert both(snippet) == 3.0


@pytest.mark.parametrize("sync", ["all_reduce", "merge_call"])
def test_sync_point_in_a_nested_function_raises_like_tf(sync, run_mode):
  """A `tf.function` called by the replica function holds the sync point:
  a RuntimeError, as in TF, not replicas waiting for each other forever."""
  def snippet(a):
    @tf.function
    def nested(x):
      replica_context = a.mod.get_replica_context()
      if sync == "all_reduce":
        return replica_context.all_reduce("SUM", x)
      return replica_context.merge_call(lambda _, v: v, args=(x,))
    return run_mode(lambda: a.mirrored.run(lambda: nested(tf.constant(1.0))))
  error = both(snippet)
  assert isinstance(error, RuntimeError)
  assert "`merge_call` called while defining a new graph or a tf.function" in str(error)


@pytest.mark.parametrize("condition", ["python", "tensor"])
@pytest.mark.parametrize("caller", [0, 1])
def test_merge_call_by_only_some_replicas_raises_like_tf(caller, condition, run_mode):
  """Only replica `caller` calls merge_call: TF's RuntimeError, eagerly and
  in a `tf.function` (where a condition on a tensor becomes a `tf.cond`,
  whose branch every replica traces); the strategy works on afterwards."""
  messages = {}

  def snippet(a):
    def replica_fn():
      context = a.mod.get_replica_context()
      replica_id = context.replica_id_in_sync_group
      if condition == "python":
        replica_id = tf.get_static_value(replica_id)
      if replica_id == caller:
        context.merge_call(lambda strategy: None)
      return tf.constant(2.0)
    try:
      run_mode(lambda: a.pair.run(replica_fn))
    except RuntimeError as e:
      messages[a.name] = str(e)
      summed = run_mode(lambda: a.pair.run(
          lambda: a.mod.get_replica_context().all_reduce("SUM", a.replica_id() + 1.0)))
      return local(a.pair, summed)
    return None
  assert both(snippet) == [3.0, 3.0]
  # In a function both replicas trace the tensor condition's branch: replica
  # 0 reaches it first.
  named = 0 if condition == "tensor" and not _is_eager(run_mode) else caller
  assert f"eplica {named} " in messages["tfd"]


@pytest.mark.parametrize("where", ["branch_on_own_input", "loop_on_own_input"])
def test_merge_call_in_control_flow_that_replicas_may_take_apart_raises_like_tf(where):
  def snippet(a):
    def replica_fn(x):
      context = a.mod.get_replica_context()
      if where == "branch_on_own_input":
        if x > 0.0:
          context.merge_call(lambda strategy: None)
      else:
        for _ in tf.range(x):
          context.merge_call(lambda strategy: None)
      return x
    return tf.function(lambda: a.pair.run(replica_fn, args=(a.replica_ids(a.pair),)))()
  error = both(snippet)
  assert isinstance(error, RuntimeError)
  assert "`merge_call` called while defining a new graph" in str(error)


@pytest.mark.parametrize("condition", ["sync_on_read", "nested_branch", "captured_input",
                                       "captured_id_in_a_nested_branch"])
def test_merge_call_in_a_branch_that_replicas_may_take_apart_raises_like_tf(condition):
  """A tf.cond on a sync-on-read variable (each replica reads its own
  component) or on a replica's own value that reaches the branch from
  outside it: a captured distributed input, a value a nested branch
  captures."""
  def snippet(a):
    strategy = a.pair
    with strategy.scope():
      on_read = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
      mirrored = tf.Variable(1.0)
    ids = a.replica_ids(strategy)  # eager: the function captures it

    def replica_fn(x):
      context = a.mod.get_replica_context()
      own = {"sync_on_read": lambda: on_read.assign(x) * 0.0 + on_read,
             "nested_branch": lambda: x * 2.0,
             "captured_input": lambda: x + 1.0,
             "captured_id_in_a_nested_branch": a.replica_id}[condition]()
      if condition.startswith(("nested", "captured_id")):
        if mirrored > 0.0:
          if own > 0.0:
            context.merge_call(lambda s: None)
      elif own > 0.5:
        context.merge_call(lambda s: None)
      return x
    return tf.function(lambda: strategy.run(replica_fn, args=(ids,)))()
  error = both(snippet)
  assert isinstance(error, RuntimeError)
  assert "`merge_call` called while defining a new graph" in str(error)


def test_merge_call_in_a_branch_every_replica_takes_alike():
  """A condition the replicas share (an all-reduced value, a mirrored
  variable) holds a merge_call, as a Keras optimizer's periodic update does
  (TensorFlow 2.21 refuses every merge_call in a branch)."""
  strategy = TFD.pair
  with strategy.scope():
    v = tf.Variable(1.0)

  def replica_fn(x):
    context = tfd.get_replica_context()
    if context.all_reduce("SUM", x) > 0.0 and v > 0.0:
      context.merge_call(lambda s: s.extended.update(v, lambda c: c.assign_add(10.0)))
    return x
  tf.function(lambda: strategy.run(replica_fn, args=(TFD.replica_ids(strategy),)))()
  assert [float(c) for c in v.values] == [11.0, 11.0]


def test_merge_call_hands_out_a_mirrored_result(run_mode):
  def snippet(a):
    def merge_fn(strategy, value):
      return strategy.extended.reduce_to("SUM", value, destinations=value)
    return a.mirrored.run(lambda: a.mod.get_replica_context().merge_call(
        merge_fn, args=(a.replica_id(),)))
  assert local(TFD.mirrored, both(snippet, run_mode)) == [6.0] * 4


@pytest.mark.parametrize("op, value, gradient", [
    ("SUM", 30.0, [8.0, 16.0, 24.0, 32.0]),
    ("MEAN", 7.5, [2.0, 4.0, 6.0, 8.0]),
])
def test_gradient_of_all_reduce_is_all_reduce_of_gradients(run_mode, op, value, gradient):
  def snippet(a):
    def replica_fn():
      x = a.replica_id() + 1.0
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = a.mod.get_replica_context().all_reduce(op, x * x)
      return y, tape.gradient(y, x)
    return a.mirrored.run(replica_fn)
  y, dy_dx = both(snippet, run_mode)
  assert local(TFD.mirrored, y) == [value] * 4
  assert local(TFD.mirrored, dy_dx) == gradient


_COLLECTIVES = {
    "all_gather": lambda context, x: context.all_gather(x, axis=1),
    "all_reduce_sum": lambda context, x: context.all_reduce("SUM", x),
    "all_reduce_mean": lambda context, x: context.all_reduce("MEAN", x),
}


def differentiate_collective(strategy, api, collective, path):
  """Each of `strategy`'s replicas, holding `c` = its id + 1, takes the
  gradient of `collective(context, x) * c` with respect to its own `x`, by
  `path`: `tf.gradients` in a replica function that is a `tf.function`, in a
  plain replica function run inside a `tf.function`, or a `GradientTape`."""
  c = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(ctx.replica_id_in_sync_group + 1.0))

  def replica_fn(c):
    x = tf.constant([[3.0], [5.0]])
    context = api.mod.get_replica_context()
    if path == "tape":
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = _COLLECTIVES[collective](context, x) * c
      return tape.gradient(y, x)
    return tf.gradients(_COLLECTIVES[collective](context, x) * c, [x])[0]
  if path == "replica_function":
    return strategy.run(tf.function(replica_fn), args=(c,))
  if path == "outer_function":
    return tf.function(lambda c: strategy.run(replica_fn, args=(c,)))(c)
  return strategy.run(replica_fn, args=(c,))


@pytest.mark.parametrize("path", ["replica_function", "outer_function", "tape"])
@pytest.mark.parametrize("collective, gradient", [
    ("all_gather", 3.0), ("all_reduce_sum", 3.0), ("all_reduce_mean", 1.5)])
def test_tf_gradients_of_collectives_flow_through_every_replica(collective, gradient, path):
  """`tf.gradients` (no tape) takes the collectives' gradients too: summed
  over the replicas, not only this replica's own term."""
  result = both(lambda a: differentiate_collective(a.pair, a, collective, path))
  assert local(TFD.pair, result) == [[[gradient], [gradient]]] * 2


# --- StrategyExtended.

def test_worker_and_parameter_devices():
  extended = both(lambda a: (a.mirrored.extended.worker_devices,
                             a.mirrored.extended.parameter_devices))
  assert extended == (DEVICES, DEVICES)


def test_reduce_to(run_mode):
  def snippet(a):
    v = _variable(a)
    ids = a.replica_ids()
    def reduce():
      onto_each = a.mirrored.extended.reduce_to(a.mod.ReduceOp.MEAN, ids, destinations=v)
      assert isinstance(onto_each, tf.distribute.DistributedValues)
      return (a.mirrored.extended.reduce_to("SUM", ids, destinations="/cpu:0"),
              [t.device for t in onto_each.values] if tf.executing_eagerly() else [],
              a.mirrored.experimental_local_results(onto_each))
    return run_mode(reduce)
  onto_one, devices, onto_each = both(snippet)
  assert float(onto_one) == 6.0
  assert devices in ([], list(DEVICES))
  assert [float(t) for t in onto_each] == [1.5] * 4


def test_reduce_to_of_function_arguments():
  def snippet(a):
    @tf.function
    def reduce(x):
      return (a.mirrored.reduce("SUM", x, axis=None),
              a.mirrored.extended.reduce_to("SUM", x, destinations=x))
    return reduce(a.replica_ids())
  total, mirrored = both(snippet)
  assert float(total) == 6.0
  assert float(mirrored) == 6.0


def test_all_reduce_of_function_arguments():
  def snippet(a):
    @tf.function
    def step(x):
      return a.mirrored.run(
          lambda y: a.mod.get_replica_context().all_reduce("SUM", y), args=(x,))
    return step(a.replica_ids())
  assert local(TFD.mirrored, both(snippet)) == [6.0] * 4


def test_reduce_to_places_the_result_on_the_destination():
  result = both(lambda a: a.mirrored.extended.reduce_to(
      "SUM", a.replica_ids(), destinations="/cpu:2").device)
  assert result == DEVICES[2]


def test_reduce_to_with_a_variable_aggregation_raises():
  with pytest.raises(ValueError, match="VariableAggregation"):
    TFD.mirrored.extended.reduce_to(tf.VariableAggregation.SUM, TFD.replica_ids(), "/cpu:0")


def test_reduce_to_in_a_replica_context_raises():
  error = both(lambda a: a.mirrored.run(
      lambda: a.mirrored.extended.reduce_to("SUM", tf.constant(1.0), "/cpu:0")))
  assert isinstance(error, RuntimeError)


def test_batch_reduce_to(run_mode):
  def snippet(a):
    v = _variable(a)
    ids = a.replica_ids()
    doubled = a.mirrored.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(2.0 * ctx.replica_id_in_sync_group))
    def reduce():
      mirrored, onto_one = a.mirrored.extended.batch_reduce_to(
          "SUM", [(ids, v), (doubled, "/cpu:1")])
      return a.mirrored.experimental_local_results(mirrored), onto_one
    return run_mode(reduce)
  mirrored, onto_one = both(snippet)
  assert [float(t) for t in mirrored] == [6.0] * 4
  assert float(onto_one) == 12.0


def _variable(a, value=1.0):
  with a.mirrored.scope():
    return tf.Variable(value)


def test_update(run_mode):
  def snippet(a):
    v = _variable(a)
    ids = a.replica_ids()
    result = run_mode(lambda: a.mirrored.experimental_local_results(a.mirrored.extended.update(
        v, lambda component, x: component.assign_add(x), args=(ids,))))
    return result, v
  result, v = both(snippet)
  assert [float(t) for t in result] == [1.0, 2.0, 3.0, 4.0]
  assert [float(c) for c in v.values] == [1.0, 2.0, 3.0, 4.0]


def test_update_without_grouping_returns_local_results():
  def snippet(a):
    v = _variable(a, 5.0)
    return a.mirrored.extended.update(v, lambda c: c.read_value(), group=False)
  result = both(snippet)
  assert isinstance(result, tuple)
  assert [float(t) for t in result] == [5.0] * 4


def test_update_in_a_replica_context_merges_first(run_mode):
  def snippet(a):
    v = _variable(a)
    result = run_mode(lambda: a.mirrored.run(lambda: a.mirrored.extended.update(
        v, lambda component, x: component.assign(x), args=(a.replica_id() * 3.0,))))
    return result, v
  result, v = both(snippet)
  assert local(TFD.mirrored, result) == [0.0, 3.0, 6.0, 9.0]
  assert [float(c) for c in v.values] == [0.0, 3.0, 6.0, 9.0]


def test_value_container():
  def snippet(a):
    v = _variable(a)
    t = tf.constant(1.0)
    return (a.mirrored.extended.value_container(v.values[2]) is v,
            a.mirrored.extended.value_container(t) is t)
  assert both(snippet) == (True, True)


def test_colocate_vars_with():
  def snippet(a):
    with a.mirrored.scope():
      v = tf.Variable(1.0)
      with a.mirrored.extended.colocate_vars_with(v):
        slot = tf.Variable(0.0)
    return slot
  slot = both(snippet)
  assert [c.device for c in slot.values] == list(DEVICES)


def test_colocate_vars_with_outside_the_scope_raises():
  def snippet(a):
    v = _variable(a)
    with a.mirrored.extended.colocate_vars_with(v):
      pass
  error = both(snippet)
  assert isinstance(error, RuntimeError)
  assert "Need to be inside" in str(error)


def test_colocate_vars_with_a_foreign_variable_raises():
  def snippet(a):
    plain = tf.Variable(1.0)
    with a.mirrored.scope():
      with a.mirrored.extended.colocate_vars_with(plain):
        pass
  assert isinstance(both(snippet), ValueError)


def test_broadcast_to(run_mode):
  def snippet(a):
    v = _variable(a)
    def broadcast():
      everywhere = a.mirrored.extended.broadcast_to(tf.constant(3.0), destinations=v)
      assert isinstance(everywhere, tf.distribute.DistributedValues)
      return (a.mirrored.experimental_local_results(everywhere),
              a.mirrored.extended.broadcast_to(tf.constant(4.0), destinations="/cpu:2"))
    return run_mode(broadcast)
  everywhere, one = both(snippet)
  assert [float(t) for t in everywhere] == [3.0] * 4
  assert float(one) == 4.0


def test_broadcast_to_places_copies_on_the_destinations():
  def snippet(a):
    v = _variable(a)
    return ([t.device for t in a.mirrored.extended.broadcast_to(
        tf.constant(3.0), destinations=v).values],
            a.mirrored.extended.broadcast_to(tf.constant(3.0), destinations="/cpu:2").device)
  assert both(snippet) == (list(DEVICES), DEVICES[2])


def test_call_for_each_replica(run_mode):
  result = both(lambda a: a.mirrored.extended.call_for_each_replica(
      lambda x, k=0.0: x * 2.0 + k, args=(a.replica_ids(),), kwargs={"k": 1.0}), run_mode)
  assert local(TFD.mirrored, result) == [1.0, 3.0, 5.0, 7.0]


@pytest.mark.parametrize("group", [True, False])
def test_update_non_slot(group):
  def snippet(a):
    v = _variable(a)
    devices = a.mirrored.extended.non_slot_devices([v])
    return a.mirrored.extended.update_non_slot(
        devices, lambda x: tf.identity(x), args=(tf.constant(1.0),), group=group)
  result = both(snippet)
  assert isinstance(result, tfd.values.Mirrored if group else tuple)
  components = TFD.mirrored.experimental_local_results(result) if group else result
  assert [float(t) for t in components] == [1.0] * 4


def test_non_slot_devices():
  assert both(lambda a: a.mirrored.extended.non_slot_devices([_variable(a)])) == DEVICES


def test_default_strategy_non_slot_devices_is_the_first_variable_by_name():
  def snippet(a):
    variables = [tf.Variable(1.0, name="b"), tf.Variable(2.0, name="a")]
    return a.mod.get_strategy().extended.non_slot_devices(variables).name
  assert both(snippet) == "a:0"


@pytest.mark.parametrize("strategy", ["mirrored", "one_device", "default"])
@pytest.mark.parametrize("call", ["update", "update_non_slot", "run"])
def test_functions_called_back_in_a_tf_function_are_converted_by_autograph(strategy, call):
  """As in TensorFlow, a Python `if` on a tensor works in the function
  `extended.update`, `extended.update_non_slot` and `run` call back."""
  def snippet(a):
    chosen = {"mirrored": a.pair, "one_device": a.one_device(),
              "default": a.mod.get_strategy()}[strategy]
    with chosen.scope():
      v = tf.Variable(1.0)

    def absolute(x):
      if x > 0.0:
        return x
      return -x

    def assign_absolute(var, x):
      if x > 0.0:
        return var.assign(x)
      return var.assign(-x)

    def assign_v(x):
      return assign_absolute(v, x)

    @tf.function
    def step(x):
      if call == "update":
        return chosen.extended.update(v, assign_absolute, (x,))
      if call == "update_non_slot":
        return chosen.extended.update_non_slot(chosen.extended.non_slot_devices([v]), assign_v, (x,))
      return chosen.run(absolute, args=(x,))
    step(tf.constant(-3.0))
    return local(chosen, v if call != "run" else step(tf.constant(-3.0)))
  result = both(snippet)
  assert result == [3.0] * (2 if strategy == "mirrored" else 1)


def test_default_strategy_accepts_variables_made_with_no_strategy():
  """TF 1.x optimizers (tf_keras's legacy ones) ask the default strategy
  about the plain variables they update and colocate their slots with."""
  def snippet(a):
    default = a.mod.get_strategy()
    plain = tf.Variable(1.0)
    with default.extended.colocate_vars_with(plain):
      slot = tf.Variable(0.0)
    with default.scope():
      in_scope = tf.Variable(2.0)
    with a.pair.scope():
      mirrored = tf.Variable(3.0)
    created = [default.extended.variable_created_in_scope(v)
               for v in (plain, slot, in_scope, mirrored)]
    return created, slot.device == plain.device
  assert both(snippet) == ([True, True, True, False], True)


def test_default_strategy_colocates_in_a_graph():
  def snippet(a):
    with tf.Graph().as_default():
      plain = tf.Variable(1.0, name="plain")
      with a.mod.get_strategy().extended.colocate_vars_with(plain):
        slot = tf.Variable(0.0, name="slot")
      return slot.op.colocation_groups()
  assert both(snippet) == [b"loc:@plain"]


# --- compat.v1.

def test_v1_reduce_axis_defaults_to_none():
  def snippet(a):
    strategy = a.v1_mirrored
    return (strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0))),
            a.v1.OneDeviceStrategy("/cpu:0").reduce("MEAN", tf.constant([1.0, 3.0])))
  total, plain = both(snippet)
  assert float(total) == 8.0
  assert plain.numpy().tolist() == [1.0, 3.0]


def test_v1_reduce_along_an_axis():
  def snippet(a):
    strategy = a.v1_mirrored
    return strategy.reduce("MEAN", strategy.run(lambda: tf.constant([1.0, 3.0])), axis=0)
  assert float(both(snippet)) == 2.0


def test_v1_reduce_along_an_unknown_dimension_with_tf1_shapes():
  """TF 1.x shapes (`disable_v2_behavior` turns them on) give a Dimension
  for an unknown size, not None; a MEAN of ints along it still counts the
  elements at run time."""
  def snippet(a):
    tf.compat.v1.disable_v2_tensorshape()
    try:
      with tf.Graph().as_default():
        strategy = (new_tf_mirrored(DEVICES[:2], module=a.v1) if a is TF
                    else a.v1.MirroredStrategy(DEVICES[:2]))

        def replica_fn():
          n = a.v1.get_replica_context().replica_id_in_sync_group + 1
          return tf.compat.v1.placeholder_with_default(tf.fill([n], n), shape=[None])

        per_replica = strategy.extended.call_for_each_replica(replica_fn)
        reduced = [strategy.reduce(op, per_replica, axis=0) for op in ("MEAN", "SUM")]
        with tf.compat.v1.Session() as session:
          return [round(np.asarray(x).item(), 6) for x in session.run(reduced)]
    finally:
      tf.compat.v1.enable_v2_tensorshape()
  assert both(snippet) == pytest.approx([5 / 3, 5])


def test_v1_update_config_proto():
  def snippet(a):
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    return (a.v1_mirrored.update_config_proto(config),
            a.v1.OneDeviceStrategy("/cpu:0").update_config_proto(config), config)
  mirrored, one_device, original = both(snippet)
  assert mirrored.isolate_session_state and mirrored.allow_soft_placement
  assert not original.isolate_session_state
  assert one_device == original


def test_v1_strategy_is_a_v1_strategy():
  assert both(lambda a: isinstance(a.v1_mirrored, a.v1.Strategy)) is True


# --- Deprecated and private names TF's own examples use; argument checks.

def test_unwrap_is_experimental_local_results(run_mode):
  result = both(lambda api: api.pair.unwrap(api.pair.run(lambda: tf.constant(2.0))),
                run_mode)
  assert [float(t) for t in result] == [2.0, 2.0]
  assert both(lambda api: api.mod.get_strategy().unwrap(tf.constant(1.0))) is not None


@pytest.mark.parametrize("args", [tf.constant([1.0, 2.0]), {"x": 1}, None, "ab", 3])
def test_run_args_must_be_a_list_or_tuple(args):
  for strategy in (TF.pair, TFD.pair, TF.mod.get_strategy(), TFD.mod.get_strategy()):
    with pytest.raises(ValueError, match="positional args must be a list or tuple"):
      strategy.run(lambda x: x, args=args)


def test_run_args_error_tells_how_to_pass_one_argument():
  with pytest.raises(ValueError, match=r"args=\(x,\)"):
    TFD.pair.run(lambda x: x, args=tf.constant(1.0))


@pytest.mark.parametrize("kwargs", [[1], (("x", 1),), "x"])
def test_run_kwargs_must_be_a_mapping(kwargs):
  for api in (TF, TFD):
    with pytest.raises(TypeError):
      api.pair.run(lambda x: x, kwargs=kwargs)
  with pytest.raises(TypeError, match="`kwargs` of strategy.run must be a dict"):
    TFD.pair.run(lambda x: x, kwargs=kwargs)


def test_run_accepts_a_list_of_args():
  assert local(TFD.pair, TFD.pair.run(lambda x: x + 1.0, args=[tf.constant(1.0)])) == [2.0, 2.0]


def test_replica_context_update(run_mode):
  def snippet(api):
    strategy = new_mirrored(api.mod, ["CPU:0", "CPU:1"])
    with strategy.scope():
      v = tf.Variable(5.0)

    def replica_fn():
      context = api.mod.get_replica_context()
      update = lambda var, value: var.assign(value)
      context._update(v, update, args=(api.replica_id() + 1.0,))  # pylint: disable=protected-access
    run_mode(lambda: strategy.run(replica_fn))
    return [float(c) for c in v.values]
  # Each component takes its own replica's argument, as in TF.
  assert both(snippet) == [1.0, 2.0]


def test_replica_context_update_outside_run_raises():
  context = TFD.pair.extended._executor.replica_context(0)  # pylint: disable=protected-access
  with TFD.pair.scope():
    v = tf.Variable(1.0)
  with pytest.raises(RuntimeError, match="Mismatching tf.distribute.Strategy objects"):
    context._update(v, lambda var: var.assign(2.0))  # pylint: disable=protected-access


@pytest.mark.parametrize("reduce_op, expected", [("SUM", 1.0), ("MEAN", 0.5)])
def test_reduce_to_the_devices_of_a_distributed_value(reduce_op, expected):
  # TF 2.21 puts every component of the MEAN on CPU:0.
  strategy = TFD.pair
  ids = TFD.replica_ids(strategy)
  traced_devices = []

  def reduce():
    result = strategy.extended.reduce_to(reduce_op, ids, destinations=ids)
    traced_devices.append([c.device for c in result.values])
    return [tf.identity(c) for c in result.values]
  assert [float(v) for v in reduce()] == [expected, expected]
  assert [float(v) for v in tf.function(reduce)()] == [expected, expected]
  assert traced_devices == [list(DEVICES[:2])] * 2


# --- TF 1.x methods of TF 2.x strategies.


def test_tf1_methods_of_a_tf2_strategy():
  """TensorFlow's TF 2.x strategies keep TF 1.x's input and grouping
  methods (undocumented, but code written for TF 1.x calls them)."""
  def snippet(a):
    s = a.mirrored
    iterator = s.make_dataset_iterator(tf.data.Dataset.range(8).batch(4))
    doubled = s.experimental_run(lambda x: x * 2, iterator)
    config = s.update_config_proto(tf.compat.v1.ConfigProto())
    return (local(s, doubled), s.experimental_run(lambda: 1),
            s.group(s.run(lambda: tf.constant(1.0))), s.group(tf.constant(2.0)),
            type(config).__name__)

  result = both(snippet)
  assert result[:2] == ([[0], [2], [4], [6]], 1)


# --- Private names TensorFlow's and clients' code call (docs/client_private_names.md).

@pytest.mark.parametrize("strategy, expected", [
    ("pair", [[0.4, 0.8]] * 2), ("one_device", [[0.8, 1.6]]), ("default", [[0.8, 1.6]])])
def test_model_garden_explicit_all_reduce_trains_like_tf(strategy, expected, run_mode):
  """The Model Garden's `grad_utils` all-reduces gradients itself through
  `extended._replica_ctx_all_reduce` before `apply_gradients`."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from official.modeling import grad_utils  # pylint: disable=g-import-not-at-top

  def snippet(a):
    s = a.mod.get_strategy() if strategy == "default" else getattr(a, strategy)
    if callable(s):
      s = s()
    with s.scope():
      w = tf.Variable([1.0, 2.0])
      optimizer = tf_keras.optimizers.legacy.SGD(0.1)

    def replica_fn():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w) * (a.replica_id() + 1.0)
      grad_utils.minimize_using_explicit_allreduce(tape, optimizer, loss, [w])
    run_mode(lambda: s.run(replica_fn))
    return local(s, w)
  np.testing.assert_allclose(both(snippet), expected, rtol=1e-6)


def test_replica_ctx_all_reduce_like_tf(run_mode):
  def snippet(a):
    s = a.pair
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=4)
    result = run_mode(lambda: s.run(lambda: s.extended._replica_ctx_all_reduce(  # pylint: disable=protected-access
        "SUM", {"a": a.replica_id(), "b": [tf.constant(1.0)]}, options)))
    return tf.nest.map_structure(lambda v: local(s, v), result)
  assert both(snippet) == {"a": [1.0, 1.0], "b": [[2.0, 2.0]]}


@pytest.mark.parametrize("where, expected", [
    ("cross_replica", AssertionError), ("outside", RuntimeError), ("default", float)])
def test_replica_ctx_all_reduce_outside_its_replicas_like_tf(where, expected):
  def snippet(a):
    s = a.pair
    call = lambda: s.extended._replica_ctx_all_reduce("SUM", tf.constant(3.0))  # pylint: disable=protected-access
    if where == "cross_replica":
      with s.scope():
        return call()
    if where == "default":
      s = a.mod.get_strategy()
    return float(call())
  assert isinstance(both(snippet), expected)


def test_replica_context_made_by_hand_reads_its_replica():
  """`tf.distribute.ReplicaContext(strategy, i)` asks the strategy for
  replica i's local index (`extended._get_local_replica_id`)."""
  def snippet(a):
    s = a.pair
    with s.scope():
      v = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM)
    s.run(lambda: v.assign(a.replica_id() + 1.0))
    context = tf.distribute.ReplicaContext(s, replica_id_in_sync_group=1)
    with context:
      return [float(v.read_value()), a.mod.get_replica_context() is context,
              int(context.replica_id_in_sync_group), context.num_replicas_in_sync]
  assert both(snippet) == [2.0, True, 1, 2]
