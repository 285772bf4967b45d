"""The TF 1.x strategy API (`tf.compat.v1.distribute`): `Strategy`,
`ReplicaContext`, the multi-step loop and `get_loss_reduction`.

These are adapters over the same extended objects as the TF 2.x classes: a
TF 1.x strategy is a `compat.v1.Strategy`, not a TF 2.x `Strategy` (as in
TensorFlow), with TF 1.x's `reduce` (`axis` optional) and
`experimental_make_numpy_dataset` (a `session` argument); the TF 1.x methods
TensorFlow's TF 2.x strategies share (`experimental_run`,
`make_dataset_iterator`, `configure`, ...) are in `distribute_lib`.
Everything works eagerly and in a TF 1.x graph run by a
`tf.compat.v1.Session`.
"""

import tensorflow as tf

from tf_distribute_lite import contexts
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp


class StrategyV1(distribute_lib.StrategyBase):
  """The TF 1.x form of `Strategy` (`tf.compat.v1.distribute.Strategy`).

  `reduce`'s `axis` defaults to None; input comes from iterators with an
  `initializer` as well as from distributed datasets.

  >>> strategy = tf_distribute_lite.compat.v1.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> iterator = strategy.make_dataset_iterator(tf.data.Dataset.range(4).batch(4))
  >>> strategy.reduce("SUM", strategy.experimental_run(tf.reduce_sum, iterator))
  <tf.Tensor: shape=(), dtype=int64, numpy=6>
  >>> isinstance(strategy, tf_distribute_lite.Strategy)
  False
  """

  def reduce(self, reduce_op, value, axis=None):
    return super().reduce(reduce_op, value, axis)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A dataset of the slices of `numpy_input`; `session` (TF 1.x) is
    accepted: the arrays are held on the input host."""
    return self._extended.experimental_make_numpy_dataset(numpy_input, session)


class ReplicaContextV1(distribute_lib.ReplicaContextBase):
  """`tf.compat.v1.distribute.ReplicaContext`: the replica context's TF 1.x
  interface (no `all_gather`). Strategies' replica contexts are TF 2.x ones,
  as in TensorFlow.

  >>> isinstance(tf_distribute_lite.get_replica_context(), ReplicaContextV1)
  False
  """


def get_loss_reduction():
  """How a TF 1.x optimizer combines the replicas' gradients: `SUM` (the
  loss is already scaled by the global batch size).

  >>> get_loss_reduction()
  <ReduceOp.SUM: 'SUM'>
  """
  return ReduceOp.SUM


class MultiStepContext:
  """What `extended.experimental_run_steps_on_iterator` gives its `fn` and
  returns: the outputs of the last step, and the op running all of them.

  >>> strategy = tf_distribute_lite.compat.v1.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> iterator = strategy.make_dataset_iterator(
  ...     tf.data.Dataset.range(8).batch(2))
  >>> def step(ctx, inputs):
  ...   total = strategy.extended.call_for_each_replica(tf.reduce_sum, args=(inputs,))
  ...   ctx.set_last_step_output("total", total, reduce_op="SUM")
  >>> ctx = strategy.extended.experimental_run_steps_on_iterator(
  ...     step, iterator, iterations=3, initial_loop_values={"total": tf.constant(0, tf.int64)})
  >>> ctx.last_step_outputs["total"]
  <tf.Tensor: shape=(), dtype=int64, numpy=9>
  """

  def __init__(self):
    self._last_step_outputs = {}
    self._reduce_ops = {}
    self._non_tensor_outputs = {}
    self.run_op = None

  @property
  def last_step_outputs(self):
    """The outputs `set_last_step_output` recorded in the last step."""
    return self._last_step_outputs

  @property
  def non_tensor_outputs(self):
    """The outputs `set_non_tensor_output` recorded."""
    return self._non_tensor_outputs

  def set_last_step_output(self, name, output, reduce_op=None):
    """Records `output` of this step as `name`, reduced across replicas by
    `reduce_op` if given (required in a replica context)."""
    if contexts.in_cross_replica_context():
      self._record(contexts.get_strategy(), name, output, reduce_op)
      return
    if reduce_op is None:
      raise ValueError("`reduce_op` must be set when `set_last_step_output` is "
                       "called in a replica context.")
    contexts.get_replica_context().merge_call(
        lambda strategy, value: self._record(strategy, name, value, reduce_op),
        args=(output,))

  def _record(self, strategy, name, output, reduce_op):
    self._reduce_ops[name] = reduce_op
    if reduce_op is not None:
      output = strategy.reduce(reduce_op, output, axis=None)
    self._last_step_outputs[name] = output

  def set_non_tensor_output(self, name, output):
    """Records a Python value as `name`."""
    if contexts.in_cross_replica_context():
      self._non_tensor_outputs[name] = output
      return

    def merge_fn(strategy, value):
      self._non_tensor_outputs[name] = strategy.experimental_local_results(value)
    contexts.get_replica_context().merge_call(merge_fn, args=(output,))


def run_steps_on_iterator(strategy, fn, iterator, iterations, initial_loop_values):
  """`extended.experimental_run_steps_on_iterator`: `fn(ctx, inputs)` for
  `iterations` steps, each on the next input, in a `tf.while_loop` (eagerly
  a Python loop); returns the `MultiStepContext`.

  In a graph only the op (or tensors) `fn` returns runs each step: it must
  return it. The outputs `fn` records with `set_last_step_output` are the
  loop's variables, each as its components (one if reduced), in the order of
  their names: `initial_loop_values` gives their starting values, flattened
  in the same order (a dict with the same keys, say).
  """
  ctx = MultiStepContext()
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
      counts = ", ".join(f"{name!r}: {len(v)} component(s)"
                         for name, v in sorted(outputs.items()))
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
    ctx.last_step_outputs[name] = (values_lib.regroup(list(components))
                                   if ctx._reduce_ops[name] is None else components[0])  # pylint: disable=protected-access
  return ctx


def _ops_of(structure):
  """The graph tensors and ops in `structure` (none eagerly)."""
  if tf.executing_eagerly():
    return []
  return [t for t in tf.nest.flatten(structure, expand_composites=True)
          if isinstance(t, (tf.Tensor, tf.Operation))]
