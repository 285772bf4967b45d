"""`TFConfigClusterResolver`: the cluster the `TF_CONFIG` environment
variable describes, read afresh at every call."""

import json
import os

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import format_master_url

_VARIABLE = "TF_CONFIG"
_OBJECT_FIELDS = {"cluster": '{"worker": ["host:port"]}',
                  "task": '{"type": "worker", "index": 0}'}


def load_tf_config():
  """`TF_CONFIG` as a dict ({} when unset).

  Malformed JSON raises `json.JSONDecodeError` (a `ValueError`) naming the
  variable. Unlike TensorFlow, which reads a JSON list as an empty config and
  fails with a `TypeError` on other values, JSON that is not an object, or a
  `cluster` or `task` entry that is not one, raises `ValueError` naming what
  is wrong.

  >>> import os
  >>> os.environ.pop("TF_CONFIG", None) and None
  >>> load_tf_config()
  {}
  >>> os.environ["TF_CONFIG"] = '{"task": null}'
  >>> load_tf_config()
  Traceback (most recent call last):
  ...
  ValueError: $TF_CONFIG's `task` must be a JSON object such as {"type": "worker", "index": 0}; it is null in '{"task": null}'.
  >>> del os.environ["TF_CONFIG"]
  """
  text = os.environ.get(_VARIABLE, "{}")
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise json.JSONDecodeError(
        f"${_VARIABLE} is not valid JSON ({e.msg}); it is {text!r}",
        e.doc, e.pos) from None
  if not isinstance(config, dict):
    raise ValueError(f"${_VARIABLE} must be a JSON object with `cluster` and "
                     f"`task` entries; it is {text!r}.")
  for field, example in _OBJECT_FIELDS.items():
    if field in config and not isinstance(config[field], dict):
      raise ValueError(f"${_VARIABLE}'s `{field}` must be a JSON object such as "
                       f"{example}; it is {json.dumps(config[field])} in {text!r}.")
  return config


class TFConfigClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.TFConfigClusterResolver):
  """Reads the cluster and this task from `TF_CONFIG`, such as
  `{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type":
  "worker", "index": 1}}`. Arguments given here override the variable.

  >>> import json, os
  >>> os.environ["TF_CONFIG"] = json.dumps({
  ...     "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]},
  ...     "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})
  >>> resolver = TFConfigClusterResolver()
  >>> resolver.task_type, resolver.task_id, resolver.master()
  ('worker', 1, 'grpc://w1:2222')
  >>> resolver.cluster_spec().as_dict()["worker"]
  ['w0:2222', 'w1:2222']
  >>> del os.environ["TF_CONFIG"]
  """

  def __init__(self, task_type=None, task_id=None, rpc_layer=None,
               environment=None):
    self._task_type = task_type
    self._task_id = task_id
    self._rpc_layer = rpc_layer
    self._environment = environment

  def _task_field(self, name):
    return load_tf_config().get("task", {}).get(name)

  @property
  def task_type(self):
    if self._task_type is not None:
      return str(self._task_type)
    given = self._task_field("type")
    return None if given is None else str(given)

  @task_type.setter
  def task_type(self, task_type):
    self._task_type = task_type

  @property
  def task_id(self):
    if self._task_id is not None:
      return int(self._task_id)
    given = self._task_field("index")
    return None if given is None else int(given)

  @task_id.setter
  def task_id(self, task_id):
    self._task_id = task_id

  @property
  def rpc_layer(self):
    if self._rpc_layer is not None:
      return self._rpc_layer
    return load_tf_config().get("rpc_layer")

  @rpc_layer.setter
  def rpc_layer(self, rpc_layer):
    self._rpc_layer = rpc_layer

  @property
  def environment(self):
    return self._environment

  def cluster_spec(self):
    """The `cluster` of `TF_CONFIG`, read now.

    >>> import os
    >>> os.environ["TF_CONFIG"] = '{"cluster": {"ps": ["p0:1"], "worker": ["w0:1"]}}'
    >>> TFConfigClusterResolver().cluster_spec().as_dict()
    {'ps': ['p0:1'], 'worker': ['w0:1']}
    >>> del os.environ["TF_CONFIG"]
    """
    return tf.train.ClusterSpec(load_tf_config().get("cluster", {}))

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """`session_master` from `TF_CONFIG`; else "" for an empty cluster or
    one job of one task slot; else the address of the given (by default
    this) task.

    >>> import os
    >>> os.environ["TF_CONFIG"] = '{"cluster": {"worker": ["w0:1", "w1:1"]}}'
    >>> TFConfigClusterResolver().master("worker", 1, "grpc")
    'grpc://w1:1'
    >>> del os.environ["TF_CONFIG"]
    """
    config = load_tf_config()
    if config.get("session_master") is not None:
      return config["session_master"]
    cluster = self.cluster_spec()
    # A sparse job such as {"1": "a:1"} has two task slots, as TF counts them.
    if not cluster.jobs or (len(cluster.jobs) == 1 and
                            len(cluster.job_tasks(cluster.jobs[0])) == 1):
      return ""
    task_type = self.task_type if task_type is None else task_type
    task_id = self.task_id if task_id is None else task_id
    rpc_layer = self.rpc_layer if rpc_layer is None else rpc_layer
    return format_master_url(cluster.task_address(task_type, task_id), rpc_layer)

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """This task's accelerators (or the given task's)."""
    return super().num_accelerators(
        self.task_type if task_type is None else task_type,
        self.task_id if task_id is None else task_id, config_proto)
