"""`MirroredStrategy`: synchronous data parallelism on one machine's
devices, with every variable mirrored on each."""

import tensorflow as tf

from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import executors
from tf_distribute_lite import variable_policy
from tf_distribute_lite.layout import Layout


class MirroredStrategy(distribute_lib.Strategy, stands_for=tf.distribute.MirroredStrategy):
  """Synchronous training across the devices of one machine.

  Args:
    devices: device names; None or empty: every GPU, else every CPU.
    cross_device_ops: a `CrossDeviceOps` for reductions; by default
      `communicator.default_cross_device_ops`.

  >>> strategy = MirroredStrategy(["CPU:0", "CPU:1"])
  >>> with strategy.scope():
  ...   v = tf.Variable(1.0)
  >>> [component.device[-5:] for component in v.values]
  ['CPU:0', 'CPU:1']
  """

  def __init__(self, devices=None, cross_device_ops=None):
    super().__init__(make_extended(self, devices, cross_device_ops))


def make_extended(strategy, devices, cross_device_ops):
  layout = Layout(resolve_devices(devices))
  return MirroredExtended(strategy, layout, communicator_lib.Communicator(layout, cross_device_ops))


class MirroredExtended(distribute_lib.StrategyExtendedV1):
  """`strategy.extended` of `MirroredStrategy`: a `Layout`, a
  `Communicator`, a variable policy and an executor."""

  def __init__(self, container_strategy, layout, communicator, variables=None, executor=None):
    super().__init__(container_strategy,
                     variables or variable_policy.MirroredPolicy(container_strategy))
    self._layout = layout
    self._communicator = communicator
    self._executor = executor or executors.LocalReplicas(
        container_strategy, layout.devices, first_replica=layout.replica_offset,
        num_replicas=layout.num_replicas)
    # As in TensorFlow: False when made in a TF1 graph. Users may set it.
    self.experimental_enable_get_next_as_optional = (
        tf.compat.v1.executing_eagerly_outside_functions())

  _devices = property(lambda self: self._layout.devices)
  _retrace_functions_for_each_device = property(lambda self: len(self._layout.devices) > 1)
  _is_chief = property(lambda self: self._layout.is_chief)

  worker_devices = property(lambda self: self._devices)
  _num_replicas_in_sync = property(lambda self: self._layout.num_replicas)
  _num_local_replicas = property(lambda self: len(self._devices))
  _input_host = property(lambda self: device_util.canonicalize(self._layout.input_host))

  def _get_local_replica_id(self, replica_id_in_sync_group):
    return replica_id_in_sync_group - self._layout.replica_offset

  def _call_for_each_replica(self, fn, args, kwargs):
    return self._executor.run(fn, args, kwargs)

  def _distribute_values_from_function(self, value_fn):
    return self._executor.distribute_values_from_function(value_fn)

  def _reduce_to(self, reduce_op, value, destinations, options):
    return self._communicator.reduce_to(reduce_op, value, destinations, options)

  def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    return self._communicator.batch_reduce_to(reduce_op, value_destination_pairs, options)

  def _broadcast_to(self, tensor, destinations):
    return self._communicator.broadcast_to(tensor, destinations)

  def _gather_to(self, value, destinations, axis, options=None):
    return self._communicator.gather_to(value, destinations, axis, options)

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    # TensorFlow 2.21 replicates in-graph, which needs a remote master's
    # Session (and fails on one worker with an AssertionError).
    del task_type, task_id
    raise ValueError(
        f"In-graph multi-worker training with `MirroredStrategy` is not "
        f"supported; got cluster_spec={cluster_spec.as_dict()}. Run "
        f"`MultiWorkerMirroredStrategy` on every worker instead.")

  def _update_config_proto(self, config_proto):
    updated = super()._update_config_proto(config_proto)
    updated.isolate_session_state = True
    return updated


def resolve_devices(devices):
  """Validated, canonical device names; by default the local GPUs, else CPUs."""
  if devices is None or (isinstance(devices, (list, tuple)) and not devices):
    devices = device_util.local_devices("GPU") or device_util.local_devices("CPU")
  if isinstance(devices, str):
    raise ValueError(f"`devices` must be a list of device names, not the "
                     f"string {devices!r}; did you mean [{devices!r}]?")
  resolved = tuple(device_util.canonicalize(d) for d in devices)
  seen = {}
  for given, canonical in zip(devices, resolved):
    if canonical in seen:
      raise ValueError(
          f"No duplicates allowed in `devices` argument: {seen[canonical]!r} "
          f"and {given!r} both name {canonical}.")
    seen[canonical] = given
  return resolved
