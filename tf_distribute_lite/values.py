"""Distributed values (`PerReplica`, `Mirrored`) and the two halves of
`strategy.run`: `select_replica` splits its inputs, `regroup` joins results."""

import collections

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import device_util


class DistributedValues(tf.distribute.DistributedValues):
  """Base class of values that hold one component per replica.

  >>> v = PerReplica([tf.constant(1.0), tf.constant(2.0)])
  >>> v.values[1]
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  """

  # Read by `is_split` from the type: cheaper than `isinstance` in every `run`.
  _splits_per_replica = True

  def __init__(self, values):
    self._values = tuple(values)

  values = property(lambda self: self._values, doc="The components, one per local replica.")
  _primary = property(lambda self: self._values[0])
  _devices = property(lambda self: tuple(v.device for v in self._values))

  def _current_replica_id(self):
    return contexts.current_replica_id()

  def _get(self):
    replica_id = self._current_replica_id()
    return self._get_cross_replica() if replica_id is None else self._values[replica_id]

  def _get_cross_replica(self):
    raise ValueError(
        f"{type(self).__name__} has a different value on each replica and "
        f"cannot be used as one value in a cross-replica context. Reduce it "
        f"with `strategy.reduce`, or use it inside `strategy.run`.")

  def _get_on_device_or_primary(self):
    """The current replica's component, else the one on this device."""
    replica_id = self._current_replica_id()
    return self._on_current_device() if replica_id is None else self._values[replica_id]

  def _on_current_device(self):
    """The component on the current device, else the first."""
    device = device_util.current()
    if device:
      device = device_util.canonicalize(device)
      for value in self._values:
        if device_util.canonicalize(value.device) == device:
          return value
    return self._primary

  def _debug_string(self, format_value):
    lines = ",\n".join(f"  {i}: {format_value(v)}" for i, v in enumerate(self._values))
    return f"{type(self).__name__}:{{\n{lines}\n}}"

  def __str__(self):
    return self._debug_string(str)

  def __repr__(self):
    return self._debug_string(repr)


def _component_specs(value):
  specs = []
  for i, component in enumerate(value.values):
    try:
      specs.append(tf.type_spec_from_value(component))
    except TypeError:
      raise TypeError(
          f"{type(value).__name__} component {i} is {component!r} of type "
          f"{type(component).__name__}, not a tensor: a value passed into or returned from a "
          "tf.function (e.g. the result of strategy.run) must be a nest of tensors.") from None
  return specs


class PerReplica(DistributedValues, tf.types.experimental.distributed.PerReplica,
                 _tf_bridge.CompositeTensor):
  """Values that may differ from replica to replica.

  >>> PerReplica([tf.constant(1), tf.constant(2)])
  PerReplica:{
    0: <tf.Tensor: shape=(), dtype=int32, numpy=1>,
    1: <tf.Tensor: shape=(), dtype=int32, numpy=2>
  }
  """

  _type_spec = property(lambda self: PerReplicaSpec(*_component_specs(self)))

  def __tf_tensor__(self, dtype=None, name=None):
    if contexts.in_cross_replica_context() or not contexts.has_strategy():
      raise ValueError(
          "It looks like you are using a PerReplica object while not inside a "
          "replica context, which is not supported. Try running your op or "
          "function inside a replica context by using `strategy.run`")
    return as_tensor(self._get(), dtype, name)


@_tf_bridge.register_type_spec("tf_distribute_lite.PerReplicaSpec")
class PerReplicaSpec(tf.TypeSpec):
  """Type spec of a `PerReplica`: its components' specs (SavedModels keep it)."""

  __slots__ = ("_specs", "_all_tensor_specs")

  def __init__(self, *component_specs):
    self._specs = component_specs
    self._all_tensor_specs = all(type(spec) is tf.TensorSpec for spec in component_specs)  # pylint: disable=unidiomatic-typecheck

  value_type = property(lambda self: PerReplica)
  _component_specs = property(lambda self: self._specs)

  def _serialize(self):
    return self._specs

  def _from_components(self, components):
    return PerReplica(components)

  def _to_components(self, value):
    return value.values

  # Fast paths of every `tf.function` call: tensors taken as they are.

  def to_tensors(self, value):
    components = value.values
    if self._all_tensor_specs and all(
        isinstance(c, tf.Tensor) and c.dtype == spec.dtype
        for c, spec in zip(components, self._specs)):
      return list(components)
    return super().to_tensors(value)

  def from_tensors(self, tensors):
    if self._all_tensor_specs:
      return PerReplica([spec.from_tensors(tensors) for spec in self._specs])
    return super().from_tensors(tensors)


class Mirrored(DistributedValues, tf.types.experimental.distributed.Mirrored):
  """Values equal on every replica, usable as one value (the current replica's).

  >>> m = Mirrored([tf.constant(3.0), tf.constant(3.0)])
  >>> m + 1.0
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  >>> m.dtype
  tf.float32
  """

  def _get_cross_replica(self):
    return self._get_on_device_or_primary()

  def __getattr__(self, name):
    if name.startswith("_"):
      raise AttributeError(name)
    return getattr(self._get(), name)

  def __tf_tracing_type__(self, context):
    return self._get().__tf_tracing_type__(context)

  def __tf_tensor__(self, dtype=None, name=None):
    return as_tensor(self._get(), dtype, name)

  def _as_graph_element(self):
    return _tf_bridge.graph_element(self._get())


def as_tensor(value, dtype=None, name=None):
  """`tf.convert_to_tensor`, skipping its costly dispatch for a tensor."""
  if isinstance(value, tf.Tensor) and (dtype is None or dtype == value.dtype):
    return value
  return tf.convert_to_tensor(value, dtype=dtype, name=name)


def forward_operators(cls, names, read):
  """Gives `cls` the operators `names`, each applied to `read(self)`."""
  def forwarded(name):
    def operator(self, *args, **kwargs):
      return getattr(read(self), name)(*args, **kwargs)
    operator.__name__ = name
    return operator
  for name in names:
    setattr(cls, name, forwarded(name))


forward_operators(Mirrored, tf.Tensor.OVERLOADABLE_OPERATORS - {
    "__eq__", "__ne__", "__div__", "__rdiv__"}, lambda self: self._get())  # pylint: disable=protected-access


def is_distributed_variable(value):
  return getattr(value, "is_distributed_variable", False) is True


def select_replica(replica_id, structure):
  """`structure` as replica `replica_id` sees it, in fresh containers.

  >>> select_replica(1, {"x": PerReplica([1, 2]), "y": 3})
  {'x': 2, 'y': 3}
  """
  if is_split(structure):
    return structure.values[replica_id]
  if isinstance(structure, (list, tuple)):
    return _sequence_like(structure, [select_replica(replica_id, item) for item in structure])
  if type(structure) in (dict, collections.OrderedDict):
    return type(structure)(
        (key, select_replica(replica_id, item)) for key, item in structure.items())
  if isinstance(structure, _LEAVES) or not tf.nest.is_nested(structure):
    return structure
  return tf.nest.map_structure(
      lambda leaf: leaf.values[replica_id] if is_split(leaf) else leaf, structure)


_LEAVES = (tf.Tensor, tf.Variable, int, float, str, bool, type(None))


def _sequence_like(sequence, items):
  return type(sequence)(*items) if hasattr(sequence, "_fields") else type(sequence)(items)


def is_split(value):
  """Whether each replica sees its own component of `value` (not a variable)."""
  split = getattr(type(value), "_splits_per_replica", None)
  if split is None:
    return (isinstance(value, tf.distribute.DistributedValues) and
            not isinstance(value, tf.Variable))
  return split


def regroup(per_replica_results, wrap_class=PerReplica, always_wrap=False):
  """One nest of distributed values from a list of per-replica nests."""
  return _regroup(per_replica_results, wrap_class, always_wrap, "")


def _regroup(per_replica_results, wrap_class, always_wrap, path):
  _check_same_structure(per_replica_results, path)
  first = per_replica_results[0]
  if isinstance(first, (list, tuple)):
    return _sequence_like(first, [
        _regroup([r[i] for r in per_replica_results], wrap_class, always_wrap, f"{path}[{i}]")
        for i in range(len(first))])
  if isinstance(first, dict):
    return type(first)((key, _regroup([r[key] for r in per_replica_results],
                                      wrap_class, always_wrap, f"{path}[{key!r}]"))
                       for key in first)
  if all(r is first for r in per_replica_results[1:]) and (
      is_distributed_variable(first) if always_wrap
      else distributed_container(first) is None):
    return first
  container = distributed_container(first)
  if container is not None and all(
      distributed_container(r) is container for r in per_replica_results[1:]):
    return container
  return wrap_class(per_replica_results)


def _check_same_structure(results, path):
  """Raises `ValueError` where the replicas' nests differ (TF 2.21: unclear errors)."""
  shape = _level(results[0])
  for i, r in enumerate(results[1:], 1):
    if _level(r) != shape:
      where = f" at {path}" if path else ""
      raise ValueError(
          f"Replicas returned different structures{where}: replica 0 returned "
          f"{_outline(results[0])}, replica {i} returned {_outline(r)}; every "
          f"replica must return the same nest (of lists, tuples and dicts).")


def _level(value):
  if isinstance(value, dict):
    return frozenset(value)
  return len(value) if isinstance(value, (list, tuple)) else None


def _outline(value):
  """A nest's structure, leaves named by their type (tensors' shape, dtype)."""
  if isinstance(value, dict):
    return "{" + ", ".join(f"{k!r}: {_outline(v)}" for k, v in value.items()) + "}"
  if isinstance(value, (list, tuple)):
    inner = ", ".join(_outline(v) for v in value)
    return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' * (len(value) == 1)})"
  if isinstance(value, (tf.Tensor, tf.Variable)):
    kind = "Variable" if isinstance(value, tf.Variable) else "Tensor"
    return f"{kind}(shape={value.shape}, dtype={value.dtype.name})"
  return type(value).__name__


def distributed_container(value):
  """The distributed variable `value` is a component of, or None."""
  if not isinstance(value, tf.Variable) or is_distributed_variable(value):
    return None
  container = _tf_bridge.distributed_container_of(value)
  if container is None or not any(c is value for c in container._values):  # pylint: disable=protected-access
    return None  # e.g. the result of an assign: same handle, not a component
  return container


def local_results(value, num_replicas):
  """The per-replica components of `value` as a tuple (else `(value,)`)."""
  if isinstance(value, tf.distribute.DistributedValues):
    return value.values
  if tf.nest.is_nested(value):
    return tuple(select_replica(i, value) for i in range(num_replicas))
  return (value,)


def flatten_with_paths(structure, path=""):
  """(path such as `['a'][0]`, leaf) of a nest of dicts, lists and tuples."""
  if isinstance(structure, dict):
    for key, item in structure.items():
      yield from flatten_with_paths(item, f"{path}[{key!r}]")
  elif isinstance(structure, (list, tuple)):
    for index, item in enumerate(structure):
      yield from flatten_with_paths(item, f"{path}[{index}]")
  else:
    yield path, structure
