"""`ReduceOp`, compared with `tf.distribute.ReduceOp`."""

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

OPS = ("SUM", "MEAN")


@pytest.mark.parametrize("name", OPS)
def test_equal_to_tensorflows_member_of_the_same_name(name):
  ours, theirs = getattr(tfd.ReduceOp, name), getattr(tf.distribute.ReduceOp, name)
  others = [getattr(tf.distribute.ReduceOp, o) for o in OPS if o != name]
  assert ours == theirs and theirs == ours and not ours != theirs
  assert hash(ours) == hash(theirs) and {theirs: name}[ours] == name
  assert all(ours != other and other != ours for other in others)
  assert ours != name  # as TensorFlow's: a member is not its string


@pytest.mark.parametrize("name", OPS)
def test_replica_context_of_the_default_strategy_takes_our_ops(name):
  """Outside every scope, `run` gives TensorFlow's replica context (what
  Keras expects there); it takes our `ReduceOp` as TensorFlow's."""
  def snippet(mod):
    def all_reduce():
      return mod.get_replica_context().all_reduce(getattr(mod.ReduceOp, name), tf.constant(3.0))
    outside = all_reduce()
    inside = mod.get_strategy().run(all_reduce)
    in_function = tf.function(lambda: mod.get_strategy().run(all_reduce))()
    return [float(outside), float(inside), float(in_function)]
  assert snippet(tfd) == snippet(tf.distribute) == [3.0, 3.0, 3.0]
