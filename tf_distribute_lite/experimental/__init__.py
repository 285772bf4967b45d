"""`tf.distribute.experimental`: the experimental names."""

from tf_distribute_lite.collective_util import CollectiveCommunication
from tf_distribute_lite.collective_util import CollectiveHints
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.distribute_lib import ValueContext
from tf_distribute_lite.experimental import partitioners
