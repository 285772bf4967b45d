"""Training that survives preemption: `tfd.experimental.PreemptionCheckpointHandler`.

What it shows:

* A `PreemptionCheckpointHandler` over a `tf.train.Checkpoint` of the model,
  its optimizer and a step counter, made in the strategy's scope: it
  restores the latest checkpoint in `--checkpoint-dir` at once.
* Every training step goes through `handler.run`. When the process gets
  SIGTERM (a spot VM's or a scheduler's notice), the handler runs one more
  step, saves a checkpoint and exits with status 42; on several workers
  they all save at the same step.
* Run it again with the same folder: it resumes where it stopped, and ends
  with the weights of a run that was never stopped.

  python examples/preemption_training.py --checkpoint-dir ckpt --steps 200 &
  kill -TERM %1; wait %1; echo $?     # 42: saved, stopped
  python examples/preemption_training.py --checkpoint-dir ckpt --steps 200

With `--pause` each step sleeps that many seconds, so there is time to send
the signal. With a `TF_CONFIG` on each machine it trains with
`tfd.MultiWorkerMirroredStrategy` instead of `tfd.MirroredStrategy`.
"""

import argparse
import json
import os
import sys
import time

import _quiet_tensorflow  # pylint: disable=unused-import  # first: keeps start-up logs out

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

GLOBAL_BATCH = 32
NUM_FEATURES = 8


def make_data(steps):
  """`steps` global batches of a fixed linear problem."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=(steps * GLOBAL_BATCH, NUM_FEATURES)).astype(np.float32)
  y = (x @ rng.normal(size=(NUM_FEATURES, 1)) + 0.5).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint-dir", required=True)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--pause", type=float, default=0.0,
                      help="seconds each step sleeps, to leave time for a signal")
  args = parser.parse_args(argv)

  multi_worker = bool(os.environ.get("TF_CONFIG"))
  strategy = tfd.MultiWorkerMirroredStrategy() if multi_worker else tfd.MirroredStrategy()
  with strategy.scope():
    weights = tf.Variable(tf.zeros([NUM_FEATURES, 1]))
    bias = tf.Variable(0.0)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(weights=weights, bias=bias, optimizer=optimizer, step=step)
    handler = tfd.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver if multi_worker else None, checkpoint, args.checkpoint_dir)
  print(f"starting at step {int(step.numpy())} of {args.steps}", flush=True)

  @tf.function
  def train_step(x, y):
    def replica_step(x, y):
      with tf.GradientTape() as tape:
        error = x @ weights + bias - y
        loss = tf.nn.compute_average_loss(tf.square(error[:, 0]), global_batch_size=GLOBAL_BATCH)
      grads = tape.gradient(loss, [weights, bias])
      optimizer.apply_gradients(zip(grads, [weights, bias]))
      return loss
    loss = strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)
    step.assign_add(1)
    return loss

  batches = iter(strategy.experimental_distribute_dataset(
      make_data(args.steps).skip(int(step.numpy()))))
  loss = None
  while step.numpy() < args.steps:
    loss = handler.run(train_step, *next(batches))
    time.sleep(args.pause)
  print(json.dumps({"steps": int(step.numpy()), "loss": None if loss is None else float(loss),
                    "weights": weights.numpy()[:, 0].tolist(), "bias": float(bias.numpy())}),
        flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
