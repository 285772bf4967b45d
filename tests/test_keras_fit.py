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


def _initial_model(module, steps_per_execution, strategy_name="mirrored"):
  """The strategy and model of `module` and `steps_per_execution`, under a
  MirroredStrategy on 4 CPUs or a OneDeviceStrategy ("one_device").

  The model is in its initial state.

  Tracing `fit` is slow, TF's above all, so each model is made once, and
  every further run resets its weights and optimizer state.
  """
  key = (module.__name__, steps_per_execution, strategy_name)
  if key not in _models:
    if strategy_name == "one_device":
      strategy = oracle.api(module).one_device()
    else:
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


# --- Keras on the distributed datasets a strategy makes.
#
# Without `steps_per_epoch`, Keras takes a distributed dataset's cardinality
# for its steps per epoch. A dataset from a function reports its pipeline's
# cardinality, in TF as here: 18 batches of 4 examples, for 5 steps. Keras
# then calls a sixth step, which ends the epoch when it finds no input. In
# TF 2.21 that step races the end of input and may apply the optimizer's
# data-independent updates (its iteration count) to some replicas' copies;
# here it applies none (see `test_a_step_without_input_changes_nothing`).
# So `fit` compared with TF reads datasets from a function as TF's tutorials
# do: repeated, with `steps_per_epoch`.

VALIDATION_EXAMPLES = 38  # 2 global batches of 16 and one of 6.

# A run on distributed datasets: `fit` (with validation data) history,
# weights and optimizer steps, how far the replicas' copies of the model's
# and optimizer's variables differ after it, then `evaluate` and `predict` on
# the 70 examples and `predict` on 3 examples, all on datasets of one kind.
_DistributedResult = collections.namedtuple(
    "_DistributedResult", ["history", "weights", "iterations", "replica_spread",
                           "evaluation", "predictions", "few_predictions"])
_distributed_results = {}


def _distributed(strategy, kind, x, y=None, repeat=False):
  """Examples `x` (and labels `y`) in global batches of 16, distributed by
  `experimental_distribute_dataset` ("dataset") or by
  `distribute_datasets_from_function` ("function", 16 / replicas a batch)."""
  dataset = tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))
  if repeat:
    dataset = dataset.repeat()
  if kind == "dataset":
    return strategy.experimental_distribute_dataset(dataset.batch(GLOBAL_BATCH))

  def dataset_fn(context):
    return dataset.shard(context.num_input_pipelines,
                         context.input_pipeline_id).batch(
                             context.get_per_replica_batch_size(GLOBAL_BATCH))
  return strategy.distribute_datasets_from_function(dataset_fn)


def _run_distributed(module, kind, steps_per_epoch=None,
                     strategy_name="mirrored"):
  """Fits on a distributed dataset of `kind`, validating on the first 38
  examples reversed, then evaluates and predicts; once per set of arguments.

  With `steps_per_epoch`, `fit` reads the examples repeated.
  """
  key = (module.__name__, kind, steps_per_epoch, strategy_name)
  if key not in _distributed_results:
    strategy, model = _initial_model(module, 1, strategy_name)
    x, y = _data(PARTIAL_BATCH)
    validation = _distributed(strategy, kind, x[:VALIDATION_EXAMPLES][::-1],
                              y[:VALIDATION_EXAMPLES][::-1])
    history = model.fit(
        _distributed(strategy, kind, x, y, repeat=steps_per_epoch is not None),
        epochs=NUM_EPOCHS, steps_per_epoch=steps_per_epoch,
        validation_data=validation, verbose=0).history
    _distributed_results[key] = _DistributedResult(
        history, model.get_weights(), int(model.optimizer.iterations.numpy()),
        _replica_spread(strategy, model.variables + model.optimizer.variables),
        model.evaluate(_distributed(strategy, kind, x, y), verbose=0),
        model.predict(_distributed(strategy, kind, x), verbose=0),
        model.predict(_distributed(strategy, kind, x[:3]), verbose=0))
  return _distributed_results[key]


def _replica_spread(strategy, variables):
  """The largest difference between two replicas' copies of a variable."""
  spread = 0.0
  for variable in variables:
    copies = [c.numpy() for c in strategy.experimental_local_results(
        variable.value)]
    spread = max([spread] + [float(np.max(np.abs(c - copies[0])))
                             for c in copies])
  return spread


def _plain_model_outputs(weights, x):
  """The classifier with `weights`, made outside every strategy, on `x`."""
  model = keras.Sequential([
      keras.Input(shape=(NUM_FEATURES,)),
      keras.layers.Dense(8, activation="relu"),
      keras.layers.Dense(NUM_CLASSES)])
  model.set_weights(weights)
  return model(x).numpy()


def _assert_distributed_run_matches(ours, theirs):
  names = ["accuracy", "loss", "val_accuracy", "val_loss"]
  assert sorted(ours.history) == sorted(theirs.history) == names
  for name in names:
    np.testing.assert_allclose(ours.history[name], theirs.history[name],
                               atol=TOLERANCE, err_msg=name)
  _assert_weights_close(ours.weights, theirs.weights)
  assert ours.iterations == theirs.iterations
  assert ours.replica_spread == theirs.replica_spread == 0.0
  np.testing.assert_allclose(ours.evaluation, theirs.evaluation,
                             atol=TOLERANCE)
  for mine, tfs in [(ours.predictions, theirs.predictions),
                    (ours.few_predictions, theirs.few_predictions)]:
    assert mine.shape == tfs.shape
    np.testing.assert_allclose(mine, tfs, atol=TOLERANCE, rtol=TOLERANCE)


# (kind, steps_per_epoch) of the runs on a MirroredStrategy.
DISTRIBUTED_RUNS = pytest.mark.parametrize("kind, steps_per_epoch", [
    ("dataset", None), ("dataset", 3), ("function", 5)])


@DISTRIBUTED_RUNS
def test_keras_on_distributed_datasets_matches_tf_distribute(kind,
                                                             steps_per_epoch):
  """`fit` with validation data, `evaluate` and `predict` on the distributed
  datasets of a MirroredStrategy give TF's numbers.

  The last global batch of the 70 (and of the 38 validation) examples holds
  6, so some of the 4 replicas get none; `predict` on 3 examples leaves a
  replica or three empty. With 3 steps per epoch of a repeated dataset the
  second epoch goes on where the first stopped.
  """
  ours = _run_distributed(tfd, kind, steps_per_epoch)
  theirs = _run_distributed(tf.distribute, kind, steps_per_epoch)
  _assert_distributed_run_matches(ours, theirs)
  assert ours.iterations == NUM_EPOCHS * (steps_per_epoch or 5)
  assert not np.allclose(ours.history["val_loss"], ours.history["loss"])


def test_fit_on_distributed_dataset_equals_fit_on_dataset():
  """Keras distributes an undistributed dataset the same way: same batches,
  same history and weights."""
  ours = _run_distributed(tfd, "dataset")
  on_dataset = _run(tfd, "dataset", PARTIAL_BATCH)
  for name in ["accuracy", "loss"]:
    np.testing.assert_allclose(ours.history[name], on_dataset.history[name],
                               atol=TOLERANCE)
  _assert_weights_close(ours.weights, on_dataset.weights)


@DISTRIBUTED_RUNS
def test_predict_on_distributed_datasets_keeps_example_order(kind,
                                                             steps_per_epoch):
  """Row i of `predict` is the fitted model, made without a strategy,
  applied to example i."""
  ours = _run_distributed(tfd, kind, steps_per_epoch)
  x, _ = _data(PARTIAL_BATCH)
  expected = _plain_model_outputs(ours.weights, x)
  assert ours.predictions.shape == (PARTIAL_BATCH, NUM_CLASSES)
  np.testing.assert_allclose(ours.predictions, expected, atol=TOLERANCE,
                             rtol=TOLERANCE)
  np.testing.assert_allclose(ours.few_predictions, expected[:3],
                             atol=TOLERANCE, rtol=TOLERANCE)
  # Accuracy is a whole number of the 70 examples.
  correct = ours.evaluation[1] * PARTIAL_BATCH
  assert abs(correct - round(correct)) < 1e-3


def test_keras_on_one_device_strategy_datasets_matches_tf_distribute():
  """The same under a OneDeviceStrategy, whose datasets give plain tensors."""
  ours = _run_distributed(tfd, "dataset", strategy_name="one_device")
  theirs = _run_distributed(tf.distribute, "dataset",
                            strategy_name="one_device")
  _assert_distributed_run_matches(ours, theirs)
  assert ours.iterations == NUM_EPOCHS * 5
  x, _ = _data(PARTIAL_BATCH)
  np.testing.assert_allclose(ours.predictions,
                             _plain_model_outputs(ours.weights, x),
                             atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("kind", ["dataset", "function"])
def test_a_step_without_input_changes_nothing(kind):
  """With a dataset of unknown length Keras runs one step per epoch more,
  which finds no input: it updates no replica's copy of anything, so the
  replicas stay equal and the optimizer counts the steps that ran."""
  strategy = tfd.MirroredStrategy()
  with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(NUM_FEATURES,)),
                              keras.layers.Dense(NUM_CLASSES)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data(PARTIAL_BATCH)
  unknown_length = tf.data.Dataset.from_tensor_slices((x, y)).filter(
      lambda *unused: True)
  if kind == "dataset":
    data = unknown_length.batch(GLOBAL_BATCH)
    steps = 5
  else:
    data = strategy.distribute_datasets_from_function(
        lambda context: unknown_length.batch(4))
    steps = 5  # 18 batches of 4 for 4 replicas, the last 2 with empty ones
  model.fit(data, epochs=3, verbose=0)
  iterations = [int(c) for c in strategy.experimental_local_results(
      model.optimizer.iterations.value)]
  assert iterations == [3 * steps] * 4
  assert _replica_spread(strategy, model.variables + model.optimizer.variables) == 0.0


def _fit_mixed_precision(strategy):
  """`fit` under the "mixed_float16" policy: the history, the weights, the
  optimizer and its steps."""
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    with strategy.scope():
      model = keras.Sequential([
          keras.Input(shape=(NUM_FEATURES,)),
          keras.layers.Dense(8, activation="relu"),
          keras.layers.Dense(NUM_CLASSES),
          keras.layers.Activation("linear", dtype="float32")])
      model.set_weights(initial_weights())
      model.compile(
          optimizer=keras.optimizers.Adam(learning_rate=0.01),
          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          metrics=["accuracy"])
  finally:
    keras.mixed_precision.set_global_policy("float32")
  x, y = _data(FULL_BATCHES)
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=NUM_EPOCHS,
                      shuffle=False, verbose=0).history
  return (history, model.get_weights(), model.optimizer,
          int(model.optimizer.iterations.numpy()))


def test_mixed_precision_fit_matches_tf_distribute():
  """Keras wraps the optimizer in a LossScaleOptimizer, which applies the
  gradients through `call_for_each_replica` with the model's variables."""
  history, weights, optimizer, iterations = _fit_mixed_precision(
      tfd.MirroredStrategy(["CPU:0", "CPU:1"]))
  tf_history, tf_weights, tf_optimizer, tf_iterations = _fit_mixed_precision(
      oracle.new_tf_mirrored(["CPU:0", "CPU:1"]))
  assert type(optimizer).__name__ == type(tf_optimizer).__name__ == "LossScaleOptimizer"
  assert iterations == tf_iterations == NUM_EPOCHS * FULL_BATCHES // GLOBAL_BATCH
  assert optimizer.dynamic_scale.numpy() == tf_optimizer.dynamic_scale.numpy()
  # float16 activations: agreement to float16 precision.
  for name in ["accuracy", "loss"]:
    np.testing.assert_allclose(history[name], tf_history[name], atol=1e-3,
                               err_msg=name)
  for ours, theirs in zip(weights, tf_weights):
    np.testing.assert_allclose(ours, theirs, atol=1e-3)
  assert not np.allclose(weights[0], initial_weights()[0])


@pytest.mark.parametrize("module", [tf.distribute, tfd], ids=["tf", "tfd"])
def test_fit_of_a_model_built_outside_the_scope_names_its_variable(module):
  """Compiled in the scope, built outside it: the optimizer's variables are
  mirrored, the model's are not, and Keras steps on TensorFlow's default
  strategy. The update fails on the model's first variable (TF 2.21 with an
  empty AssertionError, we with a ValueError that names it), not on the
  reads of the optimizer's variables before it."""
  strategy = (oracle.new_tf_mirrored(["CPU:0", "CPU:1"]) if module is tf.distribute
              else tfd.MirroredStrategy(["CPU:0", "CPU:1"]))
  model = keras.Sequential([keras.Input(shape=(NUM_FEATURES,)),
                            keras.layers.Dense(NUM_CLASSES)])
  with strategy.scope():
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data(GLOBAL_BATCH)
  expected = AssertionError if module is tf.distribute else ValueError
  with pytest.raises(expected) as raised:
    model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0)
  if module is tfd:
    assert "needs a variable created in its scope" in str(raised.value)
    assert model.layers[0].kernel.path in str(raised.value)
