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
           "values", "cross_device_ops", "collective_util", "reduce_util",
           "input_lib", "input_util", "../types/distribute"]

# Examples of APIs other issues implement, or not part of the public API.
OUT_OF_SCOPE = ("TPU", "MultiWorker", "ParameterServer", "Coordinator")
# Examples whose expected text is wrong under any strategy: a loop body that
# is an expression (`strategy.run(...)`) prints its result in a doctest.
PRINTS_UNEXPECTEDLY = {"types.distribute.DistributedIteratorInterface.get_next"}
# Examples whose expected text predates numpy 2's scalar repr.
NUMPY_1_REPR = {"distribute_lib.Strategy.experimental_distribute_values_from_function"}


def _examples():
  finder = doctest.DocTestFinder()
  found = []
  for name in MODULES:
    module = importlib.import_module(
        "tensorflow.python." + (name[3:].replace("/", ".") if name.startswith("../")
                                else f"distribute.{name}"))
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
    "test", _examples(), ids=lambda t: t.name.replace("tensorflow.python.", ""))
def test_tensorflow_docstring_example(test):
  short_name = test.name.replace("tensorflow.python.distribute.", "")
  if test.name.replace("tensorflow.python.", "") in PRINTS_UNEXPECTEDLY:
    pytest.skip("TensorFlow's expected output omits what the loop prints")
  test.globs = dict(test.globs, tf=_tf_with_our_distribute(), np=np)
  flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  runner = doctest.DocTestRunner(optionflags=flags)
  output = io.StringIO()
  with np.printoptions(legacy="1.25" if short_name in NUMPY_1_REPR else False):
    runner.run(test, out=output.write)
  results = runner.summarize(verbose=False)
  assert results.attempted > 0
  assert results.failed == 0, output.getvalue()
