"""`tf.distribute.coordinator`: parameter-server training's coordinator."""

from tf_distribute_lite.cluster_coordinator import ClusterCoordinator
from tf_distribute_lite.coordinator_values import experimental_get_current_worker_index
from tf_distribute_lite.coordinator_values import PerWorkerValues as PerWorkerValue
from tf_distribute_lite.coordinator_values import RemoteValue
