"""Orbit programs, each run under a strategy it is given; tests/test_orbit.py
runs them under TensorFlow's strategies and ours and compares the numbers.

Orbit's own examples (`SingleTaskTrainer`, `SingleTaskEvaluator`) train a
tf_keras model on an iris-shaped problem, driven as Orbit's tests drive them,
and by an `orbit.Controller` with a checkpoint manager and summaries. Each
program returns plain lists and numbers (JSON-able), so the same programs run
in a fresh process on an emulated TPU slice:

    python tests/orbit_programs.py   # TPUStrategy and MirroredStrategy on emulated:v3-8
"""

import gc
import glob
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_EXAMPLES = 150  # As iris: 4 global batches of 32 and one of 22.
NUM_FEATURES = 4
NUM_CLASSES = 3
GLOBAL_BATCH = 32
LABEL_KEY = "label"


def _orbit():
  """Orbit and its examples; imported late, after the devices are set up."""
  import orbit  # pylint: disable=g-import-not-at-top
  from orbit.examples.single_task import single_task_evaluator  # pylint: disable=g-import-not-at-top
  from orbit.examples.single_task import single_task_trainer  # pylint: disable=g-import-not-at-top
  return orbit, single_task_trainer, single_task_evaluator


def _iris_arrays(seed):
  rng = np.random.RandomState(seed)
  features = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype(np.float32)
  labels = np.argmax(features @ rng.normal(size=(NUM_FEATURES, NUM_CLASSES)), axis=1)
  return {"features": features, LABEL_KEY: labels.astype(np.int64)}


def iris_like(seed=0):
  """150 examples as `tfds.load('iris')` gives them: dicts of a float32
  "features" vector of 4 and an int64 "label" of 3 classes (here from a
  linear teacher, so there is something to learn)."""
  return tf.data.Dataset.from_tensor_slices(_iris_arrays(seed))


def _initial_weights():
  rng = np.random.RandomState(5)
  sizes = [(NUM_FEATURES, 10), (10, 10), (10, NUM_CLASSES)]
  weights = []
  for fan_in, fan_out in sizes:
    weights += [rng.normal(scale=0.5, size=(fan_in, fan_out)).astype(np.float32),
                rng.normal(scale=0.1, size=(fan_out,)).astype(np.float32)]
  return weights


def make_model(softmax=False):
  """The model of Orbit's single-task tests: Dense(10) x 2 -> Dense(3)
  (-> Softmax), with fixed initial weights. Call it in the strategy's scope."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  layers = [tf_keras.Input(shape=(NUM_FEATURES,), name="features"),
            tf_keras.layers.Dense(10, activation=tf.nn.relu),
            tf_keras.layers.Dense(10, activation=tf.nn.relu),
            tf_keras.layers.Dense(NUM_CLASSES)]
  if softmax:
    layers.append(tf_keras.layers.Softmax())
  model = tf_keras.Sequential(layers)
  model.set_weights(_initial_weights())
  return model


def _floats(values):
  return [float(v) for v in values]


def _weights(model):
  return [w.numpy().tolist() for w in model.weights]


def trainer_test(strategy):
  """Orbit's `single_task_trainer_test`, in `strategy`'s scope and shorter:
  `controller.train(1)`, then on to step 21, 5 steps per loop, on a repeated
  dataset. The loss before and after, the weights, the global step.

  As in Orbit's test the dataset is not distributed, so every replica trains
  on the whole global batch (under TensorFlow's strategies too)."""
  orbit, single_task_trainer, _ = _orbit()
  import tf_keras  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    train_ds = iris_like().batch(GLOBAL_BATCH).repeat()
    model = make_model(softmax=True)
    trainer = single_task_trainer.SingleTaskTrainer(
        train_ds, label_key=LABEL_KEY, model=model,
        loss_fn=tf_keras.losses.sparse_categorical_crossentropy,
        optimizer=tf_keras.optimizers.SGD(learning_rate=0.1))
    controller = orbit.Controller(trainer=trainer, steps_per_loop=5,
                                  global_step=trainer.optimizer.iterations)
  controller.train(1)
  start_loss = trainer.train_loss.result().numpy()
  controller.train(21)
  end_loss = trainer.train_loss.result().numpy()
  return {"start_loss": float(start_loss), "end_loss": float(end_loss),
          "step": int(trainer.optimizer.iterations.numpy()), "weights": _weights(model)}


def evaluator_test(strategy, reduction="none"):
  """Orbit's `single_task_evaluator_test`, in `strategy`'s scope: train one
  pass over the (unrepeated) dataset, 100 steps per loop, then a complete
  evaluation. Orbit's test gives the loss object Keras' default reduction,
  which tf_keras refuses under a strategy; `reduction="auto"` runs it so."""
  orbit, single_task_trainer, single_task_evaluator = _orbit()
  import tf_keras  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    train_ds = iris_like().batch(GLOBAL_BATCH)
    model = make_model()
    trainer = single_task_trainer.SingleTaskTrainer(
        train_ds, label_key=LABEL_KEY, model=model,
        loss_fn=tf_keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=reduction),
        optimizer=tf_keras.optimizers.SGD(learning_rate=0.1))
    evaluator = single_task_evaluator.SingleTaskEvaluator(
        train_ds, label_key=LABEL_KEY, model=model,
        metrics=[tf_keras.metrics.SparseCategoricalAccuracy()])
    controller = orbit.Controller(trainer=trainer, evaluator=evaluator, steps_per_loop=100,
                                  global_step=trainer.optimizer.iterations)
  controller.train(train_ds.cardinality().numpy())
  controller.evaluate()
  accuracy = evaluator.metrics[0].result().numpy()
  return {"accuracy": float(accuracy), "loss": float(trainer.train_loss.result()),
          "step": int(trainer.optimizer.iterations.numpy()), "weights": _weights(model)}


def _read_summaries(directory):
  """{tag: [[step, value], ...]} of the event files in `directory`, in the
  order they were written (file names do not sort in that order: their
  writer counters are not zero-padded)."""
  events = [event for path in glob.glob(os.path.join(directory, "events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(path)]
  summaries = {}
  for event in sorted(events, key=lambda event: event.wall_time):
    for value in event.summary.value:
      summaries.setdefault(value.tag, []).append(
          [int(event.step), float(tf.make_ndarray(value.tensor))])
  return summaries


def controller(strategy, model_dir=None, trainer_options=None, evaluator_options=None):
  """`Controller.train_and_evaluate` to step 6, 2 steps per loop, evaluating
  every 4 steps, with a checkpoint manager and train and eval summaries,
  on datasets made by `orbit.utils.make_distributed_dataset` (from a
  function for training, from a dataset for evaluation); then a second
  Controller over a new model restores the last checkpoint and trains on to
  step 8.

  Returns the outputs of every train loop and evaluation (through Orbit's
  actions), the checkpoints, the summaries (less steps_per_second), the
  step and weights after restoring, and the final weights.
  """
  orbit, single_task_trainer, single_task_evaluator = _orbit()
  import tf_keras  # pylint: disable=g-import-not-at-top
  model_dir = model_dir or tempfile.mkdtemp()
  outputs = []

  def record(kind):
    return lambda output: outputs.append(
        [kind, {name: float(value) for name, value in sorted(output.items())}])

  def build():
    with strategy.scope():
      def train_dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
        return iris_like().shard(input_context.num_input_pipelines,
                                 input_context.input_pipeline_id).repeat().batch(batch)
      train_ds = orbit.utils.make_distributed_dataset(strategy, train_dataset_fn)
      eval_ds = orbit.utils.make_distributed_dataset(
          strategy, iris_like(seed=1).batch(GLOBAL_BATCH))
      model = make_model()
      trainer = single_task_trainer.SingleTaskTrainer(
          train_ds, label_key=LABEL_KEY, model=model,
          loss_fn=tf_keras.losses.SparseCategoricalCrossentropy(
              from_logits=True, reduction="none"),
          optimizer=tf_keras.optimizers.SGD(learning_rate=0.1),
          metrics=[tf_keras.metrics.SparseCategoricalAccuracy("train_accuracy")],
          trainer_options=trainer_options)
      evaluator = single_task_evaluator.SingleTaskEvaluator(
          eval_ds, label_key=LABEL_KEY, model=model,
          metrics=[tf_keras.metrics.SparseCategoricalAccuracy("accuracy")],
          evaluator_options=evaluator_options)
      checkpoint = tf.train.Checkpoint(model=model, optimizer=trainer.optimizer)
      manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=5,
                                           step_counter=trainer.optimizer.iterations,
                                           checkpoint_interval=4)
      step = trainer.optimizer.iterations
      return model, orbit.Controller(
          trainer=trainer, evaluator=evaluator, global_step=step, steps_per_loop=2,
          checkpoint_manager=manager,
          summary_dir=os.path.join(model_dir, "train"),
          eval_summary_dir=os.path.join(model_dir, "eval"),
          train_actions=[record("train")], eval_actions=[record("eval")])

  eval_steps = 3 if evaluator_options and evaluator_options.use_tf_while_loop else -1
  model, first = build()
  first.train_and_evaluate(train_steps=6, eval_steps=eval_steps, eval_interval=4)
  trained = _weights(model)
  restored_model, second = build()
  restored = {"step": int(second.global_step.numpy()),
              "weights_equal": all(np.array_equal(a, b) for a, b in
                                   zip(trained, _weights(restored_model)))}
  second.train(8)
  second.evaluate(eval_steps)
  summaries = {}
  for kind in ["train", "eval"]:
    for tag, values in _read_summaries(os.path.join(model_dir, kind)).items():
      if tag != "steps_per_second":
        summaries[f"{kind}/{tag}"] = values
  return {"outputs": outputs, "restored": restored, "summaries": summaries,
          "checkpoints": sorted(os.path.basename(p) for p in
                                glob.glob(os.path.join(model_dir, "ckpt-*.index"))),
          "weights": _weights(restored_model)}


def per_replica_batches(input_context):
  """A `dataset_fn` whose elements are the per-replica batches of iris-like
  examples chosen by the global (step, replica) index: pipeline h of H,
  feeding k = R/H of the R replicas, gives replica k*h + j its step-s batch
  as element s*k + j. So at step s replica r reads the b examples from
  b(s*R + r) on (b = 32/R), however many pipelines feed the replicas."""
  replicas = input_context.num_replicas_in_sync
  per_pipeline = replicas // input_context.num_input_pipelines
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  examples = _iris_arrays(0)

  def element(index):
    step, local = index // per_pipeline, index % per_pipeline
    replica = per_pipeline * input_context.input_pipeline_id + local
    first = (step * replicas + replica) * batch
    return {key: tf.gather(values, tf.range(first, first + batch))
            for key, values in examples.items()}
  steps = NUM_EXAMPLES // GLOBAL_BATCH
  return tf.data.Dataset.range(steps * per_pipeline).map(element)


def replica_data_controller(strategy):
  """`Controller.train` to step 4, 2 steps per loop, on
  `distribute_datasets_from_function(per_replica_batches)`, where each
  replica reads the same examples at each step whatever the strategy's
  input pipelines. The outputs of the train loops and the final weights."""
  orbit, single_task_trainer, _ = _orbit()
  import tf_keras  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    model = make_model()
    trainer = single_task_trainer.SingleTaskTrainer(
        strategy.distribute_datasets_from_function(per_replica_batches),
        label_key=LABEL_KEY, model=model,
        loss_fn=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        optimizer=tf_keras.optimizers.SGD(learning_rate=0.1),
        metrics=[tf_keras.metrics.SparseCategoricalAccuracy("train_accuracy")])
    outputs = []
    controller = orbit.Controller(
        trainer=trainer, global_step=trainer.optimizer.iterations, steps_per_loop=2,
        train_actions=[lambda output: outputs.append(
            {name: float(value) for name, value in sorted(output.items())})])
  controller.train(4)
  return {"outputs": outputs, "step": int(trainer.optimizer.iterations.numpy()),
          "weights": _weights(model)}


def loop_fns(strategy):
  """`orbit.utils.create_tf_while_loop_fn` (in a `tf.function`, `num_steps`
  a tensor) and `create_loop_fn` (until the iterator is exhausted, reducing
  each step's output) over a distributed iterator: per-replica sums of the
  features, summed by `strategy.reduce`."""
  orbit, _, _ = _orbit()
  with strategy.scope():
    total = tf.Variable(0.0)
  dataset = orbit.utils.make_distributed_dataset(strategy, iris_like().batch(GLOBAL_BATCH))

  def step_sum(iterator):
    inputs = next(iterator)
    per_replica = strategy.run(lambda x: tf.reduce_sum(x["features"]), args=(inputs,))
    return strategy.reduce("SUM", per_replica, axis=None)

  def accumulate(iterator):
    total.assign_add(step_sum(iterator))

  while_loop = tf.function(orbit.utils.create_tf_while_loop_fn(accumulate))
  iterator = iter(dataset)
  while_loop(iterator, tf.constant(2))
  after_two = float(total.numpy())
  loop = orbit.utils.create_loop_fn(tf.function(step_sum))
  sums = loop(iterator, -1, state=[], reduce_fn=lambda state, value: state + [float(value)])
  loop_all = loop(iter(dataset), -1, state=[], reduce_fn=lambda state, value: state + [float(value)])
  return {"while_loop_two_steps": after_two, "rest": sums, "all": loop_all}


def main():
  """Every program under TPUStrategy and MirroredStrategy on the 8 cores of
  an emulated v3-8 slice; prints one JSON object."""
  import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
  resolver = tfd.cluster_resolver.TPUClusterResolver("emulated:v3-8")
  tf.config.experimental_connect_to_cluster(resolver)
  tfd.tpu.experimental.initialize_tpu_system(resolver)
  runs = {}
  for name, make in [("tpu", lambda: tfd.TPUStrategy(resolver)),
                     ("mirrored", tfd.MirroredStrategy)]:
    runs[name] = {"devices": len(tf.config.list_logical_devices("CPU"))}
    for program in [trainer_test, evaluator_test, controller, loop_fns]:
      runs[name][program.__name__] = program(make())
      gc.collect()  # Now, not piecemeal in the middle of the next program.
  print(json.dumps(runs))


if __name__ == "__main__":
  sys.exit(main())
