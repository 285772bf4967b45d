"""The cluster resolver interface, and the resolvers that read no environment:
`SimpleClusterResolver` and `UnionResolver`.

A resolver answers where the tasks of a cluster are (`cluster_spec()`), which
task this process is (`task_type`, `task_id`), how to reach a task
(`master()`) and how many accelerators a task has (`num_accelerators()`).
Every resolver here counts as a `tf.distribute.cluster_resolver.ClusterResolver`,
so TensorFlow's own functions, such as `tf.config.experimental_connect_to_cluster`,
accept it; TensorFlow's resolvers count as ours.
"""

import abc
import collections
import dataclasses

import tensorflow as tf

from tf_distribute_lite import device_util
from tf_distribute_lite.tf_classes import StandsFor

_HOST_DEVICE_TYPES = ("CPU", "XLA_CPU")


def format_master_url(master, rpc_layer=None):
  """`master` prefixed by `rpc_layer`, as in "grpc://host:port".

  >>> format_master_url("10.0.0.2:8470", "grpc")
  'grpc://10.0.0.2:8470'
  >>> format_master_url("10.0.0.2:8470")
  '10.0.0.2:8470'
  """
  return f"{rpc_layer}://{master}" if rpc_layer else master


def task_master(resolver, task_type=None, task_id=None, rpc_layer=None):
  """The address of the given task (by default the resolver's own) in its
  cluster, with `rpc_layer` (by default the resolver's); "" when no task is
  known."""
  task_type = resolver.task_type if task_type is None else task_type
  task_id = resolver.task_id if task_id is None else task_id
  if task_type is None or task_id is None:
    return ""
  return format_master_url(resolver.cluster_spec().task_address(task_type, task_id),
                           rpc_layer or resolver.rpc_layer)


@dataclasses.dataclass(frozen=True)
class DeviceAttributes:
  """A device, with the attributes `tf.compat.v1.Session.list_devices()`
  gives (a session's devices are its own objects with the same attributes).

  >>> DeviceAttributes("/job:localhost/replica:0/task:0/device:CPU:0", "CPU")
  DeviceAttributes(name='/job:localhost/replica:0/task:0/device:CPU:0', device_type='CPU', memory_limit_bytes=0, incarnation=0)
  """
  name: str
  device_type: str
  memory_limit_bytes: int = 0
  incarnation: int = 0


def devices_of(master, config_proto=None):
  """Every device `master` reaches: this process's logical devices (fully
  qualified names) when executing eagerly, else the devices of a session on
  `master`.

  >>> devices_of("")[0].device_type
  'CPU'
  """
  if tf.executing_eagerly():
    return [DeviceAttributes(device_util.canonicalize(d.name), d.device_type)
            for d in tf.config.list_logical_devices()]
  with tf.Graph().as_default(), tf.compat.v1.Session(master, config=config_proto) as session:
    return session.list_devices()


def accelerator_devices(master, config_proto=None):
  """(name, device type) of `devices_of(master)` but the host's CPUs.

  >>> accelerator_devices("")  # no accelerator on this machine
  []
  """
  return [(d.name, d.device_type) for d in devices_of(master, config_proto)
          if d.device_type not in _HOST_DEVICE_TYPES]


class ClusterResolver(abc.ABC, StandsFor, stands_for=tf.distribute.cluster_resolver.ClusterResolver):
  """The interface of every cluster resolver.

  Subclasses implement `cluster_spec()` and `master()`; `task_type`,
  `task_id` and `rpc_layer` are plain settable attributes unless a subclass
  reads them from its environment. TensorFlow's resolvers are instances too.

  >>> class OneTask(ClusterResolver):
  ...   def cluster_spec(self):
  ...     return tf.train.ClusterSpec({"worker": ["localhost:2222"]})
  ...   def master(self, task_type=None, task_id=None, rpc_layer=None):
  ...     return ""
  >>> resolver = OneTask()
  >>> resolver.task_type, resolver.task_id, resolver.environment
  (None, None, '')
  >>> isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver)
  True
  >>> theirs = tf.distribute.cluster_resolver.SimpleClusterResolver(
  ...     tf.train.ClusterSpec({}))
  >>> isinstance(theirs, ClusterResolver)
  True
  """

  @classmethod
  def __subclasshook__(cls, subclass):
    # TensorFlow's resolvers count as ours (ours count as theirs through
    # `stands_for`); its abstract base itself does not.
    theirs = tf.distribute.cluster_resolver.ClusterResolver
    if cls is ClusterResolver and theirs in subclass.__mro__[1:]:
      return True
    return NotImplemented

  @abc.abstractmethod
  def cluster_spec(self):
    """The cluster as a `tf.train.ClusterSpec`, as it is now.

    >>> SimpleClusterResolver(tf.train.ClusterSpec({"ps": ["p0:1"]})).cluster_spec().as_dict()
    {'ps': ['p0:1']}
    """

  @abc.abstractmethod
  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The address of a session master (TF 1.x sessions).

    >>> SimpleClusterResolver(tf.train.ClusterSpec({}), master="m:1").master(rpc_layer="grpc")
    'grpc://m:1'
    """

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """Accelerator cores per type, such as {"GPU": 2}; counts only the
    devices of task `task_id` of job `task_type` when both are given."""
    counts = collections.defaultdict(int)
    for name, device_type in accelerator_devices(
        self.master(task_type, task_id), config_proto):
      if task_type is not None and task_id is not None and (
          f"/job:{task_type}" not in name or f"/task:{task_id}" not in name):
        continue
      counts[device_type] += 1
    return counts

  @property
  def environment(self):
    """"google" inside Google's environment, else ""."""
    return ""

  @property
  def task_type(self):
    """This task's job name ("worker", "chief", "ps", ...), or None."""
    return getattr(self, "_task_type", None)

  @task_type.setter
  def task_type(self, task_type):
    self._task_type = task_type

  @property
  def task_id(self):
    """This task's index in its job, or None."""
    return getattr(self, "_task_id", None)

  @task_id.setter
  def task_id(self, task_id):
    self._task_id = task_id

  @property
  def rpc_layer(self):
    """The protocol between the tasks, such as "grpc", or None."""
    return getattr(self, "_rpc_layer", None)

  @rpc_layer.setter
  def rpc_layer(self, rpc_layer):
    self._rpc_layer = rpc_layer



class SimpleClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.SimpleClusterResolver):
  """A resolver that returns what it is given.

  >>> cluster = tf.train.ClusterSpec({"worker": ["w0:2222", "w1:2222"]})
  >>> resolver = SimpleClusterResolver(cluster, task_type="worker", task_id=1,
  ...                                  num_accelerators={"GPU": 8}, rpc_layer="grpc")
  >>> resolver.master("worker", 0), resolver.num_accelerators()
  ('grpc://w0:2222', {'GPU': 8})
  """

  def __init__(self, cluster_spec, master="", task_type=None, task_id=None,
               environment="", num_accelerators=None, rpc_layer=None):
    if not isinstance(cluster_spec, tf.train.ClusterSpec):
      raise TypeError("cluster_spec must be a `tf.train.ClusterSpec`.")
    if not isinstance(master, str):
      raise TypeError("master must be a string.")
    self._cluster_spec = cluster_spec
    self._master = master
    self._task_type = task_type
    self._task_id = task_id
    self._environment = environment
    self._num_accelerators = num_accelerators
    self._rpc_layer = rpc_layer

  def cluster_spec(self):
    """The cluster given to the constructor.

    >>> SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:1"]})).cluster_spec()
    ClusterSpec({'worker': ['w0:1']})
    """
    return self._cluster_spec

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The address of task `task_id` of `task_type` when both are given,
    else the `master` given to the constructor.

    >>> resolver = SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:1"]}),
    ...                                  master="m:1")
    >>> resolver.master(), resolver.master("worker", 0, "grpc")
    ('m:1', 'grpc://w0:1')
    """
    if task_type is not None and task_id is not None:
      master = self._cluster_spec.task_address(task_type, task_id)
    else:
      master = self._master
    return format_master_url(master, rpc_layer or self._rpc_layer)

  @property
  def environment(self):
    return self._environment

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """The `num_accelerators` given to the constructor, or {}."""
    del task_type, task_id, config_proto
    return {} if self._num_accelerators is None else self._num_accelerators


class UnionClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.UnionResolver):
  """The union of the clusters of several resolvers; everything else comes
  from the first one unless given here. Exported as `UnionResolver`.

  A job every resolver lists as a list of addresses is their concatenation;
  if any lists it by task index, the tasks are merged by index and an index
  given twice raises `KeyError`.

  `task_type` and `rpc_layer` given here win unless they are empty, as in
  TensorFlow; `task_id` wins even when it is 0 (TensorFlow 2.21 ignores
  `task_id=0`).

  >>> workers = SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:1"]}))
  >>> ps = SimpleClusterResolver(tf.train.ClusterSpec({"ps": ["p0:1", "p1:1"]}))
  >>> UnionResolver(workers, ps).cluster_spec().as_dict()
  {'worker': ['w0:1'], 'ps': ['p0:1', 'p1:1']}
  """

  def __init__(self, *args, **kwargs):
    self._rpc_layer = kwargs.pop("rpc_layer", None)
    self._task_type = kwargs.pop("task_type", None)
    self._task_id = kwargs.pop("task_id", None)
    if kwargs:
      raise ValueError(f"Unexpected kwargs provided {kwargs!r}")
    if not args:
      raise ValueError("At least one ClusterResolver is required.")
    for resolver in args:
      if not isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver):
        raise TypeError("All arguments must be a sub-class of `ClusterResolver.`")
    self._resolvers = args

  def cluster_spec(self):
    """The resolvers' clusters merged.

    >>> UnionResolver(SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:1"]})),
    ...               SimpleClusterResolver(tf.train.ClusterSpec({"worker": {3: "w3:1"}}))
    ...               ).cluster_spec().as_dict()
    {'worker': {0: 'w0:1', 3: 'w3:1'}}
    """
    clusters = [r.cluster_spec().as_dict() for r in self._resolvers]
    by_index = {job for cluster in clusters for job, tasks in cluster.items()
                if isinstance(tasks, dict)}
    merged = {}
    for cluster in clusters:
      for job, tasks in cluster.items():
        if job not in by_index:
          merged.setdefault(job, []).extend(tasks)
          continue
        indexed = dict(enumerate(tasks)) if isinstance(tasks, list) else tasks
        known = merged.setdefault(job, {})
        duplicated = set(indexed) & set(known)
        if duplicated:
          raise KeyError("Duplicate keys detected when merging two "
                         f"ClusterSpecs: {duplicated!r}")
        known.update(indexed)
    return tf.train.ClusterSpec(merged)

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The address of the given task in the union, else the first
    resolver's master.

    >>> workers = SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:1"]}),
    ...                                 master="w0:1")
    >>> ps = SimpleClusterResolver(tf.train.ClusterSpec({"ps": ["p0:1"]}))
    >>> union = UnionResolver(workers, ps, rpc_layer="grpc")
    >>> union.master(), union.master("ps", 0)
    ('w0:1', 'grpc://p0:1')
    """
    if task_type is not None and task_id is not None:
      master = self.cluster_spec().task_address(task_type, task_id)
      return format_master_url(master, rpc_layer or self._rpc_layer)
    return self._resolvers[0].master(rpc_layer=rpc_layer)

  task_type = property(lambda self: self._task_type or self._resolvers[0].task_type,
                       ClusterResolver.task_type.fset,
                       doc="This task's job name, or the first resolver's.")
  task_id = property(lambda self: (self._resolvers[0].task_id if self._task_id is None
                                   else self._task_id),
                     ClusterResolver.task_id.fset,
                     doc="This task's index, or the first resolver's.")
  rpc_layer = property(lambda self: self._rpc_layer or self._resolvers[0].rpc_layer,
                       ClusterResolver.rpc_layer.fset,
                       doc="The protocol given, or the first resolver's.")

  @property
  def environment(self):
    return self._resolvers[0].environment

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """The first resolver's answer."""
    return self._resolvers[0].num_accelerators(task_type, task_id, config_proto)


UnionResolver = UnionClusterResolver
