"""Partitioners: into how many shards to split a variable, along one axis.

Parameter-server training asks a partitioner (its `variable_partitioner`)
how to shard each variable it creates. A partitioner is pure arithmetic on
the variable's shape and dtype: called with them, it returns one shard count
per axis, 1 on every axis but the one it splits.

Where TensorFlow 2.21 fails or answers 0 shards on a valid shape, these
answer one shard: an axis of length 0 (TF's `FixedShardsPartitioner` gives 0
shards, its `MaxSizePartitioner` divides by zero) and slices of 0 bytes
(a 0 in another axis, or a `resource` or `variant` dtype, where TF's
`MaxSizePartitioner` divides by zero). Bad arguments fail when the
partitioner is made or called, with a message naming them: `shape` may be a
`tf.TensorShape` or anything it accepts (TF wants a `tf.TensorShape`); an
unknown length that the answer needs raises `ValueError` (TF raises
`TypeError` from its arithmetic in some partitioners); an axis out of range
raises an error that is both a `ValueError` and an `IndexError`, the two
classes TF's partitioners raise for it.
"""

import math
import numbers
import operator

import tensorflow as tf

from tf_distribute_lite.tf_classes import StandsFor


class Partitioner(StandsFor, stands_for=tf.distribute.experimental.partitioners.Partitioner):
  """Base class of partitioners: called with a variable's `shape`, `dtype`
  and `axis`, a partitioner returns a list with the number of shards for
  each axis.

  >>> class OneShardPerRow(Partitioner):
  ...   def __call__(self, shape, dtype, axis=0):
  ...     partitions = [1] * shape.rank
  ...     partitions[axis] = shape[axis]
  ...     return partitions
  >>> OneShardPerRow()(tf.TensorShape([3, 2]), tf.float32)
  [3, 1]
  """

  def __call__(self, shape, dtype, axis=0):
    """The number of shards along each axis of `shape`: a list of ints.

    Args:
      shape: the variable's `tf.TensorShape`.
      dtype: the variable's `tf.dtypes.DType`.
      axis: the axis to split; the others get 1 shard.
    """
    raise NotImplementedError(
        f"{type(self).__name__} must implement "
        f"__call__(shape, dtype, axis=0), returning a shard count per axis.")


class FixedShardsPartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.FixedShardsPartitioner):
  """Splits `axis` into `num_shards` shards, or one per element if it is
  shorter.

  >>> partitioner = FixedShardsPartitioner(num_shards=2)
  >>> partitioner(tf.TensorShape([10, 3]), tf.float32)
  [2, 1]
  >>> partitioner(tf.TensorShape([1, 3]), tf.float32)
  [1, 1]

  Args:
    num_shards: a positive integer. TF 2.21 takes any value here and
      answers with it (0 shards, or 2.5).
  """

  def __init__(self, num_shards):
    self._num_shards = _positive_count("num_shards", num_shards)

  def __call__(self, shape, dtype, axis=0):
    del dtype  # Every element counts the same.
    shape, axis = _checked_shape(shape, axis, whole_shape_known=False)
    return _partitions(shape, axis, min(self._num_shards, shape[axis]))


class MinSizePartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.MinSizePartitioner):
  """As many shards as possible, up to `max_shards`, of at least about
  `min_shard_bytes` each.

  The count is `ceil(variable bytes / min_shard_bytes)`, capped by
  `max_shards` and the length of `axis`, as in TensorFlow; so a shard may be
  a little smaller than `min_shard_bytes`.

  >>> partitioner = MinSizePartitioner(min_shard_bytes=4, max_shards=2)
  >>> partitioner(tf.TensorShape([6, 1]), tf.float32)
  [2, 1]
  >>> partitioner = MinSizePartitioner(min_shard_bytes=4, max_shards=10)
  >>> partitioner(tf.TensorShape([6, 1]), tf.float32)
  [6, 1]
  >>> partitioner(tf.TensorShape([6, 1]), tf.string)  # 16 bytes a string
  [6, 1]

  Args:
    min_shard_bytes: the least number of bytes a shard should hold.
    max_shards: the most shards to make, a positive integer.
    bytes_per_string: the size assumed for each element of a `tf.string`
      variable.
  """

  def __init__(self, min_shard_bytes=256 << 10, max_shards=1,
               bytes_per_string=16):
    self._min_shard_bytes = _positive_number("min_shard_bytes", min_shard_bytes)
    self._max_shards = _positive_count("max_shards", max_shards)
    self._bytes_per_string = _positive_number("bytes_per_string",
                                              bytes_per_string)

  def __call__(self, shape, dtype, axis=0):
    shape, axis = _checked_shape(shape, axis, whole_shape_known=True)
    total_bytes = shape.num_elements() * _element_bytes(
        dtype, self._bytes_per_string)
    wanted = math.ceil(total_bytes / self._min_shard_bytes)
    return _partitions(shape, axis,
                       min(shape[axis], self._max_shards, wanted))


class MaxSizePartitioner(
    Partitioner, stands_for=tf.distribute.experimental.partitioners.MaxSizePartitioner):
  """As few shards as possible of at most `max_shard_bytes` each, but no
  more than `max_shards`.

  A shard holds whole slices along `axis`, at least one, so a slice larger
  than `max_shard_bytes` gets a shard of its own; with `max_shards` reached,
  shards may be larger.

  >>> MaxSizePartitioner(max_shard_bytes=4)(tf.TensorShape([6, 1]), tf.float32)
  [6, 1]
  >>> MaxSizePartitioner(max_shard_bytes=4, max_shards=2)(
  ...     tf.TensorShape([6, 1]), tf.float32)
  [2, 1]
  >>> MaxSizePartitioner(max_shard_bytes=1024)(
  ...     tf.TensorShape([6, 1]), tf.float32)
  [1, 1]

  Args:
    max_shard_bytes: the most bytes a shard should hold.
    max_shards: the most shards to make; None or 0 for no limit.
    bytes_per_string: the size assumed for each element of a `tf.string`
      variable.
  """

  def __init__(self, max_shard_bytes, max_shards=None, bytes_per_string=16):
    self._max_shard_bytes = _positive_number("max_shard_bytes", max_shard_bytes)
    self._max_shards = (None if max_shards is None or max_shards == 0 else
                        _positive_count("max_shards", max_shards))
    self._bytes_per_string = _positive_number("bytes_per_string",
                                              bytes_per_string)

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
  """`shape` as a `tf.TensorShape` and `axis` as a non-negative index, once
  the lengths the answer needs are known."""
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
  if shape[axis] is None or (whole_shape_known and
                             not shape.is_fully_defined()):
    needed = "fully defined" if whole_shape_known else f"known along axis {axis}"
    raise ValueError(
        f"Cannot partition a variable whose shape is not {needed}. "
        f"Received: shape={shape}")
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
    raise ValueError(
        f"Argument `{name}` must be positive. Received: {name}={value!r}")
  return value


def _positive_count(name, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f"Argument `{name}` must be a positive integer. "
        f"Received: {name}={value!r} of type {type(value).__name__}")
  if value < 1:
    raise ValueError(
        f"Argument `{name}` must be positive. Received: {name}={value!r}")
  return int(value)
