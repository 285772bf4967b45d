"""The default strategy, in effect outside every `scope()` (one replica on
the current device), and `get_strategy` and `get_replica_context`."""

import threading

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import replica_context


class _DefaultReplicaContext(replica_context.ReplicaContext):
  """The replica context outside any strategy: one replica, id 0."""

  def _require_current(self):
    if contexts.top() is not None:
      super()._require_current()

  replica_id_in_sync_group = property(lambda self: 0)
  devices = property(lambda self: (device_util.current(),))


class _DefaultDistributionExtended(distribute_lib.StrategyExtendedV1):
  """The default strategy: one replica on whatever device is current."""

  def variable_created_in_scope(self, v):
    """Whether `v` was made with no strategy current."""
    return _tf_bridge.variable_strategy(v) is None

  def non_slot_devices(self, var_list):
    """With the variable whose name sorts first, as in TensorFlow."""
    return min(var_list, key=lambda v: v.name)

  def colocate_vars_with(self, colocate_with_variable):
    """Places new variables with `colocate_with_variable`."""
    if tf.executing_eagerly():
      return tf.device(colocate_with_variable.device)
    return tf.compat.v1.get_default_graph().colocate_with(colocate_with_variable)

  def _own_replica_context(self):
    if contexts.top() is None:
      return get_replica_context()
    return super()._own_replica_context()

  def _call_for_each_replica(self, fn, args, kwargs):
    # Through TensorFlow's default strategy, so that `has_strategy()` stays
    # False inside and Keras losses keep their default reduction.
    return _tf_bridge.tensorflow_default_strategy().extended.call_for_each_replica(
        _tf_bridge.autograph_convert(fn), args, kwargs)

  def _experimental_distribute_dataset(self, dataset, options):
    return dataset

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    return dataset_fn(input_context_lib.InputContext())


class _DefaultDistributionStrategy(contexts.DefaultStrategy, distribute_lib.Strategy):
  """The strategy in effect outside any `scope()`."""

  def __init__(self):
    super().__init__(_DefaultDistributionExtended(self))

  def scope(self):
    """A no-op scope (nothing becomes cross-replica, as in TensorFlow); not
    to be entered inside another strategy's."""
    return _DefaultScope(self)


class _DefaultScope:
  __slots__ = ("_strategy",)

  def __init__(self, strategy):
    self._strategy = strategy

  def __enter__(self):
    if contexts.has_strategy():
      raise RuntimeError("Must not nest tf.distribute.Strategy scopes.")
    return self._strategy

  def __exit__(self, *exc_info):
    pass


_defaults = {}
_defaults_lock = threading.Lock()


def default_strategy():
  if "strategy" not in _defaults:
    with _defaults_lock:
      if "strategy" not in _defaults:
        strategy = _DefaultDistributionStrategy()
        _defaults["replica_context"] = _DefaultReplicaContext(strategy, 0)
        _defaults["strategy"] = strategy
  return _defaults["strategy"]


def get_strategy():
  """The current `Strategy`: inside `scope()` that strategy, else the default.

  >>> get_strategy().num_replicas_in_sync
  1
  """
  entry = contexts.top()
  if entry is None or entry.strategy is _tf_bridge.tensorflow_default_strategy():
    return default_strategy()
  return entry.strategy


def get_replica_context():
  """The current `ReplicaContext` (the default one outside any strategy), or
  None in a cross-replica context.

  >>> get_replica_context().num_replicas_in_sync
  1
  """
  entry = contexts.top()
  if entry is None:
    default_strategy()
    return _defaults["replica_context"]
  return entry.replica_context
