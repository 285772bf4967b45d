"""Variable policies, through the strategies that hold them: where each
strategy puts its variables and its non-slot variables, and what its
updates return, compared with `tf.distribute`."""

import pytest
import tensorflow as tf

import oracle

STRATEGIES = {
    "mirrored": lambda a: a.pair,
    "one_device": lambda a: a.one_device(),
    "central_storage": lambda a: a.mod.experimental.CentralStorageStrategy(["CPU:0", "CPU:1"]),
    "default": lambda a: a.mod.get_strategy(),
}


def _floats(structure):
  return tf.nest.map_structure(lambda t: tf.convert_to_tensor(t).numpy().item(), structure)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_parameter_and_non_slot_devices_like_tensorflow(name):
  def snippet(a):
    strategy = STRATEGIES[name](a)
    with strategy.scope():
      first, second = tf.Variable(1.0, name="b"), tf.Variable(2.0, name="a")
    non_slot = strategy.extended.non_slot_devices([first, second])
    return strategy.extended.parameter_devices, getattr(non_slot, "name", non_slot)
  oracle.compare(snippet, (oracle.TF,), (oracle.TFD,))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_ungrouped_updates_give_each_result_per_replica_like_tensorflow(name, run_mode):
  def snippet(a):
    strategy = STRATEGIES[name](a)
    with strategy.scope():
      v = tf.Variable(1.0)
    updated = run_mode(lambda: strategy.extended.update(
        v, lambda c: (c.assign_add(1.0), {"x": tf.constant(3.0)}), group=False))
    # The default strategy has no parameter devices: any variable will do.
    colocate_with = v if name == "default" else strategy.extended.non_slot_devices([v])
    non_slot = run_mode(lambda: strategy.extended.update_non_slot(
        colocate_with, lambda: [tf.constant(4.0)], group=False))
    return _floats(updated), _floats(non_slot)
  updated, non_slot = oracle.compare(snippet, (oracle.TF,), (oracle.TFD,))
  assert updated[1]["x"][0] == 3.0 and non_slot[0][0] == 4.0
