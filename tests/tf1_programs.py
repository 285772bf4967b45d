"""TF 1.x programs, run in a fresh process with TF 2.x behaviour disabled
(as their authors ran them), once on `tf.compat.v1.distribute` and once on
`tfd.compat.v1`. Prints one JSON object per implementation;
tests/test_strategy_v1.py runs it.

    python tests/tf1_programs.py
"""

import json

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
from outcomes import device_names  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_v2_behavior()


def tutorial(mod):
  """TensorFlow's archived TF1 tutorial "Custom training loops with
  tf.distribute.Strategy", as written there but for random images in place
  of Fashion-MNIST, two CPUs, seeds, fewer steps and a larger learning rate:
  a Keras model in `scope()`, a distributed dataset's initializable
  iterator re-initialized each epoch, `next(iterator)`, `strategy.run`,
  `tf.nn.compute_average_loss`, `strategy.reduce`, a Session loop."""
  rng = np.random.RandomState(0)
  train_images = rng.randint(0, 256, (512, 28, 28)).astype("uint8")[..., None]
  train_images = train_images / np.float32(255)
  train_labels = rng.randint(0, 10, 512).astype("int64")
  losses = []
  with tf.Graph().as_default():
    keras.utils.set_random_seed(0)
    strategy = mod.MirroredStrategy(["/cpu:0", "/cpu:1"])
    print("Number of devices: {}".format(strategy.num_replicas_in_sync))

    BUFFER_SIZE = len(train_images)  # pylint: disable=invalid-name
    BATCH_SIZE_PER_REPLICA = 64  # pylint: disable=invalid-name
    BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync  # pylint: disable=invalid-name
    EPOCHS = 3  # pylint: disable=invalid-name

    train_dataset = tf.data.Dataset.from_tensor_slices(
        (train_images, train_labels)).shuffle(BUFFER_SIZE, seed=1).batch(BATCH_SIZE)
    train_ds = strategy.experimental_distribute_dataset(train_dataset)

    with strategy.scope():
      model = tf.keras.Sequential([
          tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
          tf.keras.layers.MaxPooling2D(),
          tf.keras.layers.Conv2D(64, 3, activation="relu"),
          tf.keras.layers.MaxPooling2D(),
          tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(64, activation="relu"),
          tf.keras.layers.Dense(10, activation="softmax")
      ])
      optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)

    with strategy.scope():
      def train_step(dist_inputs):
        def step_fn(inputs):
          images, labels = inputs
          logits = model(images)
          cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
              logits=logits, labels=labels)
          loss = tf.nn.compute_average_loss(cross_entropy, global_batch_size=BATCH_SIZE)
          train_op = optimizer.minimize(loss)
          with tf.control_dependencies([train_op]):
            return tf.identity(loss)

        per_replica_losses = strategy.run(
            step_fn, args=(dist_inputs,))
        mean_loss = strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
        return mean_loss

    with strategy.scope():
      train_iterator = train_ds.make_initializable_iterator()
      iterator_init = train_iterator.initializer
      var_init = tf.compat.v1.global_variables_initializer()
      loss = train_step(next(train_iterator))
      with tf.compat.v1.Session() as sess:
        sess.run([var_init])
        for epoch in range(EPOCHS):
          sess.run([iterator_init])
          for step in range(BUFFER_SIZE // BATCH_SIZE):
            losses.append(float(sess.run(loss)))
            print("Epoch {} Step {} Loss {:.4f}".format(epoch + 1, step, losses[-1]))
  return {"losses": losses}


def run_steps(mod):
  """`make_dataset_iterator` and `experimental_run_steps_on_iterator`."""
  with tf.Graph().as_default():
    strategy = mod.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                    cross_device_ops=mod.ReductionToOneDevice())
    with strategy.scope():
      total = tf.compat.v1.get_variable("total", [], initializer=tf.compat.v1.zeros_initializer(),
                                        aggregation=tf.VariableAggregation.SUM)
    iterator = strategy.make_dataset_iterator(
        tf.data.Dataset.range(16).map(lambda v: tf.cast(v, tf.float32)).batch(4))

    def step(ctx, inputs):
      def replica(x):
        return total.assign_add(tf.reduce_sum(x))
      result = strategy.extended.call_for_each_replica(replica, args=(inputs,))
      ctx.set_last_step_output("total", result, reduce_op=tf.distribute.ReduceOp.MEAN)
      return strategy.group(result)

    ctx = strategy.extended.experimental_run_steps_on_iterator(
        step, iterator, iterations=3, initial_loop_values={"total": 0.0})
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(iterator.initializer)
      _, last = session.run([ctx.run_op, ctx.last_step_outputs["total"]])
      return {"total": float(session.run(strategy.experimental_local_results(total))[0]),
              "last": float(last)}


def devices(mod):
  """What the TF 1.x strategies call their devices (`device_names`); in
  place of our contrib strategies TensorFlow, which has no contrib, runs
  its compat.v1 strategies of the same kind."""
  contrib = tfd.contrib if mod is tfd.compat.v1 else mod
  makers = {
      "MirroredStrategy": lambda: mod.MirroredStrategy(["/cpu:0", "/cpu:1"]),
      "MirroredStrategy()": mod.MirroredStrategy,
      "OneDeviceStrategy": lambda: mod.OneDeviceStrategy("/cpu:1"),
      "CentralStorageStrategy": lambda: mod.experimental.CentralStorageStrategy(
          ["/cpu:0", "/cpu:1"]),
      "contrib.MirroredStrategy": lambda: contrib.MirroredStrategy(["/cpu:0", "/cpu:1"]),
      "contrib.OneDeviceStrategy": lambda: contrib.OneDeviceStrategy("/cpu:1"),
  }
  names = {}
  for name, make in makers.items():
    with tf.Graph().as_default():
      names[name] = device_names(make())
  return names


if __name__ == "__main__":
  for module in (tf.compat.v1.distribute, tfd.compat.v1):
    print(json.dumps({"tutorial": tutorial(module), "run_steps": run_steps(module),
                      "devices": devices(module)}))
