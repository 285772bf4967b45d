"""TF 1.x's `ParameterServerStrategy` (`tf.compat.v1.distribute.experimental`):
between-graph training, each worker running its own graph, with variables
placed on the ps tasks by `tf.compat.v1.train.replica_device_setter` and
updated asynchronously. Without a cluster, `CentralStorageStrategy`.
"""

import copy

import tensorflow as tf

from tf_distribute_lite import central_storage_strategy
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import executors
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import input_lib
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import variable_policy
from tf_distribute_lite.cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib


class ParameterServerStrategyV1(
    strategy_v1.StrategyV1, stands_for=tf.compat.v1.distribute.experimental.ParameterServerStrategy):
  """Asynchronous training of TF1 graphs by workers, with variables on ps
  tasks. Graphs only, as in TensorFlow (eagerly, `scope`, `run` and the
  dataset methods raise `NotImplementedError`). TensorFlow 2.21's `run` and
  dataset methods return None, these their result; an evaluator the cluster
  does not list reads its own input (TF 2.21 raises `KeyError`).

  Args:
    cluster_resolver: the cluster (with a "ps" job) and this task; by
      default a `TFConfigClusterResolver`. No cluster: this machine only.

  >>> cluster = tf.train.ClusterSpec({"worker": ["localhost:2222"],
  ...                                 "ps": ["localhost:2223", "localhost:2224"]})
  >>> strategy = ParameterServerStrategyV1(
  ...     tf_distribute_lite.cluster_resolver.SimpleClusterResolver(
  ...         cluster, task_type="worker", task_id=0))
  >>> with tf.Graph().as_default(), strategy.scope():
  ...   a, b = tf.Variable(1.0), tf.Variable(2.0)
  >>> a.device, b.device
  ('/job:ps/task:0', '/job:ps/task:1')
  >>> strategy.extended.worker_devices
  ['/job:worker/replica:0/task:0/device:CPU:0']
  """

  def __init__(self, cluster_resolver=None):
    if cluster_resolver is None:
      cluster_resolver = TFConfigClusterResolver()
    cluster_resolver_lib.check_resolver(cluster_resolver)
    super().__init__(ParameterServerStrategyExtended(self, cluster_resolver))

  def scope(self):
    """Makes this strategy current in a graph (variables to the ps tasks)."""
    _refuse_eager_execution()
    return super().scope()

  def run(self, fn, args=(), kwargs=None, options=None):
    """Calls `fn` once per replica of this worker, in a graph."""
    _refuse_eager_execution()
    return super().run(fn, args, kwargs, options)

  def experimental_distribute_dataset(self, dataset, options=None):
    _refuse_eager_execution()
    return super().experimental_distribute_dataset(dataset, options)

  def distribute_datasets_from_function(self, dataset_fn, options=None):
    _refuse_eager_execution()
    return super().distribute_datasets_from_function(dataset_fn, options)

  def _configure_cluster(self, cluster_spec, task_type, task_id):
    self._extended._join(cluster_spec, task_type, task_id)  # pylint: disable=protected-access


def _refuse_eager_execution():
  if tf.executing_eagerly():
    raise NotImplementedError(
        "`tf.compat.v1.distribute.experimental.ParameterServerStrategy` "
        "currently only works with the tf.Estimator API")


class ParameterServerStrategyExtended(central_storage_strategy.ParameterServerStrategyExtended):
  """`strategy.extended` of `ParameterServerStrategyV1`: without a cluster,
  `CentralStorageStrategy`'s; in one, one worker's.

  >>> strategy = ParameterServerStrategyV1(
  ...     tf_distribute_lite.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({})))
  >>> strategy.extended.parameter_devices
  ('/job:localhost/replica:0/task:0/device:CPU:0',)
  >>> strategy.update_config_proto(tf.compat.v1.ConfigProto()).isolate_session_state
  True
  """

  def __init__(self, container_strategy, cluster_resolver):
    self._num_gpus_per_worker = cluster_runtime.gpus_per_task(cluster_resolver)
    super().__init__(container_strategy,
                     cluster_runtime.replica_devices("", self._num_gpus_per_worker), None)
    self._cluster_spec = None
    cluster_spec = cluster_resolver.cluster_spec()
    if cluster_spec.jobs:
      self._join(cluster_spec, cluster_resolver.task_type, cluster_resolver.task_id)

  def _join(self, cluster_spec, task_type, task_id):
    """Makes this the strategy of task `task_type`:`task_id` of
    `cluster_spec`."""
    if not task_type or task_id is None:
      raise ValueError("When `cluster_spec` is given, you must also specify "
                       f"`task_type` and `task_id`; got task_type={task_type!r}, "
                       f"task_id={task_id!r}.")
    num_ps = len(cluster_spec.as_dict().get("ps", ()))
    if not num_ps:
      raise ValueError(f"The cluster spec needs to have `ps` jobs; got "
                       f"{cluster_spec.as_dict()}.")
    cluster_runtime.validate_task(cluster_spec, task_type, task_id)
    task = f"/job:{task_type}/task:{task_id}"
    self._devices = tuple(device_util.canonicalize(d) for d in
                          cluster_runtime.replica_devices(task, self._num_gpus_per_worker))
    self._retrace_functions_for_each_device = len(self._devices) > 1
    self._executor = executors.LocalReplicas(self._container_strategy(), self._devices)
    self._cross_device_ops = self._host_ops = cross_device_ops_lib.ReductionToOneDevice(
        reduce_to_device=device_util.canonicalize(task))
    self._variables = variable_policy.CentralStoragePolicy(
        self._container_strategy(),
        tf.compat.v1.train.replica_device_setter(worker_device=task, cluster=cluster_spec),
        tuple(f"/job:ps/task:{i}" for i in range(num_ps)))
    self._default_device = task
    self._is_chief = cluster_runtime.is_chief(cluster_spec, task_type, task_id)
    self._cluster_spec, self._task_type, self._task_id = cluster_spec, task_type, task_id

  def _in_multi_worker_mode(self):
    return self._cluster_spec is not None

  experimental_should_init = property(
      lambda self: self._is_chief, doc="Whether this task initializes the variables.")

  def _update_config_proto(self, config_proto):
    if self._cluster_spec is None:
      return super()._update_config_proto(config_proto)
    updated = copy.deepcopy(config_proto)
    updated.isolate_session_state = False
    # Each task sees the ps tasks and itself, not the other workers.
    del updated.device_filters[:]
    if self._task_type in ("chief", "worker"):
      updated.device_filters.extend([self._default_device, "/job:ps"])
    elif self._task_type == "evaluator":
      updated.device_filters.append(self._default_device)
    return updated

  def _reduce_to(self, reduce_op, value, destinations, options):
    self._refuse_other_workers(destinations)
    return super()._reduce_to(reduce_op, value, destinations, options)

  def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
    for _, destinations in value_destination_pairs:
      self._refuse_other_workers(destinations)
    return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)

  def _refuse_other_workers(self, destinations):
    if self._cluster_spec is None or destinations is None:
      return
    for device in cross_device_ops_lib.devices_of(destinations):
      spec = tf.DeviceSpec.from_string(device)
      if spec.job == self._task_type and spec.task != self._task_id:
        raise ValueError(f"Cannot reduce to another worker: {device!r}, "
                         f"current worker is {self._default_device!r}")

  @property
  def _input_host(self):
    if self._default_device is None:
      return super()._input_host
    return device_util.canonicalize(self._default_device)

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    input_context_lib.refuse_per_replica(options)
    return input_lib.distribute_datasets_from_function(
        dataset_fn, self._devices, self._input_host, options,
        input_context=self._input_context(),
        partial_steps=self._partial_steps(partial_steps))

  def _input_context(self):
    """This worker's pipeline among those of every training task."""
    if self._cluster_spec is None or self._task_type == "evaluator":
      return input_context_lib.InputContext(1, 0, self._num_replicas_in_sync)
    return input_context_lib.InputContext(
        cluster_runtime.worker_count(self._cluster_spec),
        cluster_runtime.id_in_cluster(self._cluster_spec, self._task_type, self._task_id),
        self._num_replicas_in_sync)
