"""The examples train and their loss falls: the main job,
examples/custom_training_loop.py, on one machine and on two worker
processes; examples/tpu_training.py on an emulated TPU slice;
examples/parameter_server_training.py on its own cluster of worker and ps
processes; examples/preemption_training.py stopped by SIGTERM and resumed.
Run as a
newcomer runs them (TF_CPP_MIN_LOG_LEVEL unset), they print only their own
output."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from multi_worker import LocalCluster

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "custom_training_loop.py"

# A line of TensorFlow's C++ log, "I0000 00:00:1795783720.368569   27949
# port.cc:153] oneDNN custom operations are on...", or absl's notice before
# the first ones.
_TF_LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] |WARNING: All log messages")


def tensorflow_log_lines(output):
  """The lines of `output` that TensorFlow's C++ code logged."""
  return [line for line in output.splitlines() if _TF_LOG_LINE.match(line)]


def environment_of_a_newcomer():
  """This environment without TF_CPP_MIN_LOG_LEVEL (the tests set it)."""
  return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def test_custom_training_loop_runs_and_loss_falls():
  result = subprocess.run(
      [sys.executable, str(EXAMPLE), "--epochs", "2", "--global-batch", "512"],
      capture_output=True, text=True, timeout=600, env=environment_of_a_newcomer(),
      check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
  assert "replicas in sync: 4" in result.stdout
  assert "epoch 2: steps 8" in result.stdout
  assert ": fell" in result.stdout


@pytest.mark.multi_worker
def test_custom_training_loop_trains_on_two_workers(tmp_path):
  """With a TF_CONFIG per worker the example trains across them."""
  results = LocalCluster(2, tmp_path).run(
      "demo", args={"argv": ["--epochs", "2", "--global-batch", "512"]})
  outputs = [results[i]["output"] for i in range(2)]
  for index, output in enumerate(outputs):
    assert results[index]["code"] == 0, output
    assert f"devices: /job:worker/replica:0/task:{index}/device:CPU:0" in output
    assert "replicas in sync: 2" in output and ": fell" in output
  losses = [[line.split("loss ")[1].split()[0] for line in output.splitlines()
             if line.startswith("epoch")] for output in outputs]
  assert losses[0] == losses[1]


def test_tpu_example_trains_on_an_emulated_v3_8():
  env = {k: v for k, v in environment_of_a_newcomer().items() if k != "TPU_NAME"}
  result = subprocess.run([sys.executable, str(EXAMPLES / "tpu_training.py")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
  assert "replicas in sync: 8" in result.stdout
  assert "step 11: loss" in result.stdout and ": fell" in result.stdout


@pytest.mark.multi_worker
def test_tpu_example_trains_on_an_emulated_v4_32_pod():
  env = {k: v for k, v in environment_of_a_newcomer().items() if k != "TPU_NAME"}
  result = subprocess.run([sys.executable, str(EXAMPLES / "tpu_training.py"),
                           "--tpu", "emulated:v4-32"],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
  assert "replicas in sync: 16" in result.stdout
  assert "step 11: loss" in result.stdout and ": fell" in result.stdout


def _run_orbit_example(*args):
  """examples/keras2_orbit_training.py with `args`, 5 steps per loop and an
  evaluation every 10: its output."""
  env = {k: v for k, v in environment_of_a_newcomer().items() if k != "TPU_NAME"}
  result = subprocess.run(
      [sys.executable, str(EXAMPLES / "keras2_orbit_training.py"), "--steps-per-loop", "5",
       "--eval-interval", "10", *args],
      capture_output=True, text=True, timeout=600, env=env, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
  return result.stdout


def test_keras2_orbit_example_trains_and_goes_on_from_its_checkpoint(tmp_path):
  """4 loops of 5 steps with evaluations at 10 and 20; a second run with
  the same model directory restores step 20 and trains on to 30."""
  output = _run_orbit_example("--steps", "20", "--model-dir", str(tmp_path))
  assert "strategy: MirroredStrategy" in output and "replicas in sync: 4" in output
  assert len(output.split("losses per loop: ")[1].splitlines()[0].split()) == 4
  assert output.count("running complete evaluation") == 2
  assert "(last: ckpt-20)" in output and ": fell" in output
  output = _run_orbit_example("--steps", "30", "--model-dir", str(tmp_path))
  assert "restored from checkpoint" in output and "training until step 30" in output
  assert len(output.split("losses per loop: ")[1].splitlines()[0].split()) == 2
  assert "(last: ckpt-30)" in output


def test_keras2_orbit_example_trains_on_an_emulated_v3_8():
  output = _run_orbit_example("--tpu", "emulated:v3-8", "--steps", "20")
  assert "strategy: TPUStrategy" in output and "replicas in sync: 8" in output
  assert output.count("running complete evaluation") == 2 and ": fell" in output


def test_parameter_server_example_trains_on_its_own_local_cluster():
  """Without TF_CONFIG the example starts 2 worker and 2 ps processes,
  trains with a weight matrix sharded over the 2 ps, and ends them."""
  env = {k: v for k, v in environment_of_a_newcomer().items() if k != "TF_CONFIG"}
  result = subprocess.run([sys.executable, str(EXAMPLES / "parameter_server_training.py")],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output
  assert not tensorflow_log_lines(output), result.stderr
  for job in ("worker", "ps"):
    for index in range(2):
      assert f"started {job} {index} at 127.0.0.1:" in result.stdout
  for shard in range(2):
    assert f"weights/part_{shard}:0 [32, 1] on /job:ps/replica:0/task:{shard}/" in result.stdout
  assert "epoch 4: 20 steps" in result.stdout and ": fell" in result.stdout
  pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", result.stdout)]
  assert len(pids) == 4 and result.stdout.split("ended pids ")[1].split() == [str(p) for p in pids]
  for pid in pids:  # each was waited for, so none is left, not even as a zombie
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_preemption_example_stops_on_sigterm_and_resumes_to_the_same_weights(tmp_path):
  """examples/preemption_training.py gets SIGTERM once it says it starts
  training (its handler is in place by then): it saves and exits with 42;
  run again it resumes and ends with the weights of a run that was never
  stopped."""
  example = [sys.executable, str(EXAMPLES / "preemption_training.py"), "--steps", "40"]
  stopped = subprocess.Popen(  # pylint: disable=consider-using-with
      example + ["--checkpoint-dir", str(tmp_path / "stopped"), "--pause", "0.05"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=environment_of_a_newcomer())
  try:
    assert stopped.stdout.readline() == "starting at step 0 of 40\n"
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=120) == 42, stopped.stdout.read()
  finally:
    if stopped.poll() is None:
      stopped.kill()
      stopped.wait(timeout=10)
  runs = {}
  for name in ("stopped", "never_stopped"):
    result = subprocess.run(example + ["--checkpoint-dir", str(tmp_path / name)],
                            capture_output=True, text=True, timeout=600,
                            env=environment_of_a_newcomer(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
    first, last = result.stdout.splitlines()
    runs[name] = (int(first.split()[3]), json.loads(last))
  resumed_at, resumed = runs["stopped"]
  assert 0 < resumed_at < 40
  assert runs["never_stopped"][0] == 0
  assert resumed["steps"] == 40
  np.testing.assert_allclose(resumed["weights"] + [resumed["bias"]],
                             runs["never_stopped"][1]["weights"] + [runs["never_stopped"][1]["bias"]],
                             atol=1e-5)
