"""`CentralStorageStrategy`: replicated compute, variables on one device.

Each step runs once per compute device, as with `MirroredStrategy`, but
every variable exists once, on the parameter device. Updates made inside
`strategy.run` are first aggregated across the replicas (by the variable's
`aggregation`) and then applied once; reductions are computed on the CPU.
"""

import contextlib

import tensorflow as tf

from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import contexts
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.layout import Layout

_LOCAL_CPU = "/device:CPU:0"


class CentralStorageStrategy(strategy_v1.TF1Methods, distribute_lib.Strategy,
                             stands_for=tf.distribute.experimental.CentralStorageStrategy):
  """Synchronous training on one machine with every variable on one device.

  Args:
    compute_devices: the devices to replicate the computation on; by default
      every local GPU, or the CPU if there is none.
    parameter_device: the device variables live on; by default the only
      compute device, or the CPU when there are several.

  `experimental_distribute_dataset` takes `options` here; TensorFlow 2.21
  raises `AttributeError` for any `options` (a misspelt attribute).

  >>> strategy = CentralStorageStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0, aggregation=tf.VariableAggregation.SUM)
  >>> v
  <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>
  >>> _ = strategy.run(lambda: v.assign_add(tf.constant(1.0)))
  >>> v.numpy().item()
  3.0
  """

  def __init__(self, compute_devices=None, parameter_device=None):
    super().__init__(ParameterServerStrategyExtended(self, compute_devices, parameter_device))


class CentralStorageStrategyV1(
    strategy_v1.StrategyV1, stands_for=tf.compat.v1.distribute.experimental.CentralStorageStrategy):
  """`CentralStorageStrategy` with the TF 1.x API
  (`tf.compat.v1.distribute.experimental.CentralStorageStrategy`).

  >>> strategy = CentralStorageStrategyV1(["CPU:0", "CPU:1"])
  >>> strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  """

  def __init__(self, compute_devices=None, parameter_device=None):
    super().__init__(ParameterServerStrategyExtended(self, compute_devices, parameter_device))

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    # TensorFlow 2.21 fails here with an AttributeError.
    del task_type, task_id
    raise ValueError(
        f"`CentralStorageStrategy` runs on one machine and takes no cluster; "
        f"got cluster_spec={cluster_spec.as_dict()}.")


class ParameterServerStrategyExtended(mirrored_strategy.MirroredExtended):
  """`strategy.extended` of `CentralStorageStrategy` (named as in
  TensorFlow): replicas run as in `MirroredStrategy`; variables, updates and
  reductions differ."""

  _between_graph = True
  # Read by tf_keras (docs/client_private_names.md): the cluster task this
  # process is; a strategy on one machine has none.
  _task_type = property(lambda self: self._layout.task_type)
  _task_id = property(lambda self: self._layout.task_id)

  def __init__(self, container_strategy, compute_devices, parameter_device):
    if compute_devices is None:
      compute_devices = device_util.local_devices("GPU") or (_LOCAL_CPU,)
    layout = Layout(mirrored_strategy.resolve_devices(compute_devices))
    on_cpu = cross_device_ops_lib.ReductionToOneDevice(
        reduce_to_device=device_util.canonicalize(_LOCAL_CPU))
    super().__init__(container_strategy, layout,
                     communicator_lib.Communicator(layout, on_cpu, on_cpu))
    self.experimental_enable_get_next_as_optional = False  # as in TensorFlow
    if parameter_device is None:
      parameter_device = self._devices[0] if len(self._devices) == 1 else _LOCAL_CPU
    self._parameter_device = parameter_device
    # Where new variables go: a device, or a device function choosing one.
    self._variable_device = parameter_device

  @property
  def worker_devices(self):
    return list(self._devices)

  @property
  def parameter_devices(self):
    return (self._parameter_device,)

  def non_slot_devices(self, var_list):
    return min(var_list, key=lambda v: v.name)

  def _create_variable(self, next_creator, **kwargs):
    colocate_with = kwargs.pop("colocate_with", None)
    if len(self._devices) == 1:
      with self._placement(colocate_with):
        return next_creator(**kwargs)
    # The variable on the parameter device has no aggregation, as in TF.
    aggregation = distributed_variables.checked_aggregation(
        kwargs.pop("aggregation", None), kwargs.get("name"))
    with self._placement(colocate_with):
      variable = next_creator(**kwargs)
    return AggregatingVariable(self._container_strategy(), [variable], aggregation)

  @contextlib.contextmanager
  def _placement(self, colocate_with):
    """Places a new variable next to `colocate_with`, else on the variable
    device whatever colocation the caller's code asks for, as TensorFlow does."""
    if colocate_with is not None:
      with tf.device(colocate_with.device):
        yield
      return
    with tf.compat.v1.get_default_graph().colocate_with(None, ignore_existing=True), \
        tf.compat.v1.device(self._variable_device):
      yield

  def _update(self, var, fn, args, kwargs, group):
    target = var._primary if isinstance(var, AggregatingVariable) else var  # pylint: disable=protected-access
    if not isinstance(target, tf.Variable):
      raise ValueError(f"You can not update `var` {var!r}. It must be a Variable.")
    with tf.device(target.device), contexts.UpdateContext(0):
      result = fn(target, *values_lib.select_replica(0, args),
                  **values_lib.select_replica(0, kwargs))
    return result if group else tf.nest.map_structure(self._local_results, result)

  def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
    with tf.device(colocate_with.device), contexts.UpdateContext(0):
      result = fn(*args, **kwargs)
    return result if group else tf.nest.map_structure(self._local_results, result)


class AggregatingVariable(distributed_variables.ComponentsVariable):
  """The one variable of `CentralStorageStrategy` with several replicas.

  Every replica reads the same variable. An update inside `strategy.run`
  waits for all replicas, combines their values by the variable's
  `aggregation` and applies the result once; a variable with aggregation
  NONE cannot be updated there. Its repr is that of the variable it wraps.
  As in TensorFlow it is not a `tf.distribute.DistributedValues`: it has no
  `values`, `strategy.reduce` takes it as a value every replica shares
  (MEAN gives it back, SUM raises `ValueError`).

  >>> strategy = CentralStorageStrategy(["CPU:0", "CPU:1"], parameter_device="CPU:1")
  >>> with strategy.scope():
  ...   v = tf.Variable(0.0, aggregation=tf.VariableAggregation.MEAN)
  >>> _ = strategy.run(lambda: v.assign(tf.cast(
  ...     tf_distribute_lite.get_replica_context().replica_id_in_sync_group, tf.float32)))
  >>> v.numpy().item(), v.device[-5:]
  (0.5, 'CPU:1')
  """

  def _get(self):
    return self._primary

  def _get_on_device_or_primary(self):
    return self._primary

  @property
  def device(self):
    return self._primary.device

  def _update_in_replica(self, update_fn, value, method):
    if method.startswith("scatter"):  # as in TensorFlow: applied as it is
      return update_fn(self._primary, value)
    if self._aggregation == tf.VariableAggregation.NONE:
      raise ValueError(
          f"You must specify an aggregation method to update the "
          f"AggregatingVariable '{self.name}' in a replica context, e.g. "
          f"`tf.Variable(..., aggregation=tf.VariableAggregation.SUM)`: each "
          f"replica's update is aggregated before it is applied once. Or "
          f"update it in a cross-replica context (inside `merge_call`).")

    def merge_fn(strategy, value):
      aggregated = distributed_variables.aggregate(strategy, value,
                                                   self._aggregation, self)
      return strategy.extended.update(self, update_fn, args=(aggregated,), group=True)

    return contexts.get_replica_context().merge_call(merge_fn, args=(value,))

  def __repr__(self):
    return repr(self._primary)

  def __str__(self):
    return str(self._primary)
