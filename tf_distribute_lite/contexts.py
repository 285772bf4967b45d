"""Reads TensorFlow's per-thread strategy stack: which strategy is current, in
which context (an empty stack: the default strategy's replica context)."""

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


def top():
  """The innermost entry (TensorFlow's have the same fields), or None."""
  stack = _tf_bridge.strategy_stack()
  return stack[-1] if stack else None


class DefaultStrategy:
  """Base of the default strategy's class (`has_strategy()` is False for it)."""


def is_current(strategy):
  """Whether `strategy` is the innermost entry's (never the default's)."""
  entry = top()
  return entry is not None and entry.strategy is strategy


def has_strategy():
  """Whether a non-default strategy (nor TensorFlow's default) is current.

  >>> has_strategy()
  False
  """
  entry = top()
  return entry is not None and not (
      isinstance(entry.strategy, DefaultStrategy) or
      entry.strategy is _tf_bridge.tensorflow_default_strategy())


def in_cross_replica_context():
  """Whether this code runs in a strategy's cross-replica context.

  >>> in_cross_replica_context()
  False
  """
  entry = top()
  return entry is not None and entry.cross_replica_context is not None


def enclosing_replica_context():
  """The innermost replica context on the stack (also in `merge_call`), or None."""
  for entry in reversed(_tf_bridge.strategy_stack()):
    if entry.replica_context is not None:
      return entry.replica_context
  return None


def require_cross_replica_or_default(strategy):
  """Raises unless `strategy` may act here: its cross-replica context, or none."""
  entry = top()
  if entry is None or entry.cross_replica_context is strategy:
    return
  if entry.strategy is not strategy:
    raise_wrong_strategy(strategy)
  raise RuntimeError("Method requires being in cross-replica context, use "
                     "get_replica_context().merge_call()")


def raise_wrong_strategy(strategy):
  if not has_strategy():
    raise RuntimeError(f'Need to be inside "with strategy.scope()" for {strategy}')
  raise RuntimeError(f"Mixing different tf.distribute.Strategy objects: "
                     f"{top().strategy} is not {strategy}")


# While `extended.update` updates one replica's components, variables use it.
UpdateContext = _tf_bridge.update_context
update_replica_id = _tf_bridge.update_replica_id


def current_replica_id():
  """The replica this code runs for as a Python int, or None if cross-replica."""
  entry = top()
  if entry is None:
    return 0
  if entry.replica_context is None:
    return update_replica_id()
  return entry.replica_context._replica_id  # pylint: disable=protected-access
