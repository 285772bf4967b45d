"""`tf.tpu`, for the names this package provides."""

from tf_distribute_lite.tpu import experimental
