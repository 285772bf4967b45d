"""Tests of cross_device_ops.py: reduce, batch reduce and broadcast of every
algorithm, compared with `tf.distribute`'s own classes."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

import tf_distribute_lite as tfd
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import values as values_lib

from conftest import DEVICES
import oracle

CommunicationOptions = tfd.experimental.CommunicationOptions
CommunicationImplementation = tfd.experimental.CommunicationImplementation
REDUCE_OPS = ["SUM", "MEAN"]


def _per_replica(fn, devices=DEVICES, cls=values_lib.PerReplica):
  """A `cls` of `fn(i)` created on `devices[i]`."""
  components = []
  for i, device in enumerate(devices):
    with tf.device(device):
      components.append(fn(i))
  return cls(components)


def _per_replica_pair(fn, devices=DEVICES):
  """The same per-replica value for us and for TensorFlow."""
  return (_per_replica(fn, devices),
          _per_replica(fn, devices, cls=tf_values.PerReplica))


def _tf_op(name):
  return getattr(tf.distribute.ReduceOp, name)


def _dense(value):
  return tf.convert_to_tensor(value).numpy()


def _vector(i):
  return tf.constant([float(i + 1), 10.0 * (i + 1), -0.5 * i])


def _devices_of(value):
  if isinstance(value, tf.distribute.DistributedValues):
    return [c.device for c in value.values]
  return value.device


def _run(run_mode, fn):
  """`fn()` run by `run_mode`, and the devices of its results as built.

  A `tf.function` returns a `Mirrored` value as one tensor and every output
  on its default device, so the components cross the function boundary as
  a list and their devices are read where they are made.
  """
  built = []

  def recording():
    result = fn()
    leaves = tf.nest.flatten(result)
    built.append((result, [type(v) for v in leaves],
                  tf.nest.map_structure(_devices_of, result)))
    return [list(v.values) if isinstance(v, tf.distribute.DistributedValues)
            else v for v in leaves]
  leaves = run_mode(recording)
  structure, types, devices = built[-1]
  rebuilt = [cls(v) if issubclass(cls, tf.distribute.DistributedValues) else v
             for cls, v in zip(types, leaves)]
  return tf.nest.pack_sequence_as(structure, rebuilt), devices


def _assert_mirrored_like(ours, theirs, devices=None):
  """`ours` is a Mirrored value equal to TF's, component for component."""
  assert isinstance(ours, values_lib.Mirrored)
  assert isinstance(ours, tf.distribute.DistributedValues)
  assert type(theirs).__name__ == "Mirrored"
  if devices is not None:
    assert _devices_of(ours) == list(devices)
  assert len(ours.values) == len(theirs.values)
  for a, b in zip(ours.values, theirs.values):
    assert type(a).__name__ == type(b).__name__
    assert a.dtype == b.dtype
    np.testing.assert_allclose(_dense(a), _dense(b), rtol=1e-6)


def _collective(devices=DEVICES, options=None):
  return cross_device_ops_lib.CollectiveAllReduce(devices, options=options)


# (our class, the TF class it is compared with) for every algorithm that
# all-reduces between CPU devices.
CPU_ALGORITHMS = {
    "one_device": (tfd.ReductionToOneDevice, tf.distribute.ReductionToOneDevice),
    "hierarchical_0": (lambda: tfd.HierarchicalCopyAllReduce(num_packs=0),
                       lambda: tf.distribute.HierarchicalCopyAllReduce(num_packs=0)),
    "hierarchical_1": (lambda: tfd.HierarchicalCopyAllReduce(num_packs=1),
                       lambda: tf.distribute.HierarchicalCopyAllReduce(num_packs=1)),
    "hierarchical_2": (lambda: tfd.HierarchicalCopyAllReduce(num_packs=2),
                       lambda: tf.distribute.HierarchicalCopyAllReduce(num_packs=2)),
    "collective": (_collective, tf.distribute.ReductionToOneDevice),
}
ALL_ALGORITHMS = dict(CPU_ALGORITHMS, nccl=(tfd.NcclAllReduce,
                                            tf.distribute.NcclAllReduce))


# --- reduce.

@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(CPU_ALGORITHMS))
def test_reduce_onto_value_devices_is_mirrored(algorithm, reduce_op, run_mode):
  ours_cls, theirs_cls = CPU_ALGORITHMS[algorithm]
  ops = ours_cls()
  expected = {"SUM": [10.0, 100.0, -3.0], "MEAN": [2.5, 25.0, -0.75]}[reduce_op]

  def reduce():
    value = _per_replica(_vector)
    return ops.reduce(reduce_op, value, destinations=value)
  ours, devices = _run(run_mode, reduce)
  theirs_value = _per_replica(_vector, cls=tf_values.PerReplica)
  theirs = theirs_cls().reduce(_tf_op(reduce_op), theirs_value,
                               destinations=theirs_value)
  _assert_mirrored_like(ours, theirs)
  assert devices == _devices_of(theirs) == list(DEVICES)
  for component in ours.values:
    np.testing.assert_allclose(component.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(ALL_ALGORITHMS))
def test_reduce_onto_one_device_is_a_tensor(algorithm, reduce_op, run_mode):
  """All-reduce algorithms fall back to ReductionToOneDevice, as in TF."""
  ours_cls, theirs_cls = ALL_ALGORITHMS[algorithm]
  ops = ours_cls()
  ours, device = _run(run_mode, lambda: ops.reduce(
      reduce_op, _per_replica(_vector), destinations=DEVICES[2]))
  theirs_value = _per_replica(_vector, cls=tf_values.PerReplica)
  theirs = theirs_cls().reduce(_tf_op(reduce_op), theirs_value,
                               destinations=DEVICES[2])
  assert isinstance(ours, tf.Tensor)
  assert not isinstance(ours, tf.distribute.DistributedValues)
  assert device == theirs.device == DEVICES[2]
  np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


@pytest.mark.parametrize("algorithm", sorted(ALL_ALGORITHMS))
def test_reduce_onto_other_devices_is_mirrored_on_them(algorithm):
  """Destinations given as a distributed value on devices 1 and 3."""
  ours_cls, theirs_cls = ALL_ALGORITHMS[algorithm]
  ours_value, theirs_value = _per_replica_pair(_vector)
  ours_dest, theirs_dest = _per_replica_pair(lambda i: tf.constant(0.0),
                                 [DEVICES[1], DEVICES[3]])
  ours = ours_cls().reduce("MEAN", ours_value, destinations=ours_dest)
  theirs = theirs_cls().reduce(tf.distribute.ReduceOp.MEAN, theirs_value,
                               destinations=theirs_dest)
  _assert_mirrored_like(ours, theirs, [DEVICES[1], DEVICES[3]])


def test_reduce_accepts_reduce_op_enum_and_plain_tensor():
  ops = tfd.ReductionToOneDevice()
  with tf.device(DEVICES[1]):
    tensor = tf.constant([2.0, 4.0])
  reduced = ops.reduce(tfd.ReduceOp.MEAN, tensor, destinations=DEVICES[3])
  assert reduced.device == DEVICES[3]
  np.testing.assert_allclose(reduced.numpy(), [2.0, 4.0])
  theirs = tf.distribute.ReductionToOneDevice().reduce(
      tf.distribute.ReduceOp.MEAN, tensor, destinations=DEVICES[3])
  np.testing.assert_allclose(reduced.numpy(), theirs.numpy())


@pytest.mark.parametrize("destinations", [3, ""])
def test_reduce_rejects_bad_destinations_like_tf(destinations):
  value, theirs_value = _per_replica_pair(_vector)
  with pytest.raises(ValueError):
    tf.distribute.ReductionToOneDevice().reduce(
        tf.distribute.ReduceOp.SUM, theirs_value, destinations=destinations)
  with pytest.raises(ValueError, match="destinations"):
    tfd.ReductionToOneDevice().reduce("SUM", value, destinations=destinations)


# --- ReductionToOneDevice options.

def _ops_and_devices(fn):
  graph = fn.get_concrete_function().graph
  return [(op.type, op.device) for op in graph.get_operations()]


def test_reduce_to_device_is_where_the_sum_happens():
  """The AddN runs on `reduce_to_device`; the result goes to the destination."""
  result_devices = []

  def make_reduce(ops, cls, op):
    @tf.function
    def reduce():
      value = _per_replica(lambda i: tf.constant([float(i)]) * 2.0, cls=cls)
      result = ops.reduce(op, value, destinations=DEVICES[0])
      result_devices.append(result.device)
      return result
    return reduce

  results = {}
  for name, module, cls, op in [("ours", tfd, values_lib.PerReplica, "SUM"),
                                ("theirs", tf.distribute, tf_values.PerReplica,
                                 tf.distribute.ReduceOp.SUM)]:
    reduce = make_reduce(module.ReductionToOneDevice(reduce_to_device=DEVICES[3]),
                         cls, op)
    add_n = [d for t, d in _ops_and_devices(reduce) if t == "AddN"]
    results[name] = (add_n, reduce())
  assert results["ours"][0] == results["theirs"][0] == [DEVICES[3]]
  assert set(result_devices) == {DEVICES[0]}
  np.testing.assert_allclose(results["ours"][1].numpy(), [12.0])
  np.testing.assert_allclose(results["ours"][1].numpy(),
                             results["theirs"][1].numpy())


def test_reduce_to_device_in_eager_mode():
  ops = tfd.ReductionToOneDevice(reduce_to_device=DEVICES[2])
  value = _per_replica(_vector)
  mirrored = ops.reduce("SUM", value, destinations=value)
  assert [c.device for c in mirrored.values] == list(DEVICES)
  np.testing.assert_allclose(mirrored.values[3].numpy(), [10.0, 100.0, -3.0])
  assert ops.reduce_to_device == DEVICES[2]


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
def test_accumulation_fn_replaces_add_n(reduce_op):
  """A max "accumulation" shows the function is really used, as in TF."""
  def maximum(tensors):
    return tf.reduce_max(tf.stack(tensors), axis=0)
  ours_value, theirs_value = _per_replica_pair(lambda i: tf.constant([float(i), -float(i)]))
  ours = tfd.ReductionToOneDevice(accumulation_fn=maximum).reduce(
      reduce_op, ours_value, destinations=DEVICES[0])
  theirs = tf.distribute.ReductionToOneDevice(accumulation_fn=maximum).reduce(
      _tf_op(reduce_op), theirs_value, destinations=DEVICES[0])
  expected = {"SUM": [3.0, 0.0], "MEAN": [0.75, 0.0]}[reduce_op]
  np.testing.assert_allclose(ours.numpy(), expected)
  np.testing.assert_allclose(ours.numpy(), theirs.numpy())


def test_accumulation_fn_is_used_in_batch_reduce():
  calls = []

  def counting_add_n(tensors):
    calls.append(len(tensors))
    return tf.math.add_n(tensors)
  ops = tfd.ReductionToOneDevice(accumulation_fn=counting_add_n)
  a, b = _per_replica(_vector), _per_replica(lambda i: tf.constant(float(i)))
  results = ops.batch_reduce("SUM", [(a, a), (b, DEVICES[1])])
  assert calls == [4, 4]
  np.testing.assert_allclose(results[0].values[2].numpy(), [10.0, 100.0, -3.0])
  np.testing.assert_allclose(results[1].numpy(), 6.0)


# --- batch_reduce.

def _mixed_values(devices, cls=values_lib.PerReplica):
  """Several per-replica values of different shapes and dtypes."""
  return [
      _per_replica(lambda i: tf.reshape(tf.range(6, dtype=tf.float32), [2, 3])
                   * float(i + 1), devices, cls),
      _per_replica(lambda i: tf.constant(float(i) - 1.5), devices, cls),
      _per_replica(lambda i: tf.constant([0.25 * i] * 4, tf.float64), devices,
                   cls),
      _per_replica(lambda i: tf.constant([[float(i * i)]]), devices, cls),
  ]


def _expected_mixed(reduce_op, n):
  factor = 1.0 if reduce_op == "SUM" else 1.0 / n
  return [np.arange(6, dtype=np.float32).reshape(2, 3) * sum(range(1, n + 1)) * factor,
          sum(i - 1.5 for i in range(n)) * factor,
          np.array([0.25 * sum(range(n))] * 4) * factor,
          np.array([[sum(i * i for i in range(n))]]) * factor]


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(CPU_ALGORITHMS))
def test_batch_reduce_mixed_shapes_and_dtypes(algorithm, reduce_op, run_mode):
  ours_cls, _ = CPU_ALGORITHMS[algorithm]
  ops = ours_cls()

  def batch_reduce():
    values = _mixed_values(DEVICES)
    return ops.batch_reduce(reduce_op, [(v, v) for v in values])
  ours, devices = _run(run_mode, batch_reduce)
  # TF's own all-reduce classes cannot pack mixed dtypes; compare with
  # one-device reduction.
  theirs_values = _mixed_values(DEVICES, tf_values.PerReplica)
  theirs = tf.distribute.ReductionToOneDevice().batch_reduce(
      _tf_op(reduce_op), [(v, v) for v in theirs_values])
  assert isinstance(ours, list) and len(ours) == 4
  assert devices == [list(DEVICES)] * 4
  for result, their_result, expected in zip(ours, theirs,
                                            _expected_mixed(reduce_op, 4)):
    _assert_mirrored_like(result, their_result)
    for component in result.values:
      np.testing.assert_allclose(component.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(CPU_ALGORITHMS))
def test_batch_reduce_one_dtype_matches_the_same_tf_algorithm(algorithm,
                                                              reduce_op,
                                                              run_mode):
  ours_cls, theirs_cls = CPU_ALGORITHMS[algorithm]
  ops = ours_cls()

  def batch_reduce():
    values = [v for v in _mixed_values(DEVICES) if v.values[0].dtype == tf.float32]
    return ops.batch_reduce(reduce_op, [(v, v) for v in values])
  ours, devices = _run(run_mode, batch_reduce)
  theirs_values = [v for v in _mixed_values(DEVICES, tf_values.PerReplica)
                   if v.values[0].dtype == tf.float32]
  theirs = theirs_cls().batch_reduce(_tf_op(reduce_op),
                                     [(v, v) for v in theirs_values])
  assert len(ours) == len(theirs) == 3
  assert devices == [_devices_of(t) for t in theirs]
  for result, their_result in zip(ours, theirs):
    _assert_mirrored_like(result, their_result)


@pytest.mark.parametrize("algorithm", sorted(CPU_ALGORITHMS))
def test_batch_reduce_with_destinations_elsewhere(algorithm):
  """Pairs onto one device or other devices fall back to one-device reduction."""
  ours_cls, theirs_cls = CPU_ALGORITHMS[algorithm]
  ours_values = _mixed_values(DEVICES)
  theirs_values = _mixed_values(DEVICES, tf_values.PerReplica)
  ours = ours_cls().batch_reduce(
      "SUM", [(ours_values[0], DEVICES[1]), (ours_values[1], ours_values[1])])
  theirs = theirs_cls().batch_reduce(
      tf.distribute.ReduceOp.SUM,
      [(theirs_values[0], DEVICES[1]), (theirs_values[1], theirs_values[1])])
  assert isinstance(ours[0], tf.Tensor) and ours[0].device == DEVICES[1]
  np.testing.assert_allclose(ours[0].numpy(), theirs[0].numpy())
  _assert_mirrored_like(ours[1], theirs[1], DEVICES)


def _slices(i):
  return tf.IndexedSlices(tf.constant([[float(i + 1), 1.0]]),
                          tf.constant([i % 2], tf.int64),
                          tf.constant([3, 2], tf.int64))


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(ALL_ALGORITHMS))
def test_batch_reduce_indexed_slices(algorithm, reduce_op):
  """IndexedSlices stay IndexedSlices: the components' rows, concatenated."""
  ours_cls, theirs_cls = ALL_ALGORITHMS[algorithm]
  if algorithm == "nccl":
    theirs_cls = tf.distribute.ReductionToOneDevice
  ours_slices, theirs_slices = _per_replica_pair(_slices)
  ours = ours_cls().batch_reduce(reduce_op, [(ours_slices, ours_slices)])
  theirs = theirs_cls().batch_reduce(_tf_op(reduce_op),
                                     [(theirs_slices, theirs_slices)])
  _assert_mirrored_like(ours[0], theirs[0], DEVICES)
  expected = {"SUM": [[4.0, 2.0], [6.0, 2.0], [0.0, 0.0]],
              "MEAN": [[1.0, 0.5], [1.5, 0.5], [0.0, 0.0]]}[reduce_op]
  for component in ours[0].values:
    assert isinstance(component, tf.IndexedSlices)
    np.testing.assert_allclose(_dense(component), expected)


@pytest.mark.parametrize("algorithm", sorted(CPU_ALGORITHMS))
def test_batch_reduce_indexed_slices_next_to_dense(algorithm, run_mode):
  ours_cls, _ = CPU_ALGORITHMS[algorithm]
  ops = ours_cls()

  def batch_reduce():
    dense = _per_replica(_vector)
    slices = _per_replica(_slices)
    return ops.batch_reduce("SUM", [(dense, dense), (slices, slices)])
  (dense, slices), devices = _run(run_mode, batch_reduce)
  assert devices == [list(DEVICES)] * 2
  assert isinstance(dense, values_lib.Mirrored)
  np.testing.assert_allclose(dense.values[3].numpy(), [10.0, 100.0, -3.0])
  assert isinstance(slices.values[1], tf.IndexedSlices)
  np.testing.assert_allclose(_dense(slices.values[1]),
                             [[4.0, 2.0], [6.0, 2.0], [0.0, 0.0]])


def test_batch_reduce_rejects_pairs_that_are_not_pairs():
  value = _per_replica(_vector)
  with pytest.raises(ValueError):
    tfd.ReductionToOneDevice().batch_reduce("SUM", [value])
  with pytest.raises(ValueError):
    tf.distribute.ReductionToOneDevice().batch_reduce(
        tf.distribute.ReduceOp.SUM, [_per_replica(_vector, cls=tf_values.PerReplica)])


# --- HierarchicalCopyAllReduce on odd device counts.

@pytest.mark.parametrize("num_packs", [0, 1, 2])
@pytest.mark.parametrize("num_devices", [2, 3])
def test_hierarchical_copy_is_correct_for_any_device_count(num_packs,
                                                          num_devices,
                                                          run_mode):
  """Every device's value counts (TF 2.21 drops one of 3 devices here)."""
  devices = DEVICES[:num_devices]
  ops = tfd.HierarchicalCopyAllReduce(num_packs=num_packs)

  def batch_reduce():
    values = _mixed_values(devices)
    return ops.batch_reduce("SUM", [(v, v) for v in values] * 2)
  results, result_devices = _run(run_mode, batch_reduce)
  assert len(results) == 8
  assert result_devices == [list(devices)] * 8
  expected = _expected_mixed("SUM", num_devices) * 2
  theirs = tf.distribute.ReductionToOneDevice().batch_reduce(
      tf.distribute.ReduceOp.SUM,
      [(v, v) for v in _mixed_values(devices, tf_values.PerReplica)] * 2)
  for result, their_result, want in zip(results, theirs, expected):
    _assert_mirrored_like(result, their_result)
    for component in result.values:
      np.testing.assert_allclose(component.numpy(), want, rtol=1e-6)


def test_hierarchical_copy_rejects_negative_num_packs():
  with pytest.raises(ValueError):
    tf.distribute.HierarchicalCopyAllReduce(num_packs=-1)
  with pytest.raises(ValueError, match="-1"):
    tfd.HierarchicalCopyAllReduce(num_packs=-1)
  with pytest.raises(ValueError):
    tf.distribute.NcclAllReduce(num_packs=-1)
  with pytest.raises(ValueError, match="-1"):
    tfd.NcclAllReduce(num_packs=-1)


# --- broadcast.

@pytest.mark.parametrize("algorithm", sorted(ALL_ALGORITHMS))
def test_broadcast(algorithm, run_mode):
  ours_cls, theirs_cls = ALL_ALGORITHMS[algorithm]
  ops = ours_cls()

  def broadcast():
    with tf.device(DEVICES[0]):
      tensor = tf.constant([1.0, 2.0])
    destinations = _per_replica(lambda i: tf.constant(0.0), DEVICES[1:])
    return ops.broadcast(tensor, destinations), ops.broadcast(tensor, DEVICES[2])
  (to_many, to_one), (many_devices, one_device) = _run(run_mode, broadcast)
  with tf.device(DEVICES[0]):
    tensor = tf.constant([1.0, 2.0])
  theirs_many = theirs_cls().broadcast(
      tensor, _per_replica(lambda i: tf.constant(0.0), DEVICES[1:],
                           cls=tf_values.PerReplica))
  theirs_one = theirs_cls().broadcast(tensor, DEVICES[2])
  _assert_mirrored_like(to_many, theirs_many)
  assert many_devices == _devices_of(theirs_many) == list(DEVICES[1:])
  np.testing.assert_allclose(to_many.values[2].numpy(), [1.0, 2.0])
  assert type(to_one).__name__ == type(theirs_one).__name__
  assert isinstance(to_one, tf.Tensor)
  assert one_device == theirs_one.device == DEVICES[2]
  np.testing.assert_allclose(to_one.numpy(), [1.0, 2.0])


# --- NcclAllReduce without GPUs.

def test_nccl_all_reduce_between_cpus_raises_invalid_argument():
  ours_value, theirs_value = _per_replica_pair(_vector)
  with pytest.raises(tf.errors.InvalidArgumentError):
    tf.distribute.NcclAllReduce().batch_reduce(
        tf.distribute.ReduceOp.SUM, [(theirs_value, theirs_value)])
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    tfd.NcclAllReduce().batch_reduce("SUM", [(ours_value, ours_value)])
  message = str(error.value)
  assert "NcclAllReduce" in message
  for device in DEVICES:
    assert device in message


def test_nccl_reduce_between_cpus_falls_back_like_tf():
  """TF's `reduce` uses ReductionToOneDevice whenever a destination is a CPU."""
  ours_value, theirs_value = _per_replica_pair(_vector)
  theirs = tf.distribute.NcclAllReduce().reduce(
      tf.distribute.ReduceOp.SUM, theirs_value, destinations=theirs_value)
  ours = tfd.NcclAllReduce().reduce("SUM", ours_value, destinations=ours_value)
  _assert_mirrored_like(ours, theirs, DEVICES)


def test_nccl_reduce_onto_a_different_device_falls_back():
  ours_value, theirs_value = _per_replica_pair(_vector)
  ours = tfd.NcclAllReduce().batch_reduce(
      "MEAN", [(ours_value, DEVICES[3]), (ours_value, DEVICES[0])])
  theirs = tf.distribute.NcclAllReduce().batch_reduce(
      tf.distribute.ReduceOp.MEAN,
      [(theirs_value, DEVICES[3]), (theirs_value, DEVICES[0])])
  for a, b, device in zip(ours, theirs, [DEVICES[3], DEVICES[0]]):
    assert a.device == b.device == device
    np.testing.assert_allclose(a.numpy(), b.numpy())
    np.testing.assert_allclose(a.numpy(), [2.5, 25.0, -0.75])


GPUS = tuple(f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(4))


@pytest.mark.parametrize("num_packs", [0, 1])
def test_nccl_builds_nccl_ops_on_gpus_in_a_graph(num_packs):
  """Graph construction only: one NcclAllReduce per GPU and pack."""
  graph = tf.Graph()
  with graph.as_default():
    values = [
        _per_replica(lambda i: tf.constant([1.0, 2.0]) * float(i), GPUS),
        _per_replica(lambda i: tf.constant([[3.0]]) * float(i), GPUS),
    ]
    results = tfd.NcclAllReduce(num_packs=num_packs).batch_reduce(
        "SUM", [(v, v) for v in values])
  nccl = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
  num_all_reduces = 2 if num_packs == 0 else 1
  assert len(nccl) == 4 * num_all_reduces
  assert sorted(op.device for op in nccl) == sorted(GPUS * num_all_reduces)
  for op in nccl:
    assert op.get_attr("num_devices") == 4
    assert op.get_attr("reduction") == b"sum"
  shared_names = {op.get_attr("shared_name") for op in nccl}
  assert len(shared_names) == num_all_reduces
  for result in results:
    assert isinstance(result, values_lib.Mirrored)
    assert [c.device for c in result.values] == list(GPUS)
  assert results[1].values[0].shape == (1, 1)


@pytest.mark.parametrize("num_packs", [0, 1])
def test_nccl_graph_matches_tf(num_packs):
  """The same NcclAllReduce ops, by device and attributes, as TF builds."""
  built = []
  for module, cls, op in [(tfd, values_lib.PerReplica, "SUM"),
                          (tf.distribute, tf_values.PerReplica,
                           tf.distribute.ReduceOp.SUM)]:
    graph = tf.Graph()
    with graph.as_default():
      values = [_per_replica(lambda i: tf.constant([1.0, 2.0]), GPUS, cls),
                _per_replica(lambda i: tf.constant(3.0), GPUS, cls)]
      module.NcclAllReduce(num_packs=num_packs).batch_reduce(
          op, [(v, v) for v in values])
    built.append(sorted(
        (op.device, op.get_attr("num_devices"), op.get_attr("reduction"))
        for op in graph.get_operations() if op.type == "NcclAllReduce"))
  assert built[0] == built[1]
  assert len(built[0]) == 4 * (2 if num_packs == 0 else 1)


# --- CollectiveAllReduce.

@pytest.mark.parametrize("explicit", [True, False])
def test_collective_strategies_of_two_sizes_in_one_process(explicit, run_mode):
  """TF 2.21 fails here: a group of size 2 collides with one of size 4."""
  def make(devices):
    ops = _collective(devices) if explicit else None
    return tfd.MirroredStrategy(devices, cross_device_ops=ops)
  small, large = make(DEVICES[:2]), make(DEVICES)

  def replica_fn():
    ctx = tfd.get_replica_context()
    return ctx.all_reduce("SUM", tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)

  def run_both():
    return large.run(replica_fn), small.run(replica_fn), large.run(replica_fn)
  for _ in range(2):
    big, little, big_again = run_mode(run_both)
    assert [float(v) for v in large.experimental_local_results(big)] == [10.0] * 4
    assert [float(v) for v in small.experimental_local_results(little)] == [3.0] * 2
    assert [float(v) for v in large.experimental_local_results(big_again)] == [10.0] * 4


def test_functions_that_all_reduce_with_collectives_are_not_saved(tmp_path):
  """TF refuses to save a function traced with collective all-reduce (a
  loaded model has no group to run them in); a function that does not
  reduce across replicas is saved."""
  def snippet(strategy, name):
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    for kind, fn in (("plain", lambda: tf.constant(2.0)), ("reduced", lambda: (
        tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(2.0))))):
      module = tf.Module()
      module.f = tf.function(functools.partial(strategy.run, fn), input_signature=[])
      tf.saved_model.save(module, str(tmp_path / name / kind),
                          signatures=module.f.get_concrete_function(), options=options)
  ours = tfd.MirroredStrategy(DEVICES, cross_device_ops=_collective(DEVICES))
  oracle.compare(snippet, (oracle.tf_mirrored(), "tf"), (ours, "tfd"))
  with pytest.raises(ValueError, match="Unable to save function .*\n.*collective ops"):
    snippet(ours, "again")


def test_collective_reduce_with_two_sizes_directly():
  small, large = _collective(DEVICES[:2]), _collective(DEVICES)
  for ops, devices, expected in [(large, DEVICES, 10.0), (small, DEVICES[:2], 3.0),
                                 (large, DEVICES, 10.0)]:
    value = _per_replica(lambda i: tf.constant(float(i + 1)), devices)
    result = ops.reduce("SUM", value, destinations=value)
    assert [float(c) for c in result.values] == [expected] * len(devices)


def _many_values(cls=values_lib.PerReplica):
  return [_per_replica(lambda i, k=k: tf.fill([k + 1, 2], float(i + k)), cls=cls)
          for k in range(5)]


@pytest.mark.parametrize("bytes_per_pack", [0, 1, 24, 1 << 20])
def test_collective_packing_gives_the_same_values(bytes_per_pack, run_mode):
  ops = _collective()
  options = CommunicationOptions(bytes_per_pack=bytes_per_pack)

  def batch_reduce():
    values = _many_values()
    return ops.batch_reduce("MEAN", [(v, v) for v in values], options=options)
  packed, devices = _run(run_mode, batch_reduce)
  assert devices == [list(DEVICES)] * 5
  theirs_values = _many_values(tf_values.PerReplica)
  theirs = tf.distribute.ReductionToOneDevice().batch_reduce(
      tf.distribute.ReduceOp.MEAN, [(v, v) for v in theirs_values])
  for k, (result, their_result) in enumerate(zip(packed, theirs)):
    _assert_mirrored_like(result, their_result)
    np.testing.assert_allclose(result.values[3].numpy(),
                               np.full([k + 1, 2], 1.5 + k))


def test_eager_collective_all_reduces_of_changing_shapes_stop_retracing(caplog):
  """Eagerly, all-reduces of new shapes reuse one shape-generic function
  after the second, without TensorFlow's excessive-retracing warning."""
  ops = _collective(DEVICES[:2])
  strategy = tfd.MirroredStrategy(list(DEVICES[:2]), cross_device_ops=ops)
  for n in range(1, 8):
    result = strategy.run(lambda n=n: tfd.get_replica_context().all_reduce("SUM", tf.ones([n])))
    assert [r.numpy().tolist() for r in strategy.experimental_local_results(result)] == [
        [2.0] * n] * 2
  assert ops._eager_launch.experimental_get_tracing_count() == 2  # pylint: disable=protected-access
  assert "retracing" not in caplog.text


def _collective_op_count(ops, options):
  @tf.function
  def batch_reduce():
    values = _many_values()
    return ops.batch_reduce("SUM", [(v, v) for v in values], options=options)
  graph = batch_reduce.get_concrete_function().graph
  return sum(op.type == "CollectiveReduceV2" for op in graph.get_operations())


def test_collective_bytes_per_pack_controls_the_number_of_all_reduces():
  """Tensors of 8, 16, 24, 32, 40 bytes: one pack, or one each."""
  ops = _collective()
  assert _collective_op_count(ops, CommunicationOptions(bytes_per_pack=1)) == 5 * 4
  assert _collective_op_count(ops, CommunicationOptions(bytes_per_pack=1 << 20)) == 4
  assert _collective_op_count(ops, None) == 4
  # 8 + 16 + 24 = 48 bytes in the first pack, 32 and 40 one each.
  assert _collective_op_count(ops, CommunicationOptions(bytes_per_pack=48)) == 3 * 4


def test_collective_options_of_the_constructor_are_the_default():
  ops = _collective(options=CommunicationOptions(bytes_per_pack=1))
  assert _collective_op_count(ops, None) == 5 * 4
  assert _collective_op_count(ops, CommunicationOptions(bytes_per_pack=1 << 20)) == 4


def test_collective_ops_carry_group_size_and_ordering_tokens():
  ops = _collective()

  @tf.function
  def reduce():
    value = _per_replica(_vector)
    return ops.reduce("SUM", value, destinations=value)
  graph = reduce.get_concrete_function().graph
  collectives = [op for op in graph.get_operations()
                 if op.type == "CollectiveReduceV2"]
  assert sorted(op.device for op in collectives) == sorted(DEVICES)
  for op in collectives:
    assert len(op.inputs) == 5  # input, group size, group key, instance key, token
  result = reduce()
  assert isinstance(result, tf.Tensor)  # A Mirrored leaves a tf.function as one tensor.
  np.testing.assert_allclose(result.numpy(), [10.0, 100.0, -3.0])


def test_collective_batch_reduce_mixed_dtypes_including_integers(run_mode):
  ops = _collective()

  def batch_reduce():
    values = [_per_replica(lambda i: tf.constant([i, 2 * i], tf.int32)),
              _per_replica(lambda i: tf.constant(i, tf.int64)),
              _per_replica(lambda i: tf.constant([0.5 * i], tf.float64))]
    return ops.batch_reduce("SUM", [(v, v) for v in values])
  (ints, longs, doubles), devices = _run(run_mode, batch_reduce)
  assert devices == [list(DEVICES)] * 3
  assert ints.values[2].dtype == tf.int32
  np.testing.assert_array_equal(ints.values[2].numpy(), [6, 12])
  assert longs.values[0].dtype == tf.int64 and int(longs.values[0]) == 6
  np.testing.assert_allclose(doubles.values[3].numpy(), [3.0])


# --- CommunicationOptions and CommunicationImplementation.

def test_communication_implementation_members_match_tf():
  ours = {m.name: m.value for m in CommunicationImplementation}
  theirs = {m.name: m.value
            for m in tf.distribute.experimental.CommunicationImplementation}
  assert ours == theirs == {"AUTO": "AUTO", "RING": "RING", "NCCL": "NCCL"}
  assert tfd.experimental.CollectiveCommunication is CommunicationImplementation
  assert str(CommunicationImplementation.NCCL) == str(
      tf.distribute.experimental.CommunicationImplementation.NCCL)


@pytest.mark.parametrize("kwargs", [
    {},
    {"bytes_per_pack": 1024},
    {"bytes_per_pack": 50 * 1024 * 1024, "timeout_seconds": 120.0},
    {"implementation": "NCCL"},
    {"timeout_seconds": 5, "implementation": "RING"},
])
def test_communication_options_str_matches_tf(kwargs):
  def resolve(enum_cls):
    resolved = dict(kwargs)
    if "implementation" in resolved:
      resolved["implementation"] = enum_cls[resolved["implementation"]]
    return resolved
  ours = CommunicationOptions(**resolve(CommunicationImplementation))
  theirs = tf.distribute.experimental.CommunicationOptions(
      **resolve(tf.distribute.experimental.CommunicationImplementation))
  assert str(ours) == str(theirs)
  assert ours.bytes_per_pack == kwargs.get("bytes_per_pack", 0)
  assert ours.timeout_seconds == kwargs.get("timeout_seconds")


@pytest.mark.parametrize("kwargs", [
    {"bytes_per_pack": -1},
    {"bytes_per_pack": -1024},
    {"implementation": "bad"},
    {"implementation": 3},
    {"implementation": None},
])
def test_communication_options_validation_matches_tf(kwargs):
  with pytest.raises(ValueError):
    tf.distribute.experimental.CommunicationOptions(**kwargs)
  with pytest.raises(ValueError) as error:
    CommunicationOptions(**kwargs)
  key = next(iter(kwargs))
  assert key in str(error.value)


# --- MirroredStrategy with each algorithm: ReplicaContext.all_reduce.

STRATEGY_ALGORITHMS = {
    "one_device": (tfd.ReductionToOneDevice, tf.distribute.ReductionToOneDevice),
    "hierarchical": (tfd.HierarchicalCopyAllReduce,
                     tf.distribute.HierarchicalCopyAllReduce),
    "hierarchical_0": (lambda: tfd.HierarchicalCopyAllReduce(num_packs=0),
                       lambda: tf.distribute.HierarchicalCopyAllReduce(num_packs=0)),
    # None: TF's default collective all-reduce, in the one shared strategy
    # that may use it (see oracle.py).
    "collective": (_collective, None),
}


def _all_reduce_fn(reduce_op):
  def replica_fn():
    ctx = tf.distribute.get_replica_context()
    i = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
    value = {"vector": tf.stack([i + 1.0, 10.0 * (i + 1.0)]),
             "scalar": i * i,
             "matrix": tf.fill([2, 2], i)}
    return ctx.all_reduce(reduce_op, value)
  return replica_fn


_TF_STRATEGIES = {}


def _tf_strategy(algorithm):
  """TF's MirroredStrategy on all 4 devices with the same algorithm."""
  make_ops = STRATEGY_ALGORITHMS[algorithm][1]
  if make_ops is None:
    return oracle.tf_mirrored(DEVICES)
  if algorithm not in _TF_STRATEGIES:
    _TF_STRATEGIES[algorithm] = oracle.new_tf_mirrored(list(DEVICES), make_ops())
  return _TF_STRATEGIES[algorithm]


@pytest.mark.parametrize("reduce_op", REDUCE_OPS)
@pytest.mark.parametrize("algorithm", sorted(STRATEGY_ALGORITHMS))
def test_strategy_all_reduce_with_each_algorithm(algorithm, reduce_op, run_mode):
  strategy = tfd.MirroredStrategy(
      DEVICES, cross_device_ops=STRATEGY_ALGORITHMS[algorithm][0]())
  tf_strategy = _tf_strategy(algorithm)
  ours, devices = _run(run_mode, lambda: strategy.run(_all_reduce_fn(reduce_op)))
  theirs, their_devices = _run(run_mode, lambda: tf_strategy.run(
      _all_reduce_fn(_tf_op(reduce_op))))
  n = 1.0 if reduce_op == "SUM" else 4.0
  expected = {"vector": np.array([10.0, 100.0]) / n, "scalar": 14.0 / n,
              "matrix": np.full([2, 2], 6.0 / n)}
  for key, want in expected.items():
    assert devices[key] == their_devices[key] == list(DEVICES)
    components = strategy.experimental_local_results(ours[key])
    their_components = tf_strategy.experimental_local_results(theirs[key])
    for component, their_component in zip(components, their_components):
      np.testing.assert_allclose(component.numpy(), want, rtol=1e-6)
      np.testing.assert_allclose(component.numpy(), their_component.numpy())


@pytest.mark.parametrize("algorithm", sorted(STRATEGY_ALGORITHMS))
def test_strategy_all_reduce_gradient_with_each_algorithm(algorithm, run_mode):
  """The gradient of a SUM all-reduce is the SUM all-reduce of the gradients:
  d/dx_i of all_reduce(SUM, x_i * w_i) is 4 * w_i on replica i, as in TF."""
  strategy = tfd.MirroredStrategy(
      DEVICES, cross_device_ops=STRATEGY_ALGORITHMS[algorithm][0]())

  def replica_fn():
    ctx = tf.distribute.get_replica_context()
    x = tf.constant(1.0)
    w = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = ctx.all_reduce(tf.distribute.ReduceOp.SUM, x * w)
    return y, tape.gradient(y, x)
  y, grad = run_mode(lambda: strategy.run(replica_fn))
  tf_strategy = _tf_strategy(algorithm)
  their_y, their_grad = run_mode(lambda: tf_strategy.run(replica_fn))
  assert [float(v) for v in strategy.experimental_local_results(y)] == [10.0] * 4
  assert [float(v) for v in strategy.experimental_local_results(grad)] == [
      4.0, 8.0, 12.0, 16.0]
  assert [float(v) for v in tf_strategy.experimental_local_results(their_y)] == [10.0] * 4
  assert [float(v) for v in tf_strategy.experimental_local_results(their_grad)] == [
      4.0, 8.0, 12.0, 16.0]


def test_strategy_with_nccl_on_cpus_raises_invalid_argument(run_mode):
  strategy = tfd.MirroredStrategy(DEVICES, cross_device_ops=tfd.NcclAllReduce())
  tf_strategy = oracle.new_tf_mirrored(list(DEVICES), tf.distribute.NcclAllReduce())
  with pytest.raises(tf.errors.InvalidArgumentError):
    run_mode(lambda: tf_strategy.run(_all_reduce_fn(tf.distribute.ReduceOp.SUM)))
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    run_mode(lambda: strategy.run(_all_reduce_fn("SUM")))
  assert DEVICES[0] in str(error.value)


def test_strategy_with_nccl_reduces_to_host_by_fallback():
  """`strategy.reduce` onto the CPU host never needs NCCL, as in TF."""
  strategy = tfd.MirroredStrategy(DEVICES, cross_device_ops=tfd.NcclAllReduce())
  per_replica = strategy.run(
      lambda: tf.cast(tfd.get_replica_context().replica_id_in_sync_group,
                      tf.float32))
  assert float(strategy.reduce("SUM", per_replica, axis=None)) == 6.0
  assert float(strategy.reduce("MEAN", per_replica, axis=None)) == 1.5


# --- Sparse values.

def _sparse():
  return tf.sparse.from_dense(tf.ones([2, 2]))


def _css(api):
  return api.mod.experimental.CentralStorageStrategy(["CPU:0", "CPU:1"])


_SPARSE_ERRORS = (ValueError, AttributeError)
_SPARSE_PARTS = ["Reducing or gathering a tf.SparseTensor across replicas is not supported",
                 "SparseTensor(shape=(2, 2), dtype=float32)", "tf.sparse.to_dense"]


@pytest.mark.parametrize("snippet, theirs, ours, fragments", [
    # TF's MirroredStrategy fails on the components' missing `.device`, its
    # CentralStorageStrategy raises ValueError; ours is both.
    (lambda a: a.pair.reduce("SUM", a.pair.run(_sparse), axis=None),
     AttributeError, _SPARSE_ERRORS, _SPARSE_PARTS),
    (lambda a: tf.function(lambda: a.pair.reduce("MEAN", a.pair.run(_sparse), axis=None))(),
     AttributeError, _SPARSE_ERRORS, _SPARSE_PARTS),
    (lambda a: a.pair.run(lambda: a.mod.get_replica_context().all_reduce("SUM", _sparse())),
     AttributeError, _SPARSE_ERRORS, _SPARSE_PARTS),
    (lambda a: _css(a).reduce("SUM", _css(a).run(_sparse), axis=None),
     ValueError, _SPARSE_ERRORS, _SPARSE_PARTS),
    (lambda a: a.pair.reduce("SUM", a.pair.run(_sparse), axis=0), TypeError, TypeError,
     ["along an axis is not supported for a tf.SparseTensor", "shape (2, 2)", "axis=0"]),
], ids=["reduce", "reduce_in_function", "all_reduce", "central_storage", "along_axis"])
def test_sparse_values_across_replicas_raise_saying_so(snippet, theirs, ours, fragments):
  oracle.check_misuse(snippet, theirs, ours, fragments)


def test_one_replicas_sparse_value_reduces_to_itself_as_in_tf():
  def snippet(api):
    strategy = api.one_device()
    reduced = strategy.reduce("SUM", strategy.run(_sparse), axis=None)
    return tf.sparse.to_dense(reduced).numpy().tolist()
  assert oracle.compare(snippet, (oracle.TF,), (oracle.TFD,)) == [[1.0, 1.0], [1.0, 1.0]]


def test_every_group_has_its_own_key_and_groups_across_workers_their_own_range():
  """Collective groups of different sizes in one process never share a key;
  the keys of groups across workers follow one another whatever local
  groups are made between them, so workers that make the same multi-worker
  strategies derive the same keys."""
  first = cross_device_ops_lib.next_group_key(across_workers=True)
  collective = cross_device_ops_lib.CollectiveAllReduce
  local = [collective(DEVICES[:2]), collective(DEVICES),
           tfd.MirroredStrategy(DEVICES[:3], cross_device_ops=collective(DEVICES[:3]))]
  second = cross_device_ops_lib.next_group_key(across_workers=True)
  local_keys = {ops._group_key for ops in local[:2]}  # pylint: disable=protected-access
  local_keys.add(local[2].extended._communicator.cross_device_ops._group_key)  # pylint: disable=protected-access
  assert second == first + 1
  assert len(local_keys) == 3 and not local_keys & {first, second}


@pytest.mark.parametrize("dtype, expected", [(tf.float32, 1.5), (tf.int32, 1.5)])
def test_mean_from_sum_divides_truly_on_the_values_device(dtype, expected):
  with tf.device(DEVICES[1]):
    total = tf.constant(3, dtype)
  slices = tf.IndexedSlices(tf.constant([3.0]), tf.constant([0]), tf.constant([2]))
  mean = cross_device_ops_lib.mean_from_sum(total, 2)
  assert (mean.numpy().item(), mean.device) == (expected, DEVICES[1])
  assert cross_device_ops_lib.mean_from_sum(slices, 2).values.numpy().tolist() == [1.5]
