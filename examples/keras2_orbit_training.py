"""Training a tf_keras (Keras 2) model with Orbit's `Controller` under a `tfd` strategy.

What it shows:

* Orbit (TensorFlow Model Garden's training loop library) runs on `tfd`
  strategies unchanged: the strategy is made with `tfd`, the model, optimizer
  and metrics are built in its scope, and Orbit finds it there
  (`tf.distribute.get_strategy()` answers with the `tfd` strategy).
* An `orbit.StandardTrainer` whose `train_step` runs `step_fn` on every
  replica with `strategy.run`, scaling each replica's loss by the global
  batch (`tf.nn.compute_average_loss`); an `orbit.StandardEvaluator` for
  accuracy on held-out data.
* `orbit.Controller.train_and_evaluate`: several steps per `tf.function`
  call (a `tf.while_loop`), evaluation at intervals, and checkpoints through
  a `tf.train.CheckpointManager` (a later run with the same `--model-dir`
  goes on from the last one).

By default it trains with `tfd.MirroredStrategy` over every local device:
all GPUs, or 4 logical CPU devices on a machine without GPUs. With `--tpu`
it trains with `tfd.TPUStrategy`; `--tpu emulated:v3-8` emulates a v3-8
slice on 8 logical CPU devices, so TPU code runs anywhere.

    python examples/keras2_orbit_training.py
    python examples/keras2_orbit_training.py --tpu emulated:v3-8
    python examples/keras2_orbit_training.py --tpu local      # on a Cloud TPU VM

The data is a fixed-seed synthetic classification problem, so the loss must
fall; the script exits with status 1 if the last training loop's loss is
not below the first's.
"""

import argparse
import os
import sys
import tempfile

import _quiet_tensorflow  # pylint: disable=unused-import  # first: keeps start-up logs out

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top
import orbit  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

NUM_TRAIN = 2048
NUM_EVAL = 500  # Not a multiple of the batch: the last batch is partial.
NUM_FEATURES = 16
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


def make_strategy(tpu):
  if not tpu:
    configure_devices()
    return tfd.MirroredStrategy()
  resolver = tfd.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tfd.tpu.experimental.initialize_tpu_system(resolver)
  return tfd.TPUStrategy(resolver)


def make_datasets(global_batch):
  """Training (repeated) and evaluation data from one random linear teacher."""
  rng = np.random.default_rng(SEED)
  teacher = rng.normal(size=(NUM_FEATURES, NUM_CLASSES))
  datasets = []
  for size in [NUM_TRAIN, NUM_EVAL]:
    features = rng.normal(size=(size, NUM_FEATURES)).astype(np.float32)
    labels = np.argmax(features @ teacher, axis=1).astype(np.int32)
    datasets.append(tf.data.Dataset.from_tensor_slices((features, labels)))
  train, evaluation = datasets
  return (train.shuffle(NUM_TRAIN, seed=SEED).repeat().batch(global_batch, drop_remainder=True),
          evaluation.batch(global_batch))


class ClassifierTrainer(orbit.StandardTrainer):
  """One optimizer step per `train_step`, on every replica."""

  def __init__(self, strategy, model, optimizer, dataset, global_batch):
    self.strategy, self.model, self.optimizer = strategy, model, optimizer
    self.global_batch = global_batch
    self.loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf_keras.losses.Reduction.NONE)
    with strategy.scope():
      self.train_loss = tf_keras.metrics.Mean("loss")
      self.train_accuracy = tf_keras.metrics.SparseCategoricalAccuracy("accuracy")
    super().__init__(orbit.utils.make_distributed_dataset(strategy, dataset))

  def train_loop_begin(self):
    self.train_loss.reset_states()
    self.train_accuracy.reset_states()

  def train_step(self, iterator):
    def step_fn(features, labels):
      with tf.GradientTape() as tape:
        logits = self.model(features, training=True)
        per_example_loss = self.loss_fn(labels, logits)
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=self.global_batch)
      grads = tape.gradient(loss, self.model.trainable_variables)
      self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
      self.train_loss.update_state(per_example_loss)
      self.train_accuracy.update_state(labels, logits)

    self.strategy.run(step_fn, args=next(iterator))

  def train_loop_end(self):
    return {"loss": self.train_loss.result(), "accuracy": self.train_accuracy.result()}


class ClassifierEvaluator(orbit.StandardEvaluator):
  """Accuracy over the whole evaluation set."""

  def __init__(self, strategy, model, dataset):
    self.strategy, self.model = strategy, model
    with strategy.scope():
      self.accuracy = tf_keras.metrics.SparseCategoricalAccuracy("accuracy")
    super().__init__(orbit.utils.make_distributed_dataset(strategy, dataset))

  def eval_begin(self):
    self.accuracy.reset_states()

  def eval_step(self, iterator):
    def step_fn(features, labels):
      self.accuracy.update_state(labels, self.model(features, training=False))

    self.strategy.run(step_fn, args=next(iterator))

  def eval_end(self):
    return {"accuracy": self.accuracy.result()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tpu", default=None,
                      help="train with TPUStrategy: 'local' on a Cloud TPU VM, a TPU name, "
                           "or emulated:v3-8 (default: MirroredStrategy)")
  parser.add_argument("--steps", type=int, default=60, help="global step to train to")
  parser.add_argument("--steps-per-loop", type=int, default=10)
  parser.add_argument("--eval-interval", type=int, default=30)
  parser.add_argument("--global-batch", type=int, default=64)
  parser.add_argument("--model-dir", default=None,
                      help="checkpoints; a run goes on from the last one (default: a new "
                           "temporary directory)")
  args = parser.parse_args(argv)
  if args.steps < 2 * args.steps_per_loop:
    parser.error("--steps must be at least 2 loops to tell whether the loss fell. "
                 f"Received: steps={args.steps}, steps_per_loop={args.steps_per_loop}")

  strategy = make_strategy(args.tpu)
  replicas = strategy.num_replicas_in_sync
  print(f"strategy: {type(strategy).__name__}")
  print(f"replicas in sync: {replicas}")
  if args.global_batch % replicas:
    parser.error(f"--global-batch must be a multiple of the {replicas} replicas. "
                 f"Received: global_batch={args.global_batch}")

  tf_keras.utils.set_random_seed(SEED)
  train_data, eval_data = make_datasets(args.global_batch)
  with strategy.scope():
    model = tf_keras.Sequential([
        tf_keras.Input((NUM_FEATURES,)),
        tf_keras.layers.Dense(32, activation="relu"),
        tf_keras.layers.Dense(NUM_CLASSES)])
    optimizer = tf_keras.optimizers.SGD(learning_rate=0.5)
    trainer = ClassifierTrainer(strategy, model, optimizer, train_data, args.global_batch)
    evaluator = ClassifierEvaluator(strategy, model, eval_data)
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="keras2_orbit_")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint_manager = tf.train.CheckpointManager(
        checkpoint, model_dir, max_to_keep=2, step_counter=optimizer.iterations,
        checkpoint_interval=args.eval_interval)

  losses, accuracies = [], []
  controller = orbit.Controller(
      strategy=strategy, trainer=trainer, evaluator=evaluator,
      global_step=optimizer.iterations, steps_per_loop=args.steps_per_loop,
      checkpoint_manager=checkpoint_manager,
      train_actions=[lambda output: losses.append(float(output["loss"]))],
      eval_actions=[lambda output: accuracies.append(float(output["accuracy"]))])
  first_step = int(optimizer.iterations.numpy())
  controller.train_and_evaluate(train_steps=args.steps, eval_steps=-1,
                                eval_interval=args.eval_interval)

  print(f"checkpoints: {model_dir} (last: {os.path.basename(checkpoint_manager.latest_checkpoint)})")
  if len(losses) < 2:
    print(f"trained {len(losses)} loop(s) from step {first_step}: give --steps above it")
    return 1
  print("losses per loop: " + " ".join(f"{loss:.4f}" for loss in losses))
  print(f"evaluation accuracy: {accuracies[-1]:.3f}")
  fell = losses[-1] < losses[0]
  print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}: {'fell' if fell else 'did not fall'}")
  return 0 if fell else 1


if __name__ == "__main__":
  sys.exit(main())
