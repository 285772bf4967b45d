"""`tf.distribute.experimental.partitioners`: how variables are sharded."""

from tf_distribute_lite.partitioners import FixedShardsPartitioner
from tf_distribute_lite.partitioners import MaxSizePartitioner
from tf_distribute_lite.partitioners import MinSizePartitioner
from tf_distribute_lite.partitioners import Partitioner
