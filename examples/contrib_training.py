"""A TF 1.x training script written against `tf.contrib.distribute`, running
unchanged (but for the import) on current TensorFlow.

It is what contrib-era tutorials wrote: a graph and a Session, variables from
`tf.compat.v1.get_variable` in the strategy's scope, `tf.gradients` in each
tower, a `merge_call` that batch-reduces the towers' gradients and updates
the variables, `distribute_dataset`, and `run_steps_on_dataset` running
several steps per `session.run`. It trains a linear model and checks its
weights against the same SGD computed with numpy.

    python examples/contrib_training.py --strategy mirrored    # 4 CPU towers
    python examples/contrib_training.py --strategy one_device
    python examples/contrib_training.py --strategy tpu         # emulated v4-8
"""

import argparse
import sys

import _quiet_tensorflow  # pylint: disable=unused-import  # first: keeps start-up logs out

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

contrib = tfd.contrib  # was: tf.contrib.distribute
TOWER_BATCH = 4
LEARNING_RATE = 0.5
STEPS_PER_RUN = 5
RUNS = 6
TRUE_WEIGHTS = np.array([[1.0], [-2.0], [0.5]], np.float32)


def make_strategy(name):
  if name == "mirrored":
    return contrib.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
  if name == "one_device":
    return contrib.OneDeviceStrategy("/cpu:0")
  resolver = tfd.cluster_resolver.TPUClusterResolver(tpu="emulated:v4-8")
  return contrib.TPUStrategy(resolver, steps_per_run=STEPS_PER_RUN)


def make_data(num_towers):
  rng = np.random.RandomState(0)
  examples = TOWER_BATCH * num_towers * STEPS_PER_RUN * RUNS
  features = rng.rand(examples, 3).astype(np.float32)
  return features, features @ TRUE_WEIGHTS


def numpy_sgd(features, labels, num_towers):
  """The same training without TensorFlow: each step the towers' gradients
  of their mean squared errors, averaged."""
  weights = np.zeros([3, 1], np.float32)
  step_size = TOWER_BATCH * num_towers
  for start in range(0, len(features), step_size):
    x, y = features[start:start + step_size], labels[start:start + step_size]
    grads = [2 * xt.T @ (xt @ weights - yt) / TOWER_BATCH
             for xt, yt in zip(np.split(x, num_towers), np.split(y, num_towers))]
    weights = weights - LEARNING_RATE * np.mean(grads, axis=0)
  return weights


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--strategy", choices=["mirrored", "one_device", "tpu"],
                      default="mirrored")
  args = parser.parse_args(argv)
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
  tf.compat.v1.disable_eager_execution()

  strategy = make_strategy(args.strategy)
  features, labels = make_data(strategy.num_towers)
  with strategy.scope():
    weights = tf.compat.v1.get_variable(
        "weights", [3, 1], initializer=tf.compat.v1.zeros_initializer())
    dataset = strategy.distribute_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(TOWER_BATCH))
    iterator = dataset.make_initializable_iterator()

    def tower_fn(x, y):
      loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) - y))
      (grad,) = tf.gradients(loss, [weights])

      def merge_fn(distribution, grad):
        (mean_grad,) = distribution.batch_reduce(
            tf.compat.v1.VariableAggregation.MEAN, [(grad, weights)])
        return distribution.group(distribution.update(
            weights, lambda w, g: w.assign_sub(LEARNING_RATE * g), mean_grad))
      update = contrib.get_tower_context().merge_call(merge_fn, grad)
      with tf.control_dependencies([update]):
        return tf.identity(loss)

    def step_fn(context, x, y):
      loss = strategy.call_for_each_tower(tower_fn, x, y)
      context.set_last_step_output("loss", loss, reduce_op=tfd.ReduceOp.MEAN)
      return strategy.group(loss)

    context = strategy.run_steps_on_dataset(step_fn, iterator, iterations=STEPS_PER_RUN,
                                            initial_loop_values={"loss": 0.0})

  losses = []
  with tf.compat.v1.Session() as session:
    session.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
    for run in range(RUNS):
      _, loss = session.run([context.run_op, context.last_step_outputs["loss"]])
      losses.append(float(loss))
      print(f"run {run}: loss {loss:.5f}")
    trained = session.run(strategy.unwrap(weights))
  expected = numpy_sgd(features, labels, strategy.num_towers)
  close = all(np.allclose(w, expected, atol=1e-4) for w in trained)
  print(f"towers: {strategy.num_towers}; weights {trained[0].ravel().round(4).tolist()}; "
        f"numpy SGD {expected.ravel().round(4).tolist()}: {'equal' if close else 'DIFFERENT'}")
  return 0 if close and losses[-1] < losses[0] else 1


if __name__ == "__main__":
  sys.exit(main())
