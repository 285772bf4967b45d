"""The loop of `extended.experimental_run_steps_on_iterator` (TF 1.x) and
its `MultiStepContext`."""

import tensorflow as tf

from tf_distribute_lite import contexts
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp


class MultiStepContext:
  """What the loop gives its `fn` and returns: the last step's outputs and
  `run_op`."""

  def __init__(self, strategy=None):
    self._strategy = strategy  # the loop's: with none entered, the default
    self._last_step_outputs = {}
    self._reduced = {}
    self._non_tensor_outputs = {}
    self.run_op = None

  last_step_outputs = property(lambda self: self._last_step_outputs,
                               doc="The outputs `set_last_step_output` recorded last.")
  non_tensor_outputs = property(lambda self: self._non_tensor_outputs,
                                doc="The outputs `set_non_tensor_output` recorded.")

  def set_last_step_output(self, name, output, reduce_op=None, aggregation=None):
    """Records `output` as `name`, reduced by `reduce_op` if given (required
    in a replica context), or by TF 1.11's `aggregation`."""
    combine = _combiner(reduce_op, aggregation)
    if contexts.in_cross_replica_context():
      self._record(contexts.top().strategy, name, output, combine)
      return
    if combine is None:
      raise ValueError("`reduce_op` (or an `aggregation` other than NONE) must be "
                       "set when `set_last_step_output` is called in a replica context.")
    self._replica_context().merge_call(
        lambda strategy, value: self._record(strategy, name, value, combine),
        args=(output,))

  def _replica_context(self):
    entry = contexts.top()
    if entry is None:
      return self._strategy.extended._own_replica_context()  # pylint: disable=protected-access
    return entry.replica_context

  def _record(self, strategy, name, output, combine):
    self._reduced[name] = combine is not None
    self._last_step_outputs[name] = output if combine is None else combine(strategy, output)

  def set_non_tensor_output(self, name, output):
    """Records a Python value as `name`."""
    if contexts.in_cross_replica_context():
      self._non_tensor_outputs[name] = output
      return

    def merge_fn(strategy, value):
      self._non_tensor_outputs[name] = strategy.experimental_local_results(value)
    self._replica_context().merge_call(merge_fn, args=(output,))


def _combiner(reduce_op, aggregation):
  """A function of `(strategy, output)` combining the replicas', or None."""
  if reduce_op is not None and aggregation is not None:
    raise ValueError(
        f"`set_last_step_output` takes `reduce_op` or `aggregation` (its TF "
        f"1.11-1.12 name), not both; got reduce_op={reduce_op!r} and "
        f"aggregation={aggregation!r}.")
  if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
    return lambda strategy, output: strategy.experimental_local_results(output)[0]
  if aggregation is not None and aggregation != tf.VariableAggregation.NONE:
    reduce_op = ReduceOp.from_variable_aggregation(aggregation)
  if reduce_op is None:
    return None
  return lambda strategy, output: strategy.reduce(reduce_op, output, axis=None)


def run_steps(strategy, fn, iterator, iterations, initial_loop_values):
  """`experimental_run_steps_on_iterator`'s loop; returns `ctx`."""
  ctx = MultiStepContext(strategy)
  initial = tf.nest.flatten({} if initial_loop_values is None else initial_loop_values)
  structure = []

  def body(step, *unused_outputs):
    result = fn(ctx, iterator.get_next())
    if result is None and not tf.executing_eagerly():
      raise TypeError(
          "`fn` returned None: in a graph it must return the op (or tensors) "
          "running its step, as only that runs in the loop (Can not convert a "
          "NoneType into a Tensor or Operation).")
    outputs = {name: strategy.experimental_local_results(output)
               for name, output in ctx.last_step_outputs.items()}
    flat_outputs = tf.nest.flatten(outputs)
    if len(flat_outputs) != len(initial):
      counts = ", ".join(f"{name!r}: {len(v)} component(s)" for name, v in sorted(outputs.items()))
      raise ValueError(
          f"`initial_loop_values` must give the starting value of each output "
          f"`fn` records with `set_last_step_output`, component by component "
          f"in the order of their names ({counts}), {len(flat_outputs)} "
          f"values in all; got {initial_loop_values!r}.")
    structure[:] = [outputs]
    with tf.control_dependencies(_ops_of(result)):
      return [step + 1] + flat_outputs

  loop = tf.while_loop(lambda step, *unused: step < iterations, body,
                       [tf.constant(0)] + initial, parallel_iterations=1)
  ctx.run_op = tf.group(loop)
  outputs = tf.nest.pack_sequence_as(structure[0] if structure else {}, loop[1:])
  for name, components in outputs.items():
    ctx.last_step_outputs[name] = (components[0] if ctx._reduced[name]  # pylint: disable=protected-access
                                   else values_lib.regroup(list(components)))
  return ctx


def _ops_of(structure):
  if tf.executing_eagerly():
    return []
  return [t for t in tf.nest.flatten(structure, expand_composites=True)
          if isinstance(t, (tf.Tensor, tf.Operation))]
