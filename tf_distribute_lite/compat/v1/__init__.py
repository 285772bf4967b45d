"""`tf.compat.v1.distribute`: the TF 1.x forms of the strategy API."""

import tensorflow as tf

from tf_distribute_lite import cluster_resolver
from tf_distribute_lite.compat.v1 import experimental
from tf_distribute_lite.contexts import has_strategy
from tf_distribute_lite.contexts import in_cross_replica_context
from tf_distribute_lite.cross_device_ops import CrossDeviceOps
from tf_distribute_lite.cross_device_ops import HierarchicalCopyAllReduce
from tf_distribute_lite.cross_device_ops import NcclAllReduce
from tf_distribute_lite.cross_device_ops import ReductionToOneDevice
from tf_distribute_lite.default_strategy import get_replica_context
from tf_distribute_lite.default_strategy import get_strategy
from tf_distribute_lite.distribute_lib import experimental_set_strategy
from tf_distribute_lite.distribute_lib import RunOptions
from tf_distribute_lite.distribute_lib import StrategyExtendedV1 as StrategyExtended
from tf_distribute_lite.input_context import InputContext
from tf_distribute_lite.input_context import InputReplicationMode
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.strategy_v1 import get_loss_reduction
from tf_distribute_lite.strategy_v1 import MirroredStrategyV1 as MirroredStrategy
from tf_distribute_lite.strategy_v1 import OneDeviceStrategyV1 as OneDeviceStrategy
from tf_distribute_lite.strategy_v1 import ReplicaContextV1 as ReplicaContext
from tf_distribute_lite.strategy_v1 import StrategyV1 as Strategy

Server = tf.distribute.Server  # TensorFlow's own gRPC server, re-exported
