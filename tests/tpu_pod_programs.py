"""TPUStrategy programs on an emulated multi-host slice ($TPU_NAME, e.g.
emulated:v4-32), each next to the same replicas in this process:
MirroredStrategy over as many local logical CPU devices. Prints one JSON
object; tests/test_tpu_pod_emulation.py runs it.

    TPU_NAME=emulated:v4-32 python tests/tpu_pod_programs.py WORKDIR
"""

import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tf_distribute_lite as tfd

import keras_models
import orbit_programs
import tf_keras_cases
import tpu_programs


def local_mirrored(replicas):
  return tfd.MirroredStrategy(
      [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)])


def on_this_host(program, *args):
  """`program(*args)` with this process's CPU as the default device, as on one
  host. Connected to the pod, the default device is its host 0 (the
  resolver's master), and there TensorFlow runs a `tf.function` call
  asynchronously: an eager read right after it of a local variable it
  assigned reads the old value (as with TensorFlow's MirroredStrategy)."""
  with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
    return program(*args)


def _tasks(values):
  return [tf.DeviceSpec.from_string(v.device).task for v in values]


def input_pipelines(strategy):
  """Where each replica's batch comes from: one pipeline per host, on its
  CPU:0 (seen unfetched), each host's share of the global batch."""
  unfetched = tfd.InputOptions(experimental_fetch_to_device=False)
  dataset = tf.data.Dataset.range(64).batch(32)
  step = next(iter(strategy.experimental_distribute_dataset(dataset, unfetched)))
  fetched = next(iter(strategy.experimental_distribute_dataset(dataset)))
  contexts = []

  def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.input_pipeline_id])
    return tf.data.Dataset.range(8).map(lambda x: x + 100 * context.input_pipeline_id).batch(2)
  from_function = next(iter(strategy.distribute_datasets_from_function(dataset_fn, unfetched)))
  return {"values": [v.numpy().tolist() for v in step.values],
          "pipelines": [v.device for v in step.values], "replicas": _tasks(fetched.values),
          "same_device": [v.device for v in fetched.values] == list(
              strategy.extended.worker_devices),
          "contexts": contexts,
          "from_function": [v.numpy().tolist() for v in from_function.values],
          "from_function_pipelines": _tasks(from_function.values)}


def reductions(strategy):
  """`all_reduce`, `all_gather` in a step; `reduce` and `gather` after it."""
  @tf.function
  def step():
    def replica_fn():
      context = tfd.get_replica_context()
      x = tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0
      return (context.all_reduce("SUM", x), context.all_reduce("MEAN", x),
              context.all_gather(tf.reshape(x, [1]), 0), tf.reshape(x, [1]))
    return strategy.run(replica_fn)
  total, mean, gathered, x = step()
  return {"all_reduce": [float(total.values[0]), float(total.values[-1]), float(mean.values[7])],
          "all_gather": gathered.values[-1].numpy().tolist(),
          "reduce": [float(strategy.reduce("SUM", x, axis=0)),
                     strategy.reduce("MEAN", x, axis=None).numpy().tolist()],
          "gather": strategy.gather(x, axis=0).numpy().tolist()}


def model_parallel(resolver, topology):
  """Replicas of 2 cores on two hosts each: a dense layer whose input is
  split across the cores and whose output is on logical device 0."""
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[1, 1, 2, 1], num_replicas=topology.num_tasks * 2)
  strategy = tfd.TPUStrategy(resolver, experimental_device_assignment=assignment)
  with strategy.scope():
    kernel = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))
  dataset = tf.data.Dataset.range(64).map(lambda x: tf.cast(x, tf.float32)).batch(16).map(
      lambda x: tf.reshape(x, [4, 4]))

  @tf.function
  def step(x):
    def replica_fn(x):
      x = strategy.experimental_split_to_logical_devices(x, [1, 2])
      return strategy.experimental_assign_to_logical_device(tf.matmul(x, kernel), 0)
    return strategy.run(replica_fn, args=(x,))
  outputs = [np.concatenate([v.numpy() for v in step(x).values])
             for x in strategy.experimental_distribute_dataset(dataset)]
  plain = [x.numpy() @ kernel.values[0].numpy() for x in dataset]
  rows = lambda arrays: sorted(map(tuple, np.concatenate(arrays).tolist()))  # hosts' shares
  cores = strategy.extended._tpu_devices  # pylint: disable=protected-access
  return {"replicas": strategy.num_replicas_in_sync,
          "hosts": [strategy.extended.num_hosts, strategy.extended.num_replicas_per_host],
          "replica_0_tasks": [tf.DeviceSpec.from_string(d).task for d in cores[0]],
          "equal": rows(outputs) == rows(plain)}


def iterators_on_busy_hosts(strategy):
  """Steps each right after `iter()`, while every host is busy: each step
  reads started iterators (TensorFlow's runtime would run a step's read on a
  host before the eager op that starts its iterator there, ~1 in 2)."""
  dist = strategy.experimental_distribute_dataset(
      tf.data.Dataset.range(64).map(lambda x: tf.cast(x, tf.float32)).batch(32))
  step = tf.function(lambda iterator: strategy.run(tf.reduce_sum, args=(next(iterator),)))
  sums = []
  for _ in range(6):
    for host in range(strategy.extended.num_hosts):
      with tf.device(f"/job:worker/replica:0/task:{host}/device:CPU:0"):
        busy = tf.random.normal([1000, 1000])
        tf.linalg.matmul(busy, busy)
    try:
      sums.append(float(strategy.reduce("SUM", step(iter(dist)), axis=None)))
    except tf.errors.FailedPreconditionError as e:  # "the iterator has not been initialized"
      sums.append(type(e).__name__)
  return sums


def keras_fit(strategy):
  """Keras 3 `fit` (a new iterator on every host each epoch) and `evaluate`."""
  with strategy.scope():
    model = keras_models.classifier()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = keras_models.classification_data(64)
  history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
  return {"losses": history.history["loss"],
          "evaluation": model.evaluate(x, y, batch_size=32, verbose=0)}


def checkpoints(strategy, workdir):
  """A variable saved on the pod, restored on one host, changed, saved and
  restored on the pod."""
  local = local_mirrored(strategy.num_replicas_in_sync)
  with strategy.scope():
    pod = tf.Variable([1.0, 2.0])
  with local.scope():
    here = tf.Variable([0.0, 0.0])
  path = tf.train.Checkpoint(v=pod).save(os.path.join(workdir, "pod"))
  tf.train.Checkpoint(v=here).restore(path).assert_consumed()
  restored_here = here.numpy().tolist()
  here.assign([3.0, 4.0])
  tf.train.Checkpoint(v=pod).restore(
      tf.train.Checkpoint(v=here).save(os.path.join(workdir, "local"))).assert_consumed()
  return {"on_one_host": restored_here,
          "on_the_pod": [v.numpy().tolist() for v in pod.values[::5]]}


def main(workdir):
  resolver = tfd.cluster_resolver.TPUClusterResolver()
  topology = tfd.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tfd.TPUStrategy(resolver)
  local = local_mirrored(strategy.num_replicas_in_sync)
  programs = {
      "input": lambda: input_pipelines(strategy),
      "reductions": lambda: reductions(strategy),
      "values": lambda: tpu_programs.spec_values_on_worker_devices(resolver),
      "spec_2_0": lambda: tpu_programs.spec_2_0_examples(resolver),
      "training": lambda: tpu_programs.training_loop(resolver),
      "model_parallel": lambda: model_parallel(resolver, topology),
      "checkpoints": lambda: checkpoints(strategy, workdir),
      "tf_keras": lambda: {name: tf_keras_cases.outcome(
          "fit_arrays", s, os.path.join(workdir, name)) for name, s in [
              ("pod", strategy), ("local", local)]},
      "busy_hosts": lambda: iterators_on_busy_hosts(strategy),
      "keras": lambda: {"pod": keras_fit(strategy), "local": keras_fit(local)},
      "orbit": lambda: orbit_programs.controller(strategy, os.path.join(workdir, "orbit")),
      "orbit_replica_data": lambda: {
          "pod": orbit_programs.replica_data_controller(strategy),
          "local": on_this_host(orbit_programs.replica_data_controller, local)},
  }
  results = {"strategy": [strategy.num_replicas_in_sync, strategy.extended.num_hosts,
                          strategy.extended.num_replicas_per_host]}
  for name, program in programs.items():
    start = time.monotonic()
    results[name] = program()
    print(f"{name}: {time.monotonic() - start:.1f} s", file=sys.stderr)
  print(json.dumps(results))


if __name__ == "__main__":
  cpu = tf.config.list_physical_devices("CPU")[0]  # for a slice of up to 16 cores
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 16)
  main(sys.argv[1])
