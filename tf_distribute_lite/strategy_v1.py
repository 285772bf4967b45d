"""The TF 1.x strategy API, over the core (`distribute_lib`), never the
reverse: `TF1Methods`, the TF 1.x methods every strategy carries as in
TensorFlow; `StrategyExtendedV1`, the base of every `extended`; and
`tf.compat.v1.distribute`'s `Strategy` (`StrategyV1`, not a TF 2.x
`Strategy`), `ReplicaContext`, multi-step loop and `get_loss_reduction`.
All work eagerly and in a TF 1.x graph run by a `tf.compat.v1.Session`.
"""

import copy

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import replica_context
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp


class TF1Methods:
  """The TF 1.x methods of a strategy (a `distribute_lib.StrategyBase`),
  which TensorFlow's TF 2.x strategies keep too."""

  def experimental_make_numpy_dataset(self, numpy_input):
    """A `tf.data.Dataset` of the slices of `numpy_input` (a nest of arrays),
    held on the input host rather than as constants of a graph."""
    return self._extended.experimental_make_numpy_dataset(numpy_input)

  def update_config_proto(self, config_proto):
    """Returns a copy of `config_proto` adjusted for this strategy."""
    return self._extended._update_config_proto(config_proto)  # pylint: disable=protected-access

  def configure(self, session_config=None, cluster_spec=None, task_type=None,
                task_id=None):
    """Deprecated: adjusts `session_config` in place for this strategy
    (`update_config_proto` gives an adjusted copy) and takes the cluster this
    task belongs to, where the strategy has one."""
    if cluster_spec:
      self._configure_cluster(tf.train.ClusterSpec(cluster_spec), task_type, task_id)
    if session_config is not None:
      session_config.CopyFrom(self.update_config_proto(session_config))

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """Takes the cluster `configure` was given; ignored, as by TensorFlow's
    `OneDeviceStrategy` and `TPUStrategy`, by a strategy on one task."""
    del cluster_spec, task_type, task_id

  def make_dataset_iterator(self, dataset):
    """An iterator giving each replica its slice of every global batch of
    `dataset`; in a TF1 graph run its `initializer` first."""
    with self.scope():
      return input_lib.initializable_iterator(self.experimental_distribute_dataset(dataset))

  def make_input_fn_iterator(self, input_fn,
                             replication_mode=input_context_lib.InputReplicationMode.PER_WORKER):
    """An iterator over the dataset `input_fn(InputContext)` returns for
    this worker, batched per replica: each replica takes the next element.
    Of a callable returned instead, each `get_next` calls it once per local
    replica, as in TensorFlow (whose default strategy fails on one).

    >>> strategy = tf_distribute_lite.compat.v1.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> iterator = strategy.make_input_fn_iterator(
    ...     lambda ctx: tf.data.Dataset.range(4).batch(ctx.get_per_replica_batch_size(4)))
    >>> [t.numpy().tolist() for t in iterator.get_next().values]
    [[0, 1], [2, 3]]
    """
    if replication_mode != input_context_lib.InputReplicationMode.PER_WORKER:
      raise ValueError(f"Input replication mode not supported: {replication_mode!r}")
    callables = []

    def dataset_fn(context):
      made = input_fn(context)
      if isinstance(made, tf.data.Dataset):
        return made
      if not callable(made):
        raise ValueError(
            f"input_fn must return a tf.data.Dataset or a callable; for "
            f"{context} it returned {made!r} of type {type(made).__name__}.")
      callables.append((made, context.num_replicas_in_sync // context.num_input_pipelines))
      return tf.data.Dataset.from_tensors(0.0)  # a stand-in, dropped below
    with self.scope():
      # As TensorFlow's: a partial last step ends the input.
      distributed = self._extended._distribute_datasets_from_function(  # pylint: disable=protected-access
          dataset_fn, None, partial_steps=False)
      if callables:
        return input_lib.CallableIterator(*callables[0], self._extended._input_host)  # pylint: disable=protected-access
      return input_lib.initializable_iterator(input_lib.owned_by(distributed, self))

  def experimental_run(self, fn, input_iterator=None):
    """Runs `fn` on every replica with its part of the next input from
    `input_iterator` (or with no argument)."""
    with self.scope():
      args = () if input_iterator is None else (input_iterator.get_next(),)
    return self.run(fn, args=args)

  def group(self, value, name=None):
    """One op that runs every component of `value` (a graph's fetch); the
    component itself where there is one."""
    components = tf.nest.flatten(self.experimental_local_results(value))
    if len(components) == 1 and name is None:
      (component,) = components
      return component.op if hasattr(component, "op") and not tf.executing_eagerly() else component
    return tf.group(components, name=name)

  def colocate_vars_with(self, colocate_with_variable):
    """`extended.colocate_vars_with`."""
    return self._extended.colocate_vars_with(colocate_with_variable)


class StrategyExtendedV1(distribute_lib.StrategyExtended,
                         stands_for=tf.compat.v1.distribute.StrategyExtended):
  """`strategy.extended` with its TF 1.x methods
  (`tf.compat.v1.distribute.StrategyExtended`), as every strategy's is.

  >>> import numpy as np
  >>> extended = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"]).extended
  >>> int(extended.experimental_make_numpy_dataset(np.arange(3)).cardinality())
  3
  """

  def _update_config_proto(self, config_proto):
    return copy.deepcopy(config_proto)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A dataset of the slices of `numpy_input`, held on the input host."""
    del session
    return input_lib.numpy_dataset(numpy_input, self._input_host)

  def experimental_run_steps_on_iterator(self, fn, iterator, iterations=1,
                                         initial_loop_values=None):
    """Runs `fn(ctx, inputs)` for `iterations` steps, each on the next
    element of `iterator`, in a `tf.while_loop`; returns the
    `MultiStepContext` `ctx` with the last step's outputs and `run_op`.

    In a graph only what `fn` returns runs each step: an op, a tensor or
    (where TensorFlow 2.21 takes only one) a nest of them and of distributed
    values. The outputs recorded with `ctx.set_last_step_output` are the
    loop's variables, each as its components (one if reduced), in the order
    of their names, which `initial_loop_values` starts in the same order.
    """
    strategy = self._container_strategy()
    contexts.require_cross_replica_or_default(strategy)
    # Where TensorFlow's TF 1.x metrics make their value ops, outside the
    # loop (docs/client_private_names.md); set only while it is built.
    self._outer_control_flow_context = _tf_bridge.control_flow_context()
    try:
      with strategy.scope():
        return _run_steps(strategy, fn, iterator, iterations, initial_loop_values)
    finally:
      del self._outer_control_flow_context


class StrategyV1(TF1Methods, distribute_lib.StrategyBase,
                 stands_for=tf.compat.v1.distribute.Strategy):
  """The TF 1.x form of `Strategy` (`tf.compat.v1.distribute.Strategy`):
  `reduce`'s `axis` defaults to None, and input comes from iterators too.

  >>> strategy = tf_distribute_lite.compat.v1.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> iterator = strategy.make_dataset_iterator(tf.data.Dataset.range(4).batch(4))
  >>> strategy.reduce("SUM", strategy.experimental_run(tf.reduce_sum, iterator))
  <tf.Tensor: shape=(), dtype=int64, numpy=6>
  """

  def reduce(self, reduce_op, value, axis=None):
    return super().reduce(reduce_op, value, axis)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A dataset of the slices of `numpy_input`, held on the input host."""
    return self._extended.experimental_make_numpy_dataset(numpy_input, session)


class ReplicaContextV1(replica_context.ReplicaContextBase,
                       stands_for=tf.compat.v1.distribute.ReplicaContext):
  """`tf.compat.v1.distribute.ReplicaContext` (no `all_gather`); strategies'
  replica contexts are TF 2.x ones, as in TensorFlow.

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
  returns: the outputs of the last step, and the op running all of them."""

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
    """Records `output` of this step as `name`, reduced across replicas by
    `reduce_op` if given (required in a replica context).

    TF 1.11-1.12 code passes `aggregation` (a `tf.VariableAggregation` or
    `tf.compat.v1.VariableAggregation`) instead: SUM and MEAN reduce,
    ONLY_FIRST_REPLICA takes replica 0's value, NONE keeps every replica's.
    """
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
  """How `set_last_step_output` combines the replicas' output: a function of
  `(strategy, output)`, or None to keep every replica's."""
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


def _run_steps(strategy, fn, iterator, iterations, initial_loop_values):
  """The loop of `StrategyExtendedV1.experimental_run_steps_on_iterator`."""
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
    ctx.last_step_outputs[name] = (components[0] if ctx._reduced[name]  # pylint: disable=protected-access
                                   else values_lib.regroup(list(components)))
  return ctx


def _ops_of(structure):
  """The graph tensors and ops in `structure` (none eagerly)."""
  if tf.executing_eagerly():
    return []
  return [t for t in tf.nest.flatten(structure, expand_composites=True)
          if isinstance(t, (tf.Tensor, tf.Operation))]
