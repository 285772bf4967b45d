"""TPU programs from the spec and the "Use TPUs" guide, run on an emulated
v3-8 slice in a fresh process (8 logical CPU devices), next to the same
computation without a strategy. Prints one JSON object;
tests/test_tpu_strategy.py runs it.

    TPU_NAME=emulated:v3-8 python tests/tpu_programs.py
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tf_distribute_lite as tfd


def spec_assign_to_logical_device(topology, resolver):
  """2 logical devices x 4 replicas; the add on logical device 0."""
  device_assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[1, 1, 2], num_replicas=4)
  strategy = tfd.experimental.TPUStrategy(resolver, device_assignment=device_assignment)
  inputs = tf.data.Dataset.from_tensor_slices(np.arange(32, dtype=np.float32).reshape(8, 4)).batch(4)
  iterator = iter(strategy.experimental_distribute_dataset(inputs))

  @tf.function()
  def step_fn(inputs):
    output = tf.add(inputs, inputs)
    return strategy.experimental_assign_to_logical_device(output, 0)

  result = strategy.run(step_fn, args=(next(iterator),))
  ours = np.concatenate([t.numpy() for t in strategy.experimental_local_results(result)])
  plain = (np.arange(16, dtype=np.float32).reshape(4, 4)) * 2
  return {"replicas": strategy.num_replicas_in_sync,
          "cores_per_replica": strategy.extended.num_logical_devices_per_replica,
          "equal": bool(np.array_equal(ours, plain))}


def spec_split_to_logical_devices(topology, resolver):
  """8 logical devices x 1 replica; images split [1, 2, 4, 1]."""
  device_assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[2, 2, 2], num_replicas=1)
  strategy = tfd.experimental.TPUStrategy(resolver, device_assignment=device_assignment)
  images = np.random.RandomState(0).rand(2, 8, 8, 3).astype(np.float32)
  labels = np.array([1, 0], np.int32)
  with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.Conv2D(4, 3),
                                 tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(2)])
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function()
  def step_fn(inputs):
    images, labels = inputs
    images = strategy.experimental_split_to_logical_devices(images, [1, 2, 4, 1])
    output = model(images)
    labels = strategy.experimental_replicate_to_logical_devices(labels)
    output = strategy.experimental_replicate_to_logical_devices(output)
    return loss_fn(labels, output)

  loss = strategy.run(step_fn, args=((tf.constant(images), tf.constant(labels)),))
  plain = loss_fn(labels, model(images)).numpy()
  return {"replicas": strategy.num_replicas_in_sync,
          "cores_per_replica": strategy.extended.num_logical_devices_per_replica,
          "equal": bool(np.allclose(loss.numpy(), plain, atol=1e-6))}


def spec_values_on_worker_devices(resolver):
  """`experimental_distribute_values_from_function` placing each value on
  its replica's device, as TF's docstring example does."""
  strategy = tfd.TPUStrategy(resolver)
  worker_devices = strategy.extended.worker_devices

  def value_fn(ctx):
    with tf.device(worker_devices[ctx.replica_id_in_sync_group]):
      return tf.constant(float(ctx.replica_id_in_sync_group))

  values = strategy.experimental_distribute_values_from_function(value_fn)
  devices = [v.device for v in strategy.experimental_local_results(values)]
  total = strategy.reduce("SUM", values, axis=None).numpy()
  return {"replicas": strategy.num_replicas_in_sync,
          "on_worker_devices": devices == list(worker_devices), "sum": float(total)}


def spec_2_0_examples(resolver):
  """The TF 2.0 TPUStrategy page's examples: `experimental_run_v2` over a
  distributed dataset, over datasets from a function, and a numpy dataset."""
  strategy = tfd.TPUStrategy(resolver)
  sums = []

  @tf.function  # a TPU runs only compiled steps (TF 2.0's ran this one eagerly)
  def train_step(x):
    return tf.reduce_sum(x)
  dataset = tf.data.Dataset.range(32).map(lambda v: tf.cast(v, tf.float32)).batch(16)
  for x in strategy.experimental_distribute_dataset(dataset):
    sums.append(float(strategy.reduce(
        "SUM", strategy.experimental_run_v2(train_step, args=(x,)), axis=None)))

  def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(16)
    d = tf.data.Dataset.from_tensors([[1.]]).repeat(32).batch(batch_size)
    return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  inputs = strategy.experimental_distribute_datasets_from_function(dataset_fn)
  from_function = [float(strategy.reduce(
      "SUM", strategy.experimental_run_v2(train_step, args=(batch,)), axis=None))
                   for batch in inputs]
  numpy_input = np.ones([16], dtype=np.float32)
  numpy_dataset = strategy.experimental_make_numpy_dataset(numpy_input)
  dist_dataset = strategy.experimental_distribute_dataset(numpy_dataset.batch(16))
  numpy_sums = [float(strategy.reduce("SUM", strategy.experimental_run_v2(
      train_step, args=(x,)), axis=None)) for x in dist_dataset]
  return {"sums": sums, "from_function": from_function, "numpy": numpy_sums}


def training_loop(resolver):
  """A linear model trained on a distributed dataset, against the same
  steps without a strategy."""
  rng = np.random.RandomState(1)
  x = rng.rand(64, 3).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

  def train(strategy):
    with strategy.scope():
      w = tf.Variable(tf.zeros([3, 1]))
    dist = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(batch):
      def replica_step(features, labels):
        with tf.GradientTape() as tape:
          loss = tf.reduce_sum(tf.square(features @ w - labels)) / 16
        grad = tape.gradient(loss, w)
        grad = tf.distribute.get_replica_context().all_reduce("SUM", grad)
        w.assign_sub(0.1 * grad)
        return loss
      return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)
    losses = [float(step(batch)) for batch in dist]
    return losses, w.numpy()

  ours, weights = train(tfd.TPUStrategy(resolver))
  w = np.zeros([3, 1], np.float32)
  plain = []
  for start in range(0, 64, 16):
    xb, yb = x[start:start + 16], y[start:start + 16]
    err = xb @ w - yb
    plain.append(float(np.sum(err ** 2) / 16))
    w = w - 0.1 * (2 * xb.T @ err / 16)
  return {"losses_equal": bool(np.allclose(ours, plain, atol=1e-5)),
          "weights_equal": bool(np.allclose(weights, w, atol=1e-5)),
          "loss_fell": ours[-1] < ours[0]}


def use_tpus_guide(strategy):
  """The "Use TPUs" guide's training on synthetic MNIST-shaped data: Keras
  fit (with and without `steps_per_execution`) and its custom loop (one
  step per call, and `tf.range` steps in one call) over
  `distribute_datasets_from_function`, against Keras fit without a
  strategy on the global batch."""
  batch_size, steps_per_epoch = 200, 2
  rng = np.random.RandomState(0)
  images = rng.randint(0, 256, (600, 28, 28, 1)).astype(np.uint8)
  labels = rng.randint(0, 10, (600,)).astype(np.int64)

  def create_model():
    regularizer = tf.keras.regularizers.L2(1e-5)
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer,
                               kernel_initializer=init(1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer,
                              kernel_initializer=init(2)),
        tf.keras.layers.Dense(10, kernel_regularizer=regularizer, kernel_initializer=init(3))])

  def get_dataset(batch, is_training=True):
    part = slice(0, 400) if is_training else slice(400, 600)
    dataset = tf.data.Dataset.from_tensor_slices((images[part], labels[part])).map(
        lambda image, label: (tf.cast(image, tf.float32) / 255.0, label))
    return (dataset.repeat() if is_training else dataset).batch(batch)

  def fit(strategy, **compile_kwargs):
    with strategy.scope():
      model = create_model()
      model.compile(optimizer="adam", metrics=["sparse_categorical_accuracy"],
                    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    **compile_kwargs)
    history = model.fit(get_dataset(batch_size), epochs=2, steps_per_epoch=steps_per_epoch,
                        validation_data=get_dataset(batch_size, False), verbose=0)
    return history.history, [w.numpy() for w in model.weights]

  def custom_loop(multiple_steps):
    with strategy.scope():
      model = create_model()
      optimizer = tf.keras.optimizers.Adam()
      training_loss = tf.keras.metrics.Mean("training_loss", dtype=tf.float32)
    per_replica_batch_size = batch_size // strategy.num_replicas_in_sync
    train_dataset = strategy.distribute_datasets_from_function(
        lambda _: get_dataset(per_replica_batch_size, is_training=True))

    def step_fn(inputs):
      images, labels = inputs
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        per_example_loss = tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)
        loss = tf.nn.compute_average_loss(per_example_loss)
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(list(zip(grads, model.trainable_variables)))
      training_loss.update_state(loss * strategy.num_replicas_in_sync)

    @tf.function
    def train_step(iterator):
      strategy.run(step_fn, args=(next(iterator),))

    @tf.function
    def train_multiple_steps(iterator, steps):
      for _ in tf.range(steps):
        strategy.run(step_fn, args=(next(iterator),))

    iterator = iter(train_dataset)
    losses = []
    for _ in range(2):
      if multiple_steps:
        train_multiple_steps(iterator, tf.convert_to_tensor(steps_per_epoch))
      else:
        for _ in range(steps_per_epoch):
          train_step(iterator)
      losses.append(float(training_loss.result()))
      training_loss.reset_state()
    return losses, int(optimizer.iterations.numpy()), [w.numpy() for w in model.weights]

  def close(a, b):
    return all(np.allclose(x, y, atol=2e-4, rtol=2e-4) for x, y in zip(a, b))

  plain_history, plain_weights = fit(tf.distribute.get_strategy())
  out = {"replicas": strategy.num_replicas_in_sync}
  for name, kwargs in [("fit", {}), ("fit_steps_per_execution", {"steps_per_execution": 2})]:
    history, weights = fit(strategy, **kwargs)
    out[name] = close(weights, plain_weights) and all(
        np.allclose(history[k], plain_history[k], atol=2e-4) for k in plain_history)
  for name, multiple_steps in [("custom_loop", False), ("custom_loop_tf_range", True)]:
    losses, iterations, weights = custom_loop(multiple_steps)
    out[name] = {"iterations": iterations, "loss_fell": losses[1] < losses[0],
                 "like_fit": close(weights, plain_weights)}
  return out


def main():
  resolver = tfd.cluster_resolver.TPUClusterResolver(tpu="")
  tf.config.experimental_connect_to_cluster(resolver)
  topology = tfd.tpu.experimental.initialize_tpu_system(resolver)
  print(json.dumps({
      "devices": len(tf.config.list_logical_devices("CPU")),
      "assign": spec_assign_to_logical_device(topology, resolver),
      "split": spec_split_to_logical_devices(topology, resolver),
      "values": spec_values_on_worker_devices(resolver),
      "training": training_loop(resolver),
      "spec_2_0": spec_2_0_examples(resolver),
      "use_tpus_guide": use_tpus_guide(tfd.TPUStrategy(resolver)),
      "tensorflow_docstring": tensorflow_docstring_examples()}))


def tensorflow_docstring_examples():
  """The `>>>` examples of TensorFlow's own `tf.distribute.TPUStrategy`,
  ported (`tf.distribute.` -> `tfd.`, `tf.tpu.experimental.` ->
  `tfd.tpu.experimental.`) and run in order: the names of those that raise,
  and whether the model after `train_step` and the last `strategy.run`'s
  result equal the same computations without a strategy."""
  import doctest  # pylint: disable=g-import-not-at-top
  source = tf.distribute.TPUStrategy.__doc__
  source = source.replace("tf.distribute.", "tfd.").replace(
      "tf.tpu.experimental.", "tfd.tpu.experimental.")
  examples = doctest.DocTestParser().get_examples(source)
  namespace = {"tf": tf, "np": np, "tfd": tfd}
  failures, shown, random_states, weights = [], [], [], None
  tf.keras.utils.set_random_seed(0)  # the model's weights and dataset_fn's data
  display, sys.displayhook = sys.displayhook, shown.append
  try:
    for example in examples:
      if "distribute_datasets_from_function" in example.source:
        random_states.append(np.random.get_state())  # dataset_fn draws its data
      if example.source.startswith("train_step("):
        weights = [w.numpy() for w in namespace["model"].weights]
        replicas = namespace["strategy"].num_replicas_in_sync
      try:
        exec(compile(example.source, "<TPUStrategy docstring>", "single"), namespace)  # pylint: disable=exec-used
      except Exception as e:  # pylint: disable=broad-except
        failures.append(f"{example.source.strip().splitlines()[0]}: {type(e).__name__}: {e}")
  finally:
    sys.displayhook = display
  if failures:
    return {"examples": len(examples), "failures": failures}

  def data(random_state):
    np.random.set_state(random_state)
    return list(namespace["dataset_fn"](None).take(2))

  # train_step: replica i takes element i % 2; the gradients are summed.
  plain = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(5,))])
  plain.set_weights(weights)
  with tf.GradientTape() as tape:
    loss = sum(tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, plain(x)))
               for x, y in data(random_states[0])) * (replicas // 2)
  trained = [w - 0.1 * g for w, g in
             zip(plain.get_weights(), tape.gradient(loss, plain.trainable_variables))]
  (features, _), _ = data(random_states[1])
  return {"examples": len(examples), "failures": failures,
          "trained_like_plain": all(np.allclose(a, b, atol=1e-6) for a, b in
                                    zip(namespace["model"].get_weights(), trained)),
          "model_changed": not all(np.allclose(a, b) for a, b in zip(trained, weights)),
          "run_like_plain": bool(np.allclose(shown[-1], features * 2))}


if __name__ == "__main__":
  main()
