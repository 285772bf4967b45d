"""The step of a `TPUStrategy`: on a TPU one `tpu.replicate` computation
traced once for all replicas (SPMD); on an emulated slice, the check that
XLA compiles it (`check_compiles`)."""

import contextlib

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import replica_context
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp


class LogicalDevices:
  """What a TPU replica context adds: `experimental_logical_device`."""

  def experimental_logical_device(self, logical_device_id):
    """Places the ops made in it on the replica's logical device."""
    return self.strategy.extended.experimental_logical_device(logical_device_id)


class TPUReplicaContext(LogicalDevices, replica_context.ReplicaContext):
  """The replica context of a TPU computation: one trace for all replicas."""

  def __init__(self, strategy):
    super().__init__(strategy, 0)
    self._replica_id_tensor = None
    self._replicated_variables = {}

  @property
  def replica_id_in_sync_group(self):
    """This replica's index: a replicated input, one constant per replica."""
    if self._replica_id_tensor is None:
      self._replica_id_tensor = tf.raw_ops.TPUReplicatedInput(
          inputs=[tf.constant(i, tf.int32) for i in range(self.num_replicas_in_sync)])
    return self._replica_id_tensor

  def all_reduce(self, reduce_op, value, options=None):
    """`CrossReplicaSum` of each tensor of `value` (divided for MEAN)."""
    del options
    return tf.nest.map_structure(
        lambda v: cross_replica(ReduceOp.from_any(reduce_op), v,
                                self.num_replicas_in_sync), value)

  def local_variable(self, variable):
    """Distributed `variable` as one replicated handle of its components."""
    key = id(variable)
    if key not in self._replicated_variables:
      handle = tf.raw_ops.TPUReplicatedInput(
          inputs=[component.handle for component in variable.values],
          is_mirrored_variable=True)
      self._replicated_variables[key] = _tf_bridge.variable_of_handle(handle, variable)
    return self._replicated_variables[key]

  def logical_device_scope(self, logical_device_id):
    """Places the ops made in it on the replica's core `logical_device_id`."""
    return tf.device(tf.compat.v1.tpu.core(logical_device_id))

  def all_gather(self, value, axis, options=None):
    """A `CrossReplicaSum` of one-hot slots (an `AllToAll` for other types)."""
    del options
    replica_context.refuse_indexed_slices(value, "all_gather")
    count = self.num_replicas_in_sync
    if count == 1:
      return value

    def gather(tensor):
      tensor = tf.convert_to_tensor(tensor)
      rank = tensor.shape.rank
      if not rank or not -rank <= axis < rank:
        raise ValueError(f"all_gather needs a tensor of known rank of at least 1 "
                         f"and `axis` within it; got axis={axis} for shape "
                         f"{tensor.shape}.")
      at = axis % rank
      # [..., replicas, d_axis, ...], replica i's tensor at index i.
      slots = [1] * (rank + 1)
      slots[at] = count
      expanded = tf.expand_dims(tensor, at)
      if tensor.dtype in _CROSS_REPLICA_SUM_DTYPES:
        mask = tf.reshape(tf.one_hot(self.replica_id_in_sync_group, count,
                                     dtype=tensor.dtype), slots)
        stacked = cross_replica(ReduceOp.SUM, expanded * mask, count)
      else:
        stacked = tf.raw_ops.AllToAll(
            input=tf.tile(expanded, slots), group_assignment=[list(range(count))],
            concat_dimension=at, split_dimension=at, split_count=count)
      shape = tf.shape(tensor)
      return tf.reshape(stacked, tf.concat([shape[:at], [-1], shape[at + 1:]], 0))
    return tf.nest.map_structure(gather, value)


# The types `CrossReplicaSum` adds.
_CROSS_REPLICA_SUM_DTYPES = (tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.int32, tf.uint32)


def enclosing_step(strategy):
  """The `TPUReplicaContext` of `strategy`'s step traced here, or None."""
  context = contexts.enclosing_replica_context()
  if isinstance(context, TPUReplicaContext) and context.strategy is strategy:
    return context
  return None


def cross_replica(reduce_op, value, num_replicas):
  """`value` summed (or averaged) over the replicas of a TPU computation."""
  total = tf.compat.v1.tpu.cross_replica_sum(tf.convert_to_tensor(value))
  if reduce_op == ReduceOp.MEAN:
    total = cross_device_ops_lib.mean_from_sum(total, num_replicas)
  return total


def replicate(strategy, fn, args, kwargs, device_assignment, options,
              use_spmd_for_xla_partitioning):
  """`fn(*args, **kwargs)` as one `tpu.replicate` computation; distributed results."""
  count = strategy.num_replicas_in_sync
  per_replica = [values_lib.select_replica(i, (args, kwargs)) for i in range(count)]
  inputs = [split_inputs(p)[0] for p in per_replica]
  with_tensors = split_inputs(per_replica[0])[1]
  results = []

  def computation(*tensors):
    replica_args, replica_kwargs = with_tensors(tensors)
    with TPUReplicaContext(strategy):
      result = fn(*replica_args, **replica_kwargs)
    results.append(result)
    return output_tensors(result)

  outputs = tf.compat.v1.tpu.replicate(
      computation, inputs=inputs, device_assignment=device_assignment,
      maximum_shapes=maximum_shapes(inputs[0], options),
      padding_spec=(tf.compat.v1.tpu.PaddingSpec.POWER_OF_TWO
                    if options.experimental_bucketizing_dynamic_shape else None),
      xla_options=options.experimental_xla_options or tf.tpu.XLAOptions(
          use_spmd_for_xla_partitioning=use_spmd_for_xla_partitioning))
  structure = results[0]
  if not output_tensors(structure):
    return structure
  return values_lib.regroup(
      [tf.nest.pack_sequence_as(structure, replica_outputs, expand_composites=True)
       for replica_outputs in outputs])


def split_inputs(inputs):
  """The tensors (not variables) of `inputs`, and a function putting others there."""
  leaves = tf.nest.flatten(inputs)
  positions = [i for i, leaf in enumerate(leaves)
               if tf.is_tensor(leaf) and not isinstance(leaf, tf.Variable)]

  def with_tensors(tensors):
    flat = list(leaves)
    for position, tensor in zip(positions, tensors):
      flat[position] = tensor
    return tf.nest.pack_sequence_as(inputs, flat)
  return [leaves[i] for i in positions], with_tensors


def output_tensors(result):
  """The tensors of the nest `result`, composites' components too."""
  return [t for t in tf.nest.flatten(result, expand_composites=True) if tf.is_tensor(t)]


def maximum_shapes(replica_inputs, options):
  """Each input's shape with every dimension unknown (dynamic batch), else None."""
  if not options.experimental_enable_dynamic_batch_size:
    return None
  for tensor in replica_inputs:
    if tensor.shape.rank is None:
      raise ValueError(f"input tensor {tensor} to TPUStrategy.run() has unknown "
                       f"rank, which is not allowed")
  return [tf.TensorShape([None] * t.shape.rank) for t in replica_inputs] or None


class XlaCheckReplicaContext(TPUReplicaContext):
  """Replica 0 of the compile check: collectives are stand-ins of the right shape."""

  @property
  def replica_id_in_sync_group(self):
    return tf.constant(0, tf.int32)

  def all_reduce(self, reduce_op, value, options=None):
    del reduce_op, options
    return tf.nest.map_structure(tf.identity, value)

  def all_gather(self, value, axis, options=None):
    del options
    count = self.num_replicas_in_sync
    return tf.nest.map_structure(lambda v: tf.concat([v] * count, axis), value)

  def local_variable(self, variable):
    return variable.values[0]

  def logical_device_scope(self, logical_device_id):
    del logical_device_id  # replica 0 computes on one device
    return contextlib.nullcontext()


def check_compiles(strategy, fn, args, kwargs, created_variables=()):
  """Raises `tf.errors.InvalidArgumentError`, with XLA's message, where XLA
  cannot compile replica 0's `fn(*args, **kwargs)` (lowered to HLO, not run).
  Not checked: TF 1.x graphs, inputs other than dense tensors of known rank.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> strategy = tf_distribute_lite.TPUStrategy(resolver)
  >>> check_compiles(strategy, lambda x: x * 2.0, (tf.constant(1.0),), {})
  >>> try:
  ...   check_compiles(strategy, lambda x: tf.strings.length(tf.strings.as_string(x)),
  ...                  (tf.constant(1.0),), {})
  ... except tf.errors.InvalidArgumentError as error:
  ...   print("AsString" in str(error))
  True
  """
  if not tf.compat.v1.get_default_graph().building_function and not tf.executing_eagerly():
    return  # a TF 1.x graph
  inputs, with_tensors = split_inputs(values_lib.select_replica(0, (tuple(args), dict(kwargs))))
  specs = [tf.type_spec_from_value(tensor) for tensor in inputs]
  strings = [tensor for tensor, spec in zip(inputs, specs)
             if getattr(spec, "dtype", None) == tf.string]  # composites have none
  if strings:
    raise tf.errors.InvalidArgumentError(
        None, None,
        f"XLA cannot compile the step, as a TPU must: a TPU computes no strings, "
        f"and the step takes tf.string inputs {strings}. Turn them into numbers "
        f"before `strategy.run` (in the input pipeline).")
  static_specs = [_static(spec) for spec in specs]
  if None in static_specs:
    return
  reused = iter(created_variables)

  def reuse_variable(next_creator, **kwargs):
    variable = next(reused, None)
    return next_creator(**kwargs) if variable is None else variable

  def replica_step(unused, *tensors):
    del unused
    replica_args, replica_kwargs = with_tensors(tensors)
    with tf.variable_creator_scope(reuse_variable), XlaCheckReplicaContext(strategy):
      result = fn(*replica_args, **replica_kwargs)
    return output_tensors(result)

  traced = tf.function(replica_step, jit_compile=True).get_concrete_function(_UNUSED, *specs)
  device = strategy.extended.worker_devices[0]
  if device not in device_util.local_devices():  # a pod's host: lower on this process's CPU
    device = device_util.local_devices("CPU")[0]
  captured = _lowerable(traced, device)
  if captured is None:
    return
  try:
    _tf_bridge.hlo_text(traced, [_UNUSED] + static_specs, captured, device)
  except (ValueError, tf.errors.OpError) as e:
    message = str(e).split("Failed getting HLO text: ", 1)[-1]
    raise tf.errors.InvalidArgumentError(
        None, None,
        f"XLA cannot compile the step, as a TPU must: {message}") from None


# Given argument specs, XLA compiles a step's captured values as inputs, as a
# TPU does; given none, as constants. So every checked step takes one.
_UNUSED = tf.TensorSpec([], tf.int32)


def _static(spec):
  """`spec` with unknown dimensions as 1; None unless dense, of known rank."""
  if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
    return None
  return tf.TensorSpec([1 if d is None else d for d in spec.shape.as_list()], spec.dtype)


def _lowerable(traced, device):
  """Values of `traced`'s captures to compile with on `device`, or None."""
  variables = {id(v.handle): v for v in traced.variables}
  with tf.init_scope():
    values = [_lowerable_value(value, variables.get(id(value)), device)
              for value in traced.captured_inputs]
  return None if any(value is None for value in values) else values


def _lowerable_value(value, variable, device):
  """`value`, or zeros standing in for it (None where none can)."""
  if tf.is_symbolic_tensor(value):
    spec = _static(tf.TensorSpec(value.shape, value.dtype))
    if spec is None or value.dtype in (tf.resource, tf.variant):
      return None
    return tf.zeros(spec.shape, spec.dtype)
  if value.dtype != tf.resource or (
      tf.raw_ops.VarIsInitializedOp(resource=value) and
      device_util.canonicalize(value.device) == device_util.canonicalize(device)):
    return value
  spec = None if variable is None else _static(tf.TensorSpec(variable.shape, variable.dtype))
  if spec is None:
    return None
  return _tf_bridge.plain_variable(tf.zeros(spec.shape, spec.dtype), device, "stand_in").handle

