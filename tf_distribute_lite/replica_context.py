"""`ReplicaContext`: what code inside `strategy.run` sees of its replica,
and the collectives it calls there (`all_reduce`, `all_gather`,
`merge_call`)."""

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.tf_classes import StandsFor


def _own_copies(inputs, results):
  """`results`, where one is its own input (a value every replica shares,
  already in sync) as a copy on this replica's device, as TensorFlow's are."""
  return [tf.identity(r) if r is x else r for x, r in zip(inputs, results)]


def _with_gradient(xs, ys, gradient):
  """`ys` (collective results of `xs`), with `gradient(dys)` as their
  gradient with respect to `xs`.

  The gradient flows from here, not through the merge, which reads other
  replicas' values (and records on another thread's tape). Taking `ys` as
  arguments keeps TensorFlow's search for variables used inside the function
  from walking every replica's graph.
  """
  @tf.custom_gradient
  def with_gradient(*xs_and_ys):
    def grad(*dys):
      return list(gradient(list(dys))) + [None] * len(ys)
    return list(xs_and_ys[len(xs):]), grad
  return with_gradient(*xs, *ys)


def refuse_indexed_slices(value, method):
  """Raises TensorFlow's NotImplementedError where the nest `value` holds a
  `tf.IndexedSlices`, which `method` (a gather) cannot concatenate."""
  if any(isinstance(v, tf.IndexedSlices) for v in tf.nest.flatten(value)):
    raise NotImplementedError(
        f"{method} does not support IndexedSlices: convert them to dense "
        f"tensors first (tf.convert_to_tensor).")


def _gradient_wanted():
  """Whether a collective's result needs its gradient attached: in a graph
  always (`tf.gradients` may differentiate it later, and a function traced
  now may run under a tape later), eagerly only while a tape records."""
  return not tf.executing_eagerly() or _tf_bridge.gradient_tape_active()


class ReplicaContextBase(StandsFor):
  """What code inside `strategy.run` sees: its replica and the collectives.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> def step():
  ...   ctx = tf_distribute_lite.get_replica_context()
  ...   return ctx.all_reduce("SUM", tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)
  >>> strategy.run(step)
  PerReplica:{
    0: <tf.Tensor: shape=(), dtype=float32, numpy=3.0>,
    1: <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  }
  """

  def __init__(self, strategy, replica_id_in_sync_group, runner=None):
    self._strategy = strategy
    self._replica_id = replica_id_in_sync_group
    self._runner = runner
    self._entry = contexts.ContextEntry.in_replica(self)

  def __enter__(self):
    contexts.push(self._entry)
    summaries = _tf_bridge.summary_state()
    self._outer_summary_recording = summaries.is_recording_distribution_strategy
    summaries.is_recording_distribution_strategy = self._is_replica_zero
    return self

  def __exit__(self, *exc_info):
    _tf_bridge.summary_state().is_recording_distribution_strategy = (
        self._outer_summary_recording)
    contexts.pop()

  def _is_replica_zero(self):
    """Whether `tf.summary` records here: in replica 0 only, as in TF."""
    return tf.equal(self.replica_id_in_sync_group, 0)

  @property
  def strategy(self):
    """The strategy this replica belongs to."""
    return self._strategy

  @property
  def num_replicas_in_sync(self):
    """How many replicas take part in each synchronous step."""
    return self._strategy.num_replicas_in_sync

  @property
  def replica_id_in_sync_group(self):
    """This replica's index, a scalar int32 tensor."""
    return tf.constant(self._replica_id, tf.int32, name="replica_id_in_sync_group")

  @property
  def devices(self):
    """The devices this replica runs on."""
    self._require_current()
    return [[self._strategy.extended.worker_devices[self._replica_id]]]

  def _require_current(self):
    entry = contexts.top()
    if entry is None:  # the default strategy's replica context is current
      if isinstance(self._strategy, contexts.DefaultStrategy):
        raise RuntimeError("Mismatching ReplicaContext.")
      raise RuntimeError(f"Mismatching tf.distribute.Strategy objects: the "
                         f"default strategy is not {self._strategy}.")
    if entry.replica_context is self:
      return
    if entry.replica_context is None:
      raise RuntimeError("Need to be inside `call_for_each_replica()`")
    if entry.strategy is self._strategy:
      raise RuntimeError("Mismatching ReplicaContext.")
    raise RuntimeError(f"Mismatching tf.distribute.Strategy objects: "
                       f"{entry.strategy} is not {self._strategy}.")

  def merge_call(self, merge_fn, args=(), kwargs=None):
    """Runs `merge_fn(strategy, *args, **kwargs)` once, across all replicas.

    Every replica must call `merge_call`; `merge_fn` runs in the
    cross-replica context with each argument grouped into a distributed
    value, and each replica receives its part of the result.
    """
    self._require_current()
    kwargs = {} if kwargs is None else kwargs
    if not tf.executing_eagerly():
      merge_fn = tf.__internal__.autograph.tf_convert(
          merge_fn, tf.__internal__.autograph.control_status_ctx(),
          convert_by_default=False)
    if self._runner is not None and self._runner.num_replicas > 1:
      return self._runner.merge_call(self._replica_id, merge_fn, args, kwargs)
    with contexts.Entered(contexts.ContextEntry.cross_replica(self._strategy)):
      return merge_fn(self._strategy, *args, **kwargs)

  def all_reduce(self, reduce_op, value, options=None):
    """Reduces `value` (a nest of tensors) across replicas; each gets the result.

    A value that is the very same object in every replica (a tensor made
    outside `strategy.run`, say) is already in sync: SUM and MEAN both return
    it unchanged, not SUM times the number of replicas. Keras optimizers rely
    on this. The gradient of a SUM (MEAN) all-reduce is the SUM (MEAN)
    all-reduce of the gradients.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> shared = tf.constant(5.0)
    >>> strategy.run(lambda: tf_distribute_lite.get_replica_context().all_reduce(
    ...     "SUM", shared)).values[1]
    <tf.Tensor: shape=(), dtype=float32, numpy=5.0>
    """
    reduce_op = ReduceOp.from_any(reduce_op)
    flat = tf.nest.flatten(value)
    if not flat:
      return value
    if self.num_replicas_in_sync == 1:
      return value

    def batch_all_reduce(strategy, *per_replica):
      return strategy.extended.batch_reduce_to(
          reduce_op, [(v, v) for v in per_replica], options)

    if any(isinstance(v, tf.IndexedSlices) for v in flat):
      return tf.nest.pack_sequence_as(
          value, self.merge_call(batch_all_reduce, args=flat))

    reduced = _own_copies(flat, self.merge_call(batch_all_reduce, args=flat))
    if _gradient_wanted():
      reduced = _with_gradient(
          flat, reduced, lambda dys: self.all_reduce(reduce_op, dys, options))
    return tf.nest.pack_sequence_as(value, reduced)

  def _update(self, var, fn, args=(), kwargs=None, group=True):
    """Runs `fn(component, *args, **kwargs)` on each component of `var`,
    after every replica has arrived, with the replicas' arguments grouped
    (`strategy.extended.update` from a replica context).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> with strategy.scope():
    ...   v = tf.Variable(5.0)
    >>> def replica_fn():
    ...   context = tf_distribute_lite.get_replica_context()
    ...   context._update(v, lambda var, x: var.assign(x), args=(tf.identity(1.0),))
    >>> _ = strategy.run(replica_fn)
    >>> [c.numpy().item() for c in v.values]
    [1.0, 1.0]
    """
    self._require_current()
    return self._strategy.extended.update(var, fn, args, kwargs, group)

class ReplicaContext(ReplicaContextBase, stands_for=tf.distribute.ReplicaContext):
  """The replica context of TF 2.x strategies, with `all_gather`.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> strategy.run(lambda: tf_distribute_lite.get_replica_context().all_gather(
  ...     tf.constant([1.0]), axis=0)).values[0]
  <tf.Tensor: shape=(2,), dtype=float32, numpy=array([1., 1.], dtype=float32)>
  """

  def all_gather(self, value, axis, options=None):
    """Concatenates every replica's `value` (a nest of tensors) along `axis`.

    Replicas may differ in their size along `axis`. A value that is the very
    same object in every replica is already in sync and comes back unchanged,
    as with `all_reduce`. The gradient with respect to a replica's value is
    its own slice of the SUM all-reduce of the gathered value's gradients.
    (TensorFlow 2.21 fails to take that gradient of a shared value, or of
    values of different ranks gathered at once.)

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> def step():
    ...   context = tf_distribute_lite.get_replica_context()
    ...   x = tf.ones([context.replica_id_in_sync_group + 1])
    ...   with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     gathered = context.all_gather(x, axis=0)
    ...     loss = tf.reduce_sum(gathered * [1.0, 2.0, 3.0])
    ...   return gathered, tape.gradient(loss, x)
    >>> gathered, gradient = strategy.run(step)
    >>> gathered.values[1].numpy(), gradient.values[1].numpy()
    (array([1., 1., 1.], dtype=float32), array([4., 6.], dtype=float32))
    """
    refuse_indexed_slices(value, "all_gather")
    flat = tf.nest.flatten(value)
    if self.num_replicas_in_sync == 1:
      return value

    def gather(strategy, *per_replica):
      return [strategy.extended._gather_to(v, v, axis, options)  # pylint: disable=protected-access
              for v in per_replica]
    merged = self.merge_call(gather, args=flat)
    gathered = _own_copies(flat, merged)
    if _gradient_wanted():
      shared = [m is x for x, m in zip(flat, merged)]
      gathered = _with_gradient(
          flat, gathered,
          lambda dys: self._gather_gradients(flat, shared, dys, axis, options))
    return tf.nest.pack_sequence_as(value, gathered)

  def _gather_gradients(self, xs, shared, dys, axis, options):
    """Per `x` in `xs`, its slice of the summed gradients `dys` of its
    gathered value (`dy` itself where `x` was shared)."""
    gathered = [i for i, is_shared in enumerate(shared) if not is_shared]
    summed = self.all_reduce(ReduceOp.SUM, [dys[i] for i in gathered], options)
    sizes = self.all_gather([tf.shape(xs[i])[axis:][:1] for i in gathered],
                            axis=0, options=options)
    gradients = list(dys)
    for i, dy, size in zip(gathered, summed, sizes):
      begin = tf.reduce_sum(size[:self._replica_id])
      gradients[i] = tf.gather(dy, tf.range(begin, begin + size[self._replica_id]),
                               axis=axis)
    return gradients
