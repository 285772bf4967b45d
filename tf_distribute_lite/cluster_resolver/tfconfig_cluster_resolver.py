"""`TFConfigClusterResolver`: the cluster `$TF_CONFIG` describes."""

import json
import os

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import format_master_url

_VARIABLE = "TF_CONFIG"
_OBJECT_FIELDS = {"cluster": '{"worker": ["host:port"]}', "task": '{"type": "worker", "index": 0}'}


def load_tf_config():
  """`TF_CONFIG` as a dict ({} when unset); one that is not a JSON object (nor
  its `cluster`, `task`) raises `ValueError` (TF fails later, `TypeError`)."""
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


def _given_or_configured(attribute, read, convert=lambda value: value):
  """A settable property: `attribute` if set, else `read(load_tf_config())`."""
  def get(self):
    value = getattr(self, attribute)
    value = read(load_tf_config()) if value is None else value
    return None if value is None else convert(value)
  return property(get, lambda self, value: setattr(self, attribute, value))


class TFConfigClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.TFConfigClusterResolver):
  """Reads the cluster and this task from `TF_CONFIG`, at every call; arguments
  given here override it.

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

  def __init__(self, task_type=None, task_id=None, rpc_layer=None, environment=None):
    self._task_type = task_type
    self._task_id = task_id
    self._rpc_layer = rpc_layer
    self._environment = environment

  task_type = _given_or_configured(
      "_task_type", lambda config: config.get("task", {}).get("type"), str)
  task_id = _given_or_configured(
      "_task_id", lambda config: config.get("task", {}).get("index"), int)
  rpc_layer = _given_or_configured("_rpc_layer", lambda config: config.get("rpc_layer"))

  def cluster_spec(self):
    """The `cluster` of `TF_CONFIG`, read now."""
    return tf.train.ClusterSpec(load_tf_config().get("cluster", {}))

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """`session_master` from `TF_CONFIG`; "" for a cluster of one task slot; else
    the address of the given (by default this) task."""
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
