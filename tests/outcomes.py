"""Comparing what a call gives under TensorFlow's classes and under ours."""

import tensorflow as tf


def outcome(call):
  """What `call()` returns (a cluster spec as its dict), or the class of
  the exception it raises."""
  try:
    result = call()
  except Exception as e:  # pylint: disable=broad-except
    return type(e)
  return result.as_dict() if isinstance(result, tf.train.ClusterSpec) else result


def same(call, theirs, ours):
  """Asserts `call(theirs)` and `call(ours)` have the same outcome; returns it."""
  expected, actual = outcome(lambda: call(theirs)), outcome(lambda: call(ours))
  assert actual == expected
  return actual
