"""The cluster resolver interface, and the resolvers that read no environment:
`SimpleClusterResolver` and `UnionResolver`."""

import abc
import collections
import dataclasses

import tensorflow as tf

from tf_distribute_lite import device_util
from tf_distribute_lite.tf_classes import StandsFor

_HOST_DEVICE_TYPES = ("CPU", "XLA_CPU")


def format_master_url(master, rpc_layer=None):
  """`master` prefixed by `rpc_layer`, as in "grpc://host:port"."""
  return f"{rpc_layer}://{master}" if rpc_layer else master


def task_master(self, task_type=None, task_id=None, rpc_layer=None):
  """A resolver's `master` method: the address of the given (by default this)
  task, with `rpc_layer` (by default the resolver's); "" if none is known."""
  task_type = self.task_type if task_type is None else task_type
  task_id = self.task_id if task_id is None else task_id
  if task_type is None or task_id is None:
    return ""
  return format_master_url(self.cluster_spec().task_address(task_type, task_id),
                           rpc_layer or self.rpc_layer)


@dataclasses.dataclass(frozen=True)
class DeviceAttributes:
  """A device, with the attributes of `tf.compat.v1.Session.list_devices()`'s."""
  name: str
  device_type: str
  memory_limit_bytes: int = 0
  incarnation: int = 0


def devices_of(master, config_proto=None):
  """Every device `master` reaches (eagerly: this process's logical devices)."""
  if tf.executing_eagerly():
    return [DeviceAttributes(device_util.canonicalize(d.name), d.device_type)
            for d in tf.config.list_logical_devices()]
  with tf.Graph().as_default(), tf.compat.v1.Session(master, config=config_proto) as session:
    return session.list_devices()


def _settable(attribute, doc):
  """A property reading `attribute` (None until set) and setting it."""
  return property(lambda self: getattr(self, attribute, None),
                  lambda self, value: setattr(self, attribute, value), doc=doc)


class ClusterResolver(abc.ABC, StandsFor, stands_for=tf.distribute.cluster_resolver.ClusterResolver):
  """The interface of every cluster resolver (TensorFlow's are instances too):
  subclasses implement `cluster_spec()` and `master()`.

  >>> class OneTask(ClusterResolver):
  ...   def cluster_spec(self):
  ...     return tf.train.ClusterSpec({"worker": ["localhost:2222"]})
  ...   master = task_master
  >>> resolver = OneTask()
  >>> resolver.task_type, resolver.task_id, resolver.environment
  (None, None, '')
  >>> isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver)
  True
  """

  @classmethod
  def __subclasshook__(cls, subclass):
    # TensorFlow's resolvers count as ours; its abstract base itself does not.
    theirs = tf.distribute.cluster_resolver.ClusterResolver
    if cls is ClusterResolver and theirs in subclass.__mro__[1:]:
      return True
    return NotImplemented

  @abc.abstractmethod
  def cluster_spec(self):
    """The cluster as a `tf.train.ClusterSpec`, as it is now."""

  @abc.abstractmethod
  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The address of a session master (TF 1.x sessions)."""

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """Accelerator cores per type, such as {"GPU": 2} (of one task if given)."""
    counts = collections.defaultdict(int)
    for device in devices_of(self.master(task_type, task_id), config_proto):
      wanted = task_type is None or task_id is None or (
          f"/job:{task_type}" in device.name and f"/task:{task_id}" in device.name)
      if wanted and device.device_type not in _HOST_DEVICE_TYPES:
        counts[device.device_type] += 1
    return counts

  @property
  def environment(self):
    """"google" inside Google's environment, else "" (or what was given)."""
    return getattr(self, "_environment", "")

  task_type = _settable("_task_type", "This task's job name, such as worker or ps, or None.")
  task_id = _settable("_task_id", "This task's index in its job, or None.")
  rpc_layer = _settable("_rpc_layer", "The protocol between the tasks, such as grpc, or None.")


class NotAResolverError(ValueError, AttributeError):
  """What was given as a cluster resolver is none (TensorFlow raises either)."""


def check_resolver(resolver, argument="cluster_resolver", kind=ClusterResolver,
                   kind_name="tf.distribute.cluster_resolver.ClusterResolver"):
  """Raises `NotAResolverError` unless `resolver` is a `kind`."""
  if not isinstance(resolver, kind):
    raise NotAResolverError(f"{argument} must be an instance of {kind_name}; "
                            f"got the {type(resolver).__name__} {resolver!r}.")


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
    """The cluster given to the constructor."""
    return self._cluster_spec

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The address of the given task, else the `master` given."""
    if task_type is not None and task_id is not None:
      return task_master(self, task_type, task_id, rpc_layer)
    return format_master_url(self._master, rpc_layer or self._rpc_layer)

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """The `num_accelerators` given to the constructor, or {}."""
    del task_type, task_id, config_proto
    return {} if self._num_accelerators is None else self._num_accelerators


class UnionClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.UnionResolver):
  """The union of the clusters of several resolvers; everything else comes from
  the first one unless given here. `task_id` given here wins even when it is 0
  (TensorFlow 2.21 ignores 0). Exported as `UnionResolver`.

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
    """The resolvers' clusters merged."""
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
    """The address of the given task in the union, else the first one's master."""
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

  environment = property(lambda self: self._resolvers[0].environment)

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """The first resolver's answer."""
    return self._resolvers[0].num_accelerators(task_type, task_id, config_proto)


UnionResolver = UnionClusterResolver
