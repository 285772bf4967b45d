"""The step of a `TPUStrategy` on a real TPU: one `tpu.replicate`
computation, traced once and compiled by XLA for every replica.

Inside the computation the code is the same for all replicas (SPMD): the
replica context's all-reduce is TensorFlow's `CrossReplicaSum`, the replica id
is a replicated input, reductions in `merge_call` sum across replicas, and a
distributed variable is one replicated handle, each replica's own component.
"""

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import replica_context
from tf_distribute_lite.communicator import cross_replica
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.reduce_util import ReduceOp


class LogicalDevices:
  """What a TPU replica context adds: `experimental_logical_device`."""

  def experimental_logical_device(self, logical_device_id):
    """Places the ops made in it on logical device `logical_device_id` of
    the replica (`TPUExtended.experimental_logical_device`)."""
    return self.strategy.extended.experimental_logical_device(logical_device_id)


class TPUReplicaContext(LogicalDevices, replica_context.ReplicaContext):
  """The replica context inside a TPU computation: one trace for all
  replicas."""

  def __init__(self, strategy):
    super().__init__(strategy, 0)
    self._replica_id_tensor = None

  @property
  def replica_id_in_sync_group(self):
    """This replica's index: a replicated input, one constant per replica."""
    if self._replica_id_tensor is None:
      count = self.num_replicas_in_sync
      self._replica_id_tensor = tf.raw_ops.TPUReplicatedInput(
          inputs=[tf.constant(i, tf.int32) for i in range(count)])
    return self._replica_id_tensor

  def all_reduce(self, reduce_op, value, options=None):
    """`CrossReplicaSum` of each tensor of `value` (divided for MEAN)."""
    del options
    return tf.nest.map_structure(
        lambda v: cross_replica(ReduceOp.from_any(reduce_op), v,
                                self.num_replicas_in_sync), value)


  def all_gather(self, value, axis, options=None):
    """Each tensor of `value` concatenated along `axis` over the replicas:
    the `CrossReplicaSum` of the tensor placed at this replica's slot of
    zeros, or for types that sum cannot carry, an `AllToAll`."""
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
_CROSS_REPLICA_SUM_DTYPES = (tf.bfloat16, tf.float16, tf.float32, tf.float64,
                             tf.int32, tf.uint32)


def replicated_variable(variable):
  """Distributed `variable` inside a TPU computation: a variable whose one
  resource handle is each replica's own component (`TPUReplicatedInput` of
  the components' handles)."""
  handle = tf.raw_ops.TPUReplicatedInput(
      inputs=[component.handle for component in variable.values],
      is_mirrored_variable=True)
  return _tf_bridge.variable_of_handle(handle, variable)


def replicate(strategy, fn, args, kwargs, device_assignment, options):
  """`fn(*args, **kwargs)` as one `tpu.replicate` computation; returns the
  replicas' results grouped into distributed values.

  `options` (`RunOptions`): with `experimental_enable_dynamic_batch_size`
  every dimension of the inputs may vary (XLA pads them), with
  `experimental_bucketizing_dynamic_shape` to the next power of two;
  `experimental_xla_options` default to partitioning with SPMD exactly when
  the strategy was made with `experimental_spmd_xla_partitioning`.
  """
  extended = strategy.extended
  count = strategy.num_replicas_in_sync
  per_replica = [values_lib.select_replica(i, (args, kwargs)) for i in range(count)]
  leaves = tf.nest.flatten(per_replica[0])
  positions = input_positions(leaves)
  inputs = [[tf.nest.flatten(p)[i] for i in positions] for p in per_replica]
  results = []

  def computation(*tensors):
    flat = list(leaves)
    for position, tensor in zip(positions, tensors):
      flat[position] = tensor
    replica_args, replica_kwargs = tf.nest.pack_sequence_as(per_replica[0], flat)
    extended._tpu_mode = "replicate"  # pylint: disable=protected-access
    extended._replicated_variables = {}  # pylint: disable=protected-access
    try:
      with TPUReplicaContext(strategy):
        result = fn(*replica_args, **replica_kwargs)
    finally:
      extended._tpu_mode = None  # pylint: disable=protected-access
    results.append(result)
    return [t for t in tf.nest.flatten(result, expand_composites=True) if tf.is_tensor(t)]

  outputs = tf.compat.v1.tpu.replicate(
      computation, inputs=inputs, device_assignment=device_assignment,
      maximum_shapes=_maximum_shapes(inputs[0], options),
      padding_spec=(tf.compat.v1.tpu.PaddingSpec.POWER_OF_TWO
                    if options.experimental_bucketizing_dynamic_shape else None),
      xla_options=options.experimental_xla_options or tf.tpu.XLAOptions(
          use_spmd_for_xla_partitioning=extended._use_spmd_for_xla_partitioning))  # pylint: disable=protected-access
  structure = results[0]
  if not [t for t in tf.nest.flatten(structure, expand_composites=True) if tf.is_tensor(t)]:
    return structure
  return values_lib.regroup(
      [tf.nest.pack_sequence_as(structure, replica_outputs, expand_composites=True)
       for replica_outputs in outputs])


def input_positions(leaves):
  """Where in a replica's flattened arguments `leaves` the inputs of its TPU
  computation are: the tensors. Variables stay variables, captured by the
  computation, as in TensorFlow's `TPUStrategy`."""
  return [i for i, leaf in enumerate(leaves)
          if tf.is_tensor(leaf) and not isinstance(leaf, tf.Variable)]


def check_input_ranks(replica_inputs, options):
  """Raises `ValueError` where a dynamic batch is enabled (as by default)
  and an input tensor of a replica has unknown rank: XLA can pad dimensions
  of unknown size, never an unknown number of them."""
  if not options.experimental_enable_dynamic_batch_size:
    return
  for tensor in replica_inputs:
    if tensor.shape.rank is None:
      raise ValueError(f"input tensor {tensor} to TPUStrategy.run() has unknown "
                       f"rank, which is not allowed")


def _maximum_shapes(replica_inputs, options):
  """Each input's shape with every dimension unknown, so that XLA pads
  inputs whose shapes vary between steps; None without dynamic batches."""
  if not options.experimental_enable_dynamic_batch_size or not replica_inputs:
    return None
  check_input_ranks(replica_inputs, options)
  return [tf.TensorShape([None] * t.shape.rank) for t in replica_inputs]
