"""Device names (`device_util`), and the names strategies give their devices
against TensorFlow's: eagerly, in a `tf.function` and in a TF1 graph, where
TensorFlow's names have no job. Programs with eager execution disabled are
in tests/tf1_programs.py (tests/test_strategy_v1.py runs them)."""

import contextlib

import pytest
import tensorflow as tf

from tf_distribute_lite import device_util

import oracle
from conftest import DEVICES
from outcomes import device_names
import strategies

# TensorFlow has no contrib: a contrib strategy is compared with
# TensorFlow's compat.v1 strategy of its kind.
STRATEGIES = ["mirrored_pair", "mirrored", "v1_mirrored_pair", "one_device", "v1_one_device",
              "central_storage_pair", "central_storage", "v1_central_storage_pair",
              "contrib_mirrored_pair", "contrib_one_device"]


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
@pytest.mark.parametrize("name", STRATEGIES)
def test_strategies_name_devices_like_tf(name, mode):
  """Eagerly and in a `tf.function` names have TensorFlow's job (localhost);
  in a TF1 graph (here a `tf.Graph` while eager execution is on) none."""
  def names(ours):
    with tf.Graph().as_default() if mode == "graph" else contextlib.nullcontext():
      return device_names(strategies.make(name, ours), in_function=mode == "function")
  result = oracle.compare(names, (False,), (True,))
  assert isinstance(result, dict)
  has_job = any(d.startswith("/job:") for d in result["worker_devices"])
  assert has_job == (mode != "graph")


@pytest.mark.parametrize("device, default, eager, graph", [
    ("cpu:0", None, DEVICES[0], "/replica:0/task:0/device:CPU:0"),
    ("/gpu", None, "/job:localhost/replica:0/task:0/device:GPU:0",
     "/replica:0/task:0/device:GPU:0"),
    ("/job:localhost/device:CPU:1", None, DEVICES[1], DEVICES[1]),
    ("/task:1", None, "/job:localhost/replica:0/task:1/device:CPU:0",
     "/replica:0/task:1/device:CPU:0"),
    ("/task:1", "/job:worker/device:GPU:3", "/job:worker/replica:0/task:1/device:GPU:3",
     "/job:worker/replica:0/task:1/device:GPU:3"),
])
def test_canonicalize_like_tensorflow(device, default, eager, graph):
  from tensorflow.python.distribute import device_util as tf_device_util  # pylint: disable=g-import-not-at-top
  assert device_util.canonicalize(device, default) == eager
  assert tf_device_util.canonicalize(device, default) == eager
  with tf.Graph().as_default():
    assert device_util.canonicalize(device, default) == graph
    assert tf_device_util.canonicalize(device, default) == graph


def test_local_devices_and_presence_in_a_graph():
  with tf.Graph().as_default():
    assert device_util.local_devices("CPU") == tuple(
        d.replace("/job:localhost", "") for d in DEVICES)
    assert device_util.is_present("/replica:0/task:0/device:CPU:3")
    assert device_util.is_present(DEVICES[3])
    assert not device_util.is_present("/replica:0/task:0/device:CPU:4")


def test_on_device_copies_only_what_is_elsewhere():
  with tf.device(DEVICES[1]):
    here = tf.constant([1.0, 2.0])
    variable = tf.Variable([3.0])
  slices = tf.IndexedSlices(here, tf.constant([0, 1]))
  assert device_util.on_device(here, DEVICES[1]) is here
  copied = device_util.on_device(here, DEVICES[1], copy=True)
  assert copied is not here and copied.device == DEVICES[1]
  moved = device_util.on_device(here, DEVICES[2])
  assert (moved.device, moved.numpy().tolist()) == (DEVICES[2], [1.0, 2.0])
  read = device_util.on_device(variable, DEVICES[1])
  assert isinstance(read, tf.Tensor) and read.numpy().tolist() == [3.0]
  assert device_util.on_device(slices, DEVICES[1]) is slices
  assert device_util.on_device(slices, DEVICES[3]).indices.device == DEVICES[3]
  assert device_util.on_device(2.5, DEVICES[3]).device == DEVICES[3]
