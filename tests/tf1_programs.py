"""TF 1.x programs, run in a fresh process with TF 2.x behaviour disabled
(as their authors ran them), once on `tf.compat.v1.distribute` and once on
`tfd.compat.v1`. Prints one JSON object per implementation;
tests/test_strategy_v1.py runs it.

    python tests/tf1_programs.py
"""

import json

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_v2_behavior()
GLOBAL_BATCH = 4


def tutorial(mod):
  """The archived TF1 tutorial "Custom training loops with
  tf.distribute.Strategy": a distributed dataset's initializable iterator,
  `run` and `reduce` in `scope()`, a TF1 optimizer, a Session loop."""
  with tf.Graph().as_default():
    strategy = mod.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                    cross_device_ops=mod.ReductionToOneDevice())
    with strategy.scope():
      w = tf.compat.v1.get_variable("w", [2, 3], initializer=tf.compat.v1.constant_initializer(0.1))
      b = tf.compat.v1.get_variable("b", [3], initializer=tf.compat.v1.zeros_initializer())
      optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    x = np.random.RandomState(0).rand(16, 2).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[np.arange(16) % 3]
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat(3).batch(GLOBAL_BATCH)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    def train_step(dist_inputs):
      def step_fn(inputs):
        features, labels = inputs
        logits = tf.matmul(features, w) + b
        cross_entropy = tf.nn.softmax_cross_entropy_with_logits(logits=logits, labels=labels)
        loss = tf.reduce_sum(cross_entropy) * (1.0 / GLOBAL_BATCH)
        train_op = optimizer.minimize(loss)
        with tf.control_dependencies([train_op]):
          return tf.identity(loss)
      per_replica_losses = strategy.run(step_fn, args=(dist_inputs,))
      return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    with strategy.scope():
      input_iterator = dist_dataset.make_initializable_iterator()
      iterator_init = input_iterator.initializer
      var_init = tf.compat.v1.global_variables_initializer()
      loss = train_step(input_iterator.get_next())
      with tf.compat.v1.Session() as session:
        session.run([var_init, iterator_init])
        losses = [float(session.run(loss)) for _ in range(6)]
        weights = [a.tolist() for a in session.run(strategy.experimental_local_results(w))]
  return {"losses": losses, "weights": weights}


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


if __name__ == "__main__":
  for module in (tf.compat.v1.distribute, tfd.compat.v1):
    print(json.dumps({"tutorial": tutorial(module), "run_steps": run_steps(module)}))
