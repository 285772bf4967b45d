"""Parameter-server scenarios, run by the chief of a `multi_worker.LocalCluster`
with `num_ps` > 0, under `tf.distribute` ("tf") or `tf_distribute_lite`.

Each returns JSON-able facts that the tests compare between the two.
"""

import json
import os
import time

import numpy as np
import tensorflow as tf
import tf_keras

from tf_distribute_lite import cluster_runtime


def _cluster(context):
  """The cluster of TF_CONFIG; with args servers="in_process" its worker and
  ps servers start in this process, as in TensorFlow's tutorial."""
  cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
  if context.args.get("servers") == "in_process":
    context.servers = [
        tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", start=True)
        for job in ("worker", "ps") for i in range(cluster.num_tasks(job))]
  # TensorFlow's strategy does not wait for the servers; wait for both.
  missing = cluster_runtime.unanswered_tasks(cluster, ("worker", "ps"), time.monotonic() + 60)
  if missing:
    raise TimeoutError(f"no server answers after 60 s for {missing}")
  return cluster


def parameter_server_strategy(context, partitioner=None):
  """The module's ParameterServerStrategy over the cluster of TF_CONFIG."""
  mod = context.mod
  cluster = _cluster(context)
  if context.args.get("resolver") == "tf_config":
    resolver = mod.cluster_resolver.TFConfigClusterResolver()
  else:
    resolver = mod.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
  return mod.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def _error(call):
  try:
    call()
  except Exception as e:  # pylint: disable=broad-except
    return type(e).__name__
  return None


def _raised(call):
  """The class name and message of what `call()` raises, or None."""
  try:
    call()
  except Exception as e:  # pylint: disable=broad-except
    return [type(e).__name__, str(e)]
  return None


def basics(context):
  """Strategy, variables, scheduling, datasets, misuse and errors."""
  mod = context.mod
  partitioner = mod.experimental.partitioners.FixedShardsPartitioner(2)
  strategy = parameter_server_strategy(context, partitioner)
  facts = {"types": [type(strategy).__name__, type(strategy.extended).__name__],
           "replicas": strategy.num_replicas_in_sync,
           "worker_devices": list(strategy.extended.worker_devices),
           # Read by tf_keras (docs/client_private_names.md).
           "should_use_with_coordinator": strategy._should_use_with_coordinator,  # pylint: disable=protected-access
           "num_workers": strategy._num_workers,  # pylint: disable=protected-access
           # Read by tf_keras's BackupAndRestore and ModelCheckpoint (where to write).
           "in_multi_worker_mode": strategy.extended._in_multi_worker_mode(),  # pylint: disable=protected-access
           "should_checkpoint": strategy.extended.should_checkpoint}
  with strategy.scope():
    counter = tf.Variable(0.0)
    scalar_b = tf.Variable(1, dtype=tf.int64)
    table = tf.Variable(tf.reshape(tf.range(404, dtype=tf.float32), [101, 4]))
    small = tf.Variable([1.0, 2.0, 3.0])
  facts["placement"] = [counter.device, scalar_b.device] + [
      [v.device, v.shape.as_list()] for s in (table, small) for v in s.variables]
  facts["sharded"] = [type(table).__name__, table.shape.as_list(),
                      tf.nn.embedding_lookup(table, [0, 100, 51]).numpy().tolist()]
  coordinator = mod.coordinator.ClusterCoordinator(strategy)
  facts["same_coordinator"] = mod.coordinator.ClusterCoordinator(strategy) is coordinator

  @tf.function
  def increment():
    counter.assign_add(1.0)
    return mod.coordinator.experimental_get_current_worker_index()

  results = [coordinator.schedule(increment) for _ in range(10)]
  coordinator.join()
  facts["counter"] = float(counter.numpy())
  facts["done"] = coordinator.done()
  facts["indices"] = sorted({int(r.fetch()) for r in results} | {0, 1})
  facts["get"] = type(results[0].get()).__name__

  # Once the value of the only function scheduled is fetched, the
  # coordinator is done (a race in the queue's bookkeeping made this False
  # about half the time).
  @tf.function
  def tiny():
    return tf.constant(1.0)

  done_after_fetch = []
  for _ in range(30):
    coordinator.fetch(coordinator.schedule(tiny))
    done_after_fetch.append(coordinator.done())
  facts["done_after_fetch"] = done_after_fetch.count(True)

  @tf.function
  def replicated(x):
    per_replica = strategy.run(lambda y: y * 2.0 + table[1, 0], args=(x,))
    return strategy.reduce("SUM", per_replica, axis=None)

  facts["run"] = coordinator.fetch(coordinator.schedule(replicated, args=(tf.constant(3.0),)))
  facts["run"] = float(facts["run"])

  def dataset_fn(input_context):
    facts["input_context"] = [input_context.num_input_pipelines,
                              input_context.input_pipeline_id,
                              input_context.num_replicas_in_sync]
    return tf.data.Dataset.range(10).batch(2)

  @tf.function
  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

  per_worker = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
  iterator = iter(per_worker)
  facts["next"] = _error(lambda: next(iterator))

  @tf.function
  def read(it):
    return mod.coordinator.experimental_get_current_worker_index(), next(it)

  reads = [coordinator.schedule(read, args=(iterator,)) for _ in range(6)]
  coordinator.join()
  by_worker = {}
  for r in reads:
    index, batch = r.fetch()
    by_worker.setdefault(int(index), []).append(batch.tolist())
  expected = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  facts["each_worker_reads_its_own_dataset_in_order"] = all(
      batches == expected[:len(batches)] for batches in by_worker.values())

  # A dataset, and one from experimental_distribute_dataset, are copied to
  # each worker; the latter cannot be read on the coordinator.
  plain = tf.data.Dataset.range(4).map(lambda x: x * 10)
  distributed = strategy.experimental_distribute_dataset(plain)
  facts["unbuilt_iter"] = _error(lambda: iter(distributed))
  for name, dataset in (("plain", plain), ("distributed", distributed)):
    copied = iter(coordinator.create_per_worker_dataset(dataset))
    firsts = [coordinator.schedule(read, args=(copied,)) for _ in range(2)]
    coordinator.join()
    facts[f"{name}_dataset_on_workers"] = sorted(
        int(batch) for _, batch in (r.fetch() for r in firsts))[0]
  # tf_keras makes TensorFlow's ClusterCoordinator: it is this one.
  facts["tf_coordinator_is_this"] = (
      tf.distribute.experimental.coordinator.ClusterCoordinator(strategy) is coordinator)
  facts["tf_remote_value"] = isinstance(
      results[0], tf.distribute.experimental.coordinator.RemoteValue)

  def indexed_dataset():
    index = mod.coordinator.experimental_get_current_worker_index()
    return tf.data.Dataset.from_tensors(index).repeat()

  indexed = iter(coordinator.create_per_worker_dataset(indexed_dataset))
  pairs = [coordinator.schedule(read, args=(indexed,)) for _ in range(6)]
  coordinator.join()
  facts["dataset_fn_sees_its_worker"] = all(
      int(a) == int(b) for a, b in (p.fetch() for p in pairs))

  facts["misuse"] = {
      "python_function": _error(lambda: coordinator.schedule(lambda: 1)),
      "remote_value_argument": _error(
          lambda: coordinator.schedule(replicated, args=(results[0],))),
      "worker_index_outside": _error(mod.coordinator.experimental_get_current_worker_index),
  }

  @tf.function
  def failing():
    tf.debugging.assert_less(tf.random.uniform([]), -1.0, message="scheduled failure")
    return tf.constant(1.0)

  failed = coordinator.schedule(failing)
  facts["user_error"] = {"join": _error(coordinator.join), "fetch": _error(failed.fetch)}
  after = coordinator.schedule(increment)
  coordinator.join()
  facts["user_error"]["works_after"] = int(after.fetch()) in (0, 1)
  facts["counter_after"] = float(counter.numpy())

  for _ in range(3):
    coordinator.schedule(increment)  # values dropped at once: the functions still run
  coordinator.join()
  coordinator.schedule(failing)
  facts["dropped_values"] = {"counter": float(counter.numpy()),
                             "failed_join": _error(coordinator.join)}

  def returns_int():
    return 42

  # Last, after which TensorFlow's coordinator may have failed closures.
  facts["bad_input"] = {
      "kwargs_list": _raised(lambda: coordinator.schedule(increment, kwargs=[1.0])),
      "args_not_a_tuple": _raised(lambda: coordinator.schedule(replicated, args=3.0)),
      "dataset_not_a_function": _raised(lambda: coordinator.create_per_worker_dataset(42)),
      "dataset_fn_returns_int": _raised(
          lambda: iter(coordinator.create_per_worker_dataset(returns_int))),
  }
  return facts


def training(context):
  """A tf_keras model with sharded variables trained by one scheduled
  function (one worker: exact), then saved."""
  mod = context.mod
  strategy = parameter_server_strategy(context, mod.experimental.partitioners.FixedShardsPartitioner(2))
  coordinator = mod.coordinator.ClusterCoordinator(strategy)
  tf.random.set_seed(1)
  with strategy.scope():
    embedding = tf_keras.layers.Embedding(10, 3, embeddings_initializer=tf_keras.initializers.Constant(0.1))
    dense = tf_keras.layers.Dense(1, kernel_initializer="ones")
    inputs = tf_keras.Input((2,), dtype="int32")
    model = tf_keras.Model(inputs, dense(tf_keras.layers.Flatten()(embedding(inputs))))
    optimizer = tf_keras.optimizers.Adam(0.05)
  ids = tf.constant([[i % 10, (3 * i) % 10] for i in range(8)])
  targets = tf.constant([[float(i % 3)] for i in range(8)])

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(ids) - targets))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function
  def train(steps):
    loss = tf.constant(0.0)
    for _ in tf.range(steps):
      loss = strategy.reduce("SUM", strategy.run(step), axis=None)
    return loss

  loss = coordinator.fetch(coordinator.schedule(train, args=(tf.constant(20),)))
  facts = {
      "embedding": [type(embedding.embeddings).__name__,
                    [v.shape.as_list() for v in embedding.embeddings.variables]],
      "trainable": len(model.trainable_variables),
      "loss": float(loss),
      "weights": [np.asarray(w).tolist() for w in model.get_weights()],
  }
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  facts["checkpoint"] = checkpoint.save(os.path.join(context.directory, "ckpt"))
  module = tf.Module()
  module.table = embedding.embeddings
  module.lookup = tf.function(lambda ids: tf.nn.embedding_lookup(module.table, ids),
                              input_signature=[tf.TensorSpec([None], tf.int32)])
  facts["saved_model"] = os.path.join(context.directory, "saved_model")
  tf.saved_model.save(module, facts["saved_model"])
  facts["legacy_slots"] = _legacy_optimizer_slots(
      context, strategy, coordinator, model,
      lambda: tf.reduce_mean(tf.square(model(ids) - targets)))
  return facts


def _legacy_optimizer_slots(context, strategy, coordinator, model, loss_fn):
  """A legacy tf_keras optimizer's slots of the model's ShardedVariable: one
  added by hand under the scope, and those a training step makes, read back
  and saved in a checkpoint (as TensorFlow's tutorial does with RMSprop)."""
  embeddings = model.layers[1].embeddings
  with strategy.scope():
    added = tf_keras.optimizers.legacy.RMSprop(0.1).add_slot(embeddings, "rms")
    optimizer = tf_keras.optimizers.legacy.RMSprop(0.1)

  @tf.function
  def train():
    def step():
      with tf.GradientTape() as tape:
        loss = loss_fn()
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("SUM", strategy.run(step), axis=None)

  coordinator.fetch(coordinator.schedule(train))
  slot = optimizer.get_slot(embeddings, "rms")
  path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
      os.path.join(context.directory, "legacy", "ckpt"))
  key = "model/layer_with_weights-0/embeddings/.OPTIMIZER_SLOT/optimizer/rms/.ATTRIBUTES/VARIABLE_VALUE"
  return {
      "add_slot": [added.name, added.shape.as_list(), added.device, added.numpy().tolist()],
      "slot": [type(slot).__name__, [s.device for s in slot.variables],
               tf.convert_to_tensor(slot).numpy().tolist()],
      "checkpoint_keys": [list(k) for k in tf.train.list_variables(path)
                          if k[0] != "_CHECKPOINTABLE_OBJECT_GRAPH"],
      "checkpoint_slot": tf.train.load_checkpoint(path).get_tensor(key).tolist(),
  }


def faults(context):
  """A worker killed in the middle of functions, then restarted; then a
  user error; then a ps killed."""
  mod = context.mod
  strategy = parameter_server_strategy(context)
  coordinator = mod.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    counter = tf.Variable(0.0)
    started = tf.Variable([0.0, 0.0])  # functions each worker has begun

  @tf.function
  def slow():
    index = mod.coordinator.experimental_get_current_worker_index()
    x = 0.0 * tf.reduce_sum(started.assign_add(tf.one_hot(index, 2)))
    for _ in tf.range(context.args.get("loops", 20000)):
      x += tf.reduce_sum(tf.random.uniform([50, 50]))
    counter.assign_add(1.0)
    return index

  @tf.function
  def read(it):
    return mod.coordinator.experimental_get_current_worker_index(), next(it)

  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.range(1000)))
  facts = {}
  start = time.monotonic()
  results = [coordinator.schedule(slow) for _ in range(6)]
  deadline = time.monotonic() + 60
  while started.numpy()[1] < 1:  # until worker 1 has begun one
    if time.monotonic() > deadline:
      raise TimeoutError("worker 1 began no function in 60 s")
    time.sleep(0.02)
  context.request("kill", "worker", 1)
  context.request("restart", "worker", 1)
  coordinator.join()
  facts["worker_lost"] = {"seconds": time.monotonic() - start,
                          "all_done": all(r.fetch() in (0, 1) for r in results),
                          "counter_at_least": float(counter.numpy()) >= 6}
  # The restarted worker takes functions again, and reads its per-worker
  # iterator, made there again from the start.
  indices = set()
  read_by = {}
  deadline = time.monotonic() + 60
  while (indices != {0, 1} or sorted(read_by) != [0, 1]) and time.monotonic() < deadline:
    batch = [coordinator.schedule(slow) for _ in range(4)]
    reads = [coordinator.schedule(read, args=(iterator,)) for _ in range(4)]
    coordinator.join()
    indices |= {int(r.fetch()) for r in batch}
    for index, value in (r.fetch() for r in reads):
      read_by.setdefault(int(index), []).append(int(value))
  facts["restarted_worker_used"] = indices == {0, 1}
  facts["iterator_reads"] = read_by

  context.request("kill", "ps", 0)
  start = time.monotonic()
  lost = [coordinator.schedule(slow) for _ in range(2)]
  facts["ps_lost"] = {"join": _error(coordinator.join), "fetch": _error(lost[0].fetch)}

  def again():
    coordinator.schedule(slow)
    coordinator.join()
  facts["ps_lost"]["again"] = _error(again)
  facts["ps_lost"]["seconds"] = time.monotonic() - start
  return facts


def keras_fit(context):
  """tf_keras `Model.fit` as in TensorFlow's "Parameter server training with
  Keras" tutorial (a `DatasetCreator`), then on a dataset and on arrays with
  `steps_per_epoch`, with a checkpoint callback; then `evaluate` (exact,
  sharded over the workers, with args evaluation_shards="auto") and
  `predict`."""
  mod = context.mod
  strategy = parameter_server_strategy(context, mod.experimental.partitioners.MinSizePartitioner(
      min_shard_bytes=16, max_shards=2))
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.layers.Dense(4, kernel_initializer="ones"),
                                 tf_keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(tf_keras.optimizers.legacy.SGD(0.01), loss="mse", metrics=["mae"],
                  steps_per_execution=2,
                  pss_evaluation_shards=context.args.get("evaluation_shards", 0))
  x = np.arange(64 * 3, dtype=np.float32).reshape([64, 3]) / 100.0
  y = np.sum(x, axis=1, keepdims=True) * 0.5

  def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(8)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)

  checkpoints = os.path.join(context.directory, "checkpoints", "epoch{epoch}")

  def evaluate():
    if context.args.get("evaluation_shards"):  # exact: each batch once
      return model.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0)
    return model.evaluate(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                          steps=4, verbose=0)

  fits = [model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2,
                    steps_per_epoch=4, verbose=0, callbacks=[
                        tf_keras.callbacks.ModelCheckpoint(checkpoints, save_weights_only=True)]),
          model.fit(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8),
                    epochs=1, steps_per_epoch=4, verbose=0),
          model.fit(x, y, batch_size=8, epochs=1, steps_per_epoch=4, shuffle=False,
                    verbose=0)]
  return {
      "histories": [fit.history for fit in fits],
      "variables": [[v.device, v.shape.as_list()] for v in model.variables],
      "checkpoints": sorted(os.listdir(os.path.dirname(checkpoints))),
      "weights": [np.asarray(w).tolist() for w in model.get_weights()],
      "evaluate": [type(v).__name__ + repr(float(v)) for v in evaluate()],
      "predict": model.predict(x[:5], verbose=0).tolist(),
      "steps": int(model.optimizer.iterations.numpy()),
      "keras3_fit": _keras3_fit(strategy),
  }


def _keras3_fit(strategy):
  """Keras 3 does not train with parameter servers: its `fit` refuses."""
  import keras  # pylint: disable=import-outside-toplevel
  with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
  x = np.ones([8, 3], np.float32)
  try:
    model.fit(x, x[:, :1], epochs=1, verbose=0)
  except Exception as e:  # pylint: disable=broad-except
    return [type(e).__name__, str(e)]
  return None
