"""`TPUStrategy`: synchronous training on the cores of a TPU or of an emulated
slice (`TPUClusterResolver("emulated:v3-8")`), a replica per core or as a
`DeviceAssignment` says. Logical-device annotations are checked as on a TPU;
an emulated slice computes annotated tensors unsplit, with the same values.
"""

import contextlib
import inspect

import numpy as np
import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import contexts
from tf_distribute_lite import deprecation
from tf_distribute_lite import device_util
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import executors
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import mirrored_strategy
from tf_distribute_lite import tpu_pod_emulation
from tf_distribute_lite import tpu_replication
from tf_distribute_lite import tpu_system
from tf_distribute_lite import values as values_lib
from tf_distribute_lite import variable_policy
from tf_distribute_lite.cluster_resolver import TPUClusterResolver
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib
from tf_distribute_lite.layout import Layout


class TPUMethods:
  """What the TPU strategies add: run options and logical devices."""

  @property
  def cluster_resolver(self):
    """The `TPUClusterResolver` the strategy runs on."""
    return self._extended._tpu_cluster_resolver  # pylint: disable=protected-access

  def run(self, fn, args=(), kwargs=None, options=None):
    """Runs `fn` on each replica as one XLA step; `options` (`RunOptions`) say
    how `tpu.replicate` pads and partitions it. As in TensorFlow, eagerly `fn`
    must be a `tf.function` (or a concrete function, or have one as `__call__`),
    on an emulated slice too unless `TFD_EMULATED_TPU_EAGER=1` (for debugging).

    >>> TPUStrategyV2(TPUClusterResolver("emulated:v4-8")).run(lambda: tf.constant(1.0))
    Traceback (most recent call last):
    ...
    NotImplementedError: TPUStrategy.run(fn, ...) does not support pure eager execution...
    """
    self.extended._executor.refuse_pure_eager(fn)  # pylint: disable=protected-access
    _check_run_arguments(fn, args, kwargs)
    options = options or distribute_lib.RunOptions()
    if not all(hasattr(options, field) for field in distribute_lib.RunOptions._fields):
      raise TypeError(f"`options` must be a tf_distribute_lite.RunOptions; got {options!r}.")
    return super().run(fn, args, kwargs, options)

  def experimental_assign_to_logical_device(self, tensor, logical_device_id):
    """`tensor`, its ops placed on logical device `logical_device_id` of each replica."""
    extended = self.extended
    if extended._use_spmd_for_xla_partitioning:  # pylint: disable=protected-access
      raise ValueError(
          "Cannot assign a tensor to a logical device in SPMD mode. To "
          "disable SPMD, Please construct the TPUStrategy with "
          "`experimental_spmd_xla_partitioning=False`")
    count = extended.num_logical_devices_per_replica
    if not 0 <= logical_device_id < count:
      raise ValueError(
          f"`logical_core_id` to assign must be lower then total number of "
          f"logical devices per replica. Received logical device id "
          f"{logical_device_id} but there are only total of {count} logical "
          f"devices in replica.")
    return extended._annotated(tensor, "maximal", logical_device_id)  # pylint: disable=protected-access

  def experimental_split_to_logical_devices(self, tensor, partition_dimensions):
    """`tensor`, split along dimension i into `partition_dimensions[i]`
    pieces, one per logical device of the replica."""
    count = self.extended.num_logical_devices_per_replica
    shape = tensor.shape
    if len(shape) != len(partition_dimensions):
      raise ValueError(
          f"Length of `partition_dimensions` must equal to the rank of "
          f"`tensor.shape` ({len(shape)}). Received "
          f"len(partition_dimensions)={len(partition_dimensions)}.")
    for index, (size, parts) in enumerate(zip(shape, partition_dimensions)):
      if size is not None and size % parts:
        raise ValueError(
            f"Tensor shape at `partition_dimensions[{index}]` must be divisible "
            f"by corresponding value specified by `partition_dimensions` "
            f"({parts}). Received: {size}.")
    product = int(np.prod(partition_dimensions))
    if product != count:
      raise ValueError(
          f"The product of `partition_dimensions` should be the same as the "
          f"number of logical devices (={count}). Received "
          f"`partition_dimensions`={list(partition_dimensions)},and their "
          f"product is {product}.")
    return self.extended._annotated(tensor, "tiled", list(partition_dimensions))  # pylint: disable=protected-access

  def experimental_replicate_to_logical_devices(self, tensor):
    """`tensor`, all of it on every logical device of the replica."""
    return self.extended._annotated(tensor, "replicated", None)  # pylint: disable=protected-access


class TPUStrategyV2(TPUMethods, distribute_lib.Strategy, stands_for=tf.distribute.TPUStrategy):
  """Synchronous training on TPU cores.

  Args:
    tpu_cluster_resolver: a `tfd.cluster_resolver.TPUClusterResolver`; by
      default `TPUClusterResolver("")`, which finds the TPU.
    experimental_device_assignment: a `tf.tpu.experimental.DeviceAssignment`
      saying which cores each replica uses; by default one core each.
    experimental_spmd_xla_partitioning: partition with XLA SPMD.

  >>> strategy = TPUStrategyV2(tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8"))
  >>> strategy.num_replicas_in_sync, strategy.extended.num_hosts
  (4, 1)
  >>> with strategy.scope():
  ...   v = tf.Variable(2.0)
  >>> strategy.reduce("SUM", strategy.run(tf.function(lambda: v * 3.0)), axis=None)
  <tf.Tensor: shape=(), dtype=float32, numpy=24.0>
  """

  def __init__(self, tpu_cluster_resolver=None, experimental_device_assignment=None,
               experimental_spmd_xla_partitioning=False):
    super().__init__(TPUExtended(self, tpu_cluster_resolver, None,
                                 experimental_device_assignment,
                                 experimental_spmd_xla_partitioning))

  def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
    """`run` under its TF 2.0 name."""
    return self.run(fn, args, kwargs, options)


class ExperimentalTPUStrategy(TPUStrategyV2, covers_parent=True,
                              stands_for=tf.distribute.experimental.TPUStrategy):
  """Deprecated `tf.distribute.experimental.TPUStrategy` (TF 2.2, argument
  `device_assignment`); every `TPUStrategy` is one to `isinstance`, as in TF.

  >>> ExperimentalTPUStrategy(TPUClusterResolver("emulated:v4-8")).num_replicas_in_sync
  4
  """

  def __init__(self, tpu_cluster_resolver=None, device_assignment=None):
    deprecation.warn_once("tf.distribute.experimental.TPUStrategy",
                          "use tf_distribute_lite.TPUStrategy instead.")
    super().__init__(tpu_cluster_resolver, device_assignment)


ExperimentalTPUStrategy.__name__ = "TPUStrategy"


class TPUExtended(mirrored_strategy.MirroredExtended):
  """`strategy.extended` of the TPU strategies."""

  experimental_between_graph = False

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    """Ignored, as by TensorFlow: the TPU's cluster comes from its resolver."""
    del cluster_spec, task_type, task_id

  def __init__(self, container_strategy, tpu_cluster_resolver, steps_per_run,
               device_assignment, use_spmd_for_xla_partitioning):
    resolver = tpu_cluster_resolver or TPUClusterResolver("")
    _check_arguments(resolver, device_assignment, steps_per_run)
    self._tpu_cluster_resolver = resolver
    self._tpu_metadata = resolver.get_tpu_system_metadata()
    self._device_assignment = device_assignment
    # Read by TensorFlow's TPU embedding (docs/client_private_names.md):
    # each replica's cores, indexed [replica][logical core], as TF's array.
    self._tpu_devices = np.array(
        _replica_cores(resolver, self._tpu_metadata, device_assignment), dtype=object)
    self._use_spmd_for_xla_partitioning = use_spmd_for_xla_partitioning
    self._emulated = getattr(resolver, "emulated_slice", None) is not None
    self.steps_per_run = 1 if steps_per_run is None else steps_per_run
    self._logical_device = 0  # where variables go (`experimental_logical_device`)
    layout = Layout(tuple(device_util.canonicalize(cores[0]) for cores in self._tpu_devices))
    executor = executors.EmulatedTPU if self._emulated else executors.TPUReplicate
    super().__init__(container_strategy, layout,
                     communicator_lib.TPUCommunicator(layout, self._tpu_step),
                     variable_policy.TPUPolicy(container_strategy, self._tpu_step),
                     executor(container_strategy, layout.devices, device_assignment,
                              use_spmd_for_xla_partitioning))

  @property
  def worker_devices(self):
    """Each replica's core of the current `experimental_logical_device` (0)."""
    return tuple(cores[self._logical_device] for cores in self._tpu_devices)

  @contextlib.contextmanager
  def experimental_logical_device(self, logical_device_id):
    """In cross-replica context, places the variables made in it on logical
    device `logical_device_id` of each replica; in a replica, the ops made
    in it (an emulated replica computes on one device: they stay there)."""
    count = self.num_logical_devices_per_replica
    if not 0 <= logical_device_id < count:
      raise ValueError(f"`logical_device_id` not in range (was {logical_device_id}, "
                       f"but there are only {count} logical devices per replica).")
    step = self._tpu_step()
    if step is not None:
      with step.logical_device_scope(logical_device_id):
        yield
    elif contexts.in_cross_replica_context():
      previous, self._logical_device = self._logical_device, logical_device_id
      try:
        yield
      finally:
        self._logical_device = previous
    else:
      yield

  def _experimental_distribute_dataset(self, dataset, options):
    _check_fetchable(dataset.element_spec, options)
    return super()._experimental_distribute_dataset(dataset, options)

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    input_context_lib.refuse_per_replica(options)
    distributed = super()._distribute_datasets_from_function(dataset_fn, options, partial_steps)
    _check_fetchable(distributed.element_spec, options)
    return distributed

  @property
  def num_logical_devices_per_replica(self):
    """Cores per replica (the device assignment's `num_cores_per_replica`)."""
    return len(self._tpu_devices[0])

  @property
  def tpu_hardware_feature(self):
    """The TPU's `tf.tpu.experimental.HardwareFeature`, from its resolver."""
    return self._tpu_cluster_resolver.tpu_hardware_feature

  def _experimental_initialize_system(self):
    """Read by TF 1.x's `SessionManager`, to initialize the TPU before restoring."""
    tpu_system.initialize(self._tpu_cluster_resolver)

  @property
  def num_hosts(self):
    """TPU hosts the replicas run on."""
    if self._device_assignment is None:
      return self._tpu_metadata.num_hosts
    return len({self._device_assignment.host_device(replica=r)
                for r in range(self._device_assignment.num_replicas)})

  @property
  def num_replicas_per_host(self):
    """Replicas on each host."""
    if self._device_assignment is None:
      return self._tpu_metadata.num_of_cores_per_host
    per_host = (self._tpu_metadata.num_of_cores_per_host //
                self._device_assignment.num_cores_per_replica)
    return min(self._device_assignment.num_replicas, per_host)

  def _run(self, fn, args, kwargs, options):
    with self._naming_a_lost_host():
      return self._executor.run(fn, args, kwargs, options)

  def _reduce(self, reduce_op, value):
    with self._naming_a_lost_host():  # where the error of an eager step shows
      return super()._reduce(reduce_op, value)

  def _naming_a_lost_host(self):
    """Names the host an emulated pod lost in the errors raised in it."""
    return tpu_pod_emulation.naming_a_lost_host(getattr(self._tpu_cluster_resolver, "_hosts", None))

  def _tpu_step(self):
    """The context of the TPU computation (or XLA check) traced here, or None."""
    return tpu_replication.enclosing_step(self._container_strategy())

  def _annotated(self, tensor, kind, detail):
    """`tensor` with an XLA sharding annotation; unchanged on an emulated slice."""
    if self._emulated:
      return tensor
    return _tf_bridge.xla_sharding_annotation(tensor, kind, detail)


def _check_run_arguments(fn, args, kwargs):
  """Raises TensorFlow's ValueErrors for arguments its `TPUStrategy.run`
  cannot pass to `fn` (too many, or distributed variables where it refuses them)."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):  # no signature to check against
    return
  if parameters and parameters[0].name == "self":
    parameters = parameters[1:]
  kinds = [p.kind for p in parameters]
  is_variable = lambda x: values_lib.is_distributed_variable(next(iter(tf.nest.flatten(x)), None))
  if inspect.Parameter.POSITIONAL_ONLY in kinds:
    in_kwargs = sum(map(is_variable, (kwargs or {}).values()))
    in_args = sum(map(is_variable, args))
    if in_kwargs or in_args:
      raise ValueError(
          f"Mixing Variables and positional-only parameters not supported by "
          f"TPUStrategy. Received {in_kwargs} DistributedVariables in **kwargs "
          f"and {in_args} in *args, expected zero for both.")
    return
  named = kinds.count(inspect.Parameter.POSITIONAL_OR_KEYWORD)
  star = inspect.Parameter.VAR_POSITIONAL in kinds
  variables_named = any(is_variable(a) for a in args[:named])
  for arg in args[named:]:
    if not star:
      raise ValueError("Too many positional arguments passed to call to TPUStrategy.run().")
    if is_variable(arg):
      raise ValueError(
          "TPUStrategy.run() cannot handle Variables passed to *args. Either "
          "name the function argument, or capture the Variable implicitly.")
    if variables_named:
      raise ValueError(
          "TPUStrategy.run() cannot handle both Variables and a mix of "
          "positional args and *args. Either remove the *args, or capture "
          "the Variable implicitly.")


def _check_fetchable(element_spec, options):
  """Raises `ValueError` for sparse or ragged elements fetched to the cores."""
  if options is not None and not options.experimental_fetch_to_device:
    return
  for spec in tf.nest.flatten(element_spec):
    if isinstance(spec, values_lib.PerReplicaSpec):
      spec = spec._component_specs[0]  # pylint: disable=protected-access
    if isinstance(spec, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
      raise ValueError(
          f"Found tensor with spec {spec}. TPUStrategy does not support "
          f"distributed datasets with device prefetch when using sparse or "
          f"ragged tensors: pass tf_distribute_lite.InputOptions("
          f"experimental_fetch_to_device=False) to the dataset's distribution.")


class NotADeviceAssignmentError(ValueError, AttributeError):
  """A device assignment that is none: a `ValueError`, as TF's `DeviceAssignment`
  raises, and an `AttributeError`, as its TPUStrategy fails."""


def _check_arguments(resolver, device_assignment, steps_per_run):
  """Raises for a resolver that does not answer as a TPU's, a device assignment
  that is not a `DeviceAssignment` and `steps_per_run` below 1."""
  if not hasattr(resolver, "get_tpu_system_metadata"):
    cluster_resolver_lib.check_resolver(
        resolver, "tpu_cluster_resolver",
        (TPUClusterResolver, tf.distribute.cluster_resolver.TPUClusterResolver),
        "tf.distribute.cluster_resolver.TPUClusterResolver")
  if device_assignment is not None and not isinstance(
      device_assignment, tf.tpu.experimental.DeviceAssignment):
    raise NotADeviceAssignmentError(
        f"`experimental_device_assignment` (`device_assignment` in TF 1.x) "
        f"must be a tf.tpu.experimental.DeviceAssignment, such as "
        f"DeviceAssignment.build(topology, num_replicas=2), or None; got the "
        f"{type(device_assignment).__name__} {device_assignment!r}.")
  if steps_per_run is not None:
    distribute_lib.check_count(steps_per_run, "steps_per_run", 1)


def _replica_cores(resolver, metadata, device_assignment):
  """Each replica's core devices, by logical core."""
  emulated = getattr(resolver, "emulated_slice", None)
  if emulated is not None:
    cores = emulated.devices
  else:
    cores = [device_util.canonicalize(d.name) for d in metadata.devices if "device:TPU:" in d.name]
  if not cores:
    raise ValueError(
        f"TPUStrategy found no TPU cores (master {resolver.master()!r}, devices "
        f"{[d.name for d in metadata.devices]}). On a Cloud TPU VM use "
        f"TPUClusterResolver('local') and initialize_tpu_system; without a TPU "
        f"use TPUClusterResolver('emulated:v3-8').")
  if device_assignment is None:
    return [[core] for core in cores]
  job = tf.DeviceSpec.from_string(cores[0]).job

  def core(replica, logical_core):
    device = device_assignment.tpu_device(replica=replica, logical_core=logical_core, job=job)
    if emulated is None:
      return device_util.canonicalize(device)
    spec = tf.DeviceSpec.from_string(device)  # emulated cores are listed host after host
    return cores[spec.task * emulated.num_cores_per_host + spec.device_index]
  return [[core(r, k) for k in range(device_assignment.num_cores_per_replica)]
          for r in range(device_assignment.num_replicas)]
