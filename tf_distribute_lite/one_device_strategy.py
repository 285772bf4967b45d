"""`OneDeviceStrategy`: plain variables and one replica on one device."""

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import replica_context
from tf_distribute_lite import variable_policy
from tf_distribute_lite.layout import Layout


class OneDeviceStrategy(distribute_lib.Strategy, stands_for=tf.distribute.OneDeviceStrategy):
  """Runs on one device, with the API of the multi-replica strategies.

  Args:
    device: the device name, e.g. `"/gpu:0"` or `"CPU:1"`.

  >>> strategy = OneDeviceStrategy("/cpu:1")
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0)
  >>> v.device
  '/job:localhost/replica:0/task:0/device:CPU:1'
  >>> strategy.run(lambda: v + 1.0)
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  """

  def __init__(self, device):
    super().__init__(OneDeviceExtended(self, device))


class OneDeviceExtended(distribute_lib.StrategyExtendedV1):
  """`strategy.extended` of `OneDeviceStrategy`."""

  def __init__(self, container_strategy, device):
    self._layout = Layout((device_util.canonicalize(device),))
    super().__init__(container_strategy,
                     variable_policy.VariablePolicy(container_strategy, self._device))

  _device = property(lambda self: self._layout.devices[0])
  worker_devices = property(lambda self: self._layout.devices)

  def _call_for_each_replica(self, fn, args, kwargs):
    fn = _tf_bridge.autograph_convert(fn)
    with tf.device(self._device), _OneDeviceReplicaContext(self._container_strategy(), 0):
      return fn(*args, **kwargs)


class _OneDeviceReplicaContext(replica_context.ReplicaContext):

  @property
  def devices(self):
    self._require_current()
    return self._strategy.extended.worker_devices
