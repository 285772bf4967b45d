"""Keras optimizers with weight decay or a moving average (EMA) under
`tfd.MirroredStrategy`: equal to `tf.distribute` eagerly, and to training
without a strategy inside a `tf.function`.

Both features make Keras all-reduce or update values that every replica
shares, which relies on batch reduction treating such a value as already in
sync.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

import tf_distribute_lite as tfd

import oracle

OPTIMIZERS = ["SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad",
              "Adadelta", "Ftrl", "Lion", "Lamb", "Adafactor", "Muon",
              "ScheduleFreeAdamW"]
FEATURES = {
    "weight_decay": dict(weight_decay=0.1),
    "ema": dict(use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=2),
    "both": dict(weight_decay=0.05, use_ema=True, ema_overwrite_frequency=3),
}
INITIAL = [[3.0, 4.0], [5.0, 6.0]]
STEPS = 3


def _train(strategy, optimizer_name, feature, gradient, use_function):
  with strategy.scope():
    variable = keras.Variable(INITIAL)
    optimizer = getattr(keras.optimizers, optimizer_name)(
        learning_rate=0.5, **FEATURES[feature])
    optimizer.build([variable])

  def step(g):
    strategy.run(lambda g: optimizer.apply_gradients([(g, variable)]), args=(g,))
  step = tf.function(step) if use_function else step
  for _ in range(STEPS):
    step(gradient)
  return variable.numpy()


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("optimizer_name", OPTIMIZERS)
def test_shared_gradient_matches_tf_eagerly(optimizer_name, feature):
  gradient = tf.constant([[1.0, -2.0], [0.5, 3.0]])
  expected = _train(oracle.new_tf_mirrored(["CPU:0", "CPU:1"]), optimizer_name,
                    feature, gradient, use_function=False)
  actual = _train(tfd.MirroredStrategy(["CPU:0", "CPU:1"]), optimizer_name,
                  feature, gradient, use_function=False)
  np.testing.assert_allclose(actual, expected, rtol=1e-5)
  # The shared gradient counts once, as without a strategy.
  plain = _train(tf.distribute.get_strategy(), optimizer_name, feature,
                 gradient, use_function=False)
  np.testing.assert_allclose(actual, plain, rtol=1e-5)


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("optimizer_name", ["SGD", "AdamW", "RMSprop"])
def test_split_gradient_in_a_function_matches_training_without_strategy(
    optimizer_name, feature):
  # TF 2.21 fails here with EMA overwriting ("merge_call called while
  # defining a new graph"), so the reference is training without a strategy.
  full = tf.constant([[1.0, -2.0], [0.5, 3.0]])
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  halves = strategy.experimental_distribute_values_from_function(
      lambda context: full / 2.0)
  actual = _train(strategy, optimizer_name, feature, halves, use_function=True)
  plain = _train(tf.distribute.get_strategy(), optimizer_name, feature, full,
                 use_function=True)
  np.testing.assert_allclose(actual, plain, rtol=1e-5)


def test_issue_numbers_for_sgd():
  """The values TF 2.21 gives for SGD(learning_rate=1) and a ones gradient."""
  for kwargs, expected in [
      (dict(use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=3),
       [[1.71, 2.71], [3.71, 4.71]]),
      (dict(weight_decay=0.1), [[-0.523, 0.206], [0.935, 1.664]])]:
    strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
    with strategy.scope():
      v = keras.Variable(INITIAL)
      opt = keras.optimizers.SGD(learning_rate=1.0, **kwargs)
    g = tf.ones([2, 2])
    for _ in range(3):
      strategy.run(lambda: opt.apply_gradients([(g, v)]))  # pylint: disable=cell-var-from-loop
    np.testing.assert_allclose(v.numpy(), expected, atol=1e-3)


def _train_loss_scaled(strategy, gradients):
  """Adam in a LossScaleOptimizer, one `tf.function` step per gradient: the
  variable, the loss scale and the steps applied."""
  with strategy.scope():
    variable = keras.Variable(INITIAL)
    optimizer = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.Adam(learning_rate=0.5), initial_scale=4.0,
        dynamic_growth_steps=2)

  @tf.function
  def step(g):
    strategy.run(lambda g: optimizer.apply_gradients([(g, variable)]), args=(g,))
  for gradient in gradients:
    step(gradient)
  return (variable.numpy(), float(optimizer.dynamic_scale.numpy()),
          int(optimizer.iterations.numpy()))


def test_loss_scale_optimizer_in_a_function_matches_tf():
  """The loss scale grows after 2 finite steps and halves at a non-finite
  one, whose update is skipped, as under TF and without a strategy."""
  finite = tf.constant([[4.0, -8.0], [2.0, 12.0]])
  infinite = tf.constant([[np.inf, 1.0], [1.0, 1.0]])
  gradients = [finite, finite, infinite, finite]
  actual = _train_loss_scaled(tfd.MirroredStrategy(["CPU:0", "CPU:1"]), gradients)
  for reference in [oracle.new_tf_mirrored(["CPU:0", "CPU:1"]),
                    tf.distribute.get_strategy()]:
    expected = _train_loss_scaled(reference, gradients)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5)
    assert actual[1:] == expected[1:]
  assert actual[1:] == (4.0, 3)
  assert not np.allclose(actual[0], INITIAL)


def _train_accumulating(strategy, use_function):
  """SGD accumulating 2 steps' gradients, in 4 steps."""
  with strategy.scope():
    variable = keras.Variable(INITIAL)
    optimizer = keras.optimizers.SGD(learning_rate=0.5,
                                     gradient_accumulation_steps=2)
    optimizer.build([variable])

  def step(g):
    strategy.run(lambda g: optimizer.apply_gradients([(g, variable)]), args=(g,))
  step = tf.function(step) if use_function else step
  for scale in [1.0, 2.0, 3.0, 4.0]:
    step(tf.constant([[1.0, -2.0], [0.5, 3.0]]) * scale)
  return variable.numpy()


def test_gradient_accumulation_matches_tf():
  """Eagerly the same numbers; in a function the same RuntimeError, as each
  replica all-reduces inside a `tf.cond` branch of its own."""
  expected = _train_accumulating(oracle.new_tf_mirrored(["CPU:0", "CPU:1"]), False)
  actual = _train_accumulating(tfd.MirroredStrategy(["CPU:0", "CPU:1"]), False)
  np.testing.assert_allclose(actual, expected, rtol=1e-5)
  assert not np.allclose(actual, INITIAL)
  for strategy in [oracle.new_tf_mirrored(["CPU:0", "CPU:1"]),
                   tfd.MirroredStrategy(["CPU:0", "CPU:1"])]:
    with pytest.raises(RuntimeError, match="`merge_call` called while defining"):
      _train_accumulating(strategy, True)


class _TensorFlowsPerReplica(tf_values.DistributedValues):
  """Gradients of TensorFlow's own per-replica kind."""

  @property
  def values(self):
    return self._values


def test_per_replica_gradients_of_tensorflows_kind_match_tf():
  """Keras 3 sums the replicas' own gradients (1 and 2) into each copy, as
  under TF: `run` hands each replica its component."""
  def snippet(module):
    strategy = oracle.new_mirrored(module, ["CPU:0", "CPU:1"])
    with strategy.scope():
      v = keras.Variable([0.0, 0.0])
      optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def optimize():
      gradients = _TensorFlowsPerReplica([tf.fill([2], 1.0), tf.fill([2], 2.0)])

      def step_fn(g):
        optimizer.apply_gradients([(g, v)])
        return tf.identity(v.value)
      return strategy.experimental_local_results(strategy.run(step_fn, args=(gradients,)))
    return np.asarray(optimize()).tolist()
  np.testing.assert_allclose(oracle.compare(snippet, (tf.distribute,), (tfd,)),
                             [[-0.3, -0.3]] * 2, rtol=1e-6)
