"""TF 1.x programs that reach private names of the strategy through
TensorFlow's own helpers, run in a fresh process with TF 2.x behaviour
disabled, once on `tf.compat.v1.distribute` and once on `tfd.compat.v1`.
Prints one JSON object per implementation; tests/test_strategy_v1.py runs
it (docs/client_private_names.md).

    python tests/tf1_client_programs.py
"""

import json

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

import strategies  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_v2_behavior()

# Rows of tests/strategies.py.
STRATEGIES = ["v1_mirrored_pair", "v1_one_device", "v1_central_storage_pair", "v1_multi_worker",
              "v1_tpu"]


def _components(session, strategy, value):
  return [c.tolist() for c in session.run(list(strategy.experimental_local_results(value)))]


def moving_averages(mod):
  """`tf.compat.v1.train.ExponentialMovingAverage` and TensorFlow's
  moving-average helper (biased and zero-debiased) inside
  `extended.update`, in the replicas, and applied across them."""
  results = {}
  for name in STRATEGIES:
    for zero_debias in (False, True):
      with tf.Graph().as_default():
        strategy = strategies.make(name, ours=mod is tfd.compat.v1)
        with strategy.scope():
          v = tf.compat.v1.get_variable("v", initializer=[1.0, 2.0])
          w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
          x = tf.compat.v1.get_variable("x", initializer=[1.0, 2.0])
          ema = tf.compat.v1.train.ExponentialMovingAverage(0.5, zero_debias=zero_debias)
          apply_ema = ema.apply([x])

          def fn(unused_component, value, zero_debias=zero_debias):
            return tf.__internal__.train.assign_moving_average(
                v, value, 0.5, zero_debias=zero_debias)
          in_update = strategy.extended.update(v, fn, args=(tf.constant([2.0, 4.0]),))

          def replica_fn(zero_debias=zero_debias):
            i = tf.cast(mod.get_replica_context().replica_id_in_sync_group, tf.float32)
            return tf.__internal__.train.assign_moving_average(
                w, tf.stack([i, 2.0 * i]), 0.5, zero_debias=zero_debias)
          in_replicas = strategy.extended.call_for_each_replica(replica_fn)
        with tf.compat.v1.Session() as session:
          session.run(tf.compat.v1.global_variables_initializer())
          session.run([strategy.group(in_update), strategy.group(in_replicas), apply_ema])
          session.run(x.assign([3.0, 6.0]))
          session.run(apply_ema)
          results[f"{name}/{zero_debias}"] = [
              _components(session, strategy, variable) for variable in (v, w, ema.average(x))]
  return results


def metric_in_a_step_loop(mod):
  """A `tf.compat.v1.metrics.mean` made inside `experimental_run_steps_on_
  iterator`: TensorFlow makes its value outside the loop, where a Session
  can fetch it, when the strategy says which control flow the loop left
  (`extended._outer_control_flow_context`)."""
  with tf.Graph().as_default():
    strategy = strategies.make("v1_mirrored_pair", ours=mod is tfd.compat.v1)
    iterator = strategy.make_dataset_iterator(
        tf.data.Dataset.range(8).map(lambda v: tf.cast(v, tf.float32)).batch(2))
    values = {}

    def step(ctx, inputs):
      del ctx
      def replica_fn(x):
        value, update = tf.compat.v1.metrics.mean(x)
        values["mean"] = value
        return update
      return strategy.group(strategy.extended.call_for_each_replica(replica_fn, args=(inputs,)))

    with strategy.scope():
      ctx = strategy.extended.experimental_run_steps_on_iterator(step, iterator, iterations=3)
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer(), iterator.initializer])
      session.run(ctx.run_op)
      try:
        return {"mean": float(session.run(values["mean"]))}
      except (ValueError, TypeError, tf.errors.OpError) as e:
        return {"raised": type(e).__name__}


def keras_session(mod):
  """tf_keras's TF 1.x session initializes the variables made under the
  strategy that it has not initialized yet (marking each
  `_keras_initialized`) and reads them with `eval`."""
  from tf_keras.src import backend  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    strategy = strategies.make("v1_mirrored_pair", ours=mod is tfd.compat.v1)
    with strategy.scope():
      v = backend.variable(3.0)
      value = float(backend.get_value(v))
      v.assign(5.0)  # an op, not run
      return {"value": value, "marked": v._keras_initialized,  # pylint: disable=protected-access
              "batch": [float(x) for x in backend.batch_get_value([v])],
              "eval": float(backend.eval(v * 2.0))}


if __name__ == "__main__":
  for module in (tf.compat.v1.distribute, tfd.compat.v1):
    print(json.dumps({"moving_averages": moving_averages(module),
                      "metric_in_a_step_loop": metric_in_a_step_loop(module),
                      "keras_session": keras_session(module)}))
