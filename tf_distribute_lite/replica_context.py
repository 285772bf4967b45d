"""`ReplicaContext`: what code inside `strategy.run` sees of its replica."""

import numbers

import numpy as np
import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.tf_classes import StandsFor


def _collective_results(xs, merged, gradient):
  """`merged`, a collective's results over `xs`, with gradient `gradient(dys)`."""
  ys = [tf.identity(y) if y is x else y for x, y in zip(xs, merged)]
  if tf.executing_eagerly() and not _tf_bridge.gradient_tape_active():
    return ys

  @tf.custom_gradient
  def with_gradient(*xs_and_ys):
    def grad(*dys):
      return list(gradient(list(dys))) + [None] * len(ys)
    return list(xs_and_ys[len(xs):]), grad
  return with_gradient(*xs, *ys)


def refuse_indexed_slices(value, method):
  """Raises TensorFlow's NotImplementedError for `tf.IndexedSlices` in `value`."""
  if any(isinstance(v, tf.IndexedSlices) for v in tf.nest.flatten(value)):
    raise NotImplementedError(
        f"{method} does not support IndexedSlices: convert them to dense "
        f"tensors first (tf.convert_to_tensor).")


class ReplicaContextBase(StandsFor):
  """What TF 1.x's and TF 2.x's replica contexts share."""

  def __init__(self, strategy, replica_id_in_sync_group, runner=None):
    self._strategy = strategy
    self._replica_id = replica_id_in_sync_group
    self._runner = runner
    self._entry = contexts.ContextEntry.in_replica(self)
    self._summaries = _tf_bridge.RecordSummariesIf(self._is_replica_zero)

  def __enter__(self):
    contexts.push(self._entry)
    self._summaries.__enter__()
    return self

  def __exit__(self, *exc_info):
    self._summaries.__exit__(*exc_info)
    contexts.pop()

  def _is_replica_zero(self):
    """Whether `tf.summary` records here: in replica 0 only, as in TF."""
    return tf.equal(self.replica_id_in_sync_group, 0)

  strategy = property(lambda self: self._strategy, doc="The strategy of this replica.")
  num_replicas_in_sync = property(lambda self: self._strategy.num_replicas_in_sync,
                                  doc="How many replicas take part in each step.")

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
    """Runs `merge_fn(strategy, *args, **kwargs)` once all replicas call it."""
    self._require_current()
    kwargs = {} if kwargs is None else kwargs
    merge_fn = _tf_bridge.autograph_convert(merge_fn)
    if self._runner is not None and self._runner.num_replicas > 1:
      return self._runner.merge_call(self._replica_id, merge_fn, args, kwargs)
    with contexts.Entered(contexts.ContextEntry.cross_replica(self._strategy)):
      return merge_fn(self._strategy, *args, **kwargs)

  def all_reduce(self, reduce_op, value, options=None):
    """Reduces `value` (a nest of tensors) across replicas (a shared one is in sync).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> shared = tf.constant(5.0)
    >>> strategy.run(lambda: tf_distribute_lite.get_replica_context().all_reduce(
    ...     "SUM", shared)).values[1]
    <tf.Tensor: shape=(), dtype=float32, numpy=5.0>
    """
    reduce_op = ReduceOp.from_any(reduce_op)
    flat = tf.nest.flatten(value)
    if not flat or self.num_replicas_in_sync == 1:
      return value
    flat = [tf.convert_to_tensor(v) if isinstance(v, (numbers.Number, np.ndarray, np.generic))
            else v for v in flat]

    def batch_all_reduce(strategy, *per_replica):
      return strategy.extended.batch_reduce_to(reduce_op, [(v, v) for v in per_replica], options)
    reduced = self.merge_call(batch_all_reduce, args=flat)
    if not any(isinstance(v, tf.IndexedSlices) for v in flat):
      reduced = _collective_results(
          flat, reduced, lambda dys: self.all_reduce(reduce_op, dys, options))
    return tf.nest.pack_sequence_as(value, reduced)

  def _update(self, var, fn, args=(), kwargs=None, group=True):
    """`strategy.extended.update` from a replica context."""
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
    """Concatenates every replica's `value` (a nest of tensors) along `axis`. (TF
    2.21 fails on gradients of shared values or of several ranks at once.)"""
    refuse_indexed_slices(value, "all_gather")
    flat = tf.nest.flatten(value)
    if self.num_replicas_in_sync == 1:
      return value

    def gather(strategy, *per_replica):
      return [strategy.extended._gather_to(v, v, axis, options)  # pylint: disable=protected-access
              for v in per_replica]
    merged = self.merge_call(gather, args=flat)
    shared = [m is x for x, m in zip(flat, merged)]
    gathered = _collective_results(
        flat, merged, lambda dys: self._gather_gradients(flat, shared, dys, axis, options))
    return tf.nest.pack_sequence_as(value, gathered)

  def _gather_gradients(self, xs, shared, dys, axis, options):
    """Per `x` in `xs`, its slice of the summed gradients `dys` (shared: `dy`)."""
    gathered = [i for i, is_shared in enumerate(shared) if not is_shared]
    summed = self.all_reduce(ReduceOp.SUM, [dys[i] for i in gathered], options)
    sizes = self.all_gather([tf.shape(xs[i])[axis:][:1] for i in gathered], axis=0, options=options)
    gradients = list(dys)
    for i, dy, size in zip(gathered, summed, sizes):
      begin = tf.reduce_sum(size[:self._replica_id])
      gradients[i] = tf.gather(dy, tf.range(begin, begin + size[self._replica_id]), axis=axis)
    return gradients
