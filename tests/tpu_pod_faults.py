"""A training loop on an emulated multi-host slice ($TPU_NAME, e.g.
emulated:v4-16) that checkpoints each step, in three runs: `kill` and `stop`
SIGKILL or SIGSTOP host 1 after step 3, `resume` starts again from the last
checkpoint and then trains the same steps from scratch, uninterrupted.
`preempt` trains through a `PreemptionCheckpointHandler` instead, which saves
only on a termination notice: a first run sends itself SIGTERM after step 3
(the handler saves after the next step and exits), a restarted one resumes
where the handler saved, then trains the same steps from scratch. Prints the
hosts' process ids, then one JSON object (`preempt`: one after each step, as
the run may end in any); tests/test_tpu_pod_emulation.py runs it.

    TPU_NAME=emulated:v4-16 python tests/tpu_pod_faults.py kill|stop|resume|preempt WORKDIR
"""

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import tpu_pod_emulation

STEPS, FAULT_AFTER, BATCH = 6, 3, 16


def _gone(pid):
  """Whether process `pid` has ended (a zombie has)."""
  return tpu_pod_emulation.process_state(pid) in (None, "Z")


def _linear_model(strategy):
  """The data, the weights and momentum (made in `strategy`'s scope) and the
  replica step (momentum SGD, gradients all-reduced) both training loops run."""
  rng = np.random.RandomState(1)
  x = rng.rand(STEPS * BATCH, 3).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
  with strategy.scope():
    w, velocity = tf.Variable(tf.zeros([3, 1])), tf.Variable(tf.zeros([3, 1]))

  @tf.function
  def replica_step(features, labels):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(features @ w - labels)) / BATCH
    grad = tfd.get_replica_context().all_reduce("SUM", tape.gradient(loss, w))
    velocity.assign(0.9 * velocity + grad)
    w.assign_sub(0.1 * velocity)
    return loss
  return x, y, w, velocity, replica_step


def train(strategy, workdir, losses, fault=None):
  """Momentum SGD on a linear model from the last checkpoint in `workdir`
  (if any) to step STEPS, saving each step and appending its loss to
  `losses`; `fault()` is called before step FAULT_AFTER + 1. Returns the
  weights."""
  x, y, w, velocity, replica_step = _linear_model(strategy)
  done = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(w=w, velocity=velocity, done=done), workdir, max_to_keep=2)
  manager.restore_or_initialize()

  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).skip(int(done))
  for batch in strategy.experimental_distribute_dataset(dataset):
    if fault is not None and int(done) == FAULT_AFTER:
      fault()
    losses.append(float(strategy.reduce("SUM", strategy.run(replica_step, args=batch), None)))
    done.assign_add(1)
    manager.save(checkpoint_number=done)
  return w.numpy().tolist()


def train_preemptible(strategy, resolver, workdir, result, key, preempt=False):
  """`train`'s steps, each run by a `PreemptionCheckpointHandler` saving into
  `workdir` (and restoring from it), printing `result` after each with the
  step's loss appended to `result[key]`; with `preempt` the process sends
  itself SIGTERM after step FAULT_AFTER. Returns the weights."""
  x, y, w, velocity, replica_step = _linear_model(strategy)
  handler = tfd.experimental.PreemptionCheckpointHandler(
      resolver, tf.train.Checkpoint(w=w, velocity=velocity), workdir)
  result.setdefault("restored", {})[key] = int(handler.total_run_calls)

  def train_step(batch):
    return strategy.reduce("SUM", strategy.run(replica_step, args=batch), None)

  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).skip(
      int(handler.total_run_calls))
  batches = iter(strategy.experimental_distribute_dataset(dataset))
  while handler.total_run_calls < STEPS:
    result[key].append(float(handler.run(train_step, next(batches))))
    print(json.dumps(result), flush=True)
    if preempt and handler.total_run_calls == FAULT_AFTER:
      os.kill(os.getpid(), signal.SIGTERM)
  return w.numpy().tolist()


def main(mode, workdir):
  resolver = tfd.cluster_resolver.TPUClusterResolver()
  pids = resolver._hosts.pids  # pylint: disable=protected-access
  print(*pids, flush=True)
  tfd.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tfd.TPUStrategy(resolver)
  result = {"losses": [], "again": []}
  if mode == "preempt":
    restart = tf.io.gfile.exists(workdir)
    result["weights"] = train_preemptible(strategy, resolver, workdir, result, "losses",
                                          preempt=not restart)
    result["weights_again"] = train_preemptible(
        strategy, resolver, workdir + "-again", result, "again")
  elif mode == "resume":
    result["weights"] = train(strategy, workdir, result["losses"])
    result["weights_again"] = train(strategy, workdir + "-again", result["again"])
  else:
    faulted = []

    def fault():
      os.kill(pids[1], signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
      faulted.append(time.monotonic())
    try:
      train(strategy, workdir, result["losses"], fault)
    except tf.errors.OpError as error:
      print(f"{mode}: failed {time.monotonic() - faulted[0]:.1f} s after the fault",
            file=sys.stderr)
      result["error"] = [type(error).__name__, isinstance(error, tf.errors.UnavailableError),
                         error.message]
      result["running"] = [pid for pid in pids if not _gone(pid)]
    result["checkpoint"] = os.path.basename(tf.train.latest_checkpoint(workdir))
  print(json.dumps(result))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
