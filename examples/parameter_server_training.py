"""Parameter-server training with `tfd.ParameterServerStrategy` and
`tfd.coordinator.ClusterCoordinator`, as in TensorFlow's "Parameter server
training with a custom training loop" tutorial.

What it shows:

* A cluster of one chief (the coordinator, which runs this training loop),
  workers (which run the scheduled functions) and parameter servers, "ps"
  (which hold the variables); worker and ps tasks only run `tfd.Server`.
* A linear model's variables created in `strategy.scope()` with a
  `variable_partitioner`: the weight matrix is a sharded variable, one shard
  on each ps.
* A per-worker dataset (`coordinator.create_per_worker_dataset`) and a
  `tf.function` train step scheduled many times with
  `coordinator.schedule`; `coordinator.join()` waits for them and
  `coordinator.fetch` reads their losses.

Without `TF_CONFIG` it starts its own cluster on this machine: 2 worker and
2 ps processes on 127.0.0.1 (this script again, each with a `TF_CONFIG`),
acts as the chief, and ends them when training ends:

    python examples/parameter_server_training.py

On several machines, run it on every one with a `TF_CONFIG` that lists the
`chief`, `worker` and `ps` tasks and names this machine's task; the chief
trains, the others serve until they are ended. The script exits with status
1 if the loss did not fall.
"""

import json
import os

_LOG_LEVEL_OF_USER = os.environ.get("TF_CPP_MIN_LOG_LEVEL")  # before it is set below

import _quiet_tensorflow  # pylint: disable=unused-import,g-import-not-at-top,wrong-import-order

import socket  # pylint: disable=g-import-not-at-top,wrong-import-order
import subprocess  # pylint: disable=g-import-not-at-top,wrong-import-order
import sys  # pylint: disable=g-import-not-at-top,wrong-import-order
import time  # pylint: disable=g-import-not-at-top,wrong-import-order

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top

NUM_FEATURES, GLOBAL_BATCH, EPOCHS, STEPS_PER_EPOCH = 64, 32, 4, 20
LEARNING_RATE = 0.02


def free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def start_local_cluster(processes):
  """Starts 2 worker and 2 ps processes, appending them to `processes`, and
  sets this process's TF_CONFIG (the chief's)."""
  ports = [f"127.0.0.1:{p}" for p in free_ports(5)]
  cluster = {"chief": ports[:1], "worker": ports[1:3], "ps": ports[3:]}
  env = dict(os.environ)
  if _LOG_LEVEL_OF_USER is None:  # children drop TensorFlow's start-up lines too
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  for job in ("worker", "ps"):
    for index in range(2):
      env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
      processes.append(subprocess.Popen([sys.executable, __file__], env=dict(env)))
      print(f"started {job} {index} at {cluster[job][index]} (pid {processes[-1].pid})")
  os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
  deadline = time.monotonic() + 60
  for address in ports[1:]:
    while True:
      if any(p.poll() is not None for p in processes):
        raise RuntimeError("a worker or ps process exited while starting")
      try:
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=1).close()
        break
      except OSError:
        if time.monotonic() > deadline:
          raise TimeoutError(f"no server at {address} after 60 s") from None
        time.sleep(0.1)


def end(processes):
  for process in processes:
    process.terminate()
  for process in processes:
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait(timeout=10)
  print(f"ended pids {' '.join(str(p.pid) for p in processes)}")


def train():
  resolver = tfd.cluster_resolver.TFConfigClusterResolver()
  strategy = tfd.ParameterServerStrategy(
      resolver, variable_partitioner=tfd.experimental.partitioners.FixedShardsPartitioner(2))
  coordinator = tfd.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    weights = tf.Variable(tf.zeros([NUM_FEATURES, 1]), name="weights")  # sharded over the ps
    bias = tf.Variable(0.0, name="bias")
  for v in [*weights.variables, bias]:
    print(f"variable {v.name} {v.shape.as_list()} on {v.device}")

  def dataset_fn(input_context):
    rng = np.random.default_rng(input_context.input_pipeline_id)
    features = rng.normal(size=(1024, NUM_FEATURES)).astype(np.float32)
    teacher = np.linspace(-1.0, 1.0, NUM_FEATURES, dtype=np.float32)[:, None]
    labels = features @ teacher + 0.5 + rng.normal(scale=0.1, size=(1024, 1)).astype(np.float32)
    batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(1024).repeat().batch(batch)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

  def replica_fn(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) + bias - y))
    variables = [*weights.variables, bias]
    for variable, grad in zip(variables, tape.gradient(loss, variables)):
      variable.assign_sub(LEARNING_RATE * grad)
    return loss

  @tf.function
  def step(iterator):
    x, y = next(iterator)
    return strategy.reduce("MEAN", strategy.run(replica_fn, args=(x, y)), axis=None)

  losses = []
  for epoch in range(1, EPOCHS + 1):
    results = [coordinator.schedule(step, args=(per_worker_iterator,))
               for _ in range(STEPS_PER_EPOCH)]
    coordinator.join()
    losses.append(float(np.mean([coordinator.fetch(r) for r in results])))
    print(f"epoch {epoch}: {STEPS_PER_EPOCH} steps  loss {losses[-1]:.4f}")
  fell = losses[-1] < losses[0]
  print(f"final loss {losses[-1]:.4f} (first epoch {losses[0]:.4f}): "
        f"{'fell' if fell else 'did NOT fall'}")
  return 0 if fell else 1


def main():
  if os.environ.get("TF_CONFIG"):
    resolver = tfd.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
      tfd.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                 task_index=resolver.task_id, protocol="grpc", start=True).join()
      return 0
    return train()
  processes = []
  try:
    start_local_cluster(processes)
    return train()
  finally:
    end(processes)


if __name__ == "__main__":
  sys.exit(main())
