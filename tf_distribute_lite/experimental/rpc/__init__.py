"""`tf.distribute.experimental.rpc`: remote calls of `tf.function`s."""

from tf_distribute_lite.rpc_ops import Client
from tf_distribute_lite.rpc_ops import Server
