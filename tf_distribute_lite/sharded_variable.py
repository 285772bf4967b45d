"""`ShardedVariable`: one variable kept as shards along its first axis, saved as
one whole variable (restored into any number of shards); `shard_arguments`
splits a variable for `ParameterServerStrategy`'s `variable_partitioner`."""

import itertools

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.tf_classes import StandsFor


def shard_sizes(length, num_shards):
  """The rows of a first axis of `length` each of `num_shards` shards holds.

  >>> shard_sizes(101, 2)
  [51, 50]
  >>> shard_sizes(13, 5)
  [3, 3, 3, 2, 2]
  """
  base, extra = divmod(length, num_shards)
  return [base + (1 if i < extra else 0) for i in range(num_shards)]


def shard_arguments(kwargs, partitioner):
  """Each shard's creation arguments, as `partitioner` splits `kwargs`' variable."""
  if partitioner is None:
    return None
  initial_value, shape, dtype = (kwargs.get(key) for key in ("initial_value", "shape", "dtype"))
  if initial_value is None:
    raise ValueError(
        "It looks like you are using `ParameterServerStrategy` with a `variable_partitioner`, and "
        "trying to create a variable without specifying `initial_value`. This is not allowed. "
        "Please specify the `initial_value`.")
  if callable(initial_value) and (shape is None or dtype is None):
    initial_value = initial_value()
  if callable(initial_value):
    shape, dtype = tf.TensorShape(shape), tf.as_dtype(dtype)
  else:
    initial_value = tf.convert_to_tensor(initial_value, dtype=dtype)
    shape, dtype = initial_value.shape, initial_value.dtype
  if shape.rank == 0:
    return None
  partitions = partitioner(shape=shape, dtype=dtype)
  if not partitions or partitions[0] == 0 or any(p != 1 for p in list(partitions)[1:]):
    raise ValueError(
        f"variable_partitioner must return a list/tuple whose elements are 1 "
        f"besides the first element (non-zero), got: {partitions!r}")
  num_shards = min(partitions[0], shape[0])
  if num_shards == 1:
    return None
  shards = []
  offset = 0
  for i, size in enumerate(shard_sizes(shape[0], num_shards)):
    shards.append(dict(kwargs, shape=(size,) + tuple(shape[1:]),
                       initial_value=_shard_initial_value(initial_value, shape, offset, size)))
    if kwargs.get("name") is not None:
      shards[-1]["name"] = f"{kwargs['name']}/part_{i}"
    offset += size
  return shards


def _shard_initial_value(initial_value, shape, offset, size):
  """A callable giving rows `offset` to `offset + size` of the initial value."""
  def shard_value():
    if not callable(initial_value):
      return initial_value[offset:offset + size]
    partition_shape = (size,) + tuple(shape[1:])
    try:
      value = initial_value(partition_shape=partition_shape,
                            partition_offset=(offset,) + (0,) * (len(shape) - 1))
    except (TypeError, ValueError):
      value = initial_value()
    value = tf.convert_to_tensor(value)
    if value.shape == partition_shape:
      return value
    return value[offset:offset + size]
  return shard_value


class ShardedVariable(distributed_variables.SavedAsOneVariable, _tf_bridge.Trackable,
                      _tf_bridge.CompositeTensor,
                      StandsFor, stands_for=_tf_bridge.TENSORFLOW_SHARDED_VARIABLE):
  """A variable stored as `variables`, shards along its first axis.

  >>> v = ShardedVariable([tf.Variable([[1.0], [2.0]]), tf.Variable([[3.0]])])
  >>> v.shape, [s.shape.as_list() for s in v.variables]
  (TensorShape([3, 1]), [[2, 1], [1, 1]])
  >>> tf.convert_to_tensor(v).numpy().ravel().tolist()
  [1.0, 2.0, 3.0]
  >>> tf.nn.embedding_lookup(v, [2, 0]).numpy().ravel().tolist()
  [3.0, 1.0]
  """

  def __init__(self, variables, name="ShardedVariable"):
    super().__init__()
    if (not isinstance(variables, (list, tuple)) or not variables or
        any(not isinstance(v, tf.Variable) for v in variables)):
      raise TypeError(f"Argument `variables` should be a non-empty list of "
                      f"`tf.Variable`s. Received {variables}")
    dtypes = [v.dtype for v in variables]
    if len(set(dtypes)) > 1:
      raise ValueError(f"All elements in argument `variables` must have the same "
                       f"dtype. Received dtypes: {dtypes}")
    shapes = [v.shape for v in variables]
    if len({tuple(s.as_list()[1:]) for s in shapes}) > 1 or shapes[0].rank == 0:
      raise ValueError(f"All elements in argument `variables` must have the same "
                       f"shapes except for the first axis. Received shapes: {shapes}")
    self._variables = list(variables)
    self._name = name
    self._dtype = dtypes[0]
    self._offsets = _starts(variables)
    self._shape = tf.TensorShape([self._offsets[-1]] + shapes[0].as_list()[1:])
    for v in self._variables:
      _tf_bridge.set_sharded_container(v, self)
    self._saving_variable = None  # the whole variable a SavedModel stores

  @property
  def variables(self):
    """The shards in order (while a SavedModel is written: the whole one)."""
    if _tf_bridge.in_save_context():
      return [self._whole_variable_for_saving()]
    return self._variables

  def __iter__(self):
    return iter(self._variables)

  def __len__(self):
    return len(self._variables)

  name = property(lambda self: self._name, doc="The name of the whole variable.")
  dtype = property(lambda self: self._dtype, doc="The shards' dtype.")
  shape = property(lambda self: self._shape, doc="The shape of the whole variable.")
  trainable = property(lambda self: self._variables[0].trainable)
  is_sharded_variable = property(lambda self: True)
  _shared_name = property(lambda self: self._name)

  @property
  def _unique_id(self):
    return _tf_bridge.variable_key(self._variables[0], "_unique_id").replace("part_0", "sharded")

  _distribute_strategy = property(lambda self: _tf_bridge.variable_strategy(self._variables[0]))

  def _should_act_as_resource_variable(self):
    return True

  def __repr__(self):
    return (f"<{type(self).__name__} '{self._name}' shape={self._shape} "
            f"dtype={self._dtype.name} shards={[v.shape[0] for v in self._variables]}>")

  def read_value(self):
    """The whole value: the shards concatenated."""
    return tf.concat([v.read_value() for v in self.variables], axis=0)

  value = read_value

  def numpy(self):
    return self.read_value().numpy()

  def __getitem__(self, slice_spec):
    return self.read_value()[slice_spec]

  def sparse_read(self, indices, name=None):
    """Rows `indices` of the whole variable, gathered shard by shard."""
    del name
    return _gather(self, indices)

  # --- Updates: each shard takes its rows of the value.

  def _update(self, method, value, **kwargs):
    del kwargs  # use_locking, name, read_value
    if method.startswith(("scatter", "batch_scatter")):
      return self._scatter(method.replace("batch_", ""), value)
    value = tf.convert_to_tensor(value, dtype=self._dtype)
    for i, v in enumerate(self._variables):
      getattr(v, method)(value[self._offsets[i]:self._offsets[i + 1]])
    return self

  def assign(self, value, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._update("assign", value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._update("assign_add", delta)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name, read_value
    return self._update("assign_sub", delta)

  def _scatter(self, method, sparse_delta):
    """Sends each row of `sparse_delta` (`tf.IndexedSlices`) to its shard."""
    indices = tf.cast(sparse_delta.indices, tf.int64)
    for i, v in enumerate(self._variables):
      start, stop = self._offsets[i], self._offsets[i + 1]
      mine = tf.where((indices >= start) & (indices < stop))[:, 0]
      getattr(v, method)(tf.IndexedSlices(
          tf.gather(sparse_delta.values, mine), tf.gather(indices, mine) - start))
    return self

  # --- Checkpoints and SavedModel: stored as one whole variable.

  _saved_value = read_value

  def _assign_restored(self, restored):
    return tf.group([
        v.assign(restored[self._offsets[i]:self._offsets[i + 1]], read_value=False)
        for i, v in enumerate(self._variables)])

  def _whole_variable_for_saving(self):
    if self._saving_variable is None:
      self._saving_variable = _tf_bridge.uninitialized_variable(
          self._shape, self._dtype, self._name, self.trainable)
    return self._saving_variable

  def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
    whole = self._whole_variable_for_saving()
    resources = []
    for v in self._variables + [whole]:
      resources.extend(_tf_bridge.export_to_saved_model(
          v, object_map, tensor_map, options, **kwargs))
    object_map[self] = ShardedVariable([object_map[whole]], name=self._name)
    return resources

  def _write_object_proto(self, proto, options):
    _tf_bridge.write_variable_proto(self._whole_variable_for_saving(), proto, options)

  def __tf_experimental_restore_capture__(self, concrete_function, internal_capture):
    del concrete_function, internal_capture
    return None

  # --- A composite tensor: it crosses `tf.function` boundaries as its shards.

  @property
  def _type_spec(self):
    return ShardedVariableSpec(*(tf.type_spec_from_value(v) for v in self._variables))


class ShardedVariableSpec(tf.TypeSpec):
  """Type spec of a `ShardedVariable`: its shards' variable specs.

  >>> ShardedVariable([tf.Variable([1.0]), tf.Variable([2.0])])._type_spec
  ShardedVariableSpec(VariableSpec(shape=(1,), dtype=tf.float32, trainable=True, alias_id=None), VariableSpec(shape=(1,), dtype=tf.float32, trainable=True, alias_id=None))
  """

  def __init__(self, *variable_specs):
    self._specs = variable_specs

  value_type = property(lambda self: ShardedVariable)
  _component_specs = property(lambda self: self._specs)

  def _serialize(self):
    return self._specs

  def _to_components(self, value):
    return tuple(value._variables)  # pylint: disable=protected-access

  def _from_components(self, components):
    return ShardedVariable(list(components))


def _as_tensor(var, dtype=None, name=None, as_ref=False):
  del name
  if dtype is not None and not dtype.is_compatible_with(var.dtype):
    raise ValueError(f"Incompatible type conversion requested to type "
                     f"{dtype.name!r} for variable of type {var.dtype.name!r}")
  if as_ref:
    raise NotImplementedError("ShardedVariable doesn't support being used as a reference.")
  return var.read_value()


tf.register_tensor_conversion_function(ShardedVariable, _as_tensor)

values_lib.forward_operators(ShardedVariable, tf.Tensor.OVERLOADABLE_OPERATORS - {"__getitem__"},
                             lambda self: self.read_value())


def _starts(variables):
  return [0] + list(itertools.accumulate(v.shape[0] for v in variables))


def _gather(sharded, ids):
  """Rows `ids` of `sharded`, each read from its shard ("div" partitioning)."""
  ids = tf.convert_to_tensor(ids)
  variables = sharded.variables
  starts = _starts(variables)
  flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
  shard = tf.cast(tf.searchsorted(tf.constant(starts[1:-1], tf.int64), flat, side="right"),
                  tf.int32)
  local = flat - tf.gather(tf.constant(starts[:-1], tf.int64), shard)
  positions = tf.dynamic_partition(tf.range(tf.size(flat)), shard, len(variables))
  parts = tf.dynamic_partition(local, shard, len(variables))
  rows = [v.sparse_read(p) for v, p in zip(variables, parts)]
  gathered = tf.dynamic_stitch(positions, rows)
  result = tf.reshape(gathered, tf.concat([tf.shape(ids), tf.shape(gathered)[1:]], 0))
  result.set_shape(ids.shape.concatenate(sharded.shape[1:]))
  return result


@tf.experimental.dispatch_for_api(tf.nn.embedding_lookup)
def _embedding_lookup(params: ShardedVariable, ids, max_norm=None, name=None):
  if max_norm is not None:
    return tf.nn.embedding_lookup(params.variables, ids, max_norm=max_norm, name=name)
  with tf.name_scope(name or "embedding_lookup"):
    return _gather(params, ids)
