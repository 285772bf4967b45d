"""Emulated TPU slices: their topologies work with TensorFlow's
DeviceAssignment as a TPU's do."""

import pytest
import tensorflow as tf

from tf_distribute_lite import tpu_emulation


@pytest.mark.parametrize("name, mesh, cores, hosts", [
    ("v2-8", [2, 2, 1, 2], 8, 1), ("v3-8", [2, 2, 1, 2], 8, 1), ("v4-8", [2, 2, 1, 1], 4, 1),
    ("v5litepod-8", [2, 4, 1, 1], 8, 1), ("v4-16", [2, 2, 2, 1], 8, 2),
    ("v4-32", [2, 2, 4, 1], 16, 4), ("v3-32", [4, 4, 1, 2], 32, 4),
    ("v5litepod-16", [4, 4, 1, 1], 16, 4)])
def test_presets_have_their_tpus_mesh(name, mesh, cores, hosts):
  tpu_slice = tpu_emulation.parse(f"emulated:{name}")
  topology = tpu_slice.topology()
  assert topology.mesh_shape.tolist() == mesh
  assert (tpu_slice.num_cores, topology.num_tasks, topology.num_tpus_per_task) == (
      cores, hosts, cores // hosts)
  assert len(set(tpu_slice.devices)) == cores
  coordinates = [tuple(c) for c in tpu_slice.device_coordinates()]
  assert len(set(coordinates)) == cores  # each core once
  assert all(0 <= c[i] < mesh[i] for c in coordinates for i in range(4))
  assignment = tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[1, 1, 1, mesh[3]], num_replicas=cores // mesh[3])
  cores_used = sorted(
      (topology.task_ordinal_at_coordinates(assignment.coordinates(r, c)),
       assignment.tpu_ordinal(r, c))
      for r in range(assignment.num_replicas) for c in range(assignment.num_cores_per_replica))
  assert cores_used == [(task, i) for task in range(hosts) for i in range(cores // hosts)]


@pytest.mark.parametrize("name, chips_per_host", [
    ("v4-32", (2, 2, 1)), ("v3-32", (2, 2, 1)), ("v5litepod-16", (2, 2, 1))])
def test_each_host_holds_a_box_of_chips_and_hosts_tile_the_mesh(name, chips_per_host):
  topology = tpu_emulation.PRESETS[name].topology()
  for task in range(topology.num_tasks):
    chips = {tuple(c[:3]) for c in topology.device_coordinates[task].tolist()}
    low = [min(c[i] for c in chips) for i in range(3)]
    assert chips == {(low[0] + x, low[1] + y, low[2] + z) for x in range(chips_per_host[0])
                     for y in range(chips_per_host[1]) for z in range(chips_per_host[2])}
    assert [topology.task_ordinal_at_coordinates(c) for c in
            topology.device_coordinates[task]] == [task] * topology.num_tpus_per_task
  assert topology.device_coordinates[1, 0].tolist() == {
      "v4-32": [0, 0, 1, 0], "v3-32": [2, 0, 0, 0], "v5litepod-16": [2, 0, 0, 0]}[name]
  assert tpu_emulation.PRESETS[name].devices[topology.num_tpus_per_task] == (
      "/job:worker/replica:0/task:1/device:CPU:0")


def test_the_cores_of_a_chip_are_neighbours():
  assert tpu_emulation.PRESETS["v3-8"].device_coordinates()[:4] == [
      [0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]


@pytest.mark.parametrize("name", ["my-tpu", "local", "grpc://10.0.0.2:8470", None, b"x"])
def test_other_names_are_not_emulated(name):
  assert tpu_emulation.parse(name) is None


def test_a_slice_that_fits_the_devices_needs_nothing_more():
  tpu_emulation.PRESETS["v4-8"].ensure_devices()  # 4 devices, as tests have
  assert len(tf.config.list_logical_devices("CPU")) >= 4
