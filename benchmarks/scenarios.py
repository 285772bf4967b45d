"""Benchmark scenarios, one function each, shared by every implementation.

A scenario takes `module` (None for plain TensorFlow, else `tf.distribute` or
`tf_distribute_lite`, used as `module.MirroredStrategy`, `module.ReduceOp`,
...) and a `Budget`, and returns `(value, fingerprint)`: the measured time in
milliseconds (MB allocated for the memory rows) and a dict of floats
summarising what was computed, which must agree across implementations.

Importing this module does not start TensorFlow's runtime, so the worker
configures the `NUM_DEVICES` logical CPU devices after importing it.
"""

import contextlib
import dataclasses
import gc
import statistics
import time
import weakref

import numpy as np
import tensorflow as tf

NUM_DEVICES = 4
DEVICES = tuple(f"CPU:{i}" for i in range(NUM_DEVICES))


@dataclasses.dataclass(frozen=True)
class Budget:
  """How long to measure a steady state: warm-up calls, then timed calls."""
  warmup: int = 5
  min_iters: int = 20
  min_seconds: float = 0.5
  max_iters: int = 2000


QUICK = Budget(warmup=2, min_iters=3, min_seconds=0.05, max_iters=50)


def median_ms(fn, budget):
  """Median time of one `fn()` call in ms, after `budget.warmup` calls."""
  def measure():
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
  return median_of_ms(measure, budget)


def median_of_ms(measure, budget):
  """Median in ms of `measure()`, which times something itself and returns
  seconds, after `budget.warmup` calls."""
  for _ in range(budget.warmup):
    measure()
  times = []
  start = time.perf_counter()
  while len(times) < budget.max_iters and (
      len(times) < budget.min_iters or
      time.perf_counter() - start < budget.min_seconds):
    times.append(measure())
  return statistics.median(times) * 1e3


def time_once_ms(fn):
  """`(ms, result)` of a single `fn()` call."""
  t0 = time.perf_counter()
  result = fn()
  return (time.perf_counter() - t0) * 1e3, result


# --- Helpers shared by the scenarios.


def make_strategy(module, devices=DEVICES):
  return None if module is None else module.MirroredStrategy(list(devices))


def scope(strategy):
  return contextlib.nullcontext() if strategy is None else strategy.scope()


def per_replica(strategy, make, devices=DEVICES):
  """`make(i)` on each replica's device: a PerReplica value, or a list."""
  def on_device(i):
    with tf.device(devices[i]):
      return make(i)
  if strategy is None:
    return [on_device(i) for i in range(len(devices))]
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: on_device(ctx.replica_id_in_sync_group))


def replica_values(strategy, value):
  """The per-replica copies of `value` (a structure) as a list of structures."""
  if strategy is None:
    return [value]
  flat = [strategy.experimental_local_results(v)
          for v in tf.nest.flatten(value)]
  return [tf.nest.pack_sequence_as(value, [f[r] for f in flat])
          for r in range(len(flat[0]))]


def checksum(structure, fn=lambda a: a):
  """Sum of `fn` over every element of every tensor, in float64."""
  return float(sum(np.sum(fn(np.asarray(t, dtype=np.float64)))
                   for t in tf.nest.flatten(structure)))


def agreed(name, sums):
  """Fingerprint entries for per-replica checksums that should be equal."""
  mean = float(np.mean(sums))
  spread = float(np.ptp(sums)) / max(abs(mean), 1e-30)
  return {name: mean, "replica_spread": spread}


# --- 1. Eager strategy.run of a small step.


def _eager_run(module, budget, num_replicas):
  devices = DEVICES[:num_replicas]
  rng = np.random.default_rng(0)
  xs = [rng.random((32, 32), np.float32) for _ in devices]
  w0, b0 = rng.random((32, 32), np.float32), rng.random(32, np.float32)

  def make_step(w, b):
    return lambda x: tf.matmul(x, w) + b

  strategy = make_strategy(module, devices)
  x = per_replica(strategy, lambda i: tf.constant(xs[i]), devices)
  if strategy is None:
    steps = []
    for device in devices:
      with tf.device(device):
        steps.append(make_step(tf.Variable(w0), tf.Variable(b0)))

    def iteration():
      outputs = []
      for device, step, x_i in zip(devices, steps, x):
        with tf.device(device):
          outputs.append(step(x_i))
      return outputs
  else:
    with strategy.scope():
      step = make_step(tf.Variable(w0), tf.Variable(b0))
    iteration = lambda: strategy.run(step, args=(x,))
  ms = median_ms(iteration, budget)
  outputs = iteration()
  if strategy is not None:
    outputs = strategy.experimental_local_results(outputs)
  return ms, {"output_sum": checksum(outputs)}


def eager_run_1(module, budget):
  return _eager_run(module, budget, 1)


def eager_run_4(module, budget):
  return _eager_run(module, budget, 4)


# --- 2. MLP training step in a tf.function.

GLOBAL_BATCH = 256
LEARNING_RATE = 0.1


class _Mlp:
  """An MLP (784-256-10 unless `widths` says otherwise) and its SGD training
  step, for one implementation."""

  def __init__(self, module, widths=(784, 256, 10)):
    self._make_data(widths)
    self.strategy = strategy = make_strategy(module)
    with scope(strategy):
      self.params = params = [tf.Variable(v) for v in self.initial]
    replicas = 1 if strategy is None else strategy.num_replicas_in_sync

    def step_fn(x, y):
      loss, grads = loss_and_grads(params, x, y, replicas)
      if module is not None:
        grads = module.get_replica_context().all_reduce(module.ReduceOp.SUM,
                                                        grads)
      for v, g in zip(params, grads):
        v.assign_sub(LEARNING_RATE * g)
      return loss

    if strategy is None:
      self.train_step = tf.function(step_fn)
    else:
      @tf.function
      def train_step(x, y):
        losses = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(module.ReduceOp.SUM, losses, axis=None)
      self.train_step = train_step

  def _make_data(self, widths):
    """The initial weights (`initial`) and the global batch (`x`, `y`)."""
    rng = np.random.default_rng(0)
    self.initial = mlp_initial_weights(rng, widths)
    self.x = rng.random((GLOBAL_BATCH, widths[0]), np.float32)
    self.y = rng.integers(0, widths[-1], GLOBAL_BATCH).astype(np.int32)

  def batch(self, size):
    """The first `size` examples: global tensors, or per-replica slices."""
    if self.strategy is None:
      return tf.constant(self.x[:size]), tf.constant(self.y[:size])
    n = size // self.strategy.num_replicas_in_sync
    return tuple(
        per_replica(self.strategy, lambda i, a=a: tf.constant(a[i * n:][:n]))
        for a in (self.x, self.y))

  def weight_change(self):
    """Fingerprint of the weights: sum |w - w0|, per replica."""
    return self._weight_change(replica_values(self.strategy, self.params))

  def _weight_change(self, per_replica_params):
    sums = [sum(checksum(v - w0, np.abs) for v, w0 in zip(vs, self.initial))
            for vs in per_replica_params]
    return agreed("weight_change", sums)


def mlp_initial_weights(rng, widths=(784, 256, 10)):
  """Kernels and biases of the MLP with `widths`, drawn from `rng`."""
  weights = []
  for fan_in, fan_out in zip(widths[:-1], widths[1:]):
    weights += [rng.normal(0, 0.05, (fan_in, fan_out)).astype(np.float32),
                np.zeros(fan_out, np.float32)]
  return weights


def loss_and_grads(params, x, y, replicas):
  """The MLP's loss on batch `(x, y)`, scaled for `replicas` replicas, and
  its gradients."""
  with tf.GradientTape() as tape:
    logits = x
    for i in range(0, len(params), 2):
      logits = logits @ params[i] + params[i + 1]
      if i + 2 < len(params):
        logits = tf.nn.relu(logits)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    loss = tf.reduce_sum(losses) / tf.cast(tf.shape(x)[0] * replicas, tf.float32)
  return loss, tape.gradient(loss, params)


class _MlpByHand(_Mlp):
  """The step a strategy runs on the 4 devices, written by hand in plain
  TensorFlow: a copy of the weights per device, each device's quarter of the
  batch traced on that device, gradients summed on the first device and
  applied to every copy. It is the least that tracing each replica builds,
  so the `_x4` rows compare the strategies with it."""

  def __init__(self, widths=(784, 256, 10)):  # pylint: disable=super-init-not-called
    self._make_data(widths)
    self.copies = []
    for device in DEVICES:
      with tf.device(device):
        self.copies.append([tf.Variable(v) for v in self.initial])

    @tf.function
    def train_step(xs, ys):
      losses, grads = [], []
      for device, params, x, y in zip(DEVICES, self.copies, xs, ys):
        with tf.device(device):
          loss, device_grads = loss_and_grads(params, x, y, NUM_DEVICES)
        losses.append(loss)
        grads.append(device_grads)
      with tf.device(DEVICES[0]):
        summed = [tf.add_n(list(g)) for g in zip(*grads)]
        total = tf.add_n(losses)
      for device, params in zip(DEVICES, self.copies):
        with tf.device(device):
          for v, g in zip(params, summed):
            v.assign_sub(LEARNING_RATE * g)
      return total
    self.train_step = train_step

  def batch(self, size):
    n = size // NUM_DEVICES
    return tuple(per_replica(None, lambda i, a=a: tf.constant(a[i * n:][:n]))
                 for a in (self.x, self.y))

  def weight_change(self):
    return self._weight_change(self.copies)


def mlp_step(module, budget, by_hand=False):
  mlp = _mlp(module, by_hand=by_hand)
  x, y = mlp.batch(GLOBAL_BATCH)
  losses = [float(mlp.train_step(x, y)) for _ in range(3)]
  fingerprint = {"loss_1": losses[0], "loss_3": losses[2],
                 **mlp.weight_change()}
  return median_ms(lambda: mlp.train_step(x, y), budget), fingerprint


def _mlp(module, widths=(784, 256, 10), by_hand=False):
  """The MLP of `module`; plain TensorFlow's written for 4 devices if
  `by_hand`."""
  return _MlpByHand(widths) if by_hand and module is None else _Mlp(module, widths)


def mlp_first_call(module, budget, by_hand=False):
  del budget
  mlp = _mlp(module, by_hand=by_hand)
  x, y = mlp.batch(GLOBAL_BATCH)
  ms, loss = time_once_ms(lambda: mlp.train_step(x, y))
  return ms, {"loss_1": float(loss), **mlp.weight_change()}


def mlp_retrace(module, budget, widths=(784, 256, 10), by_hand=False):
  del budget
  mlp = _mlp(module, widths, by_hand)
  x, y = mlp.batch(GLOBAL_BATCH)
  x_half, y_half = mlp.batch(GLOBAL_BATCH // 2)
  for _ in range(2):
    mlp.train_step(x, y)
  traces = mlp.train_step.experimental_get_tracing_count()
  ms, loss = time_once_ms(lambda: mlp.train_step(x_half, y_half))
  if mlp.train_step.experimental_get_tracing_count() != traces + 1:
    raise RuntimeError("the call with a new batch size did not retrace")
  return ms, {"loss_3": float(loss), **mlp.weight_change()}


def deep_mlp_retrace(module, budget, by_hand=False):
  """`mlp_retrace` of a 20-layer MLP (128 wide): tracing cost dominates."""
  return mlp_retrace(module, budget, widths=(128,) * 21, by_hand=by_hand)


def mlp_step_x4(module, budget):
  """`mlp_step`; plain runs the step written by hand for 4 devices."""
  return mlp_step(module, budget, by_hand=True)


def mlp_first_call_x4(module, budget):
  """`mlp_first_call`; plain runs the step written by hand for 4 devices."""
  return mlp_first_call(module, budget, by_hand=True)


def mlp_retrace_x4(module, budget):
  """`mlp_retrace`; plain runs the step written by hand for 4 devices."""
  return mlp_retrace(module, budget, by_hand=True)


def deep_mlp_retrace_x4(module, budget):
  """`deep_mlp_retrace`; plain runs the step written by hand for 4 devices."""
  return deep_mlp_retrace(module, budget, by_hand=True)


# --- 3. All-reduce of ~16 MB per replica in a tf.function.


def _allreduce_shapes(num_tensors=50, floats=4 * 2**20):
  """Kernel-like [rows, 256] and bias-like [rows] shapes, ~`floats` in all."""
  weights = np.random.default_rng(1).uniform(0.2, 1.8, num_tensors // 2)
  rows = np.maximum(1, np.round(weights / weights.sum() * floats / 257))
  return [s for r in rows.astype(int).tolist() for s in ((r, 256), (r,))]


def allreduce_16mb(module, budget):
  rng = np.random.default_rng(0)
  arrays = [rng.random(s, np.float32) for s in _allreduce_shapes()]
  strategy = make_strategy(module)
  inputs = per_replica(strategy,
                       lambda i: [tf.constant(a) + float(i) for a in arrays])
  if strategy is None:
    @tf.function
    def fn(replica_lists):
      with tf.device(DEVICES[0]):
        return [tf.add_n(list(ts)) for ts in zip(*replica_lists)]
  else:
    def replica_fn(values):
      return module.get_replica_context().all_reduce(module.ReduceOp.SUM,
                                                     values)

    @tf.function
    def fn(values):
      return strategy.run(replica_fn, args=(values,))
  ms = median_ms(lambda: fn(inputs), budget)
  outputs = replica_values(strategy, fn(inputs))
  return ms, agreed("sum", [checksum(o) for o in outputs])


# --- 4. Eager strategy.reduce.


def _reduce(module, budget, op, axis):
  rng = np.random.default_rng(0)
  arrays = [rng.random((64, 128), np.float32) for _ in DEVICES]
  strategy = make_strategy(module)
  values = per_replica(strategy, lambda i: tf.constant(arrays[i]))
  if strategy is not None:
    reduce_op = getattr(module.ReduceOp, op)
    fn = lambda: strategy.reduce(reduce_op, values, axis=axis)
  elif axis is None:
    def fn():
      with tf.device(DEVICES[0]):
        return tf.add_n(values)
  else:
    def fn():
      with tf.device(DEVICES[0]):
        return tf.reduce_mean(tf.concat(values, axis=0), axis=0)
  ms = median_ms(fn, budget)
  return ms, {"sum": checksum(fn())}


def reduce_none(module, budget):
  return _reduce(module, budget, "SUM", None)


def reduce_axis0(module, budget):
  return _reduce(module, budget, "MEAN", 0)


# --- 5. Strategy construction and variable creation.


def _layer_initializers():
  """(name, initial value function) of the 20 layers' kernels and biases."""
  for i in range(20):
    yield (f"dense_{i}/kernel",
           lambda i=i: tf.random.stateless_normal([128, 128], seed=[i, 0]))
    yield f"dense_{i}/bias", lambda: tf.zeros([128])


def _build_20_layers(module, by_hand=False):
  """Builds the 20 layers' variables: `build()` returns each replica's list.

  With `by_hand`, plain TensorFlow builds what 4 replicas' variables are at
  least: each variable on every device, the copies initialised from the
  first one's value.
  """
  def build_by_hand():
    copies = [[] for _ in DEVICES]
    for name, make in _layer_initializers():
      with tf.device(DEVICES[0]):
        first = tf.Variable(make, name=name)
      copies[0].append(first)
      for i in range(1, NUM_DEVICES):
        with tf.device(DEVICES[i]):
          copies[i].append(tf.Variable(first.read_value(), name=f"{name}/replica_{i}"))
    return copies

  def build():
    strategy = make_strategy(module)
    with scope(strategy):
      variables = [tf.Variable(make, name=name)
                   for name, make in _layer_initializers()]
    return replica_values(strategy, variables)

  return build_by_hand if by_hand and module is None else build


def _squares(copies):
  return agreed("sum_of_squares", [checksum(vs, np.square) for vs in copies])


def build_20_layer_mlp(module, budget, by_hand=False):
  del budget
  ms, copies = time_once_ms(_build_20_layers(module, by_hand))
  return ms, _squares(copies)


def build_20_layer_mlp_x4(module, budget):
  """`build_20_layer_mlp`; plain builds the variables by hand on 4 devices."""
  return build_20_layer_mlp(module, budget, by_hand=True)


# --- 6. Memory: what the allocator holds, in MB (the worker turns on
# TensorFlow's BFC CPU allocator, which counts its bytes, for these rows; the
# 4 logical devices share it). "plain" is the work written by hand for the 4
# devices, since one copy of every variable per device is what replicas are.


def allocated_mb(fn):
  """`(peak, held, result)` of `fn()`: the MB allocated at the peak of the
  call and still allocated after it, over what was allocated before it."""
  tf.config.experimental.reset_memory_stats(DEVICES[0])
  before = tf.config.experimental.get_memory_info(DEVICES[0])["current"]
  result = fn()
  info = tf.config.experimental.get_memory_info(DEVICES[0])
  return ((info["peak"] - before) / 2**20, (info["current"] - before) / 2**20,
          result)


def variables_mb_x4(module, budget):
  """MB held by the 20 layers' variables on 4 devices once built."""
  del budget
  _, held, copies = allocated_mb(_build_20_layers(module, by_hand=True))
  return held, _squares(copies)


def variables_peak_mb_x4(module, budget):
  """Peak MB allocated while building the 20 layers' variables on 4 devices."""
  del budget
  peak, _, copies = allocated_mb(_build_20_layers(module, by_hand=True))
  return peak, _squares(copies)


def mlp_step_peak_mb_x4(module, budget):
  """Peak MB allocated by a step of `mlp_step` (after 3 steps), variables
  and inputs excluded."""
  del budget
  mlp = _mlp(module, by_hand=True)
  x, y = mlp.batch(GLOBAL_BATCH)
  for _ in range(3):
    mlp.train_step(x, y)
  peak, _, loss = allocated_mb(lambda: mlp.train_step(x, y))
  return peak, {"loss_4": float(loss), **mlp.weight_change()}


# --- 7. Distributed input: iterating over, creating and dropping iterators.

INPUT_ROWS = 4096
INPUT_STEPS = 200


class _Input:
  """Global batches of 256x784 float32 from a fixed array of `INPUT_ROWS`
  rows, repeated: the plain dataset, or distributed over the replicas."""

  def __init__(self, module):
    x = np.random.default_rng(0).random((INPUT_ROWS, 784), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(
        GLOBAL_BATCH, drop_remainder=True).repeat()
    self.strategy = strategy = make_strategy(module)
    self.dataset = (dataset if strategy is None
                    else strategy.experimental_distribute_dataset(dataset))

  def global_batch(self, value):
    """One step's value as a numpy global batch, replica parts in order."""
    parts = ([value] if self.strategy is None
             else self.strategy.experimental_local_results(value))
    return np.concatenate([np.asarray(part) for part in parts])

  def first_batch_sums(self):
    """Fingerprint of the first step of a new iterator."""
    return batch_sums([self.global_batch(next(iter(self.dataset)))])


def batch_sums(batches):
  """Fingerprint of global batches: column 0 summed, plain and weighted by
  the row's position in its batch (so the replicas' order counts)."""
  column = np.stack([b[:, 0] for b in batches]).astype(np.float64)
  position = np.arange(column.shape[1])
  return {"column_sum": float(column.sum()),
          "row_weighted_sum": float((column * position).sum()),
          "rows": float(column.size)}


def dataset_iter_python(module, budget):
  data = _Input(module)
  iterator = iter(data.dataset)
  fingerprint = batch_sums(
      [data.global_batch(next(iterator)) for _ in range(INPUT_STEPS)])

  def steps():
    for _ in range(INPUT_STEPS):
      next(iterator)
  return median_ms(steps, budget), fingerprint


def dataset_iter_function(module, budget):
  data = _Input(module)
  strategy = data.strategy

  def column_sum(x):
    return tf.reduce_sum(x[:, 0])

  if strategy is None:
    step_sum = column_sum
  else:
    def step_sum(x):
      return strategy.reduce(module.ReduceOp.SUM,
                             strategy.run(column_sum, args=(x,)), axis=None)

  @tf.function
  def steps(iterator):
    total = tf.constant(0.0)
    for _ in tf.range(INPUT_STEPS):
      total += step_sum(next(iterator))
    return total

  iterator = iter(data.dataset)
  total = float(steps(iterator))  # Traces; the first INPUT_STEPS batches.
  ms = median_ms(lambda: steps(iterator), budget)
  if steps.experimental_get_tracing_count() != 1:
    raise RuntimeError("passing the same iterator again retraced")
  return ms, {"column_sum": total}


def _timed_without_gc(fn):
  """Seconds `fn()` takes with the cycle collector off, as in `timeit`, so
  collecting earlier garbage does not land in the measurement."""
  gc.disable()
  try:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
  finally:
    gc.enable()


def iterator_create(module, budget):
  data = _Input(module)
  fingerprint = data.first_batch_sums()

  def measure():
    iterators = []
    seconds = _timed_without_gc(lambda: iterators.append(iter(data.dataset)))
    iterators.clear()  # Untimed; see iterator_teardown.
    return seconds
  return median_of_ms(measure, budget), fingerprint


def iterator_teardown(module, budget):
  """Dropping the last reference to an iterator that has yielded one step.

  An iterator's components are its resource handles (tf.data's owned
  anonymous iterators, and tf.distribute's multi-device iterator), which
  delete the resource, stopping its prefetch threads, when they are freed.
  The measurement ends only once all of them are gone: a `gc.collect()` is
  timed too if dropping the reference does not free them.
  """
  data = _Input(module)
  fingerprint = data.first_batch_sums()

  def measure():
    iterators = [iter(data.dataset)]
    next(iterators[0])
    handles = [weakref.ref(t) for t in tf.nest.flatten(
        iterators[0], expand_composites=True)]
    if not handles:
      raise RuntimeError("the iterator has no resource handles to watch")
    alive = lambda: any(h() is not None for h in handles)

    def teardown():
      iterators.clear()
      if alive():
        gc.collect()
    seconds = _timed_without_gc(teardown)
    if alive():
      raise RuntimeError("the iterator's resources outlive it")
    return seconds
  return median_of_ms(measure, budget), fingerprint


# --- 8. Client libraries: tf_keras `fit` and Orbit's `Controller.train`.
#
# The MLP of `mlp_step` as a tf_keras model (SGD, global batch 256), trained
# on batches of `_Input`'s kind with labels; "plain" builds and trains it
# without a strategy. Both time steady steps in loops of `CLIENT_STEPS`.

CLIENT_STEPS = 20


def _keras2_mlp(strategy):
  """The 784-256-10 MLP as a tf_keras model, in `strategy`'s scope, with
  `mlp_initial_weights`; its input is named "x"."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  with scope(strategy):
    model = tf_keras.Sequential([
        tf_keras.Input((784,), name="x"),
        tf_keras.layers.Dense(256, activation="relu"),
        tf_keras.layers.Dense(10)])
    model.set_weights(mlp_initial_weights(np.random.default_rng(0)))
  return model


def _labelled_batches():
  """Global batches of {"x": 256x784 float32, "label": 256 int32}, repeated."""
  rng = np.random.default_rng(1)
  data = {"x": rng.random((INPUT_ROWS, 784), np.float32),
          "label": rng.integers(0, 10, INPUT_ROWS).astype(np.int32)}
  return tf.data.Dataset.from_tensor_slices(data).batch(
      GLOBAL_BATCH, drop_remainder=True).repeat()


def _keras2_weight_change(model):
  initial = mlp_initial_weights(np.random.default_rng(0))
  return {"weight_change": sum(checksum(w - w0, np.abs)
                               for w, w0 in zip(model.get_weights(), initial))}


def keras2_fit(module, budget):
  """tf_keras `Model.fit` of the MLP: one `fit` of epochs of `CLIENT_STEPS`
  steps (its iterator lives across epochs), each epoch timed; ms per step,
  the first `budget.warmup` epochs (tracing) not timed."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  strategy = make_strategy(module)
  model = _keras2_mlp(strategy)
  with scope(strategy):
    model.compile(optimizer=tf_keras.optimizers.SGD(learning_rate=LEARNING_RATE),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  epoch_seconds, fingerprint = [], {}

  class EpochTimer(tf_keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
      self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
      epoch_seconds.append(time.perf_counter() - self.start)
      if epoch == 0:  # Later epochs drift apart with the order of the sums.
        fingerprint.update(loss_first_epoch=logs["loss"], **_keras2_weight_change(model))

  epochs = budget.warmup + budget.min_iters
  model.fit(_labelled_batches().map(lambda d: (d["x"], d["label"])), epochs=epochs,
            steps_per_epoch=CLIENT_STEPS, verbose=0, callbacks=[EpochTimer()])
  return statistics.median(epoch_seconds[budget.warmup:]) * 1e3 / CLIENT_STEPS, fingerprint


def orbit_controller_train(module, budget):
  """Orbit's `Controller.train` driving its `SingleTaskTrainer` on the MLP,
  on `orbit.utils.make_distributed_dataset`, `CLIENT_STEPS` steps per loop (one `tf.function` call of a
  `tf.while_loop`); ms per step of a call that trains one loop, the first
  (tracing) not timed."""
  import io  # pylint: disable=g-import-not-at-top
  import orbit  # pylint: disable=g-import-not-at-top
  from orbit.examples.single_task import single_task_trainer  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  strategy = make_strategy(module)
  model = _keras2_mlp(strategy)
  with scope(strategy):
    # Each replica its part of the global batch (a dataset passed as it is
    # would give every replica all of it).
    dataset = orbit.utils.make_distributed_dataset(strategy, _labelled_batches())
    trainer = single_task_trainer.SingleTaskTrainer(
        dataset, label_key="label", model=model,
        loss_fn=lambda y, logits: tf_keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True),
        optimizer=tf_keras.optimizers.SGD(learning_rate=LEARNING_RATE))
    controller = orbit.Controller(trainer=trainer, steps_per_loop=CLIENT_STEPS,
                                  global_step=trainer.optimizer.iterations)

  def train_one_loop():
    controller.train(int(controller.global_step.numpy()) + CLIENT_STEPS)

  with contextlib.redirect_stdout(io.StringIO()):  # The Controller prints each loop.
    train_one_loop()
    fingerprint = {"loss_first_loop": float(trainer.train_loss.result()),
                   **_keras2_weight_change(model)}
    ms = median_ms(train_one_loop, budget) / CLIENT_STEPS
  return ms, fingerprint


SCENARIOS = {f.__name__: f for f in (
    eager_run_1, eager_run_4, mlp_step, mlp_first_call, mlp_retrace,
    deep_mlp_retrace, mlp_step_x4, mlp_first_call_x4, mlp_retrace_x4,
    deep_mlp_retrace_x4, allreduce_16mb, reduce_none, reduce_axis0,
    build_20_layer_mlp, build_20_layer_mlp_x4, variables_mb_x4,
    variables_peak_mb_x4, mlp_step_peak_mb_x4, dataset_iter_python,
    dataset_iter_function, iterator_create, iterator_teardown, keras2_fit,
    orbit_controller_train)}
