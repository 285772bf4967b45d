"""TensorFlow features that meet distributed variables: random generators,
moving averages, control flow and loops over steps, compared with TF."""

import numpy as np
import pytest
import tensorflow as tf

from oracle import TF, TFD


@pytest.fixture(params=[TF, TFD], ids=lambda a: a.name)
def api(request):
  return request.param


def _local(strategy, value):
  return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def _per_api(make):
  """`make(api)` for TF and tfd: the results must be equal."""
  expected, actual = make(TF), make(TFD)
  for e, a in zip(expected, actual):
    np.testing.assert_allclose(a, e, rtol=1e-6)
  return actual


@pytest.mark.parametrize("in_function", [False, True])
def test_random_generator_in_scope_draws_like_tensorflow(in_function):
  def make(api):
    strategy = api.mirrored
    with strategy.scope():
      generator = tf.random.Generator.from_seed(7)
    run = lambda: strategy.run(lambda: generator.normal([3]))
    return _local(strategy, tf.function(run)() if in_function else run())
  draws = _per_api(make)
  assert not np.allclose(draws[0], draws[1])  # replicas draw different numbers


def test_exponential_moving_average_of_a_mirrored_variable(api):
  strategy = api.mirrored
  with strategy.scope():
    v = tf.Variable(2.0)
    ema = tf.train.ExponentialMovingAverage(0.5)
    ema.apply([v])
    v.assign(4.0)
    ema.apply([v])
    average = ema.average(v)
  assert type(average).__name__ == "MirroredVariable"
  assert [float(c) for c in average.values] == [3.0] * 4


def test_control_flow_reads_mirrored_variables(api):
  strategy = api.mirrored
  with strategy.scope():
    v = tf.Variable(2.0)
  branch = tf.function(lambda: tf.cond(v > 1.0, lambda: v * 2.0, lambda: v))
  loop = tf.function(lambda: tf.while_loop(lambda i: i < v, lambda i: i + 1.0, [0.0]))
  assert float(branch()) == 4.0
  assert float(loop()[0]) == 2.0


def test_all_reduce_inside_a_tf_range_loop(api):
  strategy = api.mirrored
  ctx = api.mod.get_replica_context

  @tf.function
  def total():
    result = tf.constant(0.0)
    for i in tf.range(3):
      per_replica = strategy.run(
          lambda: ctx().all_reduce("SUM", tf.cast(i, tf.float32)))
      result += strategy.reduce("SUM", per_replica, axis=None)
    return result
  # Each step: 4 replicas all-reduce i (4i), then reduce sums 4 copies: 16i.
  assert float(total()) == 16.0 * (0 + 1 + 2)
