"""`tf.compat.v1.distribute.experimental`."""

from tf_distribute_lite.collective_util import CollectiveCommunication
from tf_distribute_lite.collective_util import CollectiveHints
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
