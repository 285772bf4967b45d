"""`tf.tpu.experimental`: the TPU system functions, working with this
package's resolvers, and TensorFlow's TPU value types."""

import tensorflow as tf

from tf_distribute_lite.tpu_device_assignment import DeviceAssignment
from tf_distribute_lite.tpu_system import initialize_tpu_system
from tf_distribute_lite.tpu_system import shutdown_tpu_system

Topology = tf.tpu.experimental.Topology
TPUSystemMetadata = tf.tpu.experimental.TPUSystemMetadata
