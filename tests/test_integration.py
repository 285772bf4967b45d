"""TensorFlow features that meet distributed variables: random generators,
moving averages, control flow and loops over steps, compared with TF."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import executors

import oracle
from oracle import TF, TFD
import strategies


@pytest.fixture(params=[TF, TFD], ids=lambda a: a.name)
def api(request):
  return request.param


def _local(strategy, value):
  return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def _per_api(make):
  """`oracle.compare` of `make(api)` with TF and tfd, to 1e-6; tfd's outcome."""
  return oracle.compare(make, (TF,), (TFD,), alike=oracle.close(1e-6), ours=True)


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


# --- TensorFlow's moving-average helper under every strategy.
# `tf.__internal__.train.assign_moving_average` (under
# `tf.train.ExponentialMovingAverage` and `tf_keras.backend.
# moving_average_update`) reads TensorFlow's update context: inside
# `extended.update` it updates the component being updated, else it calls
# `extended.update` itself.

# The strategies of tests/strategies.py whose updates are compared, each
# made once.
UPDATE_STRATEGIES = ["mirrored_pair", "one_device", "central_storage_pair", "multi_worker", "tpu"]
_names = itertools.count()


def _update_strategy(kind, api):
  return strategies.shared(kind, ours=api is TFD)


def _variable(strategy):
  # Zero-debiasing makes variables named after this one in TF's variable
  # store, which outlives the test: every variable gets its own name.
  with strategy.scope():
    return tf.Variable([1.0, 2.0], name=f"average_{next(_names)}")


def _average_in_update(api, strategy, run, zero_debias):
  v = _variable(strategy)

  def fn(unused_component, value):
    return tf.__internal__.train.assign_moving_average(v, value, 0.5, zero_debias=zero_debias)
  run(lambda: strategy.extended.update(v, fn, args=(tf.constant([2.0, 4.0]),)))
  return _local(strategy, v)


def _average_in_update_non_slot(api, strategy, run, zero_debias):
  v = _variable(strategy)

  def fn():
    return tf.__internal__.train.assign_moving_average(
        v, tf.constant([2.0, 4.0]), 0.5, zero_debias=zero_debias)
  run(lambda: strategy.extended.update_non_slot(strategy.extended.non_slot_devices([v]), fn))
  return _local(strategy, v)


def _average_in_replicas(api, strategy, run, zero_debias):
  v = _variable(strategy)

  def step():
    i = api.replica_id()
    tf.__internal__.train.assign_moving_average(v, tf.stack([i, 2.0 * i]), 0.5,
                                                zero_debias=zero_debias)
  run(lambda: strategy.run(step))
  return _local(strategy, v)


def _exponential_moving_average(api, strategy, run, zero_debias):
  v = _variable(strategy)
  with strategy.scope():
    ema = tf.train.ExponentialMovingAverage(0.5, zero_debias=zero_debias)
    ema.apply([v])

  def step():
    v.assign([3.0, 6.0])
    ema.apply([v])
  with strategy.scope():
    run(step)
  return _local(strategy, ema.average(v))


def _exponential_moving_average_in_replicas(api, strategy, run, zero_debias):
  v = _variable(strategy)
  with strategy.scope():
    ema = tf.train.ExponentialMovingAverage(0.5, zero_debias=zero_debias)
    ema.apply([v])
    v.assign([3.0, 6.0])

  def step():
    ema.apply([v])
  run(lambda: strategy.run(step))
  return _local(strategy, ema.average(v))


def _tf_keras_moving_average_update(api, strategy, run, zero_debias):
  del zero_debias  # tf_keras always debiases
  import tf_keras  # pylint: disable=g-import-not-at-top
  v = _variable(strategy)

  def step():
    tf_keras.backend.moving_average_update(v, tf.constant([2.0, 4.0]), 0.5)
  if isinstance(strategy, (tf.distribute.experimental.CentralStorageStrategy,
                           tfd.experimental.CentralStorageStrategy)):
    # In a replica both refuse to update a variable without aggregation.
    with strategy.scope():
      run(step)
  else:
    run(lambda: strategy.run(step))
  return _local(strategy, v)


def _allow_eager_tpu_steps(monkeypatch):
  """The "eager" runs take the emulated TPU's debugging option: a TPU refuses
  an eager step."""
  monkeypatch.setenv(executors.EAGER_RUN_VARIABLE, "1")


@pytest.mark.parametrize("zero_debias", [False, True], ids=["biased", "zero_debias"])
@pytest.mark.parametrize("snippet", [
    _average_in_update, _average_in_update_non_slot, _average_in_replicas,
    _exponential_moving_average, _exponential_moving_average_in_replicas,
    _tf_keras_moving_average_update], ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize("kind", UPDATE_STRATEGIES)
def test_moving_averages_like_tensorflow(kind, snippet, zero_debias, run_mode,
                                        monkeypatch):
  """TF updates each component once; before tfd shared TF's update context,
  an average inside `extended.update` was updated once per device, and
  zero-debiasing in a graph failed with "Duplicate node name"."""
  _allow_eager_tpu_steps(monkeypatch)
  if snippet is _tf_keras_moving_average_update and zero_debias:
    pytest.skip("tf_keras always debiases")
  # Zero-debiasing makes its variables with `get_variable`; a `tf.function`
  # traces twice on its first call and gets them again only where the
  # variable scope reuses variables, as every scope entered eagerly does
  # (TensorFlow's root scope does not if a function made it first).
  def alike(expected, actual):
    if kind == "tpu":  # 4 replicas, each with TF's value
      expected = expected[:1] * 4
    return oracle.close(1e-6)(expected, actual)
  with tf.compat.v1.variable_scope("moving_averages"):
    oracle.compare(lambda api: snippet(api, _update_strategy(kind, api), run_mode, zero_debias),
                   (TF,), (TFD,), alike=alike)


@pytest.mark.parametrize("kind", UPDATE_STRATEGIES)
def test_tf_keras_batch_normalization_statistics_like_tensorflow(kind, run_mode, monkeypatch):
  import tf_keras  # pylint: disable=g-import-not-at-top
  _allow_eager_tpu_steps(monkeypatch)

  def statistics(api):
    strategy = _update_strategy(kind, api)
    with strategy.scope():
      layer = tf_keras.layers.BatchNormalization(momentum=0.5)
      layer.build([None, 2])

    def step():
      i = api.replica_id()
      layer(tf.stack([[i, 1.0], [2.0 * i, 3.0]]), training=True)
    run_mode(lambda: strategy.run(step))
    return [_local(strategy, w) for w in (layer.moving_mean, layer.moving_variance)]
  oracle.compare(statistics, (TF,), (TFD,), alike=oracle.close(1e-6))
