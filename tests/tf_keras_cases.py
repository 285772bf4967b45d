"""What tf_keras (Keras 2) does under a strategy, one function per feature.

Each case takes a strategy and an empty directory and returns what it
observed as plain JSON data (numbers, lists, strings), so that the run under
`tf.distribute` and the run under tfd compare leaf by leaf, in this process
or from a subprocess. tests/test_tf_keras.py runs them. As a program it
runs the cases it is given on the emulated TPU slice TPU_NAME names (v3-8:
8 logical CPU devices, so a process of its own) and under TF's
MirroredStrategy on the same devices, and prints one JSON object:

    TPU_NAME=emulated:v3-8 python tests/tf_keras_cases.py WORKDIR CASE...
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

from keras_models import classification_data
from keras_models import classifier
from keras_models import initial_weights
from keras_models import NUM_CLASSES
from keras_models import NUM_FEATURES

GLOBAL_BATCH = 16
NUM_EXAMPLES = 40  # batches of 16, 16 and 8: the last one is partial
EPOCHS = 2
STEPS_PER_EPOCH = 3  # on repeated datasets: as many as the 40 examples make


def _keras():
  import tf_keras  # pylint: disable=g-import-not-at-top  (imported when used)
  return tf_keras


def _data():
  return classification_data(NUM_EXAMPLES)


def _compiled(strategy, **compile_kwargs):
  """The classifier with Adam, compiled in `strategy.scope()`."""
  keras = _keras()
  compile_kwargs.setdefault("metrics", ["accuracy"])
  with strategy.scope():
    model = classifier(keras)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **compile_kwargs)
    model.optimizer.build(model.trainable_variables)
  return model


_shared = {}  # id(strategy) -> (strategy, its model, the optimizer's initial state)


def _model(strategy):
  """`_compiled(strategy)`, made once per strategy and reset to its initial
  weights and optimizer state for each case: tracing `fit`, `evaluate` and
  `predict` is most of what a case costs, and a model traces them once for
  every kind of input that batches alike."""
  if id(strategy) not in _shared:
    model = _compiled(strategy)
    _shared[id(strategy)] = (strategy, model, [v.numpy() for v in model.optimizer.variables()])
  _, model, optimizer_state = _shared[id(strategy)]
  model.set_weights(initial_weights())
  for variable, value in zip(model.optimizer.variables(), optimizer_state):
    variable.assign(value)
  return model


def _weights(model):
  return [w.tolist() for w in model.get_weights()]


def _trained(model, history, evaluate=None, predict=None):
  """History, weights and optimizer steps of a fitted model, then the
  results of `evaluate()` and `predict()` where given."""
  result = {"history": history.history, "weights": _weights(model),
            "iterations": int(model.optimizer.iterations.numpy())}
  if evaluate is not None:
    result["evaluate"] = evaluate()
  if predict is not None:
    result["predict"] = predict().tolist()
  return result


def _repeated(x, y, batch):
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


# --- Input: arrays, datasets, distributed datasets, DatasetCreator.

def fit_arrays(strategy, workdir, model=None):
  """fit, evaluate and predict on numpy arrays (partial last batch)."""
  del workdir
  x, y = _data()
  model = model or _model(strategy)
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
  return _trained(model, history,
                  lambda: model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0),
                  lambda: model.predict(x, batch_size=GLOBAL_BATCH, verbose=0))


def steps_per_execution(strategy, workdir):
  """`fit_arrays` compiled with `steps_per_execution=2`."""
  return fit_arrays(strategy, workdir, _compiled(strategy, steps_per_execution=2))


def fit_dataset(strategy, workdir):
  """fit (with validation data), evaluate and predict on a batched
  `tf.data.Dataset`."""
  del workdir
  x, y = _data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
  model = _model(strategy)
  history = model.fit(dataset, epochs=EPOCHS, validation_data=dataset.take(2), verbose=0)
  return _trained(model, history, lambda: model.evaluate(dataset, verbose=0),
                  lambda: model.predict(dataset.map(lambda f, _: f), verbose=0))


def fit_distributed_dataset(strategy, workdir):
  """fit with `steps_per_epoch` and evaluate on
  `strategy.experimental_distribute_dataset`."""
  del workdir
  x, y = _data()
  dataset = strategy.experimental_distribute_dataset(_repeated(x, y, GLOBAL_BATCH))
  model = _model(strategy)
  history = model.fit(dataset, steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, verbose=0)
  return _trained(model, history,
                  lambda: model.evaluate(dataset, steps=STEPS_PER_EPOCH, verbose=0))


def _dataset_fn(input_context):
  x, y = _data()
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  return _repeated(x, y, batch).shard(input_context.num_input_pipelines,
                                      input_context.input_pipeline_id)


def fit_datasets_from_function(strategy, workdir):
  """fit with `steps_per_epoch` on `distribute_datasets_from_function`."""
  del workdir
  model = _model(strategy)
  history = model.fit(strategy.distribute_datasets_from_function(_dataset_fn),
                      steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, verbose=0)
  return _trained(model, history)


def fit_dataset_creator(strategy, workdir):
  """fit with `steps_per_epoch` on a `keras.utils.experimental.DatasetCreator`."""
  del workdir
  model = _model(strategy)
  creator = _keras().utils.experimental.DatasetCreator(_dataset_fn)
  history = model.fit(creator, steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, verbose=0)
  return _trained(model, history)


def input_batch_size(strategy, workdir):
  """A model whose `keras.Input` fixes the batch size, fitted and
  evaluated on batches of that size."""
  del workdir
  keras = _keras()
  x, y = _data()
  with strategy.scope():
    model = keras.Sequential([keras.Input((NUM_FEATURES,), batch_size=8),
                              keras.layers.Dense(NUM_CLASSES, kernel_initializer="ones")])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
  return _trained(model, history, lambda: model.evaluate(x, y, batch_size=8, verbose=0),
                  lambda: model.predict(x, batch_size=8, verbose=0))


# --- Metrics, losses and sample weights.

def metrics_and_losses(strategy, workdir):
  """A model with a regression output (Huber loss, regression metrics) and
  a binary one (cross-entropy with label smoothing, confusion-matrix
  metrics), weighted losses and weighted metrics, fitted and evaluated with
  sample weights. Metrics are named: Keras numbers default names per
  process."""
  del workdir
  keras = _keras()
  x, labels = _data()
  rng = np.random.RandomState(5)
  y = {"value": rng.normal(size=(NUM_EXAMPLES, 2)).astype(np.float32),
       "label": (labels > 0).astype(np.float32)[:, None]}
  sample_weight = rng.uniform(0.5, 2.0, size=(NUM_EXAMPLES,)).astype(np.float32)
  with strategy.scope():
    inputs = keras.Input((NUM_FEATURES,))
    model = keras.Model(inputs, {
        "value": keras.layers.Dense(2, kernel_initializer="ones", name="value")(inputs),
        "label": keras.layers.Dense(1, kernel_initializer="ones", name="label")(inputs)})
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss={"value": keras.losses.Huber(),
              "label": keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1)},
        loss_weights={"value": 1.0, "label": 0.5},
        metrics={"value": ["mae", keras.metrics.RootMeanSquaredError(),
                           keras.metrics.CosineSimilarity()],
                 "label": [keras.metrics.BinaryAccuracy(threshold=0.0),
                           keras.metrics.AUC(from_logits=True, name="auc"),
                           keras.metrics.Precision(thresholds=0.0, name="precision"),
                           keras.metrics.Recall(thresholds=0.0, name="recall")]},
        weighted_metrics={"value": [keras.metrics.MeanSquaredError(name="wmse")]})
  history = model.fit(x, y, sample_weight=sample_weight, batch_size=GLOBAL_BATCH,
                      epochs=EPOCHS, shuffle=False, verbose=0)
  return _trained(model, history, lambda: model.evaluate(
      x, y, sample_weight=sample_weight, batch_size=GLOBAL_BATCH, verbose=0,
      return_dict=True))


# --- Callbacks.

def _files(directory):
  """The files under `directory`, relative; event files by their folder."""
  found = set()
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.relpath(os.path.join(root, name), directory)
      found.add(os.path.join(os.path.dirname(path), "events") if "tfevents" in name else path)
  return sorted(found)


def model_checkpoint(strategy, workdir):
  """ModelCheckpoint saving weights (HDF5 and TF checkpoint) each epoch and
  the whole model after the last step; the files written and the weights
  they hold."""
  keras = _keras()
  x, y = _data()
  model = _model(strategy)
  callbacks = [
      keras.callbacks.ModelCheckpoint(os.path.join(workdir, "weights.{epoch}.h5"),
                                      save_weights_only=True),
      keras.callbacks.ModelCheckpoint(os.path.join(workdir, "ckpt.{epoch}"),
                                      save_weights_only=True),
      keras.callbacks.ModelCheckpoint(os.path.join(workdir, "model.{epoch}"),
                                      save_freq=EPOCHS * STEPS_PER_EPOCH)]
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False,
                      verbose=0, callbacks=callbacks)
  result = _trained(model, history)
  result["files"] = _files(workdir)
  restored = classifier(keras)
  restored.load_weights(os.path.join(workdir, "weights.1.h5"))
  result["h5_epoch_1"] = _weights(restored)
  restored.load_weights(os.path.join(workdir, "ckpt.1")).expect_partial()
  result["ckpt_epoch_1"] = _weights(restored)
  result["model_epoch_2"] = _weights(keras.models.load_model(os.path.join(workdir, "model.2")))
  return result


def early_stopping(strategy, workdir):
  """EarlyStopping on a loss that must fall by more than it can: training
  stops after `patience` + 1 epochs and restores the best weights."""
  del workdir
  x, y = _data()
  model = _model(strategy)
  stop = _keras().callbacks.EarlyStopping(monitor="loss", min_delta=1.0, patience=1,
                                          restore_best_weights=True)
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=5, shuffle=False, verbose=0,
                      callbacks=[stop])
  result = _trained(model, history)
  result["stopped_epoch"] = stop.stopped_epoch
  return result


def tensorboard(strategy, workdir):
  """TensorBoard logging each epoch: the event files written, and the
  scalars they hold by tag (train and validation)."""
  x, y = _data()
  model = _model(strategy)
  logs = os.path.join(workdir, "logs")
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                      validation_data=(x, y),
                      callbacks=[_keras().callbacks.TensorBoard(logs)])
  scalars = {}
  for directory, _, names in sorted(os.walk(logs)):
    for name in sorted(names):
      for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
        for value in event.summary.value:
          if value.tag.startswith("epoch_"):
            key = f"{os.path.basename(directory)}/{value.tag}"
            scalars.setdefault(key, []).append(float(tf.make_ndarray(value.tensor)))
  return {"history": history.history, "files": _files(workdir), "scalars": scalars}


class _Interrupt(Exception):
  pass


def backup_and_restore(strategy, workdir):
  """BackupAndRestore: a fit interrupted after its second epoch, then a
  new model resuming it; its history and weights."""
  keras = _keras()
  x, y = _data()
  backup_dir = os.path.join(workdir, "backup")

  class InterruptAfterEpoch1(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
      if epoch == 1:
        raise _Interrupt()

  model = _compiled(strategy)  # a fresh one: the callback leaves it tracking state
  try:
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup_dir), InterruptAfterEpoch1()])
  except _Interrupt:
    pass
  model = _compiled(strategy)
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=4, shuffle=False, verbose=0,
                      callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])
  return _trained(model, history)


# --- Custom training loops with tf_keras optimizers.

def _custom_loop(strategy, optimizer):
  """Two epochs of a `tf.function` step calling `strategy.run` on a
  distributed dataset, with Keras metrics updated in the replicas."""
  keras = _keras()
  x, y = _data()
  with strategy.scope():
    model = classifier(keras)
    optimizer = optimizer(keras)
    mean_loss = keras.metrics.Mean()
    accuracy = keras.metrics.SparseCategoricalAccuracy()
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=keras.losses.Reduction.NONE)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

  @tf.function
  def train_step(features, labels):
    def replica_step(features, labels):
      with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = tf.nn.compute_average_loss(loss_fn(labels, logits),
                                          global_batch_size=GLOBAL_BATCH)
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      mean_loss.update_state(loss)
      accuracy.update_state(labels, logits)
      return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(features, labels)),
                           axis=None)

  losses = [float(train_step(*batch)) for _ in range(EPOCHS) for batch in dataset]
  return {"losses": losses, "weights": _weights(model),
          "iterations": int(optimizer.iterations.numpy()),
          "mean_loss": float(mean_loss.result()), "accuracy": float(accuracy.result())}


def custom_loop(strategy, workdir):
  """The custom loop with `keras.optimizers.Adam`."""
  del workdir
  return _custom_loop(strategy, lambda keras: keras.optimizers.Adam(learning_rate=0.01))


def custom_loop_legacy(strategy, workdir):
  """The custom loop with `keras.optimizers.legacy.Adam`."""
  del workdir
  return _custom_loop(strategy, lambda keras: keras.optimizers.legacy.Adam(learning_rate=0.01))


# --- Saving.

def saving(strategy, workdir):
  """A model fitted under the strategy, saved as a Keras SavedModel, with
  `tf.saved_model.save` and as a `tf.train.Checkpoint` of model and
  optimizer; each loaded back without the strategy and in its scope."""
  keras = _keras()
  x, y = _data()
  model = _model(strategy)
  model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
  keras_dir, tf_dir = os.path.join(workdir, "keras"), os.path.join(workdir, "tf")
  model.save(keras_dir)
  tf.saved_model.save(model, tf_dir)
  path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
      os.path.join(workdir, "ckpt"))
  few = x[:5]

  def load():
    restored = _compiled(tf.distribute.get_strategy())
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(
        path).assert_existing_objects_matched()
    return {"keras_model": keras.models.load_model(keras_dir).predict(few, verbose=0).tolist(),
            "checkpoint_weights": _weights(restored),
            "checkpoint_optimizer": [v.numpy().tolist() for v in restored.optimizer.variables()]}
  result = {"trained": _weights(model), "loaded": load()}
  with strategy.scope():
    result["loaded_in_scope"] = load()
  serve = tf.saved_model.load(tf_dir).signatures["serving_default"]
  result["tf_loaded"] = [v.numpy().tolist() for v in serve(tf.constant(few)).values()]
  return result


# --- Mixed precision.

def mixed_float16(strategy, workdir):
  """fit under the `mixed_float16` global policy."""
  keras = _keras()
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    return fit_arrays(strategy, workdir, _compiled(strategy))
  finally:
    keras.mixed_precision.set_global_policy("float32")


# --- Sharpness-aware minimization.

def sharpness_aware(strategy, workdir):
  """fit of tf_keras's SharpnessAwareMinimization around the classifier: each
  step moves the weights along the gradient and back before applying it."""
  del workdir
  keras = _keras()
  x, y = _data()
  with strategy.scope():
    model = keras.models.experimental.SharpnessAwareMinimization(classifier(keras), rho=0.05)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
  return _trained(model, history)


# --- The private strategy names tf_keras reads (docs/client_private_names.md).

CLIENT_PRIVATE_NAMES = (
    "_should_use_with_coordinator", "_num_workers", "_mesh", "_scale_loss_for_estimator",
    "extended._in_multi_worker_mode", "extended._global_batch_size",
    "extended._use_merge_call", "extended._task_id",
    "extended._cluster_resolver", "extended._tpu_cluster_resolver",
    "extended._std_server_started", "extended._retrace_functions_for_each_device",
    "extended._outer_control_flow_context", "extended._device_assignment")

ABSENT = "absent"


def _described(value):
  """`value` as JSON: a method by what it returns, a resolver by its class
  and task."""
  if callable(value):
    value = value()
  if isinstance(value, (bool, int, str, type(None))):
    return value
  return [type(value).__name__, value.task_type, value.task_id]


def client_private_names(strategy):
  """Each of `CLIENT_PRIVATE_NAMES` on `strategy`, or "absent"."""
  found = {}
  for name in CLIENT_PRIVATE_NAMES:
    owner = strategy.extended if name.startswith("extended.") else strategy
    attribute = name.split(".")[-1]
    found[name] = (_described(getattr(owner, attribute)) if hasattr(owner, attribute)
                   else ABSENT)
  return found


CASES = {case.__name__: case for case in [
    fit_arrays, fit_dataset, fit_distributed_dataset, fit_datasets_from_function,
    fit_dataset_creator, steps_per_execution, input_batch_size, metrics_and_losses,
    model_checkpoint, early_stopping, tensorboard, backup_and_restore, custom_loop,
    custom_loop_legacy, saving, mixed_float16, sharpness_aware]}


def outcome(case, strategy, workdir):
  """What `case` observed, or {"raised": the exception's class name}."""
  os.makedirs(workdir, exist_ok=True)
  try:
    return CASES[case](strategy, workdir)
  except Exception as e:  # pylint: disable=broad-except
    return {"raised": type(e).__name__, "message": str(e)[-2000:]}


def main(cases, workdir):
  """Each case on an emulated TPU slice and under TF's MirroredStrategy on
  the same devices (TPU_NAME names the slice)."""
  import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
  resolver = tfd.cluster_resolver.TPUClusterResolver()
  tpu = tfd.TPUStrategy(resolver)
  mirrored = tf.distribute.MirroredStrategy(
      list(tpu.extended.worker_devices), cross_device_ops=tf.distribute.ReductionToOneDevice())
  results = {"replicas": tpu.num_replicas_in_sync}
  for case in cases:
    results[case] = {
        "tpu": outcome(case, tpu, os.path.join(workdir, "tpu", case)),
        "mirrored": outcome(case, mirrored, os.path.join(workdir, "mirrored", case))}
  print(json.dumps(results))


if __name__ == "__main__":
  main(sys.argv[2:], sys.argv[1])
