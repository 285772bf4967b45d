"""Distributed variables: real `tf.Variable`s standing for their components,
saved as the one variable they stand for."""

import contextlib
import copy

import numpy as np
import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp

VARIABLE_VALUE = "VARIABLE_VALUE"  # the checkpoint key plain variables use
_OWN_ATTRIBUTES = frozenset(
    ["_values", "_distribute_strategy", "_aggregation", "_common_name",
     # Not a component's: Keras looks for `_distributed_container` on its handle.
     "_distributed_container", "_use_resource_variables", "_attribute_sentinel"])


class SavedAsOneVariable:
  """A variable kept in parts, checkpointed as one plain variable
  (`_saved_value`, `_assign_restored`); `scatter_*` go through `_update`."""

  def _serialize_to_tensors(self):
    return {VARIABLE_VALUE: self._saved_value()}

  def _restore_from_tensors(self, restored_tensors):
    restored = restored_tensors[VARIABLE_VALUE]
    if not restored.shape.is_compatible_with(self.shape):
      raise ValueError(
          f"Received incompatible tensor with shape {restored.shape} when "
          f"attempting to restore variable with shape {self.shape} and name "
          f"{self.name}.")
    return self._assign_restored(restored)


def _scatter_method(method):
  def scatter(self, sparse_delta, use_locking=False, name=None):
    return self._update(method, sparse_delta, use_locking=use_locking, name=name)  # pylint: disable=protected-access
  scatter.__name__ = method
  scatter.__doc__ = f"`tf.Variable.{method}` on every part, as for `assign`."
  return scatter


for _method in ("scatter_sub", "scatter_add", "scatter_mul", "scatter_div",
                "scatter_min", "scatter_max", "scatter_update",
                "batch_scatter_update"):
  setattr(SavedAsOneVariable, _method, _scatter_method(_method))


class ComponentsVariable(SavedAsOneVariable, tf.Variable, _tf_bridge.TensorBase):
  """A `tf.Variable` standing for its components (`_values`); subclasses
  say which component a read uses and how a replica's update applies."""

  def __init__(self, strategy, components, aggregation):
    if (aggregation == tf.VariableAggregation.MEAN and not components[0].dtype.is_floating):
      raise ValueError(
          "creating distributed tf.Variable with aggregation=MEAN and a "
          "non-floating dtype is not supported, please use a different "
          "aggregation or dtype")
    self._values = tuple(components)
    self._distribute_strategy = strategy
    self._aggregation = aggregation
    self._common_name = self._primary.name.split(":")[0]
    for component in components:
      # Keras and `regroup` find the container of a component through this.
      _tf_bridge.set_distributed_container(component, self)

  def __getattr__(self, name):
    # The rest comes from the component a read would use, as in TensorFlow.
    if name.startswith(("__", "_self_")) or name in _OWN_ATTRIBUTES:
      raise AttributeError(name)
    return getattr(self._component_for_attributes(), name)

  def __deepcopy__(self, memo):
    components = []
    for component in self._values:
      with tf.device(component.device):
        components.append(copy.deepcopy(component, memo))
    copied = type(self)(self._distribute_strategy, components, self._aggregation)
    memo[id(self)] = copied
    return copied

  # --- Properties of the variable it stands for.

  is_distributed_variable = True
  _splits_per_replica = False  # Each replica picks its component when used.

  _primary = property(lambda self: self._values[0])

  distribute_strategy = property(lambda self: self._distribute_strategy)
  aggregation = property(lambda self: self._aggregation)
  synchronization = property(lambda self: self._primary.synchronization)
  name = property(lambda self: self._primary.name)
  dtype = property(lambda self: self._primary.dtype)
  shape = property(lambda self: self._primary.shape)

  @property
  def device(self):
    """The current replica's component's device (else the one on the
    current device), as in TensorFlow."""
    replica_id = contexts.current_replica_id()
    if replica_id is None or replica_id >= len(self._values):
      return self._on_current_device().device
    return self._values[replica_id].device

  trainable = property(lambda self: self._primary.trainable)
  constraint = property(lambda self: self._primary.constraint)
  graph = property(lambda self: self._primary.graph)
  initial_value = property(lambda self: self._primary.initial_value)
  _shared_name = property(lambda self: _tf_bridge.variable_key(self._primary, "_shared_name"))
  _unique_id = property(lambda self: _tf_bridge.variable_key(self._primary, "_unique_id"))
  _graph_key = property(lambda self: _tf_bridge.variable_key(self._primary, "_graph_key"))

  # Set by TensorFlow's TF1 SavedModel loader (docs/client_private_names.md).
  _initializer_op = None

  @property
  def initializer(self):
    if _tf_bridge.saving_without_distribution():
      return self._primary.initializer
    if self._initializer_op is not None:
      return self._initializer_op
    return tf.group([v.initializer for v in self._values])

  @property
  def op(self):
    """The current replica's component's op; across replicas the first's,
    as in TensorFlow."""
    if contexts.in_cross_replica_context():
      return self._primary.op
    return self._get_on_device_or_primary().op

  @property
  def handle(self):
    """The resource handle of the current replica's component."""
    if _tf_bridge.saving_without_distribution():
      return self._primary.handle
    local = self._distribute_strategy.extended._replica_local_variable(self)  # pylint: disable=protected-access
    return (self._component_for_attributes() if local is None else local).handle

  def is_initialized(self, name=None):
    """Whether every component is initialized, a boolean tensor."""
    return tf.reduce_all([v.is_initialized() for v in self._values], name=name)

  def _should_act_as_resource_variable(self):
    """Makes `resource_variable_ops.is_resource_variable` accept this."""

  # --- Reading.

  def _current_replica_id(self):
    """The replica whose component is meant here, or None; in another
    strategy's replica, `ValueError` (TensorFlow 2.21 reads one)."""
    entry = contexts.top()
    if entry is None:
      return None  # no strategy in effect: the variable reads as one value
    if entry.replica_context is None:
      return contexts.update_replica_id()
    if entry.strategy is self._distribute_strategy:
      return entry.replica_context._replica_id  # pylint: disable=protected-access
    if self._in_foreign_replica():
      raise ValueError(
          f"{type(self).__name__} {self._common_name!r} was created in the "
          f"scope of {self._distribute_strategy} and is used in a replica of "
          f"another strategy, {entry.strategy}. A variable belongs to the "
          f"strategy whose scope created it: create the model, its variables "
          f"and its optimizer in the scope of the strategy that runs them.")
    return None  # a default strategy's replica

  def _in_foreign_replica(self):
    if not contexts.has_strategy():
      return False
    entry = contexts.top()
    return entry.replica_context is not None and entry.strategy is not self._distribute_strategy

  def _component_for_attributes(self):
    """The component whose attributes and handle this shows (in another
    strategy's replica one of them, as in TensorFlow)."""
    if self._in_foreign_replica():
      return self._on_current_device()
    return self._get_on_device_or_primary()

  def _get(self):
    if _tf_bridge.saving_without_distribution():
      return self._primary
    local = self._distribute_strategy.extended._replica_local_variable(self)  # pylint: disable=protected-access
    return super()._get() if local is None else local

  def value(self):
    value = self._get()
    return value.value() if isinstance(value, tf.Variable) else value

  def read_value(self):
    return tf.identity(self.value())

  def eval(self, session=None):
    """The value, in `session`, of the component on this device (never
    aggregated, as in TensorFlow)."""
    return self._get_on_device_or_primary().eval(session)

  def numpy(self):
    if not tf.executing_eagerly():
      raise NotImplementedError(
          "DistributedVariable.numpy() is only available when eager "
          "execution is enabled.")
    return self.read_value().numpy()

  def __tf_tensor__(self, dtype=None, name=None):
    return values_lib.as_tensor(self.value(), dtype, name)

  def __array__(self, dtype=None, copy=None):
    """The value as a (fresh) numpy array; TensorFlow 2.21 fails on an
    on-read scalar."""
    del copy
    return np.asarray(self.numpy(), dtype=dtype)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    del as_ref
    return self.__tf_tensor__(dtype, name)

  def _as_graph_element(self):
    return _tf_bridge.graph_element(self._get_on_device_or_primary())

  def sparse_read(self, indices, name=None):
    return tf.gather(self.value(), indices, name=name)

  def gather_nd(self, indices, name=None):
    return tf.gather_nd(self.value(), indices, name=name)

  # --- Writing. Every update method funnels into `_update`.

  def assign(self, value, use_locking=False, name=None, read_value=True):
    return self._update("assign", value, use_locking=use_locking, name=name, read_value=read_value)

  def assign_add(self, delta, use_locking=False, name=None, read_value=True):
    return self._update("assign_add", delta, use_locking=use_locking,
                        name=name, read_value=read_value)

  def assign_sub(self, delta, use_locking=False, name=None, read_value=True):
    return self._update("assign_sub", delta, use_locking=use_locking,
                        name=name, read_value=read_value)

  def _update(self, method, value, **kwargs):
    """Applies `component.<method>(value, **kwargs)` as the context asks."""
    def update_fn(component, value):
      return getattr(component, method)(value, **kwargs)

    if _tf_bridge.saving_without_distribution():
      return update_fn(self._primary, value)
    if method.startswith("assign"):
      self._check_assignable(value)
    if contexts.in_cross_replica_context() and contexts.update_replica_id() is not None:
      return update_fn(self._values[contexts.update_replica_id()], value)
    if self._current_replica_id() is not None:
      return self._update_in_replica(update_fn, value, method)
    with self._strategy_scope():
      return self._update_cross_replica(update_fn, value, method)

  def _update_cross_replica(self, update_fn, value, method):
    return self._distribute_strategy.extended.update(self, update_fn, args=(value,), group=True)

  def _update_aggregated(self, update_fn, value):
    """Applies the replicas' `value`s aggregated, through `merge_call`."""
    def merge_fn(strategy, value):
      aggregated = aggregate(strategy, value, self._aggregation, self)
      return strategy.extended.update(self, update_fn, args=(aggregated,), group=True)

    return contexts.top().replica_context.merge_call(merge_fn, args=(value,))

  def _strategy_scope(self):
    if contexts.has_strategy():
      return contextlib.nullcontext()
    return self._distribute_strategy.scope()

  def _check_assignable(self, value):
    """Raises what a plain variable raises for a wrong dtype or shape."""
    for component in values_lib.local_results(value, 1):
      if isinstance(component, (tf.IndexedSlices, tf.Operation)):
        continue
      try:
        tensor = tf.convert_to_tensor(component, dtype=self.dtype)
      except (TypeError, ValueError) as e:
        raise type(e)(f"Cannot assign {component!r} to variable "
                      f"'{self.name}' of dtype {self.dtype.name}: {e}") from None
      if not tensor.shape.is_compatible_with(self.shape):
        raise ValueError(
            f"Cannot assign a value of shape {tensor.shape} to variable "
            f"'{self.name}' of shape {self.shape}.")

  # --- tf.function, checkpoints and SavedModel.

  def __tf_tracing_type__(self, context):
    del context
    return _VariableTraceType(self)

  def _saved_value(self):
    with self._strategy_scope():
      return self.read_value()

  def _assign_restored(self, restored):
    restored = self._component_restore_value(restored)
    updates = []
    for component in self._values:
      with tf.device(component.device):
        updates.append(component.assign(restored, read_value=False))
    return tf.group(updates)

  def _component_restore_value(self, restored):
    return restored

  def _copy_trackable_to_cpu(self, object_map):
    # An asynchronous checkpoint's copy: one plain variable on the host CPU.
    value = self._saved_value()
    if self not in object_map:
      host_cpu = tf.DeviceSpec.from_string(self._primary.device).replace(
          device_type="CPU", device_index=0).to_string()
      object_map[self] = _tf_bridge.plain_variable(value, host_cpu, self._common_name)
    else:
      object_map[self].assign(value)

  def _gather_saveables_for_checkpoint(self):
    # A TF 1.x Saver stores the same value under the variable's name.
    def saveable(name=self._common_name):
      return _tf_bridge.tf1_saveable(
          self, name, self._primary.device, self._saved_value,
          lambda restored: self._restore_from_tensors({VARIABLE_VALUE: restored}))
    return {VARIABLE_VALUE: saveable}

  def to_proto(self, export_scope=None):
    # A TF1 graph's exported collections hold the variable it stands for.
    return self._primary.to_proto(export_scope=export_scope)

  def _export_to_saved_model_graph(self, object_map=None, tensor_map=None, options=None, **kwargs):
    # A SavedModel stores the variable this stands for: the primary component.
    resources = _tf_bridge.export_to_saved_model(
        self._primary, object_map, tensor_map, options, **kwargs)
    for component in self._values[1:]:
      object_map[component] = object_map[self._primary]
      tensor_map[component.handle] = tensor_map[self._primary.handle]
      resources.append(component.handle)
    object_map[self] = object_map[self._primary]
    tensor_map[self] = tensor_map[self._primary.handle]
    resources.append(self)
    return resources

  def _write_object_proto(self, proto, options):
    _tf_bridge.write_object_proto(self._primary, proto, options)
    proto.variable.aggregation = self.aggregation.value
    policy = options.experimental_variable_policy
    if policy == tf.saved_model.experimental.VariablePolicy.EXPAND_DISTRIBUTED_VARIABLES:
      for component in self._values:
        component_proto = proto.variable.experimental_distributed_variable_components.add()
        component_proto.name = component.name.split(":")[0]
        component_proto.device = component.device

  def __tf_experimental_restore_capture__(self, concrete_function, internal_capture):
    _tf_bridge.replace_capture(concrete_function, self, internal_capture)
    return self


class DistributedVariable(ComponentsVariable, values_lib.DistributedValues):
  """A distributed value with one component per replica."""

  # A distributed value's, not tf.Variable's.
  __repr__ = values_lib.DistributedValues.__repr__
  __str__ = values_lib.DistributedValues.__str__

  def _update_cross_replica(self, update_fn, value, method):
    _unsaveable_when_traced(self, f"updates ({method})")
    return super()._update_cross_replica(update_fn, value, method)


def _unsaveable_when_traced(variable, action):
  """Marks the function being traced unsaveable, as TensorFlow does."""
  _tf_bridge.mark_function_unsaveable(
      f"It {action} the distributed variable '{variable.name}' across its "
      f"replicas, which a SavedModel cannot hold: the function was traced "
      f"under the strategy before `tf.saved_model.save`. Give "
      f"`tf.saved_model.save` the `tf.function` itself (with an "
      f"`input_signature`) as the signature, not a concrete function from "
      f"`get_concrete_function()`: saving traces it again with each "
      f"distributed variable as one variable, e.g.\n\n"
      f"@tf.function(input_signature=...)\ndef f_with_input_signature():\n  ...\n\n"
      f"tf.saved_model.save(..., signatures=f_with_input_signature)")


class _VariableTraceType(tf.types.experimental.TraceType):
  """A `tf.function` traces once per distributed variable and captures it."""

  def __init__(self, variable):
    self._variable = variable

  def is_subtype_of(self, other):
    return self == other

  def most_specific_common_supertype(self, others):
    return self if all(self == other for other in others) else None

  def placeholder_value(self, placeholder_context=None):
    return self._variable

  def to_tensors(self, value):
    return []

  def cast(self, value, cast_context):
    return value

  def __hash__(self):
    return id(self._variable)

  def __eq__(self, other):
    return isinstance(other, _VariableTraceType) and other._variable is self._variable


class MirroredVariable(DistributedVariable, tf.types.experimental.distributed.Mirrored):
  """A variable whose components stay equal on every replica.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0)
  >>> v
  MirroredVariable:{
    0: <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>,
    1: <tf.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=1.0>
  }
  >>> _ = v.assign_add(2.0)
  >>> v.numpy().item()
  3.0
  """

  def _get_cross_replica(self):
    return self._get_on_device_or_primary()

  def _update(self, method, value, **kwargs):
    # As in TensorFlow: sparse updates combined by SUM or MEAN mean nothing.
    if method == "batch_scatter_update":
      raise NotImplementedError(
          f"`batch_scatter_update` is not supported for MirroredVariable "
          f"'{self.name}'; use `scatter_update`.")
    if (method in ("scatter_min", "scatter_max", "scatter_update") and
        self._aggregation not in (tf.VariableAggregation.ONLY_FIRST_REPLICA,
                                  tf.VariableAggregation.NONE) and
        not _tf_bridge.saving_without_distribution()):
      raise NotImplementedError(
          f"`{method}` is only supported for a MirroredVariable with NONE or "
          f"ONLY_FIRST_REPLICA aggregation; '{self.name}' has {self._aggregation}.")
    return super()._update(method, value, **kwargs)

  def _update_in_replica(self, update_fn, value, method):
    if self._aggregation == tf.VariableAggregation.NONE:
      return update_fn(self._get(), value)
    return self._update_aggregated(update_fn, value)


def checked_aggregation(aggregation, name):
  """`aggregation` checked, as given (a TF 1.x enum stays one, as in
  TensorFlow); None is TF 1.x's NONE.

  >>> checked_aggregation(tf.VariableAggregation.SUM, "v")
  <VariableAggregationV2.SUM: 1>
  >>> checked_aggregation(None, "v")
  <VariableAggregation.NONE: 0>
  """
  aggregation = aggregation or tf.compat.v1.VariableAggregation.NONE
  if aggregation not in tuple(tf.VariableAggregation):
    raise ValueError(f"Invalid variable aggregation mode: {aggregation} for "
                     f"variable: {name}")
  return aggregation


def aggregate(strategy, value, aggregation, destinations):
  """`value` from every replica, combined by a variable's `aggregation`."""
  if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
    first = strategy.experimental_local_results(value)[0]
    return strategy.extended.broadcast_to(first, destinations)
  return strategy.extended.reduce_to(
      ReduceOp.from_variable_aggregation(aggregation), value, destinations)


class SyncOnReadVariable(DistributedVariable):
  """A variable each replica updates on its own, aggregated by its
  `aggregation` when read across replicas.

  >>> strategy = tf_distribute_lite.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
  ...                   aggregation=tf.VariableAggregation.SUM)
  >>> _ = strategy.run(lambda: v.assign_add(1.0))
  >>> v.numpy().item()
  2.0
  """

  def _get_cross_replica(self):
    if self._aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
      return self._primary
    if self._aggregation == tf.VariableAggregation.NONE:
      raise ValueError(
          f"SyncOnReadVariable '{self.name}' has aggregation NONE and cannot "
          f"be read in a cross-replica context; read it inside strategy.run.")
    if self._aggregation == tf.VariableAggregation.SUM:
      _unsaveable_when_traced(self, "reads the sum of")
    reads = []
    for component in self._values:
      with tf.device(component.device):
        reads.append(component.read_value())
    return self._distribute_strategy.extended._reduce(  # pylint: disable=protected-access
        ReduceOp.from_variable_aggregation(self._aggregation), values_lib.PerReplica(reads))

  def _get(self):
    local = super()._get()
    runner = getattr(getattr(contexts.top(), "replica_context", None), "_runner", None)
    if runner is not None and isinstance(local, tf.Variable) and not tf.executing_eagerly():
      # A merge_call in a tf.cond on it may be reached by some replicas only.
      runner.note_replica_local(local.handle)
    return local

  def _as_graph_element(self):
    return _tf_bridge.graph_element(self._get())

  def _update_in_replica(self, update_fn, value, method):
    if "scatter" in method:
      raise NotImplementedError(
          f"`{method}` is not supported for SyncOnReadVariable '{self.name}'.")
    return update_fn(self._get(), value)

  def _update_cross_replica(self, update_fn, value, method):
    if "scatter" in method:
      raise NotImplementedError(
          f"`{method}` is not supported for SyncOnReadVariable '{self.name}'.")
    _unsaveable_when_traced(self, f"updates ({method})")
    if method != "assign" and self._aggregation == tf.VariableAggregation.SUM:
      raise ValueError(
          f"SyncOnReadVariable does not support `{method}` in cross-replica "
          f"context when aggregation is set to `tf.VariableAggregation.SUM`.")
    if method == "assign":
      value = self._component_restore_value(tf.convert_to_tensor(value, self.dtype))
    updates = self._distribute_strategy.extended.update(self, update_fn, args=(value,), group=False)
    done = tf.group([u for u in updates if u is not None])
    if all(u is None or isinstance(u, tf.Operation) for u in updates):
      return done  # read_value=False
    with tf.control_dependencies([done] if done is not None else []):
      return self.read_value()

  def _component_restore_value(self, restored):
    # With SUM, each component holds its share.
    if self._aggregation == tf.VariableAggregation.SUM:
      replicas = self._distribute_strategy.num_replicas_in_sync
      return tf.cast(restored / replicas, self.dtype)
    return restored


class AggregatingVariable(ComponentsVariable):
  """`CentralStorageStrategy`'s variable for several replicas: an update in
  `strategy.run` applies the replicas' values once, aggregated (not with
  aggregation NONE). As in TensorFlow, not a `DistributedValues`; its repr
  is its variable's."""

  def _get(self):
    return self._primary

  def _get_on_device_or_primary(self):
    return self._primary

  device = property(lambda self: self._primary.device)

  def _update_in_replica(self, update_fn, value, method):
    if "scatter" in method:  # as in TensorFlow: applied as it is
      return update_fn(self._primary, value)
    if self._aggregation == tf.VariableAggregation.NONE:
      raise ValueError(
          f"You must specify an aggregation method to update the "
          f"AggregatingVariable '{self.name}' in a replica context, e.g. "
          f"`tf.Variable(..., aggregation=tf.VariableAggregation.SUM)`: each "
          f"replica's update is aggregated before it is applied once. Or "
          f"update it in a cross-replica context (inside `merge_call`).")
    return self._update_aggregated(update_fn, value)

  def __repr__(self):
    return repr(self._primary)

  def __str__(self):
    return str(self._primary)


def _on_the_variable(method):
  def call(self, *args, **kwargs):
    return getattr(self._primary, method)(*args, **kwargs)
  call.__name__ = method
  call.__doc__ = f"`tf.Variable.{method}` of the one variable, as in TensorFlow."
  return call


for _method in ("scatter_nd_sub", "scatter_nd_add", "scatter_nd_update"):
  setattr(AggregatingVariable, _method, _on_the_variable(_method))
