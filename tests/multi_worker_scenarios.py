"""What the workers of a multi-worker test run, each in its own process.

Every scenario takes a `Context` (the strategy module, `tf.distribute` or
`tf_distribute_lite`, this worker's index, a directory shared by the
cluster, and the test's arguments) and returns a JSON-able dict that the
test compares across workers, with TensorFlow's, or with a single process.
"""

import json
import os
import pathlib
import tempfile
import time
import traceback

import numpy as np
import tensorflow as tf

from keras_models import classification_data
from keras_models import classifier
from multi_worker_worker import wait_to_be_killed
from tf_keras_cases import client_private_names


class Context:
  """What a scenario knows of its worker."""

  def __init__(self, mod, index, directory, args):
    self.mod = mod
    self.index = index
    self.directory = directory
    self.args = args

  def request(self, action, job, index, timeout=30):
    """Asks the cluster to "kill" or "restart" task `index` of `job` (see
    `multi_worker.LocalCluster`); returns once that is done."""
    path = pathlib.Path(self.directory) / f"request-{time.monotonic_ns()}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"action": action, "job": job, "index": index}))
    path.with_suffix(".tmp").rename(path)
    wait_for_file(path.with_suffix(".done"), timeout)

  def strategy(self, **options):
    """The module's MultiWorkerMirroredStrategy, with `options` as its
    CommunicationOptions."""
    return self.mod.MultiWorkerMirroredStrategy(
        communication_options=self.mod.experimental.CommunicationOptions(**options))


def wait_for_file(path, timeout=60):
  """Waits until the file `path` exists (another process's signal);
  TimeoutError after `timeout` seconds."""
  path = pathlib.Path(path)
  deadline = time.monotonic() + timeout
  while not path.exists():
    if time.monotonic() > deadline:
      raise TimeoutError(f"{path} did not appear within {timeout} s")
    time.sleep(0.02)


def _floats(values):
  return np.asarray(values, dtype=np.float64).tolist()


def _local(strategy, value):
  return [np.asarray(v).tolist() for v in strategy.experimental_local_results(value)]


def _replica_id(mod):
  return mod.get_replica_context().replica_id_in_sync_group


# --- The strategy's API across workers.

def basics(ctx):
  """Properties, reductions, gathers, variables and input of one strategy,
  the collective ops of two more in the same program; ends with a
  collective that times out (worker 0 alone calls it)."""
  mod = ctx.mod
  strategy = ctx.strategy(timeout_seconds=60)
  extended = strategy.extended
  out = {
      "num_replicas": strategy.num_replicas_in_sync,
      "worker_devices": list(extended.worker_devices),
      "multi_worker_mode": extended._in_multi_worker_mode(),  # pylint: disable=protected-access
      "chief_flags": [extended.should_checkpoint, extended.should_save_summary,
                      extended.experimental_should_init, extended.experimental_between_graph],
      "task": [strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id],
      # tf_keras reads these (docs/client_private_names.md).
      "client_private_names": client_private_names(strategy),
      # The collective leader, device filter and allocator of TF 1.x sessions.
      "session_config": str(strategy.update_config_proto(tf.compat.v1.ConfigProto())),
      "replica_ids": _local(strategy, strategy.run(lambda: _replica_id(mod))),
      "value_ids": _local(strategy, strategy.experimental_distribute_values_from_function(
          lambda context: context.replica_id_in_sync_group)),
  }
  ids = strategy.run(lambda: tf.cast(_replica_id(mod), tf.float32) + 1.0)
  rows = strategy.run(lambda: tf.fill(tf.stack([_replica_id(mod) + 1, 2]),
                                      tf.cast(_replica_id(mod), tf.float32)))
  out["reduce"] = _floats([strategy.reduce("SUM", ids, axis=None),
                           strategy.reduce("MEAN", ids, axis=None)])
  out["reduce_rows"] = [strategy.reduce("SUM", rows, axis=0).numpy().tolist(),
                        strategy.reduce("MEAN", rows, axis=0).numpy().tolist()]
  out["gather"] = strategy.gather(rows, axis=0).numpy().tolist()
  out["all_gather"] = _local(strategy, strategy.run(
      lambda: mod.get_replica_context().all_gather(
          tf.fill([_replica_id(mod) + 1], _replica_id(mod)), axis=0)))

  @tf.function
  def all_reduce_in_function():
    context = mod.get_replica_context()
    value = tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0
    return (context.all_reduce("SUM", value), context.all_reduce("MEAN", [value, 2 * value]),
            context.all_reduce("SUM", tf.cast(context.replica_id_in_sync_group, tf.int32)))
  results = strategy.run(all_reduce_in_function)
  out["all_reduce_function"] = tf.nest.map_structure(
      lambda v: _local(strategy, v), results)
  out["batch_reduce_to"] = [_local(strategy, r) for r in extended.batch_reduce_to(
      "SUM", [(ids, ids), (ids, "/device:CPU:0")])]
  out["indexed_slices"] = _indexed_slices(ctx, strategy)
  out["saving_all_reduce"] = _saving_all_reduce(ctx, strategy)
  with strategy.scope():
    v = tf.Variable(10.0 + ctx.index)
    counter = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)
  out["initial_value"] = float(v.numpy())
  # TF's own ReplicaContext, made for this worker's replica, asks the
  # strategy which local replica it is (docs/client_private_names.md).
  with tf.distribute.ReplicaContext(strategy, replica_id_in_sync_group=ctx.index):
    out["read_in_replica_context_by_hand"] = float(v.read_value())
  strategy.run(tf.function(lambda: counter.assign_add(1.0)))
  out["counter"] = float(counter.numpy())
  out["input"] = _input(ctx, strategy)
  if ctx.mod is not tf.distribute:  # graphs of TensorFlow's differ
    out["collective_ops"] = _collective_ops_in_graph(ctx)
  out["timeout"] = _collective_timeout(ctx, strategy)
  return out


def _saving_all_reduce(ctx, strategy):
  """A SavedModel of a function traced to all-reduce across the workers
  (tracing runs no collective): TensorFlow refuses it."""
  module = tf.Module()
  module.f = tf.function(lambda: strategy.run(
      lambda: ctx.mod.get_replica_context().all_reduce("SUM", tf.constant(1.0))),
                         input_signature=[])
  try:
    tf.saved_model.save(module, tempfile.mkdtemp(), signatures=module.f.get_concrete_function(),
                        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
  except ValueError as e:
    return "Unable to save function" in str(e)
  return "saved"


def _indexed_slices(ctx, strategy):
  """IndexedSlices all-reduced in replicas (eagerly and in a tf.function)
  and reduced across them, with and without a dense shape: each replica
  gives the row [id + 1, id + 1] at index id."""
  mod = ctx.mod

  def slices(dense_shape):
    replica = _replica_id(mod)
    return tf.IndexedSlices(tf.fill([1, 2], tf.cast(replica, tf.float32) + 1.0),
                            tf.reshape(replica, [1]), dense_shape)

  def describe(value):
    if not isinstance(value, tf.IndexedSlices):
      return type(value).__name__
    return [value.values.numpy().tolist(), value.indices.numpy().tolist(),
            None if value.dense_shape is None else value.dense_shape.numpy().tolist()]

  out = []
  for dense_shape in (None, tf.constant([4, 2])):
    for op in ("SUM", "MEAN"):
      def all_reduce(op=op, dense_shape=dense_shape):
        return strategy.run(lambda: mod.get_replica_context().all_reduce(op, slices(dense_shape)))
      for run in (all_reduce, tf.function(all_reduce)):
        out.append([describe(v) for v in strategy.experimental_local_results(run())])
      out.append(describe(strategy.reduce(op, strategy.run(slices, args=(dense_shape,)),
                                          axis=None)))
  return out


def _input(ctx, strategy):
  """Each worker's batches of one dataset under every auto-shard policy,
  of input functions, and of input that runs out sooner on some workers."""
  policy = tf.data.experimental.AutoShardPolicy
  out = {}
  for name in ("AUTO", "DATA", "OFF"):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(policy, name)
    dataset = tf.data.Dataset.range(20).batch(8).with_options(options)
    out[name] = [_local(strategy, batch)
                 for batch in strategy.experimental_distribute_dataset(dataset)]
  contexts = []

  def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.input_pipeline_id,
                     context.num_replicas_in_sync,
                     context.get_per_replica_batch_size(2 * context.num_replicas_in_sync)])
    return tf.data.Dataset.range(8).shard(
        context.num_input_pipelines, context.input_pipeline_id).batch(2)
  out["from_function"] = [_local(strategy, batch) for batch in
                          strategy.distribute_datasets_from_function(dataset_fn)]
  out["input_contexts"] = contexts
  # Three files: with FILE sharding worker 0 of 2 reads two of them,
  # worker 1 one, so worker 1 runs out first and gets empty batches.
  files = []
  for f in range(3):
    path = os.path.join(ctx.directory, f"worker{ctx.index}_file{f}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for r in range(2):
        writer.write(f"f{f}r{r}".encode())
    files.append(path)
  dataset = tf.data.TFRecordDataset(files).batch(2)
  out["uneven"] = [[len(part) for part in _local(strategy, batch)]
                   for batch in strategy.experimental_distribute_dataset(dataset)]

  @tf.function
  def count_in_function(dist):
    steps = tf.constant(0)
    for batch in dist:
      steps += 1 + 0 * tf.size(strategy.experimental_local_results(batch)[0])
    return steps
  out["uneven_function_steps"] = int(count_in_function(
      strategy.experimental_distribute_dataset(dataset)))
  return out


def _collective_timeout(ctx, strategy):
  """Worker 0 alone all-reduces with a 2 s timeout; the others wait until
  it is done."""
  done = os.path.join(ctx.directory, "collective_timeout_done")
  if ctx.index != 0:
    wait_for_file(done)
    return None
  options = ctx.mod.experimental.CommunicationOptions(timeout_seconds=2)
  start = time.monotonic()
  try:
    strategy.run(lambda: ctx.mod.get_replica_context().all_reduce(
        "SUM", tf.constant(1.0), options=options))
    outcome = "no error"
  except Exception as e:  # pylint: disable=broad-except
    outcome = type(e).__name__
  seconds = time.monotonic() - start
  open(done, "w").close()
  return [outcome, seconds]


def _collective_ops_in_graph(ctx):
  """The collective ops an all-reduce of three tensors builds, with options
  that set every field and with none: [count, hints, timeouts] for each."""
  out = []
  for options in ({"timeout_seconds": 7.5, "bytes_per_pack": 64,
                   "implementation": "RING"}, {}):
    strategy = ctx.strategy(**options)

    @tf.function
    def step():
      return strategy.run(lambda: ctx.mod.get_replica_context().all_reduce(
          "SUM", [tf.ones([16]), tf.ones([16]), tf.ones([3])]))
    graph = step.get_concrete_function().graph
    ops = graph.get_operations() + [
        op for function in graph._functions.values()  # pylint: disable=protected-access
        for op in function.graph.get_operations()]
    collectives = [op for op in ops if op.type == "CollectiveReduceV2"]
    sums = step()
    out.append([len(collectives),
                sorted({op.get_attr("communication_hint").decode() for op in collectives}),
                sorted({op.get_attr("timeout_seconds") for op in collectives}),
                float(tf.add_n([tf.reduce_sum(t) for t in tf.nest.flatten(sums)]))])
  return out


# --- Training.

def write_dir(ctx, strategy, directory):
  """Where this worker writes a checkpoint: the chief into `directory`,
  the others into temporary directories (removed after writing)."""
  if strategy.extended.should_checkpoint:
    return directory
  return tempfile.mkdtemp(prefix=f"worker{ctx.index}_", dir=ctx.directory)


def custom_loop(ctx):
  """A Keras model trained in a custom loop on global batches of 16; the
  chief checkpoints after every step. Args: steps, checkpoint (a directory
  to write), restore (a checkpoint to restore first), die_after (a
  task index and step: that task signals the test, which kills it),
  local_strategy_first (worker 0 alone all-reduces with a MirroredStrategy
  of collective ops before it makes the multi-worker strategy)."""
  import keras  # pylint: disable=g-import-not-at-top
  mod, args = ctx.mod, ctx.args
  out = {}
  if args.get("local_strategy_first") and ctx.index == 0:
    out["local_sum"] = _local_collective_sum(mod)
  strategy = ctx.strategy(timeout_seconds=args.get("timeout", 60))
  with strategy.scope():
    model = classifier()
    optimizer = keras.optimizers.Adam(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  if args.get("restore"):
    checkpoint.restore(args["restore"]).expect_partial()
    out["restored"] = [w.tolist() for w in model.get_weights()]
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

  def step_fn(x, y):
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=16)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function
  def train_step(x, y):
    return strategy.reduce("SUM", strategy.run(step_fn, args=(x, y)), axis=None)

  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices(classification_data(16 * args["steps"])).batch(16))
  out["losses"] = []
  die_task, die_step = args.get("die_after", (None, None))
  start = time.monotonic()
  try:
    for step, (x, y) in enumerate(dataset):
      out["losses"].append(float(train_step(x, y)))
      if args.get("checkpoint"):
        directory = write_dir(ctx, strategy, args["checkpoint"])
        checkpoint.write(os.path.join(directory, f"ckpt-{step}"))
        if directory != args["checkpoint"]:
          tf.io.gfile.rmtree(directory)
        else:
          out["saved"] = [w.tolist() for w in model.get_weights()]
      if ctx.index == die_task and step == die_step:
        open(os.path.join(ctx.directory, "ready_to_die"), "w").close()
        wait_to_be_killed(60)
      start = time.monotonic()
  except Exception as e:  # pylint: disable=broad-except
    out["error"] = [type(e).__name__, str(e), time.monotonic() - start]
  out["weights"] = [w.tolist() for w in model.get_weights()]
  out["leftover_dirs"] = sorted(d for d in os.listdir(ctx.directory)
                                if d.startswith(f"worker{ctx.index}_"))
  return out


def _local_collective_sum(mod):
  """A sum of this worker's 2 replicas by a MirroredStrategy that
  all-reduces with collective ops (as on GPUs)."""
  from tf_distribute_lite import cross_device_ops  # pylint: disable=g-import-not-at-top
  devices = ["CPU:0", "CPU:1"]
  strategy = mod.MirroredStrategy(
      devices, cross_device_ops=cross_device_ops.CollectiveAllReduce(devices))
  summed = strategy.run(lambda: mod.get_replica_context().all_reduce(
      "SUM", tf.cast(_replica_id(mod), tf.float32) + 1.0))
  return _floats(strategy.experimental_local_results(summed))


def keras_fit(ctx):
  """Keras `fit` and `evaluate` of the small classifier on global batches
  of 16 (TensorFlow's multi-worker Keras tutorial, on synthetic data)."""
  import keras  # pylint: disable=g-import-not-at-top
  strategy = ctx.strategy(timeout_seconds=60)
  with strategy.scope():
    model = classifier()
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(64)).batch(16)
  batch_logs = []
  history = model.fit(dataset, epochs=2, verbose=0, callbacks=[
      keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batch_logs.append(
          {k: float(v) for k, v in logs.items()}))])
  evaluation = model.evaluate(dataset, verbose=0, return_dict=True)
  predictions = model.predict(tf.data.Dataset.from_tensor_slices(classification_data(24)[0]).batch(8),
                              verbose=0)
  return {"history": history.history, "batch_logs": batch_logs,
          "weights": [w.tolist() for w in model.get_weights()],
          "evaluation": evaluation, "predictions": np.asarray(predictions).tolist(),
          "checkpointing": _fit_with_checkpoints(ctx, strategy)}


def _fit_with_checkpoints(ctx, strategy, keras=None, optimizer=None, prefix=""):
  """TensorFlow's Keras tutorial on fault tolerance, with `keras` (Keras 3
  by default, or tf_keras) and `optimizer()` (SGD by default): `fit` of 3
  epochs of 4 steps with `BackupAndRestore` and `ModelCheckpoint` writing
  into directories the workers share (named with `prefix`), interrupted at
  the start of epoch 2, then resumed by a fresh model. Reports the files the
  shared directories hold and this worker's leftovers in its temporary
  directory."""
  if keras is None:
    import keras  # pylint: disable=g-import-not-at-top,redefined-outer-name
  optimizer = optimizer or (lambda: keras.optimizers.SGD(learning_rate=0.1))
  backup = os.path.join(ctx.directory, prefix + "backup")
  checkpoints = os.path.join(ctx.directory, prefix + "checkpoints")

  class Interruption(keras.callbacks.Callback):

    def on_epoch_begin(self, epoch, logs=None):
      if epoch == 2:
        raise RuntimeError("interrupted")

  def fit(extra_callbacks):
    with strategy.scope():
      model = classifier(keras)
      model.compile(optimizer=optimizer(),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [keras.callbacks.BackupAndRestore(backup),
                 keras.callbacks.ModelCheckpoint(
                     os.path.join(checkpoints, "epoch{epoch}.weights.h5"),
                     save_weights_only=True)]
    dataset = tf.data.Dataset.from_tensor_slices(classification_data(64)).batch(16).repeat()
    return model, model.fit(dataset, epochs=3, steps_per_epoch=4, verbose=0,
                            callbacks=callbacks + extra_callbacks)

  out = {}
  try:
    fit([Interruption()])
  except RuntimeError as e:
    out["interrupted"] = str(e)
  # Every worker sees the chief's files complete.
  strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
  out["backup_after_interruption"] = sorted(os.listdir(backup))
  model, history = fit([])
  out["resumed_epochs"] = history.epoch
  out["resumed_loss"] = history.history["loss"]
  out["weights"] = [w.tolist() for w in model.get_weights()]
  # Every worker sees the chief's last checkpoint and backup, and has
  # removed its temporary files of the last epoch (the workers share one
  # temporary directory).
  strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
  out["backup_after_training"] = os.path.exists(backup)
  out["checkpoints"] = sorted(os.listdir(checkpoints))
  out["temporary_files"] = sorted(name for _, _, names in os.walk(tempfile.gettempdir())
                                  for name in names if name.endswith((".h5", ".json")))
  return out


def client_libraries(ctx):
  """tf_keras (Keras 2): `fit`, `evaluate` and `predict` of the small
  classifier on global batches of 16, then `_fit_with_checkpoints` with a
  legacy optimizer; then Orbit's
  Controller training and evaluating its single-task example (with
  checkpoints and summaries in a directory of this worker's)."""
  import orbit_programs  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  strategy = ctx.strategy(timeout_seconds=60)
  loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def compiled(optimizer, metrics=()):
    with strategy.scope():
      model = classifier(tf_keras)
      model.compile(optimizer=optimizer, loss=loss, metrics=list(metrics))
    return model

  model = compiled(tf_keras.optimizers.Adam(learning_rate=0.01), ["accuracy"])
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(64)).batch(16)
  history = model.fit(dataset, epochs=2, verbose=0)
  out = {"history": history.history,
         "evaluation": model.evaluate(dataset, verbose=0, return_dict=True),
         "predictions": np.asarray(model.predict(
             tf.data.Dataset.from_tensor_slices(classification_data(24)[0]).batch(8),
             verbose=0)).tolist(),
         "weights": [w.tolist() for w in model.get_weights()]}

  out["checkpointing"] = _fit_with_checkpoints(
      ctx, strategy, tf_keras, lambda: tf_keras.optimizers.legacy.SGD(learning_rate=0.1),
      prefix="tf_keras_")
  out["orbit"] = orbit_programs.controller(
      strategy, os.path.join(ctx.directory, f"orbit_{ctx.index}"))
  return out


def tutorial_custom_loop(ctx):
  """TensorFlow's multi-worker custom training loop tutorial, on synthetic
  MNIST-shaped data: per-worker input from `distribute_datasets_from_function`,
  a small CNN, SGD, an accuracy metric, and the tutorial's checkpointing
  (chief into the directory, others into temporary ones they remove)."""
  import keras  # pylint: disable=g-import-not-at-top
  mod = ctx.mod
  strategy = ctx.strategy(timeout_seconds=60)
  per_worker_batch, steps_per_epoch, epochs = 8, 4, 2
  global_batch = per_worker_batch * strategy.num_replicas_in_sync
  rng = np.random.RandomState(0)
  x_train = rng.uniform(size=(256, 28, 28)).astype(np.float32)
  y_train = rng.randint(0, 10, size=(256,)).astype(np.int64)

  def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    return dataset.batch(batch_size)

  with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
  iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

  @tf.function
  def train_step(iterator):
    def step_fn(inputs):
      x, y = inputs
      with tf.GradientTape() as tape:
        predictions = model(x, training=True)
        per_example_loss = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None)(y, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      train_accuracy.update_state(y, predictions)
      return loss
    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(mod.ReduceOp.SUM, per_replica_losses, axis=None)

  epoch = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(model=model, epoch=epoch)
  checkpoint_dir = os.path.join(ctx.directory, "tutorial_ckpt")
  losses = []
  while epoch.numpy() < epochs:
    total = 0.0
    for _ in range(steps_per_epoch):
      total += float(train_step(iterator))
    losses.append(total / steps_per_epoch)
    epoch.assign_add(1)
    directory = write_dir(ctx, strategy, checkpoint_dir)
    tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1).save()
    if directory != checkpoint_dir:
      tf.io.gfile.rmtree(directory)
    train_accuracy.reset_state()
  return {"losses": losses, "weights": [w.tolist() for w in model.get_weights()],
          "leftover_dirs": sorted(d for d in os.listdir(ctx.directory)
                                  if d.startswith(f"worker{ctx.index}_"))}


def several(ctx):
  """The scenarios `ctx.args["scenarios"]` names, one after another in this
  process (fewer clusters to start); what each returned or raised, by name."""
  out = {}
  for name in ctx.args["scenarios"]:
    try:
      out[name] = globals()[name](ctx)
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"type": type(e).__name__, "error": str(e),
                   "traceback": traceback.format_exc()[-3000:]}
  return out


def start_up(ctx):
  """Only makes the strategy: how long it took, or how it failed."""
  start = time.monotonic()
  try:
    ctx.strategy()
  except Exception as e:  # pylint: disable=broad-except
    return {"type": type(e).__name__, "error": str(e),
            "seconds": time.monotonic() - start}
  return {"seconds": time.monotonic() - start}


def demo(ctx):
  """The main job, examples/custom_training_loop.py, as one worker."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
  import custom_training_loop  # pylint: disable=g-import-not-at-top
  output = io.StringIO()
  with contextlib.redirect_stdout(output):
    code = custom_training_loop.main(ctx.args["argv"])
  return {"code": code, "output": output.getvalue()}
