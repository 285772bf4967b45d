"""`Strategy` and `StrategyExtended`: the TF 2.x core of every strategy.

A strategy decides where variables live and how a step runs on several
replicas. `Strategy` holds the user-facing methods (`scope`, `run`, `reduce`,
...); `StrategyExtended` the lower-level ones (`reduce_to`, `update`, ...).
Concrete strategies subclass `StrategyExtended` and fill in its hooks
(`_call_for_each_replica`, `_reduce_to`, `_batch_reduce_to`, `_gather_to`)
and give it a variable policy (`variable_policy`), which makes, places and
updates the variables. Code inside `run` sees a
`replica_context.ReplicaContext`; the TF 1.x methods that strategies carry
too are added by `strategy_v1`, which this module never imports.
"""

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
  num_replicas_in_sync = property(lambda self: self._replicas,
                                  doc="How many replicas are in sync.")

  def __str__(self):
    return (f"tf.distribute.ValueContext(replica id "
            f"{self.replica_id_in_sync_group},  total replicas in sync: "
            f"{self.num_replicas_in_sync})")


class RunOptions(collections.namedtuple("RunOptions", [
    "experimental_enable_dynamic_batch_size",
    "experimental_bucketizing_dynamic_shape",
    "experimental_xla_options"])):
  """Options for `strategy.run` (they apply to TPU strategies).

  >>> RunOptions()
  RunOptions(experimental_enable_dynamic_batch_size=True, experimental_bucketizing_dynamic_shape=False, experimental_xla_options=None)
  """

  def __new__(cls, experimental_enable_dynamic_batch_size=True,
              experimental_bucketizing_dynamic_shape=False,
              experimental_xla_options=None):
    return super().__new__(cls, experimental_enable_dynamic_batch_size,
                           experimental_bucketizing_dynamic_shape,
                           experimental_xla_options)


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
  """What entering a strategy's scope also does: `set_scope_entry_hook`'s."""
  del strategy


def set_scope_entry_hook(hook):
  """Makes `hook(strategy)` run whenever a strategy's scope is entered (not
  re-entered). Called once, by the package's `__init__`, with the client
  shims' (`_client_shims.install`), which sit above the core."""
  global _on_scope_entry
  _on_scope_entry = hook


class StrategyBase(StandsFor):
  """What the TF 2.x `Strategy` and the TF 1.x `compat.v1.Strategy` share."""

  # Read by TensorFlow's TF 1.x optimizers: losses are not rescaled.
  _scale_loss_for_estimator = False
  # Read by tf_keras: only a parameter-server strategy is driven through a
  # `ClusterCoordinator`.
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
    """The cluster resolver of a multi-worker strategy (its extended
    object's `_cluster_resolver`), else None."""
    return getattr(self._extended, "_cluster_resolver", None)

  def scope(self):
    """A context manager making this strategy current.

    Inside it `tf.distribute.get_strategy()` returns this strategy, the
    context is cross-replica, and variables are created by the strategy.
    """
    return _StrategyScope(self)

  def run(self, fn, args=(), kwargs=None, options=None):
    """Calls `fn` once per replica with that replica's part of the arguments.

    Distributed values in `args` and `kwargs` give each replica its own
    component. Returns the results grouped per nest element: `PerReplica`
    values, `Mirrored` values, or plain values where every replica returned
    the same object (or there is one replica).

    Inside a `tf.function`, no op of the step starts before every replica's
    input is there, so a step whose input fails (a dataset that has run out)
    applies none of its updates. TensorFlow 2.21 may apply some of them
    (Keras' iteration count, say) to some replicas' copies of a variable and
    not to others.

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
    """Reduces `value` across replicas, and along `axis` within each.

    `axis=None` combines the replicas' values elementwise. With an `axis`
    the values are reduced along it too; MEAN then divides by the true
    number of elements, so a partial last batch is weighted correctly.

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
    """Deprecated: use `experimental_local_results`.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> len(strategy.unwrap(strategy.run(lambda: tf.constant(1.0))))
    2
    """
    deprecation.warn_once("Strategy.unwrap",
                          "use `experimental_local_results` instead.")
    return self.experimental_local_results(value)

  def experimental_distribute_dataset(self, dataset, options=None):
    """A `tf.distribute.DistributedDataset` splitting each global batch of
    `dataset` across the replicas.

    A global batch of `b` gives each replica in turn `ceil(b / replicas)`
    elements, or what is left, so replicas at the end of a partial batch get
    empty batches. Across several input workers the dataset is first
    auto-sharded by its `options().experimental_distribute.auto_shard_policy`.

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
    """A `tf.distribute.DistributedDataset` of the datasets `dataset_fn`
    makes, one per input pipeline; each replica dequeues its own batch.

    `dataset_fn` gets a `tf.distribute.InputContext` and returns a dataset
    batched per replica.

    As in TensorFlow, its `cardinality` counts the batches of the datasets,
    not the steps, and Keras `fit` takes it for its steps per epoch; so
    without `steps_per_epoch` an epoch ends at a step that finds no input.
    That step updates nothing; in TensorFlow 2.21 it may still count one more
    `optimizer.iterations` per epoch. Repeat the dataset and pass
    `steps_per_epoch`, as TensorFlow's tutorials do, for the same numbers.

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

  def experimental_distribute_datasets_from_function(self, dataset_fn,
                                                     options=None):
    """The former name of `distribute_datasets_from_function`.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> dist = strategy.experimental_distribute_datasets_from_function(
    ...     lambda context: tf.data.Dataset.range(2).batch(1))
    >>> int(dist.cardinality)
    2
    """
    return self.distribute_datasets_from_function(dataset_fn, options)

  # --- The TF 1.x methods, which TensorFlow's TF 2.x strategies keep too.

  def experimental_make_numpy_dataset(self, numpy_input):
    """A `tf.data.Dataset` of the slices of `numpy_input` (a nest of arrays),
    held on the input host rather than as constants of a graph. (TensorFlow
    2.21's TF 2.x strategies have it on `extended` only.)"""
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
      self._extended._configure_cluster(  # pylint: disable=protected-access
          tf.train.ClusterSpec(cluster_spec), task_type, task_id)
    if session_config is not None:
      session_config.CopyFrom(self.update_config_proto(session_config))

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
    """Concatenates the replicas' components of `value` along `axis`.

    `value` may be a nest; each element is gathered. (TensorFlow 2.21
    returns replica 0's components of a nest instead.) A `tf.IndexedSlices`
    raises `NotImplementedError`, as in TensorFlow (where one in a nest
    comes back ungathered); a distributed value of them is gathered dense.

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
  """TF's checks of `run`'s `args` and `kwargs`, with clearer messages."""
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
  """Raises `TypeError` unless `value` is an int, `ValueError` if it is
  below `minimum`: for counts such as `num_gpus` or `steps_per_run`.

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
  for leaf in tf.nest.flatten(structure):
    if _replica_count(leaf) not in (None, expected):
      break
  else:
    return
  count, path = next(
      ((_replica_count(value), path) for path, value in
       values_lib.flatten_with_paths(structure)
       if _replica_count(value) not in (None, expected)),
      (max(_replica_count(leaf) or 0 for leaf in tf.nest.flatten(structure)), ""))
  raise ValueError(
      f"`{argument}`{path} of strategy.run holds {count} "
      f"per-replica values, but the strategy has {expected} replicas: "
      f"distributed values passed to run must come from the same strategy.")


def _replica_count(value):
  """How many per-replica components `value` has, None if not distributed."""
  return len(value.values) if values_lib.is_split(value) else None


class StrategyExtended(StandsFor, stands_for=tf.distribute.StrategyExtended):
  """The lower-level methods of a strategy: `strategy.extended`.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> strategy.extended.worker_devices
  ('/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1')
  """

  def __init__(self, container_strategy, variables=None):
    self._container_strategy_ref = weakref.ref(container_strategy)
    # How variables are made, placed and updated (`variable_policy`).
    self._variables = variables or variable_policy.VariablePolicy(container_strategy)

  def _container_strategy(self):
    return self._container_strategy_ref()

  # Read by TensorFlow's tf.function cache: one trace per device when True.
  _retrace_functions_for_each_device = False

  def _use_merge_call(self):
    """Read by Keras: replica-context updates go through `merge_call`."""
    return True

  def _in_multi_worker_mode(self):
    return False

  # Where ops made in `scope()` go unless placed (one task of a cluster, whose
  # graph this process builds); None: wherever the caller's device says.
  _default_device = None

  # Read by tf_keras: datasets are batched by the global batch size (every
  # TensorFlow strategy answers True).
  _global_batch_size = True

  # --- What multi-worker code asks of a strategy; one worker answers alike.

  _between_graph = False

  @property
  def experimental_between_graph(self):
    """Whether each worker builds its own graph (between-graph replication)."""
    return self._between_graph

  @property
  def experimental_require_static_shapes(self):
    """Whether the input must have static shapes."""
    return False

  # The chief of a cluster writes checkpoints and summaries; a strategy of
  # one task is its own chief. Every task initializes its variables.
  _is_chief = True

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
    with replica_context.ReplicaContext(self._container_strategy(), 0):
      return fn(*args, **kwargs)

  def _distribute_values_from_function(self, value_fn):
    return value_fn(ValueContext())

  def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
    """Read by the Model Garden's `grad_utils` (explicit gradient
    all-reduce) and TensorFlow's bundled Keras: `value` (a nest of tensors)
    reduced across the replicas, from a replica context, as
    `get_replica_context().all_reduce` does.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> strategy.run(lambda: strategy.extended._replica_ctx_all_reduce(
    ...     "SUM", tf.constant(2.0))).values[1]
    <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
    """
    if contexts.in_cross_replica_context():  # TensorFlow asserts
      raise AssertionError("`StrategyExtended._replica_ctx_all_reduce` must be "
                           "called in a replica context")
    replica = self._own_replica_context()
    if replica is None:
      contexts.raise_wrong_strategy(self._container_strategy())
    return replica.all_reduce(reduce_op, value, options)

  def _own_replica_context(self):
    """The current replica context if it is one of this strategy's, else
    None. (With no strategy entered, the default strategy's is current,
    which its `extended` answers.)"""
    replica = getattr(contexts.top(), "replica_context", None)
    return replica if getattr(replica, "strategy", None) is self._container_strategy() else None

  def _get_local_replica_id(self, replica_id_in_sync_group):
    """Read by `tf.distribute.ReplicaContext(strategy, replica_id)`: the
    index among this worker's replicas of replica `replica_id_in_sync_group`
    (the same on one worker)."""
    return replica_id_in_sync_group

  @property
  def _num_replicas_in_sync(self):
    return 1

  @property
  def _num_local_replicas(self):
    """How many of the replicas run in this process (all, on one worker)."""
    return self._num_replicas_in_sync

  @property
  def worker_devices(self):
    """The devices the replicas run on, one per replica."""
    raise RuntimeError(
        "worker_devices() method unsupported by default tf.distribute.Strategy.")

  @property
  def parameter_devices(self):
    """The devices variables are placed on."""
    return self._variables.parameter_devices

  @property
  def worker_devices_by_replica(self):
    """Each replica's devices, one list per replica."""
    return [[device] for device in self.worker_devices]

  def non_slot_devices(self, var_list):
    """The devices for non-slot variables (such as an optimizer's step)."""
    return self._variables.non_slot_devices(var_list)

  def _local_results(self, value):
    return values_lib.local_results(value, self._num_local_replicas)

  # --- Reductions.

  def reduce_to(self, reduce_op, value, destinations, options=None):
    """Reduces `value` across replicas onto `destinations`.

    The result is a tensor on the destination device, or a `Mirrored` value
    with one component on each destination device. (Onto the devices of a
    distributed value, TensorFlow 2.21 puts every component of a MEAN on the
    first device.)

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> per_replica = strategy.run(lambda: tf.constant(1.0))
    >>> strategy.extended.reduce_to("SUM", per_replica, destinations="CPU:0")
    <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
    """
    contexts.require_cross_replica_or_default(self._container_strategy())
    if isinstance(reduce_op, tf.VariableAggregation):
      raise ValueError("`reduce_op` must be a tf.distribute.ReduceOp, not a "
                       f"tf.VariableAggregation ({reduce_op}).")
    return self._reduce_to(ReduceOp.from_any(reduce_op), value, destinations,
                           options)

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
    """`reduce_to` for a list of `(value, destinations)` pairs at once.

    Each result is a tensor where its destinations are one device (even when
    TensorFlow 2.21 would wrap it in a one-component `Mirrored`), else a
    `Mirrored` value. A value that is not distributed is the same on every
    replica, so it is already reduced: it comes back unchanged, copied onto
    its destinations if they are elsewhere.

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
    return [self._reduce_to(reduce_op, v, d, options)
            for v, d in value_destination_pairs]

  def _reduce(self, reduce_op, value):
    return self._local_results(self._reduce_to(
        reduce_op, value, self._reduce_destination(), None))[0]

  def _reduce_destination(self):
    """Where `strategy.reduce` puts its result: on the current device, else
    on the strategy's default device, else on the CPU."""
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
    """Runs `fn(component, *args, **kwargs)` on each component of `var`.

    In a replica context this first waits for all replicas (`merge_call`)
    and passes `fn` their arguments grouped.

    >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
    >>> with strategy.scope():
    ...   v = tf.Variable(1.0)
    >>> _ = strategy.extended.update(v, lambda c, x: c.assign_add(x), args=(2.0,))
    >>> v.values[1].numpy().item()
    3.0
    """
    kwargs = {} if kwargs is None else kwargs
    strategy = self._container_strategy()
    fn = _tf_bridge.autograph_convert(fn)
    replica_context = self._own_replica_context()
    if replica_context is not None:
      def merge_fn(merged_strategy, *merged_args, **merged_kwargs):
        return merged_strategy.extended.update(var, fn, merged_args,
                                               merged_kwargs, group)
      return replica_context.merge_call(merge_fn, args=args, kwargs=kwargs)
    with strategy.scope():
      return self._update(var, fn, args, kwargs, group)

  def _update(self, var, fn, args, kwargs, group):
    return self._variables.update(var, fn, args, kwargs, group)

  def update_non_slot(self, colocate_with, fn, args=(), kwargs=None, group=True):
    """Runs `fn(*args, **kwargs)` once per device of `colocate_with`."""
    with self._container_strategy().scope():
      return self._update_non_slot(colocate_with, _tf_bridge.autograph_convert(fn),
                                   args, kwargs or {}, group)

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    return self._variables.update_non_slot(colocate_with, fn, args, kwargs, group)

  @property
  def _input_host(self):
    """The device input pipelines run on."""
    return device_util.canonicalize("/device:CPU:0")

  def _experimental_distribute_dataset(self, dataset, options):
    if input_context_lib.is_per_replica(options):
      raise NotImplementedError(
          "InputReplicationMode.PER_REPLICA is only supported in "
          "`distribute_datasets_from_function`.")
    return input_lib.distribute_dataset(
        dataset, self.worker_devices, self._input_host, options)

  def _distribute_datasets_from_function(self, dataset_fn, options,
                                         partial_steps=None):
    """`partial_steps`: whether a last step on which some replicas' pipelines
    have ended gives them empty batches; by default this strategy's
    `experimental_enable_get_next_as_optional` (see `input_lib`)."""
    return input_lib.distribute_datasets_from_function(
        dataset_fn, self.worker_devices, self._input_host, options,
        partial_steps=self._partial_steps(partial_steps))

  def _partial_steps(self, partial_steps=None):
    if partial_steps is None:
      return getattr(self, "experimental_enable_get_next_as_optional", False)
    return partial_steps

class StrategyExtendedV1(StrategyExtended, stands_for=tf.compat.v1.distribute.StrategyExtended):
  """`StrategyExtended` with its TF 1.x methods
  (`tf.compat.v1.distribute.StrategyExtended`): the base of every
  strategy's `extended`, as in TensorFlow.

  >>> extended = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"]).extended
  >>> isinstance(extended, tf.compat.v1.distribute.StrategyExtended)
  True
  """

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """Takes the cluster `strategy.configure` was given; ignored, as by
    TensorFlow's OneDevice and TPU strategies, by a strategy of one task."""
    del cluster_spec, task_type, task_id

  def _update_config_proto(self, config_proto):
    return copy.deepcopy(config_proto)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    """A dataset of the slices of `numpy_input`, held on the input host.

    >>> import numpy as np
    >>> extended = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"]).extended
    >>> int(extended.experimental_make_numpy_dataset(np.arange(3)).cardinality())
    3
    """
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
    raise RuntimeError(
        "Must not be called inside a `tf.distribute.Strategy` scope.")
  if strategy is not None:
    new_scope = strategy.scope()
    new_scope.__enter__()
    _global_scopes[graph] = new_scope

