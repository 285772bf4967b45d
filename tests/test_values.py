"""Behaviour of `PerReplica`, `Mirrored`, `regroup` and `select_replica`.

Every snippet runs twice: under `tf.distribute` (the oracle) and under
`tf_distribute_lite`. Values, reprs and exception classes must agree, and
where the answer is known it is also spelled out.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import distribute_utils as tf_distribute_utils
from tensorflow.python.distribute import values as tf_values

import tf_distribute_lite as tfd
from tf_distribute_lite import values as tfd_values

import oracle

NUM_DEVICES = len(tf.config.list_logical_devices("CPU"))
DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}"
                for i in range(NUM_DEVICES))

Impl = collections.namedtuple(
    "Impl", "name dist PerReplica Mirrored regroup select_replica")

IMPLS = (
    Impl("tf.distribute", tf.distribute, tf_values.PerReplica, tf_values.Mirrored,
         tf_distribute_utils.regroup, tf_distribute_utils.select_replica),
    Impl("tfd", tfd, tfd_values.PerReplica, tfd_values.Mirrored,
         tfd_values.regroup, tfd_values.select_replica),
)

Pair = collections.namedtuple("Pair", "a b")


def compare(snippet, num_devices=NUM_DEVICES):
  """Runs `snippet(impl, strategy)` under both; asserts equal outcomes.

  Returns the outcome, so a test can also check it against known values.
  """
  devices = DEVICES[:num_devices]
  return oracle.compare(snippet, *[(impl, oracle.mirrored(impl.dist, devices)) for impl in IMPLS])


def _numpy(structure):
  """Tensors and arrays in a nest as (nested) Python lists and scalars."""
  def convert(x):
    if isinstance(x, (tf.Tensor, tf.Variable, np.ndarray, np.generic)):
      return np.asarray(x).tolist()
    return x
  return tf.nest.map_structure(convert, structure)


def _per_replica_floats(strategy, offset=0.0, shape=()):
  """A PerReplica whose replica i holds `i + offset` (float32)."""
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.fill(shape, float(ctx.replica_id_in_sync_group) + offset))


def _expected_repr(cls_name, items):
  lines = ",\n".join(f"  {i}: {item}" for i, item in enumerate(items))
  return f"{cls_name}:{{\n{lines}\n}}"


# --- Reprs and str.


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_per_replica_repr_and_str(num_devices):
  """`repr` and `str` list every component, as TF prints them."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    return repr(value), str(value)

  rep, text = compare(snippet, num_devices)
  assert rep == _expected_repr(
      "PerReplica", [f"<tf.Tensor: shape=(), dtype=float32, numpy={i}.0>"
                     for i in range(num_devices)])
  assert text == _expected_repr(
      "PerReplica", [f"tf.Tensor({i}.0, shape=(), dtype=float32)"
                     for i in range(num_devices)])


def test_per_replica_repr_of_vectors_and_python_values():
  """Components print with their own repr, whatever they are."""
  def snippet(impl, strategy):
    vectors = impl.PerReplica([tf.constant([1, 2]), tf.constant([3, 4])])
    python = impl.PerReplica([1, "a"])
    return repr(vectors), str(vectors), repr(python), str(python)

  rep, _, python_rep, python_str = compare(snippet)
  assert rep == _expected_repr("PerReplica", [
      "<tf.Tensor: shape=(2,), dtype=int32, numpy=array([1, 2], dtype=int32)>",
      "<tf.Tensor: shape=(2,), dtype=int32, numpy=array([3, 4], dtype=int32)>"])
  assert python_rep == "PerReplica:{\n  0: 1,\n  1: 'a'\n}"
  assert python_str == "PerReplica:{\n  0: 1,\n  1: a\n}"


def test_mirrored_repr_and_str():
  """A `Mirrored` prints like a `PerReplica`, under its own class name."""
  def snippet(impl, strategy):
    value = impl.Mirrored([tf.constant(1.5), tf.constant(1.5)])
    return repr(value), str(value)

  rep, text = compare(snippet)
  assert rep == _expected_repr(
      "Mirrored", ["<tf.Tensor: shape=(), dtype=float32, numpy=1.5>"] * 2)
  assert text == _expected_repr(
      "Mirrored", ["tf.Tensor(1.5, shape=(), dtype=float32)"] * 2)


def test_update_result_is_mirrored_with_matching_repr():
  """`extended.update` in cross-replica context returns a `Mirrored`."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    result = strategy.extended.update(v, lambda c, x: c.assign_add(x),
                                      args=(2.0,))
    return type(result).__name__, repr(result)

  name, rep = compare(snippet)
  assert name == "Mirrored"
  assert rep == _expected_repr(
      "Mirrored", ["<tf.Tensor: shape=(), dtype=float32, numpy=3.0>"] * NUM_DEVICES)


# --- Components and public types.


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_values_and_local_results(num_devices):
  """`.values` and `experimental_local_results` give the components in order."""
  def snippet(impl, strategy):
    def step():
      replica_id = impl.dist.get_replica_context().replica_id_in_sync_group
      return tf.fill([2], tf.cast(replica_id, tf.float32))

    value = strategy.run(step)
    local = strategy.experimental_local_results(value)
    return (type(value.values).__name__, _numpy(value.values),
            [c.device for c in value.values], type(local).__name__,
            all(a is b for a, b in zip(local, value.values)), len(local))

  kind, numbers, devices, local_kind, same, count = compare(snippet, num_devices)
  assert kind == "tuple" and local_kind == "tuple"
  assert numbers == tuple([float(i)] * 2 for i in range(num_devices))
  assert devices == list(DEVICES[:num_devices])
  assert same and count == num_devices


def test_local_results_of_plain_values_and_nests():
  """A plain value is one local result; a nest is split per replica."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    return (_numpy(strategy.experimental_local_results(tf.constant(5.0))),
            _numpy(strategy.experimental_local_results(3)),
            _numpy(strategy.experimental_local_results({"a": value, "b": 1})),
            _numpy(strategy.experimental_local_results([1, 2])))

  plain, python, nest, plain_list = compare(snippet)
  assert plain == (5.0,) and python == (3,)
  assert nest == tuple({"a": float(i), "b": 1} for i in range(NUM_DEVICES))
  assert plain_list == ([1, 2],) * NUM_DEVICES


def test_isinstance_of_public_distributed_types():
  """PerReplica and Mirrored are the public interface types, not tensors."""
  def snippet(impl, strategy):
    per_replica = _per_replica_floats(strategy)
    mirrored = impl.Mirrored([tf.constant(1.0)] * 2)
    kinds = tf.types.experimental.distributed
    return [
        isinstance(per_replica, tf.distribute.DistributedValues),
        isinstance(per_replica, kinds.PerReplica),
        isinstance(per_replica, kinds.Mirrored),
        isinstance(mirrored, tf.distribute.DistributedValues),
        isinstance(mirrored, kinds.Mirrored),
        isinstance(mirrored, kinds.PerReplica),
        tf.is_tensor(per_replica),
        isinstance(per_replica, tf.Tensor),
    ]

  assert compare(snippet) == [True, True, False, True, True, False, False, False]
  assert issubclass(tfd.DistributedValues, tf.distribute.DistributedValues)


# --- Composite tensors and tf.function.


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_function_with_per_replica_argument_traces_once(num_devices):
  """New PerReplica arguments of the same shapes reuse the first trace."""
  def snippet(impl, strategy):
    @tf.function
    def step(x):
      return strategy.run(lambda t: t * 2.0, args=(x,))

    outputs = []
    for i in range(5):
      result = step(_per_replica_floats(strategy, offset=10.0 * i, shape=[1]))
      outputs.append(_numpy(strategy.experimental_local_results(result)))
    return step.experimental_get_tracing_count(), outputs

  count, outputs = compare(snippet, num_devices)
  assert count == 1
  assert outputs[4] == tuple([2.0 * (40.0 + i)] for i in range(num_devices))


def test_function_retraces_for_new_shape_or_dtype():
  """A PerReplica of other shapes or dtypes is a new input signature."""
  def snippet(impl, strategy):
    @tf.function
    def identity(x):
      return x

    for value in ([tf.zeros([1])] * 2, [tf.zeros([1])] * 2,
                  [tf.zeros([2])] * 2, [tf.zeros([2], tf.int32)] * 2):
      identity(impl.PerReplica(value))
    return identity.experimental_get_tracing_count()

  assert compare(snippet) == 3


def test_per_replica_returned_from_function_is_per_replica():
  """A PerReplica passed through a tf.function comes back as one."""
  def snippet(impl, strategy):
    @tf.function
    def identity(x):
      return x

    @tf.function
    def run_replicas():
      replica_id = lambda: impl.dist.get_replica_context().replica_id_in_sync_group
      return strategy.run(lambda: tf.cast(replica_id(), tf.float32) * 3.0)

    echoed = identity(_per_replica_floats(strategy, offset=1.0))
    ran = run_replicas()
    return (type(echoed).__name__, _numpy(echoed.values),
            type(ran).__name__, _numpy(ran.values))

  echoed_kind, echoed, ran_kind, ran = compare(snippet)
  assert echoed_kind == ran_kind == "PerReplica"
  assert echoed == tuple(float(i + 1) for i in range(NUM_DEVICES))
  assert ran == tuple(3.0 * i for i in range(NUM_DEVICES))


def test_per_replica_of_composite_or_mixed_components_through_a_function():
  """Ragged, IndexedSlices and int/float components round-trip a function."""
  def snippet(impl, strategy):
    identity = tf.function(lambda x: x)
    ragged = identity(impl.PerReplica(
        [tf.ragged.constant([[i, 1], [2]]) for i in range(NUM_DEVICES)]))
    slices = identity(impl.PerReplica(
        [tf.IndexedSlices(tf.constant([[float(i)]]), tf.constant([1]), tf.constant([2, 1]))
         for i in range(NUM_DEVICES)]))
    mixed = identity(impl.PerReplica(
        [tf.constant(i) if i % 2 else tf.constant([float(i)]) for i in range(NUM_DEVICES)]))
    return ([type(v).__name__ for v in (ragged, slices, mixed)],
            [r.to_list() for r in ragged.values],
            [_numpy(tf.convert_to_tensor(s)) for s in slices.values],
            [_numpy(m) for m in mixed.values])

  kinds, ragged, slices, mixed = compare(snippet)
  assert kinds == ["PerReplica"] * 3
  assert ragged == [[[i, 1], [2]] for i in range(NUM_DEVICES)]
  assert slices == [[[0.0], [float(i)]] for i in range(NUM_DEVICES)]
  assert mixed == [i if i % 2 else [float(i)] for i in range(NUM_DEVICES)]


def test_mirrored_function_argument_traces_once():
  """New Mirrored arguments of the same shapes reuse the first trace."""
  def snippet(impl, strategy):
    @tf.function
    def double(x):
      return x * 2.0

    results = [double(impl.Mirrored([tf.constant(float(i))] * 2))
               for i in range(4)]
    return (double.experimental_get_tracing_count(),
            _numpy(tf.convert_to_tensor(results[-1])))

  assert compare(snippet) == (1, 6.0)


def test_mirrored_returned_from_function_is_one_tensor():
  """A Mirrored a tf.function returns comes back as its one tensor."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    identity = tf.function(lambda x: x)
    echoed = identity(impl.Mirrored([tf.constant(2.0)] * 2))
    updated = tf.function(lambda: strategy.extended.update(
        v, lambda c: c.assign_add(1.0)))()
    return (type(echoed).__name__, _numpy(echoed), type(updated).__name__,
            _numpy(updated))

  assert compare(snippet) == ("EagerTensor", 2.0, "EagerTensor", 2.0)


def test_type_spec_repr():
  """The type spec of a PerReplica lists its components' specs."""
  def snippet(impl, strategy):
    spec = _per_replica_floats(strategy, shape=[3])._type_spec
    return type(spec).__name__, repr(spec)

  name, rep = compare(snippet)
  assert name == "PerReplicaSpec"
  component = "TensorSpec(shape=(3,), dtype=tf.float32, name=None)"
  assert rep == f"PerReplicaSpec({', '.join([component] * NUM_DEVICES)})"


def test_type_spec_as_input_signature():
  """A PerReplica's type spec serves as a `tf.function` input signature."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy, shape=[1])
    spec = value._type_spec
    same_spec = impl.PerReplica([tf.zeros([1])] * NUM_DEVICES)._type_spec
    step = tf.function(
        lambda x: strategy.run(lambda t: t + 1.0, args=(x,)),
        input_signature=[spec])
    result = step(_per_replica_floats(strategy, offset=5.0, shape=[1]))
    return (spec == same_spec, hash(spec) == hash(same_spec),
            spec.is_compatible_with(value), type(result).__name__,
            _numpy(result.values))

  equal, same_hash, compatible, kind, result = compare(snippet)
  assert equal and same_hash and compatible and kind == "PerReplica"
  assert result == tuple([i + 6.0] for i in range(NUM_DEVICES))


def test_nest_expand_composites_round_trip():
  """`tf.nest` with expand_composites sees the components, and rebuilds."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy, offset=0.5)
    flat = tf.nest.flatten({"x": value}, expand_composites=True)
    doubled = [t * 2.0 for t in flat]
    rebuilt = tf.nest.pack_sequence_as({"x": value}, doubled,
                                       expand_composites=True)
    return (len(flat), _numpy(flat), type(rebuilt["x"]).__name__,
            _numpy(rebuilt["x"].values))

  count, flat, kind, rebuilt = compare(snippet)
  assert count == NUM_DEVICES
  assert flat == [i + 0.5 for i in range(NUM_DEVICES)]
  assert kind == "PerReplica"
  assert rebuilt == tuple(2.0 * i + 1.0 for i in range(NUM_DEVICES))


# --- Using distributed values as values.


def test_per_replica_is_not_one_tensor_in_cross_replica_context():
  """Converting a PerReplica outside `run` raises ValueError, as in TF."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    outcomes = []
    for scope in (None, strategy.scope()):
      try:
        if scope is None:
          tf.convert_to_tensor(value)
        else:
          with scope:
            tf.convert_to_tensor(value)
        outcomes.append("converted")
      except ValueError as e:
        outcomes.append(str(e))
    return outcomes

  outcomes = compare(snippet)
  assert all("not inside a replica context" in o for o in outcomes), outcomes


def test_captured_per_replica_converts_to_the_replicas_component():
  """Inside `run`, a captured PerReplica converts to that replica's value."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    result = strategy.run(lambda: tf.convert_to_tensor(value) * 2.0)
    return _numpy(strategy.experimental_local_results(result))

  assert compare(snippet) == tuple(2.0 * i for i in range(NUM_DEVICES))


def test_mirrored_behaves_as_its_value():
  """Operators, attributes and conversion use the mirrored value."""
  def snippet(impl, strategy):
    m = impl.Mirrored([tf.constant([1.0, 2.0])] * 2)
    return _numpy([m + 1.0, m * 2.0, 1.0 - m, m[1], m > 1.5,
                   tf.convert_to_tensor(m)]), m.dtype, tuple(m.shape)

  values, dtype, shape = compare(snippet)
  assert values == [[2.0, 3.0], [2.0, 4.0], [0.0, -1.0], 2.0, [False, True],
                    [1.0, 2.0]]
  assert dtype == tf.float32 and shape == (2,)


def test_captured_mirrored_gives_each_replica_its_component():
  """Inside `run`, replica i reads component i of a captured Mirrored."""
  def snippet(impl, strategy):
    m = impl.Mirrored([tf.constant(float(i)) for i in range(NUM_DEVICES)])
    result = strategy.run(lambda: m + 0.5)
    return _numpy(strategy.experimental_local_results(result))

  assert compare(snippet) == tuple(i + 0.5 for i in range(NUM_DEVICES))


# --- regroup and select_replica.


def test_regroup_nests():
  """Lists, tuples, dicts and namedtuples are regrouped element by element."""
  def snippet(impl, strategy):
    result = impl.regroup([{"x": (1, [2, 3]), "y": Pair(4, "z")},
                           {"x": (5, [6, 7]), "y": Pair(8, "z")}])
    return (repr(result), type(result["y"]).__name__,
            type(result["x"][1]).__name__, result["y"].b)

  rep, pair_kind, list_kind, shared = compare(snippet)
  assert pair_kind == "Pair" and list_kind == "list" and shared == "z"
  assert rep == (
      "{'x': (PerReplica:{\n  0: 1,\n  1: 5\n}, [PerReplica:{\n  0: 2,\n"
      "  1: 6\n}, PerReplica:{\n  0: 3,\n  1: 7\n}]), 'y': Pair(a=PerReplica:"
      "{\n  0: 4,\n  1: 8\n}, b='z')}")


def test_regroup_keeps_one_shared_object():
  """Where every replica gave the very same object, that object is kept."""
  def snippet(impl, strategy):
    shared = tf.constant(3)
    kept = impl.regroup([shared, shared, shared])
    single = impl.regroup([tf.constant(1.0)])
    wrapped = impl.regroup([shared, shared], always_wrap=True)
    return (kept is shared, type(single).__name__, type(wrapped).__name__,
            _numpy(wrapped.values))

  assert compare(snippet) == (True, "EagerTensor", "PerReplica", (3, 3))


def test_regroup_wrap_class():
  """`wrap_class` picks the distributed type of the regrouped values."""
  def snippet(impl, strategy):
    result = impl.regroup([tf.constant(1.0), tf.constant(1.0)], impl.Mirrored)
    return type(result).__name__, _numpy(result.values)

  assert compare(snippet) == ("Mirrored", (1.0, 1.0))


def test_regroup_components_of_a_variable_give_the_variable():
  """The components of a distributed variable regroup into the variable."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    from_components = impl.regroup(list(v.values))
    from_variable = impl.regroup([v] * NUM_DEVICES)
    from_updates = impl.regroup([c.assign(2.0) for c in v.values])
    return (from_components is v, from_variable is v,
            type(from_updates).__name__)

  assert compare(snippet) == (True, True, "PerReplica")


def _by_replica(api, first, other, run=False):
  """`first` from replica 0, `other` from replica 1, of `run` or of
  `experimental_distribute_values_from_function`."""
  def pick(replica_id):
    return first() if replica_id == 0 else other()
  if run:
    return api.pair.run(lambda: pick(api.mod.get_replica_context().replica_id_in_sync_group))
  return api.pair.experimental_distribute_values_from_function(
      lambda context: pick(context.replica_id_in_sync_group))


_X = lambda: tf.constant(1.0)  # pylint: disable=unnecessary-lambda-assignment
_SCALAR = "Tensor(shape=(), dtype=float32)"


@pytest.mark.parametrize("snippet, theirs, fragments", [
    # TF's regroup asserts; or takes the values and fails at the reduction.
    (lambda a: _by_replica(a, lambda: (_X(),), lambda: {"a": _X()}), AssertionError,
     [f"replica 0 returned ({_SCALAR},)", f"replica 1 returned {{'a': {_SCALAR}}}"]),
    (lambda a: _by_replica(a, _X, lambda: (_X(), _X())), None,
     [f"replica 0 returned {_SCALAR}", f"replica 1 returned ({_SCALAR}, {_SCALAR})"]),
    (lambda a: _by_replica(a, lambda: [_X()], lambda: [_X(), _X()], run=True), AssertionError,
     [f"replica 0 returned [{_SCALAR}]", f"replica 1 returned [{_SCALAR}, {_SCALAR}]"]),
    (lambda a: _by_replica(a, lambda: {"a": [1]}, lambda: {"a": [1, 2]}), AssertionError,
     ["structures at ['a']", "replica 0 returned [int]", "replica 1 returned [int, int]"]),
], ids=["tuple_and_dict", "tensor_and_tuple", "run_lists", "nested"])
def test_replicas_returning_different_structures_raise_value_error(snippet, theirs, fragments):
  oracle.check_misuse(snippet, theirs, ValueError,
                      ["Replicas returned different structures"] + fragments)


@pytest.mark.parametrize("replica_id", [0, 1, NUM_DEVICES - 1])
def test_select_replica_on_nests(replica_id):
  """`select_replica` picks component `replica_id` everywhere in a nest."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    nest = {"a": value, "b": [7, (value, "s")], "c": Pair(value, None)}
    selected = impl.select_replica(replica_id, nest)
    return _numpy(selected), type(selected["c"]).__name__

  selected, pair_kind = compare(snippet)
  r = float(replica_id)
  assert selected == {"a": r, "b": [7, (r, "s")], "c": Pair(r, None)}
  assert pair_kind == "Pair"


def test_select_replica_keeps_distributed_variables_whole():
  """A distributed variable is not split: it picks its component itself."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    selected = impl.select_replica(1, {"v": v, "x": _per_replica_floats(strategy)})
    return selected["v"] is v, _numpy(selected["x"])

  assert compare(snippet) == (True, 1.0)


class _TensorFlowsPerReplica(tf_values.DistributedValues):
  """A per-replica value of TensorFlow's own kind, as tf_keras's optimizer
  tests make one."""

  @property
  def values(self):
    return self._values


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_distributed_values_of_tensorflows_kind_are_split(in_function):
  """`run`, `extended.update` and `update_non_slot` give each replica and
  device its own component of a DistributedValues that is TensorFlow's,
  not ours, as TF does with its own."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(0.0)
    extended = strategy.extended

    def step():
      parts = _TensorFlowsPerReplica([tf.constant(i + 1.0) for i in range(NUM_DEVICES)])
      ran = strategy.run(lambda x: x * 2.0, args=(parts,))
      with tf.control_dependencies(strategy.experimental_local_results(ran)):
        extended.update(v, lambda c, x: c.assign_add(x), args=(parts,))
      non_slot = extended.update_non_slot(
          extended.non_slot_devices([v]), tf.identity, args=(parts,), group=False)
      return strategy.experimental_local_results(ran), non_slot
    ran, non_slot = tf.function(step)() if in_function else step()
    return _numpy(ran), _numpy(non_slot), _numpy(strategy.experimental_local_results(v))

  ones_up = tuple(i + 1.0 for i in range(NUM_DEVICES))
  assert compare(snippet) == (tuple(2.0 * x for x in ones_up), ones_up, ones_up)


def test_run_regroups_nested_results():
  """`strategy.run` regroups a nest of per-replica results."""
  def snippet(impl, strategy):
    with strategy.scope():
      v = tf.Variable(2.0)

    def step(x):
      return {"t": (x * 2.0, 5), "v": v, "l": [x + 1.0]}

    result = strategy.run(step, args=(_per_replica_floats(strategy),))
    return (type(result["t"][0]).__name__, result["t"][1], result["v"] is v,
            _numpy(result["t"][0].values), _numpy(result["l"][0].values))

  kind, constant, same_variable, doubled, incremented = compare(snippet)
  assert kind == "PerReplica" and constant == 5 and same_variable
  assert doubled == tuple(2.0 * i for i in range(NUM_DEVICES))
  assert incremented == tuple(i + 1.0 for i in range(NUM_DEVICES))


def test_run_splits_distributed_arguments_in_nests():
  """Each replica receives its own component of nested PerReplica args."""
  def snippet(impl, strategy):
    value = _per_replica_floats(strategy)
    result = strategy.run(lambda d: d["k"][0] + 1.0, args=({"k": [value]},))
    return _numpy(strategy.experimental_local_results(result))

  assert compare(snippet) == tuple(i + 1.0 for i in range(NUM_DEVICES))


def test_saved_model_holds_functions_taking_and_returning_per_replica(tmp_path):
  """A SavedModel holds a function whose signature takes a PerReplica and
  one that returns one; loaded, they take and give the strategy's values."""
  def snippet(impl, strategy):
    module = tf.Module()
    module.double = tf.function(lambda x: strategy.run(lambda t: t * 2.0, args=(x,)))
    module.double.get_concrete_function(_per_replica_floats(strategy))
    module.ids = tf.function(
        lambda: strategy.run(lambda: impl.dist.get_replica_context().replica_id_in_sync_group),
        input_signature=[])
    path = str(tmp_path / impl.name)
    tf.saved_model.save(module, path)
    loaded = tf.saved_model.load(path)
    with strategy.scope():
      doubled = loaded.double(_per_replica_floats(strategy, offset=1.0))
    ids = loaded.ids()
    return (type(doubled).__name__, _numpy(doubled.values),
            type(ids).__name__, _numpy(ids.values))

  doubled_kind, doubled, ids_kind, ids = compare(snippet, num_devices=2)
  assert (doubled_kind, ids_kind) == ("PerReplica", "PerReplica")
  assert (doubled, ids) == ((2.0, 4.0), (0, 1))
