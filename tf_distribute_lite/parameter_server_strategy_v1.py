"""TF 1.x's `ParameterServerStrategy`: between-graph training, variables on
the ps tasks (`replica_device_setter`), updated asynchronously. Without a
cluster, `CentralStorageStrategy`."""

import copy

import tensorflow as tf

from tf_distribute_lite import central_storage_strategy
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import communicator as communicator_lib
from tf_distribute_lite import cross_device_ops as cross_device_ops_lib
from tf_distribute_lite import device_util
from tf_distribute_lite import executors
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import strategy_v1
from tf_distribute_lite import variable_policy
from tf_distribute_lite.cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib
from tf_distribute_lite.layout import Layout


class ParameterServerStrategyV1(
    strategy_v1.StrategyV1, stands_for=tf.compat.v1.distribute.experimental.ParameterServerStrategy):
  """Asynchronous training of TF1 graphs, with variables on ps tasks (in
  graphs only, as in TensorFlow). `cluster_resolver`: by default a
  `TFConfigClusterResolver`. (TensorFlow 2.21's `run` and dataset methods
  return None, and an evaluator the cluster does not list raises `KeyError`.)

  >>> cluster = tf.train.ClusterSpec({"worker": ["localhost:2222"],
  ...                                 "ps": ["localhost:2223", "localhost:2224"]})
  >>> strategy = ParameterServerStrategyV1(
  ...     tf_distribute_lite.cluster_resolver.SimpleClusterResolver(
  ...         cluster, task_type="worker", task_id=0))
  >>> with tf.Graph().as_default(), strategy.scope():
  ...   a, b = tf.Variable(1.0), tf.Variable(2.0)
  >>> a.device, b.device
  ('/job:ps/task:0', '/job:ps/task:1')
  """

  def __init__(self, cluster_resolver=None):
    if cluster_resolver is None:
      cluster_resolver = TFConfigClusterResolver()
    cluster_resolver_lib.check_resolver(cluster_resolver)
    super().__init__(ParameterServerStrategyExtended(self, cluster_resolver))

  def scope(self):
    _refuse_eager_execution()
    return super().scope()

  def run(self, fn, args=(), kwargs=None, options=None):
    _refuse_eager_execution()
    return super().run(fn, args, kwargs, options)

  def experimental_distribute_dataset(self, dataset, options=None):
    _refuse_eager_execution()
    return super().experimental_distribute_dataset(dataset, options)

  def distribute_datasets_from_function(self, dataset_fn, options=None):
    _refuse_eager_execution()
    return super().distribute_datasets_from_function(dataset_fn, options)


def _refuse_eager_execution():
  if tf.executing_eagerly():
    raise NotImplementedError(
        "`tf.compat.v1.distribute.experimental.ParameterServerStrategy` "
        "currently only works with the tf.Estimator API")


class ParameterServerStrategyExtended(central_storage_strategy.ParameterServerStrategyExtended):
  """`strategy.extended` of `ParameterServerStrategyV1`: without a cluster,
  `CentralStorageStrategy`'s.

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
    self._cluster_spec = tf.train.ClusterSpec({})
    cluster_spec = cluster_resolver.cluster_spec()
    if cluster_spec.jobs:
      self._configure_cluster(cluster_spec, cluster_resolver.task_type, cluster_resolver.task_id)

  def _configure_cluster(self, cluster_spec, task_type, task_id):
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
    # Central storage's parts, on the task; its own replicas are in sync.
    self._layout = Layout(
        cluster_runtime.replica_devices(task, self._num_gpus_per_worker),
        input_host=task, task_type=task_type, task_id=task_id,
        is_chief=cluster_runtime.task_layout(cluster_spec, task_type, task_id).is_chief)
    on_task = cross_device_ops_lib.ReductionToOneDevice(
        reduce_to_device=device_util.canonicalize(task))
    self._communicator = communicator_lib.Communicator(self._layout, on_task, on_task)
    self._executor = executors.LocalReplicas(self._container_strategy(), self._devices)
    self._variables = variable_policy.CentralStoragePolicy(
        self._container_strategy(),
        tf.compat.v1.train.replica_device_setter(worker_device=task, cluster=cluster_spec),
        tuple(f"/job:ps/task:{i}" for i in range(num_ps)))
    self._default_device = task
    self._cluster_spec = cluster_spec

  def _in_multi_worker_mode(self):
    return self._layout.task_type is not None

  experimental_should_init = property(
      lambda self: self._is_chief, doc="Whether this task initializes the variables.")

  def _update_config_proto(self, config_proto):
    if self._layout.task_type is None:
      return super()._update_config_proto(config_proto)
    updated = copy.deepcopy(config_proto)
    updated.isolate_session_state = False
    # Each task sees the ps tasks and itself, not the other workers.
    del updated.device_filters[:]
    if self._layout.task_type in ("chief", "worker"):
      updated.device_filters.extend([self._default_device, "/job:ps"])
    elif self._layout.task_type == "evaluator":
      updated.device_filters.append(self._default_device)
    return updated

  def _distribute_datasets_from_function(self, dataset_fn, options, partial_steps=None):
    input_context_lib.refuse_per_replica(options)
    return super()._distribute_datasets_from_function(dataset_fn, options, partial_steps)

  def _input_context(self):
    """This worker's pipeline among those of every training task."""
    task = cluster_runtime.task_layout(self._cluster_spec, self._layout.task_type, self._layout.task_id)
    return input_context_lib.InputContext(
        task.num_workers, task.worker_index, self._num_replicas_in_sync)
