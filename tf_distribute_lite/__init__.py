"""tf_distribute_lite: TensorFlow's `tf.distribute` API, re-implemented.

Use it where you would use `tf.distribute`:

>>> import tf_distribute_lite as tfd
>>> strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
>>> with strategy.scope():
...   v = tf.Variable(2.0)
>>> strategy.reduce(tfd.ReduceOp.SUM, strategy.run(lambda: v * 1.0), axis=None)
<tf.Tensor: shape=(), dtype=float32, numpy=4.0>
"""

import tensorflow as tf

from tf_distribute_lite import _client_shims
from tf_distribute_lite import cluster_resolver
from tf_distribute_lite import compat
from tf_distribute_lite import contrib
from tf_distribute_lite import coordinator
from tf_distribute_lite import experimental
from tf_distribute_lite import tpu
from tf_distribute_lite import values
from tf_distribute_lite.contexts import has_strategy
from tf_distribute_lite.contexts import in_cross_replica_context
from tf_distribute_lite.collective_all_reduce_strategy import CollectiveAllReduceStrategy as MultiWorkerMirroredStrategy
from tf_distribute_lite.cross_device_ops import CrossDeviceOps
from tf_distribute_lite.cross_device_ops import HierarchicalCopyAllReduce
from tf_distribute_lite.cross_device_ops import NcclAllReduce
from tf_distribute_lite.cross_device_ops import ReductionToOneDevice
from tf_distribute_lite.default_strategy import get_replica_context
from tf_distribute_lite.default_strategy import get_strategy
from tf_distribute_lite.distribute_lib import experimental_set_strategy
from tf_distribute_lite.distribute_lib import RunOptions
from tf_distribute_lite.distribute_lib import Strategy
from tf_distribute_lite.distribute_lib import StrategyExtended
from tf_distribute_lite.input_context import InputContext
from tf_distribute_lite.input_context import InputOptions
from tf_distribute_lite.input_context import InputReplicationMode
from tf_distribute_lite.input_lib import DistributedDataset
from tf_distribute_lite.input_lib import DistributedIterator
from tf_distribute_lite.mirrored_strategy import MirroredStrategy
from tf_distribute_lite.one_device_strategy import OneDeviceStrategy
from tf_distribute_lite.parameter_server_strategy import ParameterServerStrategyV2 as ParameterServerStrategy
from tf_distribute_lite.reduce_util import ReduceOp
from tf_distribute_lite.replica_context import ReplicaContext
from tf_distribute_lite.tpu_strategy import TPUStrategyV2 as TPUStrategy
from tf_distribute_lite.values import DistributedValues

Server = tf.distribute.Server  # TensorFlow's own gRPC server, re-exported

__version__ = "0.1.0"

_client_shims.install()
