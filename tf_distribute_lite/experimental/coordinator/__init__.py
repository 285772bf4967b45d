"""`tf.distribute.experimental.coordinator`: the coordinator's names."""

from tf_distribute_lite.cluster_coordinator import ClusterCoordinator
from tf_distribute_lite.coordinator_values import PerWorkerValues
from tf_distribute_lite.coordinator_values import RemoteValue
