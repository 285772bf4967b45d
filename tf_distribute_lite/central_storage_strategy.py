"""`CentralStorageStrategy`: replicas as in `MirroredStrategy`, each variable
once, on the parameter device; reductions on the CPU."""

import tensorflow as tf

from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite import variable_policy
from tf_distribute_lite.layout import Layout

_LOCAL_CPU = "/device:CPU:0"


class CentralStorageStrategy(distribute_lib.Strategy,
                             stands_for=tf.distribute.experimental.CentralStorageStrategy):
  """Synchronous training on one machine with every variable on one device.

  Args:
    compute_devices: the replicas' devices; by default the GPUs, else the CPU.
    parameter_device: by default the only compute device, else the CPU.

  Takes dataset `options` (TensorFlow 2.21 raises `AttributeError`).

  >>> strategy = CentralStorageStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0, aggregation=tf.VariableAggregation.SUM)
  >>> v
  <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>
  >>> _ = strategy.run(lambda: v.assign_add(tf.constant(1.0)))
  >>> v.numpy().item()
  3.0
  """

  def __init__(self, compute_devices=None, parameter_device=None):
    super().__init__(ParameterServerStrategyExtended(self, compute_devices, parameter_device))


class ParameterServerStrategyExtended(mirrored_strategy.MirroredExtended):
  """`strategy.extended` of `CentralStorageStrategy` (named as in TensorFlow)."""

  _between_graph = True
  _task_id = None  # read by tf_keras (docs/client_private_names.md)

  def __init__(self, container_strategy, compute_devices, parameter_device):
    if compute_devices is None:
      compute_devices = device_util.local_devices("GPU") or (_LOCAL_CPU,)
    layout = Layout(mirrored_strategy.resolve_devices(compute_devices))
    on_cpu = cross_device_ops_lib.ReductionToOneDevice(
        reduce_to_device=device_util.canonicalize(_LOCAL_CPU))
    super().__init__(container_strategy, layout,
                     communicator_lib.Communicator(layout, on_cpu, on_cpu),
                     variable_policy.CentralStoragePolicy(container_strategy, parameter_device))
    self.experimental_enable_get_next_as_optional = False  # as in TensorFlow

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    # TensorFlow 2.21 fails here with an AttributeError.
    del task_type, task_id
    raise ValueError(
        f"`CentralStorageStrategy` runs on one machine and takes no cluster; "
        f"got cluster_spec={cluster_spec.as_dict()}.")

  worker_devices = property(lambda self: list(self._devices))
