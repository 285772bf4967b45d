"""Training on a TPU with `tfd.TPUStrategy`: a small classifier, a
distributed dataset, a few steps with the loss falling.

    python examples/tpu_training.py                 # emulated v3-8 slice
    python examples/tpu_training.py --tpu local     # on a Cloud TPU VM
    python examples/tpu_training.py --tpu emulated:v4-32   # a 4-host pod, emulated

Without `--tpu`, `$TPU_NAME` is read, and without it the program runs on an
emulated v3-8 slice (8 logical CPU devices, one per TPU core), so the same
code runs here and on a TPU. The script exits with status 1 if the loss did
not fall. On an emulated pod (v4-16, v4-32, v3-32, v5litepod-16) each host
is a local process and every host reads its share of each global batch.
"""

import argparse
import os
import sys

import _quiet_tensorflow  # pylint: disable=unused-import  # first: keeps start-up logs out

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import keras  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

GLOBAL_BATCH = 64
STEPS = 12


def make_dataset():
  """A learnable problem: labels from a random linear teacher."""
  rng = np.random.default_rng(0)
  features = rng.normal(size=(GLOBAL_BATCH * STEPS, 16)).astype(np.float32)
  labels = np.argmax(features @ rng.normal(size=(16, 4)), axis=1).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
      GLOBAL_BATCH, drop_remainder=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tpu", default=os.environ.get("TPU_NAME") or "emulated:v3-8",
                      help="'local' on a Cloud TPU VM, a TPU name, emulated:v3-8 or emulated:v4-32")
  args = parser.parse_args(argv)

  resolver = tfd.cluster_resolver.TPUClusterResolver(tpu=args.tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tfd.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tfd.TPUStrategy(resolver)
  print(f"replicas in sync: {strategy.num_replicas_in_sync}")

  with strategy.scope():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    optimizer = keras.optimizers.SGD(learning_rate=0.5)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

  @tf.function
  def train_step(features, labels):
    def step_fn(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_fn(labels, model(features)),
                                          global_batch_size=GLOBAL_BATCH)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("SUM", strategy.run(step_fn, args=(features, labels)), axis=None)

  losses = []
  for step, (features, labels) in enumerate(
      strategy.experimental_distribute_dataset(make_dataset())):
    losses.append(float(train_step(features, labels)))
    print(f"step {step}: loss {losses[-1]:.4f}")
  fell = losses[-1] < losses[0]
  print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}: {'fell' if fell else 'did not fall'}")
  return 0 if fell else 1


if __name__ == "__main__":
  sys.exit(main())
