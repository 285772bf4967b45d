"""`MultiWorkerMirroredStrategy`: synchronous training across machines.

Every worker (one process per machine, each with its own `TF_CONFIG`) runs
the same program. A worker's replicas (its GPUs, or one replica on its CPU)
run as in `MirroredStrategy`; reductions add up every replica of every
worker with TensorFlow's collective ops over its gRPC runtime, which
`cluster_runtime` starts.

Collective keys need no messages between workers: each strategy of several
workers takes the next two group keys of a counter that only these
strategies use, and each of its `CollectiveAllReduce`s draws instance keys
at run time from a counter of its own, so workers that run the same
program (creating these strategies and launching collectives in the same
order) derive the same keys, whatever other strategies each worker makes.
Two collective groups serve a strategy: its replicas, and its workers (one
member each, on the worker's CPU) for values that are not per replica,
variable initial values and input synchronisation.

Without a cluster (no `TF_CONFIG`) the strategy runs on this machine alone.
"""

import copy
import functools
import itertools

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import deprecation
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import executors
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import values as values_lib
from tf_distribute_lite import variable_policy
from tf_distribute_lite.cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.reduce_util import ReduceOp

# A collective that waits longer than this for other workers raises
# `tf.errors.DeadlineExceededError`, unless `CommunicationOptions` set a
# timeout of their own (TensorFlow 2.21 waits forever by default).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800.0

# The first group key of these strategies, clear of TensorFlow's keys and of
# those of the other strategies' collectives.
_GROUP_KEY_BASE = 8_000_000
_group_keys = itertools.count(_GROUP_KEY_BASE, 2)  # two groups per strategy

_SUMMABLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


class CollectiveAllReduceStrategy(strategy_v1.TF1Methods, distribute_lib.Strategy,
                                  stands_for=tf.distribute.MultiWorkerMirroredStrategy):
  """Synchronous training on the devices of several machines.

  Args:
    cluster_resolver: a cluster resolver saying which tasks form the cluster
      and which one this process is; by default `TF_CONFIG` is read.
    communication_options: `tf.distribute.experimental.CommunicationOptions`
      for every reduction (per-call options override them). Across workers a
      collective times out after `timeout_seconds`, by default
      `DEFAULT_COLLECTIVE_TIMEOUT_SECONDS`.

  Create it at the start of the program, before any other TensorFlow op:
  it starts this task's gRPC server and waits until every task has joined.
  Each worker has one replica per GPU, or one on its CPU.

  >>> strategy = CollectiveAllReduceStrategy()  # no TF_CONFIG: this machine only
  >>> strategy.num_replicas_in_sync, strategy.extended._in_multi_worker_mode()
  (1, False)
  >>> with strategy.scope():
  ...   v = tf.Variable(2.0)
  >>> strategy.reduce("SUM", strategy.run(lambda: v * 3.0), axis=None)
  <tf.Tensor: shape=(), dtype=float32, numpy=6.0>
  """

  def __init__(self, cluster_resolver=None, communication_options=None):
    super().__init__(CollectiveAllReduceExtended(
        self, cluster_resolver,
        CommunicationOptions() if communication_options is None else communication_options))

  @property
  def cluster_resolver(self):
    """The cluster resolver given, or the `TF_CONFIG` one made by default."""
    return self._extended._cluster_resolver  # pylint: disable=protected-access


class ExperimentalMultiWorkerMirroredStrategy(
    CollectiveAllReduceStrategy, covers_parent=True,
    stands_for=tf.distribute.experimental.MultiWorkerMirroredStrategy):
  """Deprecated: `tf.distribute.experimental.MultiWorkerMirroredStrategy`,
  which takes a `communication` implementation; use
  `MultiWorkerMirroredStrategy`. Every `MultiWorkerMirroredStrategy` is one
  to `isinstance`, as in TensorFlow.

  >>> strategy = ExperimentalMultiWorkerMirroredStrategy("RING")
  >>> strategy.extended._communication_options.implementation
  <CommunicationImplementation.RING: 'RING'>
  >>> isinstance(CollectiveAllReduceStrategy(), ExperimentalMultiWorkerMirroredStrategy)
  True
  """

  def __init__(self, communication=CommunicationImplementation.AUTO,
               cluster_resolver=None):
    deprecation.warn_once(
        "tf.distribute.experimental.MultiWorkerMirroredStrategy",
        "use tf_distribute_lite.MultiWorkerMirroredStrategy instead.")
    super().__init__(cluster_resolver,
                     CommunicationOptions(implementation=communication))


ExperimentalMultiWorkerMirroredStrategy.__name__ = "CollectiveAllReduceStrategy"


class CollectiveAllReduceStrategyV1(
    strategy_v1.StrategyV1, stands_for=tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy):
  """`MultiWorkerMirroredStrategy` with the TF 1.x API
  (`tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy`).

  >>> strategy = CollectiveAllReduceStrategyV1()
  >>> strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  """

  def __init__(self, communication=CommunicationImplementation.AUTO,
               cluster_resolver=None):
    super().__init__(CollectiveAllReduceExtended(
        self, cluster_resolver, CommunicationOptions(implementation=communication)))

  @property
  def cluster_resolver(self):
    """The cluster resolver given, or the `TF_CONFIG` one made by default."""
    return self._extended._cluster_resolver  # pylint: disable=protected-access

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """The strategy joined its cluster when it was made: `configure` may name
    that cluster and task again (as TF 1.x's distribute coordinator does),
    not another one."""
    resolver = self.cluster_resolver
    if (cluster_spec.as_dict() != resolver.cluster_spec().as_dict() or
        (task_type, task_id) != (resolver.task_type, resolver.task_id)):
      raise ValueError(
          f"MultiWorkerMirroredStrategy joins its cluster when it is made: "
          f"make it with cluster_resolver=tf.distribute.cluster_resolver."
          f"SimpleClusterResolver(cluster_spec, task_type=..., task_id=...) "
          f"rather than configuring it later. It was made for "
          f"cluster_spec={resolver.cluster_spec().as_dict()}, "
          f"task_type={resolver.task_type!r}, task_id={resolver.task_id!r}; "
          f"got cluster_spec={cluster_spec.as_dict()}, "
          f"task_type={task_type!r}, task_id={task_id!r}.")


class CollectiveAllReduceExtended(mirrored_strategy.MirroredExtended):
  """`strategy.extended` of `MultiWorkerMirroredStrategy`."""

  _between_graph = True

  def __init__(self, container_strategy, cluster_resolver, communication_options):
    if not isinstance(communication_options, CommunicationOptions):
      raise ValueError(
          f"communication_options must be an instance of "
          f"tf.distribute.experimental.CommunicationOptions; got "
          f"{communication_options!r}.")
    self._cluster_resolver = cluster_resolver or TFConfigClusterResolver()
    cluster_resolver_lib.check_resolver(self._cluster_resolver)
    self._communication_options = communication_options
    cluster_spec = self._cluster_resolver.cluster_spec()
    task_type = self._cluster_resolver.task_type
    task_id = self._cluster_resolver.task_id
    self._task = ""
    self._num_workers, self._id_in_cluster, self._is_chief = 1, 0, True
    # Read by tf_keras (docs/client_private_names.md): this process's index
    # in its job, None without a cluster.
    self._task_id = task_id if cluster_spec.jobs else None
    if cluster_spec.jobs:
      cluster_runtime.validate_task(cluster_spec, task_type, task_id)
      if task_type != "evaluator":  # an evaluator works on its own
        self._id_in_cluster = cluster_runtime.id_in_cluster(cluster_spec, task_type, task_id)
        self._task = cluster_runtime.join(cluster_spec, task_type, task_id,
                                          self._cluster_resolver.rpc_layer)
        # Read by tf_keras's TF 1.x distribute coordinator, which otherwise
        # starts a second server for this task (docs/client_private_names.md).
        self._std_server_started = True
        self._num_workers = cluster_runtime.worker_count(cluster_spec)
        self._is_chief = cluster_runtime.is_chief(cluster_spec, task_type, task_id)
    devices = cluster_runtime.replica_devices(
        self._task, cluster_runtime.gpus_per_task(self._cluster_resolver))
    options = communication_options
    if self._num_workers > 1 and not options.timeout_seconds:
      options = CommunicationOptions(options.bytes_per_pack,
                                     DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
                                     options.implementation)
    group_key = next(_group_keys) if self._num_workers > 1 else None
    super().__init__(container_strategy, devices,
                     cross_device_ops_lib.CollectiveAllReduce(
                         devices, len(devices) * self._num_workers, options, group_key),
                     variable_policy.MirroredPolicy(
                         container_strategy,
                         self._chief_value if self._num_workers > 1 else None))
    self._executor = executors.LocalReplicas(
        container_strategy, self._devices,
        functools.partial(_MirroredReplicaContext, first_replica=self._first_replica),
        self._first_replica, self._num_replicas_in_sync)
    self.experimental_enable_get_next_as_optional = True  # also in TF1 graphs
    self._worker_ops = self._worker_sync = None
    if self._num_workers > 1:
      self._worker_ops = cross_device_ops_lib.CollectiveAllReduce(
          [self._input_host], self._num_workers, options, group_key + 1)
      self._worker_sync = input_lib.WorkerSync(self._any_worker_has)

  # --- The cluster.

  def _in_multi_worker_mode(self):
    return self._num_workers > 1

  @property
  def _num_replicas_in_sync(self):
    return len(self._devices) * self._num_workers

  @property
  def _num_local_replicas(self):
    return len(self._devices)

  @property
  def _first_replica(self):
    """The global id of this worker's first replica."""
    return self._id_in_cluster * len(self._devices)

  def _get_local_replica_id(self, replica_id_in_sync_group):
    return replica_id_in_sync_group - self._first_replica

  def _update_config_proto(self, config_proto):
    updated = copy.deepcopy(config_proto)
    if not self._task:
      cluster_runtime.configure_collectives(updated)
    else:
      task = tf.DeviceSpec.from_string(self._task)
      cluster_runtime.configure_collectives(
          updated, self._cluster_resolver.cluster_spec(), task.job, task.task)
    return updated

  # --- Replicas and input.

  def _input_context(self):
    return input_context_lib.InputContext(
        self._num_workers, self._id_in_cluster, self._num_replicas_in_sync)

  def _experimental_distribute_dataset(self, dataset, options):
    input_context_lib.refuse_per_replica(options)
    return input_lib.distribute_dataset(
        dataset, self._devices, self._input_host, options,
        input_context=self._input_context(), workers=self._worker_sync)

  def _distribute_datasets_from_function(self, dataset_fn, options,
                                         partial_steps=None):
    input_context_lib.refuse_per_replica(options)
    return input_lib.distribute_datasets_from_function(
        dataset_fn, self._devices, self._input_host, options,
        input_context=self._input_context(), workers=self._worker_sync,
        partial_steps=self._partial_steps(partial_steps))

  def _any_worker_has(self, has_value):
    """Whether any worker's input has data, given this worker's answer."""
    with tf.device(self._input_host):
      mine = tf.cast(has_value, tf.int32)
    (total,) = self._sum_over(self._worker_ops, [[mine]], None)[0]
    return total > 0

  # --- Variables: every worker starts from the chief's initial values.

  def _chief_value(self, initial_value, dtype):
    """A callable giving the chief's `initial_value` on every worker."""
    def value():
      given = initial_value() if callable(initial_value) else initial_value
      if isinstance(given, _tf_bridge.CheckpointInitialValue):
        given = given.wrapped_value
      given = tf.convert_to_tensor(given, dtype=dtype)
      if not (given.dtype in _SUMMABLE or given.dtype.is_integer or
              given.dtype.is_bool):
        return given  # strings and such: every worker makes its own
      with tf.device(self._input_host):
        mine = tf.identity(given) if self._is_chief else tf.zeros_like(given)
      (chief,) = self._sum_over(self._worker_ops, [[mine]], None)[0]
      return chief
    return value

  # --- Reductions across workers.

  def _reduce(self, reduce_op, value):
    if self._num_workers == 1:
      return super()._reduce(reduce_op, value)
    destination = device_util.current() or self._input_host
    return self._local_results(self._reduce_to(reduce_op, value, destination, None))[0]

  def _reduce_to(self, reduce_op, value, destinations, options):
    if self._num_workers == 1:
      return super()._reduce_to(reduce_op, value, destinations, options)
    if reduce_op == ReduceOp.MEAN and isinstance(
        value, (values_lib.Mirrored, distributed_variables.MirroredVariable)):
      return value
    return self._batch_reduce_to(reduce_op, [(value, destinations)], options)[0]

  def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    if self._num_workers == 1:
      return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
    by_group = {}
    results = [None] * len(value_destination_pairs)
    for index, (value, destinations) in enumerate(value_destination_pairs):
      ops, components = self._collective_inputs(value)
      if any(isinstance(c, tf.IndexedSlices) for c in components):
        results[index] = self._onto(
            self._reduce_indexed_slices(reduce_op, ops, components, options),
            destinations, value)
      else:
        by_group.setdefault(ops, []).append((index, components))
    for ops, items in by_group.items():
      sums = self._sum_over(ops, [components for _, components in items], options)
      for (index, _), summed in zip(items, sums):
        if reduce_op == ReduceOp.MEAN:
          summed = [_divide(s, self._group_size(ops)) for s in summed]
        value, destinations = value_destination_pairs[index]
        results[index] = self._onto(summed, destinations, value)
    return results

  def _gather_to(self, value, destinations, axis, options=None):
    if self._num_workers == 1:
      return super()._gather_to(value, destinations, axis, options)
    ops, components = self._collective_inputs(value, dense=True)
    gathered = self._all_gather(ops, components, axis, options)
    return self._onto(gathered, destinations, value)

  def _collective_inputs(self, value, dense=False):
    """The group that reduces `value` and its components (tensors, or
    IndexedSlices unless `dense`), one per member in this process, on the
    members' devices: a per-replica value goes to the replicas' group; any
    other value is this worker's, for the workers' group."""
    if (isinstance(value, tf.distribute.DistributedValues) and
        len(value.values) == len(self._devices)):
      return self._cross_device_ops, [
          _on(c, d, dense) for c, d in zip(value.values, self._devices)]
    return self._worker_ops, [_on(value, self._input_host, dense)]

  def _reduce_indexed_slices(self, reduce_op, ops, components, options):
    """IndexedSlices summed over the group of `ops` as TensorFlow sums them:
    every member's indices and values gathered in member order (a dense
    component counts as slices of all its rows); MEAN scales the values."""
    slices = [c if isinstance(c, tf.IndexedSlices) else _as_slices(c)
              for c in components]
    values = self._all_gather(ops, [s.values for s in slices], 0, options)
    indices = self._all_gather(ops, [s.indices for s in slices], 0, options)
    if reduce_op == ReduceOp.MEAN:
      values = [_divide(v, self._group_size(ops)) for v in values]
    return [tf.IndexedSlices(v, i, s.dense_shape)
            for v, i, s in zip(values, indices, slices)]

  def _group_size(self, ops):
    return self._num_replicas_in_sync if ops is self._cross_device_ops else self._num_workers

  def _first_member(self, ops):
    return self._first_replica if ops is self._cross_device_ops else self._id_in_cluster

  def _sum_over(self, ops, values, options):
    """Sums each list of components in `values` over the group of `ops`;
    returns, per value, the sums on this process's members."""
    casts = [[_summable(c) for c in components] for components in values]
    per_replica = [values_lib.PerReplica(components) for components in casts]
    summed = ops.batch_reduce_implementation(
        ReduceOp.SUM, [(v, v) for v in per_replica], options)
    return [[tf.cast(s, c.dtype) if s.dtype != c.dtype else s
             for s, c in zip(values_lib.local_results(total, len(components)), components)]
            for total, components in zip(summed, values)]

  def _all_gather(self, ops, components, axis, options):
    """Every member's component of `ops`' group concatenated along `axis`, in
    member order: each member writes its part into zeros at its offset,
    and a sum puts the parts together."""
    axis = axis % components[0].shape.rank if components[0].shape.rank else axis
    group_size, first = self._group_size(ops), self._first_member(ops)
    sizes = []
    for member, component in enumerate(components):
      with tf.device(component.device):
        sizes.append(tf.one_hot(first + member, group_size, dtype=tf.int64,
                                on_value=tf.shape(component, out_type=tf.int64)[axis]))
    all_sizes = self._sum_over(ops, [sizes], options)[0]
    padded = []
    for member, (component, counts) in enumerate(zip(components, all_sizes)):
      with tf.device(component.device):
        before = tf.reduce_sum(counts[:first + member])
        after = tf.reduce_sum(counts[first + member + 1:])
        paddings = tf.one_hot(axis, tf.rank(component), dtype=tf.int64)[:, None] * (
            tf.stack([before, after])[None, :])
        padded.append(tf.pad(component, paddings))
    return self._sum_over(ops, [padded], options)[0]

  def _onto(self, per_device, destinations, value):
    """Results on this process's members placed on `destinations`: a tensor
    for one device, else a `Mirrored` value."""
    if destinations is value or self._is_per_replica(destinations):
      devices = self._devices
    else:
      devices = cross_device_ops_lib.devices_of(destinations)
    by_device = {device_util.canonicalize(t.device): t for t in per_device if t.device}
    placed = [by_device.get(d) if d in by_device else
              cross_device_ops_lib.copy_to_device(per_device[0], d) for d in devices]
    return placed[0] if len(placed) == 1 else values_lib.Mirrored(placed)


class _MirroredReplicaContext(executors._MirroredReplicaContext):  # pylint: disable=protected-access
  """A replica context whose `replica_id_in_sync_group` counts the replicas
  of the workers before this one (named as in TensorFlow)."""

  def __init__(self, strategy, local_replica_id, runner, first_replica):
    super().__init__(strategy, local_replica_id, runner)
    self._first_replica = first_replica

  @property
  def replica_id_in_sync_group(self):
    """This replica's index in the cluster, a scalar int32 tensor."""
    return tf.constant(self._first_replica + self._replica_id, tf.int32,
                       name="replica_id_in_sync_group")


def _on(value, device, dense=False):
  """`value` on `device`: IndexedSlices as they are unless `dense`,
  anything else as a tensor."""
  if isinstance(value, tf.IndexedSlices) and not dense:
    if value.device and device_util.canonicalize(value.device) == device:
      return value
    return cross_device_ops_lib.copy_to_device(value, device)
  if isinstance(value, tf.Variable):
    value = value.read_value()
  with tf.device(device):
    tensor = tf.convert_to_tensor(value)
    if tensor.device and device_util.canonicalize(tensor.device) == device:
      return tensor
    return tf.identity(tensor)


def _as_slices(tensor):
  """A dense tensor as IndexedSlices of all its rows."""
  with tf.device(tensor.device):
    shape = tf.shape(tensor, out_type=tf.int64)
    return tf.IndexedSlices(tensor, tf.range(shape[0]), shape)


def _summable(tensor):
  """`tensor` in a dtype collective ops add: integers and booleans as int64."""
  if tensor.dtype in _SUMMABLE:
    return tensor
  if tensor.dtype.is_integer or tensor.dtype.is_bool:
    with tf.device(tensor.device):
      return tf.cast(tensor, tf.int64)
  raise TypeError(
      f"Cannot reduce a {tensor.dtype.name} tensor across workers: collective "
      f"ops add {', '.join(d.name for d in _SUMMABLE)} (and other integer or "
      f"boolean tensors, as int64).")


def _divide(tensor, count):
  with tf.device(tensor.device):
    if tensor.dtype.is_floating:
      return tensor / tf.cast(count, tensor.dtype)
    return tensor // count
