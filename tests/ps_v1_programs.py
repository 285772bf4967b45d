"""TF 1.x parameter-server programs, run in a fresh process with TF 2.x
behaviour disabled (as their authors ran them), once on
`tf.compat.v1.distribute` and once on `tfd.compat.v1`; each starts its own
worker and ps servers in this process. Prints one JSON object per
implementation; tests/test_parameter_server_strategy_v1.py runs it.

    python tests/ps_v1_programs.py
"""

import json
import os
import re

import numpy as np
import tensorflow as tf

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
from multi_worker import free_ports  # pylint: disable=g-import-not-at-top

tf.compat.v1.disable_v2_behavior()

# Bounds every step a session runs on the servers.
SESSION_CONFIG = tf.compat.v1.ConfigProto(operation_timeout_in_ms=60_000)
FEATURES = np.array([[1.0, 2.0, 0.5], [0.0, 1.0, 3.0], [2.0, 0.5, 1.0], [1.5, 1.0, 0.0]],
                    np.float32)
LABELS = FEATURES @ np.array([[2.0], [-1.0], [0.5]], np.float32) + 1.0


def start_servers():
  """One worker and two ps servers on free 127.0.0.1 ports, in this
  process; the cluster and the worker's server."""
  cluster = tf.train.ClusterSpec({
      job: [f"127.0.0.1:{port}" for port in ports]
      for job, ports in zip(("worker", "ps"), (free_ports(1), free_ports(2)))})
  servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, start=True)
             for job in ("worker", "ps") for i in range(cluster.num_tasks(job))]
  return cluster, servers[0]


def train(mod, resolver, target):
  """A linear model trained for 5 steps by `GradientDescentOptimizer`
  under `mod.experimental.ParameterServerStrategy(resolver)`, in a Session
  on `target`: the variables' devices and reprs, the losses and the values
  after training, and what the strategy says of itself."""
  with tf.Graph().as_default():
    strategy = mod.experimental.ParameterServerStrategy(resolver)
    config = strategy.update_config_proto(SESSION_CONFIG)
    with strategy.scope():
      weights = tf.compat.v1.get_variable(
          "weights", [3, 1], initializer=tf.compat.v1.zeros_initializer())
      bias = tf.Variable([0.5], name="bias")
      step = tf.compat.v1.train.get_or_create_global_step()
      optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.02)
      contexts = []

      def input_fn(context):
        contexts.append([context.num_input_pipelines, context.input_pipeline_id,
                         context.num_replicas_in_sync])
        return tf.data.Dataset.from_tensor_slices((FEATURES, LABELS)).repeat().batch(2)
      iterator = strategy.make_input_fn_iterator(input_fn)

      def step_fn(inputs):
        features, labels = inputs
        loss = tf.reduce_mean(tf.square(tf.matmul(features, weights) + bias - labels))
        train_op = optimizer.minimize(loss, global_step=step)
        with tf.control_dependencies([train_op]):
          return tf.identity(loss)
      loss = strategy.reduce(
          "MEAN", strategy.extended.call_for_each_replica(step_fn, args=(iterator.get_next(),)))
    variables = tf.compat.v1.global_variables()
    with tf.compat.v1.Session(target, config=config) as session:
      session.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
      losses = [float(session.run(loss)) for _ in range(5)]
      values = {v.op.name: session.run(v).tolist() for v in variables}
    extended = strategy.extended
    return {
        "devices": {v.op.name: v.device for v in variables},
        "reprs": [repr(v) for v in variables],
        "trainable": [v.op.name for v in tf.compat.v1.trainable_variables()],
        "losses": losses,
        "values": values,
        "input_contexts": contexts,
        "strategy": re.sub(r"^<[\w.]+\.(\w+) object at 0x\w+>$", r"\1", repr(strategy)),
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "worker_devices": list(extended.worker_devices),
        "parameter_devices": list(extended.parameter_devices),
        "flags": [extended.should_checkpoint, extended.should_save_summary,
                  extended.experimental_should_init, extended.experimental_between_graph],
        "config": str(config),
    }


def programs(mod, resolvers):
  """`train` on the cluster of servers of this process, and on this machine
  with no cluster (a `SimpleClusterResolver` with an empty cluster, or the
  default resolver with no TF_CONFIG) in a local Session."""
  cluster, worker = start_servers()
  on_cluster = resolvers.SimpleClusterResolver(cluster, task_type="worker", task_id=0)
  return {"cluster": train(mod, on_cluster, worker.target),
          "local": train(mod, resolvers.SimpleClusterResolver(tf.train.ClusterSpec({})), ""),
          "default_resolver": train(mod, None, "")}


if __name__ == "__main__":
  os.environ.pop("TF_CONFIG", None)
  for module, resolver_module in ((tf.compat.v1.distribute, tf.distribute.cluster_resolver),
                                  (tfd.compat.v1, tfd.cluster_resolver)):
    print(json.dumps(programs(module, resolver_module)))
