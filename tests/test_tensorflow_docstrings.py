"""TensorFlow's own `tf.distribute` docstring examples, run against tfd.

Every `>>>` example in the installed TensorFlow's `tensorflow.python.distribute`
modules (and its `tf.types.experimental.distributed` types) is run with `tf`
standing for TensorFlow except that `tf.distribute` is tf_distribute_lite and
`tf.tpu` is `tfd.tpu`. Output is compared as TensorFlow's doctest harness
compares it: an example that shows no output may print any.

Several use `MirroredStrategy(["GPU:0", "GPU:1"])`: on a CPU-only machine
TensorFlow 2.21 hangs in their all-reduce, tfd soft-places them and answers.
The TPU examples ask for `TPUClusterResolver(tpu='')`, which reads
`$TPU_NAME`: they run on an emulated v3-8 slice, which needs 8 logical CPU
devices, so in a fresh process (this one has conftest's 4):

    TPU_NAME=emulated:v3-8 python tests/test_tensorflow_docstrings.py
"""

import doctest
import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from multi_worker import free_ports

TPU_NAME = "emulated:v3-8"

# Examples of APIs tfd does not implement (ParameterServerStrategy, the
# coordinator), or not part of the public API (ShardedVariable).
OUT_OF_SCOPE = ("ParameterServer", "Coordinator", "ShardedVariable(")
# Examples whose expected text predates numpy 2's scalar repr.
NUMPY_1_REPR = {"distribute.distribute_lib.Strategy.experimental_distribute_values_from_function"}


def _modules():
  package = importlib.import_module("tensorflow.python.distribute")
  names = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
           if "test" not in info.name.rsplit(".", 1)[-1]]
  return [importlib.import_module(name)
          for name in names + ["tensorflow.python.types.distribute"]]


def _examples():
  finder = doctest.DocTestFinder()
  found = []
  for module in _modules():
    for test in finder.find(module):
      source = "".join(example.source for example in test.examples)
      if source and not any(k in source for k in OUT_OF_SCOPE):
        found.append(test)
  return found


def _short_name(test):
  return test.name.replace("tensorflow.python.", "")


def _needs_tpu(test):
  return any("TPUClusterResolver" in example.source for example in test.examples)


def _tf_with_our_distribute():
  namespace = types.SimpleNamespace(
      **{k: getattr(tf, k) for k in dir(tf) if not k.startswith("__")})
  namespace.distribute = tfd
  namespace.tpu = tfd.tpu
  return namespace


class _TensorFlowOutputChecker(doctest.OutputChecker):
  """An example that shows no output passes whatever it prints, as in
  TensorFlow's doctest harness (`initialize_tpu_system(resolver)` is shown
  without the topology it returns)."""

  def check_output(self, want, got, optionflags):
    return not want or super().check_output(want, got, optionflags)


def _run(test):
  """(examples attempted, examples failed, the failure report)."""
  # The partitioner examples name the classes of their module bare.
  ours = {k: v for k, v in vars(tfd.experimental.partitioners).items()
          if not k.startswith("_")}
  test.globs = dict(test.globs, **ours, tf=_tf_with_our_distribute(), np=np)
  runner = doctest.DocTestRunner(checker=_TensorFlowOutputChecker(),
                                 optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  output = io.StringIO()
  legacy = "1.25" if _short_name(test) in NUMPY_1_REPR else False
  with np.printoptions(legacy=legacy):
    runner.run(test, out=output.write)
  results = runner.summarize(verbose=False)
  return results.attempted, results.failed, output.getvalue()


@pytest.fixture(scope="module")
def tpu_results():
  """`_run`'s answers for the TPU examples, from a fresh process."""
  env = dict(os.environ, TPU_NAME=TPU_NAME)
  result = subprocess.run([sys.executable, __file__], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def _portpicker():
  """The `portpicker` package that the RPC examples import (not one of our
  dependencies): its `pick_unused_port`, from `free_ports`."""
  module = types.ModuleType("portpicker")
  module.pick_unused_port = lambda: free_ports(1)[0]
  return module


@pytest.mark.parametrize("test", _examples(), ids=_short_name)
def test_tensorflow_docstring_example(test, request, monkeypatch):
  if any("portpicker" in example.source for example in test.examples):
    monkeypatch.setitem(sys.modules, "portpicker", _portpicker())
  if _needs_tpu(test):
    attempted, failed, output = request.getfixturevalue("tpu_results")[test.name]
  else:
    attempted, failed, output = _run(test)
  assert attempted > 0
  assert failed == 0, output


if __name__ == "__main__":
  print(json.dumps({test.name: _run(test) for test in _examples() if _needs_tpu(test)}))
