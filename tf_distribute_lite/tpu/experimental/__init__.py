"""`tf.tpu.experimental`: the TPU system functions, working with this
package's resolvers, and TensorFlow's TPU value types and TPU embedding API."""

from tensorflow.tpu import experimental as _tf_tpu_experimental

from tf_distribute_lite.tpu_device_assignment import DeviceAssignment
from tf_distribute_lite.cluster_resolver.tpu_cluster_resolver import initialize_tpu_system
from tf_distribute_lite.cluster_resolver.tpu_cluster_resolver import shutdown_tpu_system

DeviceOrderMode = _tf_tpu_experimental.DeviceOrderMode
HardwareFeature = _tf_tpu_experimental.HardwareFeature
Topology = _tf_tpu_experimental.Topology
TPUSystemMetadata = _tf_tpu_experimental.TPUSystemMetadata
embedding = _tf_tpu_experimental.embedding
