"""Variable policies: how a strategy makes, places and updates variables."""

import contextlib
import weakref

import tensorflow as tf

from tf_distribute_lite import contexts
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import sharded_variable
from tf_distribute_lite import values as values_lib


class VariablePolicy:
  """Plain variables on `device` (`OneDeviceStrategy`), or where the caller
  puts them (the default strategy); updates run once."""

  def __init__(self, strategy, device=None):
    self._strategy = weakref.ref(strategy)
    self._device = device

  @property
  def parameter_devices(self):
    if self._device is None:
      raise RuntimeError(
          "parameter_devices() method unsupported by default tf.distribute.Strategy.")
    return (self._device,)

  def non_slot_devices(self, var_list):
    del var_list
    return self.parameter_devices

  def create(self, next_creator, **kwargs):
    colocate_with = kwargs.pop("colocate_with", None)
    with _on(self._device if colocate_with is None else colocate_with.device):
      return next_creator(**kwargs)

  def update(self, var, fn, args, kwargs, group):
    return self.update_non_slot(var, fn, (var, *args), kwargs, group)

  def update_non_slot(self, colocate_with, fn, args, kwargs, group):
    """`fn` once, in TensorFlow's update context (ungrouped: in tuples)."""
    with _on(self._update_device(colocate_with)), contexts.UpdateContext(0):
      result = fn(*args, **kwargs)
    return result if group else _ungrouped(result)

  def _update_device(self, colocate_with):
    del colocate_with
    return self._device

  def replica_local_variable(self, variable):
    del variable
    return None


def _on(device):
  return contextlib.nullcontext() if device is None else tf.device(device)


def _ungrouped(result):
  return tf.nest.map_structure(lambda value: values_lib.local_results(value, 1), result)


class MirroredPolicy(VariablePolicy):
  """A component per replica device, in a `MirroredVariable` or (ON_READ)
  `SyncOnReadVariable`; `initial_value(value, dtype)` may give the chief's."""

  def __init__(self, strategy, initial_value=None):
    super().__init__(strategy)
    self._initial_value = initial_value

  parameter_devices = property(lambda self: self._strategy().extended.worker_devices)

  def create(self, next_creator, **kwargs):
    if self._initial_value is not None and kwargs.get("initial_value") is not None:
      kwargs["initial_value"] = self._initial_value(kwargs["initial_value"], kwargs.get("dtype"))
    colocate_with = kwargs.pop("colocate_with", None)
    devices = self.parameter_devices if colocate_with is None else tuple(
        v.device for v in colocate_with.values)
    kwargs.pop("caching_device", None)
    synchronization = kwargs.get("synchronization") or tf.VariableSynchronization.AUTO
    if synchronization == tf.VariableSynchronization.NONE:
      raise ValueError(
          "`NONE` variable synchronization mode is not supported with "
          f"tf.distribute strategy. Please change the `synchronization` for "
          f"variable: {kwargs.get('name')}")
    if synchronization == tf.VariableSynchronization.AUTO:
      kwargs["synchronization"] = synchronization = tf.VariableSynchronization.ON_WRITE
    # The components are created with the aggregation too, as in TensorFlow.
    aggregation = kwargs["aggregation"] = distributed_variables.checked_aggregation(
        kwargs.get("aggregation"), kwargs.get("name"))
    components = []
    for i, device in enumerate(devices):
      with tf.device(device):
        if i > 0:
          kwargs["name"] = f"{components[0].name.split(':')[0]}/replica_{i}/"
          if kwargs.get("initial_value") is not None:
            kwargs["initial_value"] = _copy_of(components[0])
        components.append(next_creator(**kwargs))
    cls = (distributed_variables.SyncOnReadVariable
           if synchronization == tf.VariableSynchronization.ON_READ
           else distributed_variables.MirroredVariable)
    variable = cls(self._strategy(), components, aggregation)
    if not tf.executing_eagerly():
      _collect_instead(components, variable)
    return variable

  def update(self, var, fn, args, kwargs, group):
    if not values_lib.is_distributed_variable(var):
      raise ValueError(
          f"strategy.extended.update of {type(self._strategy()).__name__} "
          f"needs a variable created in its scope; got {var!r}.")
    components = var.values
    return _update_each([c.device for c in components], fn,
                        [(c,) for c in components], args, kwargs, group)

  def update_non_slot(self, colocate_with, fn, args, kwargs, group):
    devices = cross_device_ops_lib.devices_of(colocate_with)
    return _update_each(devices, fn, [()] * len(devices), args, kwargs, group)


def _update_each(devices, fn, leading_args, args, kwargs, group):
  """Each device's update in its replica's update context (and in a graph,
  name scope `update_<i>`, as TensorFlow's); `group`ed into one value."""
  results = []
  in_graph = not tf.executing_eagerly()
  for i, device in enumerate(devices):
    with tf.device(device), contexts.UpdateContext(i), (
        tf.name_scope(f"update_{i}") if in_graph else contextlib.nullcontext()):
      results.append(fn(*leading_args[i], *values_lib.select_replica(i, args),
                        **values_lib.select_replica(i, kwargs)))
  grouped = values_lib.regroup(results, values_lib.Mirrored)
  if not group:
    return _ungrouped(grouped)

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
  """Puts `variable` in place of its components in the graph's collections."""
  graph = tf.compat.v1.get_default_graph()
  for key in graph.get_all_collection_keys():
    collection = graph.get_collection_ref(key)
    kept = [v for v in collection if not any(v is c for c in components)]
    if len(kept) < len(collection):
      kept.insert(next(i for i, v in enumerate(collection)
                       if any(v is c for c in components)), variable)
      collection[:] = kept


def _copy_of(primary):
  """The other components' initial value: the primary's, read once per graph."""
  if not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function:
    return primary.initial_value
  reads = {}

  def initial_value():
    graph = tf.compat.v1.get_default_graph()
    if graph not in reads:
      reads[graph] = primary.value()
    return reads[graph]
  return initial_value


class TPUPolicy(MirroredPolicy):
  """Mirrored; inside a TPU computation (`step()`, else None) a replica
  uses the variable its replica context gives."""

  def __init__(self, strategy, step):
    super().__init__(strategy)
    self._step = step

  def replica_local_variable(self, variable):
    step = self._step()
    return None if step is None else step.local_variable(variable)

  def update(self, var, fn, args, kwargs, group):
    step = self._step()
    if step is None:
      return super().update(var, fn, args, kwargs, group)
    result = fn(step.local_variable(var), *args, **kwargs)
    return result if group else (result,)  # as TensorFlow (Keras extends a list with it)


class CentralStoragePolicy(VariablePolicy):
  """Each variable once, on `device` (or a device function; by default the
  only replica device, else the CPU), for several replicas aggregating."""

  def __init__(self, strategy, device=None, parameter_devices=None):
    super().__init__(strategy)
    self._where = device
    self._parameter_devices = parameter_devices

  parameter_devices = property(lambda self: self._parameter_devices or (self._variable_device(),))

  def _variable_device(self):
    if self._where is not None:
      return self._where
    devices = self._strategy().extended.worker_devices
    return devices[0] if len(devices) == 1 else "/device:CPU:0"

  def non_slot_devices(self, var_list):
    return min(var_list, key=lambda v: v.name)

  def create(self, next_creator, **kwargs):
    colocate_with = kwargs.pop("colocate_with", None)
    aggregating = len(self._strategy().extended.worker_devices) > 1
    if aggregating:  # the variable itself has no aggregation, as in TensorFlow
      aggregation = distributed_variables.checked_aggregation(
          kwargs.pop("aggregation", None), kwargs.get("name"))
    with self._placement(colocate_with):
      variable = next_creator(**kwargs)
    if aggregating:
      return distributed_variables.AggregatingVariable(self._strategy(), [variable], aggregation)
    return variable

  @contextlib.contextmanager
  def _placement(self, colocate_with):
    """Next to `colocate_with`, else on the variable device (ignoring the
    caller's colocation, as TensorFlow does)."""
    if colocate_with is not None:
      with tf.device(colocate_with.device):
        yield
    else:
      with tf.compat.v1.get_default_graph().colocate_with(None, ignore_existing=True), \
          tf.compat.v1.device(self._variable_device()):
        yield

  def update(self, var, fn, args, kwargs, group):
    target = var._primary if isinstance(var, distributed_variables.AggregatingVariable) else var  # pylint: disable=protected-access
    if not isinstance(target, tf.Variable):
      raise ValueError(f"You can not update `var` {var!r}. It must be a Variable.")
    return self.update_non_slot(target, fn, (target, *values_lib.select_replica(0, args)),
                                values_lib.select_replica(0, kwargs), group)

  def _update_device(self, colocate_with):
    return colocate_with.device


class ParameterServerPolicy(VariablePolicy):
  """Variables (or a `ShardedVariable`'s shards) on the ps tasks in turn; a
  slot with its variable (a sharded one's on `coordinator_device`)."""

  def __init__(self, strategy, num_ps, partitioner, coordinator_device):
    super().__init__(strategy)
    self._ps_devices = tuple(f"/job:ps/task:{i}/device:CPU:0" for i in range(num_ps))
    self._partitioner = partitioner
    self._coordinator_device = coordinator_device
    self._count = 0  # variables made, for the round-robin

  # The ps tasks' CPUs, where TensorFlow 2.21 answers the coordinator's CPU.
  parameter_devices = property(lambda self: self._ps_devices)

  def non_slot_devices(self, var_list):
    return min(var_list, key=lambda v: v.name)

  def create(self, next_creator, **kwargs):
    colocate_with = kwargs.pop("colocate_with", None)
    if colocate_with is not None:  # an optimizer's slot: never split
      with tf.device(self._coordinator_device if isinstance(
          colocate_with, sharded_variable.ShardedVariable) else colocate_with.device):
        return next_creator(**kwargs)
    shards = sharded_variable.shard_arguments(kwargs, self._partitioner)
    if shards is None:
      return self._on_next_ps(next_creator, kwargs)
    return sharded_variable.ShardedVariable(
        [self._on_next_ps(next_creator, shard) for shard in shards])

  def _on_next_ps(self, next_creator, kwargs):
    with tf.device(self._ps_devices[self._count % len(self._ps_devices)]):
      variable = next_creator(**kwargs)
    self._count += 1
    return variable
