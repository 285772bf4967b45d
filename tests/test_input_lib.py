"""Distributed input: `experimental_distribute_dataset`,
`distribute_datasets_from_function`, their iterators, `InputContext`,
`InputOptions` and `experimental_make_numpy_dataset`.

Every snippet runs under `tf.distribute` (the oracle) and under
`tf_distribute_lite`, on 4 replicas unless stated: values, devices, shapes,
element specs and exception classes must agree, and where the answer is
known it is also spelled out.

TF takes about half a second to make each distributed iterator, so where
several tests read the same data TF's reading is done once and kept.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import input_lib

import oracle
from conftest import DEVICES
import strategies

MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])
Dataset = tf.data.Dataset


# --- Helpers.

# A tensor as plain Python; `device` is None where it was not recorded.
Tensor = collections.namedtuple("Tensor", ["dtype", "shape", "values", "device"])


def _value(x, device=True):
  """A step's value as plain Python: each tensor as a `Tensor`, distributed
  values as (type name, components), nests kept."""
  if isinstance(x, dict):
    return {k: _value(v, device) for k, v in x.items()}
  if isinstance(x, (tuple, list)):
    return tuple(_value(v, device) for v in x)
  if isinstance(x, tf.distribute.DistributedValues):
    return (type(x).__name__, tuple(_value(v, device) for v in x.values))
  return Tensor(x.dtype.name, tuple(x.shape), x.numpy().tolist(), x.device if device else None)


def _strip(value):
  """`_value`s in a nest, without devices."""
  if isinstance(value, Tensor):
    return value._replace(device=None)
  if isinstance(value, dict):
    return {k: _strip(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_strip(v) for v in value)
  return value


def _both(snippet, strategy=oracle.mirrored):
  """`oracle.compare` of `snippet(mod, strategy(mod))` with TF and tfd;
  returns TF's outcome."""
  return oracle.compare(snippet, (tf.distribute, strategy(tf.distribute)),
                        (tfd, strategy(tfd)))


def _tf_once(key, snippet, strategy=oracle.mirrored):
  """TF's outcome of `snippet(tf.distribute, strategy(tf.distribute))`,
  worked out once per `key`."""
  return oracle.tf_outcome((__name__, key), lambda: snippet(tf.distribute,
                                                             strategy(tf.distribute)))


def _assert_same(expected, actual):
  assert actual == expected, (f"\ntf.distribute gave: {expected!r}\n"
                              f"tf_distribute_lite gave: {actual!r}")
  return True


_EAGER = lambda fn: fn()


def _read_like_tf(key, read, run_mode, strategy=oracle.mirrored):
  """Asserts `read(tfd, strategy(tfd), run_mode)` equals TF's `read` done
  eagerly (once per `key`), devices included where tfd's result has them;
  returns TF's.

  TF reads eagerly: the values do not depend on the mode, and a `tf.function`
  that returns values TF's iterator read by `next` can hang TF on a machine
  with few cores (its inter-op threads all wait).
  """
  def alike(expected, actual):
    _assert_same(_strip(expected), _strip(actual))
    return actual == _strip(actual) or _assert_same(expected, actual)  # devices, if read
  return oracle.compare(lambda mod, mode: read(mod, strategy(mod), mode), (tf.distribute, _EAGER),
                        (tfd, run_mode), alike=alike, tf_key=(__name__, key))


def _fresh(mod):
  """A new MirroredStrategy on all 4 CPUs: TF's keeps PER_REPLICA input
  settings after a call uses them, so option tests never share one."""
  return oracle.new_mirrored(mod)


def _take(dist, count, run_mode):
  """`count` steps of `dist` read by `next`, eagerly (with devices) or in a
  `tf.function` (without)."""
  eager = []

  def take():
    eager.append(tf.executing_eagerly())
    iterator = iter(dist)
    return [next(iterator) for _ in range(count)]

  steps = run_mode(take)
  return [_value(step, device=eager[0]) for step in steps]


def _per_replica_leaves(value):
  """The ("PerReplica", components) leaves of a `_value`, in order."""
  if isinstance(value, dict):
    return [leaf for k in sorted(value) for leaf in _per_replica_leaves(value[k])]
  if value and value[0] == "PerReplica":
    return [value]
  return [leaf for v in value for leaf in _per_replica_leaves(v)]


def _contents(steps):
  """Each step's per-replica values, from `_value`s."""
  return [[part.values for part in parts] for _, parts in steps]


def _shapes(steps):
  """Each step's per-replica shapes, from `_value`s."""
  return [[part.shape for part in parts] for _, parts in steps]


def _devices(steps):
  """Each step's per-replica devices, from `_value`s read eagerly."""
  return [[part.device for part in parts] for _, parts in steps]


def _weighted(mod):
  """A replica fn: the sum of its batch times (replica id + 1)."""
  def fn(batch):
    return tf.reduce_sum(tf.cast(batch, tf.float32)) * (oracle.api(mod).replica_id() + 1.0)
  return fn


def _weighted_total(steps):
  """What summing `_weighted` over all replicas and `steps` gives."""
  return float(sum(sum(v) * (r + 1) for step in steps for r, v in enumerate(step)))


def _options(**kwargs):
  """`InputOptions` of a module; `per_replica=True` picks PER_REPLICA."""
  def make(mod):
    args = dict(kwargs)
    if args.pop("per_replica", False):
      args["experimental_replication_mode"] = mod.InputReplicationMode.PER_REPLICA
    return mod.InputOptions(**args)
  return make


def _spec(shape, dtype="int64", replicas=4):
  specs = ", ".join([f"TensorSpec(shape={shape}, dtype=tf.{dtype}, name=None)"] * replicas)
  return f"PerReplicaSpec({specs})"


# Datasets of 1-D batches, and each step's per-replica batch sizes.
BATCHED = {
    "even": (lambda: Dataset.range(16).batch(8), [[2, 2, 2, 2]] * 2),
    "uneven_10": (lambda: Dataset.range(20).batch(10, drop_remainder=True), [[3, 3, 3, 1]] * 2),
    "uneven_6": (lambda: Dataset.range(12).batch(6, drop_remainder=True), [[2, 2, 2, 0]] * 2),
    "uneven_2": (lambda: Dataset.range(4).batch(2, drop_remainder=True), [[1, 1, 0, 0]] * 2),
    "partial_last": (lambda: Dataset.range(7).batch(5), [[2, 2, 1, 0], [1, 1, 0, 0]]),
}

STRUCTURED = {
    "dict": (lambda: Dataset.from_tensor_slices({
        "a": np.arange(6.0), "b": np.arange(18, dtype=np.float32).reshape(6, 3)}).batch(5), 2),
    "tuple": (lambda: Dataset.from_tensor_slices(
        (np.arange(8), np.arange(24.0).reshape(8, 3))).batch(4), 2),
    "nested": (lambda: Dataset.from_tensor_slices({
        "x": (np.arange(10), np.arange(10.0) / 2),
        "y": {"z": np.arange(30, dtype=np.float32).reshape(10, 3)}}).batch(6), 2),
    "features": (lambda: Dataset.from_tensor_slices(
        np.arange(27, dtype=np.float32).reshape(9, 3)).batch(4), 3),
}

SHUFFLED = {
    "shuffle": lambda: Dataset.range(20).shuffle(20, seed=3).batch(8),
    "small_buffer": lambda: Dataset.range(30).shuffle(8, seed=11).batch(6, drop_remainder=True),
    "fixed_order": lambda: Dataset.range(20).shuffle(
        20, seed=5, reshuffle_each_iteration=False).batch(7),
}


def _read_batched(name, run_mode):
  make, sizes = BATCHED[name]
  return _read_like_tf(("batched", name), lambda mod, s, mode: _take(
      s.experimental_distribute_dataset(make()), len(sizes), mode), run_mode)


def _read_structured(name, run_mode):
  make, steps = STRUCTURED[name]

  def read(mod, strategy, mode):
    dist = strategy.experimental_distribute_dataset(make())
    return repr(dist.element_spec), _take(dist, steps, mode)

  return _read_like_tf(("structured", name), read, run_mode)


def _eager_steps(dist):
  return [_value(step) for step in dist]


# --- experimental_distribute_dataset: what each replica gets, and where.

@pytest.mark.parametrize("name", BATCHED)
def test_batches_split_across_replicas(name, run_mode):
  steps = _read_batched(name, run_mode)
  assert [[shape[0] for shape in step] for step in _shapes(steps)] == BATCHED[name][1]
  assert _devices(steps) == [list(DEVICES)] * len(steps)


def test_partial_last_batch_is_spread_like_tensorflow():
  steps = _read_batched("partial_last", _EAGER)
  assert _contents(steps) == [[[0, 1], [2, 3], [4], []], [[5], [6], [], []]]
  assert _shapes(steps) == [[(2,), (2,), (1,), (0,)], [(1,), (1,), (0,), (0,)]]


@pytest.mark.parametrize("name", BATCHED)
def test_replica_batches_concatenate_to_the_global_batches(name):
  make = BATCHED[name][0]
  plain = [b.numpy().tolist() for b in make()]
  tf_steps = _read_batched(name, _EAGER)
  assert [sum(step, []) for step in _contents(tf_steps)] == plain
  dist = oracle.mirrored(tfd).experimental_distribute_dataset(make())
  for _ in range(2):
    assert [sum(step, []) for step in _contents(_eager_steps(dist))] == plain


@pytest.mark.parametrize("name", SHUFFLED)
def test_shuffled_order_is_kept(name):
  make = SHUFFLED[name]
  plain = make()
  epochs = [[b.numpy().tolist() for b in plain] for _ in range(2)]

  def concatenated(dist):
    return [sum((part.numpy().tolist() for part in step.values), []) for step in dist]

  tf_epoch = _tf_once(("shuffled", name), lambda mod, s: concatenated(
      s.experimental_distribute_dataset(make())))
  assert tf_epoch == epochs[0]
  dist = oracle.mirrored(tfd).experimental_distribute_dataset(make())
  assert [concatenated(dist) for _ in range(2)] == epochs  # each epoch reshuffles alike
  assert (epochs[0] == epochs[1]) == (name == "fixed_order")


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_elements(name, run_mode):
  spec, steps = _read_structured(name, run_mode)
  assert len(steps) == STRUCTURED[name][1]
  assert spec.count("PerReplicaSpec") == len(_per_replica_leaves(steps[0]))


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_elements_are_on_replica_devices(name):
  _, steps = _read_structured(name, _EAGER)
  leaves = [leaf for step in steps for leaf in _per_replica_leaves(step)]
  specs = tf.nest.flatten(STRUCTURED[name][0]().element_spec)
  assert len(leaves) == len(steps) * len(specs)
  assert _devices(leaves) == [list(DEVICES)] * len(leaves)


def test_features_rows_go_to_replicas_in_order():
  _, steps = _read_structured("features", _EAGER)
  rows = np.arange(27, dtype=np.float32).reshape(9, 3).tolist()
  assert _contents(steps) == [[[rows[0]], [rows[1]], [rows[2]], [rows[3]]],
                              [[rows[4]], [rows[5]], [rows[6]], [rows[7]]],
                              [[rows[8]], [], [], []]]
  assert _shapes(steps)[-1] == [(1, 3), (0, 3), (0, 3), (0, 3)]


def test_dict_partial_step_matches_tensorflow():
  spec, steps = _read_structured("dict", _EAGER)
  assert spec == "{'a': " + _spec("(None,)", "float64") + ", 'b': " + _spec(
      "(None, 3)", "float32") + "}"
  assert _contents([steps[0]["a"], steps[1]["a"]]) == [
      [[0.0, 1.0], [2.0, 3.0], [4.0], []], [[5.0], [], [], []]]
  assert _shapes([steps[1]["b"]]) == [[(1, 3), (0, 3), (0, 3), (0, 3)]]


# --- element_spec.

@pytest.mark.parametrize("make, expected", [
    (lambda: Dataset.range(16).batch(8, drop_remainder=True), _spec("(2,)")),
    (lambda: Dataset.range(16).batch(8), _spec("(None,)")),
    (lambda: Dataset.range(20).batch(10, drop_remainder=True), _spec("(None,)")),
    (lambda: Dataset.range(12).batch(6, drop_remainder=True), _spec("(None,)")),
    (lambda: Dataset.from_tensor_slices(np.ones((24, 3), np.float32)).batch(12, True),
     _spec("(3, 3)", "float32")),
    (lambda: Dataset.from_tensor_slices(np.ones((24, 3), np.float32)).batch(6, True),
     _spec("(None, 3)", "float32")),
    (lambda: Dataset.from_tensor_slices({"a": np.arange(8.0)}).batch(4, drop_remainder=True),
     "{'a': " + _spec("(1,)", "float64") + "}"),
    (lambda: Dataset.from_tensor_slices((np.arange(8), np.ones((8, 2)))).batch(8, True),
     f"({_spec('(2,)')}, {_spec('(2, 2)', 'float64')})"),
], ids=["static", "unknown_batch", "static_10", "static_6", "features_static",
        "features_6", "dict", "tuple"])
def test_element_spec_matches_tensorflow(make, expected):
  spec = _both(lambda mod, s: repr(s.experimental_distribute_dataset(make()).element_spec))
  assert spec == expected
  iterator = iter(oracle.mirrored(tfd).experimental_distribute_dataset(make()))
  assert repr(iterator.element_spec) == spec


def test_iterator_element_spec_matches_tensorflow():
  assert _both(lambda mod, s: repr(iter(s.experimental_distribute_dataset(
      Dataset.range(8).batch(4, drop_remainder=True))).element_spec)) == _spec("(1,)")


@pytest.mark.parametrize("drop_remainder", [False, True], ids=["dynamic", "static"])
def test_element_spec_as_input_signature(drop_remainder):
  def snippet(mod, strategy):
    dataset = Dataset.from_tensors(([1.0], [2])).repeat(20).batch(8, drop_remainder)
    dist = strategy.experimental_distribute_dataset(dataset)

    @tf.function(input_signature=[dist.element_spec])
    def train_step(inputs):
      return strategy.run(lambda x: (2.0 * x[0], x[1] + 1), args=(inputs,))

    results = [_value(train_step(x), device=False) for x in dist]
    return results, train_step.experimental_get_tracing_count()

  results, traces = _both(snippet)
  assert traces == 1
  assert len(results) == (2 if drop_remainder else 3)
  assert results[0][0][1][0] == Tensor("float32", (2, 1), [[2.0], [2.0]], None)
  assert results[0][1][1][3] == Tensor("int32", (2, 1), [[3], [3]], None)
  if not drop_remainder:
    assert _shapes([results[2][0]]) == [[(1, 1)] * 4]


# --- Iteration.

def _make_dist(source):
  """A distributed dataset of 7 elements in steps of 5 (2, 2, 1, 0 then 1, 1,
  0, 0 per replica), by `experimental_distribute_dataset` or from a function
  (2 per replica per step: 0-1, 2-3, 4-5, 6 then nothing)."""
  if source == "dataset":
    return lambda s: s.experimental_distribute_dataset(Dataset.range(7).batch(5))
  return lambda s: s.distribute_datasets_from_function(
      lambda ctx: Dataset.range(7).batch(ctx.get_per_replica_batch_size(8)))


SOURCES = pytest.mark.parametrize("source", ["dataset", "function"])
STEPS = {"dataset": [[[0, 1], [2, 3], [4], []], [[5], [6], [], []]],
         "function": [[[0, 1], [2, 3], [4, 5], [6]]]}


@SOURCES
def test_for_loop_sums_replica_results(source, run_mode):
  def snippet(mod, strategy):
    dist = _make_dist(source)(strategy)
    fn = _weighted(mod)

    def total():
      result = tf.constant(0.0)
      for x in dist:
        result += strategy.reduce("SUM", strategy.run(fn, args=(x,)), axis=None)
      return result

    return float(run_mode(total))

  assert _both(snippet) == _weighted_total(STEPS[source])


@SOURCES
def test_iterator_argument_does_not_retrace(source):
  def make(strategy):
    if source == "dataset":
      return strategy.experimental_distribute_dataset(Dataset.range(48).batch(4))
    return strategy.distribute_datasets_from_function(lambda ctx: Dataset.range(48).batch(1))

  def snippet(mod, strategy):
    iterator = iter(make(strategy))
    fn = _weighted(mod)

    @tf.function
    def three_steps(iterator):
      total = tf.constant(0.0)
      for _ in tf.range(3):
        total += strategy.reduce("SUM", strategy.run(fn, args=(next(iterator),)), axis=None)
      return total

    totals = [float(three_steps(iterator)) for _ in range(3)]
    return totals, three_steps.experimental_get_tracing_count(), _value(next(iterator))

  totals, traces, step = _both(snippet)
  assert traces == 1
  steps = [[[4 * s + r] for r in range(4)] for s in range(9)]  # element 4s+r
  assert totals == [_weighted_total(steps[3 * c:3 * c + 3]) for c in range(3)]
  assert _contents([step]) == [[[36], [37], [38], [39]]]
  assert _devices([step]) == [list(DEVICES)]


READS = {
    "next": next,
    "get_next": lambda iterator: iterator.get_next(),
    "dot_next": lambda iterator: iterator.next(),
    "dunder_next": lambda iterator: iterator.__next__(),
}


@SOURCES
def test_iterating_and_the_end_of_data(source):
  def snippet(mod, strategy):
    dist = _make_dist(source)(strategy)
    iterator = iter(dist)
    kinds = (isinstance(dist, tf.distribute.DistributedDataset),
             isinstance(iterator, tf.distribute.DistributedIterator), iter(iterator) is iterator)
    reads = list(READS.values())
    steps = [_value(reads[i % len(reads)](iterator)) for i in range(len(STEPS[source]))]
    raised = {}
    for name, read in READS.items():
      try:
        read(iterator)
      except Exception as e:  # pylint: disable=broad-except
        raised[name] = type(e)
    return kinds, steps, raised

  kinds, steps, raised = _both(snippet)
  assert kinds == (True, True, True)
  assert _contents(steps) == STEPS[source]
  assert _shapes(steps)[-1] == {"dataset": [(1,), (1,), (0,), (0,)],
                                "function": [(2,), (2,), (2,), (1,)]}[source]
  assert _devices(steps) == [list(DEVICES)] * len(steps)
  assert raised == {"next": StopIteration, "get_next": tf.errors.OutOfRangeError,
                    "dot_next": StopIteration, "dunder_next": StopIteration}


@SOURCES
@pytest.mark.parametrize("read", ["next", "get_next", "get_next_as_optional"])
def test_reading_inside_the_replica_function_raises_like_tf(source, read, run_mode):
  """Each replica would get every replica's input: TF's ValueError. (TF
  raises it for `get_next_as_optional` only once the value is flattened.)"""
  def snippet(mod, strategy):
    iterator = iter(_make_dist(source)(strategy))
    reads = dict(READS, get_next_as_optional=lambda i: i.get_next_as_optional().get_value())
    step = lambda: strategy.run(lambda: reads[read](iterator))
    run_mode(step)

  error = _both(snippet)
  assert error.type is ValueError
  if read != "get_next_as_optional":
    assert ("next(iterator) should be called from outside of replica_fn. e.g. "
            "strategy.run(replica_fn, args=(next(iterator),))") in error.message


@SOURCES
@pytest.mark.parametrize("where", ["scope", "replica", "function_argument"])
def test_reading_under_another_strategy_raises_like_tf(source, where, run_mode):
  """An iterator of one strategy's input read in another strategy's scope
  or replica: TF's RuntimeError (before the replica check); it reads on in
  its own strategy's scope and outside every scope."""
  def snippet(mod, strategy):
    other = oracle.api(mod).one_device("CPU:1")
    dist = (strategy.experimental_distribute_dataset(Dataset.range(16).batch(4))
            if source == "dataset" else strategy.distribute_datasets_from_function(
                lambda ctx: Dataset.range(16).batch(1)))
    iterator = iter(dist)
    with strategy.scope():
      first = next(iterator)
    second = iterator.get_next()
    try:
      if where == "scope":
        with other.scope():
          run_mode(lambda: next(iterator))
      elif where == "replica":
        run_mode(lambda: other.run(lambda: next(iterator)))
      else:
        with other.scope():
          tf.function(lambda i: i.get_next())(iterator)
    except RuntimeError as e:
      return _contents([_value(first), _value(second)]), "Mixing different" in str(e)
    return None

  steps, mixing = _both(snippet)
  assert mixing and steps == [[[0], [1], [2], [3]], [[4], [5], [6], [7]]]


def test_end_of_data_in_function_raises_out_of_range():
  def snippet(mod, strategy):
    iterator = iter(strategy.experimental_distribute_dataset(Dataset.range(4).batch(4)))
    fn = _weighted(mod)

    @tf.function
    def step(iterator):
      return strategy.reduce("SUM", strategy.run(fn, args=(iterator.get_next(),)), axis=None)

    first = float(step(iterator))
    try:
      step(iterator)
    except Exception as e:  # pylint: disable=broad-except
      return first, type(e)
    return first, None

  first, raised = _both(snippet)
  assert raised is tf.errors.OutOfRangeError
  assert first == _weighted_total([[[0], [1], [2], [3]]])


@SOURCES
def test_get_next_as_optional(source, run_mode):
  def read(mod, strategy, mode):
    dist = _make_dist(source)(strategy)
    fn = _weighted(mod)

    def read_all():
      iterator = iter(dist)
      results = []
      for _ in range(len(STEPS[source]) + 1):
        optional = iterator.get_next_as_optional()
        total = tf.cond(
            optional.has_value(),
            lambda o=optional: strategy.reduce(
                "SUM", strategy.run(fn, args=(o.get_value(),)), axis=None),
            lambda: tf.constant(-1.0))
        results.append((optional.has_value(), total))
      return results

    return [(bool(has), float(total)) for has, total in mode(read_all)]

  results = _read_like_tf(("optional", source), read, run_mode)
  assert [has for has, _ in results] == [True] * len(STEPS[source]) + [False]
  assert [t for _, t in results] == [_weighted_total([s]) for s in STEPS[source]] + [-1.0]


@SOURCES
def test_get_next_as_optional_values(source):
  def snippet(mod, strategy):
    iterator = iter(_make_dist(source)(strategy))
    optionals = [iterator.get_next_as_optional() for _ in range(len(STEPS[source]) + 1)]
    return ([_value(o.get_value()) for o in optionals[:-1]],
            bool(optionals[-1].has_value()), repr(optionals[-1].element_spec))

  steps, has_value, spec = _both(snippet)
  assert _contents(steps) == STEPS[source]
  assert not has_value
  assert spec == _spec("(None,)")


def test_get_next_as_optional_with_iterator_argument():
  def snippet(mod, strategy):
    iterator = iter(_make_dist("dataset")(strategy))
    fn = _weighted(mod)

    @tf.function
    def read(iterator):
      optional = iterator.get_next_as_optional()
      total = tf.cond(optional.has_value(),
                      lambda: strategy.reduce(
                          "SUM", strategy.run(fn, args=(optional.get_value(),)), axis=None),
                      lambda: tf.constant(-1.0))
      return optional.has_value(), total

    results = [read(iterator) for _ in range(4)]
    return ([(bool(has), float(total)) for has, total in results],
            read.experimental_get_tracing_count())

  results, traces = _both(snippet)
  assert traces == 1
  assert results == [(True, _weighted_total([s])) for s in STEPS["dataset"]] + [(False, -1.0)] * 2


@SOURCES
def test_reduce(source, run_mode):
  def read(mod, strategy, mode):
    dist = _make_dist(source)(strategy)
    fn = _weighted(mod)
    return float(mode(lambda: dist.reduce(
        tf.constant(0.0),
        lambda state, x: state + strategy.reduce("SUM", strategy.run(fn, args=(x,)), axis=None))))

  assert _read_like_tf(("reduce", source), read, run_mode) == _weighted_total(STEPS[source])


@SOURCES
@pytest.mark.parametrize("make, expected", [
    (lambda: Dataset.range(7).batch(2), 4),
    (lambda: Dataset.range(7).batch(2).repeat(), -1),
    (lambda: Dataset.range(7).filter(lambda x: x > 2).batch(2), -2),
], ids=["finite", "infinite", "unknown"])
def test_cardinality(source, make, expected):
  def snippet(mod, strategy):
    if source == "dataset":
      dist = strategy.experimental_distribute_dataset(make())
    else:
      dist = strategy.distribute_datasets_from_function(lambda ctx: make())
    return int(dist.cardinality)

  assert _both(snippet) == expected


def test_cardinality_in_function():
  def snippet(mod, strategy):
    cardinality = tf.function(lambda: strategy.experimental_distribute_dataset(
        Dataset.range(7).batch(2)).cardinality)()
    return int(cardinality)

  assert _both(snippet) == tf.data.UNKNOWN_CARDINALITY


# --- distribute_datasets_from_function.

@pytest.mark.parametrize("method", ["distribute_datasets_from_function",
                                    "experimental_distribute_datasets_from_function"])
def test_function_gets_an_input_context(method):
  def snippet(mod, strategy):
    seen = []

    def dataset_fn(ctx):
      seen.append((isinstance(ctx, mod.InputContext), ctx.num_input_pipelines,
                   ctx.input_pipeline_id, ctx.num_replicas_in_sync, str(ctx),
                   tf.identity(0).device))
      return Dataset.range(11).batch(ctx.get_per_replica_batch_size(8))

    dist = getattr(strategy, method)(dataset_fn)
    return seen, repr(dist.element_spec), int(dist.cardinality), [_value(x) for x in dist]

  seen, spec, cardinality, steps = _both(snippet)
  assert seen == [(True, 1, 0, 4, "tf.distribute.InputContext(input pipeline id 0, total: 1)",
                   DEVICES[0])]
  assert (spec, cardinality) == (_spec("(None,)"), 6)
  assert _contents(steps) == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10], [], []]]
  assert _devices(steps) == [list(DEVICES)] * 2
  assert _shapes(steps)[1] == [(2,), (1,), (0,), (0,)]


def test_function_structured_elements(run_mode):
  def read(mod, strategy, mode):
    dist = strategy.distribute_datasets_from_function(lambda ctx: Dataset.from_tensor_slices({
        "a": np.arange(5), "b": np.arange(15, dtype=np.float32).reshape(5, 3)}).batch(1))
    return repr(dist.element_spec), _take(dist, 2, mode)

  spec, steps = _read_like_tf("function_structured", read, run_mode)
  assert spec == "{'a': " + _spec("(None,)") + ", 'b': " + _spec("(None, 3)", "float32") + "}"
  assert _contents([steps[1]["a"]]) == [[[4], [], [], []]]
  assert _shapes([steps[1]["b"]]) == [[(1, 3), (0, 3), (0, 3), (0, 3)]]


PIPELINE_OPTIONS = {
    "per_replica": _options(per_replica=True),
    "per_replica_on_device": _options(per_replica=True, experimental_place_dataset_on_device=True,
                                      experimental_fetch_to_device=False),
    "per_replica_no_fetch": _options(per_replica=True, experimental_fetch_to_device=False),
    "per_worker_no_fetch": _options(experimental_fetch_to_device=False),
}
# Where dataset_fn runs, and where each replica's batches land.
PLACEMENT = {
    "per_replica": ([DEVICES[0]] * 4, list(DEVICES)),
    "per_replica_on_device": (list(DEVICES), list(DEVICES)),
    "per_replica_no_fetch": ([DEVICES[0]] * 4, [DEVICES[0]] * 4),
    "per_worker_no_fetch": ([DEVICES[0]], [DEVICES[0]] * 4),
}


def _pipelines(name):
  """TF's and tfd's (contexts seen, element spec, steps) for 10 examples in
  batches of 2 per input pipeline under `PIPELINE_OPTIONS[name]`."""
  def snippet(mod, strategy):
    seen = []

    def dataset_fn(ctx):
      seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync,
                   tf.identity(0).device))
      return Dataset.range(10).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2)

    dist = strategy.distribute_datasets_from_function(dataset_fn, PIPELINE_OPTIONS[name](mod))
    return seen, repr(dist.element_spec), [_value(x) for x in dist]

  return _tf_once(("pipelines", name), snippet, _fresh), snippet(tfd, _fresh(tfd))


@pytest.mark.parametrize("name", PIPELINE_OPTIONS)
def test_input_pipelines_and_placement(name):
  """The contexts dataset_fn sees, and every step but the partial last."""
  (tf_seen, tf_spec, tf_steps), (seen, spec, steps) = _pipelines(name)
  _assert_same((tf_seen, tf_spec, tf_steps[:-1]), (seen, spec, steps[:-1]))
  fn_devices, value_devices = PLACEMENT[name]
  assert seen == [(len(fn_devices), i, 4, d) for i, d in enumerate(fn_devices)]
  assert spec == _spec("(None,)")
  if len(fn_devices) == 4:
    assert _contents(steps[:-1]) == [[[0, 4], [1, 5], [2, 6], [3, 7]]]
  else:
    assert _contents(steps[:-1]) == [[[0, 1], [2, 3], [4, 5], [6, 7]]]
  assert _devices(steps[:-1]) == [value_devices]


@pytest.mark.parametrize("name", PIPELINE_OPTIONS)
def test_input_pipelines_last_partial_step(name):
  """Replicas without data get empty batches, placed as TF places them."""
  (_, _, tf_steps), (_, _, steps) = _pipelines(name)
  if name.startswith("per_replica"):
    assert _contents(steps[-1:]) == [[[8], [9], [], []]]
  else:
    assert _contents(steps[-1:]) == [[[8, 9], [], [], []]]
  _assert_same(tf_steps[-1], steps[-1])


def test_per_replica_function_in_tf_function():
  def snippet(mod, strategy):
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: Dataset.range(10).shard(4, ctx.input_pipeline_id).batch(2),
        _options(per_replica=True)(mod))
    fn = _weighted(mod)

    @tf.function
    def total():
      result = tf.constant(0.0)
      for x in dist:
        result += strategy.reduce("SUM", strategy.run(fn, args=(x,)), axis=None)
      return result

    return float(total())

  assert _both(snippet, _fresh) == _weighted_total(
      [[[0, 4], [1, 5], [2, 6], [3, 7]], [[8], [9], [], []]])


# Per-replica pipelines of different lengths: whether a last, partial step
# is read (replicas without data getting empty batches) or ends the input.
UNEVEN_PIPELINES = {
    "scalars": lambda ctx: Dataset.range(5),
    "batches": lambda ctx: Dataset.range(10).batch(2),
    "static_batches": lambda ctx: Dataset.range(10).batch(2, drop_remainder=True),
}


def _uneven_steps(name, enable, in_function):
  """Per step, each replica's values of `UNEVEN_PIPELINES[name]` on 2 CPUs,
  with `experimental_enable_get_next_as_optional` set to `enable` (None:
  as made), read by `next` eagerly or by a `for` loop in a `tf.function`."""
  def snippet(mod, strategy):
    if enable is not None:
      strategy.extended.experimental_enable_get_next_as_optional = enable
    dist = strategy.distribute_datasets_from_function(UNEVEN_PIPELINES[name])
    if not in_function:
      return [[t.numpy().tolist() for t in strategy.experimental_local_results(x)]
              for x in dist]

    @tf.function
    def sizes_and_sums():
      sizes, sums = tf.TensorArray(tf.int32, 0, True), tf.TensorArray(tf.int64, 0, True)
      for x in dist:
        parts = strategy.experimental_local_results(x)
        sizes = sizes.write(sizes.size(), tf.stack([tf.size(p) for p in parts]))
        sums = sums.write(sums.size(), tf.stack([tf.reduce_sum(p) for p in parts]))
      return sizes.stack(), sums.stack()
    return [a.numpy().tolist() for a in sizes_and_sums()]
  return snippet


@pytest.mark.parametrize("name, enable, expected", [
    ("scalars", None, [[0, 1], [2, 3]]),
    ("batches", None, [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]),
    ("batches", False, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
    ("static_batches", None, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
], ids=["scalars", "batches", "batches_disabled", "static_batches"])
def test_partial_step_of_uneven_pipelines_like_tf(name, enable, expected):
  snippet = _uneven_steps(name, enable, in_function=False)
  assert _both(snippet, lambda mod: oracle.new_mirrored(mod, ["CPU:0", "CPU:1"])) == expected


def test_partial_step_in_a_function_loop_like_tf():
  """A `for` loop in a `tf.function` reads a partial step of batches even
  with `experimental_enable_get_next_as_optional` off, as in TensorFlow."""
  snippet = _uneven_steps("batches", False, in_function=True)
  assert _both(snippet, lambda mod: oracle.new_mirrored(mod, ["CPU:0", "CPU:1"])) == [
      [[2, 2], [2, 2], [2, 0]], [[1, 5], [9, 13], [17, 0]]]


def test_partial_step_of_scalars_in_a_function_loop_ends_the_input():
  """TensorFlow 2.21 makes up a 0 for the replica without data here."""
  snippet = _uneven_steps("scalars", None, in_function=True)
  assert snippet(tfd, oracle.new_mirrored(tfd, ["CPU:0", "CPU:1"])) == [
      [[1, 1], [1, 1]], [[0, 1], [2, 3]]]


@pytest.mark.parametrize("make", ["mirrored", "mirrored_in_graph", "central_storage"])
def test_get_next_as_optional_setting_like_tf(make):
  def setting(mod):
    if make == "central_storage":
      strategy = mod.experimental.CentralStorageStrategy(["CPU:0", "CPU:1"])
    elif make == "mirrored":
      strategy = oracle.new_mirrored(mod, ["CPU:0", "CPU:1"])
    else:
      with tf.Graph().as_default():
        strategy = oracle.new_mirrored(mod, ["CPU:0", "CPU:1"])
    return getattr(strategy.extended, "experimental_enable_get_next_as_optional", False)
  assert setting(tfd) == setting(tf.distribute) == (make == "mirrored")


@pytest.mark.parametrize("options", [
    _options(experimental_place_dataset_on_device=True),
    _options(experimental_place_dataset_on_device=True, experimental_fetch_to_device=False),
    _options(per_replica=True, experimental_place_dataset_on_device=True,
             experimental_fetch_to_device=True),
], ids=["place_per_worker", "place_per_worker_no_fetch", "place_and_fetch"])
def test_invalid_function_options_raise_value_error(options):
  def snippet(mod, strategy):
    try:
      strategy.distribute_datasets_from_function(
          lambda ctx: Dataset.range(8).batch(2), options(mod))
    except Exception as e:  # pylint: disable=broad-except
      return type(e), str(e)
    return None

  error, message = _both(snippet, _fresh)
  assert error is ValueError and "experimental_place_dataset_on_device" in message


def test_per_replica_mode_in_distribute_dataset_raises():
  def snippet(mod, strategy):
    strategy.experimental_distribute_dataset(
        Dataset.range(8).batch(4), _options(per_replica=True)(mod))

  raised = _both(snippet, _fresh)
  assert isinstance(raised, oracle.Raised) and raised.type is NotImplementedError


@pytest.mark.parametrize("options, devices", [
    (_options(experimental_fetch_to_device=False), [DEVICES[0]] * 4),
    (_options(experimental_place_dataset_on_device=True, experimental_fetch_to_device=False),
     [DEVICES[0]] * 4),
    (_options(experimental_per_replica_buffer_size=3), list(DEVICES)),
], ids=["no_fetch", "place_no_fetch", "buffer_3"])
def test_distribute_dataset_options(options, devices):
  steps = _both(lambda mod, s: [_value(x) for x in s.experimental_distribute_dataset(
      Dataset.range(10).batch(4), options(mod))], _fresh)
  assert _contents(steps) == [[[0], [1], [2], [3]], [[4], [5], [6], [7]], [[8], [9], [], []]]
  assert _devices(steps[:2]) == [devices] * 2


# --- InputContext and InputOptions.

@pytest.mark.parametrize("args", [(), (1, 0, 4), (3, 2, 6), (2, 1, 8)], ids=str)
def test_input_context(args):
  def snippet(mod, unused_strategy):
    ctx = mod.InputContext(*args)
    return (str(ctx), ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync,
            ctx.get_per_replica_batch_size(24))

  result = _both(snippet)
  ids = args or (1, 0, 1)
  assert result[:4] == (f"tf.distribute.InputContext(input pipeline id {ids[1]}, "
                        f"total: {ids[0]})",) + ids
  assert result[4] == 24 // ids[2]


@pytest.mark.parametrize("batch", [6, 7, 3])
def test_per_replica_batch_size_must_divide(batch):
  def snippet(mod, unused_strategy):
    try:
      mod.InputContext(2, 0, 4).get_per_replica_batch_size(batch)
    except Exception as e:  # pylint: disable=broad-except
      return type(e), str(e)
    return None

  error, message = _both(snippet)
  assert error is ValueError and str(batch) in message


@pytest.mark.parametrize("kwargs", [
    {}, {"experimental_fetch_to_device": False},
    {"experimental_fetch_to_device": None, "experimental_per_replica_buffer_size": 3},
    {"per_replica": True, "experimental_place_dataset_on_device": True},
], ids=["default", "no_fetch", "fetch_none", "per_replica"])
def test_input_options_repr(kwargs):
  result = _both(lambda mod, unused: repr(_options(**kwargs)(mod)))
  assert result.startswith("InputOptions(experimental_fetch_to_device=")
  if not kwargs:
    assert result == (
        "InputOptions(experimental_fetch_to_device=True, experimental_replication_mode="
        "<InputReplicationMode.PER_WORKER: 'PER_WORKER'>, "
        "experimental_place_dataset_on_device=False, experimental_per_replica_buffer_size=1)")


# --- One replica.

ONE_REPLICA = {
    "one_device": (lambda mod: oracle.api(mod).one_device("CPU:1"), DEVICES[1]),
    "mirrored_one": (lambda mod: oracle.mirrored(mod, ("CPU:2",)), DEVICES[2]),
}
ONE_REPLICA_DATASETS = {
    "batched": lambda: Dataset.range(7).batch(3),
    "dict": lambda: Dataset.from_tensor_slices({
        "a": np.arange(4.0), "b": np.ones((4, 3), np.float32)}).batch(2, drop_remainder=True),
    "unbatched": lambda: Dataset.range(3),
}


@pytest.mark.parametrize("data", ONE_REPLICA_DATASETS)
@pytest.mark.parametrize("name", ONE_REPLICA)
def test_one_replica_gives_plain_tensors(name, data):
  make_strategy, device = ONE_REPLICA[name]

  def snippet(mod, strategy):
    dist = strategy.experimental_distribute_dataset(ONE_REPLICA_DATASETS[data]())
    steps = list(dist)
    leaves = tf.nest.flatten(steps)
    return (repr(dist.element_spec), [_value(x) for x in steps],
            all(tf.is_tensor(t) and not isinstance(t, tf.distribute.DistributedValues)
                for t in leaves),
            {t.device for t in leaves},
            all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(dist.element_spec)))

  spec, steps, plain, devices, plain_spec = _both(snippet, make_strategy)
  assert plain and plain_spec
  assert devices == {device}
  assert "PerReplica" not in spec
  if data == "batched":
    assert [values for _, _, values, _ in steps] == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("name", ONE_REPLICA)
def test_one_replica_from_function(name, run_mode):
  make_strategy, device = ONE_REPLICA[name]

  def read(mod, strategy, mode):
    seen = []

    def dataset_fn(ctx):
      seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
      return Dataset.range(5).batch(2)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    total = mode(lambda: dist.reduce(tf.constant(0, tf.int64),
                                     lambda state, x: state + tf.reduce_sum(x * x)))
    return seen, repr(dist.element_spec), [_value(x) for x in dist], int(total)

  seen, spec, steps, total = _read_like_tf(("one_replica_function", name), read, run_mode,
                                           make_strategy)
  assert seen == [(1, 0, 1)]
  assert spec == "TensorSpec(shape=(None,), dtype=tf.int64, name=None)"
  assert steps == [("int64", (2,), [0, 1], device), ("int64", (2,), [2, 3], device),
                   ("int64", (1,), [4], device)]
  assert total == 30


@pytest.mark.parametrize("name", ONE_REPLICA)
def test_one_replica_optional_and_cardinality(name):
  def snippet(mod, strategy):
    dist = strategy.experimental_distribute_dataset(Dataset.range(7).batch(3))
    iterator = iter(dist)
    optionals = [iterator.get_next_as_optional() for _ in range(4)]
    return (int(dist.cardinality), [bool(o.has_value()) for o in optionals],
            [o.get_value().numpy().tolist() for o in optionals[:3]])

  assert _both(snippet, ONE_REPLICA[name][0]) == (
      3, [True, True, True, False], [[0, 1, 2], [3, 4, 5], [6]])


@MODULES
def test_default_strategy_passes_input_through(mod):
  strategy = mod.get_strategy()
  assert not mod.has_strategy()
  dataset = Dataset.range(4).batch(2)
  assert strategy.experimental_distribute_dataset(dataset) is dataset
  seen = []

  def dataset_fn(ctx):
    seen.append((type(ctx).__name__, ctx.num_input_pipelines, ctx.input_pipeline_id,
                 ctx.num_replicas_in_sync, str(ctx)))
    return dataset

  assert strategy.distribute_datasets_from_function(dataset_fn) is dataset
  assert seen == [("InputContext", 1, 0, 1,
                   "tf.distribute.InputContext(input pipeline id 0, total: 1)")]


# --- Errors. TensorFlow fails on the first two with AttributeError or
# IndexError from deep inside; tf_distribute_lite says what is wrong.

@pytest.mark.parametrize("value", [
    [1, 2, 3], np.arange(4), tf.constant([1, 2]), {"a": tf.constant([1.0])},
], ids=["list", "array", "tensor", "dict"])
def test_non_dataset_raises_type_error(value):
  with pytest.raises(TypeError, match="`dataset`") as raised:
    oracle.mirrored(tfd).experimental_distribute_dataset(value)
  assert type(value).__name__ in str(raised.value)


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(3),
    lambda: Dataset.from_tensor_slices({"a": np.arange(3), "b": np.ones((3, 2))}),
    lambda: Dataset.from_tensor_slices((np.ones((3, 2)), np.arange(3))),
], ids=["scalar", "dict", "tuple"])
def test_unbatched_dataset_raises_value_error(make):
  with pytest.raises(ValueError, match=r"(?i)batch"):
    oracle.mirrored(tfd).experimental_distribute_dataset(make())


@pytest.mark.parametrize("method", ["map", "batch", "shuffle"])
@pytest.mark.parametrize("source", ["dataset", "function"])
def test_transforming_a_distributed_dataset_raises(method, source):
  def make(strategy):
    if source == "dataset":
      return strategy.experimental_distribute_dataset(Dataset.range(8).batch(4))
    return strategy.distribute_datasets_from_function(lambda ctx: Dataset.range(8).batch(1))

  raised = _both(lambda mod, s: getattr(make(s), method))
  assert raised.type is AttributeError
  with pytest.raises(AttributeError, match="distribute_datasets_from_function") as error:
    getattr(make(oracle.mirrored(tfd)), method)
  assert repr(method) in str(error.value)


@pytest.mark.parametrize("result", [[1, 2], tf.constant([1, 2]), None],
                         ids=["list", "tensor", "None"])
def test_function_returning_non_dataset_raises_type_error(result):
  with pytest.raises(TypeError, match="tf.data.Dataset"):
    oracle.mirrored(tfd).distribute_datasets_from_function(lambda ctx: result)


# --- experimental_make_numpy_dataset.

NUMPY_STRATEGIES = ["mirrored", "v1_mirrored", "one_device"]
NUMPY_INPUTS = {
    "array": lambda: np.arange(30, dtype=np.float32).reshape(10, 3),
    "dict": lambda: {"x": np.arange(10), "y": np.arange(30.0).reshape(10, 3)},
    "tuple": lambda: (np.arange(10, dtype=np.int32), np.linspace(0.0, 1.0, 10)),
}


def _slices(numpy_input):
  return [tf.nest.map_structure(lambda a, i=i: a[i].tolist(), numpy_input)
          for i in range(10)]


@pytest.mark.parametrize("data", NUMPY_INPUTS)
def test_numpy_dataset_matches_tensorflow_v1(data):
  def snippet(mod, strategy):
    dataset = strategy.experimental_make_numpy_dataset(NUMPY_INPUTS[data]())
    return repr(dataset.element_spec), [tf.nest.map_structure(lambda t: t.numpy().tolist(), x)
                                        for x in dataset]

  spec, elements = _both(snippet, lambda mod: oracle.api(mod).v1_mirrored)
  assert elements == _slices(NUMPY_INPUTS[data]())
  assert "TensorSpec" in spec


@pytest.mark.parametrize("data", NUMPY_INPUTS)
@pytest.mark.parametrize("name", NUMPY_STRATEGIES)
def test_numpy_dataset_values(name, data):
  numpy_input = NUMPY_INPUTS[data]()
  dataset = strategies.shared(name, ours=True).experimental_make_numpy_dataset(numpy_input)
  got = [tf.nest.map_structure(lambda t: t.numpy().tolist(), x) for x in dataset]
  assert got == _slices(numpy_input)
  assert tf.nest.map_structure(lambda s: s.dtype.as_numpy_dtype, dataset.element_spec) == (
      tf.nest.map_structure(lambda a: a.dtype.type, numpy_input))


def test_numpy_dataset_distributes():
  strategy = oracle.mirrored(tfd)
  dataset = strategy.experimental_make_numpy_dataset(np.arange(16.0)).batch(8)
  steps = [_value(x) for x in strategy.experimental_distribute_dataset(dataset)]
  assert _contents(steps) == [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]],
                              [[8.0, 9.0], [10.0, 11.0], [12.0, 13.0], [14.0, 15.0]]]


def _largest_const(graph_def):
  """The most bytes any Const node holds, in the graph and its functions."""
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  return max([n.attr["value"].tensor.ByteSize() for n in nodes if n.op == "Const"] or [0])


@pytest.mark.parametrize("name", NUMPY_STRATEGIES)
def test_numpy_dataset_in_function_is_not_a_constant(name):
  strategy = strategies.shared(name, ours=True)
  array = np.arange(4000, dtype=np.float32).reshape(1000, 4)

  @tf.function
  def column_sums():
    dataset = strategy.experimental_make_numpy_dataset(array)
    return dataset.reduce(tf.zeros([4]), lambda total, row: total + row)

  @tf.function
  def plain_column_sums():  # the control: a plain dataset embeds the array
    return Dataset.from_tensor_slices(array).reduce(tf.zeros([4]), lambda total, row: total + row)

  np.testing.assert_array_equal(column_sums().numpy(), array.sum(axis=0))
  plain_graph_def = plain_column_sums.get_concrete_function().graph.as_graph_def()
  assert _largest_const(plain_graph_def) > array.nbytes
  graph_def = column_sums.get_concrete_function().graph.as_graph_def()
  assert _largest_const(graph_def) < 1000
  assert graph_def.ByteSize() < array.nbytes


# --- One worker of several: steps agreed with the other workers.


def _other_worker_with_steps(steps):
  """A `WorkerSync` as if another worker had input for `steps` more steps."""
  remaining = tf.Variable(steps)

  def any_worker_has(has_value):
    return tf.logical_or(has_value, remaining.assign_sub(1) >= 0)
  return input_lib.WorkerSync(any_worker_has)


def _one_worker_of_two(sync, make_dataset=lambda: Dataset.range(8).batch(8)):
  """Worker 0 of 2 (4 replicas each): one step of its own input."""
  return input_lib.distribute_dataset(
      make_dataset(), DEVICES, host=DEVICES[0],
      input_context=tfd.InputContext(2, 0, 2 * len(DEVICES)), workers=sync)


def test_worker_without_input_takes_empty_steps_while_another_has_some():
  steps = [[p.numpy().tolist() for p in step.values]
           for step in _one_worker_of_two(_other_worker_with_steps(3))]
  assert steps == [[[0], [2], [4], [6]], [[], [], [], []], [[], [], [], []]]


def test_steps_agreed_with_other_workers_in_function():
  @tf.function
  def count(dist):
    steps, total = tf.constant(0), tf.constant(0, tf.int64)
    for step in dist:
      steps += 1
      total += tf.add_n([tf.reduce_sum(p) for p in step.values])
    return steps, total
  steps, total = count(_one_worker_of_two(_other_worker_with_steps(3)))
  assert (int(steps), int(total)) == (3, 12)


def test_end_of_every_workers_input_raises_out_of_range():
  iterator = iter(_one_worker_of_two(_other_worker_with_steps(1)))
  assert [p.numpy().tolist() for p in iterator.get_next().values] == [[0], [2], [4], [6]]
  with pytest.raises(tf.errors.OutOfRangeError):
    iterator.get_next()
  graph_iterator = iter(_one_worker_of_two(_other_worker_with_steps(1)))
  next_in_function = tf.function(lambda it: it.get_next().values[0])
  assert next_in_function(graph_iterator).numpy().tolist() == [0]
  with pytest.raises(tf.errors.OutOfRangeError):
    next_in_function(graph_iterator)
