"""`tf.contrib.distribute` (TF 1.x): the tower API."""

from tf_distribute_lite.contrib_tower import DistributionStrategy
from tf_distribute_lite.contrib_tower import get_cross_tower_context
from tf_distribute_lite.contrib_tower import get_distribution_strategy
from tf_distribute_lite.contrib_tower import get_tower_context
from tf_distribute_lite.contrib_tower import has_distribution_strategy
from tf_distribute_lite.contrib_tower import MirroredStrategy
from tf_distribute_lite.contrib_tower import OneDeviceStrategy
from tf_distribute_lite.contrib_tower import TowerContext
from tf_distribute_lite.contrib_tower import TPUStrategy
