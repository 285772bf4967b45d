"""`DeviceAssignment`: TensorFlow's, whose `build` also takes 3-element shapes."""

import tensorflow as tf


def full_computation_shape(computation_shape):
  """`computation_shape` with 4 elements: TF 2.2's `[x, y, cores]` gets `z = 1`."""
  if computation_shape is None:
    return None
  shape = [int(n) for n in computation_shape]
  if len(shape) == 3:
    return [shape[0], shape[1], 1, shape[2]]
  return shape


class DeviceAssignment(tf.tpu.experimental.DeviceAssignment):
  """TensorFlow's `DeviceAssignment`, whose `build` also takes 3-element shapes.

  >>> topology = tf_distribute_lite.tpu_emulation.PRESETS["v3-8"].topology()
  >>> assignment = DeviceAssignment.build(topology, computation_shape=[1, 1, 2],
  ...                                     num_replicas=4)
  >>> assignment.num_replicas, assignment.num_cores_per_replica
  (4, 2)
  """

  @staticmethod
  def build(topology, computation_shape=None, computation_stride=None,
            num_replicas=1, device_order_mode=None):
    """TensorFlow's `DeviceAssignment.build`, taking 3-element shapes too."""
    kwargs = {} if device_order_mode is None else {"device_order_mode": device_order_mode}
    return tf.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=full_computation_shape(computation_shape),
        computation_stride=full_computation_shape(computation_stride),
        num_replicas=num_replicas, **kwargs)
