"""`ReduceOp`: how values from several replicas combine into one."""

import enum

import tensorflow as tf


class ReduceOp(enum.Enum):
  """How per-replica values are reduced: `SUM` or `MEAN` (TF's and "SUM" too).

  >>> ReduceOp.from_any("mean")
  <ReduceOp.MEAN: 'MEAN'>
  """
  SUM = "SUM"
  MEAN = "MEAN"

  def __eq__(self, other):
    # Equal to TensorFlow's member of the same name, from either side.
    if isinstance(other, enum.Enum) and type(other).__name__ == "ReduceOp":
      return self.value == other.value
    return NotImplemented

  __hash__ = enum.Enum.__hash__  # the name's hash, as TensorFlow's members

  @staticmethod
  def from_variable_aggregation(aggregation):
    """The reduce op matching a `tf.VariableAggregation` (SUM or MEAN)."""
    by_aggregation = {tf.VariableAggregation.SUM: ReduceOp.SUM,
                      tf.VariableAggregation.MEAN: ReduceOp.MEAN}
    if aggregation not in by_aggregation:
      raise ValueError(
          f"Could not convert from `tf.VariableAggregation` {aggregation} to "
          f"`tf.distribute.ReduceOp`: only SUM and MEAN have one.")
    return by_aggregation[aggregation]

  @staticmethod
  def from_any(reduce_op):
    """Our `ReduceOp` for ours, TensorFlow's, or a string, else `ValueError`.

    >>> ReduceOp.from_any("max")
    Traceback (most recent call last):
      ...
    ValueError: 'MAX' is not a valid ReduceOp: use tf.distribute.ReduceOp.SUM or MEAN (or the string 'SUM' or 'MEAN').
    """
    if isinstance(reduce_op, ReduceOp):
      return reduce_op
    if isinstance(reduce_op, enum.Enum) and type(reduce_op).__name__ == "ReduceOp":
      reduce_op = reduce_op.value  # TensorFlow's own tf.distribute.ReduceOp
    if isinstance(reduce_op, str):
      if reduce_op.upper() in ReduceOp.__members__:
        return ReduceOp[reduce_op.upper()]
      raise ValueError(
          f"{reduce_op.upper()!r} is not a valid ReduceOp: use "
          f"tf.distribute.ReduceOp.SUM or MEAN (or the string 'SUM' or 'MEAN').")
    raise ValueError(
        f"`reduce_op` must be tf.distribute.ReduceOp.SUM or MEAN (or the "
        f"string 'SUM' or 'MEAN'); got {reduce_op!r}.")
