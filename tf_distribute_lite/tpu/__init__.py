"""`tf.tpu`: the TPU system functions working with this package's resolvers
(`experimental`), and TensorFlow's `XLAOptions`."""

from tensorflow import tpu as _tf_tpu

from tf_distribute_lite.tpu import experimental

XLAOptions = _tf_tpu.XLAOptions
