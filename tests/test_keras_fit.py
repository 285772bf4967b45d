"""Keras 3 `fit`, `evaluate` and `predict` of a model compiled under
`tfd.MirroredStrategy` equal the same calls under
`tf.distribute.MirroredStrategy`."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from conftest import DEVICES
import oracle
from keras_models import initial_weights
from keras_models import NUM_CLASSES
from keras_models import NUM_FEATURES
from keras_models import TOLERANCE

GLOBAL_BATCH = 16
NUM_EPOCHS = 2
FULL_BATCHES = 64  # 4 global batches of 16.
PARTIAL_BATCH = 70  # 4 global batches of 16 and one of 6.

# What one run gave: the strategy the model was made under, the model, its
# `fit` history, weights and optimizer steps, then
# `evaluate` and `predict` on the examples it was fitted on, and `predict` on
# 3 examples, fewer than the 4 replicas.
_Result = collections.namedtuple(
    "_Result", ["strategy", "model", "history", "weights", "iterations",
                "evaluation", "predictions", "few_predictions"])

_results = {}
_models = {}


def _data(num_examples):
  """The first `num_examples` of 70 fixed examples: features and labels."""
  rng = np.random.RandomState(7)
  x = rng.normal(size=(PARTIAL_BATCH, NUM_FEATURES)).astype(np.float32)
  y = rng.randint(0, NUM_CLASSES, size=(PARTIAL_BATCH,)).astype(np.int32)
  return x[:num_examples], y[:num_examples]


def _make_model(strategy, steps_per_execution=1):
  """Dense(8, relu) -> Dense(3) with Adam, made and compiled in the scope."""
  with strategy.scope():
    model = keras.Sequential([
        keras.Input(shape=(NUM_FEATURES,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(NUM_CLASSES)])
    model.set_weights(initial_weights())
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution)
    model.optimizer.build(model.trainable_variables)
  return model


def _initial_model(module, steps_per_execution):
  """The strategy and model of `module` and `steps_per_execution`.

  The model is in its initial state.

  Tracing `fit` is slow, TF's above all, so each model is made once, and
  every further run resets its weights and optimizer state.
  """
  key = (module.__name__, steps_per_execution)
  if key not in _models:
    strategy = (oracle.tf_mirrored() if module is tf.distribute
                else tfd.MirroredStrategy())
    model = _make_model(strategy, steps_per_execution)
    _models[key] = (strategy, model,
                    [v.numpy() for v in model.optimizer.variables])
  strategy, model, optimizer_state = _models[key]
  model.set_weights(initial_weights())
  for variable, value in zip(model.optimizer.variables, optimizer_state):
    variable.assign(value)
  return strategy, model


def _fit(model, source, num_examples):
  """`model.fit` on a batched `tf.data.Dataset` or on numpy arrays."""
  x, y = _data(num_examples)
  if source == "dataset":
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    history = model.fit(dataset, epochs=NUM_EPOCHS, shuffle=False, verbose=0)
  else:
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=NUM_EPOCHS,
                        shuffle=False, verbose=0)
  return history.history


def _run(module, source, num_examples, steps_per_execution=1):
  """Fits, then evaluates and predicts, once per set of arguments.

  Runs on numpy arrays with one step per call only fit: the tests evaluate
  and predict after fitting on the dataset. Only runs on the partial batch
  predict on 3 examples.
  """
  key = (module.__name__, source, num_examples, steps_per_execution)
  if key not in _results:
    assert module is tfd or steps_per_execution == 1
    strategy, model = _initial_model(module, steps_per_execution)
    history = _fit(model, source, num_examples)
    weights = model.get_weights()
    iterations = int(model.optimizer.iterations.numpy())
    evaluation = predictions = few_predictions = None
    x, y = _data(num_examples)
    if source == "dataset" or steps_per_execution > 1:
      evaluation = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
      predictions = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    if num_examples == PARTIAL_BATCH and evaluation is not None:
      few_predictions = model.predict(x[:3], batch_size=GLOBAL_BATCH,
                                      verbose=0)
    _results[key] = _Result(strategy, model, history, weights, iterations,
                            evaluation, predictions, few_predictions)
  return _results[key]


def _assert_history_close(actual, expected):
  assert sorted(actual) == sorted(expected) == ["accuracy", "loss"]
  for name in expected:
    assert len(actual[name]) == len(expected[name]) == NUM_EPOCHS
    np.testing.assert_allclose(actual[name], expected[name], atol=TOLERANCE,
                               err_msg=name)


def _assert_weights_close(actual, expected):
  assert len(actual) == len(expected) == 4
  for a, e in zip(actual, expected):
    assert a.shape == e.shape
    np.testing.assert_allclose(a, e, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("source,num_examples", [
    ("dataset", FULL_BATCHES), ("numpy", FULL_BATCHES),
    ("dataset", PARTIAL_BATCH)])
def test_fit_matches_tf_distribute(source, num_examples):
  """Per-epoch loss and accuracy and the final weights equal TF's."""
  ours = _run(tfd, source, num_examples)
  theirs = _run(tf.distribute, source, num_examples)
  _assert_history_close(ours.history, theirs.history)
  _assert_weights_close(ours.weights, theirs.weights)
  steps_per_epoch = -(-num_examples // GLOBAL_BATCH)
  assert ours.iterations == theirs.iterations == NUM_EPOCHS * steps_per_epoch
  # The model learns, and the second epoch sees the first epoch's weights.
  assert ours.history["loss"][1] < ours.history["loss"][0]
  assert not any(np.allclose(w, w0) for w, w0 in
                 zip(ours.weights, initial_weights()))


@pytest.mark.parametrize("num_examples", [FULL_BATCHES, PARTIAL_BATCH])
def test_fit_on_numpy_equals_fit_on_dataset(num_examples):
  """Numpy arrays with shuffle=False are batched as the dataset is, as in TF.

  So runs on numpy arrays may be checked against TF's run on the dataset.
  """
  on_numpy = _run(tfd, "numpy", num_examples)
  on_dataset = _run(tfd, "dataset", num_examples)
  _assert_history_close(on_numpy.history, on_dataset.history)
  _assert_weights_close(on_numpy.weights, on_dataset.weights)
  if num_examples == FULL_BATCHES:
    tf_on_numpy = _run(tf.distribute, "numpy", num_examples)
    tf_on_dataset = _run(tf.distribute, "dataset", num_examples)
    _assert_history_close(tf_on_numpy.history, tf_on_dataset.history)
    _assert_weights_close(tf_on_numpy.weights, tf_on_dataset.weights)


def test_partial_last_batch_counts_every_example():
  """The 6 examples of the last batch change the history and the weights."""
  full = _run(tfd, "dataset", FULL_BATCHES)
  partial = _run(tfd, "dataset", PARTIAL_BATCH)
  assert not np.allclose(full.history["loss"], partial.history["loss"])
  assert not np.allclose(full.weights[0], partial.weights[0])


@pytest.mark.parametrize("num_examples", [FULL_BATCHES, PARTIAL_BATCH])
def test_evaluate_matches_tf_distribute(num_examples):
  """`evaluate` returns the same loss and accuracy as TF."""
  ours = _run(tfd, "dataset", num_examples)
  theirs = _run(tf.distribute, "dataset", num_examples)
  assert len(ours.evaluation) == len(theirs.evaluation) == 2
  np.testing.assert_allclose(ours.evaluation, theirs.evaluation,
                             atol=TOLERANCE)
  # Accuracy is a whole number of examples out of all of them.
  correct = ours.evaluation[1] * num_examples
  assert abs(correct - round(correct)) < 1e-3


@pytest.mark.parametrize("num_examples", [FULL_BATCHES, PARTIAL_BATCH])
def test_predict_matches_tf_distribute(num_examples):
  """`predict` returns TF's logits, one row per example, in order."""
  ours = _run(tfd, "dataset", num_examples)
  theirs = _run(tf.distribute, "dataset", num_examples)
  assert ours.predictions.shape == theirs.predictions.shape == (
      num_examples, NUM_CLASSES)
  np.testing.assert_allclose(ours.predictions, theirs.predictions,
                             atol=TOLERANCE, rtol=TOLERANCE)
  if num_examples == FULL_BATCHES:
    return
  assert ours.few_predictions.shape == theirs.few_predictions.shape == (
      3, NUM_CLASSES)
  np.testing.assert_allclose(ours.few_predictions, theirs.few_predictions,
                             atol=TOLERANCE, rtol=TOLERANCE)
  np.testing.assert_allclose(ours.few_predictions, ours.predictions[:3],
                             atol=TOLERANCE, rtol=TOLERANCE)


def test_predict_equals_the_model_on_one_device():
  """Each row of `predict` is the fitted model applied to that example."""
  ours = _run(tfd, "dataset", PARTIAL_BATCH)
  model = keras.Sequential([
      keras.Input(shape=(NUM_FEATURES,)),
      keras.layers.Dense(8, activation="relu"),
      keras.layers.Dense(NUM_CLASSES)])
  model.set_weights(ours.weights)
  x, _ = _data(PARTIAL_BATCH)
  np.testing.assert_allclose(ours.predictions, model(x).numpy(),
                             atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("source,steps_per_execution",
                         [("dataset", 2), ("numpy", 4)])
def test_steps_per_execution_matches_tf_distribute(source, steps_per_execution):
  """Several steps per call run the same steps as TF's one step per call.

  5 steps per epoch run as 2 + 2 + 1 or as 4 + 1. TF's run is on the
  dataset, which batches as the numpy arrays do.
  """
  # TF 2.21's MirroredStrategy fails here in Keras ("while/cond/Placeholder").
  ours = _run(tfd, source, PARTIAL_BATCH, steps_per_execution)
  theirs = _run(tf.distribute, "dataset", PARTIAL_BATCH)
  assert ours.model.steps_per_execution == steps_per_execution
  _assert_history_close(ours.history, theirs.history)
  _assert_weights_close(ours.weights, theirs.weights)
  assert ours.iterations == theirs.iterations == NUM_EPOCHS * 5
  np.testing.assert_allclose(ours.evaluation, theirs.evaluation,
                             atol=TOLERANCE)
  np.testing.assert_allclose(ours.predictions, theirs.predictions,
                             atol=TOLERANCE, rtol=TOLERANCE)
  np.testing.assert_allclose(ours.few_predictions, theirs.few_predictions,
                             atol=TOLERANCE, rtol=TOLERANCE)


def _variable_types(model):
  """Per variable of the model, optimizer and metrics: (path, value type).

  A Keras 3 variable wraps the strategy's variable, its `value`.
  """
  variables = (model.variables + model.optimizer.variables
               + model.metrics_variables)
  return [(v.path.split("/", 1)[1], type(v.value)) for v in variables]


def test_keras_uses_our_strategy_and_variables():
  """Keras keeps our strategy and makes its variables ours, as TF's are TF's."""
  ours = _run(tfd, "dataset", FULL_BATCHES)
  theirs = _run(tf.distribute, "dataset", FULL_BATCHES)
  assert isinstance(ours.strategy, tfd.MirroredStrategy)
  assert ours.model.distribute_strategy is ours.strategy
  assert ours.model.optimizer._distribution_strategy is ours.strategy  # pylint: disable=protected-access
  assert ours.strategy.num_replicas_in_sync == 4
  assert theirs.model.distribute_strategy is oracle.tf_mirrored()
  for model in [ours.model, theirs.model]:
    for variable in model.variables:
      assert type(variable).__module__.startswith("keras")

  our_types, their_types = _variable_types(ours.model), _variable_types(
      theirs.model)
  assert len(our_types) == len(their_types) == 4 + 10 + 4
  for (our_path, our_type), (their_path, their_type) in zip(our_types,
                                                            their_types):
    assert our_type.__module__.startswith("tf_distribute_lite"), our_path
    assert their_type.__module__.startswith("tensorflow"), their_path
    assert our_type.__name__ == their_type.__name__, our_path
  assert {t.__name__ for _, t in our_types} == {"MirroredVariable",
                                                "SyncOnReadVariable"}

  for weight in ours.model.trainable_variables:
    components = ours.strategy.experimental_local_results(weight.value)
    assert tuple(c.device for c in components) == DEVICES
    for component in components[1:]:
      np.testing.assert_allclose(component.numpy(), components[0].numpy(),
                                 atol=TOLERANCE)
