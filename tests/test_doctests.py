"""Runs the `>>>` examples in every docstring of the package, and checks that
every public class and function has one."""

import doctest
import importlib
import inspect
import pathlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite

PACKAGE_DIR = pathlib.Path(tf_distribute_lite.__file__).parent


def _modules():
  names = [tf_distribute_lite.__name__]
  for info in pkgutil.walk_packages([str(PACKAGE_DIR)], "tf_distribute_lite."):
    names.append(info.name)
  return sorted(names)


def _public_api():
  """(qualified name, object) for every name the public namespaces export."""
  namespaces = [tf_distribute_lite, tf_distribute_lite.experimental,
                tf_distribute_lite.experimental.partitioners,
                tf_distribute_lite.experimental.rpc,
                tf_distribute_lite.compat.v1,
                tf_distribute_lite.compat.v1.experimental,
                tf_distribute_lite.cluster_resolver, tf_distribute_lite.contrib,
                tf_distribute_lite.tpu.experimental]
  seen = {}
  for namespace in namespaces:
    for name, obj in vars(namespace).items():
      if name.startswith("_") or inspect.ismodule(obj) or not callable(obj):
        continue
      if not obj.__module__.startswith(tf_distribute_lite.__name__):
        continue  # TensorFlow's own, re-exported (`Server`, `Topology`)
      if inspect.isclass(obj) or inspect.isfunction(obj):
        seen.setdefault(id(obj), (f"{namespace.__name__}.{name}", obj))
  return sorted(seen.values(), key=lambda item: item[0])


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples(module_name):
  module = importlib.import_module(module_name)
  finder = doctest.DocTestFinder(exclude_empty=True)
  globs = {"tf": tf, "np": np, "tf_distribute_lite": tf_distribute_lite,
           **vars(module)}
  runner = doctest.DocTestRunner(
      optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  for test in finder.find(module, module_name, globs=dict(globs)):
    if test.filename and not test.filename.startswith(str(PACKAGE_DIR)):
      continue
    runner.run(test)
  results = runner.summarize(verbose=False)
  assert results.failed == 0, f"{results.failed} doctest example(s) failed in {module_name}"


@pytest.mark.parametrize("name, obj", _public_api(), ids=lambda x: x if isinstance(x, str) else "")
def test_public_api_has_runnable_example(name, obj):
  doc = inspect.getdoc(obj) or ""
  assert ">>>" in doc, f"{name} has no `>>>` example in its docstring"
