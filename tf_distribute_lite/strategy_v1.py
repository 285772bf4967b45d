"""The compat.v1 adapter: `StrategyV1` (`reduce`'s `axis` defaults to None,
no `gather`), the `compat.v1` strategies (TF 1.x constructors over the TF
2.x strategies' parts), `ReplicaContextV1` and `get_loss_reduction`."""

import tensorflow as tf

from tf_distribute_lite import central_storage_strategy
from tf_distribute_lite import collective_all_reduce_strategy
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite import one_device_strategy
from tf_distribute_lite import replica_context
from tf_distribute_lite import tpu_strategy
from tf_distribute_lite.collective_util import CommunicationImplementation
from tf_distribute_lite.collective_util import CommunicationOptions
from tf_distribute_lite.reduce_util import ReduceOp


class StrategyV1(distribute_lib.StrategyBase, stands_for=tf.compat.v1.distribute.Strategy):
  """`tf.compat.v1.distribute.Strategy`: `reduce`'s `axis` defaults to None.

  >>> strategy = tf_distribute_lite.compat.v1.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> iterator = strategy.make_dataset_iterator(tf.data.Dataset.range(4).batch(4))
  >>> strategy.reduce("SUM", strategy.experimental_run(tf.reduce_sum, iterator))
  <tf.Tensor: shape=(), dtype=int64, numpy=6>
  """

  def reduce(self, reduce_op, value, axis=None):
    return super().reduce(reduce_op, value, axis)

  def experimental_make_numpy_dataset(self, numpy_input, session=None):
    return self._extended.experimental_make_numpy_dataset(numpy_input, session)


class ReplicaContextV1(replica_context.ReplicaContextBase,
                       stands_for=tf.compat.v1.distribute.ReplicaContext):
  """`tf.compat.v1.distribute.ReplicaContext` (no `all_gather`); strategies
  use TF 2.x ones, as in TensorFlow.

  >>> isinstance(tf_distribute_lite.get_replica_context(), ReplicaContextV1)
  False
  """


def get_loss_reduction():
  """How TF 1.x optimizers combine the replicas' gradients: always `SUM`.

  >>> get_loss_reduction()
  <ReduceOp.SUM: 'SUM'>
  """
  return ReduceOp.SUM


class MirroredStrategyV1(StrategyV1, stands_for=tf.compat.v1.distribute.MirroredStrategy):
  """`MirroredStrategy` with the TF 1.x API.

  >>> strategy = MirroredStrategyV1(["CPU:0", "CPU:1"])
  >>> strategy.reduce("MEAN", strategy.run(lambda: tf.constant(3.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=3.0>
  """

  def __init__(self, devices=None, cross_device_ops=None):
    super().__init__(mirrored_strategy.make_extended(self, devices, cross_device_ops))


class OneDeviceStrategyV1(StrategyV1, stands_for=tf.compat.v1.distribute.OneDeviceStrategy):
  """`OneDeviceStrategy` with the TF 1.x API.

  >>> OneDeviceStrategyV1("/cpu:0").reduce("SUM", tf.constant(1.0))
  <tf.Tensor: shape=(), dtype=float32, numpy=1.0>
  """

  def __init__(self, device):
    super().__init__(one_device_strategy.OneDeviceExtended(self, device))


class CentralStorageStrategyV1(
    StrategyV1, stands_for=tf.compat.v1.distribute.experimental.CentralStorageStrategy):
  """`CentralStorageStrategy` with the TF 1.x API.

  >>> strategy = CentralStorageStrategyV1(["CPU:0", "CPU:1"])
  >>> strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  """

  def __init__(self, compute_devices=None, parameter_device=None):
    super().__init__(central_storage_strategy.ParameterServerStrategyExtended(
        self, compute_devices, parameter_device))


class CollectiveAllReduceStrategyV1(
    StrategyV1, stands_for=tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy):
  """`MultiWorkerMirroredStrategy` with the TF 1.x API.

  >>> strategy = CollectiveAllReduceStrategyV1()
  >>> strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)))
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  """

  def __init__(self, communication=CommunicationImplementation.AUTO, cluster_resolver=None):
    super().__init__(collective_all_reduce_strategy.CollectiveAllReduceExtended(
        self, cluster_resolver, CommunicationOptions(implementation=communication)))


class TPUStrategyV1(tpu_strategy.TPUMethods, StrategyV1,
                    stands_for=tf.compat.v1.distribute.experimental.TPUStrategy):
  """`TPUStrategy` with the TF 1.x API.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> TPUStrategyV1(resolver, steps_per_run=5).steps_per_run
  5
  """

  def __init__(self, tpu_cluster_resolver=None, steps_per_run=None, device_assignment=None):
    super().__init__(tpu_strategy.TPUExtended(self, tpu_cluster_resolver, steps_per_run,
                                              device_assignment, False))

  steps_per_run = property(lambda self: self._extended.steps_per_run,
                           doc="Steps each host loop runs.")
