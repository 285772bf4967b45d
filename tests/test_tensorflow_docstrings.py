"""TensorFlow's own `tf.distribute` docstring examples, run against tfd.

Each example is taken from the installed TensorFlow and run with `tf`
standing for TensorFlow except that `tf.distribute` is tf_distribute_lite.
Several use `MirroredStrategy(["GPU:0", "GPU:1"])`: on a CPU-only machine
TensorFlow 2.21 hangs in their all-reduce, tfd soft-places them and answers.
"""

import doctest
import importlib
import io
import types

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

MODULES = ["distribute_lib", "mirrored_strategy", "one_device_strategy",
           "values", "cross_device_ops", "collective_util", "reduce_util"]

# Examples of APIs other issues implement, or not part of the public API.
OUT_OF_SCOPE = ("TPU", "MultiWorker", "ParameterServer", "Coordinator",
                "experimental_distribute_dataset", "InputOptions",
                "distribute_datasets_from_function", "InputContext",
                "DistributedDataset", "_update(")
# Examples whose expected text predates numpy 2's scalar repr.
NUMPY_1_REPR = {"distribute_lib.Strategy.experimental_distribute_values_from_function"}


def _examples():
  finder = doctest.DocTestFinder()
  found = []
  for name in MODULES:
    module = importlib.import_module(f"tensorflow.python.distribute.{name}")
    for test in finder.find(module):
      source = "".join(example.source for example in test.examples)
      if "distribute" in source and not any(k in source for k in OUT_OF_SCOPE):
        found.append(test)
  return found


def _tf_with_our_distribute():
  namespace = types.SimpleNamespace(
      **{k: getattr(tf, k) for k in dir(tf) if not k.startswith("__")})
  namespace.distribute = tfd
  return namespace


@pytest.mark.parametrize(
    "test", _examples(), ids=lambda t: t.name.replace("tensorflow.python.distribute.", ""))
def test_tensorflow_docstring_example(test):
  short_name = test.name.replace("tensorflow.python.distribute.", "")
  test.globs = dict(test.globs, tf=_tf_with_our_distribute(), np=np)
  flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  runner = doctest.DocTestRunner(optionflags=flags)
  output = io.StringIO()
  with np.printoptions(legacy="1.25" if short_name in NUMPY_1_REPR else False):
    runner.run(test, out=output.write)
  results = runner.summarize(verbose=False)
  assert results.attempted > 0
  assert results.failed == 0, output.getvalue()
