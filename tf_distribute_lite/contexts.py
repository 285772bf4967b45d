"""Which strategy is current, and whether code runs per replica or across them.

Each entry on TensorFlow's per-thread strategy stack (see `_tf_bridge`) says
which strategy is current and whether the thread is in its cross-replica
context (inside `strategy.scope()`) or in a replica context (inside
`strategy.run`). With the stack empty, the default strategy is current in its
default replica context; `default_strategy` defines it and registers it here.
"""

from tf_distribute_lite import _tf_bridge


class ContextEntry:
  """One entry on the strategy stack: a strategy and the context kind."""

  __slots__ = ("strategy", "cross_replica_context", "replica_context")

  def __init__(self, strategy, cross_replica_context, replica_context):
    self.strategy = strategy
    self.cross_replica_context = cross_replica_context
    self.replica_context = replica_context

  @classmethod
  def cross_replica(cls, strategy):
    return cls(strategy, strategy, None)

  @classmethod
  def in_replica(cls, replica_context):
    return cls(replica_context.strategy, None, replica_context)


class Entered:
  """Pushes a `ContextEntry` for the duration of a `with` block."""

  __slots__ = ("_entry",)

  def __init__(self, entry):
    self._entry = entry

  def __enter__(self):
    push(self._entry)
    return self._entry

  def __exit__(self, *exc_info):
    pop()


def push(entry):
  _tf_bridge.strategy_stack().append(entry)


def pop():
  _tf_bridge.strategy_stack().pop()


# How to get the default strategy and its context entry: `default_strategy`,
# which defines them, registers them here when imported.
_defaults = {}


def register_defaults(default_strategy, default_context_entry):
  """Called once by `default_strategy` with its two getters."""
  _defaults.update(strategy=default_strategy, entry=default_context_entry)


def current():
  """The innermost entry, or the default strategy's replica entry."""
  stack = _tf_bridge.strategy_stack()
  if stack:
    return stack[-1]
  return _defaults["entry"]()


def get_strategy():
  """The current `Strategy`: inside `scope()` that strategy, else the default
  (also where TensorFlow's own default strategy is on the stack).

  >>> get_strategy().num_replicas_in_sync
  1
  """
  strategy = current().strategy
  if strategy is _tf_bridge.tensorflow_default_strategy():
    return _defaults["strategy"]()
  return strategy


def has_strategy():
  """Whether a non-default strategy is current.

  TensorFlow's own default strategy, whose replica context TensorFlow pushes
  when Keras runs outside every scope, is a default strategy too.

  >>> has_strategy()
  False
  """
  stack = _tf_bridge.strategy_stack()
  if not stack:
    return False
  strategy = stack[-1].strategy
  return (strategy is not _defaults["strategy"]() and
          strategy is not _tf_bridge.tensorflow_default_strategy())


def in_cross_replica_context():
  """Whether this code runs in a strategy's cross-replica context.

  >>> in_cross_replica_context()
  False
  """
  return current().cross_replica_context is not None


def get_replica_context():
  """The current `ReplicaContext`, or None in a cross-replica context.

  Outside any strategy this is the default strategy's replica context.

  >>> get_replica_context().num_replicas_in_sync
  1
  """
  return current().replica_context


def enclosing_replica_context():
  """The innermost replica context on the stack, also inside its
  `merge_call` (a cross-replica entry above it); None outside every one."""
  for entry in reversed(_tf_bridge.strategy_stack()):
    if entry.replica_context is not None:
      return entry.replica_context
  return None


def require_cross_replica_or_default(strategy):
  """Raises unless `strategy` may act here: its cross-replica context, or none."""
  entry = current()
  if entry.cross_replica_context is strategy:
    return
  if not _tf_bridge.strategy_stack():
    return
  if entry.strategy is not strategy:
    raise_wrong_strategy(strategy)
  raise RuntimeError("Method requires being in cross-replica context, use "
                     "get_replica_context().merge_call()")


def raise_wrong_strategy(strategy):
  if not has_strategy():
    raise RuntimeError(
        f'Need to be inside "with strategy.scope()" for {strategy}')
  raise RuntimeError(f"Mixing different tf.distribute.Strategy objects: "
                     f"{get_strategy()} is not {strategy}")


# `strategy.extended.update` applies a function to one component at a time;
# while it does, reads and writes of distributed variables go to that replica.
# The state is TensorFlow's own, which its moving-average helper reads too.
UpdateContext = _tf_bridge.update_context
update_replica_id = _tf_bridge.update_replica_id


def current_replica_id():
  """The replica this code runs for as a Python int, or None if cross-replica."""
  replica_context = get_replica_context()
  if replica_context is None:
    return update_replica_id()
  return replica_context._replica_id  # pylint: disable=protected-access
