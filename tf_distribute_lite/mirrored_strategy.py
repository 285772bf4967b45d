"""`MirroredStrategy`: synchronous data parallelism on one machine's devices.

Every variable is mirrored on all devices; each step runs once per device
(replica) on that replica's share of the batch, and the replicas' gradients
are all-reduced so the copies stay equal.
"""

import contextlib
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import contexts
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import replica_context
from tf_distribute_lite import replica_runner
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.layout import Layout


class MirroredStrategy(strategy_v1.TF1Methods, distribute_lib.Strategy,
                       stands_for=tf.distribute.MirroredStrategy):
  """Synchronous training across the devices of one machine.

  Args:
    devices: device names, e.g. `["GPU:0", "GPU:1"]`. None or empty means
      every GPU, or every CPU device if there is no GPU.
    cross_device_ops: a `CrossDeviceOps` for reductions; by default
      collective all-reduce (ring on CPUs, NCCL on GPUs), as TensorFlow.

  >>> strategy = MirroredStrategy(["CPU:0", "CPU:1"])
  >>> strategy.num_replicas_in_sync
  2
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0)
  >>> v
  MirroredVariable:{
    0: <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>,
    1: <tf.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=1.0>
  }
  """

  def __init__(self, devices=None, cross_device_ops=None):
    super().__init__(_extended(self, devices, cross_device_ops))


def _extended(strategy, devices, cross_device_ops):
  layout = Layout(resolve_devices(devices))
  return MirroredExtended(strategy, layout,
                          communicator_lib.Communicator(layout, cross_device_ops))


class MirroredExtended(strategy_v1.StrategyExtendedV1):
  """`strategy.extended` of `MirroredStrategy`, made of where the replicas
  are (`layout.Layout`) and what reduces their values
  (`communicator.Communicator`)."""

  def __init__(self, container_strategy, layout, communicator):
    super().__init__(container_strategy)
    self._layout = layout
    self._communicator = communicator
    self._function_cache = weakref.WeakKeyDictionary()
    # As in TensorFlow: a strategy made in a TF1 graph ends the input at a
    # partial last step of its input functions' pipelines. Users may set it.
    self.experimental_enable_get_next_as_optional = (
        tf.compat.v1.executing_eagerly_outside_functions())

  # --- Devices and the cluster, from the layout.

  _devices = property(lambda self: self._layout.devices)
  _retrace_functions_for_each_device = property(lambda self: len(self._layout.devices) > 1)
  _is_chief = property(lambda self: self._layout.is_chief)

  @property
  def worker_devices(self):
    return self._devices

  parameter_devices = worker_devices

  @property
  def _num_replicas_in_sync(self):
    return self._layout.num_replicas

  @property
  def _num_local_replicas(self):
    return len(self._devices)

  def _get_local_replica_id(self, replica_id_in_sync_group):
    return replica_id_in_sync_group - self._layout.replica_offset

  @property
  def _input_host(self):
    return device_util.canonicalize(self._layout.input_host)

  # --- Variables.

  def _create_variable(self, next_creator, **kwargs):
    colocate_with = kwargs.pop("colocate_with", None)
    devices = self.parameter_devices if colocate_with is None else tuple(
        v.device for v in colocate_with.values)
    kwargs.pop("caching_device", None)
    synchronization = kwargs.get("synchronization") or tf.VariableSynchronization.AUTO
    if synchronization == tf.VariableSynchronization.AUTO:
      synchronization = kwargs["synchronization"] = tf.VariableSynchronization.ON_WRITE
    if synchronization == tf.VariableSynchronization.NONE:
      raise ValueError(
          "`NONE` variable synchronization mode is not supported with "
          f"tf.distribute strategy. Please change the `synchronization` for "
          f"variable: {kwargs.get('name')}")
    # The components are created with the aggregation too, as in TensorFlow.
    aggregation = kwargs["aggregation"] = distributed_variables.checked_aggregation(
        kwargs.get("aggregation"), kwargs.get("name"))
    components = []
    for i, device in enumerate(devices):
      with tf.device(device):
        if i > 0:
          primary = components[0]
          kwargs["name"] = f"{primary.name.split(':')[0]}/replica_{i}/"
          if kwargs.get("initial_value") is not None:
            kwargs["initial_value"] = _copy_of(primary)
        components.append(next_creator(**kwargs))
    if synchronization == tf.VariableSynchronization.ON_READ:
      cls = distributed_variables.SyncOnReadVariable
    else:
      cls = distributed_variables.MirroredVariable
    variable = cls(self._container_strategy(), components, aggregation)
    if not tf.executing_eagerly():
      _collect_instead(components, variable)
    return variable

  # --- Running replicas.

  def _call_for_each_replica(self, fn, args, kwargs):
    if isinstance(fn, _TF_FUNCTION):
      return self._as_one_function(fn)(*args, **kwargs)
    if not tf.executing_eagerly():
      fn = tf.__internal__.autograph.tf_convert(
          fn, tf.__internal__.autograph.control_status_ctx(),
          convert_by_default=False)
    inputs = [(values_lib.select_replica(i, args), values_lib.select_replica(i, kwargs))
              for i in range(len(self._devices))]
    if len(inputs) == 1:  # Nothing to wait for at merge_call: no runner.
      (args, kwargs), = inputs
      with replica_runner.conversion_guard(), \
          self._make_replica_context(0, None), tf.device(self._devices[0]):
        return values_lib.regroup([fn(*args, **kwargs)])
    runner = replica_runner.ReplicaRunner(
        self._container_strategy(), fn, inputs, self._devices,
        self._make_replica_context)
    return values_lib.regroup(runner.run())

  def _as_one_function(self, function):
    """`function` run on every replica inside one traced function."""
    wrapped = self._function_cache.get(function)
    if wrapped is None:
      def run_replicas(*args, **kwargs):
        return self._call_for_each_replica(function.python_function, args, kwargs)
      wrapped = _tf_bridge.clone_function(function, run_replicas)
      self._function_cache[function] = wrapped
    return wrapped

  def _make_replica_context(self, replica_id, runner):
    return _MirroredReplicaContext(self._container_strategy(), replica_id, runner)

  def _distribute_values_from_function(self, value_fn):
    first, count = self._layout.replica_offset, self._layout.num_replicas
    return values_lib.regroup(
        [value_fn(distribute_lib.ValueContext(first + i, count)) for i in range(len(self._devices))],
        always_wrap=True)

  # --- Reductions: all through the communicator.

  def _reduce_to(self, reduce_op, value, destinations, options):
    return self._communicator.reduce_to(reduce_op, value, destinations, options)

  def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    return self._communicator.batch_reduce_to(reduce_op, value_destination_pairs, options)

  def _broadcast_to(self, tensor, destinations):
    return self._communicator.broadcast_to(tensor, destinations)

  def _gather_to(self, value, destinations, axis, options=None):
    return self._communicator.gather_to(value, destinations, axis, options)

  # --- Updates.

  def _update(self, var, fn, args, kwargs, group):
    if not values_lib.is_distributed_variable(var):
      raise ValueError(
          f"strategy.extended.update of {type(self._container_strategy()).__name__} "
          f"needs a variable created in its scope; got {var!r}.")
    components = var.values
    return self._update_each(
        [c.device for c in components], fn,
        [(c,) for c in components], args, kwargs, group)

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    devices = cross_device_ops_lib.devices_of(colocate_with)
    return self._update_each(devices, fn, [()] * len(devices), args, kwargs, group)

  def _update_each(self, devices, fn, leading_args, args, kwargs, group):
    """Each device's update, in TensorFlow's update context of its replica
    and, in a graph, in name scope `update_<i>` as in TensorFlow (helpers
    such as `assign_moving_average` name their ops after the scope)."""
    results = []
    in_graph = not tf.executing_eagerly()
    for i, device in enumerate(devices):
      with tf.device(device), contexts.UpdateContext(i), (
          tf.name_scope(f"update_{i}") if in_graph else contextlib.nullcontext()):
        results.append(fn(*leading_args[i], *values_lib.select_replica(i, args),
                          **values_lib.select_replica(i, kwargs)))
    return _regroup_updates(results, group, self._local_results)

  def non_slot_devices(self, var_list):
    del var_list
    return self._devices

  def _update_config_proto(self, config_proto):
    updated = type(config_proto)()
    updated.CopyFrom(config_proto)
    updated.isolate_session_state = True
    return updated


# The type of `tf.function` objects (named GenericFunction before TF 2.15).
_TF_FUNCTION = getattr(tf.types.experimental, "PolymorphicFunction", None) or (
    tf.types.experimental.GenericFunction)


def _regroup_updates(results, group, local_results):
  """Per-device update results as one value; with `group`, run all updates."""
  grouped = values_lib.regroup(results, values_lib.Mirrored)
  if not group:
    return tf.nest.map_structure(local_results, grouped)

  def join(value):
    if not isinstance(value, values_lib.Mirrored) or len(value.values) == 1:
      return value
    parts = value.values
    done = tf.group(parts)
    if not all(tf.is_tensor(p) or isinstance(p, tf.Variable) for p in parts):
      return done
    joined = []
    for part in parts:
      with tf.device(part.device), tf.control_dependencies([done]):
        joined.append(tf.identity(part))
    return values_lib.Mirrored(joined)
  return tf.nest.map_structure(join, grouped)


def _collect_instead(components, variable):
  """In a TF1 graph, puts `variable` where its components were put in the
  graph's collections (`tf.compat.v1.trainable_variables()` and such)."""
  graph = tf.compat.v1.get_default_graph()
  for key in graph.get_all_collection_keys():
    collection = graph.get_collection_ref(key)
    kept = [v for v in collection if not any(v is c for c in components)]
    if len(kept) < len(collection):
      kept.insert(next(i for i, v in enumerate(collection)
                       if any(v is c for c in components)), variable)
      collection[:] = kept


def _copy_of(primary):
  """The initial value of components i > 0: the primary's value, read once
  for all of them (each variable copies it onto its own device); in a TF1
  graph, the primary's initial value."""
  reads = {}

  def initial_value():
    graph = tf.compat.v1.get_default_graph()
    if graph not in reads:
      reads[graph] = primary.value()
    return reads[graph]

  if not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function:
    # In a TF1 graph the initializers run together, in one `session.run`:
    # the components take the primary's initial value tensor, which that run
    # computes once for all of them.
    return primary.initial_value
  return initial_value


def resolve_devices(devices):
  """Validated, canonical device names; all local devices when none given."""
  if devices is None or (isinstance(devices, (list, tuple)) and not devices):
    devices = device_util.local_devices("GPU") or device_util.local_devices("CPU")
  if isinstance(devices, str):
    raise ValueError(f"`devices` must be a list of device names, not the "
                     f"string {devices!r}; did you mean [{devices!r}]?")
  resolved = tuple(device_util.canonicalize(d) for d in devices)
  seen = {}
  for given, canonical in zip(devices, resolved):
    if canonical in seen:
      raise ValueError(
          f"No duplicates allowed in `devices` argument: {seen[canonical]!r} "
          f"and {given!r} both name {canonical}.")
    seen[canonical] = given
  return resolved


class _MirroredReplicaContext(replica_context.ReplicaContext):
  """The replica context of `MirroredStrategy.run`, named as in TensorFlow."""


class MirroredStrategyV1(strategy_v1.StrategyV1,
                         stands_for=tf.compat.v1.distribute.MirroredStrategy):
  """`MirroredStrategy` with the TF 1.x API (`tf.compat.v1.distribute`).

  >>> strategy = MirroredStrategyV1(["CPU:0", "CPU:1"])
  >>> strategy.reduce("MEAN", strategy.run(lambda: tf.constant(3.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  """

  def __init__(self, devices=None, cross_device_ops=None):
    super().__init__(_extended(self, devices, cross_device_ops))

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    # TensorFlow 2.21 replicates in-graph onto the cluster's tasks, which
    # needs a Session on a remote master (picking its default cross-device
    # ops there raises this error; for one worker, an AssertionError).
    del task_type, task_id
    raise ValueError(
        f"In-graph multi-worker training with `MirroredStrategy` is not "
        f"supported; got cluster_spec={cluster_spec.as_dict()}. Run "
        f"`MultiWorkerMirroredStrategy` on every worker instead.")
