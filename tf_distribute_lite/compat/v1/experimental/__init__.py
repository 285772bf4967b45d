"""`tf.compat.v1.distribute.experimental`.

TensorFlow's `ParameterServerStrategy` is not here: TF 1.x parameter servers
(variables on `ps` tasks, workers' graphs run through a Session on a remote
master) would be a mechanism of their own, not an adapter over this
package's strategies.
"""

from tf_distribute_lite.central_storage_strategy import CentralStorageStrategyV1 as CentralStorageStrategy
from tf_distribute_lite.collective_all_reduce_strategy import CollectiveAllReduceStrategyV1 as MultiWorkerMirroredStrategy
from tf_distribute_lite.collective_util import CollectiveCommunication
from tf_distribute_lite.collective_util import CollectiveHints
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.tpu_strategy import TPUStrategyV1 as TPUStrategy
