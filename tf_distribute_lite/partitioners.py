"""Partitioners: a shard count per axis of a variable, 1 but on `axis`. Where
TF 2.21 answers 0 shards or divides by zero, these answer one shard."""

import math
import numbers
import operator

import tensorflow as tf

from tf_distribute_lite import distribute_lib
from tf_distribute_lite.tf_classes import StandsFor


class Partitioner(StandsFor, stands_for=tf.distribute.experimental.partitioners.Partitioner):
  """Base class of partitioners: `(shape, dtype, axis)` -> shards per axis.

  >>> class OneShardPerRow(Partitioner):
  ...   def __call__(self, shape, dtype, axis=0):
  ...     partitions = [1] * shape.rank
  ...     partitions[axis] = shape[axis]
  ...     return partitions
  >>> OneShardPerRow()(tf.TensorShape([3, 2]), tf.float32)
  [3, 1]
  """

  def __call__(self, shape, dtype, axis=0):
    """The number of shards along each axis of `shape`: a list of ints."""
    raise NotImplementedError(
        f"{type(self).__name__} must implement "
        f"__call__(shape, dtype, axis=0), returning a shard count per axis.")


class FixedShardsPartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.FixedShardsPartitioner):
  """Splits `axis` into `num_shards` shards (at most one per element).

  >>> FixedShardsPartitioner(num_shards=2)(tf.TensorShape([10, 3]), tf.float32)
  [2, 1]
  """

  def __init__(self, num_shards):
    self._num_shards = _positive_count("num_shards", num_shards)

  def __call__(self, shape, dtype, axis=0):
    del dtype  # Every element counts the same.
    shape, axis = _checked_shape(shape, axis, whole_shape_known=False)
    return _partitions(shape, axis, min(self._num_shards, shape[axis]))


class MinSizePartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.MinSizePartitioner):
  """`ceil(variable bytes / min_shard_bytes)` shards, at most `max_shards`.

  >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)(tf.TensorShape([6, 1]), tf.float32)
  [2, 1]
  """

  def __init__(self, min_shard_bytes=256 << 10, max_shards=1, bytes_per_string=16):
    self._min_shard_bytes = _positive_number("min_shard_bytes", min_shard_bytes)
    self._max_shards = _positive_count("max_shards", max_shards)
    self._bytes_per_string = _positive_number("bytes_per_string", bytes_per_string)

  def __call__(self, shape, dtype, axis=0):
    shape, axis = _checked_shape(shape, axis, whole_shape_known=True)
    total_bytes = shape.num_elements() * _element_bytes(dtype, self._bytes_per_string)
    wanted = math.ceil(total_bytes / self._min_shard_bytes)
    return _partitions(shape, axis, min(shape[axis], self._max_shards, wanted))


class MaxSizePartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.MaxSizePartitioner):
  """As few shards as possible of at most `max_shard_bytes`, up to `max_shards`.

  >>> MaxSizePartitioner(max_shard_bytes=4)(tf.TensorShape([6, 1]), tf.float32)
  [6, 1]
  """

  def __init__(self, max_shard_bytes, max_shards=None, bytes_per_string=16):
    self._max_shard_bytes = _positive_number("max_shard_bytes", max_shard_bytes)
    self._max_shards = (None if max_shards is None or max_shards == 0 else
                        _positive_count("max_shards", max_shards))
    self._bytes_per_string = _positive_number("bytes_per_string", bytes_per_string)

  def __call__(self, shape, dtype, axis=0):
    shape, axis = _checked_shape(shape, axis, whole_shape_known=True)
    length = shape[axis]
    slice_bytes = (shape.num_elements() // length * _element_bytes(
        dtype, self._bytes_per_string)) if length else 0
    if slice_bytes == 0:
      return _partitions(shape, axis, 1)
    slices_per_shard = max(1, math.floor(self._max_shard_bytes / slice_bytes))
    shards = math.ceil(length / slices_per_shard)
    if self._max_shards is not None:
      shards = min(shards, self._max_shards)
    return _partitions(shape, axis, shards)


class _AxisError(ValueError, IndexError):
  """An axis out of range: TF's partitioners raise either class for it."""


def _checked_shape(shape, axis, whole_shape_known):
  """`shape` as a `tf.TensorShape` and `axis` as a non-negative index."""
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    raise ValueError(
        f"Cannot partition a variable of unknown rank: `shape` must have a "
        f"known rank. Received: shape={shape}")
  axis = operator.index(axis)
  if not -shape.rank <= axis < shape.rank:
    raise _AxisError(
        f"Cannot partition along axis {axis}: `shape` {shape} has "
        f"{shape.rank} axes. Received: axis={axis}")
  axis %= shape.rank
  if shape[axis] is None or (whole_shape_known and not shape.is_fully_defined()):
    needed = "fully defined" if whole_shape_known else f"known along axis {axis}"
    raise ValueError(
        f"Cannot partition a variable whose shape is not {needed}. Received: shape={shape}")
  return shape, axis


def _partitions(shape, axis, shards):
  """1 for every axis of `shape`, `shards` (at least 1) for `axis`."""
  partitions = [1] * shape.rank
  partitions[axis] = max(1, int(shards))
  return partitions


def _element_bytes(dtype, bytes_per_string):
  dtype = tf.as_dtype(dtype).base_dtype
  return bytes_per_string if dtype == tf.string else dtype.size


def _positive_number(name, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(
        f"Argument `{name}` must be a positive number. "
        f"Received: {name}={value!r} of type {type(value).__name__}")
  if value < 1:
    raise ValueError(f"Argument `{name}` must be positive. Received: {name}={value!r}")
  return value


def _positive_count(name, value):
  distribute_lib.check_count(value, name, 1)
  return int(value)
