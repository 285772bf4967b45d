"""Every test process gets 4 logical CPU devices before TensorFlow starts.

Multi-replica behaviour is tested on these 4 devices, so it needs no GPU.
"""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Processes the tests start import this checkout's package, whichever one
# the environment has installed.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [
    str(pathlib.Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_DEVICES = 4


def _configure_devices():
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES)


_configure_devices()

# Listing the devices starts TensorFlow's runtime now, eagerly. TensorFlow
# fixes the runtime's soft device placement when it starts: off if the first
# operation is made inside a TF1 graph (a `tf.data` map or a `tf.function`
# traced under `tf.Graph().as_default()`), and `tf.config.
# get_soft_device_placement()` still says True. Started here, every test
# finds the same runtime, whichever test runs first.
tf.config.list_logical_devices()

DEVICES = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}"
                for i in range(NUM_DEVICES))


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "multi_worker: starts a cluster of worker processes on this "
      "machine (deselect with -m 'not multi_worker')")


@pytest.fixture(params=["eager", "function"])
def run_mode(request):
  """Runs a zero-argument callable eagerly or inside a `tf.function`."""
  if request.param == "eager":
    return lambda fn: fn()
  return lambda fn: tf.function(fn)()
