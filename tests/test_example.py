"""The main job, examples/custom_training_loop.py, trains and its loss falls."""

import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "custom_training_loop.py"


def test_custom_training_loop_runs_and_loss_falls():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, str(EXAMPLE), "--epochs", "2", "--global-batch", "512"],
      capture_output=True, text=True, timeout=600, env=env, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "replicas in sync: 4" in result.stdout
  assert "epoch 2: steps 8" in result.stdout
  assert ": fell" in result.stdout
