"""Legacy namespaces: `compat.v1` mirrors `tf.compat.v1.distribute`."""

from tf_distribute_lite.compat import v1
