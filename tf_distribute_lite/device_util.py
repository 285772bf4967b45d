"""Device strings: canonical (fully qualified) names, validation, the
current device, and values placed on a device."""

import functools

import tensorflow as tf

from tf_distribute_lite import _tf_bridge

# The task this process's devices belong to (`set_local_task`).
_local_task = ["/job:localhost/replica:0/task:0"]
# A TF1 graph names devices without a job.
_GRAPH_TASK = "/replica:0/task:0"


def canonicalize(device, default=None):
  """The fully qualified name of `device` (a string, `tf.DeviceSpec` or
  `LogicalDevice`), filled from `default`, then this task's CPU:0 (in a TF1
  graph, as in TensorFlow, without a job).

  >>> canonicalize("/gpu:1")
  '/job:localhost/replica:0/task:0/device:GPU:1'
  >>> with tf.Graph().as_default():
  ...   canonicalize("/gpu:1")
  '/replica:0/task:0/device:GPU:1'
  """
  base = _local_task[0] if tf.compat.v1.executing_eagerly_outside_functions() else _GRAPH_TASK
  return _merged(device, default, base)


def _full_name(device):
  return _merged(device, None, _local_task[0])


@functools.lru_cache(maxsize=1024)
def _merged(device, default, task):
  """CPU:0 of `task`, overridden by `default`'s fields, then `device`'s."""
  spec = tf.DeviceSpec.from_string(task + "/device:CPU:0")
  if default:
    spec = spec.make_merged_spec(_parse(default, "default"))
  return spec.make_merged_spec(_parse(device, "device")).to_string()


@functools.lru_cache(maxsize=1024)
def device_type(device):
  """The device type ("CPU", "GPU", "TPU", ...) that `device` names.

  >>> device_type("/job:localhost/replica:0/task:0/device:GPU:1")
  'GPU'
  """
  return _parse(device, "device").device_type


def _parse(device, argument):
  if isinstance(device, tf.DeviceSpec):
    return device
  if device is None:
    return tf.DeviceSpec()
  if isinstance(device, tf.config.LogicalDevice):
    device = device.name
  if not isinstance(device, str):
    raise TypeError(f"`{argument}` must be a device name string such as "
                    f"'CPU:0' or '/gpu:1'; got {device!r}.")
  try:
    return tf.DeviceSpec.from_string(device)
  except ValueError as e:
    raise ValueError(f"Malformed device string {device!r} in `{argument}`: "
                     f"expected a name such as 'CPU:0', '/gpu:1' or "
                     f"'/job:worker/task:0/device:GPU:0' ({e})") from None


def set_local_task(task):
  """Makes `task` (as "/job:worker/replica:0/task:1") the task of device
  names without one."""
  _local_task[0] = _merged(task, None, _local_task[0]).rsplit("/device:", 1)[0]
  _local_devices.cache_clear()


def is_present(device):
  """Whether this process has a logical device named `device`."""
  return _full_name(device) in _local_devices()


@functools.lru_cache(maxsize=1)
def _local_devices():
  return frozenset(_full_name(d.name) for d in tf.config.list_logical_devices())


def local_devices(device_type=None):
  """Canonical names of this process's (not its cluster's) logical devices."""
  names = [d.name for d in tf.config.list_logical_devices(device_type)]
  return tuple(canonicalize(n) for n in names if _full_name(n).startswith(_local_task[0] + "/"))


def current():
  """The device the innermost eager `tf.device` scope names; "" inside a
  `tf.function` (the placer decides later)."""
  return _tf_bridge.eager_device_name() if tf.executing_eagerly() else ""


def on_device(value, device, copy=False):
  """`value` (read or converted) on canonical `device`: itself if it is
  there already (unless `copy`), else a copy made there.

  >>> on_device(tf.constant(1.0), canonicalize("CPU:1")).device
  '/job:localhost/replica:0/task:0/device:CPU:1'
  """
  if not copy:
    if isinstance(value, tf.Variable):
      value = value.read_value()
    elif not tf.is_tensor(value):
      with tf.device(device):
        value = tf.convert_to_tensor(value)
    if value.device and canonicalize(value.device) == device:
      return value
  with tf.device(device):
    return tf.identity(value)
