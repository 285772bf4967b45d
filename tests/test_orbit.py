"""Orbit (from TensorFlow Model Garden) under our strategies gives the numbers
it gives under TensorFlow's: its `Controller` driving its own single-task
examples (a tf_keras model), with checkpoints, summaries, several steps per
loop and interleaved evaluation, `orbit.utils.make_distributed_dataset` and
Orbit's loop functions. The programs are in tests/orbit_programs.py.

TPUStrategy on an emulated v3-8 needs 8 devices, so its runs are in one
fresh process, next to MirroredStrategy on the same 8 devices.
"""

import gc
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import oracle
import orbit_programs
import strategies

pytest.importorskip("orbit")
pytest.importorskip("tf_keras")

from orbit import StandardEvaluatorOptions  # pylint: disable=g-import-not-at-top
from orbit import StandardTrainerOptions  # pylint: disable=g-import-not-at-top

HERE = pathlib.Path(__file__).resolve().parent
TOLERANCE = 1e-5

# Rows of tests/strategies.py, each strategy made anew.
STRATEGIES = ["central_storage", "mirrored", "one_device"]


def collect_garbage():
  """Frees what a run left behind now, not in the middle of the next run.

  A run leaves reference cycles that hold TensorFlow iterators and thread
  pools (after a Controller run under TF's MirroredStrategy, 70-odd threads);
  collected piecemeal during the next run, they stall it for tens of seconds
  on a busy machine, collected at once, a few seconds at most.
  """
  gc.collect()


@pytest.fixture(autouse=True)
def _clean_up():
  """Orbit's Controller makes its global step every summary's default step."""
  yield
  tf.summary.experimental.set_step(None)
  collect_garbage()


def _compare(program, strategy_name, ours=False, tmp_path=None, **kwargs):
  """`oracle.compare` of `program(strategy, **kwargs)` under TF's strategy
  and tfd's, to TOLERANCE (with a `model_dir` each in `tmp_path`, if given);
  returns TF's result (tfd's where `ours`)."""
  def run(ours):
    if tmp_path is not None:
      kwargs["model_dir"] = str(tmp_path / ("tfd" if ours else "tf"))
    result = program(strategies.make(strategy_name, ours), **kwargs)
    collect_garbage()
    return result
  return oracle.compare(run, (False,), (True,), alike=oracle.close(TOLERANCE), ours=ours)


def assert_trainer_test(result):
  """What Orbit's trainer test asserts: the loss fell by more than half."""
  assert result["step"] == 21
  assert result["end_loss"] < result["start_loss"] / 2


def assert_evaluator_test(result):
  """One pass of 5 steps (the last of 22 examples), then an accuracy that is
  a whole number of the 150 examples."""
  assert result["step"] == 5
  correct = result["accuracy"] * orbit_programs.NUM_EXAMPLES
  assert abs(correct - round(correct)) < 1e-3 and 0 < correct < 150


def assert_controller(result):
  """Loops of 2 steps, evaluations at steps 4 and 6, a restart from the
  step-6 checkpoint, then on to step 8; summaries at each."""
  outputs = result["outputs"]
  assert [kind for kind, _ in outputs] == [
      "train", "train", "eval", "train", "eval", "train", "eval"]
  assert sorted(outputs[0][1]) == ["train_accuracy", "training_loss"]
  assert sorted(outputs[2][1]) == ["accuracy"]
  train_losses = [output["training_loss"] for kind, output in outputs if kind == "train"]
  assert train_losses[-1] < train_losses[0]
  assert result["restored"] == {"step": 6, "weights_equal": True}
  assert result["checkpoints"] == ["ckpt-2.index", "ckpt-6.index", "ckpt-8.index"]
  summaries = result["summaries"]
  assert sorted(summaries) == ["eval/accuracy", "train/train_accuracy", "train/training_loss"]
  assert summaries["train/training_loss"] == [
      [step, loss] for step, loss in zip([2, 4, 6, 8], train_losses)]
  assert summaries["eval/accuracy"] == [
      [step, output["accuracy"]] for step, (kind, output) in
      zip([4, 6, 8], [o for o in outputs if o[0] == "eval"])]


def assert_loop_fns(result):
  """The two steps in the while loop, the three after them, and all five
  from a new iterator, sum the same features."""
  assert len(result["rest"]) == 3 and len(result["all"]) == 5
  np.testing.assert_allclose(sum(result["all"][:2]), result["while_loop_two_steps"], rtol=1e-5)
  np.testing.assert_allclose(result["all"][2:], result["rest"], rtol=1e-5)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_single_task_trainer_as_orbit_tests_it(strategy_name):
  """Orbit's `single_task_trainer_test`: `Controller.train` with 5 steps
  per loop; the same losses and weights as under TF's strategy."""
  theirs = _compare(orbit_programs.trainer_test, strategy_name)
  assert_trainer_test(theirs)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_single_task_evaluator_as_orbit_tests_it(strategy_name):
  """Orbit's `single_task_evaluator_test`: one pass of training over a
  dataset with a partial last batch, then evaluation to its end."""
  theirs = _compare(orbit_programs.evaluator_test, strategy_name)
  assert_evaluator_test(theirs)


def test_a_loss_with_keras_default_reduction_is_refused_as_in_tf():
  """Orbit's evaluator test gives its loss object Keras' default reduction;
  under a strategy tf_keras refuses it, under ours as under TF's."""
  def run(strategy):
    return orbit_programs.evaluator_test(strategy, reduction="auto")
  raised = oracle.compare(run, (strategies.make("mirrored", False),),
                          (strategies.make("mirrored", True),))
  assert isinstance(raised, oracle.Raised) and raised.type is ValueError
  assert "Reduction.NONE" in raised.message


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_controller_train_and_evaluate_with_checkpoints_and_summaries(strategy_name, tmp_path):
  """`Controller.train_and_evaluate`, 2 steps per loop, with a checkpoint
  manager and summaries, restored by a second Controller that trains on."""
  ours = _compare(orbit_programs.controller, strategy_name, ours=True, tmp_path=tmp_path)
  assert_controller(ours)
  assert (tmp_path / "tfd" / "checkpoint").exists()


def test_controller_with_python_train_loop_and_while_eval_loop():
  """The other loop options: training steps each a `tf.function` in a
  Python loop, evaluation steps in a `tf.while_loop` (3 steps)."""
  ours = _compare(
      orbit_programs.controller, "mirrored", ours=True,
      trainer_options=StandardTrainerOptions(use_tf_while_loop=False),
      evaluator_options=StandardEvaluatorOptions(use_tf_while_loop=True))
  assert_controller(ours)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_loop_fns_over_a_distributed_iterator(strategy_name):
  """`create_tf_while_loop_fn` and `create_loop_fn` (to the end of the
  input) over `make_distributed_dataset`'s iterator."""
  theirs = _compare(orbit_programs.loop_fns, strategy_name)
  assert_loop_fns(theirs)


def test_orbit_under_tpu_strategy_on_emulated_v3_8_equals_mirrored_strategy():
  """Every program under TPUStrategy on an emulated v3-8 gives the numbers
  of MirroredStrategy on the same 8 devices (to XLA's rounding)."""
  env = {k: v for k, v in os.environ.items() if k != "TPU_NAME"}
  result = subprocess.run([sys.executable, str(HERE / "orbit_programs.py")], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  runs = json.loads(result.stdout.strip().splitlines()[-1])
  tpu, mirrored = runs["tpu"], runs["mirrored"]
  assert tpu["devices"] == mirrored["devices"] == 8
  oracle.assert_same_numbers(tpu, mirrored, TOLERANCE)
  assert_trainer_test(tpu["trainer_test"])
  assert_evaluator_test(tpu["evaluator_test"])
  assert_controller(tpu["controller"])
  assert_loop_fns(tpu["loop_fns"])
