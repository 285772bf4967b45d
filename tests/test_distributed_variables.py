"""Behaviour of variables created in a strategy's scope.

`MirroredVariable` and `SyncOnReadVariable` must act as the `tf.Variable`
they stand for: creation, reprs, reads, operators, gradients, updates in
every context and aggregation, checkpoints and SavedModels. Every snippet
runs under `tf.distribute` (the oracle) and under `tf_distribute_lite`, and
the outcomes (values, reprs, exception classes) must agree.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
from oracle import Raised

NUM_DEVICES = len(tf.config.list_logical_devices("CPU"))
DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}"
                for i in range(NUM_DEVICES))
IMPLS = (tf.distribute, tfd)

AGG = tf.VariableAggregation
SYNC = tf.VariableSynchronization
ALL_AGGREGATIONS = (AGG.SUM, AGG.MEAN, AGG.ONLY_FIRST_REPLICA, AGG.NONE)


def _strategy(dist, num_devices):
  """The shared strategy of `dist` on the first `num_devices` devices."""
  return oracle.mirrored(dist, DEVICES[:num_devices])


def compare(snippet, num_devices=NUM_DEVICES):
  """Runs `snippet(dist, strategy)` under both; asserts equal outcomes.

  Returns the outcome, so a test can also check it against known values.
  """
  return oracle.compare(snippet, *[(dist, _strategy(dist, num_devices)) for dist in IMPLS])


def _numpy(structure):
  """Tensors, variables and arrays in a nest as Python lists and scalars."""
  def convert(x):
    if isinstance(x, (tf.Tensor, np.ndarray, np.generic)):
      return np.asarray(x).tolist()
    if isinstance(x, tf.Variable):
      return x.numpy().tolist()
    return x
  return tf.nest.map_structure(convert, structure)


def _components(variable):
  """The value of every component of a distributed variable."""
  return [c.numpy().tolist() for c in variable.values]


def _replica_id(dist):
  """This replica's id as a float32 scalar."""
  return tf.cast(dist.get_replica_context().replica_id_in_sync_group,
                 tf.float32)


def _expected_repr(cls_name, items):
  lines = ",\n".join(f"  {i}: {item}" for i, item in enumerate(items))
  return f"{cls_name}:{{\n{lines}\n}}"


def _component_names(base, num_devices):
  return [f"{base}:0"] + [f"{base}/replica_{i}:0" for i in range(1, num_devices)]


# --- Creation, reprs and names.


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_mirrored_variable_repr_and_str(num_devices):
  """A mirrored variable prints every component under its replica name."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    return type(v).__name__, repr(v), str(v)

  kind, rep, text = compare(snippet, num_devices)
  assert kind == "MirroredVariable"
  expected = _expected_repr("MirroredVariable", [
      f"<tf.Variable '{name}' shape=() dtype=float32, numpy=1.0>"
      for name in _component_names("Variable", num_devices)])
  assert rep == expected
  assert text == expected


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_component_names_and_devices(num_devices):
  """Component i is `<name>/replica_i` on device i; the variable is `<name>`."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], name="w")
    return ([c.name for c in v.values], [c.device for c in v.values],
            [repr(c) for c in v.values], v.name, v.device, _components(v))

  names, devices, reprs, name, device, components = compare(snippet, num_devices)
  assert names == _component_names("w", num_devices)
  assert devices == list(DEVICES[:num_devices])
  assert reprs[1] == ("<tf.Variable 'w/replica_1:0' shape=(2,) dtype=float32, "
                      "numpy=array([1., 2.], dtype=float32)>")
  assert name == "w:0" and device == DEVICES[0]
  assert components == [[1.0, 2.0]] * num_devices


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_variable_created_on_first_trace_of_a_function(num_devices):
  """A tf.function creating a variable in scope makes a MirroredVariable once."""
  def snippet(dist, strategy):
    created = []

    @tf.function
    def read():
      if not created:
        created.append(tf.Variable(tf.random.normal([3]), name="made_in_fn"))
      return created[0].read_value()

    with strategy.scope():
      results = [read() for _ in range(3)]
    v = created[0]
    components = _components(v)
    # TF traces a function that creates variables twice.
    return (len(created), read.experimental_get_tracing_count(),
            type(v).__name__, [c.name for c in v.values],
            all(c == components[0] for c in components),
            _numpy(results[2]) == components[0])

  count, traces, kind, names, equal, read_primary = compare(snippet, num_devices)
  assert (count, traces, kind) == (1, 2, "MirroredVariable")
  assert names == _component_names("made_in_fn", num_devices)
  assert equal and read_primary


def _made_in_function():
  """A variable created by the first trace of a tf.function."""
  created = []

  @tf.function
  def make():
    if not created:
      created.append(tf.Variable(lambda: tf.random.uniform([4])))

  make()
  return created[0]


_RANDOM_INITIALIZERS = {
    "tensor": lambda: tf.Variable(tf.random.normal([4])),
    "callable": lambda: tf.Variable(lambda: tf.random.normal([4])),
    "keras_initializer": lambda: tf.Variable(
        lambda: keras.initializers.GlorotUniform()((4,))),
    "in_function": _made_in_function,
}


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
@pytest.mark.parametrize("initializer", sorted(_RANDOM_INITIALIZERS))
def test_random_initializer_gives_equal_components(initializer, num_devices):
  """Components made for replicas > 0 start equal to the primary."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = _RANDOM_INITIALIZERS[initializer]()
    components = _components(v)
    return (type(v).__name__, len(components),
            all(c == components[0] for c in components),
            len(set(components[0])) > 1)

  assert compare(snippet, num_devices) == (
      "MirroredVariable", num_devices, True, True)


def test_keras_dense_built_in_scope():
  """A Keras layer built in scope holds mirrored weights and trains per replica."""
  def snippet(dist, strategy):
    with strategy.scope():
      layer = keras.layers.Dense(3, name="probe", kernel_initializer="ones",
                                 bias_initializer="zeros")
      layer.build((None, 2))
      random_layer = keras.layers.Dense(3, name="random_probe")
      random_layer.build((None, 2))
    kernel = layer.kernel.value
    random_kernel = _components(random_layer.kernel.value)

    def step(x):
      with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(x))
      return tape.gradient(y, layer.kernel.value)

    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([1, 2], float(ctx.replica_id_in_sync_group)))
    grads = tf.function(lambda x: strategy.run(step, args=(x,)))(inputs)
    return (type(kernel).__name__,
            isinstance(kernel, tf.distribute.DistributedValues),
            [c.name for c in kernel.values],
            [c.name for c in layer.bias.value.values],
            all(c == random_kernel[0] for c in random_kernel),
            _numpy(layer(tf.ones((1, 2)))), type(grads).__name__,
            _numpy(strategy.experimental_local_results(grads)))

  (kind, distributed, kernel_names, bias_names, random_equal, output,
   grads_kind, grads) = compare(snippet)
  assert kind == "MirroredVariable" and distributed
  assert kernel_names == _component_names("probe/kernel", NUM_DEVICES)
  assert bias_names == _component_names("probe/bias", NUM_DEVICES)
  assert random_equal
  assert output == [[2.0, 2.0, 2.0]]
  assert grads_kind == "PerReplica"
  assert grads == tuple([[float(i)] * 3] * 2 for i in range(NUM_DEVICES))


def test_on_read_gives_sync_on_read_variable():
  """synchronization=ON_READ makes a non-trainable SyncOnReadVariable."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(0.0, synchronization=SYNC.ON_READ)
    kinds = tf.types.experimental.distributed
    return (type(v).__name__, repr(v), isinstance(v, tf.Variable),
            isinstance(v, tf.distribute.DistributedValues),
            isinstance(v, kinds.Mirrored), v.trainable,
            [c.trainable for c in v.values], v.synchronization, v.aggregation)

  (kind, rep, is_variable, distributed, mirrored, trainable, component_trainable,
   synchronization, aggregation) = compare(snippet)
  assert kind == "SyncOnReadVariable"
  assert rep == _expected_repr("SyncOnReadVariable", [
      f"<tf.Variable '{name}' shape=() dtype=float32, numpy=0.0>"
      for name in _component_names("Variable", NUM_DEVICES)])
  assert is_variable and distributed and not mirrored
  assert not trainable and component_trainable == [False] * NUM_DEVICES
  assert synchronization == SYNC.ON_READ and aggregation == AGG.NONE


def test_on_read_variable_can_be_made_trainable():
  """ON_READ with trainable=True gives trainable components, as in TF."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(0.0, synchronization=SYNC.ON_READ, trainable=True)
    return v.trainable, [c.trainable for c in v.values]

  assert compare(snippet) == (True, [True] * NUM_DEVICES)


@pytest.mark.parametrize("synchronization", [None, SYNC.AUTO, SYNC.ON_WRITE])
def test_mirrored_synchronization_is_on_write(synchronization):
  """AUTO (the default) resolves to ON_WRITE on the variable and components."""
  def snippet(dist, strategy):
    kwargs = {} if synchronization is None else {"synchronization": synchronization}
    with strategy.scope():
      v = tf.Variable(1.0, **kwargs)
    return v.synchronization, [c.synchronization for c in v.values]

  assert compare(snippet) == (SYNC.ON_WRITE, [SYNC.ON_WRITE] * NUM_DEVICES)


@pytest.mark.parametrize("synchronization", [SYNC.ON_WRITE, SYNC.ON_READ])
@pytest.mark.parametrize("aggregation", ALL_AGGREGATIONS)
def test_aggregation_property(aggregation, synchronization):
  """`aggregation` is the one the variable was created with."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=synchronization,
                      aggregation=aggregation)
    return type(v).__name__, v.aggregation

  kind, result = compare(snippet)
  assert result == aggregation
  assert kind == ("SyncOnReadVariable" if synchronization == SYNC.ON_READ
                  else "MirroredVariable")


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_mean_aggregation_of_integer_variable_raises(dtype):
  """MEAN of an integer variable is rejected at creation, as by TF."""
  def snippet(dist, strategy):
    with strategy.scope():
      tf.Variable(tf.constant(1, dtype), aggregation=AGG.MEAN)

  raised = compare(snippet)
  assert raised == Raised(ValueError(""))
  assert "aggregation=MEAN and a non-floating dtype" in raised.message


def test_synchronization_none_raises():
  """synchronization=NONE is rejected in a strategy's scope, as by TF."""
  def snippet(dist, strategy):
    with strategy.scope():
      tf.Variable(1.0, synchronization=SYNC.NONE, name="nosync")

  raised = compare(snippet)
  assert raised == Raised(ValueError(""))
  assert "`NONE` variable synchronization mode is not supported" in raised.message


# --- Acting as a tf.Variable.


def test_isinstance_and_conversion():
  """A mirrored variable is a tf.Variable and converts to its value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    kinds = tf.types.experimental.distributed
    return (isinstance(v, tf.Variable),
            isinstance(v, tf.distribute.DistributedValues),
            isinstance(v, kinds.Mirrored), isinstance(v, kinds.PerReplica),
            _numpy(tf.convert_to_tensor(v)), _numpy(tf.identity(v)),
            _numpy(tf.reduce_sum(v)), type(tf.convert_to_tensor(v)).__name__)

  assert compare(snippet) == (
      True, True, True, False, [[1.0, 2.0], [3.0, 4.0]],
      [[1.0, 2.0], [3.0, 4.0]], 10.0, "EagerTensor")


def test_is_tensor_like():
  """`tf.is_tensor` and numpy conversion accept a mirrored variable."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
    array = np.asarray(v)
    return tf.is_tensor(v), str(array.dtype), array.tolist()

  assert compare(snippet) == (True, "float32", [1.0, 2.0])


# TF 2.21's variables take no `copy`, which numpy 2 warns about.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy")
def test_scalar_variables_become_numpy_arrays():
  """`np.array` of a scalar gives a 0-d array, with a dtype or `copy` asked
  for, as for a plain variable."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(2.5)
    arrays = [np.array(v), np.asarray(v, dtype=np.float64), np.array(v, copy=True),
              np.float32(v)]
    return [(type(a).__name__, str(a.dtype), a.shape, a.tolist()) for a in arrays]

  assert compare(snippet) == [("ndarray", "float32", (), 2.5),
                              ("ndarray", "float64", (), 2.5),
                              ("ndarray", "float32", (), 2.5),
                              ("float32", "float32", (), 2.5)]


@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy")
def test_keras_scalar_variables_print_their_value():
  """Keras prints a scalar's value, which it reads through `np.array`."""
  def reprs(strategy):
    with strategy.scope():
      optimizer = keras.optimizers.Adam(0.01, name="probe_adam")
      optimizer.build([keras.Variable([1.0])])
      metric = keras.metrics.Mean(name="probe_mean")
      scale = keras.Variable(2.5, name="probe_scale")
    metric.update_state([1.0, 2.0])
    return repr(optimizer.iterations), repr(scale), repr(metric.variables[0])

  ours = reprs(_strategy(tfd, 2))
  assert ours == ("<Variable path=probe_adam/iteration, shape=(), dtype=int64, value=0>",
                  "<Variable path=probe_scale, shape=(), dtype=float32, value=2.5>",
                  "<Variable path=probe_mean/total, shape=(), dtype=float32, value=3.0>")
  theirs = reprs(_strategy(tf.distribute, 2))
  # TF 2.21 cannot make an on-read scalar (a metric's total) a numpy array,
  # so Keras prints it without its value; ours prints it as without a strategy.
  assert theirs[:2] == ours[:2]
  assert theirs[2] == "<Variable path=probe_mean/total, shape=(), dtype=float32>"
  assert reprs(tf.distribute.get_strategy())[2] == ours[2]


def test_operators():
  """Arithmetic, matmul, indexing and comparisons act on the value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    return _numpy([v + 1.0, 1.0 + v, v * 2.0, 2.0 - v, v / 2.0, v ** 2,
                   v @ v, tf.matmul(v, v), v[0], v[:, 1], v[1, 0], -v,
                   abs(-v), v > 2.0, v <= 2.0, v == 2.0, v != 2.0])

  assert compare(snippet) == [
      [[2.0, 3.0], [4.0, 5.0]], [[2.0, 3.0], [4.0, 5.0]],
      [[2.0, 4.0], [6.0, 8.0]], [[1.0, 0.0], [-1.0, -2.0]],
      [[0.5, 1.0], [1.5, 2.0]], [[1.0, 4.0], [9.0, 16.0]],
      [[7.0, 10.0], [15.0, 22.0]], [[7.0, 10.0], [15.0, 22.0]],
      [1.0, 2.0], [2.0, 4.0], 3.0, [[-1.0, -2.0], [-3.0, -4.0]],
      [[1.0, 2.0], [3.0, 4.0]], [[False, False], [True, True]],
      [[True, True], [False, False]], [[False, True], [False, False]],
      [[True, False], [True, True]]]


def test_read_methods():
  """numpy(), read_value() and value() give the value as eager tensors."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
    return (_numpy(v.numpy()), type(v.numpy()).__name__,
            _numpy(v.read_value()), type(v.read_value()).__name__,
            _numpy(v.value()), type(v.value()).__name__)

  assert compare(snippet) == ([1.0, 2.0], "ndarray", [1.0, 2.0], "EagerTensor",
                              [1.0, 2.0], "EagerTensor")


def test_properties():
  """shape, dtype, name, device and the rest are the variable's own."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([[1, 2, 3]], name="props", aggregation=AGG.SUM)
      frozen = tf.Variable(1.0, trainable=False)
    return (tuple(v.shape), tuple(v.get_shape()), v.dtype, v.name, v.device,
            v.trainable, v.aggregation, v.distribute_strategy is strategy,
            frozen.trainable, [c.trainable for c in frozen.values],
            bool(v.is_initialized()))

  assert compare(snippet) == (
      (1, 3), (1, 3), tf.int32, "props:0", DEVICES[0], True, AGG.SUM, True,
      False, [False] * NUM_DEVICES, True)


def test_aggregation_is_kept_as_given():
  """The aggregation is the enum given, a TF 1.x one included (the default
  is TF 1.x's NONE, as for any tf.Variable), and the components carry it;
  `is_initialized` is a boolean tensor, as in TensorFlow."""
  v1 = tf.compat.v1.VariableAggregation

  def snippet(dist, strategy):
    with strategy.scope():
      variables = [
          tf.Variable(1.0), tf.Variable(1.0, aggregation=AGG.SUM),
          tf.Variable(1.0, aggregation=v1.MEAN),
          tf.Variable(1.0, synchronization=SYNC.ON_READ,
                      aggregation=v1.ONLY_FIRST_TOWER)]
    return ([(repr(v.aggregation), repr(v.values[-1].aggregation))
             for v in variables],
            [repr(v.is_initialized()) for v in variables[:1]])

  assert compare(snippet)[0] == [
      ("<VariableAggregation.NONE: 0>",) * 2,
      ("<VariableAggregationV2.SUM: 1>",) * 2,
      ("<VariableAggregation.MEAN: 2>",) * 2,
      ("<VariableAggregation.ONLY_FIRST_REPLICA: 3>",) * 2]


def test_unhashable_but_ref_works():
  """Like tf.Variable: hashing raises TypeError, `ref()` is the key."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    try:
      hash(v)
      hashed = "hashed"
    except TypeError as e:
      hashed = str(e).split(".")[0]
    return hashed, {v.ref(): 7}[v.ref()], v.ref().deref() is v

  assert compare(snippet) == ("Variable is unhashable", 7, True)


def test_capture_in_function_traces_once_and_sees_updates():
  """A function capturing the variable reads its latest value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(2.0)
    double = tf.function(lambda: v * 2.0)
    first = double()
    v.assign(5.0)
    second = double()
    return _numpy([first, second]), double.experimental_get_tracing_count()

  assert compare(snippet) == ([4.0, 10.0], 1)


def test_variable_as_function_argument():
  """A distributed variable passed to a tf.function is read each call."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(2.0)
    double = tf.function(lambda var: var * 2.0)
    first = double(v)
    v.assign(5.0)
    return _numpy([first, double(v)]), double.experimental_get_tracing_count()

  assert compare(snippet) == ([4.0, 10.0], 1)


def test_distinct_variables_as_function_arguments():
  """Two variables of one shape passed in turn each give their own value."""
  # Not compared: TF 2.21 reuses the first variable's trace and returns 10.0
  # for `w` as well.
  strategy = _strategy(tfd, NUM_DEVICES)
  with strategy.scope():
    v = tf.Variable(5.0)
    w = tf.Variable(2.0)
  double = tf.function(lambda var: var * 2.0)
  assert double(v).numpy() == 10.0
  assert double(w).numpy() == 4.0
  assert double(v).numpy() == 10.0


def test_gradient_in_cross_replica_context():
  """GradientTape differentiates through the variable outside `run`."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 3.0])
      frozen = tf.Variable(1.0, trainable=False)
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(v * v) + frozen
    grads = tape.gradient(y, [v, frozen])
    with tf.GradientTape() as tape:
      y = tf.function(lambda: tf.reduce_sum(v * v * v))()
    through_function = tape.gradient(y, v)
    return (type(grads[0]).__name__, _numpy(grads[0]), grads[1],
            _numpy(through_function))

  assert compare(snippet) == ("EagerTensor", [2.0, 6.0], None, [3.0, 27.0])


def test_tape_watch_of_non_trainable_variable():
  """`tape.watch` makes a non-trainable mirrored variable differentiable."""
  def snippet(dist, strategy):
    with strategy.scope():
      frozen = tf.Variable(2.0, trainable=False)
    with tf.GradientTape() as tape:
      tape.watch(frozen)
      y = frozen * frozen * 3.0
    return _numpy(tape.gradient(y, frozen))

  assert compare(snippet) == 12.0


def test_gradients_inside_run(run_mode):
  """Inside `run` each replica gets the gradient of its own loss."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    def step():
      with tf.GradientTape() as tape:
        y = tf.reduce_sum(v * (_replica_id(dist) + 1.0))
      return tape.gradient(y, v)

    grads = run_mode(lambda: strategy.run(step))
    return type(grads).__name__, _numpy(strategy.experimental_local_results(grads))

  kind, grads = compare(snippet)
  assert kind == "PerReplica"
  assert grads == tuple([[i + 1.0] * 2] * 2 for i in range(NUM_DEVICES))


def test_variable_created_inside_run():
  """A variable created inside `run` is one MirroredVariable for all replicas."""
  def snippet(dist, strategy):
    with strategy.scope():
      result = strategy.run(
          lambda: tf.Variable(lambda: tf.random.normal([3]), name="in_run"))
    components = _components(result)
    return (type(result).__name__, [c.name for c in result.values],
            all(c == components[0] for c in components))

  assert compare(snippet) == (
      "MirroredVariable", _component_names("in_run", NUM_DEVICES), True)


def test_scatter_update_in_cross_replica_context():
  """`scatter_update` outside `run` reaches every component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0, 3.0])
    result = v.scatter_update(tf.IndexedSlices(tf.constant([9.0]),
                                               tf.constant([1])))
    return type(result).__name__, _numpy(result.values), _components(v)

  assert compare(snippet) == ("Mirrored", ([1.0, 9.0, 3.0],) * NUM_DEVICES,
                              [[1.0, 9.0, 3.0]] * NUM_DEVICES)


@pytest.mark.parametrize("synchronization", [SYNC.ON_WRITE, SYNC.ON_READ])
@pytest.mark.parametrize("aggregation", ALL_AGGREGATIONS)
@pytest.mark.parametrize("where", ["cross_replica", "replica", "function_replica"])
def test_scatter_methods_in_every_context_and_aggregation_like_tf(
    synchronization, aggregation, where):
  """Each scatter method on each kind of variable: TF's values, or TF's
  NotImplementedError (scatter_min/max/update of a SUM or MEAN mirrored
  variable; batch_scatter_update of any distributed variable). In a
  replica, the replicas' slices of a SUM or MEAN variable are combined
  (concatenated, divided for MEAN) and applied once."""
  def snippet(dist, strategy):
    outcomes = {}
    for method in ("scatter_add", "scatter_sub", "scatter_mul", "scatter_div",
                   "scatter_min", "scatter_max", "scatter_update", "batch_scatter_update"):
      with strategy.scope():
        v = tf.Variable([1.0, 2.0], synchronization=synchronization, aggregation=aggregation)
      update = lambda v=v, method=method: getattr(v, method)(
          tf.IndexedSlices(tf.constant([5.0]), tf.constant([0])))
      try:
        if where == "cross_replica":
          update()
        elif where == "replica":
          strategy.run(update)
        else:
          tf.function(lambda update=update: strategy.run(update))()
        outcomes[method] = _components(v)
      except (NotImplementedError, ValueError) as e:
        outcomes[method] = type(e).__name__
    return outcomes

  outcomes = compare(snippet, num_devices=2)
  assert outcomes["batch_scatter_update"] in ("NotImplementedError", "ValueError")
  if synchronization == SYNC.ON_WRITE and aggregation in (AGG.SUM, AGG.MEAN):
    assert outcomes["scatter_update"] == "NotImplementedError"
    if where != "cross_replica":
      assert outcomes["scatter_add"] == [[11.0, 2.0] if aggregation == AGG.SUM else [6.0, 2.0]] * 2


def test_new_variable_from_distributed_initial_value():
  """A variable initialised from a mirrored variable copies its value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
      v.assign([3.0, 4.0])
      copy = tf.Variable(v)
    return type(copy).__name__, _components(copy)

  assert compare(snippet) == ("MirroredVariable", [[3.0, 4.0]] * NUM_DEVICES)


# --- Updates in the cross-replica context.


@pytest.mark.parametrize("method, expected", [
    ("assign", 5.0), ("assign_add", 7.0), ("assign_sub", -3.0)])
def test_cross_replica_update_updates_every_component(method, expected):
  """An update outside `run` applies to every component, returns a Mirrored."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(2.0)
    result = getattr(v, method)(5.0)
    return type(result).__name__, repr(result), _components(v), _numpy(v.numpy())

  kind, rep, components, value = compare(snippet)
  assert kind == "Mirrored"
  assert rep == _expected_repr(
      "Mirrored", [f"<tf.Tensor: shape=(), dtype=float32, numpy={expected}>"]
      * NUM_DEVICES)
  assert components == [expected] * NUM_DEVICES and value == expected


@pytest.mark.parametrize("method", ["assign", "assign_add", "assign_sub"])
def test_cross_replica_update_without_read_value_returns_none(method):
  """read_value=False returns None and still updates every component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(2.0)
    return getattr(v, method)(1.0, read_value=False), _components(v)

  expected = {"assign": 1.0, "assign_add": 3.0, "assign_sub": 1.0}[method]
  assert compare(snippet) == (None, [expected] * NUM_DEVICES)


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_cross_replica_updates_in_function(num_devices):
  """Updates in a tf.function outside `run` reach every component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 1.0])

    @tf.function
    def update():
      v.assign([2.0, 3.0])
      v.assign_add([1.0, 1.0])
      return tf.convert_to_tensor(v.assign_sub([0.5, 0.5]))

    result = update()
    return _numpy(result), _components(v)

  assert compare(snippet, num_devices) == (
      [2.5, 3.5], [[2.5, 3.5]] * num_devices)


def test_cross_replica_update_returned_from_function_is_a_tensor():
  """An update's Mirrored result returned by a tf.function is one tensor."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    result = tf.function(lambda: v.assign(7.0))()
    return type(result).__name__, _numpy(result), _components(v)

  assert compare(snippet) == ("EagerTensor", 7.0, [7.0] * NUM_DEVICES)


# --- Updates inside strategy.run, by aggregation.


def _expected_replica_updates(aggregation, n):
  """Component values after assign_add(id+1), assign(10*id), assign_sub(id)."""
  ids = list(range(n))
  if aggregation == AGG.NONE:
    return ([1.0 + i + 1.0 for i in ids], [10.0 * i for i in ids],
            [9.0 * i for i in ids])
  combine = {AGG.SUM: sum, AGG.MEAN: lambda xs: sum(xs) / n,
             AGG.ONLY_FIRST_REPLICA: lambda xs: xs[0]}[aggregation]
  added = 1.0 + combine([i + 1.0 for i in ids])
  assigned = combine([10.0 * i for i in ids])
  subtracted = assigned - combine([float(i) for i in ids])
  return [added] * n, [assigned] * n, [subtracted] * n


@pytest.mark.parametrize("aggregation", ALL_AGGREGATIONS)
def test_replica_updates_by_aggregation(aggregation, run_mode):
  """SUM/MEAN/ONLY_FIRST_REPLICA aggregate across replicas; NONE does not."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=aggregation)

    def add():
      return v.assign_add(_replica_id(dist) + 1.0)

    def assign():
      return v.assign(_replica_id(dist) * 10.0)

    def subtract():
      v.assign_sub(_replica_id(dist), read_value=False)

    def run(step):
      result = run_mode(lambda: strategy.run(step))
      if result is None:
        return None, None, _components(v)
      return (type(result).__name__,
              _numpy(strategy.experimental_local_results(result)),
              _components(v))

    kind, added, after_add = run(add)
    _, assigned, after_assign = run(assign)
    _, subtracted, after_subtract = run(subtract)
    return (kind, added, after_add, assigned, after_assign, subtracted,
            after_subtract)

  (kind, added, after_add, assigned, after_assign, subtracted,
   after_subtract) = compare(snippet)
  expected_add, expected_assign, expected_subtract = _expected_replica_updates(
      aggregation, NUM_DEVICES)
  assert kind == "PerReplica"
  assert after_add == expected_add and list(added) == expected_add
  assert after_assign == expected_assign and list(assigned) == expected_assign
  assert subtracted is None and after_subtract == expected_subtract


@pytest.mark.parametrize("aggregation", [AGG.SUM, AGG.MEAN, AGG.NONE])
def test_replica_updates_on_two_devices(aggregation):
  """The same aggregation rules hold for a 2-device strategy."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=aggregation)

    @tf.function
    def step():
      return strategy.run(lambda: v.assign_add(_replica_id(dist) + 1.0))

    step()
    return _components(v)

  expected = {AGG.SUM: [4.0, 4.0], AGG.MEAN: [2.5, 2.5], AGG.NONE: [2.0, 3.0]}
  assert compare(snippet, num_devices=2) == expected[aggregation]


def test_only_first_replica_takes_replica_zero_value():
  """ONLY_FIRST_REPLICA assigns replica 0's value to every component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([0.0], aggregation=AGG.ONLY_FIRST_REPLICA)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([ctx.replica_id_in_sync_group + 5.0]))
    strategy.run(lambda x: v.assign(x), args=(values,))
    return _components(v)

  assert compare(snippet) == [[5.0]] * NUM_DEVICES


def test_none_aggregation_assigns_each_replicas_value_in_function():
  """With NONE each replica writes its own component, also in a function."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(0.0)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group * 2.0))
    tf.function(lambda x: strategy.run(lambda y: v.assign(y), args=(x,)))(values)
    return _components(v), _numpy(v.numpy())

  assert compare(snippet) == ([2.0 * i for i in range(NUM_DEVICES)], 0.0)


def test_mean_replica_assign_of_python_value():
  """MEAN of the same Python value on every replica is that value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=AGG.MEAN)
    strategy.run(lambda: v.assign(5.0))
    return _components(v)

  assert compare(snippet) == [5.0] * NUM_DEVICES


def test_sum_replica_assign_of_tensor():
  """SUM of the same tensor on every replica is its multiple."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=AGG.SUM)
    strategy.run(lambda: v.assign(tf.constant(5.0)))
    return _components(v)

  assert compare(snippet) == [5.0 * NUM_DEVICES] * NUM_DEVICES


# --- strategy.extended.update.


def test_extended_update_group_true_and_false():
  """group=True gives a Mirrored; group=False a tuple per component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    grouped = strategy.extended.update(
        v, lambda c, a, b: c.assign(a * b), args=(2.0,), kwargs={"b": 3.0})
    grouped_values = _numpy(grouped.values)
    ungrouped = strategy.extended.update(
        v, lambda c, x: c.assign_add(x), args=(1.0,), group=False)
    ungrouped_values = [float(x.numpy()) for x in ungrouped]
    no_read = strategy.extended.update(
        v, lambda c: c.assign_add(1.0, read_value=False))
    return (type(grouped).__name__, grouped_values, type(ungrouped).__name__,
            len(ungrouped), ungrouped_values, no_read, _components(v))

  assert compare(snippet) == (
      "Mirrored", (6.0,) * NUM_DEVICES, "tuple", NUM_DEVICES,
      [7.0] * NUM_DEVICES, None, [8.0] * NUM_DEVICES)


def test_extended_update_with_per_replica_argument():
  """A PerReplica argument gives each component its own value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(0.0)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group)))
    result = strategy.extended.update(v, lambda c, x: c.assign(x), args=(values,))
    return type(result).__name__, _numpy(result.values), _components(v)

  expected = [float(i) for i in range(NUM_DEVICES)]
  assert compare(snippet) == ("Mirrored", tuple(expected), expected)


def test_extended_update_in_function():
  """`extended.update` inside a tf.function updates every component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)

    @tf.function
    def update():
      ungrouped = strategy.extended.update(
          v, lambda c: c.assign_add(1.0), group=False)
      return [tf.convert_to_tensor(x) for x in ungrouped]

    return _numpy(update()), _components(v)

  assert compare(snippet) == ([2.0] * NUM_DEVICES, [2.0] * NUM_DEVICES)


def test_extended_update_in_replica_context():
  """Called inside `run`, update gathers every replica's argument."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)

    def step():
      return strategy.extended.update(
          v, lambda c, x: c.assign_add(x), args=(_replica_id(dist),))

    result = strategy.run(step)
    return (type(result).__name__,
            _numpy(strategy.experimental_local_results(result)), _components(v))

  expected = [1.0 + i for i in range(NUM_DEVICES)]
  assert compare(snippet) == ("PerReplica", tuple(expected), expected)


# --- ON_READ variables.


@pytest.mark.parametrize("aggregation", ALL_AGGREGATIONS)
def test_on_read_replica_updates_own_component(aggregation, run_mode):
  """Inside `run` each replica updates and reads its own component."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)

    def step():
      v.assign_add(_replica_id(dist) + 1.0)
      return v.read_value()

    result = run_mode(lambda: strategy.run(step))
    return _numpy(strategy.experimental_local_results(result)), _components(v)

  expected = [2.0 + i for i in range(NUM_DEVICES)]
  assert compare(snippet) == (tuple(expected), expected)


@pytest.mark.parametrize("aggregation, expected", [
    (AGG.SUM, 5.0), (AGG.MEAN, 2.5), (AGG.ONLY_FIRST_REPLICA, 2.0)])
def test_on_read_on_two_devices(aggregation, expected):
  """A 2-device ON_READ variable updates per replica and aggregates on read."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    tf.function(lambda: strategy.run(
        lambda: v.assign_add(_replica_id(dist) + 1.0)))()
    return _components(v), _numpy(v.read_value())

  assert compare(snippet, num_devices=2) == ([2.0, 3.0], expected)


@pytest.mark.parametrize("aggregation, expected", [
    (AGG.SUM, 14.0), (AGG.MEAN, 3.5), (AGG.ONLY_FIRST_REPLICA, 2.0)])
def test_on_read_cross_replica_read_aggregates(aggregation, expected):
  """Reading outside `run` combines the components by the aggregation."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    strategy.run(lambda: v.assign_add(_replica_id(dist) + 1.0))
    reads = [v.numpy(), v.read_value(), tf.convert_to_tensor(v), v.value(),
             tf.function(lambda: v.read_value())(), v * 1.0]
    with strategy.scope():
      reads.append(v.read_value())
    return _numpy(reads)

  assert compare(snippet) == [expected] * 7


def test_on_read_none_aggregation_cannot_be_read_cross_replica():
  """With aggregation NONE a cross-replica read raises ValueError."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ)
    return v.read_value()

  assert compare(snippet) == Raised(ValueError(""))


@pytest.mark.parametrize("aggregation, component", [
    (AGG.SUM, 8.0 / NUM_DEVICES), (AGG.MEAN, 8.0), (AGG.ONLY_FIRST_REPLICA, 8.0)])
def test_on_read_cross_replica_assign(aggregation, component):
  """A cross-replica assign sets the aggregate: SUM divides among components."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    result = v.assign(8.0, read_value=False)
    return result, _components(v), _numpy(v.numpy())

  assert compare(snippet) == (None, [component] * NUM_DEVICES, 8.0)


@pytest.mark.parametrize("aggregation", [
    AGG.SUM, AGG.MEAN, AGG.ONLY_FIRST_REPLICA])
def test_on_read_cross_replica_assign_returns_aggregated_value(aggregation):
  """The value a cross-replica assign returns is the new aggregated value."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    result = v.assign(8.0)
    return type(result).__name__, _numpy(tf.convert_to_tensor(result))

  assert compare(snippet) == ("EagerTensor", 8.0)


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_on_read_sum_cross_replica_add_raises(method):
  """assign_add/assign_sub of a SUM variable outside `run` raise ValueError."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=AGG.SUM)
    try:
      getattr(v, method)(1.0)
    except ValueError as e:
      return str(e), _components(v)
    return "no error", _components(v)

  message, components = compare(snippet)
  assert message == (
      f"SyncOnReadVariable does not support `{method}` in cross-replica "
      f"context when aggregation is set to `tf.VariableAggregation.SUM`.")
  assert components == [1.0] * NUM_DEVICES


@pytest.mark.parametrize("aggregation", [AGG.MEAN, AGG.ONLY_FIRST_REPLICA])
def test_on_read_cross_replica_add_updates_every_component(aggregation):
  """For MEAN and ONLY_FIRST_REPLICA cross-replica adds reach every copy."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    v.assign_add(2.0, read_value=False)
    after_add = _components(v)
    v.assign_sub(0.5, read_value=False)
    return after_add, _components(v), _numpy(v.numpy())

  assert compare(snippet) == ([3.0] * NUM_DEVICES, [2.5] * NUM_DEVICES, 2.5)


def test_cross_replica_assignments_group_into_one_op():
  """`tf.group` takes what a cross-replica `assign` returns, as tf_keras's
  loss scaling does with `tf.group(var.assign(...), counter.assign(0))`."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)

    @tf.function(autograph=False)
    def step():
      return tf.group(v.assign(2.0), v.assign_add(1.0)) is not None
    with strategy.scope():
      grouped = step()
    return bool(grouped), _components(v)
  assert compare(snippet, 2) == (True, [3.0, 3.0])


# --- Checkpoints.


@pytest.mark.parametrize("num_devices", [2, NUM_DEVICES])
def test_checkpoint_between_mirrored_and_plain_variables(num_devices, tmp_path):
  """Checkpoints move between mirrored and plain variables both ways."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    with strategy.scope():
      mirrored = tf.Variable([1.0, 2.0])
    saved = tf.train.Checkpoint(v=mirrored).save(str(directory / "mirrored"))
    plain = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(v=plain).restore(saved).assert_consumed()
    plain_saved = tf.train.Checkpoint(v=tf.Variable([5.0, 6.0])).save(
        str(directory / "plain"))
    tf.train.Checkpoint(v=mirrored).restore(plain_saved).assert_consumed()
    return _numpy(plain), _components(mirrored)

  assert compare(snippet, num_devices) == (
      [1.0, 2.0], [[5.0, 6.0]] * num_devices)


@pytest.mark.parametrize("synchronization, aggregation", [
    (SYNC.ON_WRITE, AGG.NONE), (SYNC.ON_READ, AGG.SUM)])
def test_asynchronous_checkpoints_save_the_value_at_save_time(
    synchronization, aggregation, tmp_path):
  """An asynchronous save copies the variable to the host first: later
  assignments do not reach the checkpoint, as for a plain variable."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=synchronization, aggregation=aggregation)
    checkpoint = tf.train.Checkpoint(v=v)
    asynchronous = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    first = checkpoint.save(str(directory / "ckpt"), options=asynchronous)
    with strategy.scope():
      v.assign(5.0)
    second = checkpoint.save(str(directory / "ckpt"), options=asynchronous)
    checkpoint.sync()
    restored = []
    for path in (first, second):
      checkpoint.restore(path).assert_consumed()
      restored.append(_components(v))
    return restored
  # A SUM variable stores its total (2.0, then 5.0) and restores half of it
  # into each of its two components.
  second = 5.0 if synchronization == SYNC.ON_WRITE else 2.5
  assert compare(snippet, 2) == [[1.0, 1.0], [second, second]]


def test_checkpoint_mirrored_to_mirrored_across_sizes(tmp_path):
  """Restoring into mirrored variables sets every component."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    small = _strategy(dist, 2)
    with strategy.scope():
      big = tf.Variable([1.0, 2.0])
    saved = tf.train.Checkpoint(v=big).save(str(directory / "big"))
    with small.scope():
      target = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(v=target).restore(saved).assert_consumed()
    with strategy.scope():
      same_size = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(v=same_size).restore(saved).assert_consumed()
    with small.scope():
      source = tf.Variable([7.0, 8.0])
    small_saved = tf.train.Checkpoint(v=source).save(str(directory / "small"))
    tf.train.Checkpoint(v=big).restore(small_saved).assert_consumed()
    return _components(target), _components(same_size), _components(big)

  assert compare(snippet) == (
      [[1.0, 2.0]] * 2, [[1.0, 2.0]] * NUM_DEVICES, [[7.0, 8.0]] * NUM_DEVICES)


def test_checkpoint_keys_match_a_plain_variable(tmp_path):
  """A mirrored variable is saved under the key a plain one would use."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    with strategy.scope():
      v = tf.Variable([[1.0, 2.0, 3.0]])
    saved = tf.train.Checkpoint(layer=tf.Module(), v=v).save(str(directory / "c"))
    return (tf.train.list_variables(saved),
            _numpy(tf.train.load_checkpoint(saved).get_tensor(
                "v/.ATTRIBUTES/VARIABLE_VALUE")))

  names, value = compare(snippet)
  assert ("v/.ATTRIBUTES/VARIABLE_VALUE", [1, 3]) in names
  assert value == [[1.0, 2.0, 3.0]]


@pytest.mark.parametrize("aggregation, saved_value, component", [
    (AGG.SUM, 14.0, 14.0 / NUM_DEVICES), (AGG.MEAN, 3.5, 3.5)])
def test_checkpoint_of_sync_on_read_variable(aggregation, saved_value,
                                             component, tmp_path):
  """An ON_READ variable saves its aggregate and restores to it."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=aggregation)
    strategy.run(lambda: v.assign_add(_replica_id(dist) + 1.0))
    saved = tf.train.Checkpoint(v=v).save(str(directory / "c"))
    stored = tf.train.load_checkpoint(saved).get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE")
    plain = tf.Variable(0.0)
    tf.train.Checkpoint(v=plain).restore(saved).assert_consumed()
    with strategy.scope():
      target = tf.Variable(0.0, synchronization=SYNC.ON_READ,
                           aggregation=aggregation)
    tf.train.Checkpoint(v=target).restore(saved).assert_consumed()
    return (_numpy(stored), _numpy(plain), _components(target),
            _numpy(target.numpy()))

  assert compare(snippet) == (
      saved_value, saved_value, [component] * NUM_DEVICES, saved_value)


def test_deferred_restore_into_variable_created_in_scope(tmp_path):
  """A restore issued before the variable exists fills every component."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    source = tf.Module()
    source.v = tf.Variable([3.0, 4.0])
    saved = tf.train.Checkpoint(m=source).save(str(directory / "c"))
    target = tf.Module()
    status = tf.train.Checkpoint(m=target).restore(saved)
    with strategy.scope():
      target.v = tf.Variable([0.0, 0.0])
    status.assert_consumed()
    return _components(target.v)

  assert compare(snippet) == [[3.0, 4.0]] * NUM_DEVICES


def test_restore_of_wrong_shape_raises_and_changes_nothing(tmp_path):
  """Restoring a value of another shape raises ValueError."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    saved = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0, 3.0])).save(
        str(directory / "c"))
    with strategy.scope():
      v = tf.Variable([0.0, 0.0])
    try:
      tf.train.Checkpoint(v=v).restore(saved)
    except ValueError:
      return "ValueError", _components(v)
    return "restored", _components(v)

  assert compare(snippet) == ("ValueError", [[0.0, 0.0]] * NUM_DEVICES)


# --- SavedModel.


def _saved_module(dist, strategy, directory):
  """Saves a module with a mirrored, a sync-on-read variable and a function."""
  with strategy.scope():
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0], name="weights")
    module.total = tf.Variable(0.0, synchronization=SYNC.ON_READ,
                               aggregation=AGG.SUM)
    module.apply = tf.function(
        lambda x: module.v * x + module.total,
        input_signature=[tf.TensorSpec([], tf.float32)])
  strategy.run(lambda: module.total.assign_add(1.0))
  module.v.assign([2.0, 3.0])
  tf.saved_model.save(module, str(directory))
  return module


def test_saved_model_loads_without_strategy(tmp_path):
  """A SavedModel of mirrored variables loads as plain variables."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    module = _saved_module(dist, strategy, directory)
    before = module.apply(2.0)
    loaded = tf.saved_model.load(str(directory))
    result = loaded.apply(3.0)
    loaded.v.assign([0.0, 1.0])
    return (_numpy(before), _numpy(loaded.v.read_value()),
            isinstance(loaded.v, tf.distribute.DistributedValues),
            _numpy(loaded.total), _numpy(result), _numpy(loaded.apply(1.0)))

  assert compare(snippet) == (
      [8.0, 10.0], [0.0, 1.0], False, float(NUM_DEVICES),
      [10.0, 13.0], [4.0, 5.0])


def test_saved_model_loads_inside_scope(tmp_path):
  """Loaded inside a scope, the variables are distributed again."""
  def snippet(dist, strategy):
    directory = tmp_path / dist.__name__.split(".")[0]
    _saved_module(dist, strategy, directory)
    with strategy.scope():
      loaded = tf.saved_model.load(str(directory))
    per_replica = strategy.run(loaded.apply, args=(tf.constant(2.0),))
    return (type(loaded.v).__name__, _components(loaded.v),
            type(loaded.total).__name__, _numpy(loaded.total.numpy()),
            _numpy(loaded.apply(3.0)),
            _numpy(strategy.experimental_local_results(per_replica)))

  n = float(NUM_DEVICES)
  kind, components, total_kind, total, result, per_replica = compare(snippet)
  assert kind == "MirroredVariable" and total_kind == "SyncOnReadVariable"
  assert components == [[2.0, 3.0]] * NUM_DEVICES
  assert total == n
  # The loaded function reads the primary component of `total` (n / n).
  assert result == [7.0, 10.0]
  # Replica i reads its own share of `total` (n / n = 1.0).
  assert per_replica == tuple([5.0, 7.0] for _ in range(NUM_DEVICES))


_TRACED_ACROSS_REPLICAS = {
    "assign_mirrored": (SYNC.ON_WRITE, AGG.NONE, lambda v, x: v.assign(x)),
    "assign_on_read": (SYNC.ON_READ, AGG.SUM, lambda v, x: v.assign(x)),
    "read_on_read_sum": (SYNC.ON_READ, AGG.SUM, lambda v, x: v.read_value() + x),
}


@pytest.mark.parametrize("concrete", [True, False], ids=["concrete", "function"])
@pytest.mark.parametrize("use", sorted(_TRACED_ACROSS_REPLICAS))
def test_saving_a_function_traced_across_replicas(use, concrete, tmp_path):
  """A signature traced under the strategy before `tf.saved_model.save` that
  updates a distributed variable, or reads the sum of an on-read one, across
  replicas: saving it refuses with TF's ValueError. The `tf.function` itself
  saves: saving traces it again with single variables."""
  synchronization, aggregation, use_variable = _TRACED_ACROSS_REPLICAS[use]
  messages = {}

  def snippet(dist, strategy):
    directory = str(tmp_path / dist.__name__.split(".")[0])
    with strategy.scope():
      module = tf.Module()
      module.v = tf.Variable(2.0, synchronization=synchronization, aggregation=aggregation,
                             name="across")
      module.f = tf.function(lambda x: use_variable(module.v, x),
                             input_signature=[tf.TensorSpec([], tf.float32)])
      module.f(tf.constant(1.0))
    signature = module.f.get_concrete_function() if concrete else module.f
    try:
      tf.saved_model.save(module, directory, signatures=signature)
    except ValueError as e:
      messages[dist] = str(e)
      return "ValueError"
    loaded = tf.saved_model.load(directory)
    return _numpy(loaded.signatures["serving_default"](tf.constant(3.0)))

  if concrete:
    assert compare(snippet) == "ValueError"
    assert all("Unable to save function" in m for m in messages.values())
    assert "distributed variable 'across:0'" in messages[tfd]
  else:
    # An on-read SUM variable saves its sum: 2.0 on each replica.
    saved = 2.0 * NUM_DEVICES if use == "read_on_read_sum" else 0.0
    assert list(compare(snippet).values()) == [saved + 3.0]


def test_initializer_of_a_variable_loaded_in_a_tf1_graph(tmp_path):
  """In a TF1 graph, the variables a SavedModel loads in a scope are
  initialized by restoring their saved values, as in TF."""
  module = tf.Module()
  module.v = tf.Variable([1.0, 2.0])
  module.total = tf.Variable(3.0, synchronization=SYNC.ON_READ, aggregation=AGG.SUM)
  tf.saved_model.save(module, str(tmp_path))

  def snippet(dist, make_strategy):
    with tf.Graph().as_default():
      strategy = make_strategy()
      with strategy.scope():
        loaded = tf.saved_model.load(str(tmp_path))
      initializers = [loaded.v.initializer, loaded.total.initializer]
      with tf.compat.v1.Session() as session:
        session.run(initializers)
        return (type(loaded.v).__name__,
                _numpy(session.run(strategy.experimental_local_results(loaded.v))),
                float(session.run(loaded.total)))

  expected = oracle.compare(
      snippet, (tf.distribute, lambda: oracle.new_tf_mirrored(DEVICES[:2])),
      (tfd, lambda: tfd.MirroredStrategy(DEVICES[:2])))
  assert expected == ("MirroredVariable", ([1.0, 2.0], [1.0, 2.0]), 3.0)


def test_eval_in_a_tf1_session():
  """TF 1.x `eval()` reads the primary component: an on-read variable's is
  not aggregated, as in TensorFlow."""
  def snippet(dist, strategy):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      with strategy.scope():
        v = tf.Variable([10.0, 11.0])
        total = tf.Variable(1.0, synchronization=SYNC.ON_READ, aggregation=AGG.SUM)
      session.run([v.initializer, total.initializer])
      updates = strategy.run(lambda: total.assign_add(_replica_id(dist) + 1.0))
      session.run(strategy.experimental_local_results(updates))
      session.run(v.assign([1.0, 2.0]))
      return _numpy(v.eval()), _numpy(total.eval(session)), _numpy(session.run(total))

  assert compare(snippet, num_devices=2) == ([1.0, 2.0], 2.0, 5.0)


def _save_signature(v, directory, use, input_signature=False):
  """Saves `v` with a signature doing `use` to it: "saved" or the error."""
  uses = {
      "assign": lambda: v.assign(tf.constant([2.0, 2.0])),
      "assign_add": lambda: v.assign_add(tf.constant([2.0, 2.0])),
      "scatter_update": lambda: v.scatter_update(
          tf.IndexedSlices(tf.constant([5.0]), tf.constant([0]))),
      "read": lambda: tf.convert_to_tensor(v),
  }
  if input_signature:
    signature = tf.function(uses[use], input_signature=[])
  else:
    signature = tf.function(uses[use]).get_concrete_function()
  try:
    tf.saved_model.save(v, str(directory), signatures=signature)
  except ValueError as e:
    return "ValueError", "f_with_input_signature" in str(e)
  return "saved", None


@pytest.mark.parametrize("synchronization, aggregation, use, expected", [
    (SYNC.ON_WRITE, AGG.MEAN, "assign", "ValueError"),
    (SYNC.ON_WRITE, AGG.NONE, "assign_add", "ValueError"),
    (SYNC.ON_WRITE, AGG.ONLY_FIRST_REPLICA, "scatter_update", "ValueError"),
    (SYNC.ON_READ, AGG.MEAN, "assign", "ValueError"),
    (SYNC.ON_READ, AGG.SUM, "read", "ValueError"),
    (SYNC.ON_READ, AGG.MEAN, "read", "saved"),
    (SYNC.ON_READ, AGG.ONLY_FIRST_REPLICA, "read", "saved"),
    (SYNC.ON_WRITE, AGG.SUM, "read", "saved"),
])
def test_saved_model_refuses_concrete_functions_that_update_or_aggregate(
    synchronization, aggregation, use, expected, tmp_path):
  """A concrete function traced before saving that updates a distributed
  variable across replicas, or reads a SUM on-read one, holds every
  replica's copy: `tf.saved_model.save` refuses it with a ValueError that
  says to give the tf.function with an input signature, which then saves."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 1.0], synchronization=synchronization,
                      aggregation=aggregation)
    directory = tmp_path / dist.__name__.split(".")[0]
    return (_save_signature(v, directory / "concrete", use),
            _save_signature(v, directory / "function", use, input_signature=True),
            _components(v))

  concrete, function, _ = compare(snippet)
  assert concrete[0] == expected and concrete[1] in (True, None)
  assert function == ("saved", None)


def test_saved_model_refuses_an_update_traced_in_a_tf1_graph(tmp_path):
  """In a TF 1.x graph too the refusal comes at save time (tfd used to save
  and then fail for want of a default session)."""
  def snippet(dist, strategy):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      with strategy.scope():
        v = tf.Variable([1.0, 1.0])
      session.run(v.initializer)
      return _save_signature(v, tmp_path / dist.__name__.split(".")[0], "assign")

  assert compare(snippet, num_devices=2) == ("ValueError", True)


def test_initializer_while_saving_is_the_primarys(tmp_path):
  """A signature traced by `tf.saved_model.save` sees the variable it stands
  for: its initializer is the primary component's (None eagerly)."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    seen = []
    module = tf.Module()
    module.v = v
    module.f = tf.function(
        lambda: seen.append(v.initializer is v.values[0].initializer) or v + 1.0,
        input_signature=[])
    tf.saved_model.save(module, str(tmp_path / dist.__name__.split(".")[0]))
    return seen

  assert compare(snippet)[0] is True


def test_saved_model_loaded_into_a_tf1_graph_in_scope_initializes(tmp_path):
  """`tf.saved_model.load` under `scope()` in a TF 1.x graph: running the
  variables' initializers restores the saved value into every component."""
  def snippet(dist, strategy):
    directory = str(tmp_path / dist.__name__.split(".")[0])
    with strategy.scope():
      module = tf.Module()
      module.v = tf.Variable(3.0)
      module.total = tf.Variable(4.0, synchronization=SYNC.ON_READ,
                                 aggregation=AGG.MEAN)
    tf.saved_model.save(module, directory)
    with tf.Graph().as_default():
      with strategy.scope():
        loaded = tf.saved_model.load(directory)
      initializers = [v.initializer for v in (loaded.v, loaded.total)]
      with tf.compat.v1.Session() as session:
        session.run(initializers)
        return (session.run([loaded.v.read_value(), loaded.total.read_value()]),
                session.run(list(loaded.v.values) + list(loaded.total.values)))

  values, components = compare(snippet, num_devices=2)
  assert values == [3.0, 4.0] and components == [3.0, 3.0, 4.0, 4.0]


# --- Bad input.


def _attempt(update):
  """Runs `update`; the class of what it raised, or "no error"."""
  try:
    update()
  except Exception as e:  # pylint: disable=broad-except
    return type(e), str(e)
  return "no error", ""


@pytest.mark.parametrize("context", ["cross_replica", "function", "replica"])
def test_assign_of_wrong_shape_raises_and_changes_nothing(context):
  """A value of the wrong shape raises ValueError naming the variable."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], name="bad_shape")
    update = lambda: v.assign([1.0, 2.0, 3.0])
    if context == "function":
      update = tf.function(update)
    elif context == "replica":
      update = functools.partial(strategy.run, update)
    error, message = _attempt(update)
    return error, "bad_shape" in message, _components(v)

  assert compare(snippet) == (ValueError, True, [[1.0, 2.0]] * NUM_DEVICES)


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_add_of_wrong_shape_raises_and_changes_nothing(method):
  """A delta of the wrong shape raises and leaves every component alone."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], name="bad_delta")
    error, _ = _attempt(lambda: getattr(v, method)([1.0, 2.0, 3.0]))
    return error in (ValueError, tf.errors.InvalidArgumentError), _components(v)

  assert compare(snippet) == (True, [[1.0, 2.0]] * NUM_DEVICES)


@pytest.mark.parametrize("value", [
    tf.constant([1, 2]), tf.constant([1.0, 2.0], tf.float64)],
                         ids=["int32", "float64"])
def test_assign_of_wrong_dtype_tensor_raises_value_error(value):
  """A tensor of another dtype raises ValueError and changes nothing."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], name="bad_dtype")
    error, _ = _attempt(lambda: v.assign(value))
    return error, _components(v)

  assert compare(snippet) == (ValueError, [[1.0, 2.0]] * NUM_DEVICES)
  strategy = _strategy(tfd, NUM_DEVICES)
  with strategy.scope():
    v = tf.Variable([1.0, 2.0], name="bad_dtype")
  with pytest.raises(ValueError, match="bad_dtype"):
    v.assign(value)


@pytest.mark.parametrize("dtype, value", [
    (tf.int32, 1.5), (tf.float32, "abc")], ids=["float_to_int", "str_to_float"])
def test_assign_of_unconvertible_python_value_raises_type_error(dtype, value):
  """A Python value that cannot become the dtype raises TypeError, as in TF."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(tf.constant(3, dtype), name="strict")
    error, _ = _attempt(lambda: v.assign(value))
    return error, _components(v)

  expected = 3 if dtype == tf.int32 else 3.0
  assert compare(snippet) == (TypeError, [expected] * NUM_DEVICES)


@pytest.mark.parametrize("method", ["assign", "assign_add"])
def test_sum_replica_update_of_shared_python_value_raises(method, run_mode):
  """SUM of one Python value shared by every replica is ambiguous: ValueError."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=AGG.SUM, name="summed")
    error, _ = _attempt(
        lambda: run_mode(lambda: strategy.run(lambda: getattr(v, method)(5.0))))
    return error, _components(v)

  assert compare(snippet) == (ValueError, [1.0] * NUM_DEVICES)


@pytest.mark.parametrize("synchronization", [SYNC.ON_WRITE, SYNC.ON_READ])
def test_device_is_the_current_replicas_component(synchronization):
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0, synchronization=synchronization,
                      aggregation=AGG.SUM)
    in_run = strategy.experimental_local_results(
        strategy.run(lambda: tf.constant(v.device)))
    with tf.device("CPU:1"):
      outside = v.device
    with strategy.scope(), tf.device("CPU:1"):
      cross_replica = v.device
    return [t.numpy().decode() for t in in_run], outside, cross_replica, v.device
  in_run, outside, cross_replica, plain = compare(snippet)
  assert in_run == list(DEVICES)
  assert (outside, cross_replica, plain) == (DEVICES[0], DEVICES[1], DEVICES[0])


# --- A variable used by another strategy than its own.

def _other_strategy_step(api, make_optimizer, build=False, trained=False):
  """Variable and optimizer made in one strategy's scope (the optimizer
  built, or trained one step there), applied in a replica of another."""
  with api.pair.scope():
    v = tf.Variable(1.0)
    optimizer = make_optimizer()
    if build:
      optimizer.build([v])
  def step():
    return optimizer.apply_gradients([(tf.constant(1.0), v)])
  if trained:
    api.pair.run(step)
  return api.one_device("CPU:1").run(step)


def _tf_keras():
  import tf_keras  # pylint: disable=import-outside-toplevel
  return tf_keras


_NOT_ITS_STRATEGY = ["was created in the scope of", "used in a replica of another strategy",
                     "create the model, its variables and its optimizer in the scope"]


@pytest.mark.parametrize("snippet, theirs, ours, fragments", [
    # The clients' own checks of the variable's strategy speak, as in TF.
    (lambda a: _other_strategy_step(a, lambda: _tf_keras().optimizers.legacy.Adam(0.1)),
     ValueError, ValueError, ["Trying to create optimizer slot variable under the scope"]),
    # TF reads the other strategy's replica's component of the learning rate.
    (lambda a: _other_strategy_step(a, lambda: _tf_keras().optimizers.legacy.Adam(0.1),
                                    trained=True),
     ValueError, ValueError, ["'Adam/learning_rate'"] + _NOT_ITS_STRATEGY),
    (lambda a: _other_strategy_step(a, lambda: _tf_keras().optimizers.Adam(0.1), trained=True),
     TypeError, RuntimeError, ["Mixing different tf.distribute.Strategy objects"]),
    (lambda a: _other_strategy_step(a, lambda: _tf_keras().optimizers.Adam(0.1)),
     ValueError, ValueError, ["`colocate_vars_with` must only be passed a variable created"]),
    (lambda a: _other_strategy_step(a, lambda: keras.optimizers.Adam(0.1)),
     RuntimeError, RuntimeError, ["Mixing different tf.distribute.Strategy objects"]),
    # Reading the optimizer's step counter: TF fails converting it.
    (lambda a: _other_strategy_step(a, lambda: keras.optimizers.SGD(0.1), build=True),
     TypeError, ValueError, _NOT_ITS_STRATEGY),
], ids=["tf_keras_legacy", "tf_keras_legacy_trained", "tf_keras_trained", "tf_keras",
        "keras3", "keras3_built"])
def test_optimizer_of_another_strategy_raises(snippet, theirs, ours, fragments):
  oracle.check_misuse(snippet, theirs, ours, fragments)


def test_reading_a_variable_in_another_strategys_replica_raises():
  """TF reads the component of the other strategy's replica id, which
  belongs to no replica of it."""
  def snippet(api):
    with api.pair.scope():
      v = tf.Variable(1.0)
    return api.one_device("CPU:1").run(lambda: v * 2.0)
  oracle.check_misuse(snippet, None, ValueError, _NOT_ITS_STRATEGY)


# --- Private names clients read or write on distributed variables
# (docs/client_private_names.md).

def test_tf1_optimizer_slot_of_a_component_is_that_replicas():
  """TensorFlow's TF 1.x `Optimizer.get_slot` of a component variable (what
  its updates see) finds the distributed slot through the component's
  `_distributed_container` and gives its `_get_on_device_or_primary()`."""
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
      optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    strategy.run(lambda: optimizer.minimize(lambda: v * v))
    seen = []

    def fn(component):
      slot = optimizer.get_slot(component, "momentum")
      seen.append([type(slot).__name__, slot.device, float(slot.read_value())])
    strategy.extended.update(v, fn)
    return seen
  assert compare(snippet, 2) == [
      ["ResourceVariable", DEVICES[i], 4.0] for i in range(2)]


def test_aggregation_set_by_hand_governs_updates_in_replicas():
  """The Model Garden's spectral normalization sets a layer kernel's
  `_aggregation` after building it, then assigns to the kernel in the
  replicas."""
  def snippet(dist, strategy):
    with strategy.scope():
      kernel = tf.Variable([1.0, 2.0])
    kernel._aggregation = AGG.MEAN  # pylint: disable=protected-access

    def step():
      kernel.assign(kernel * (_replica_id(dist) + 1.0))
    tf.function(lambda: strategy.run(step))()
    return [str(kernel.aggregation), _components(kernel)]
  assert compare(snippet, 2) == ["VariableAggregationV2.MEAN", [[1.5, 3.0], [1.5, 3.0]]]


def test_eval_is_for_tf1_graphs():
  def snippet(dist, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    return v.eval()
  assert isinstance(compare(snippet, 2), Raised)
