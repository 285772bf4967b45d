"""oracle.py keeps TensorFlow's strategies from breaking each other's
collectives, whichever test files share a process and in whatever order."""

import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
from conftest import DEVICES, NUM_DEVICES

SHAPES = ([], [2], [3, 2])


def _all_reduce(mod, strategy, shape, run_mode):
  """SUM-all-reduces a tensor of ones of `shape`; each replica's result."""
  def replica_fn():
    return mod.get_replica_context().all_reduce("SUM", tf.ones(shape))
  result = run_mode(lambda: strategy.run(replica_fn))
  return [t.numpy().tolist() for t in strategy.experimental_local_results(result)]


def _expected(strategy, shape):
  n = strategy.num_replicas_in_sync
  return [tf.fill(shape, float(n)).numpy().tolist()] * n


def test_tf_strategies_all_reduce_different_shapes_in_one_process(run_mode):
  """TF 2.21 aborts every collective here with two default MirroredStrategies."""
  strategies = [(tf.distribute, oracle.tf_mirrored()),
                (tf.distribute, oracle.tf_mirrored(["CPU:0", "CPU:1"])),
                (tf.distribute, oracle.tf_mirrored(["CPU:1", "CPU:2", "CPU:3"])),
                (tf.distribute, oracle.new_tf_mirrored()),
                (tf.distribute, oracle.TF.v1_mirrored),
                (tfd, oracle.TFD.mirrored)]
  for shape in SHAPES:
    for mod, strategy in strategies:
      assert _all_reduce(mod, strategy, shape, run_mode) == _expected(strategy, shape)
  shared = oracle.tf_mirrored()
  assert _all_reduce(tf.distribute, shared, [5], run_mode) == _expected(shared, [5])


def test_only_the_shared_tf_strategy_uses_collectives():
  shared = oracle.tf_mirrored()
  assert shared is oracle.tf_mirrored(DEVICES) is oracle.TF.mirrored
  assert shared.num_replicas_in_sync == NUM_DEVICES
  assert type(shared.extended._cross_device_ops).__name__ == "CollectiveAllReduce"  # pylint: disable=protected-access
  others = [oracle.tf_mirrored(["CPU:0", "CPU:1"]), oracle.TF.pair, oracle.TF.v1_mirrored,
            oracle.new_tf_mirrored(), oracle.new_mirrored(tf.distribute, ["CPU:2"])]
  for strategy in others:
    assert isinstance(strategy.extended._cross_device_ops,  # pylint: disable=protected-access
                      tf.distribute.ReductionToOneDevice)
  assert oracle.tf_mirrored(["CPU:0", "CPU:1"]) is oracle.TF.pair


def test_a_second_tf_collective_strategy_is_refused():
  shared_ops = oracle.tf_mirrored().extended._cross_device_ops  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="collective"):
    oracle.new_tf_mirrored(cross_device_ops=shared_ops)


def test_tf_default_cross_device_ops_are_what_tf_falls_back_on():
  """TF uses the ops it builds for itself when it is given none."""
  extended = oracle.tf_mirrored().extended
  assert extended._cross_device_ops is extended._collective_ops  # pylint: disable=protected-access
  assert oracle.tf_default_cross_device_ops() is extended._cross_device_ops  # pylint: disable=protected-access
  pair = oracle.tf_default_cross_device_ops(["CPU:0", "CPU:1"])
  assert type(pair).__name__ == "CollectiveAllReduce"
  assert pair._devices == DEVICES[:2]  # pylint: disable=protected-access


_COLLIDING = textwrap.dedent("""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

    def all_reduce(strategy, shape):
      return strategy.run(
          lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones(shape)))

    first, second = tf.distribute.MirroredStrategy(), tf.distribute.MirroredStrategy()
    all_reduce(first, [2])
    try:
      all_reduce(second, [3])
    except tf.errors.InvalidArgumentError as e:
      print("collided:", e)
    """)


def test_without_the_rule_tf_strategies_collide():
  """Why oracle.py exists: two default TF strategies break each other.

  Run in a process of its own, since the failure poisons every later
  collective. Should a TF release fix this, oracle.py's rule may go.
  """
  result = subprocess.run([sys.executable, "-c", _COLLIDING], capture_output=True,
                          text=True, timeout=300, check=True)
  assert "collided:" in result.stdout
  assert "Shape mismatch in the collective instance" in result.stdout
