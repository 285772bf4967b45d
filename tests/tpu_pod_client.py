"""The client of an emulated multi-host TPU slice (`$TPU_NAME`, e.g.
emulated:v4-32), in a fresh process: what its resolver answers, the devices
it sees once connected, and a sum across two hosts. Prints one JSON object;
tests/test_tpu_pod_emulation.py runs it.

    TPU_NAME=emulated:v4-32 python tests/tpu_pod_client.py
"""

import json

import tensorflow as tf

import tf_distribute_lite as tfd


def main():
  resolver = tfd.cluster_resolver.TPUClusterResolver()
  metadata = resolver.get_tpu_system_metadata()
  answers = {
      "cluster": resolver.cluster_spec().as_dict(), "master": resolver.master(),
      "get_master": resolver.get_master(), "task": [resolver.task_type, resolver.task_id],
      "accelerators": resolver.num_accelerators(),
      "feature_before": repr(resolver.tpu_hardware_feature),
      "metadata": [metadata.num_cores, metadata.num_hosts, metadata.num_of_cores_per_host,
                   metadata.topology.num_tasks, metadata.topology.num_tpus_per_task],
      "metadata_devices": [d.name for d in metadata.devices],
      "pids": resolver._hosts.pids,  # pylint: disable=protected-access
  }
  topology = tfd.tpu.experimental.initialize_tpu_system(resolver)
  answers["topology"] = [topology.num_tasks, topology.num_tpus_per_task,
                         topology.mesh_shape.tolist(), topology.device_coordinates.tolist()]
  answers["feature_after"] = type(resolver.tpu_hardware_feature).__name__
  answers["devices"] = [d.name for d in tf.config.list_logical_devices()]

  @tf.function
  def across_hosts():
    with tf.device("/job:worker/replica:0/task:1/device:CPU:2"):
      a = tf.constant(2.0)
    with tf.device("/job:worker/replica:0/task:3/device:CPU:1"):
      b = tf.constant(3.0)
      return a + b
  graph = across_hosts.get_concrete_function().graph
  answers["sum"] = [float(across_hosts()), sorted(
      op.device for op in graph.get_operations() if op.type in ("Const", "AddV2"))]
  answers["shared"] = tfd.cluster_resolver.TPUClusterResolver().cluster_spec().as_dict()
  print(json.dumps(answers))


if __name__ == "__main__":
  main()
