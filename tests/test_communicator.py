"""Tests of communicator.py: the reductions of one strategy, as the
strategies' own tests reach them (`strategy.reduce`, `reduce_to`,
`all_reduce`, ...), and here what each communicator decides by itself."""

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.layout import Layout

from conftest import DEVICES

SUM, MEAN = tfd.ReduceOp.SUM, tfd.ReduceOp.MEAN


def _per_replica(devices):
  components = []
  for i, device in enumerate(devices):
    with tf.device(device):
      components.append(tf.constant(float(i + 1)))
  return values_lib.PerReplica(components)


def test_a_value_every_replica_shares_is_in_sync():
  """MEAN gives it back; SUM of it over several replicas is refused, and
  batch reduction (what all_reduce asks) gives it back, as in TensorFlow."""
  communicator = communicator_lib.Communicator(Layout(DEVICES[:2]))
  shared = tf.constant(3.0)
  assert communicator.reduce_to(MEAN, shared, DEVICES[0], None) is shared
  with pytest.raises(ValueError, match="cannot be reduced with the given reduce op"):
    communicator.reduce_to(SUM, shared, DEVICES[0], None)
  assert communicator.batch_reduce_to(SUM, [(shared, shared)], None) == [shared]


def test_int32_values_and_cpu_destinations_reduce_on_one_device():
  host_ops = tfd.ReductionToOneDevice(reduce_to_device=DEVICES[3])
  communicator = communicator_lib.Communicator(
      Layout(DEVICES[:2]), tfd.HierarchicalCopyAllReduce(), host_ops)
  ints = values_lib.PerReplica([tf.constant(1), tf.constant(2)])
  assert communicator._ops_for(ints) is host_ops  # pylint: disable=protected-access
  mean = communicator.reduce_to(MEAN, _per_replica(DEVICES[:2]), [DEVICES[0], DEVICES[1]], None)
  assert [v.numpy().item() for v in mean.values] == [1.5, 1.5]


def test_a_task_reduces_onto_its_own_worker_and_the_ps_tasks_only():
  layout = Layout(DEVICES[:1], input_host="/job:worker/task:1", task_type="worker", task_id=1)
  communicator = communicator_lib.Communicator(layout)
  with pytest.raises(ValueError, match="Cannot reduce to another worker"):
    communicator.batch_reduce_to(SUM, [(tf.constant(1.0), "/job:worker/task:0")], None)


def test_the_tpu_communicator_follows_the_step_being_traced():
  """Outside a TPU step it reduces as on one process; inside one, a value
  traced once for every replica is reduced by the step, a distributed value
  as on one process."""
  class Step:
    def all_reduce(self, reduce_op, value):
      return ("reduced by the step", reduce_op, value)

  step = [None]
  communicator = communicator_lib.TPUCommunicator(Layout(DEVICES[:2]), lambda: step[0])
  value = tf.constant(3.0)
  with pytest.raises(ValueError):
    communicator.reduce_to(SUM, value, DEVICES[0], None)
  step[0] = Step()
  assert communicator.reduce_to(SUM, value, DEVICES[0], None) == (
      "reduced by the step", SUM, value)
  assert communicator.batch_reduce_to(SUM, [(value, DEVICES[0])], None) == [
      ("reduced by the step", SUM, value)]
  per_replica = _per_replica(DEVICES[:2])
  assert communicator.reduce_to(SUM, per_replica, DEVICES[0], None).numpy() == 3.0
