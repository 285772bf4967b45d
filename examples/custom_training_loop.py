"""Data-parallel training with `tfd.MirroredStrategy` in a custom training loop.

What it shows:

* `tfd.MirroredStrategy()` over every local device: all GPUs, or, on a machine
  without GPUs, 4 logical CPU devices configured before TensorFlow starts, so
  there are always several replicas.
* A Keras 3 model, optimizer and metric created in `strategy.scope()`: their
  variables become mirrored (or sync-on-read) variables.
* A `tf.function` train step that runs `step_fn` on every replica with
  `strategy.run` and sums the per-replica losses with `strategy.reduce`.
  Each replica scales its loss by the *global* batch size
  (`tf.nn.compute_average_loss`), so the summed gradients equal those of one
  big batch.
* Input from `strategy.experimental_distribute_dataset`: a shuffled
  `tf.data.Dataset` batched by the *global* batch size, each batch split
  into one slice per replica and placed on that replica's device.

The data is a fixed-seed synthetic classification problem (labels from a
random linear teacher plus noise), so the loss must fall; the script exits
with status 1 if the last epoch's loss is not below the first's.

  python examples/custom_training_loop.py --epochs 5 --global-batch 256

On several machines: run the same command on each, with a `TF_CONFIG` that
lists every machine and says which one this is; the script then trains with
`tfd.MultiWorkerMirroredStrategy` (one replica per GPU, or per machine
without GPUs) and each global batch is shared among all machines' replicas.
"""

import argparse
import os
import sys
import time

import _quiet_tensorflow  # pylint: disable=unused-import  # first: keeps start-up logs out

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import keras  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

NUM_EXAMPLES = 4096
NUM_FEATURES = 32
NUM_CLASSES = 4
NUM_CPU_REPLICAS = 4
SEED = 0


def configure_devices():
  """Without GPUs, splits the CPU into 4 logical devices (before TF starts)."""
  if tf.config.list_physical_devices("GPU"):
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_CPU_REPLICAS)


def make_data():
  """A learnable classification problem: a random linear teacher + noise."""
  rng = np.random.default_rng(SEED)
  features = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype(np.float32)
  teacher = rng.normal(size=(NUM_FEATURES, NUM_CLASSES)).astype(np.float32)
  noise = rng.normal(scale=0.5, size=(NUM_EXAMPLES, NUM_CLASSES))
  labels = np.argmax(features @ teacher + noise, axis=1).astype(np.int32)
  return features, labels


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=5)
  parser.add_argument("--global-batch", type=int, default=256)
  args = parser.parse_args(argv)
  global_batch = args.global_batch
  if args.epochs < 2:
    parser.error("--epochs must be at least 2 to tell whether the loss fell. "
                 f"Received: epochs={args.epochs}")

  configure_devices()
  if os.environ.get("TF_CONFIG"):
    strategy = tfd.MultiWorkerMirroredStrategy()
  else:
    strategy = tfd.MirroredStrategy()
  replicas = strategy.num_replicas_in_sync
  print(f"devices: {', '.join(strategy.extended.worker_devices)}")
  print(f"replicas in sync: {replicas}")
  if global_batch % replicas:
    parser.error(f"--global-batch must be a multiple of the {replicas} "
                 f"replicas. Received: global_batch={global_batch}")

  features, labels = make_data()
  steps_per_epoch = NUM_EXAMPLES // global_batch  # The remainder is dropped.
  if not steps_per_epoch:
    parser.error(f"--global-batch must be at most {NUM_EXAMPLES}. "
                 f"Received: global_batch={global_batch}")
  print(f"data: {NUM_EXAMPLES} examples x {NUM_FEATURES} features, "
        f"{NUM_CLASSES} classes; global batch {global_batch} "
        f"({global_batch // replicas} per replica)")

  keras.utils.set_random_seed(SEED)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((NUM_FEATURES,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])
    optimizer = keras.optimizers.Adam(learning_rate=1e-2)
    # Slot variables made here, not lazily inside the tf.function.
    optimizer.build(model.trainable_variables)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
  loss_object = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=None)

  def step_fn(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = tf.nn.compute_average_loss(
          loss_object(y, logits), global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    accuracy.update_state(y, logits)
    return loss

  @tf.function
  def train_step(per_replica_batch):
    per_replica_loss = strategy.run(step_fn, args=per_replica_batch)
    return strategy.reduce(tfd.ReduceOp.SUM, per_replica_loss, axis=None)

  dataset = (tf.data.Dataset.from_tensor_slices((features, labels))
             .shuffle(NUM_EXAMPLES, seed=SEED)
             .batch(global_batch, drop_remainder=True)
             .prefetch(tf.data.AUTOTUNE))
  dist_dataset = strategy.experimental_distribute_dataset(dataset)

  epoch_losses = []
  for epoch in range(1, args.epochs + 1):
    accuracy.reset_state()
    total_loss = 0.0
    start = time.perf_counter()
    for per_replica_batch in dist_dataset:
      total_loss += float(train_step(per_replica_batch))
    seconds = time.perf_counter() - start
    epoch_losses.append(total_loss / steps_per_epoch)
    print(f"epoch {epoch}: steps {steps_per_epoch}  loss {epoch_losses[-1]:.4f}  "
          f"accuracy {float(accuracy.result()):.3f}  "
          f"{steps_per_epoch * global_batch / seconds:,.0f} examples/s")

  fell = epoch_losses[-1] < epoch_losses[0]
  print(f"final loss {epoch_losses[-1]:.4f} (first epoch {epoch_losses[0]:.4f}): "
        f"{'fell' if fell else 'did NOT fall'}")
  return 0 if fell else 1


if __name__ == "__main__":
  sys.exit(main())
