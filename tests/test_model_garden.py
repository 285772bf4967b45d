"""The Model Garden's training framework under tfd's strategies gives the
numbers it gives under TensorFlow's.

The real package (`official`, from tf-models-no-deps) runs unchanged:
`official.core.train_lib.run_experiment` (training, evaluation, checkpoints,
summaries, a restart from the last checkpoint); `official.core.base_trainer.
Trainer` driven directly, with an exponential-moving-average optimizer and
with the Model Garden's own test task (`official.utils.testing.mock_task`);
`official.modeling.multitask.train_lib.run_experiment` with its joint and
interleaving trainers and its multi-task evaluator. Our tasks are tiny
regressions (`official.core.base_task.Task` subclasses) on fixed data with
fixed initial weights, so that every loss, metric and weight can be compared.

Each program runs under a TF strategy and the tfd strategy standing for it;
TF has no TPUStrategy without a TPU, so tfd's, on an emulated v4-8 (the 4
CPUs), is compared with TF's MirroredStrategy on the same 4 devices.
"""

import dataclasses
import gc
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

import oracle
import strategies

pytest.importorskip("tf_keras")
pytest.importorskip("official.core.train_lib")

import tf_keras  # pylint: disable=g-import-not-at-top
from official.core import base_task  # pylint: disable=g-import-not-at-top
from official.core import base_trainer  # pylint: disable=g-import-not-at-top
from official.core import config_definitions as cfg  # pylint: disable=g-import-not-at-top
from official.core import train_lib  # pylint: disable=g-import-not-at-top
from official.modeling.multitask import base_model  # pylint: disable=g-import-not-at-top
from official.modeling.multitask import configs as multitask_configs  # pylint: disable=g-import-not-at-top
from official.modeling.multitask import multitask  # pylint: disable=g-import-not-at-top
from official.modeling.multitask import train_lib as multitask_train_lib  # pylint: disable=g-import-not-at-top
from official.modeling.optimization.configs import optimizer_config  # pylint: disable=g-import-not-at-top
from official.utils.testing import mock_task  # pylint: disable=g-import-not-at-top

FEATURES = 3
HIDDEN = 4
# Float sums in another order (TPUStrategy's replicas, MirroredStrategy's
# collectives) differ in the last bits.
TOLERANCE = 1e-5

# Rows of tests/strategies.py, each strategy made anew.
STRATEGIES = ["central_storage_pair", "mirrored", "multi_worker", "one_device", "tpu"]


# --- A tiny regression task on fixed data.

def _examples(count, seed):
  """`count` examples (x, y) of a noisy linear teacher drawn from `seed`."""
  rng = np.random.RandomState(seed)
  x = rng.normal(size=(count, FEATURES)).astype(np.float32)
  teacher = rng.normal(size=(FEATURES, 1))
  y = x @ teacher + 0.1 * rng.normal(size=(count, 1))
  return x, y.astype(np.float32)


def _initial_weights(seed, layers):
  """Fixed weights for Dense layers of (fan_in, fan_out) `layers`."""
  rng = np.random.RandomState(seed)
  weights = []
  for fan_in, fan_out in layers:
    weights += [rng.normal(scale=0.5, size=(fan_in, fan_out)).astype(np.float32),
                rng.normal(scale=0.1, size=(fan_out,)).astype(np.float32)]
  return weights


@dataclasses.dataclass
class RegressionData(cfg.DataConfig):
  """`examples` examples drawn from `seed`, repeated for training."""
  examples: int = 0


def _data(seed, examples, batch, training=True):
  return RegressionData(seed=seed, examples=examples, global_batch_size=batch,
                        is_training=training)


@dataclasses.dataclass
class RegressionConfig(cfg.TaskConfig):
  """Training data: 40 examples repeated; validation: 24 examples once."""
  train_data: RegressionData = dataclasses.field(default_factory=lambda: _data(1, 40, 8))
  validation_data: RegressionData = dataclasses.field(
      default_factory=lambda: _data(2, 24, 8, training=False))


class RegressionTask(base_task.Task):
  """Mean squared error of a Dense(4, relu) -> Dense(1) model; its
  validation also returns each replica's predictions, which
  `aggregate_logs` gathers as the Model Garden's tasks do."""

  def build_model(self):
    model = tf_keras.Sequential([
        tf_keras.Input(shape=(FEATURES,)),
        tf_keras.layers.Dense(HIDDEN, activation="relu"),
        tf_keras.layers.Dense(1)])
    model.set_weights(_initial_weights(0, [(FEATURES, HIDDEN), (HIDDEN, 1)]))
    return model

  def build_inputs(self, params, input_context=None):
    x, y = _examples(params.examples, params.seed)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if params.is_training:
      dataset = dataset.repeat()
    batch = params.global_batch_size
    if input_context:
      batch = input_context.get_per_replica_batch_size(batch)
    return dataset.batch(batch, drop_remainder=params.is_training)

  def build_losses(self, labels, model_outputs, aux_losses=None):
    loss = tf.reduce_mean(tf.square(labels - model_outputs))
    if aux_losses:
      loss += tf.add_n(aux_losses)
    return loss

  def build_metrics(self, training=True):
    return [tf_keras.metrics.MeanAbsoluteError(name="mae"),
            tf_keras.metrics.Sum(name="examples")]

  def process_metrics(self, metrics, labels, model_outputs, **kwargs):
    mae, examples = metrics
    mae.update_state(labels, model_outputs)
    examples.update_state(tf.cast(tf.shape(labels)[0], tf.float32))

  def validation_step(self, inputs, model, metrics=None):
    logs = super().validation_step(inputs, model, metrics)
    logs["predictions"] = self.inference_step(inputs[0], model)
    return logs

  def aggregate_logs(self, state, step_outputs):
    state = state or []
    state.extend(np.asarray(p).ravel().tolist() for p in step_outputs["predictions"])
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    predictions = np.concatenate([np.asarray(p) for p in aggregated_logs])
    return {"predicted": float(np.sum(predictions)), "predictions": float(predictions.size)}


# --- Plain numbers out of what the programs return.

def _plain(value):
  """Nested dicts and lists of floats from tensors, arrays and numbers."""
  if isinstance(value, dict):
    return {key: _plain(v) for key, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if tf.is_tensor(value) or isinstance(value, (np.ndarray, np.generic, float, int)):
    return np.asarray(value).astype(float).tolist()
  return value


def _weights(variables):
  return [v.numpy().tolist() for v in variables]


def _summaries(directory):
  """{tag: [[step, value], ...]} from the event files in `directory`,
  without the timing ones."""
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "steps_per_second":
          continue
        found.setdefault(value.tag, []).append(
            [int(event.step), float(tf.make_ndarray(value.tensor))])
  return {tag: sorted(points) for tag, points in found.items()}


def _checkpoints(model_dir):
  return sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "ckpt-*.index")))


# --- The programs, each under the strategy it is given.

def _experiment_config(train_steps):
  """2 steps a loop, checkpoints and summaries every 2 steps, evaluations
  every 4 over the whole validation set; SGD with momentum and a decaying
  learning rate; the checkpoint of least validation `mae` exported."""
  return cfg.ExperimentConfig(
      task=RegressionConfig(),
      trainer=cfg.TrainerConfig(
          train_steps=train_steps, steps_per_loop=2, summary_interval=2,
          checkpoint_interval=2, validation_interval=4, validation_steps=-1,
          best_checkpoint_export_subdir="best", best_checkpoint_eval_metric="mae",
          best_checkpoint_metric_comp="lower",
          optimizer_config=cfg.OptimizationConfig({
              "optimizer": {"type": "sgd", "sgd": {"momentum": 0.9}},
              "learning_rate": {"type": "polynomial", "polynomial": {
                  "initial_learning_rate": 0.05, "decay_steps": 8,
                  "end_learning_rate": 0.01}}})))


def run_experiment_program(strategy, model_dir, restart):
  """`train_lib.run_experiment`: train_and_eval to step 6 (evaluations at 4
  and 6) and a post-evaluation; then, if `restart`, a new run restores step
  6's checkpoint, trains on to step 8 and evaluates."""
  results = {}
  runs = (("train_and_eval", 6), ("train", 8))
  for mode, steps in runs[:1 + restart]:
    with strategy.scope():
      task = RegressionTask(RegressionConfig(), logging_dir=model_dir)
    model, post_eval = train_lib.run_experiment(
        distribution_strategy=strategy, task=task, mode=mode,
        params=_experiment_config(steps), model_dir=model_dir, run_post_eval=True)
    results[f"step_{steps}"] = {"eval": _plain(post_eval), "weights": _weights(model.weights)}
  with open(os.path.join(model_dir, "best", "info.json")) as f:
    results["best"] = _plain(json.load(f))
  results.update(
      train_summaries=_summaries(os.path.join(model_dir, "train")),
      eval_summaries=_summaries(os.path.join(model_dir, "validation")),
      checkpoints=_checkpoints(model_dir))
  return results


def ema_trainer_program(strategy):
  """`base_trainer.Trainer` itself with an EMA-wrapped legacy SGD: two
  `train(3)` calls, then `evaluate(3)` (on the averaged weights, swapped in
  and back out by the optimizer)."""
  config = _experiment_config(6)
  config.trainer.optimizer_config.ema = optimizer_config.EMAConfig(
      average_decay=0.5, dynamic_decay=False)
  with strategy.scope():
    task = RegressionTask(config.task)
    model = task.build_model()
    trainer = base_trainer.Trainer(
        config, task, model=model,
        optimizer=task.create_optimizer(config.trainer.optimizer_config, config.runtime))
    logs = [trainer.train(tf.constant(3)), trainer.train(tf.constant(3))]
    evaluated = trainer.evaluate(tf.constant(3))
  return {"train": _plain(logs), "eval": _plain(evaluated),
          "weights": _weights(model.weights),
          "averages": _weights(trainer.optimizer._average_weights),  # pylint: disable=protected-access
          "global_step": int(trainer.global_step.numpy())}


def mock_task_program(strategy):
  """As the Model Garden's own `base_trainer_test`: its `MockTask` (zero
  inputs, a model loss) under a `Trainer`, `train(5)` then `evaluate(5)`.
  Its kernel starts random, so only the logs are compared."""
  config = cfg.ExperimentConfig(trainer=cfg.TrainerConfig(
      optimizer_config=cfg.OptimizationConfig({
          "optimizer": {"type": "sgd"}, "learning_rate": {"type": "constant"}})))
  with strategy.scope():
    task = mock_task.MockTask(config.task)
    trainer = base_trainer.Trainer(
        config, task, model=task.build_model(),
        optimizer=task.create_optimizer(config.trainer.optimizer_config, config.runtime))
    logs = trainer.train(tf.constant(5))
    evaluated = trainer.evaluate(tf.constant(5))
  return {"train": _plain(logs), "eval": _plain(evaluated)}


class SharedTrunkModel(base_model.MultiTaskBaseModel):
  """A shared Dense(4, relu) trunk with a Dense(1) head per task."""

  def _instantiate_sub_tasks(self):
    trunk = tf_keras.layers.Dense(HIDDEN, activation="relu")
    sub_tasks = {}
    for seed, name in enumerate(TASK_NAMES):
      inputs = tf_keras.Input(shape=(FEATURES,))
      outputs = tf_keras.layers.Dense(1)(trunk(inputs))
      sub_tasks[name] = tf_keras.Model(inputs, outputs)
      sub_tasks[name].set_weights(
          _initial_weights(10 + seed, [(FEATURES, HIDDEN), (HIDDEN, 1)]))
    return sub_tasks


TASK_NAMES = ("first", "second")


def multitask_program(strategy, model_dir, trainer_type):
  """`multitask.train_lib.run_experiment` with `trainer_type` ("joint" or
  "interleaving", tasks sampled uniformly): train_and_eval to step 6 with
  the multi-task evaluator (3 and 2 steps), then a post-evaluation."""
  routines = tuple(
      multitask_configs.TaskRoutine(
          task_name=name, eval_steps=3 - index, task_weight=1.0 + index,
          task_config=RegressionConfig(
              train_data=_data(20 + index, 40, 8),
              validation_data=_data(30 + index, 24, 8, training=False)))
      for index, name in enumerate(TASK_NAMES))
  config = multitask_configs.MultiTaskExperimentConfig(
      task=multitask_configs.MultiTaskConfig(task_routines=routines),
      trainer=multitask_configs.MultiTaskTrainerConfig(
          trainer_type=trainer_type, train_steps=6, steps_per_loop=2,
          summary_interval=2, checkpoint_interval=2, validation_interval=3,
          validation_steps=2,
          task_sampler=multitask_configs.TaskSamplingConfig(type="uniform"),
          optimizer_config=_experiment_config(6).trainer.optimizer_config))
  with strategy.scope():
    tasks = {routine.task_name: RegressionTask(routine.task_config, name=routine.task_name)
             for routine in routines}
    multi_task = multitask.MultiTask(
        tasks, task_weights={r.task_name: r.task_weight for r in routines},
        task_eval_steps={r.task_name: r.eval_steps for r in routines})
    model = SharedTrunkModel()
  model, post_eval = multitask_train_lib.run_experiment(
      distribution_strategy=strategy, task=multi_task, model=model,
      mode="train_and_eval", params=config, model_dir=model_dir, run_post_eval=True)
  return {"post_eval": _plain(post_eval),
          "weights": _weights(model.trainable_variables),
          "train_summaries": {
              name: _summaries(os.path.join(model_dir, "train", name))
              for name in TASK_NAMES},
          "checkpoints": _checkpoints(model_dir)}


# --- The tests.

@pytest.fixture(autouse=True)
def _clean_up(monkeypatch):
  """No cluster in the environment (MultiWorkerMirroredStrategy on one
  worker); Orbit's Controller makes its global step every summary's default
  step; the runs' reference cycles are freed at once."""
  monkeypatch.delenv("TF_CONFIG", raising=False)
  yield
  tf.summary.experimental.set_step(None)
  gc.collect()


def _compare(program, strategy_name, tmp_path=None, **kwargs):
  """`oracle.compare` of `program(strategy, **kwargs)` under TF's strategy
  and tfd's, to TOLERANCE; returns TF's result. TF's is worked out once per
  strategy and arguments ("tpu" and "mirrored" share TF's MirroredStrategy)."""
  def run(ours):
    result = program(strategies.make(strategy_name, ours),
                     **_model_dir(tmp_path, "tfd" if ours else "tf"), **kwargs)
    gc.collect()
    return result
  tf_key = (__name__, program, strategies.STRATEGIES[strategy_name].tf,
            tuple(sorted(kwargs.items())))
  return oracle.compare(run, (False,), (True,), alike=oracle.close(TOLERANCE), tf_key=tf_key)


def _model_dir(tmp_path, name):
  return {} if tmp_path is None else {"model_dir": str(tmp_path / name)}


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_run_experiment_trains_and_evaluates(strategy_name, tmp_path):
  """`train_lib.run_experiment`: losses, metrics, summaries, weights, the
  checkpoints and the best one as under TF's strategy; where the variables
  are laid out differently from one device, also through a restart."""
  restart = strategy_name in ("central_storage_pair", "mirrored", "tpu")
  theirs = _compare(run_experiment_program, strategy_name, tmp_path, restart=restart)
  steps = [2, 4, 6, 8] if restart else [2, 4, 6]
  assert theirs["checkpoints"] == [f"ckpt-{step}.index" for step in steps]
  assert [step for step, _ in theirs["train_summaries"]["training_loss"]] == steps
  # Every evaluation saw the 24 validation examples once, on every replica count.
  assert {value for _, value in theirs["eval_summaries"]["examples"]} == {24.0}
  assert theirs["eval_summaries"]["predictions"][0] == [4, 24.0]


@pytest.mark.parametrize("strategy_name", ["mirrored", "tpu"])
def test_trainer_with_a_moving_average_optimizer(strategy_name):
  """`base_trainer.Trainer` with the Model Garden's EMA optimizer: it
  averages in `extended.update` and swaps the averages in for evaluation
  (through `merge_call` under TPUStrategy) and back out."""
  theirs = _compare(ema_trainer_program, strategy_name)
  assert theirs["global_step"] == 6
  assert theirs["weights"] != theirs["averages"]


@pytest.mark.parametrize("strategy_name", ["one_device", "tpu"])
def test_the_model_gardens_mock_task(strategy_name):
  """The Model Garden's own test task, as its tests drive it: the
  validation `counter` adds up 1 per step on every replica."""
  theirs = _compare(mock_task_program, strategy_name)
  replicas = {"one_device": 1, "tpu": 4}[strategy_name]
  assert theirs["eval"]["counter"] == 5.0 * replicas


@pytest.mark.parametrize("strategy_name, trainer_type", [
    ("tpu", "joint"), ("central_storage_pair", "interleaving"), ("multi_worker", "interleaving")])
def test_multitask_run_experiment(strategy_name, trainer_type, tmp_path):
  """`official.modeling.multitask.train_lib.run_experiment` with the joint
  or the interleaving trainer and the multi-task evaluator."""
  theirs = _compare(multitask_program, strategy_name, tmp_path, trainer_type=trainer_type)
  assert theirs["checkpoints"] == ["ckpt-2.index", "ckpt-5.index", "ckpt-6.index"]
  # 3 and 2 evaluation steps of 8 examples.
  assert [theirs["post_eval"][name]["examples"] for name in TASK_NAMES] == [24.0, 16.0]
