"""The TF 1.x contrib "tower" API (`tf.contrib.distribute`): a facade over the
`compat.v1` strategies, towers being replicas."""

import tensorflow as tf

from tf_distribute_lite import contexts
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import default_strategy
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import tpu_system
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp

_FACADE = "_contrib_strategy"


def _extended(name, doc):
  """A property: `name` of the wrapped strategy's `extended`."""
  return property(lambda self: getattr(self._strategy.extended, name), doc=doc)


class DistributionStrategy:
  """The contrib API over a `compat.v1` strategy (`self._strategy`).

  >>> strategy = tf_distribute_lite.contrib.MirroredStrategy(["/cpu:0", "/cpu:1"])
  >>> with strategy.scope():
  ...   doubled = strategy.call_for_each_tower(lambda x: x * 2, tf.constant(3))
  >>> [int(t) for t in strategy.unwrap(doubled)]
  [6, 6]
  """

  def __init__(self, strategy):
    self._strategy = strategy
    setattr(strategy, _FACADE, self)

  between_graph = _extended("experimental_between_graph", "Whether each worker builds its graph.")
  is_single_tower = property(lambda self: self.num_towers == 1, doc="Whether there is one tower.")
  num_towers = property(lambda self: self._strategy.num_replicas_in_sync, doc="Towers per step.")
  num_hosts = property(lambda self: getattr(self._strategy.extended, "num_hosts", 1),
                       doc="Hosts the towers run on.")
  num_towers_per_host = property(lambda self: self.num_towers // self.num_hosts, doc="Per host.")
  parameter_devices = _extended("parameter_devices", "The devices variables are placed on.")
  worker_devices = _extended("worker_devices", "The devices towers run on.")

  @property
  def worker_device_index(self):
    """Per tower, its index in `worker_devices` (0 with a single tower)."""
    if self.is_single_tower:
      return 0
    return self._strategy.extended._distribute_values_from_function(  # pylint: disable=protected-access
        lambda ctx: ctx.replica_id_in_sync_group)

  should_checkpoint = _extended("should_checkpoint", "Whether checkpoints are written here.")
  should_init = _extended("experimental_should_init", "Whether initialization runs here.")
  should_save_summary = _extended("should_save_summary", "Whether summaries are saved here.")

  def scope(self):
    """The core strategy's scope: variables are mirrored, cross-tower context."""
    return self._strategy.scope()

  def call_for_each_tower(self, fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` once per tower (`run_concurrently` ignored)."""
    kwargs.pop("run_concurrently", None)
    return self._strategy.extended.call_for_each_replica(fn, args, kwargs)

  def reduce(self, aggregation, value, destinations=None):
    """Combines the towers' `value` by `aggregation` onto `destinations`."""
    return self.batch_reduce(aggregation, [(value, destinations)])[0]

  def batch_reduce(self, aggregation, value_destination_pairs):
    """`reduce` for several `(value, destinations)` pairs at once."""
    if getattr(aggregation, "value", None) not in _TOWER_AGGREGATIONS:
      raise ValueError(
          f"`aggregation` must be tf.VariableAggregation.SUM, MEAN or "
          f"ONLY_FIRST_REPLICA (ONLY_FIRST_TOWER); got {aggregation!r}.")
    extended = self._strategy.extended
    pairs = [(v, self.worker_devices if d is None else d) for v, d in value_destination_pairs]
    if aggregation.value == tf.VariableAggregation.ONLY_FIRST_REPLICA.value:
      return [extended.broadcast_to(self._strategy.experimental_local_results(v)[0], d)
              for v, d in pairs]
    return extended.batch_reduce_to(ReduceOp.from_variable_aggregation(
        tf.VariableAggregation(aggregation.value)), pairs)

  def broadcast(self, tensor, destinations=None):
    """`tensor` mirrored onto `destinations` (by default every tower)."""
    if destinations is None and self._strategy is not default_strategy.default_strategy():
      destinations = self.worker_devices
    return self._strategy.extended.broadcast_to(tensor, destinations)

  def colocate_vars_with(self, colocate_with_variable):
    """A scope placing new variables like `colocate_with_variable`."""
    return self._strategy.extended.colocate_vars_with(colocate_with_variable)

  def configure(self, session_config=None, cluster_spec=None, task_type=None, task_id=None):
    """Adjusts `session_config` for this strategy."""
    self._strategy.configure(session_config, cluster_spec, task_type, task_id)

  def distribute_dataset(self, dataset_fn):
    """`dataset_fn()`'s dataset, tower `i` taking element `i` of each group."""
    return PerDeviceDataset(self._strategy.extended._distribute_datasets_from_function(  # pylint: disable=protected-access
        lambda input_context: dataset_fn(), None, partial_steps=False))

  def initialize(self):
    """Nothing to initialize (or finalize): None eagerly, no ops in a graph."""
    return None if tf.executing_eagerly() else []

  finalize = initialize

  def get_host_cpu_device(self, host_id):
    """The CPU of host `host_id`."""
    del host_id
    return self._strategy.extended._input_host  # pylint: disable=protected-access

  def group(self, value, name=None):
    """`tf.group` of the towers' components of `value`."""
    return self._strategy.group(value, name)

  def map(self, map_over, fn, *args, **kwargs):
    """Per tower, `fn(element, *args, **kwargs)` of its elements of `map_over`."""
    results = [[] for _ in self.worker_devices]
    for i, element in enumerate(map_over):
      tower = i % len(results)
      with tf.device(self.worker_devices[tower]):
        results[tower].append(fn(element, *args, **kwargs))
    return results[0] if len(results) == 1 else values_lib.PerReplica(tuple(results))

  def non_slot_devices(self, var_list):
    """Devices for variables that are not slots."""
    return self._strategy.extended.non_slot_devices(var_list)

  def read_var(self, tower_local_var):
    """The aggregated value of a tower-local variable."""
    return self._strategy.extended.read_var(tower_local_var)

  def run_steps_on_dataset(self, fn, iterator, iterations=1, initial_loop_values=None):
    """Runs `fn(context, *inputs)` `iterations` times; the `MultiStepContext`."""
    def step(context, inputs):
      return fn(context, *inputs) if isinstance(inputs, tuple) else fn(context, inputs)
    return self._strategy.extended.experimental_run_steps_on_iterator(
        step, iterator, iterations, initial_loop_values)

  def unwrap(self, value):
    """The towers' components of `value`, as a list."""
    return list(self._strategy.experimental_local_results(value))

  def update(self, var, fn, *args, **kwargs):
    """`fn(component, *args, **kwargs)` on every component of `var`."""
    return self._strategy.extended.update(var, fn, args, kwargs)

  def update_non_slot(self, colocate_with, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on the devices of `colocate_with`."""
    return self._strategy.extended.update_non_slot(colocate_with, fn, args, kwargs)

  def value_container(self, value):
    """The distributed variable `value` is a component of, else `value`."""
    return self._strategy.extended.value_container(value)


class MirroredStrategy(DistributionStrategy):
  """Towers on several devices of one machine (TF 1.x contrib).

  >>> strategy = tf_distribute_lite.contrib.MirroredStrategy(num_gpus=0)
  >>> strategy.num_towers >= 1
  True
  """

  def __init__(self, devices=None, num_gpus=None, num_gpus_per_worker=None,
               cross_tower_ops=None, prefetch_on_device=None,
               auto_shard_dataset=False):
    del prefetch_on_device, auto_shard_dataset
    if num_gpus is not None and num_gpus_per_worker is not None:
      raise ValueError(f"Pass `num_gpus` or `num_gpus_per_worker`, not both; got "
                       f"num_gpus={num_gpus!r}, num_gpus_per_worker={num_gpus_per_worker!r}.")
    gpus, argument = ((num_gpus, "num_gpus") if num_gpus is not None
                      else (num_gpus_per_worker, "num_gpus_per_worker"))
    if gpus is not None:
      distribute_lib.check_count(gpus, argument, 0)
      if devices is not None:
        raise ValueError(f"Pass `devices` or `{argument}`, not both; got "
                         f"devices={devices!r}, {argument}={gpus!r}.")
      if gpus:
        devices = [f"/device:GPU:{i}" for i in range(gpus)]
    cross_device_ops_lib.check_cross_device_ops(cross_tower_ops, "cross_tower_ops")
    super().__init__(strategy_v1.MirroredStrategyV1(devices, cross_tower_ops))


class OneDeviceStrategy(DistributionStrategy):
  """One tower, on `device` (TF 1.x contrib).

  >>> strategy = tf_distribute_lite.contrib.OneDeviceStrategy("/cpu:0")
  >>> strategy.is_single_tower, strategy.worker_device_index
  (True, 0)
  """

  def __init__(self, device, prefetch_on_device=None):
    del prefetch_on_device
    super().__init__(strategy_v1.OneDeviceStrategyV1(device))


class TPUStrategy(OneDeviceStrategy):  # pylint: disable=super-init-not-called
  """Towers on the cores of a TPU or an emulated slice (TF 1.x contrib).

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> strategy = tf_distribute_lite.contrib.TPUStrategy(resolver, steps_per_run=5)
  >>> strategy.num_towers, strategy.steps_per_run
  (4, 5)
  """

  def __init__(self, tpu_cluster_resolver, steps_per_run, num_cores=None):
    device_assignment = None
    if num_cores is not None:
      distribute_lib.check_count(num_cores, "num_cores", 1)
      topology = (tpu_system.initialized_topology(tpu_cluster_resolver) or
                  tpu_system.initialize(tpu_cluster_resolver))
      device_assignment = tf.tpu.experimental.DeviceAssignment.build(
          topology, num_replicas=num_cores)
    DistributionStrategy.__init__(self, strategy_v1.TPUStrategyV1(
        tpu_cluster_resolver, steps_per_run, device_assignment))

  steps_per_run = property(lambda self: self._strategy.steps_per_run, doc="Steps per loop.")

  def run_steps_on_dataset(self, fn, iterator, iterations=None, initial_loop_values=None):
    """As `DistributionStrategy`'s, `steps_per_run` steps by default."""
    return super().run_steps_on_dataset(
        fn, iterator, self.steps_per_run if iterations is None else iterations,
        initial_loop_values)


class PerDeviceDataset:
  """What `distribute_dataset` returns: iterators over the towers' elements."""

  def __init__(self, distributed_dataset):
    self._distributed = distributed_dataset

  def make_one_shot_iterator(self):
    """An iterator that needs no initialization."""
    eager = tf.executing_eagerly()
    return iter(self._distributed) if eager else self._distributed.make_one_shot_iterator()

  def make_initializable_iterator(self):
    """An iterator whose `initializer` (re)starts it (a TF1 graph)."""
    return input_lib.initializable_iterator(self._distributed)


class TowerContext:
  """What `get_tower_context()` gives inside `call_for_each_tower`.

  >>> strategy = tf_distribute_lite.contrib.MirroredStrategy(["/cpu:0", "/cpu:1"])
  >>> with strategy.scope():
  ...   towers = strategy.call_for_each_tower(
  ...       lambda: (get_tower_context().tower_id, get_tower_context().device[-5:]))
  >>> strategy.unwrap(towers[0]), strategy.unwrap(towers[1])
  ([0, 1], ['CPU:0', 'CPU:1'])
  """

  def __init__(self, replica_context, tower_id):
    self._replica_context = replica_context
    self.tower_id = tower_id

  def merge_call(self, merge_fn, *args, **kwargs):
    """Runs `merge_fn(distribution, *args, **kwargs)` once for all towers."""
    def core_merge_fn(strategy, *merged_args, **merged_kwargs):
      return merge_fn(_facade(strategy), *merged_args, **merged_kwargs)
    return self._replica_context.merge_call(core_merge_fn, args=args, kwargs=kwargs)

  distribution_strategy = property(lambda self: _facade(self._replica_context.strategy),
                                   doc="The contrib strategy the tower belongs to.")
  num_towers = property(lambda self: self._replica_context.num_replicas_in_sync, doc="Towers.")
  is_single_tower = property(lambda self: self.num_towers == 1, doc="Whether it is the only one.")

  device = property(lambda self: tf.nest.flatten(self._replica_context.devices)[0],
                    doc="The device this tower runs on, as a string.")


def get_tower_context():
  """The current tower's context, or None in a cross-tower context.

  >>> get_tower_context().tower_id
  0
  """
  replica_context = default_strategy.get_replica_context()
  if replica_context is None:
    return None
  return TowerContext(replica_context, getattr(replica_context, "_replica_id", 0))


def get_cross_tower_context():
  """The current contrib strategy in a cross-tower context, else None.

  >>> get_cross_tower_context() is None
  True
  """
  return get_distribution_strategy() if contexts.in_cross_replica_context() else None


def get_distribution_strategy():
  """The current contrib strategy (the default one outside any scope).

  >>> get_distribution_strategy().num_towers
  1
  """
  return _facade(default_strategy.get_strategy())


def has_distribution_strategy():
  """Whether a contrib strategy other than the default is current.

  >>> has_distribution_strategy()
  False
  """
  return contexts.has_strategy()


def _facade(strategy):
  """The contrib strategy over core `strategy` (made for the default)."""
  facade = getattr(strategy, _FACADE, None)
  return facade if facade is not None else DistributionStrategy(strategy)


_TOWER_AGGREGATIONS = frozenset(a.value for a in (
    tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN,
    tf.VariableAggregation.ONLY_FIRST_REPLICA))
