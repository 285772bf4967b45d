"""Training under a `PreemptionCheckpointHandler`, in worker processes of a
`multi_worker.LocalCluster` (scenario "preemption_scenarios.NAME"), with
`tf.distribute` or `tf_distribute_lite`.

`train` fits a linear model to `regression_data` on global batches of 16,
one `handler.run` per step, from the checkpoint the handler restores. A
worker named in `signal_at` stops after that many steps, says so in the
file `ready-INDEX` (holding its process id) and waits until the test has
sent it SIGTERM, seen it taken and written `signal-sent`: the notice always
comes after the same step. `keras_fit` does the same with tf_keras's `fit` and
`BackupAndRestore`.
"""

import json
import os
import pathlib
import time

import numpy as np
import tensorflow as tf

from multi_worker_scenarios import wait_for_file

BATCH = 16
LEARNING_RATE = 0.1


def regression_data(steps):
  """`steps` batches of 16 examples: 3 features, one target."""
  rng = np.random.RandomState(5)
  x = rng.normal(size=(BATCH * steps, 3)).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1
  return x, y


def plain_weights(steps):
  """The weights of `train` after `steps` steps, without strategy or handler."""
  x, y = regression_data(steps)
  w = np.zeros([3, 1], np.float32)
  for start in range(0, len(x), BATCH):
    xb, yb = x[start:start + BATCH], y[start:start + BATCH]
    w = w - LEARNING_RATE * (2 * xb.T @ (xb @ w - yb) / BATCH)
  return w


def _strategy(ctx):
  """The strategy `ctx.args["kind"]` names, and the resolver for the handler."""
  mod, kind = ctx.mod, ctx.args.get("kind", "multi_worker")
  if kind == "multi_worker":
    strategy = mod.MultiWorkerMirroredStrategy()
    return strategy, strategy.cluster_resolver
  if kind == "mirrored":
    return mod.MirroredStrategy(["CPU:0", "CPU:1"]), None
  if kind == "one_device":
    return mod.OneDeviceStrategy("CPU:0"), None
  resolver = mod.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  return mod.TPUStrategy(resolver), resolver


def _termination_config(ctx):
  """Args "grace_period", "exit_code" (an `exit_fn` that exits with it) and
  "keep_managers" (a `CheckpointManager` keeping that many) as TerminationConfig."""
  args = ctx.args
  exit_fn = None
  if "exit_code" in args:
    exit_fn = lambda: os._exit(args["exit_code"])  # pylint: disable=protected-access
  if "grace_period" not in args and exit_fn is None:
    return None
  return ctx.mod.experimental.TerminationConfig(
      exit_fn=exit_fn, grace_period=args.get("grace_period"))


def train(ctx):
  """Args: steps, checkpoint_dir (by default `run/checkpoints` in the
  cluster's directory), kind, signal_at ([index, step]),
  step_seconds (a pause in each step), keep (a `CheckpointManager` keeping
  that many checkpoints instead of a `Checkpoint`), and those of
  `_termination_config`."""
  mod, args = ctx.mod, ctx.args
  strategy, resolver = _strategy(ctx)
  steps = args["steps"]
  checkpoint_dir = args.get("checkpoint_dir") or os.path.join(ctx.directory, "run", "checkpoints")
  with strategy.scope():
    w = tf.Variable(tf.zeros([3, 1]), aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    step = tf.Variable(0, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  checkpoint = tf.train.Checkpoint(w=w, step=step)
  if args.get("orbit"):
    return _train_with_orbit_action(ctx, strategy, resolver, checkpoint, w, step)
  if args.get("keep"):
    target, directory = tf.train.CheckpointManager(
        checkpoint, checkpoint_dir, max_to_keep=args["keep"]), None
  else:
    target, directory = checkpoint, checkpoint_dir
  handler = mod.experimental.PreemptionCheckpointHandler(
      resolver, target, directory, termination_config=_termination_config(ctx))
  restored = int(step.numpy())
  train_step, batches = _training(ctx, strategy, w, step)
  while step.numpy() < steps:
    handler.run(train_step, *next(batches))
    time.sleep(args.get("step_seconds", 0))
    if args.get("signal_at") == [ctx.index, int(step.numpy())]:
      _wait_for_signal(ctx)
  return {"restored": restored, "total_run_calls": _total_run_calls(handler),
          "weights": w.numpy().tolist(),
          "next_to_checkpoint_dir": sorted(os.listdir(os.path.dirname(checkpoint_dir)))}


def _train_with_orbit_action(ctx, strategy, resolver, checkpoint, w, step):
  """`train` with Orbit's `SaveCheckpointIfPreempted` action after each
  step (as Orbit's Controller calls it), over a `CheckpointManager` of this
  worker's own folder, numbered by the step."""
  from orbit import actions  # pylint: disable=g-import-not-at-top
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(ctx.directory, "run", f"orbit_{ctx.index}"), max_to_keep=1)
  action = actions.SaveCheckpointIfPreempted(resolver, manager, checkpoint_number=step)
  restored = int(step.numpy())
  train_step, batches = _training(ctx, strategy, w, step)
  while step.numpy() < ctx.args["steps"]:
    action(train_step(*next(batches)))
    if ctx.args.get("signal_at") == [ctx.index, int(step.numpy())]:
      _wait_for_signal(ctx)
  return {"restored": restored, "total_run_calls": None, "weights": w.numpy().tolist(),
          "checkpoints": sorted(os.listdir(manager.directory))}


def _training(ctx, strategy, w, step):
  """The training step of `train`, and its batches from the restored step on."""
  mod = ctx.mod

  @tf.function
  def train_step(x, y):
    def replica_step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(x @ w - y)) / BATCH
      grad = mod.get_replica_context().all_reduce("SUM", tape.gradient(loss, w))
      w.assign_sub(LEARNING_RATE * grad)
      return loss
    loss = strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)
    step.assign_add(1)
    return loss

  dataset = tf.data.Dataset.from_tensor_slices(regression_data(ctx.args["steps"])).batch(BATCH)
  return train_step, iter(strategy.experimental_distribute_dataset(
      dataset.skip(int(step.numpy()))))


def _total_run_calls(handler):
  """None where TensorFlow's handler is off (on Google Cloud without GPUs)."""
  try:
    return int(handler.total_run_calls)
  except AttributeError:
    return None


def _wait_for_signal(ctx):
  directory = pathlib.Path(ctx.directory)
  (directory / f"ready-{ctx.index}.tmp").write_text(json.dumps(os.getpid()))
  (directory / f"ready-{ctx.index}.tmp").rename(directory / f"ready-{ctx.index}")
  wait_for_file(directory / "signal-sent")


def without_handler(ctx):
  """Joins the cluster and waits; the worker in `signal_at` gets SIGTERM
  (no handler). Once the signal has been taken (the test writes
  `signal-sent` then), every worker still running reports it lived on.
  Args "watch_seconds": a `PreemptionWatcher` reports the notice it saw
  within that time, and returns from `block_until_worker_exit`."""
  strategy = ctx.mod.MultiWorkerMirroredStrategy()
  watch_seconds = ctx.args.get("watch_seconds")
  watcher = ctx.mod.experimental.PreemptionWatcher() if watch_seconds else None
  strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
  if ctx.args["signal_at"][0] == ctx.index:
    _wait_for_signal(ctx)
  else:
    wait_for_file(pathlib.Path(ctx.directory) / "signal-sent")
  out = {"lived_on": True}
  if watcher is not None:
    deadline = time.monotonic() + watch_seconds
    while watcher.preemption_message is None and time.monotonic() < deadline:
      time.sleep(0.05)
    out["preemption_message"] = watcher.preemption_message
    watcher.block_until_worker_exit()
    out["blocked_until_exit"] = True
  return out


# --- tf_keras's BackupAndRestore.

KERAS_STEPS_PER_EPOCH = 4


def keras_fit(ctx):
  """tf_keras's `fit` of `keras_models.classifier` with `BackupAndRestore`
  into `run/backup`, `epochs` epochs of 4 steps. Args: epochs, kind,
  save_freq, save_before_preemption, signal_at ([index, steps] of this run:
  the pause comes before `BackupAndRestore` sees the step end, as a notice
  in the middle of the step would).

  Every step trains on the same global batch of 16: a job that resumes in
  the middle of an epoch reads the epoch's data from its start (tf_keras
  counts steps, it does not skip data), so only then does it end where an
  uninterrupted run does, whatever step it resumes at."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from keras_models import classification_data, classifier  # pylint: disable=g-import-not-at-top
  args = ctx.args
  strategy, _ = _strategy(ctx)
  with strategy.scope():
    model = _keras_classifier(tf_keras, classifier)
  ran = []

  class Steps(tf_keras.callbacks.Callback):
    """Records the (epoch, batch) of each step, and pauses for the signal."""

    def on_epoch_begin(self, epoch, logs=None):
      self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
      ran.append([int(self.epoch), int(batch)])
      if args.get("signal_at") == [ctx.index, len(ran)]:
        _wait_for_signal(ctx)

  backup = tf_keras.callbacks.BackupAndRestore(
      os.path.join(ctx.directory, "run", "backup"), save_freq=args.get("save_freq", "epoch"),
      save_before_preemption=args.get("save_before_preemption", False))
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(16)).batch(16).repeat()
  model.fit(dataset, epochs=args["epochs"], steps_per_epoch=KERAS_STEPS_PER_EPOCH, verbose=0,
            callbacks=[Steps(), backup])
  handler = getattr(model, "_preemption_handler", None)
  return {"ran": ran, "weights": [w.tolist() for w in model.get_weights()],
          "handler": handler and type(handler).__module__}


def _keras_classifier(tf_keras, classifier):
  model = classifier(tf_keras)
  model.compile(optimizer=tf_keras.optimizers.SGD(learning_rate=0.1),
                loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def keras_plain_weights(steps):
  """The weights of `keras_fit` after `steps` steps, without strategy or
  backup."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from keras_models import classification_data, classifier  # pylint: disable=g-import-not-at-top
  model = _keras_classifier(tf_keras, classifier)
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(16)).batch(16).repeat()
  model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
  return [w.tolist() for w in model.get_weights()]
