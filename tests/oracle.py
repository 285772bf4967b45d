"""TensorFlow as the test oracle: its strategies, the tf/tfd API pair, and
`compare`, the one helper that runs a snippet under `tf.distribute` and under
tfd and asserts the same outcome (values, reprs or numbers to a tolerance
through `alike`; exception classes through `Raised`).

TF 2.21 gives every MirroredStrategy that all-reduces with its default
collective ops the same collective group and instance keys. Two of them in
one process collide: tensors of different shapes fail with "Shape mismatch
in the collective instance", groups of different sizes with "joining a group
with size 2, but that group has size 4", and after either every collective
in the process fails. pytest runs many test files in one process, so tests
get TF's MirroredStrategy only from here, by two rules:

* `tf_mirrored()` is the only TF strategy with TF's default collective
  all-reduce: on all 4 CPUs, made once and shared.
* Every other TF MirroredStrategy reduces with `ReductionToOneDevice`, or
  with other non-collective cross-device ops a test names
  (`new_tf_mirrored`, from the strategy table in tests/strategies.py).

Our own strategies each get their own collective group, so they need no rule.
"""

import operator
import traceback

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from conftest import DEVICES
from strategies import new_tf_mirrored

_shared = {}


def _key(devices):
  """`None` for all 4 CPUs, else the device list as a tuple."""
  if devices is None or tuple(devices) == DEVICES:
    return None
  return tuple(devices)


def _once(key, make):
  if key not in _shared:
    _shared[key] = make()
  return _shared[key]


def tf_mirrored(devices=None):
  """TF's MirroredStrategy on `devices` (all 4 CPUs by default), made once.

  On all 4 CPUs it is the one strategy with TF's default collective
  all-reduce; on any other device list it reduces with ReductionToOneDevice.
  """
  key = _key(devices)
  if key is None:
    return _once(("tf", None), tf.distribute.MirroredStrategy)
  return _once(("tf", key), lambda: new_tf_mirrored(list(key)))


def tf_default_cross_device_ops(devices=None):
  """The cross-device ops TF's MirroredStrategy picks on `devices` by itself.

  TF builds them in every MirroredStrategy and uses them when given none; on
  other devices than all 4 CPUs they are read from a strategy that reduces
  with ReductionToOneDevice, so they are never run.
  """
  if _key(devices) is None:
    return tf_mirrored().extended._cross_device_ops  # pylint: disable=protected-access
  return new_tf_mirrored(devices).extended._collective_ops  # pylint: disable=protected-access


def mirrored(module, devices=None):
  """The shared MirroredStrategy of `module` (`tf.distribute` or `tfd`)."""
  if module is tf.distribute:
    return tf_mirrored(devices)
  key = _key(devices)
  return _once((module, key), lambda: module.MirroredStrategy(None if key is None else list(key)))


def new_mirrored(module, devices=None, cross_device_ops=None):
  """A new MirroredStrategy of `module`; TF's never runs its collectives."""
  if module is tf.distribute:
    return new_tf_mirrored(devices, cross_device_ops)
  return module.MirroredStrategy(devices, cross_device_ops=cross_device_ops)


class Api:
  """One implementation of the strategy API and its shared strategies."""

  def __init__(self, name, module, v1):
    self.name = name
    self.mod = module
    self.v1 = v1

  @property
  def mirrored(self):
    """A MirroredStrategy on all 4 CPUs."""
    return mirrored(self.mod)

  @property
  def pair(self):
    """A MirroredStrategy on CPU:0 and CPU:1."""
    return mirrored(self.mod, ("CPU:0", "CPU:1"))

  def one_device(self, device="CPU:1"):
    """A OneDeviceStrategy on `device`."""
    return _once((self.name, "one_device", device), lambda: self.mod.OneDeviceStrategy(device))

  @property
  def v1_mirrored(self):
    """A compat.v1 MirroredStrategy on all 4 CPUs (TF's reduces on one device)."""
    if self.mod is tf.distribute:
      return _once(("tf", "v1"), lambda: new_tf_mirrored(module=self.v1))
    return _once(("tfd", "v1"), self.v1.MirroredStrategy)

  def replica_ids(self, strategy=None, dtype=tf.float32):
    """A PerReplica holding each replica's id."""
    strategy = strategy or self.mirrored
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group, dtype))

  def replica_id(self):
    """Inside `run`: this replica's id as a float32 tensor."""
    return tf.cast(self.mod.get_replica_context().replica_id_in_sync_group, tf.float32)


TF = Api("tf", tf.distribute, tf.compat.v1.distribute)
TFD = Api("tfd", tfd, tfd.compat.v1)


def api(module):
  """`TF` for `tf.distribute`, `TFD` for `tfd`."""
  return TF if module is tf.distribute else TFD


class Raised:
  """An exception a snippet raised: equal to another `Raised` of the same
  class, and to that class itself."""

  def __init__(self, error):
    self.error = error
    self.type = type(error)
    self.message = str(error)

  def __eq__(self, other):
    if isinstance(other, Raised):
      return other.type is self.type
    return other is self.type

  def __repr__(self):
    return f"Raised({self.type.__name__}: {self.message[:300]})"

  def formatted_traceback(self):
    return "".join(traceback.format_exception(self.error))[-3000:]


def outcome(call):
  """What `call()` returns (a cluster spec as its dict), or the `Raised`
  exception."""
  try:
    result = call()
  except Exception as e:  # pylint: disable=broad-except
    return Raised(e)
  return result.as_dict() if isinstance(result, tf.train.ClusterSpec) else result


def same_repr(expected, actual):
  """For `compare`: the two values print alike."""
  return repr(actual) == repr(expected)


def assert_same_numbers(actual, expected, tolerance=0.0, path="result"):
  """`actual` has the structure of `expected` (dicts, lists); numbers and
  arrays agree to `tolerance` (relative and absolute), the rest is equal.
  An outcome from another process may hold an exception as a dict with
  "raised" (its class name) and "message": only the class must agree."""
  if isinstance(expected, dict) and "raised" in expected:
    assert isinstance(actual, dict) and actual.get("raised") == expected["raised"], (
        f"{path}: TF raised {expected['raised']}: {expected['message']}\n"
        f"tfd gave: {str(actual)[:3000]}")
    return
  if isinstance(actual, dict) and "raised" in actual:
    pytest.fail(f"{path}: tfd raised {actual['raised']}: {actual['message']}")
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for key in expected:
      assert_same_numbers(actual[key], expected[key], tolerance, f"{path}[{key!r}]")
  elif _numbers(expected):
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, err_msg=path)
  elif isinstance(expected, (list, tuple)):
    assert len(actual) == len(expected), path
    for i, (a, e) in enumerate(zip(actual, expected)):
      assert_same_numbers(a, e, tolerance, f"{path}[{i}]")
  else:
    assert actual == expected, path


def _numbers(value):
  """Whether `value` is a number, or an array or nested lists of numbers."""
  try:
    return np.asarray(value).dtype.kind in "fiu"
  except ValueError:  # lists of different lengths
    return False


def close(tolerance):
  """For `compare`: `assert_same_numbers` to `tolerance`."""
  def alike(expected, actual):
    assert_same_numbers(actual, expected, tolerance)
    return True
  return alike


def tf_outcome(key, call):
  """`outcome(call)`, worked out once per `key` in the process: for
  TensorFlow's outcomes that are slow to work out. `key` starts with the
  test file's `__name__`."""
  return _once(("outcome", key), lambda: outcome(call))


def compare(snippet, tf_args, tfd_args, run_mode=None, alike=operator.eq, ours=False,
            tf_key=None):
  """Runs `snippet(*tf_args)` with TensorFlow and `snippet(*tfd_args)` with
  tfd, each through `run_mode` if given (the `run_mode` fixture: eagerly or
  in a `tf.function`); asserts equal outcomes and returns TF's (tfd's where
  `ours`).

  Equal outcomes are values that are `alike(theirs, ours)` (equal, by
  default; `same_repr`; or a check of one's own, which may assert), or
  exceptions of one class (`Raised`). With `tf_key`, TF's outcome is
  `tf_outcome(tf_key, ...)`.
  """
  def runner(args):
    def call():
      return snippet(*args)
    return call if run_mode is None else lambda: run_mode(call)
  if tf_key is None:
    expected = outcome(runner(tf_args))
  else:
    expected = tf_outcome(tf_key, runner(tf_args))
  actual = outcome(runner(tfd_args))
  message = f"\ntf.distribute gave: {expected!r}\ntf_distribute_lite gave: {actual!r}"
  raised = [o for o in (expected, actual) if isinstance(o, Raised)]
  if raised:
    assert len(raised) == 2 and actual == expected, "\n".join(
        [message] + [r.formatted_traceback() for r in raised])
  else:
    assert alike(expected, actual), message
  return actual if ours else expected


def check_misuse(snippet, theirs, ours, fragments, apis=(TF, TFD)):
  """Bad input: `snippet(apis[0])` (TensorFlow) raises exactly `theirs`, or
  nothing where `theirs` is None (TF accepts it and fails later, or never);
  `snippet(apis[1])` (ours) raises an instance of `ours` (a class, or a
  tuple of classes the error is each of), its message holding each of
  `fragments` (the argument, what was expected, what was given)."""
  try:
    snippet(apis[0])
  except Exception as e:  # pylint: disable=broad-except
    assert type(e) is theirs, f"tf.distribute raised {e!r}, not {theirs}"
  else:
    assert theirs is None, f"tf.distribute raised no {theirs.__name__}"
  ours = ours if isinstance(ours, tuple) else (ours,)
  with pytest.raises(ours) as raised:
    snippet(apis[1])
  assert all(isinstance(raised.value, cls) for cls in ours), repr(raised.value)
  for fragment in fragments:
    assert fragment in str(raised.value), (fragment, str(raised.value))
