"""Cross-device ops: one class per reduction algorithm, and helpers on
devices and values. All-reduces apply where the destinations are the
values' devices, else they reduce on one device."""

import itertools
import threading

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import device_util
from tf_distribute_lite import values as values_lib
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.tf_classes import StandsFor


# --- Destinations and values.

def devices_of(destinations):
  """The canonical devices that `destinations` names: a device string or a
  sequence of them, or the devices of a (distributed) value or variable.

  >>> devices_of("cpu:0")
  ('/job:localhost/replica:0/task:0/device:CPU:0',)
  """
  if isinstance(destinations, str):
    devices = (destinations,)
  elif isinstance(destinations, tf.distribute.DistributedValues):
    # Components without a device (tf.function arguments) count as CPU:0.
    devices = tuple(v.device or "/device:CPU:0" for v in destinations.values)
  elif isinstance(destinations, (list, tuple)) and all(isinstance(d, str) for d in destinations):
    devices = tuple(destinations)
  elif isinstance(destinations, (tf.Tensor, tf.Variable, tf.IndexedSlices)):
    devices = (destinations.device,)
  else:
    raise ValueError(
        "destinations must be one of a `DistributedValues` object, a "
        "tf.Variable object, or a device string; got "
        f"{type(destinations).__name__}: {destinations!r}.")
  if not devices or not all(devices):
    raise ValueError(f"destinations can not be empty; got {destinations!r}.")
  return tuple(device_util.canonicalize(d) for d in devices)


def as_per_replica(value):
  """`value` as a distributed value: a plain tensor becomes one component."""
  if not isinstance(value, values_lib.DistributedValues):
    value = values_lib.PerReplica(
        value.values if isinstance(value, tf.distribute.DistributedValues) else (value,))
  check_not_sparse(value.values)
  return value


class SparseAcrossReplicasError(ValueError, AttributeError):
  """A `tf.SparseTensor` reduced across replicas: TensorFlow raises either
  class, depending on the strategy."""


def check_not_sparse(components):
  """Raises `SparseAcrossReplicasError` if several replicas' `components`
  include a `tf.SparseTensor` (one replica's passes, as in TensorFlow).

  >>> check_not_sparse([tf.sparse.eye(2), tf.sparse.eye(2)])
  Traceback (most recent call last):
  ...
  tf_distribute_lite.cross_device_ops.SparseAcrossReplicasError: Reducing or gathering a tf.SparseTensor across replicas is not supported; got the per-replica components [SparseTensor(shape=(2, 2), dtype=float32), SparseTensor(shape=(2, 2), dtype=float32)]. Convert them with tf.sparse.to_dense first, or pass a tf.IndexedSlices.
  """
  if len(components) > 1 and any(isinstance(c, tf.SparseTensor) for c in components):
    described = ", ".join(
        f"SparseTensor(shape={tuple(c.shape)}, dtype={c.dtype.name})"
        if isinstance(c, tf.SparseTensor) else type(c).__name__ for c in components)
    raise SparseAcrossReplicasError(
        f"Reducing or gathering a tf.SparseTensor across replicas is not "
        f"supported; got the per-replica components [{described}]. Convert "
        f"them with tf.sparse.to_dense first, or pass a tf.IndexedSlices.")


def check_cross_device_ops(ops, argument="cross_device_ops"):
  """Raises `TypeError` unless `ops` is None or has `CrossDeviceOps`'s
  `reduce`, `batch_reduce` and `broadcast` (TensorFlow 2.21 fails later).

  >>> check_cross_device_ops("nccl")
  Traceback (most recent call last):
  ...
  TypeError: `cross_device_ops` must be an instance of tf.distribute.CrossDeviceOps, such as tf.distribute.NcclAllReduce(), or None; got the str 'nccl'.
  """
  if ops is None:
    return
  if isinstance(ops, type):
    raise TypeError(
        f"`{argument}` must be an instance of tf.distribute.CrossDeviceOps, "
        f"not the class {ops.__name__}: pass {ops.__name__}() instead.")
  if not all(callable(getattr(ops, m, None)) for m in ("reduce", "batch_reduce", "broadcast")):
    raise TypeError(
        f"`{argument}` must be an instance of tf.distribute.CrossDeviceOps, "
        f"such as tf.distribute.NcclAllReduce(), or None; got the "
        f"{type(ops).__name__} {ops!r}.")


def simple_broadcast(value, destinations, always_mirrored=False):
  """`value` copied to every destination device where not there already."""
  devices = devices_of(destinations)
  if len(devices) == 1 and not always_mirrored:
    device = getattr(value, "device", None)
    if device and device_util.canonicalize(device) == devices[0]:
      return value
    return device_util.on_device(value, devices[0], copy=True)
  return values_lib.regroup([device_util.on_device(value, d, copy=True) for d in devices],
                            values_lib.Mirrored)


def mean_from_sum(total, count):
  """`total / count` on `total`'s device (IndexedSlices too); integers give
  floats, as in TensorFlow."""
  with tf.device(total.device):
    if isinstance(total, tf.IndexedSlices):
      return tf.IndexedSlices(total.values / count, total.indices, total.dense_shape)
    return total / count


def _aggregate(components, accumulation_fn):
  """Sums tensors with `accumulation_fn`; concatenates IndexedSlices."""
  if any(isinstance(c, tf.IndexedSlices) for c in components):
    slices = [c if isinstance(c, tf.IndexedSlices) else as_indexed_slices(c) for c in components]
    return tf.IndexedSlices(tf.concat([s.values for s in slices], 0),
                            tf.concat([s.indices for s in slices], 0),
                            slices[0].dense_shape)
  return accumulation_fn(list(components))


def as_indexed_slices(tensor):
  """A dense tensor as IndexedSlices of all its rows."""
  shape = tf.shape(tensor, out_type=tf.int64)
  return tf.IndexedSlices(tensor, tf.range(shape[0]), shape)


def reduce_on_device(reduce_op, value, device, accumulation_fn=tf.math.add_n):
  """Reduces the components of `value` on `device`."""
  check_not_sparse(value.values)
  with tf.device(device):
    reduced = _aggregate(value.values, accumulation_fn)
    if reduce_op == ReduceOp.MEAN:
      reduced = mean_from_sum(reduced, len(value.values))
  return reduced


class CrossDeviceOps(StandsFor, stands_for=tf.distribute.CrossDeviceOps):
  """Base class of the reduction algorithms: subclasses implement
  `reduce_implementation`, and may override the other `*_implementation`s.

  >>> ops = ReductionToOneDevice()
  >>> value = tf_distribute_lite.values.PerReplica([tf.constant(1.0), tf.constant(2.0)])
  >>> ops.reduce(tf_distribute_lite.ReduceOp.SUM, value, destinations="CPU:0")
  <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  """

  def reduce(self, reduce_op, per_replica_value, destinations, options=None):
    """Reduces `per_replica_value` onto `destinations` (several: `Mirrored`)."""
    reduce_op = ReduceOp.from_any(reduce_op)
    value = as_per_replica(per_replica_value)
    devices = devices_of(destinations)
    if len(value.values) == 1 and devices_of(value) == devices:
      return device_util.on_device(value.values[0], devices[0], copy=True)
    return self.reduce_implementation(reduce_op, value, destinations,
                                      options or CommunicationOptions())

  def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
    """Reduces each `(value, destinations)` pair; returns a list of results."""
    reduce_op = ReduceOp.from_any(reduce_op)
    pairs = _checked_pairs(value_destination_pairs)
    if all(len(v.values) == 1 and devices_of(v) == devices_of(d) for v, d in pairs):
      return [device_util.on_device(v.values[0], v.values[0].device, copy=True) for v, _ in pairs]
    return self.batch_reduce_implementation(reduce_op, pairs, options or CommunicationOptions())

  def broadcast(self, tensor, destinations):
    """Copies `tensor` to `destinations`."""
    devices_of(destinations)
    return self.broadcast_implementation(tensor, destinations)

  def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
    raise NotImplementedError(f"{type(self).__name__} must implement reduce_implementation.")

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
    return [self.reduce_implementation(reduce_op, value, destinations, options)
            for value, destinations in value_destination_pairs]

  def broadcast_implementation(self, tensor, destinations):
    return simple_broadcast(tensor, destinations, always_mirrored=True)


def _checked_pairs(value_destination_pairs):
  if not isinstance(value_destination_pairs, (list, tuple)) or not all(
      isinstance(p, (list, tuple)) and len(p) == 2 for p in value_destination_pairs):
    raise ValueError(
        "`value_destination_pairs` must be a list or a tuple of (value, "
        f"destinations) pairs; got {value_destination_pairs!r}.")
  return [(as_per_replica(v), d) for v, d in value_destination_pairs]


class ReductionToOneDevice(CrossDeviceOps, stands_for=tf.distribute.ReductionToOneDevice):
  """Reduces by copying every component to one device and adding there.

  Args:
    reduce_to_device: where to reduce; by default the first destination.
    accumulation_fn: combines a list of tensors; `tf.math.add_n` by default.

  >>> ops = ReductionToOneDevice(reduce_to_device="CPU:0")
  >>> value = tf_distribute_lite.values.PerReplica([tf.constant(1.0), tf.constant(3.0)])
  >>> ops.reduce("MEAN", value, destinations="CPU:0")
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  """

  def __init__(self, reduce_to_device=None, accumulation_fn=None):
    self.reduce_to_device = reduce_to_device
    self.accumulation_fn = accumulation_fn or tf.math.add_n

  def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
    del options
    device = self.reduce_to_device or devices_of(destinations)[0]
    reduced = reduce_on_device(reduce_op, per_replica_value, device, self.accumulation_fn)
    return self.broadcast(reduced, destinations)

  def broadcast_implementation(self, tensor, destinations):
    return simple_broadcast(tensor, destinations)


_FALLBACK = ReductionToOneDevice()


def all_reduces_in_place(ops):
  """Whether `ops` all-reduces between the values' own devices."""
  return isinstance(ops, _AllReduce)


class _AllReduce(CrossDeviceOps):
  """An all-reduce: `_all_reduce_dense(per_device, ...)` sums equally
  shaped tensors, one per device, onto each device."""

  def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
    return self.batch_reduce_implementation(
        reduce_op, [(per_replica_value, destinations)], options)[0]

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
    if not all(devices_of(v) == devices_of(d) for v, d in value_destination_pairs):
      return _FALLBACK.batch_reduce_implementation(reduce_op, value_destination_pairs, options)
    values = [v for v, _ in value_destination_pairs]
    results = [None] * len(values)
    dense = []
    for i, value in enumerate(values):
      if isinstance(value.values[0], tf.IndexedSlices):
        results[i] = _FALLBACK.reduce_implementation(reduce_op, value, value, options)
      else:
        dense.append(i)
    if dense:
      reduced = self._batch_all_reduce([values[i] for i in dense], options)
      for i, per_device in zip(dense, reduced):
        if reduce_op == ReduceOp.MEAN:
          per_device = [mean_from_sum(v, len(per_device)) for v in per_device]
        results[i] = values_lib.regroup(per_device, values_lib.Mirrored)
    return results

  def _batch_all_reduce(self, values, options):
    """Sums each distributed value in `values`; per value, per-device sums."""
    devices = devices_of(values[0])
    packs = self._packs(values, options)
    reduced = [None] * len(values)
    for pack in packs:
      per_device = [_concat_flat([values[i].values[d] for i in pack], devices[d])
                    for d in range(len(devices))] if len(pack) > 1 else [
                        values[pack[0]].values[d] for d in range(len(devices))]
      summed = self._all_reduce_dense(per_device, devices, options)
      if len(pack) == 1:
        reduced[pack[0]] = summed
        continue
      pieces = [_split_flat(s, [values[i].values[0] for i in pack], devices[d])
                for d, s in enumerate(summed)]
      for k, i in enumerate(pack):
        reduced[i] = [pieces[d][k] for d in range(len(devices))]
    return reduced

  def _packs(self, values, options):
    """Groups of indices of `values` to all-reduce as one flat tensor."""
    del options
    return [[i] for i in range(len(values))]

  def _all_reduce_dense(self, per_device, devices, options):
    raise NotImplementedError


def _concat_flat(tensors, device):
  with tf.device(device):
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def _split_flat(flat, like, device):
  with tf.device(device):
    sizes = [tf.size(t) if t.shape.num_elements() is None else t.shape.num_elements() for t in like]
    pieces = tf.split(flat, sizes)
    return [tf.reshape(p, tf.shape(t) if not t.shape.is_fully_defined() else t.shape)
            for p, t in zip(pieces, like)]


class _PackedByCount(_AllReduce):
  """An all-reduce with `num_packs` packing; a reduction onto a CPU uses
  `ReductionToOneDevice`, as in TensorFlow."""

  def __init__(self, num_packs=1):
    if num_packs < 0:
      raise ValueError(f"`num_packs` must be >= 0; got {num_packs}.")
    self.num_packs = num_packs

  def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
    if any(device_util.device_type(d) == "CPU" for d in devices_of(destinations)):
      return _FALLBACK.reduce_implementation(reduce_op, per_replica_value, destinations, options)
    return super().reduce_implementation(reduce_op, per_replica_value, destinations, options)

  def _packs(self, values, options):
    """No packing for `num_packs` 0; else one pack per dtype."""
    if self.num_packs == 0:
      return [[i] for i in range(len(values))]
    by_dtype = {}
    for i, v in enumerate(values):
      by_dtype.setdefault(v.values[0].dtype, []).append(i)
    return list(by_dtype.values())


class HierarchicalCopyAllReduce(_PackedByCount, stands_for=tf.distribute.HierarchicalCopyAllReduce):
  """Sums each half of the devices on a root, adds the two, copies the total
  back (TF 2.21 drops values for an odd number of devices). `num_packs`: 0
  all-reduces each tensor alone, else those of one dtype together.

  >>> value = tf_distribute_lite.values.PerReplica([tf.constant(1.0), tf.constant(2.0)])
  >>> HierarchicalCopyAllReduce().reduce("SUM", value, destinations="CPU:0")
  <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  """

  def __init__(self, num_packs=1):
    super().__init__(num_packs)
    self._next_root = itertools.count()

  def _all_reduce_dense(self, per_device, devices, options):
    n = len(devices)
    if n == 1:
      return [device_util.on_device(per_device[0], devices[0], copy=True)]
    halves = [range(0, (n + 1) // 2), range((n + 1) // 2, n)]
    shift = next(self._next_root)
    roots = [devices[half[shift % len(half)]] for half in halves]
    partial = []
    for half, root in zip(halves, roots):
      with tf.device(root):
        partial.append(tf.math.add_n([per_device[i] for i in half]))
    with tf.device(roots[0]):
      total = tf.math.add_n(partial)
    totals = [total, device_util.on_device(total, roots[1], copy=True)]
    return [device_util.on_device(totals[0 if i in halves[0] else 1], device, copy=True)
            for i, device in enumerate(devices)]


class NcclAllReduce(_PackedByCount, stands_for=tf.distribute.NcclAllReduce):
  """All-reduce between GPUs with NVIDIA NCCL; between other devices,
  `tf.errors.InvalidArgumentError`.

  Args:
    num_packs: as for `HierarchicalCopyAllReduce`.

  >>> NcclAllReduce(num_packs=2).num_packs
  2
  """

  def __init__(self, num_packs=1):
    super().__init__(num_packs)
    self._names = itertools.count()

  def _all_reduce_dense(self, per_device, devices, options):
    not_gpu = [d for d in devices if device_util.device_type(d) != "GPU"]
    if not_gpu:
      raise tf.errors.InvalidArgumentError(
          None, None,
          f"NcclAllReduce all-reduces between GPUs only, but the values live "
          f"on {', '.join(not_gpu)}. Use tf_distribute_lite.ReductionToOneDevice "
          f"or HierarchicalCopyAllReduce for other devices.")
    shared_name = f"tfd_nccl_{next(self._names)}"
    result = []
    for tensor, device in zip(per_device, devices):
      with tf.device(device):
        result.append(tf.raw_ops.NcclAllReduce(
            input=tensor, reduction="sum", num_devices=len(devices),
            shared_name=shared_name))
    return result


# Each CollectiveAllReduce takes its own group key; groups across workers
# count apart, so workers making the same strategies agree on their keys.
_group_keys = {False: itertools.count(7_000_000), True: itertools.count(8_000_000)}
_group_key_lock = threading.Lock()
# Instance keys are counted per group.
_FIRST_INSTANCE_KEY = 7_000_000
_INSTANCE_KEY_LIMIT = 2**31 - 1


def next_group_key(across_workers=False):
  """The next collective group key, of a local or `across_workers` group."""
  with _group_key_lock:
    return next(_group_keys[across_workers])


class CollectiveAllReduce(_AllReduce):
  """All-reduce with TensorFlow's collective ops (ordered per device, so
  they cannot deadlock) among this process's `devices` and others' in a
  group of `group_size` (default: `len(devices)`) under `group_key` (default:
  `next_group_key()`), with default `options`.

  >>> ops = CollectiveAllReduce(["CPU:0", "CPU:1"])
  >>> per_replica = []
  >>> for i, d in enumerate(["CPU:0", "CPU:1"]):
  ...   with tf.device(d):
  ...     per_replica.append(tf.constant(float(i + 1)))
  >>> value = tf_distribute_lite.values.PerReplica(per_replica)
  >>> ops.reduce("SUM", value, destinations=value)
  Mirrored:{
    0: <tf.Tensor: shape=(), dtype=float32, numpy=3.0>,
    1: <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  }
  """

  # The pack size where the options' `bytes_per_pack` is 0.
  DEFAULT_BYTES_PER_PACK = 32 * 1024 * 1024

  def __init__(self, devices, group_size=None, options=None, group_key=None):
    self._devices = tuple(device_util.canonicalize(d) for d in devices)
    self._group_size = group_size or len(self._devices)
    self._options = options or CommunicationOptions()
    self._group_key = next_group_key() if group_key is None else group_key
    self._ordering_tokens = None
    self._instance_counter = None
    self._eager_launch = tf.function(self._launch, autograph=False, reduce_retracing=True)

  def _packs(self, values, options):
    limit = self._options.merge(options).bytes_per_pack or self.DEFAULT_BYTES_PER_PACK
    packs, current, size, dtype = [], [], 0, None
    for i, v in enumerate(values):
      t = v.values[0]
      nbytes = (t.shape.num_elements() or 0) * t.dtype.size
      if current and (t.dtype != dtype or size + nbytes > limit or not t.shape.is_fully_defined()):
        packs.append(current)
        current, size = [], 0
      current.append(i)
      size += nbytes
      dtype = t.dtype
    if current:
      packs.append(current)
    return packs

  def _all_reduce_dense(self, per_device, devices, options):
    if devices != self._devices:
      raise ValueError(
          f"CollectiveAllReduce was built for devices {self._devices} but "
          f"got values on {devices}.")
    options = self._options.merge(options)
    if tf.executing_eagerly():
      # The caller differentiates all-reduce itself (ReplicaContext.all_reduce);
      # a tape must not try to differentiate the collective op inside.
      per_device = [tf.stop_gradient(t) for t in per_device]
      reduced = self._eager_launch(per_device, options.implementation.value,
                                   options.timeout_seconds or 0)
      # A function hands its outputs back on the caller's device.
      return [device_util.on_device(r, d, copy=True) for r, d in zip(reduced, devices)]
    # As TensorFlow does: a SavedModel cannot hold collective ops.
    _tf_bridge.mark_function_unsaveable(
        "It all-reduces with collective ops (CollectiveAllReduce), which a "
        "SavedModel cannot hold: save a function that does not reduce across "
        "replicas, such as one traced outside the strategy's scope.")
    return self._launch(per_device, options.implementation.value, options.timeout_seconds or 0)

  def _launch(self, per_device, implementation, timeout):
    tokens = self._tokens()
    instance_key = self._next_instance_key()
    result = []
    for tensor, device, token in zip(per_device, self._devices, tokens):
      with tf.device(device):
        result.append(tf.raw_ops.CollectiveReduceV2(
            input=tensor, group_size=self._group_size,
            group_key=self._group_key, instance_key=instance_key,
            ordering_token=[token], merge_op="Add", final_op="Id",
            communication_hint=implementation.lower(),
            timeout_seconds=float(timeout)))
    return result

  def _tokens(self):
    if self._ordering_tokens is None:
      with tf.init_scope():
        self._ordering_tokens = [_tf_bridge.plain_variable(0.0, d, "ordering_token")
                                 for d in self._devices]
    return [token.handle for token in self._ordering_tokens]

  def _next_instance_key(self):
    """A fresh instance key each time it is computed (`ResourceCountUpTo`),
    so that concurrent or looped launches of one trace never share one."""
    if self._instance_counter is None:
      host = tf.DeviceSpec.from_string(self._devices[0]).replace(device_type="CPU", device_index=0)
      with tf.init_scope():
        self._instance_counter = _tf_bridge.plain_variable(
            _FIRST_INSTANCE_KEY, host, "instance_key_counter")
    with tf.device(self._instance_counter.device):
      return tf.raw_ops.ResourceCountUpTo(
          resource=self._instance_counter.handle, limit=_INSTANCE_KEY_LIMIT, T=tf.int32)
