"""`Communicator`: every reduction of one strategy, on one process's devices,
across workers or in a TPU step; and `reduce_along_axis`."""

import numbers

import numpy as np
import tensorflow as tf

from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import distributed_variables
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.reduce_util import ReduceOp

# A collective's timeout unless `CommunicationOptions` set one (TensorFlow
# 2.21 waits forever).
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 1800.0

# The types collective ops add; other integers and booleans go as int64.
_SUMMABLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


class Communicator:
  """One process's reductions: with `cross_device_ops` where they all-reduce
  in place, else with `host_ops` (int32, CPU or other destinations); onto
  another task of the job, `ValueError`, as in TensorFlow."""

  def __init__(self, layout, cross_device_ops=None, host_ops=None):
    cross_device_ops_lib.check_cross_device_ops(cross_device_ops)
    self.layout = layout
    self.cross_device_ops = cross_device_ops or default_cross_device_ops(layout.devices)
    self._host_ops = host_ops or cross_device_ops_lib.ReductionToOneDevice()

  def reduce_to(self, reduce_op, value, destinations, options):
    self._refuse_other_workers(destinations)
    if (type(value) is values_lib.PerReplica and isinstance(destinations, str) and
        len(value.values) == self.layout.num_replicas and
        device_util.device_type(destinations) == "CPU"):
      # What the host path below does onto one CPU, without its dispatch.
      return cross_device_ops_lib.reduce_on_device(reduce_op, value, destinations)
    if reduce_op == ReduceOp.MEAN and _is_mirrored(value):
      return value
    if not isinstance(value, tf.distribute.DistributedValues):
      # The same object on every replica: MEAN (or a sum of zeros) is itself.
      if reduce_op == ReduceOp.MEAN or (not tf.is_tensor(value) and _is_all_zero(value)):
        return value
      if len(self.layout.devices) != 1:
        raise ValueError(
            f"A non-DistributedValues value {value!s} cannot be reduced with "
            f"the given reduce op {reduce_op}. Summing one value that every "
            f"replica shares is ambiguous: pass per-replica values (from "
            f"strategy.run) or use ReduceOp.MEAN.")
      return cross_device_ops_lib.simple_broadcast(value, destinations)
    destinations = self._destination_devices(destinations)
    devices = cross_device_ops_lib.devices_of(destinations)
    ops = self._ops_for(value)
    value = self._placed(value, ops)
    on_host = any(device_util.device_type(d) == "CPU" for d in devices)
    if on_host or devices != cross_device_ops_lib.devices_of(value):
      return self._host_ops.reduce(reduce_op, value, destinations)
    return ops.reduce(reduce_op, value, destinations, options)

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    """Values that share an algorithm reduce in one batch."""
    results = [None] * len(value_destination_pairs)
    by_ops = {}
    pairs = []
    for i, (value, destinations) in enumerate(value_destination_pairs):
      self._refuse_other_workers(destinations)
      if not isinstance(value, tf.distribute.DistributedValues):
        # The same on every replica: itself, as in TensorFlow, copied elsewhere.
        shared = destinations is value or not (tf.is_tensor(value) or isinstance(value, tf.Variable))
        results[i] = value if shared else cross_device_ops_lib.simple_broadcast(value, destinations)
        pairs.append(None)
        continue
      ops = self._ops_for(value)
      pairs.append((self._placed(value, ops), self._destination_devices(destinations)))
      by_ops.setdefault(ops, []).append(i)
    for ops, indices in by_ops.items():
      reduced = ops.batch_reduce(reduce_op, [pairs[i] for i in indices], options)
      for i, r in zip(indices, reduced):
        results[i] = r
    return results

  def broadcast_to(self, tensor, destinations):
    if isinstance(tensor, (float, int)):
      return tensor
    return self._ops_for(tensor).broadcast(tensor, self._destination_devices(destinations))

  def gather_to(self, value, destinations, axis, options=None):
    del options
    if not isinstance(value, tf.distribute.DistributedValues):
      return value
    cross_device_ops_lib.check_not_sparse(value.values)
    destinations = self._destination_devices(destinations)
    with tf.device(cross_device_ops_lib.devices_of(destinations)[0]):
      gathered = tf.concat(list(value.values), axis=axis)
    return cross_device_ops_lib.simple_broadcast(gathered, destinations)

  def _ops_for(self, value):
    """The algorithm for `value`: int32 goes through one device, as in TF."""
    components = values_lib.local_results(value, 1)
    cross_device_ops_lib.check_not_sparse(components)
    if any(getattr(c, "dtype", None) == tf.int32 for c in components):
      return self._host_ops
    return self.cross_device_ops

  def _placed(self, value, ops):
    """`value` with each component on its replica's device, where `ops`
    all-reduces in place (components may be made anywhere)."""
    if (not cross_device_ops_lib.all_reduces_in_place(ops) or not self._is_per_replica(value)):
      return value
    devices = self.layout.devices
    if all(c.device and device_util.canonicalize(c.device) == d
           for c, d in zip(value.values, devices)):
      return value
    return type(value)([device_util.on_device(c, d) for c, d in zip(value.values, devices)])

  def _is_per_replica(self, value):
    return (isinstance(value, values_lib.DistributedValues) and
            not values_lib.is_distributed_variable(value) and
            len(value.values) == len(self.layout.devices))

  def _destination_devices(self, destinations):
    """The replicas' devices for a per-replica `destinations`."""
    return self.layout.devices if self._is_per_replica(destinations) else destinations

  def _refuse_other_workers(self, destinations):
    if self.layout.task_type is None or destinations is None:
      return
    for device in cross_device_ops_lib.devices_of(destinations):
      spec = tf.DeviceSpec.from_string(device)
      if spec.job == self.layout.task_type and spec.task != self.layout.task_id:
        raise ValueError(f"Cannot reduce to another worker: {device!r}, "
                         f"current worker is {self.layout.input_host!r}")


def _is_mirrored(value):
  return isinstance(value, (values_lib.Mirrored, distributed_variables.MirroredVariable))


def _is_all_zero(value):
  try:
    return bool(np.all(np.asarray(value) == 0))
  except (TypeError, ValueError):
    return False


def default_cross_device_ops(devices):
  """GPUs: NCCL collectives, as in TensorFlow; others reduce on one device
  (1.3x a plain sum, where TensorFlow's ring takes 3-4x; float results are
  those of its `ReductionToOneDevice`)."""
  missing = [d for d in devices if not device_util.is_present(d)]
  if missing:
    tf.get_logger().warning(
        "MirroredStrategy devices %s are not present on this machine: "
        "TensorFlow places their ops on available devices instead (soft "
        "placement), and reductions use ReductionToOneDevice.",
        ", ".join(missing))
    return cross_device_ops_lib.ReductionToOneDevice()
  types = {device_util.device_type(d) for d in devices}
  if types != {"GPU"}:
    return cross_device_ops_lib.ReductionToOneDevice()
  if len(tf.config.list_physical_devices("GPU")) >= len(tf.config.list_logical_devices("GPU")):
    implementation = CommunicationImplementation.NCCL
  else:
    implementation = CommunicationImplementation.RING
  return cross_device_ops_lib.CollectiveAllReduce(
      devices, options=CommunicationOptions(implementation=implementation))


def reduce_along_axis(reduce_op, components, axis, across=None):
  """`Strategy.reduce` along `axis` of this process's `components`; `across`
  sums the total and count over processes holding other replicas."""
  with tf.device(device_util.current() or "/device:CPU:0"):
    tensors = [c if isinstance(c, tf.Tensor) else tf.convert_to_tensor(c) for c in components]
    axes = _checked_axes(axis, tensors[0])
    parts = _joined(tensors, axes)
    if across is None and len(parts) == 1 and (
        reduce_op == ReduceOp.SUM or parts[0].dtype.is_floating):
      reduce = tf.reduce_sum if reduce_op == ReduceOp.SUM else tf.reduce_mean
      return reduce(parts[0], axis=axes)
    total = tf.math.add_n([tf.reduce_sum(p, axis=axes) for p in parts])
    if across is not None:
      total = across(total)
    if reduce_op == ReduceOp.SUM:
      return total
    counts = [_element_count(p, axes) for p in parts]
    if all(isinstance(c, int) for c in counts):
      count = sum(counts)
    else:
      count = tf.math.add_n([tf.cast(c, tf.int64) for c in counts])
    if across is not None:
      count = across(tf.cast(count, tf.int64))
    return tf.math.truediv(total, tf.cast(count, total.dtype))


def _joined(tensors, axes):
  """`[tf.concat(tensors)]` along the first of `axes` where the other
  dimensions agree statically, else `tensors`."""
  if len(tensors) == 1:
    return tensors
  dims = [t.shape.as_list() if t.shape.rank is not None else None for t in tensors]
  if dims[0] is None:
    return tensors
  first = (axes[0] if isinstance(axes, list) else axes) % len(dims[0])
  rest = [None if d is None else d[:first] + d[first + 1:] for d in dims]
  if None in rest[0] or any(r != rest[0] for r in rest[1:]):
    return tensors
  return [tf.concat(tensors, axis=first)]


def _checked_axes(axis, tensor):
  """`axis` validated against `tensor`'s rank, its ints as Python ints."""
  axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
  rank = tensor.shape.rank
  for a in axes:
    if not isinstance(a, numbers.Integral) or isinstance(a, bool):
      raise TypeError(f"`axis` must be None, an int or a list of ints; got {axis!r}.")
    if rank is not None and not -rank <= a < rank:
      raise ValueError(f"`axis` = {axis!r} out of range for `value` with "
                       f"rank {rank} (shape {tensor.shape}).")
  axes = [int(a) for a in axes]
  if rank is not None and len({a % rank for a in axes}) < len(axes):
    raise ValueError(f"`axis` = {axis!r} names an axis more than once.")
  return axes if isinstance(axis, (list, tuple)) else axes[0]


def _element_count(tensor, axes):
  """How many elements `reduce_sum(tensor, axes)` adds into each result."""
  axes = axes if isinstance(axes, list) else [axes]
  count = 1
  for a in axes:
    dim = tf.compat.dimension_value(tensor.shape[a]) if tensor.shape.rank is not None else None
    if dim is None:
      return tf.reduce_prod([tf.shape(tensor, out_type=tf.int64)[a] for a in axes])
    count *= dim
  return count


class ClusterCommunicator(Communicator):
  """Reductions across workers, with collective ops in two groups: the
  replicas (per-replica values) and the workers' input hosts (other values,
  the chief's initial values, input sync)."""

  def __init__(self, layout, options):
    if not options.timeout_seconds:
      options = CommunicationOptions(options.bytes_per_pack,
                                     DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
                                     options.implementation)
    replicas_key = cross_device_ops_lib.next_group_key(across_workers=True)
    workers_key = cross_device_ops_lib.next_group_key(across_workers=True)
    super().__init__(layout, cross_device_ops_lib.CollectiveAllReduce(
        layout.devices, layout.num_replicas, options, replicas_key))
    self._worker_ops = cross_device_ops_lib.CollectiveAllReduce(
        [self._host], layout.num_workers, options, workers_key)
    # Each group's size and the index of its first member in this process.
    self._groups = {self.cross_device_ops: (layout.num_replicas, layout.replica_offset),
                    self._worker_ops: (layout.num_workers, layout.worker_index)}

  _host = property(lambda self: device_util.canonicalize(self.layout.input_host))

  def reduce_to(self, reduce_op, value, destinations, options):
    if reduce_op == ReduceOp.MEAN and _is_mirrored(value):
      return value
    return self.batch_reduce_to(reduce_op, [(value, destinations)], options)[0]

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options):
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
          summed = [_mean_in_dtype(s, self._groups[ops][0]) for s in summed]
        value, destinations = value_destination_pairs[index]
        results[index] = self._onto(summed, destinations, value)
    return results

  def gather_to(self, value, destinations, axis, options=None):
    ops, components = self._collective_inputs(value, dense=True)
    gathered = self._all_gather(ops, components, axis, options)
    return self._onto(gathered, destinations, value)

  def any_worker(self, flag):
    """Whether `flag` (this worker's boolean) is true on any worker."""
    with tf.device(self._host):
      mine = tf.cast(flag, tf.int32)
    return self._sum_over_workers(mine) > 0

  def from_chief(self, tensor):
    """The chief's `tensor` on every worker (strings: each worker's own)."""
    if not _summable_dtype(tensor.dtype):
      return tensor
    with tf.device(self._host):
      mine = tf.identity(tensor) if self.layout.is_chief else tf.zeros_like(tensor)
    return self._sum_over_workers(mine)

  def _sum_over_workers(self, tensor):
    (total,) = self._sum_over(self._worker_ops, [[tensor]], None)[0]
    return total

  def _collective_inputs(self, value, dense=False):
    """The collective group of `value` and its components on this process's
    members' devices (IndexedSlices made dense if `dense`)."""
    def on(component, device):
      if dense and isinstance(component, tf.IndexedSlices):
        with tf.device(device):
          component = tf.convert_to_tensor(component)
      return device_util.on_device(component, device)
    devices = self.layout.devices
    if (isinstance(value, tf.distribute.DistributedValues) and len(value.values) == len(devices)):
      return self.cross_device_ops, [on(c, d) for c, d in zip(value.values, devices)]
    return self._worker_ops, [on(value, self._host)]

  def _reduce_indexed_slices(self, reduce_op, ops, components, options):
    """IndexedSlices summed as TensorFlow does: every member's gathered."""
    slices = []
    for c in components:
      with tf.device(c.device):
        slices.append(c if isinstance(c, tf.IndexedSlices)
                      else cross_device_ops_lib.as_indexed_slices(c))
    values = self._all_gather(ops, [s.values for s in slices], 0, options)
    indices = self._all_gather(ops, [s.indices for s in slices], 0, options)
    if reduce_op == ReduceOp.MEAN:
      values = [_mean_in_dtype(v, self._groups[ops][0]) for v in values]
    return [tf.IndexedSlices(v, i, s.dense_shape) for v, i, s in zip(values, indices, slices)]

  def _sum_over(self, ops, values, options):
    """Per list of components in `values`, its sums over `ops`' group."""
    casts = [[_summable(c) for c in components] for components in values]
    per_replica = [values_lib.PerReplica(components) for components in casts]
    summed = ops.batch_reduce_implementation(ReduceOp.SUM, [(v, v) for v in per_replica], options)
    return [[tf.cast(s, c.dtype) if s.dtype != c.dtype else s
             for s, c in zip(values_lib.local_results(total, len(components)), components)]
            for total, components in zip(summed, values)]

  def _all_gather(self, ops, components, axis, options):
    """The group's components concatenated along `axis`: each padded with
    zeros around its place, then summed."""
    axis = axis % components[0].shape.rank if components[0].shape.rank else axis
    group_size, first = self._groups[ops]
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
    """This process's results on `destinations` (one: a tensor)."""
    if destinations is value or self._is_per_replica(destinations):
      devices = self.layout.devices
    else:
      devices = cross_device_ops_lib.devices_of(destinations)
    by_device = {device_util.canonicalize(t.device): t for t in per_device if t.device}
    placed = [by_device.get(d) if d in by_device else
              device_util.on_device(per_device[0], d, copy=True) for d in devices]
    return placed[0] if len(placed) == 1 else values_lib.Mirrored(placed)


def _summable_dtype(dtype):
  return dtype in _SUMMABLE or dtype.is_integer or dtype.is_bool


def _summable(tensor):
  """`tensor` in a dtype collectives add (other integers, bools: int64)."""
  if tensor.dtype in _SUMMABLE:
    return tensor
  if _summable_dtype(tensor.dtype):
    with tf.device(tensor.device):
      return tf.cast(tensor, tf.int64)
  raise TypeError(
      f"Cannot reduce a {tensor.dtype.name} tensor across workers: collective "
      f"ops add {', '.join(d.name for d in _SUMMABLE)} (and other integer or "
      f"boolean tensors, as int64).")


def _mean_in_dtype(total, count):
  """`total / count` in `total`'s dtype (integers floor-divided)."""
  with tf.device(total.device):
    if total.dtype.is_floating:
      return total / tf.cast(count, total.dtype)
    return total // count


class TPUCommunicator(Communicator):
  """A TPU strategy's reductions: inside a step (`tpu_step()`), the step
  reduces what every replica traced once."""

  def __init__(self, layout, tpu_step):
    super().__init__(layout)
    self._tpu_step = tpu_step

  def reduce_to(self, reduce_op, value, destinations, options):
    step = self._tpu_step()
    if step is not None and not isinstance(value, tf.distribute.DistributedValues):
      return step.all_reduce(reduce_op, value)
    return super().reduce_to(reduce_op, value, destinations, options)

  def batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    if self._tpu_step() is not None:
      return [self.reduce_to(reduce_op, v, d, options) for v, d in value_destination_pairs]
    return super().batch_reduce_to(reduce_op, value_destination_pairs, options)
