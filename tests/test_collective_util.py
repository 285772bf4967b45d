"""`CollectiveHints`, the deprecated form of `CommunicationOptions`: what it
makes, its validation, its deprecation notice, and that strategies and
cross-device ops take it wherever they take options, as TF's do."""

import inspect
import logging

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import deprecation

import oracle
from conftest import DEVICES

HINT_ARGUMENTS = pytest.mark.parametrize("kwargs", [
    {}, {"bytes_per_pack": 1024}, {"timeout_seconds": 30.0},
    {"bytes_per_pack": 50 * 1024 * 1024, "timeout_seconds": 120},
    {"bytes_per_pack": 1.5}])


@HINT_ARGUMENTS
def test_hints_are_communication_options_as_in_tf(kwargs):
  ours = tfd.experimental.CollectiveHints(**kwargs)
  theirs = tf.distribute.experimental.CollectiveHints(**kwargs)
  assert type(ours) is type(tfd.experimental.CommunicationOptions())
  assert type(theirs) is type(tf.distribute.experimental.CommunicationOptions())
  assert type(ours).__name__ == type(theirs).__name__ == "Options"
  assert str(ours) == str(theirs)
  # TF 2.21's options are no instances of CommunicationOptions; ours are.
  assert isinstance(ours, tfd.experimental.CommunicationOptions)
  assert (ours.bytes_per_pack, ours.timeout_seconds) == (
      kwargs.get("bytes_per_pack", 0), kwargs.get("timeout_seconds"))
  assert ours.implementation is tfd.experimental.CommunicationImplementation.AUTO


def test_signature_and_namespaces_match_tf():
  ours = inspect.signature(tfd.experimental.CollectiveHints)
  theirs = inspect.signature(tf.distribute.experimental.CollectiveHints)
  assert str(ours) == str(theirs) == "(bytes_per_pack=0, timeout_seconds=None)"
  assert tfd.compat.v1.experimental.CollectiveHints is tfd.experimental.CollectiveHints
  for hints in (tfd.experimental.CollectiveHints,
                tf.distribute.experimental.CollectiveHints):
    with pytest.raises(TypeError):
      hints(implementation="RING")


@pytest.mark.parametrize("bytes_per_pack, error", [
    (-1, ValueError), (-1024, ValueError), ("1024", TypeError), (None, TypeError)])
def test_validation_matches_tf(bytes_per_pack, error):
  with pytest.raises(error):
    tf.distribute.experimental.CollectiveHints(bytes_per_pack=bytes_per_pack)
  with pytest.raises(error, match="`bytes_per_pack`"):
    tfd.experimental.CollectiveHints(bytes_per_pack=bytes_per_pack)


class _Records(logging.Handler):

  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def test_deprecation_is_logged_once(monkeypatch):
  monkeypatch.setattr(deprecation, "_warned", set())
  records = _Records()
  tf.get_logger().addHandler(records)
  try:
    tfd.experimental.CollectiveHints()
    tfd.experimental.CollectiveHints(bytes_per_pack=8)
  finally:
    tf.get_logger().removeHandler(records)
  assert len(records.messages) == 1
  assert "CollectiveHints is deprecated" in records.messages[0]
  assert "CommunicationOptions" in records.messages[0]


def test_merge_takes_what_hints_set():
  options = tfd.experimental.CommunicationOptions(
      bytes_per_pack=64, implementation="RING")
  merged = options.merge(tfd.experimental.CollectiveHints(timeout_seconds=5.0))
  assert (merged.bytes_per_pack, merged.timeout_seconds, merged.implementation) == (
      64, 5.0, tfd.experimental.CommunicationImplementation.RING)
  merged = tfd.experimental.CollectiveHints(bytes_per_pack=8).merge(options)
  assert (merged.bytes_per_pack, merged.implementation.value) == (64, "RING")


def _sum_of_replica_ids(module, hints):
  def replica_fn():
    context = module.get_replica_context()
    value = tf.cast(context.replica_id_in_sync_group, tf.float32)
    return context.all_reduce("SUM", [value, 2.0 * value], options=hints)
  return replica_fn


@pytest.mark.parametrize("module", [tf.distribute, tfd], ids=["tf", "tfd"])
def test_all_reduce_takes_hints(module, run_mode):
  strategy = oracle.mirrored(module)
  hints = module.experimental.CollectiveHints(bytes_per_pack=4,
                                              timeout_seconds=60.0)
  result = run_mode(lambda: strategy.run(_sum_of_replica_ids(module, hints)))
  assert [[float(v) for v in strategy.experimental_local_results(part)]
          for part in result] == [[6.0] * 4, [12.0] * 4]


def _collective_ops(strategy, options):
  @tf.function
  def step():
    return strategy.run(_sum_of_replica_ids(tfd, options))
  graph = step.get_concrete_function().graph
  return [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]


def test_hints_reach_the_collective_ops():
  """Packs of at most 4 bytes: one all-reduce per value; and the timeout."""
  strategy = tfd.MirroredStrategy(
      DEVICES, cross_device_ops=cross_device_ops_lib.CollectiveAllReduce(DEVICES))
  hinted = _collective_ops(
      strategy, tfd.experimental.CollectiveHints(bytes_per_pack=4,
                                                 timeout_seconds=60.0))
  assert len(hinted) == 2 * 4
  assert {op.get_attr("timeout_seconds") for op in hinted} == {60.0}
  packed = _collective_ops(strategy, tfd.experimental.CollectiveHints())
  assert len(packed) == 4
  assert {op.get_attr("timeout_seconds") for op in packed} == {0.0}


@pytest.mark.parametrize("cross_device_ops", [
    tfd.ReductionToOneDevice, tfd.HierarchicalCopyAllReduce])
def test_reduce_to_and_batch_reduce_to_take_hints(cross_device_ops):
  strategy = tfd.MirroredStrategy(DEVICES[:2], cross_device_ops=cross_device_ops())
  hints = tfd.experimental.CollectiveHints(bytes_per_pack=1, timeout_seconds=9)
  value = strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant(float(context.replica_id_in_sync_group + 1)))
  reduced = strategy.extended.reduce_to("SUM", value, DEVICES[0], options=hints)
  assert float(reduced) == 3.0
  (batched,) = strategy.extended.batch_reduce_to(
      "MEAN", [(value, value)], options=hints)
  assert [float(v) for v in strategy.experimental_local_results(batched)] == [1.5, 1.5]
