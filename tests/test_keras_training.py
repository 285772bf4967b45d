"""A Keras 3 custom training loop under `tfd.MirroredStrategy`, step for step
equal to the same loop under `tf.distribute.MirroredStrategy`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from conftest import DEVICES
import oracle
from keras_models import classification_data
from keras_models import classifier
from keras_models import initial_weights
from keras_models import NUM_CLASSES
from keras_models import NUM_FEATURES
from keras_models import TOLERANCE

GLOBAL_BATCH = 16
NUM_STEPS = 5


def _make_optimizer(name):
  if name == "sgd":
    return keras.optimizers.SGD(learning_rate=0.1)
  return keras.optimizers.Adam(learning_rate=0.01)


def _unbuilt_classifier():
  """`classifier()` that creates its weights when first called."""
  initializers = [keras.initializers.Constant(w) for w in initial_weights()]
  return keras.Sequential([
      keras.layers.Dense(8, activation="relu", kernel_initializer=initializers[0],
                         bias_initializer=initializers[1]),
      keras.layers.Dense(NUM_CLASSES, kernel_initializer=initializers[2],
                         bias_initializer=initializers[3])])


class _Trainer:
  """Model, optimizer, metrics and step function built in `strategy.scope()`."""

  def __init__(self, strategy, optimizer_name, use_function=True, lazy=False):
    """With `lazy` the model and optimizer create their variables in the
    first step, as in the "Custom training" tutorial."""
    self.strategy = strategy
    with strategy.scope():
      self.model = _unbuilt_classifier() if lazy else classifier()
      self.optimizer = _make_optimizer(optimizer_name)
      if not lazy:
        # Slot variables up front: TF cannot create them inside a tf.function.
        self.optimizer.build(self.model.trainable_variables)
      self.loss_metric = keras.metrics.Mean(name="loss")
      self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    self.loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None)
    self.step = tf.function(self._step) if use_function else self._step

  def _replica_step(self, x, y):
    with tf.GradientTape() as tape:
      logits = self.model(x, training=True)
      per_example_loss = self.loss_fn(y, logits)
      loss = tf.nn.compute_average_loss(per_example_loss,
                                        global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, self.model.trainable_variables)
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
    self.loss_metric.update_state(per_example_loss)
    self.accuracy.update_state(y, logits)
    return loss

  def _step(self, x, y):
    per_replica_loss = self.strategy.run(self._replica_step, args=(x, y))
    return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss,
                                axis=None)

  def distribute(self, batch):
    """`batch` split into equal consecutive slices, one per replica."""
    def value_fn(ctx):
      n = GLOBAL_BATCH // ctx.num_replicas_in_sync
      start = ctx.replica_id_in_sync_group * n
      return tf.constant(batch[start:start + n])
    return self.strategy.experimental_distribute_values_from_function(value_fn)

  def train(self, num_steps):
    """Runs `num_steps` steps; returns the loss of each step."""
    x, y = classification_data(num_steps, GLOBAL_BATCH)
    losses = []
    for i in range(num_steps):
      loss = self.step(self.distribute(x[i]), self.distribute(y[i]))
      losses.append(float(loss))
    return losses

  def component_weights(self):
    """Per weight, the numpy value of each of its mirrored components."""
    return [[c.numpy() for c in self.strategy.experimental_local_results(w.value)]
            for w in self.model.trainable_variables]


def _reference_losses_and_weights(optimizer_name, num_steps):
  """The same training on one device, with the whole batch: ground truth."""
  model = classifier()
  optimizer = _make_optimizer(optimizer_name)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y = classification_data(num_steps, GLOBAL_BATCH)
  losses = []
  for i in range(num_steps):
    with tf.GradientTape() as tape:
      loss = loss_fn(y[i], model(x[i], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    losses.append(float(loss))
  return losses, [w.numpy() for w in model.trainable_variables]


@pytest.fixture(scope="module")
def tf_strategy():
  """TF's MirroredStrategy on the 4 devices, reducing on one device."""
  return oracle.new_tf_mirrored(list(DEVICES))


def _assert_weights_close(actual, expected):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_training_loop_matches_tf_distribute(optimizer_name, tf_strategy):
  """Losses, metrics and weights after 5 tf.function steps equal TF's."""
  ours = _Trainer(tfd.MirroredStrategy(), optimizer_name)
  theirs = _Trainer(tf_strategy, optimizer_name)
  assert ours.strategy.num_replicas_in_sync == 4

  our_losses = ours.train(NUM_STEPS)
  their_losses = theirs.train(NUM_STEPS)

  np.testing.assert_allclose(our_losses, their_losses, atol=TOLERANCE)
  assert len(set(np.round(our_losses, 4))) == NUM_STEPS  # The model learns.
  for ours_metric, theirs_metric in [(ours.loss_metric, theirs.loss_metric),
                                     (ours.accuracy, theirs.accuracy)]:
    np.testing.assert_allclose(float(ours_metric.result()),
                               float(theirs_metric.result()), atol=TOLERANCE)
  np.testing.assert_allclose(float(ours.loss_metric.result()),
                             np.mean(our_losses), atol=TOLERANCE)
  _assert_weights_close([w.numpy() for w in ours.model.trainable_variables],
                        [w.numpy() for w in theirs.model.trainable_variables])
  assert int(ours.optimizer.iterations.numpy()) == NUM_STEPS
  assert int(theirs.optimizer.iterations.numpy()) == NUM_STEPS


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_training_loop_matches_single_device_training(optimizer_name):
  """4 replicas on 4 slices of a batch train as one device on the batch."""
  ours = _Trainer(tfd.MirroredStrategy(), optimizer_name)
  losses = ours.train(NUM_STEPS)
  expected_losses, expected_weights = _reference_losses_and_weights(
      optimizer_name, NUM_STEPS)
  np.testing.assert_allclose(losses, expected_losses, atol=TOLERANCE)
  _assert_weights_close([w.numpy() for w in ours.model.trainable_variables],
                        expected_weights)


def _reference_on_slice(x, y):
  """Weights after one SGD step on `x` alone, scaled as one replica of four."""
  model = classifier()
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=None)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(loss_fn(y, model(x))) / GLOBAL_BATCH
  grads = tape.gradient(loss, model.trainable_variables)
  keras.optimizers.SGD(learning_rate=0.1).apply_gradients(
      zip(grads, model.trainable_variables))
  return [w.numpy() for w in model.trainable_variables]


def test_gradients_are_all_reduced_across_replicas(tf_strategy):
  """Replicas see different data, yet every weight's components stay equal."""
  ours = _Trainer(tfd.MirroredStrategy(), "sgd")
  theirs = _Trainer(tf_strategy, "sgd")
  x, y = classification_data(1, GLOBAL_BATCH)
  slices = [x[0][i * 4:(i + 1) * 4] for i in range(4)]
  assert not any(np.allclose(slices[0], s) for s in slices[1:])

  ours.train(1)
  theirs.train(1)

  initial = initial_weights()
  their_weights = [w.numpy() for w in theirs.model.trainable_variables]
  for components, expected, start in zip(ours.component_weights(),
                                         their_weights, initial):
    assert len(components) == 4
    for component in components:
      np.testing.assert_allclose(component, expected, atol=TOLERANCE)
    assert not np.allclose(components[0], start)
  devices = [[c.device for c in ours.strategy.experimental_local_results(w.value)]
             for w in ours.model.trainable_variables]
  assert all(tuple(d) == DEVICES for d in devices)

  # Without the all-reduce, replica 0 would have stepped on its slice only.
  replica_0_alone = _reference_on_slice(x[0][:4], y[0][:4])
  assert not all(np.allclose(c[0], w, atol=TOLERANCE)
                 for c, w in zip(ours.component_weights(), replica_0_alone))


def test_keras_sees_our_strategy_inside_the_step():
  """Keras optimizers and tf.distribute find the strategy in every context."""
  strategy = tfd.MirroredStrategy()
  with strategy.scope():
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    assert tf.distribute.get_strategy() is strategy
  seen = []

  @tf.function
  def step():
    def replica_fn():
      seen.append(tf.distribute.get_strategy())
      return tf.distribute.get_replica_context().num_replicas_in_sync
    return strategy.run(replica_fn)

  step()
  assert seen and all(s is strategy for s in seen)
  assert optimizer._distribution_strategy is strategy  # pylint: disable=protected-access


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_eager_training_loop_matches_tf_distribute(optimizer_name, tf_strategy):
  """Without tf.function, 2 steps still match TF step for step."""
  ours = _Trainer(tfd.MirroredStrategy(), optimizer_name, use_function=False)
  theirs = _Trainer(tf_strategy, optimizer_name, use_function=False)
  np.testing.assert_allclose(ours.train(2), theirs.train(2), atol=TOLERANCE)
  np.testing.assert_allclose(float(ours.accuracy.result()),
                             float(theirs.accuracy.result()), atol=TOLERANCE)
  np.testing.assert_allclose(float(ours.loss_metric.result()),
                             float(theirs.loss_metric.result()), atol=TOLERANCE)
  _assert_weights_close([w.numpy() for w in ours.model.trainable_variables],
                        [w.numpy() for w in theirs.model.trainable_variables])
  for components in ours.component_weights():
    for component in components[1:]:
      np.testing.assert_allclose(component, components[0], atol=TOLERANCE)


def test_model_and_optimizer_built_inside_the_first_step():
  """The model and Adam create their variables in the first tf.function step
  (TF 2.21 fails there: "You must feed a value for placeholder"); training
  still equals one device, and every weight's components stay equal."""
  trainer = _Trainer(tfd.MirroredStrategy(), "adam", lazy=True)
  assert not trainer.model.built and not trainer.optimizer.built

  losses = trainer.train(NUM_STEPS)

  expected_losses, expected_weights = _reference_losses_and_weights("adam", NUM_STEPS)
  np.testing.assert_allclose(losses, expected_losses, atol=TOLERANCE)
  _assert_weights_close([w.numpy() for w in trainer.model.trainable_variables],
                        expected_weights)
  for components in trainer.component_weights():
    for component in components[1:]:
      np.testing.assert_allclose(component, components[0], atol=TOLERANCE)
