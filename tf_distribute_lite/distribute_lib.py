"""`Strategy` and `StrategyExtended`, whose hooks (`_call_for_each_replica`,
`_reduce_to`, ...) and variable policy each strategy fills in."""

import collections
import collections.abc
import contextlib
import copy
import numbers
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import contexts
from tf_distribute_lite import deprecation
from tf_distribute_lite import device_util
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import multi_step
from tf_distribute_lite import replica_context
from tf_distribute_lite import values as values_lib
from tf_distribute_lite import variable_policy
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.tf_classes import StandsFor


class ValueContext(StandsFor, stands_for=tf.distribute.experimental.ValueContext):
  """What `value_fn` of `experimental_distribute_values_from_function` gets.

  >>> context = ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
  >>> context.replica_id_in_sync_group / context.num_replicas_in_sync
  0.5
  """

  def __init__(self, replica_id_in_sync_group=0, num_replicas_in_sync=1):
    self._replica, self._replicas = replica_id_in_sync_group, num_replicas_in_sync

  replica_id_in_sync_group = property(lambda self: self._replica,
                                      doc="The replica this value is for.")
  num_replicas_in_sync = property(lambda self: self._replicas, doc="How many replicas are in sync.")

  def __str__(self):
    return (f"tf.distribute.ValueContext(replica id "
            f"{self.replica_id_in_sync_group},  total replicas in sync: "
            f"{self.num_replicas_in_sync})")


class RunOptions(collections.namedtuple("RunOptions", [
    "experimental_enable_dynamic_batch_size",
    "experimental_bucketizing_dynamic_shape",
    "experimental_xla_options"], defaults=(True, False, None))):
  """Options for `strategy.run` (they apply to TPU strategies).

  >>> RunOptions()
  RunOptions(experimental_enable_dynamic_batch_size=True, experimental_bucketizing_dynamic_shape=False, experimental_xla_options=None)
  """


class _StrategyScope:
  """`strategy.scope()`: makes the strategy current and intercepts variables."""

  def __init__(self, strategy):
    self._strategy = strategy
    self._entry = contexts.ContextEntry.cross_replica(strategy)
    self._creator_scope = _tf_bridge.VariableCreatorScope(self._create_variable)
    self._reentered = 0

  def _create_variable(self, next_creator, **kwargs):
    if not contexts.is_current(self._strategy):
      contexts.raise_wrong_strategy(self._strategy)
    kwargs["distribute_strategy"] = self._strategy
    if "use_resource" in kwargs:  # TF 1.x creation: mirror resource variables
      kwargs["use_resource"] = True
    return self._strategy.extended._create_variable(next_creator, **kwargs)  # pylint: disable=protected-access

  def __enter__(self):
    if contexts.has_strategy():
      contexts.require_cross_replica_or_default(self._strategy)
      self._reentered += 1
      return self._strategy
    contexts.push(self._entry)
    self._creator_scope.__enter__()
    default_device = self._strategy.extended._default_device  # pylint: disable=protected-access
    self._device_scope = tf.device(default_device) if default_device else contextlib.nullcontext()
    self._device_scope.__enter__()
    _on_scope_entry(self._strategy)
    return self._strategy

  def __exit__(self, *exc_info):
    if self._reentered:
      self._reentered -= 1
      return
    self._device_scope.__exit__(*exc_info)
    self._creator_scope.__exit__(*exc_info)
    contexts.pop()


def _on_scope_entry(strategy):
  del strategy


def set_scope_entry_hook(hook):
  """Makes `hook(strategy)` run on each (not nested) scope entry; set once,
  with the client shims' (`_client_shims.install`), which sit above the core."""
  global _on_scope_entry
  _on_scope_entry = hook


class StrategyBase(StandsFor):
  """What the TF 2.x `Strategy` and the TF 1.x `compat.v1.Strategy` share."""

  # Read by TF 1.x optimizers and tf_keras (docs/client_private_names.md).
  _scale_loss_for_estimator = False
  _should_use_with_coordinator = False

  def __init__(self, extended):
    self._extended = extended

  @property
  def extended(self):
    """The `StrategyExtended` with the lower-level methods."""
    return self._extended

  @property
  def num_replicas_in_sync(self):
    """How many replicas take part in each synchronous step."""
    return self._extended._num_replicas_in_sync  # pylint: disable=protected-access

  @property
  def cluster_resolver(self):
    """The cluster resolver of a multi-worker strategy, else None."""
    return getattr(self._extended, "_cluster_resolver", None)

  def scope(self):
    """A context manager making this strategy current (cross-replica), in
    which the strategy creates the variables."""
    return _StrategyScope(self)

  def run(self, fn, args=(), kwargs=None, options=None):
    """Calls `fn` once per replica with its components of distributed
    arguments; returns the results regrouped. In a `tf.function`, a step
    whose input fails updates nothing (TensorFlow 2.21 may update some
    replicas).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> strategy.run(lambda x: x + 1, args=(tf.constant(1),))
    PerReplica:{
      0: <tf.Tensor: shape=(), dtype=int32, numpy=2>,
      1: <tf.Tensor: shape=(), dtype=int32, numpy=2>
    }
    """
    kwargs = {} if kwargs is None else kwargs
    _check_run_arguments(args, kwargs)
    _check_replica_counts(self, args, "args")
    if kwargs:
      _check_replica_counts(self, kwargs, "kwargs")
    with self.scope():
      return self._extended._run(fn, args, kwargs, options)  # pylint: disable=protected-access

  def reduce(self, reduce_op, value, axis):
    """Reduces `value` across replicas, and along `axis` (if not None)
    within each; MEAN divides by the true element count.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> parts = strategy.experimental_distribute_values_from_function(
    ...     lambda ctx: tf.constant([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 0.0, 0.0]][
    ...         ctx.replica_id_in_sync_group][:4 - 2 * ctx.replica_id_in_sync_group]))
    >>> strategy.reduce("MEAN", parts, axis=0)
    <tf.Tensor: shape=(), dtype=float32, numpy=2.5>
    """
    contexts.require_cross_replica_or_default(self)
    reduce_op = ReduceOp.from_any(reduce_op)
    if axis is None:
      reduce_one = lambda v: self._extended._reduce(reduce_op, v)  # pylint: disable=protected-access
    else:
      reduce_one = lambda v: self._reduce_along(reduce_op, v, axis)
    if tf.nest.is_nested(value):
      return tf.nest.map_structure(reduce_one, value)
    return reduce_one(value)

  def _reduce_along(self, reduce_op, value, axis):
    local_replicas = self._extended._num_local_replicas  # pylint: disable=protected-access
    if isinstance(value, tf.distribute.DistributedValues):
      components = value.values
    else:
      components = (value,) * local_replicas
    sparse = [c for c in components if isinstance(c, tf.SparseTensor)]
    if sparse:  # TensorFlow 2.21 fails converting it, with a TypeError.
      raise TypeError(
          f"`strategy.reduce` along an axis is not supported for a "
          f"tf.SparseTensor; got one of shape {sparse[0].shape} with "
          f"axis={axis!r}. Convert it with tf.sparse.to_dense first.")
    if len(components) == self.num_replicas_in_sync == local_replicas:
      return communicator_lib.reduce_along_axis(reduce_op, components, axis)
    # Other processes hold the other replicas' components.
    return communicator_lib.reduce_along_axis(reduce_op, components, axis, lambda total: (
        self._extended._reduce(ReduceOp.SUM, total)))  # pylint: disable=protected-access

  def experimental_local_results(self, value):
    """The components of `value` on this worker's replicas, as a tuple.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> result = strategy.run(lambda: tf.constant(1.0))
    >>> [t.numpy().item() for t in strategy.experimental_local_results(result)]
    [1.0, 1.0]
    """
    return self._extended._local_results(value)  # pylint: disable=protected-access

  def unwrap(self, value):
    """Deprecated: use `experimental_local_results`."""
    deprecation.warn_once("Strategy.unwrap", "use `experimental_local_results` instead.")
    return self.experimental_local_results(value)

  def experimental_distribute_dataset(self, dataset, options=None):
    """A `tf.distribute.DistributedDataset` giving each replica in turn
    `ceil(batch / replicas)` elements of each batch, or what is left;
    across workers the dataset is auto-sharded first.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> dataset = tf.data.Dataset.range(6).batch(4)
    >>> for batch in strategy.experimental_distribute_dataset(dataset):
    ...   print([t.numpy().tolist() for t in batch.values])
    [[0, 1], [2, 3]]
    [[4], [5]]
    """
    return input_lib.owned_by(
        self._extended._experimental_distribute_dataset(dataset, options), self)  # pylint: disable=protected-access

  def distribute_datasets_from_function(self, dataset_fn, options=None):
    """A `tf.distribute.DistributedDataset` of the datasets, batched per
    replica, that `dataset_fn(InputContext)` makes per input pipeline. Its
    `cardinality` counts batches, as in TensorFlow: without `steps_per_epoch`
    a Keras epoch ends at a step with no input, which updates nothing
    (TensorFlow 2.21 may count it in `optimizer.iterations`).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> def dataset_fn(context):
    ...   batch_size = context.get_per_replica_batch_size(4)
    ...   return tf.data.Dataset.range(4).batch(batch_size)
    >>> for batch in strategy.distribute_datasets_from_function(dataset_fn):
    ...   print([t.numpy().tolist() for t in batch.values])
    [[0, 1], [2, 3]]
    """
    input_context_lib.check_function_options(options)
    return input_lib.owned_by(
        self._extended._distribute_datasets_from_function(dataset_fn, options), self)  # pylint: disable=protected-access

  def experimental_distribute_datasets_from_function(self, dataset_fn, options=None):
    """The former name of `distribute_datasets_from_function`."""
    return self.distribute_datasets_from_function(dataset_fn, options)

  # --- The TF 1.x methods, which TensorFlow's TF 2.x strategies keep too.

  def experimental_make_numpy_dataset(self, numpy_input):
    """A dataset of the slices of `numpy_input`, held on the input host
    (TensorFlow 2.21 has it on `extended` only)."""
    return self._extended.experimental_make_numpy_dataset(numpy_input)

  def update_config_proto(self, config_proto):
    """Returns a copy of `config_proto` adjusted for this strategy."""
    return self._extended._update_config_proto(config_proto)  # pylint: disable=protected-access

  def configure(self, session_config=None, cluster_spec=None, task_type=None, task_id=None):
    """Deprecated: adjusts `session_config` in place and takes this task's
    cluster, where the strategy has one."""
    if cluster_spec:
      self._extended._configure_cluster(  # pylint: disable=protected-access
          tf.train.ClusterSpec(cluster_spec), task_type, task_id)
    if session_config is not None:
      session_config.CopyFrom(self.update_config_proto(session_config))

  def make_dataset_iterator(self, dataset):
    """An iterator over `experimental_distribute_dataset(dataset)`; in a
    TF1 graph run its `initializer` first."""
    with self.scope():
      return input_lib.initializable_iterator(self.experimental_distribute_dataset(dataset))

  def make_input_fn_iterator(self, input_fn,
                             replication_mode=input_context_lib.InputReplicationMode.PER_WORKER):
    """An iterator over this worker's dataset `input_fn(InputContext)`,
    batched per replica; a callable returned instead is called once per
    local replica by each `get_next`.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
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
    """`run(fn)` on the next input of `input_iterator`, if given."""
    with self.scope():
      args = () if input_iterator is None else (input_iterator.get_next(),)
    return self.run(fn, args=args)

  def group(self, value, name=None):
    """One op running every component of `value` (the component if one)."""
    components = tf.nest.flatten(self.experimental_local_results(value))
    if len(components) == 1 and name is None:
      (component,) = components
      return component.op if hasattr(component, "op") and not tf.executing_eagerly() else component
    return tf.group(components, name=name)

  def colocate_vars_with(self, colocate_with_variable):
    """`extended.colocate_vars_with`."""
    return self._extended.colocate_vars_with(colocate_with_variable)


class Strategy(StrategyBase, stands_for=tf.distribute.Strategy):
  """A distribution policy: where variables live and how steps run.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0)
  >>> per_replica = strategy.run(lambda: v * 2.0)
  >>> strategy.reduce(tf_distribute_lite.ReduceOp.SUM, per_replica, axis=None)
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  """

  def gather(self, value, axis):
    """Concatenates the replicas' components of each element of `value`
    along `axis` (TensorFlow 2.21 returns replica 0's of a nest). A
    `tf.IndexedSlices` raises `NotImplementedError`, as in TensorFlow.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> parts = strategy.experimental_distribute_values_from_function(
    ...     lambda ctx: tf.fill([1, 2], ctx.replica_id_in_sync_group))
    >>> strategy.gather(parts, axis=0)
    <tf.Tensor: shape=(2, 2), dtype=int32, numpy=
    array([[0, 0],
           [1, 1]], dtype=int32)>
    """
    if not contexts.in_cross_replica_context() and contexts.has_strategy():
      raise RuntimeError(
          "`tf.distribute.Strategy.gather` is not supported in a replica "
          "context; use `tf.distribute.ReplicaContext.all_gather` instead.")
    replica_context.refuse_indexed_slices(value, "gather")
    destination = device_util.current() or "/device:CPU:0"
    return tf.nest.map_structure(
        lambda v: self._extended._local_results(  # pylint: disable=protected-access
            self._extended._gather_to(v, destination, axis))[0], value)  # pylint: disable=protected-access

  def experimental_distribute_values_from_function(self, value_fn):
    """Distributed values made by `value_fn(ValueContext)` for each replica.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> strategy.experimental_distribute_values_from_function(
    ...     lambda ctx: ctx.replica_id_in_sync_group * 10)
    PerReplica:{
      0: 0,
      1: 10
    }
    """
    return self._extended._distribute_values_from_function(value_fn)  # pylint: disable=protected-access


def _check_run_arguments(args, kwargs):
  if not isinstance(args, (list, tuple)):
    raise ValueError(
        f"positional args must be a list or tuple, got {type(args)}: the "
        f"`args` of strategy.run are the positional arguments of `fn`; for "
        f"one argument x pass args=(x,).")
  if not isinstance(kwargs, collections.abc.Mapping):
    raise TypeError(
        f"`kwargs` of strategy.run must be a dict of keyword arguments for "
        f"`fn`, got {type(kwargs)}.")


def check_count(value, argument, minimum):
  """Raises `TypeError` unless count `value` is an int, `ValueError` if it
  is below `minimum`.

  >>> check_count(-1, "num_gpus", 0)
  Traceback (most recent call last):
  ...
  ValueError: Argument `num_gpus` must be an integer of at least 0. Received: num_gpus=-1
  """
  if not isinstance(value, numbers.Integral) or isinstance(value, bool):
    raise TypeError(f"Argument `{argument}` must be an integer. Received: "
                    f"{argument}={value!r} of type {type(value).__name__}")
  if value < minimum:
    raise ValueError(f"Argument `{argument}` must be an integer of at least "
                     f"{minimum}. Received: {argument}={value!r}")


def _check_replica_counts(strategy, structure, argument):
  expected = strategy.extended._num_local_replicas  # pylint: disable=protected-access
  counts = [_replica_count(leaf) for leaf in tf.nest.flatten(structure)]
  if all(count in (None, expected) for count in counts):
    return
  count, path = next(
      ((_replica_count(value), path) for path, value in values_lib.flatten_with_paths(structure)
       if _replica_count(value) not in (None, expected)),
      (max(count or 0 for count in counts), ""))
  raise ValueError(
      f"`{argument}`{path} of strategy.run holds {count} "
      f"per-replica values, but the strategy has {expected} replicas: "
      f"distributed values passed to run must come from the same strategy.")


def _replica_count(value):
  return len(value.values) if values_lib.is_split(value) else None


class StrategyExtended(StandsFor, stands_for=tf.distribute.StrategyExtended):
  """The lower-level methods of a strategy: `strategy.extended`.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> strategy.extended.worker_devices
  ('/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1')
  """

  def __init__(self, container_strategy, variables=None):
    self._container_strategy_ref = weakref.ref(container_strategy)
    self._variables = variables or variable_policy.VariablePolicy(container_strategy)

  def _container_strategy(self):
    return self._container_strategy_ref()

  # Read by TensorFlow and tf_keras (docs/client_private_names.md).
  _retrace_functions_for_each_device = False
  _global_batch_size = True

  def _use_merge_call(self):
    return True

  def _in_multi_worker_mode(self):
    return False

  # Where ops made in `scope()` go unless placed; None: the caller's device.
  _default_device = None
  _between_graph = False

  experimental_between_graph = property(
      lambda self: self._between_graph, doc="Whether each worker builds its own graph.")
  experimental_require_static_shapes = property(
      lambda self: False, doc="Whether the input must have static shapes.")

  _is_chief = True  # the chief writes checkpoints and summaries
  experimental_should_init = property(
      lambda self: True, doc="Whether this task initializes the variables.")
  should_checkpoint = property(
      lambda self: self._is_chief, doc="Whether this task writes checkpoints.")
  should_save_summary = property(
      lambda self: self._is_chief, doc="Whether this task saves summaries.")

  # --- Variables.

  def variable_created_in_scope(self, v):
    """Whether `v` was created inside this strategy's scope."""
    return _tf_bridge.variable_strategy(v) is self._container_strategy()

  def colocate_vars_with(self, colocate_with_variable):
    """A scope in which new variables are placed like `colocate_with_variable`.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> with strategy.scope():
    ...   v = tf.Variable(1.0)
    ...   with strategy.extended.colocate_vars_with(v):
    ...     slot = tf.Variable(0.0)
    >>> [c.device[-5:] for c in slot.values]
    ['CPU:0', 'CPU:1']
    """
    strategy = self._container_strategy()
    if not contexts.is_current(strategy):
      contexts.raise_wrong_strategy(strategy)
    if _tf_bridge.variable_strategy(colocate_with_variable) is not strategy:
      raise ValueError(
          "`colocate_vars_with` must only be passed a variable created in "
          f"this tf.distribute.Strategy.scope(), not: {colocate_with_variable!r}")

    def create_colocated(next_creator, **kwargs):
      kwargs["colocate_with"] = colocate_with_variable
      return next_creator(**kwargs)
    return tf.variable_creator_scope(create_colocated)

  def _create_variable(self, next_creator, **kwargs):
    return self._variables.create(next_creator, **kwargs)

  def value_container(self, val):
    """The distributed variable `val` is a component of, else `val`."""
    container = values_lib.distributed_container(val)
    return val if container is None else container

  def _replica_local_variable(self, variable):
    """What a replica uses for distributed `variable`, if not a component."""
    return self._variables.replica_local_variable(variable)

  def read_var(self, replica_local_var):
    """`replica_local_var` as one tensor: for sync-on-read variables, the
    aggregated value."""
    if isinstance(replica_local_var, tf.Variable):
      return tf.identity(replica_local_var.value())
    return tf.identity(replica_local_var)

  # --- Running replicas.

  def call_for_each_replica(self, fn, args=(), kwargs=None):
    """Runs `fn` once per replica (the TF 1.x name of `strategy.run`)."""
    with self._container_strategy().scope():
      return self._call_for_each_replica(fn, args, kwargs or {})

  def _run(self, fn, args, kwargs, options):
    """`strategy.run` in its scope; only TPU strategies take `options`."""
    del options
    return self._call_for_each_replica(fn, args, kwargs)

  def _call_for_each_replica(self, fn, args, kwargs):
    fn = _tf_bridge.autograph_convert(fn)
    with replica_context.ReplicaContext(self._container_strategy(), 0):
      return fn(*args, **kwargs)

  def _distribute_values_from_function(self, value_fn):
    return value_fn(ValueContext())

  def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
    """`get_replica_context().all_reduce`, for the Model Garden's explicit
    gradient all-reduce (docs/client_private_names.md)."""
    if contexts.in_cross_replica_context():  # TensorFlow asserts
      raise AssertionError("`StrategyExtended._replica_ctx_all_reduce` must be "
                           "called in a replica context")
    replica = self._own_replica_context()
    if replica is None:
      contexts.raise_wrong_strategy(self._container_strategy())
    return replica.all_reduce(reduce_op, value, options)

  def _own_replica_context(self):
    """The current replica context if it is this strategy's, else None."""
    replica = getattr(contexts.top(), "replica_context", None)
    return replica if getattr(replica, "strategy", None) is self._container_strategy() else None

  def _get_local_replica_id(self, replica_id_in_sync_group):
    """Read by TensorFlow's `ReplicaContext`: the index among this worker's
    replicas."""
    return replica_id_in_sync_group

  _num_replicas_in_sync = property(lambda self: 1)
  # The replicas this process runs.
  _num_local_replicas = property(lambda self: self._num_replicas_in_sync)

  @property
  def worker_devices(self):
    """The devices the replicas run on, one per replica."""
    raise RuntimeError("worker_devices() method unsupported by default tf.distribute.Strategy.")

  parameter_devices = property(lambda self: self._variables.parameter_devices,
                               doc="The devices variables are placed on.")
  worker_devices_by_replica = property(
      lambda self: [[device] for device in self.worker_devices],
      doc="Each replica's devices, one list per replica.")

  def non_slot_devices(self, var_list):
    """The devices for non-slot variables (such as an optimizer's step)."""
    return self._variables.non_slot_devices(var_list)

  def _local_results(self, value):
    return values_lib.local_results(value, self._num_local_replicas)

  # --- Reductions.

  def reduce_to(self, reduce_op, value, destinations, options=None):
    """Reduces `value` across replicas onto `destinations`: a tensor for
    one device, else a `Mirrored` value (TensorFlow 2.21 puts every
    component of a MEAN onto a distributed value's devices on the first).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> per_replica = strategy.run(lambda: tf.constant(1.0))
    >>> strategy.extended.reduce_to("SUM", per_replica, destinations="CPU:0")
    <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
    """
    contexts.require_cross_replica_or_default(self._container_strategy())
    if isinstance(reduce_op, tf.VariableAggregation):
      raise ValueError("`reduce_op` must be a tf.distribute.ReduceOp, not a "
                       f"tf.VariableAggregation ({reduce_op}).")
    return self._reduce_to(ReduceOp.from_any(reduce_op), value, destinations, options)

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
    """`reduce_to` for a list of `(value, destinations)` pairs (one device:
    a tensor, where TensorFlow 2.21 may give a `Mirrored`); a value not
    distributed comes back, copied onto its destinations.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> per_replica = strategy.run(lambda: tf.constant(1.0))
    >>> strategy.extended.batch_reduce_to("SUM", [(per_replica, "CPU:1"),
    ...                                           (tf.constant(3.0), "CPU:1")])
    [<tf.Tensor: shape=(), dtype=float32, numpy=2.0>, <tf.Tensor: shape=(), dtype=float32, numpy=3.0>]
    """
    contexts.require_cross_replica_or_default(self._container_strategy())
    return self._batch_reduce_to(ReduceOp.from_any(reduce_op),
                                 list(value_destination_pairs), options)

  def _reduce_to(self, reduce_op, value, destinations, options):
    del reduce_op, destinations, options
    return value

  def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    return [self._reduce_to(reduce_op, v, d, options) for v, d in value_destination_pairs]

  def _reduce(self, reduce_op, value):
    return self._local_results(self._reduce_to(
        reduce_op, value, self._reduce_destination(), None))[0]

  def _reduce_destination(self):
    return device_util.current() or self._default_device or "/device:CPU:0"

  def broadcast_to(self, tensor, destinations):
    """Copies `tensor` onto `destinations` (a `Mirrored` value for several)."""
    contexts.require_cross_replica_or_default(self._container_strategy())
    return self._broadcast_to(tensor, destinations)

  def _broadcast_to(self, tensor, destinations):
    del destinations
    return tensor

  def _gather_to(self, value, destinations, axis, options=None):
    del destinations, axis, options
    return value

  # --- Updates.

  def update(self, var, fn, args=(), kwargs=None, group=True):
    """Runs `fn(component, *args, **kwargs)` on each component of `var`
    (in a replica context, through `merge_call`).

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> with strategy.scope():
    ...   v = tf.Variable(1.0)
    >>> _ = strategy.extended.update(v, lambda c, x: c.assign_add(x), args=(2.0,))
    >>> v.values[1].numpy().item()
    3.0
    """
    kwargs = {} if kwargs is None else kwargs
    fn = _tf_bridge.autograph_convert(fn)
    replica_context = self._own_replica_context()
    if replica_context is not None:
      def merge_fn(merged_strategy, *merged_args, **merged_kwargs):
        return merged_strategy.extended.update(var, fn, merged_args, merged_kwargs, group)
      return replica_context.merge_call(merge_fn, args=args, kwargs=kwargs)
    with self._container_strategy().scope():
      return self._variables.update(var, fn, args, kwargs, group)

  def update_non_slot(self, colocate_with, fn, args=(), kwargs=None, group=True):
    """Runs `fn(*args, **kwargs)` once per device of `colocate_with`."""
    with self._container_strategy().scope():
      return self._variables.update_non_slot(
          colocate_with, _tf_bridge.autograph_convert(fn), args, kwargs or {}, group)

  _input_host = property(lambda self: device_util.canonicalize("/device:CPU:0"))

  # Input functions across workers: this worker's `InputContext`, a `WorkerSync`.
  _worker_sync = None

  def _input_context(self):
    return None

  def _experimental_distribute_dataset(self, dataset, options):
    if input_context_lib.is_per_replica(options):
      raise NotImplementedError(
          "InputReplicationMode.PER_REPLICA is only supported in "
          "`distribute_datasets_from_function`.")
    return input_lib.distribute_dataset(dataset, self.worker_devices, self._input_host, options)

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    """`partial_steps` (see `input_lib`) defaults to the strategy's
    `experimental_enable_get_next_as_optional`."""
    if partial_steps is None:
      partial_steps = getattr(self, "experimental_enable_get_next_as_optional", False)
    return input_lib.distribute_datasets_from_function(
        dataset_fn, self.worker_devices, self._input_host, options,
        input_context=self._input_context(), workers=self._worker_sync,
        partial_steps=partial_steps)

class StrategyExtendedV1(StrategyExtended, stands_for=tf.compat.v1.distribute.StrategyExtended):
  """`StrategyExtended` with the TF 1.x methods: the base of every
  strategy's `extended`, as in TensorFlow.

  >>> extended = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"]).extended
  >>> isinstance(extended, tf.compat.v1.distribute.StrategyExtended)
  True
  """

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """`strategy.configure`'s cluster: ignored by a strategy of one task."""
    del cluster_spec, task_type, task_id

  def _update_config_proto(self, config_proto):
    return copy.deepcopy(config_proto)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A dataset of the slices of `numpy_input`, held on the input host.

    >>> extended = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"]).extended
    >>> int(extended.experimental_make_numpy_dataset(np.arange(3)).cardinality())
    3
    """
    del session
    return input_lib.numpy_dataset(numpy_input, self._input_host)

  def experimental_run_steps_on_iterator(self, fn, iterator, iterations=1,
                                         initial_loop_values=None):
    """Runs `fn(ctx, inputs)` on the next `iterations` elements of
    `iterator` in a `tf.while_loop`; returns the `MultiStepContext` `ctx`.
    In a graph only what `fn` returns (a nest, where TensorFlow 2.21 takes
    one op) runs; `initial_loop_values` start `ctx`'s outputs by name."""
    strategy = self._container_strategy()
    contexts.require_cross_replica_or_default(strategy)
    # Read by TF 1.x metrics while the loop is built (docs/client_private_names.md).
    self._outer_control_flow_context = _tf_bridge.control_flow_context()
    try:
      with strategy.scope():
        return multi_step.run_steps(strategy, fn, iterator, iterations, initial_loop_values)
    finally:
      del self._outer_control_flow_context


_global_scopes = weakref.WeakKeyDictionary()


def experimental_set_strategy(strategy):
  """Makes `strategy` current without a `with` block (None resets it).

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> experimental_set_strategy(strategy)
  >>> tf_distribute_lite.get_strategy() is strategy
  True
  >>> experimental_set_strategy(None)
  >>> tf_distribute_lite.has_strategy()
  False
  """
  graph = tf.compat.v1.get_default_graph()
  old_scope = _global_scopes.pop(graph, None)
  if old_scope is not None:
    old_scope.__exit__(None, None, None)
  if contexts.has_strategy():
    raise RuntimeError("Must not be called inside a `tf.distribute.Strategy` scope.")
  if strategy is not None:
    new_scope = strategy.scope()
    new_scope.__enter__()
    _global_scopes[graph] = new_scope

