"""`ParameterServerStrategy`: a coordinator (this process) sends steps to
workers, with variables on the ps tasks."""

import logging
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import auto_shard
from tf_distribute_lite import cluster_coordinator
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import variable_policy
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib

_COORDINATOR_JOB = cluster_coordinator.COORDINATOR_JOB
COORDINATOR_CPU = cluster_coordinator.COORDINATOR_CPU


class ParameterServerStrategyV2(distribute_lib.Strategy,
                                stands_for=tf.distribute.ParameterServerStrategy):
  """Training by a coordinator that sends steps to workers, with variables on
  parameter servers.

  Args:
    cluster_resolver: a cluster with "worker" and "ps" tasks (and at most
      one "chief", this process), whose servers are running.
    variable_partitioner: a `tf.distribute.experimental.partitioners`
      partitioner splitting variables along their first axis, or None.

  >>> cluster = tf.train.ClusterSpec({"worker": ["localhost:2223"],
  ...                                 "ps": ["localhost:2224"]})  # doctest: +SKIP
  >>> servers = [tf.distribute.Server(cluster, job, 0, start=True)
  ...            for job in ("worker", "ps")]  # doctest: +SKIP
  >>> strategy = ParameterServerStrategyV2(
  ...     tf_distribute_lite.cluster_resolver.SimpleClusterResolver(
  ...         cluster, rpc_layer="grpc"))  # doctest: +SKIP
  """

  def __init__(self, cluster_resolver, variable_partitioner=None):
    cluster_resolver_lib.check_resolver(cluster_resolver)
    if variable_partitioner is not None and not callable(variable_partitioner):
      # TensorFlow 2.21 takes it and fails at the first variable.
      raise TypeError(
          f"variable_partitioner must be a tf.distribute.experimental.partitioners."
          f"Partitioner (or a function of a variable's shape and dtype) or None; "
          f"got the {type(variable_partitioner).__name__} {variable_partitioner!r}.")
    cluster_spec = _checked_cluster(cluster_resolver)
    _wait_for_servers(cluster_spec)
    _connect(cluster_spec, cluster_resolver.rpc_layer or "grpc")
    super().__init__(ParameterServerStrategyV2Extended(self, cluster_spec, variable_partitioner))
    self._cluster_resolver = cluster_resolver
    self._coordinator = None  # the ClusterCoordinator made for it
    # Read by tf_keras (docs/client_private_names.md).
    self._should_use_with_coordinator = True
    self._num_workers = self._extended._num_workers  # pylint: disable=protected-access

  @property
  def _cluster_coordinator(self):
    """This strategy's `ClusterCoordinator`, made on first use (TensorFlow's
    `ClusterCoordinator(strategy)` returns it)."""
    if self._coordinator is None:
      cluster_coordinator.ClusterCoordinator(self)
    return self._coordinator

  def _reconnect(self):
    """Connects to the cluster again (once a lost worker is back)."""
    _connect(self._extended._cluster_spec, self._cluster_resolver.rpc_layer or "grpc")  # pylint: disable=protected-access


def _checked_cluster(cluster_resolver):
  cluster_spec = cluster_resolver.cluster_spec()
  if not cluster_spec.jobs:
    raise ValueError("Cluster spec must be non-empty in "
                     "`tf.distribute.cluster_resolver.ClusterResolver`.")
  cluster_runtime.validate_jobs(cluster_spec)
  jobs = cluster_spec.as_dict()
  for job in ("ps", "worker"):
    if not jobs.get(job):
      raise ValueError(f"There must be at least one {job}. The cluster {jobs} "
                       f"has no {job!r} task.")
  return cluster_spec


def _wait_for_servers(cluster_spec):
  """Waits, at most `cluster_runtime.startup_timeout()` seconds, until every
  worker and ps task's server answers."""
  deadline = time.monotonic() + cluster_runtime.startup_timeout()
  missing = cluster_runtime.unanswered_tasks(cluster_spec, ("worker", "ps"), deadline)
  if missing:
    names = ", ".join(f"{cluster_runtime.task_name(job, i)} at {address}"
                      for job, i, address in missing)
    raise tf.errors.DeadlineExceededError(
        None, None, f"ParameterServerStrategy could not reach the cluster within "
        f"{cluster_runtime.startup_timeout():g} s: no server answers for {names}. "
        f"Start each worker and ps task (tf.distribute.Server(...).join()), or "
        f"set ${cluster_runtime.STARTUP_TIMEOUT_VARIABLE} to wait longer.")


def _connect(cluster_spec, protocol):
  """Connects this process, as the coordinator, to the cluster; workers and
  ps tasks see each other and the coordinator only, as in TensorFlow."""
  filters = tf.config.experimental.ClusterDeviceFilters()
  for job, visible in (("worker", "/job:ps"), ("ps", "/job:worker")):
    for index in range(cluster_spec.num_tasks(job)):
      filters.set_device_filters(job, index, [visible, f"/job:{_COORDINATOR_JOB}"])
  _tf_bridge.remote_ops_run_synchronously()
  tf.config.experimental_connect_to_cluster(
      cluster_spec, job_name=_COORDINATOR_JOB, protocol=protocol,
      cluster_device_filters=filters)


class ParameterServerStrategyV2Extended(distribute_lib.StrategyExtendedV1):
  """`strategy.extended` of `ParameterServerStrategy`."""

  def __init__(self, container_strategy, cluster_spec, variable_partitioner):
    super().__init__(container_strategy, variable_policy.ParameterServerPolicy(
        container_strategy, cluster_spec.num_tasks("ps"), variable_partitioner,
        COORDINATOR_CPU))
    self._cluster_spec = cluster_spec
    self._num_workers = cluster_spec.num_tasks("worker")
    # Set by the ClusterCoordinator while it traces a function to schedule.
    self._being_scheduled = False

  # A step runs on the CPU of whichever worker runs it.
  worker_devices = property(lambda self: ("/device:CPU:0",))

  # --- Replicas and input.

  def _call_for_each_replica(self, fn, args, kwargs):
    self._warn_unless_scheduled()
    return super()._call_for_each_replica(fn, args, kwargs)

  def _reduce_to(self, reduce_op, value, destinations, options):
    self._warn_unless_scheduled()
    return super()._reduce_to(reduce_op, value, destinations, options)

  def _warn_unless_scheduled(self):
    if not self._being_scheduled:
      logging.getLogger("tensorflow").warning(
          "A ParameterServerStrategy method is invoked without "
          "ClusterCoordinator.schedule: outside a tf.function being traced it "
          "runs on the coordinator. Call `run` and `reduce` inside functions "
          "given to ClusterCoordinator.schedule to run them on workers.")

  def _experimental_distribute_dataset(self, dataset, options):
    del options
    input_lib.check_dataset(dataset)
    remade = auto_shard.dataset_remaker(dataset)
    return DatasetFromFunction(
        lambda _: remade(), input_context_lib.InputContext(),
        "To use this dataset, you need to pass this dataset to "
        "ClusterCoordinator.create_per_worker_dataset.")

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    del options, partial_steps
    # Each worker reads its own pipeline, as one of one (as in TensorFlow).
    return DatasetFromFunction(
        dataset_fn, input_context_lib.InputContext(),
        "You need to use this dataset in ClusterCoordinator.create_per_worker_dataset.")


class DatasetFromFunction(tf.distribute.DistributedDataset):
  """A worker's input, made there by `dataset_fn(input_context)`; made
  outside a `tf.function`, iterating it raises `ValueError`, as in TensorFlow.

  >>> ds = DatasetFromFunction(lambda ctx: tf.data.Dataset.range(3),
  ...                          tf_distribute_lite.InputContext(), "unbuilt")
  >>> ds.element_spec
  TensorSpec(shape=(), dtype=tf.int64, name=None)
  >>> iter(ds)
  Traceback (most recent call last):
  ...
  ValueError: unbuilt
  """

  def __init__(self, dataset_fn, input_context, unbuilt_message):
    self._dataset_fn = dataset_fn
    self._input_context = input_context
    self._unbuilt_message = None if tf.inside_function() else unbuilt_message

  def build(self):
    """The dataset, made where this is called."""
    return self._dataset_fn(self._input_context)

  def __iter__(self):
    if self._unbuilt_message is not None:
      raise ValueError(self._unbuilt_message)
    return iter(self.build())

  element_spec = property(lambda self: self.build().element_spec)

  def reduce(self, initial_state, reduce_func):
    return self.build().reduce(initial_state, reduce_func)


