"""The default strategy: the one in effect outside every `scope()`, with
one replica on whatever device is current; and `get_strategy` and
`get_replica_context`, which return it and its replica context there.
"""

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

  @property
  def replica_id_in_sync_group(self):
    return 0

  @property
  def devices(self):
    return (device_util.current(),)


class _DefaultDistributionExtended(distribute_lib.StrategyExtendedV1):
  """The default strategy: one replica on whatever device is current."""

  def variable_created_in_scope(self, v):
    """Whether `v` was made with no strategy current, as every variable
    made outside all scopes (or in this strategy's no-op scope) is."""
    return _tf_bridge.variable_strategy(v) is None

  def non_slot_devices(self, var_list):
    """Where non-slot variables go: with the variable of `var_list` whose
    name sorts first, as in TensorFlow."""
    return min(var_list, key=lambda v: v.name)

  def colocate_vars_with(self, colocate_with_variable):
    """Places new variables with `colocate_with_variable`, any variable made
    with no strategy (TF 1.x optimizers ask this of their slots)."""
    if tf.executing_eagerly():
      return tf.device(colocate_with_variable.device)
    return tf.compat.v1.get_default_graph().colocate_with(colocate_with_variable)

  def _own_replica_context(self):
    if contexts.top() is None:
      return get_replica_context()
    return super()._own_replica_context()

  def _call_for_each_replica(self, fn, args, kwargs):
    # As TensorFlow's default strategy, which is what TensorFlow and Keras
    # find current inside: `tf.distribute.has_strategy()` stays False, so
    # Keras losses keep their default reduction (`get_strategy()` still
    # answers this strategy).
    return _tf_bridge.tensorflow_default_strategy().extended.call_for_each_replica(
        _tf_bridge.autograph_convert(fn), args, kwargs)

  def _experimental_distribute_dataset(self, dataset, options):
    return dataset

  def _distribute_datasets_from_function(self, dataset_fn, options,
                                         partial_steps=None):
    return dataset_fn(input_context_lib.InputContext())


class _DefaultDistributionStrategy(contexts.DefaultStrategy, distribute_lib.Strategy):
  """The strategy in effect outside any `scope()`."""

  def __init__(self):
    super().__init__(_DefaultDistributionExtended(self))

  def scope(self):
    """A no-op scope: the default strategy is already current, in its
    default replica context (as in TensorFlow, nothing becomes
    cross-replica). It must not be entered inside another strategy's."""
    return _DefaultScope(self)


class _DefaultScope:
  """`scope()` of the default strategy."""

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
  """The single default strategy object."""
  if "strategy" not in _defaults:
    with _defaults_lock:
      if "strategy" not in _defaults:
        strategy = _DefaultDistributionStrategy()
        _defaults["replica_context"] = _DefaultReplicaContext(strategy, 0)
        _defaults["strategy"] = strategy
  return _defaults["strategy"]


def get_strategy():
  """The current `Strategy`: inside `scope()` that strategy, else the default
  (also where TensorFlow's own default strategy is on the stack).

  >>> get_strategy().num_replicas_in_sync
  1
  """
  entry = contexts.top()
  if entry is None or entry.strategy is _tf_bridge.tensorflow_default_strategy():
    return default_strategy()
  return entry.strategy


def get_replica_context():
  """The current `ReplicaContext`, or None in a cross-replica context.

  Outside any strategy this is the default strategy's replica context.

  >>> get_replica_context().num_replicas_in_sync
  1
  """
  entry = contexts.top()
  if entry is None:
    default_strategy()
    return _defaults["replica_context"]
  return entry.replica_context
