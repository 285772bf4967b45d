"""Emulated TPU slices: their topologies work with TensorFlow's
DeviceAssignment as a TPU's do."""

import pytest
import tensorflow as tf

from tf_distribute_lite import tpu_emulation


@pytest.mark.parametrize("name, mesh, cores", [
    ("v2-8", [2, 2, 1, 2], 8), ("v3-8", [2, 2, 1, 2], 8), ("v4-8", [2, 2, 1, 1], 4),
    ("v5litepod-8", [2, 4, 1, 1], 8)])
def test_presets_have_their_tpus_mesh(name, mesh, cores):
  tpu_slice = tpu_emulation.parse(f"emulated:{name}")
  topology = tpu_slice.topology()
  assert topology.mesh_shape.tolist() == mesh
  assert (tpu_slice.num_cores, topology.num_tasks, topology.num_tpus_per_task) == (cores, 1, cores)
  assert len(tpu_slice.devices) == cores
  coordinates = [tuple(c) for c in tpu_slice.device_coordinates()]
  assert len(set(coordinates)) == cores  # each core once
  assert all(0 <= c[i] < mesh[i] for c in coordinates for i in range(4))
  assignment = tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[1, 1, 1, mesh[3]], num_replicas=cores // mesh[3])
  assert sorted(assignment.tpu_ordinal(r, c) for r in range(assignment.num_replicas)
                for c in range(assignment.num_cores_per_replica)) == list(range(cores))


def test_the_cores_of_a_chip_are_neighbours():
  assert tpu_emulation.PRESETS["v3-8"].device_coordinates()[:4] == [
      [0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]


@pytest.mark.parametrize("name", ["my-tpu", "local", "grpc://10.0.0.2:8470", None, b"x"])
def test_other_names_are_not_emulated(name):
  assert tpu_emulation.parse(name) is None


def test_a_slice_that_fits_the_devices_needs_nothing_more():
  tpu_emulation.PRESETS["v4-8"].ensure_devices()  # 4 devices, as tests have
  assert len(tf.config.list_logical_devices("CPU")) >= 4
