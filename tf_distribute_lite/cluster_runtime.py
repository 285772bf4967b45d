"""Joining a cluster: `join` starts this task's gRPC server with collective
ops and TensorFlow's coordination service, once per process.

Waits are bounded: tasks must register within `startup_timeout()` (TensorFlow
2.21 waits an hour); a lost task aborts the others' collectives after
`HEARTBEAT_TIMEOUT_SECONDS`. This module alone sets SIGTERM's handler: the
process ends (after recording the notice), where TensorFlow's trains on.
"""

import concurrent.futures
import dataclasses
import os
import signal
import socket
import threading
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cloud_http
from tf_distribute_lite import device_util
from tf_distribute_lite.cluster_resolver import TFConfigClusterResolver
from tf_distribute_lite.layout import Layout

STARTUP_TIMEOUT_VARIABLE = "TF_DISTRIBUTE_LITE_STARTUP_TIMEOUT"
DEFAULT_STARTUP_TIMEOUT_SECONDS = 900.0
HEARTBEAT_TIMEOUT_SECONDS = 10.0
# Of the start-up time, kept for the server's start and probes on failure.
_MARGIN_SECONDS = 1.0
# How long a notice may take to reach the coordination service.
NOTICE_TIMEOUT_SECONDS = 2.0
PREEMPTION_NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"
_TASK_TYPES = ("chief", "worker", "evaluator", "ps")
_COORDINATED_JOBS = ("chief", "worker")


def startup_timeout():
  """Seconds every task has to join: `$TF_DISTRIBUTE_LITE_STARTUP_TIMEOUT` or 900."""
  return cloud_http.setting(STARTUP_TIMEOUT_VARIABLE, DEFAULT_STARTUP_TIMEOUT_SECONDS,
                            positive=True)


# --- Questions about a cluster.

def validate_jobs(cluster_spec):
  """Raises `ValueError` for an unknown job, or several chiefs or evaluators."""
  cluster = cluster_spec.as_dict()
  unknown = [job for job in cluster if job not in _TASK_TYPES]
  if unknown:
    raise ValueError(f"The cluster names jobs {unknown}; the jobs allowed are "
                     f"{list(_TASK_TYPES)}. Cluster: {cluster}.")
  for job in ("chief", "evaluator"):
    if len(cluster.get(job, ())) > 1:
      raise ValueError(f"There must be at most one {job!r} task; the cluster "
                       f"has {len(cluster[job])}: {cluster[job]}.")


def validate_task(cluster_spec, task_type, task_id):
  """Raises `ValueError` naming what of the cluster or the task does not fit.

  >>> cluster = tf.train.ClusterSpec({"worker": ["a:1", "b:1"]})
  >>> validate_task(cluster, "worker", 2)
  Traceback (most recent call last):
  ...
  ValueError: The task index 2 (`task.index`) is outside job 'worker', which has 2 tasks (indices 0 to 1) in the cluster {'worker': ['a:1', 'b:1']}.
  """
  validate_jobs(cluster_spec)
  cluster = cluster_spec.as_dict()
  if task_type is None or task_id is None:
    raise ValueError(
        f"The cluster {cluster} is given but this task's `task` entry (its "
        f"`type` and `index`) is missing: got task type {task_type!r} and "
        f"index {task_id!r}.")
  if task_type not in cluster and task_type != "evaluator":
    raise ValueError(f"The task type {task_type!r} (`task.type`) is not a job "
                     f"of the cluster, whose jobs are {sorted(cluster)}.")
  if task_type in cluster:
    size = cluster_spec.num_tasks(task_type)
    if not isinstance(task_id, int) or not 0 <= task_id < size:
      raise ValueError(
          f"The task index {task_id!r} (`task.index`) is outside job "
          f"{task_type!r}, which has {size} tasks (indices 0 to {size - 1}) in "
          f"the cluster {cluster}.")


def task_layout(cluster_spec, task_type, task_id):
  """Where a task stands in `cluster_spec`, as a `Layout` without devices
  (an evaluator or "ps" task stands alone)."""
  if not cluster_spec.jobs:
    return Layout()
  if task_type not in _COORDINATED_JOBS:
    return Layout(is_chief=task_type != "ps", task_type=task_type, task_id=task_id)
  chiefs = cluster_spec.num_tasks("chief") if "chief" in cluster_spec.jobs else 0
  index = 0 if task_type == "chief" else task_id + chiefs
  return Layout(num_workers=len(_tasks(cluster_spec)), worker_index=index,
                is_chief=index == 0, task_type=task_type, task_id=task_id)


def gpus_per_task(resolver):
  """How many GPUs each task of `resolver`'s cluster computes on."""
  if isinstance(resolver, TFConfigClusterResolver):
    # It would count its task's devices, which exist only once joined.
    return len(device_util.local_devices("GPU"))
  return resolver.num_accelerators().get("GPU", 0)


def replica_devices(task, gpus):
  """The replicas' devices of task `task` ("": this machine): its GPUs,
  else its CPU.

  >>> replica_devices("/job:worker/task:1", 2)
  ('/job:worker/replica:0/task:1/device:GPU:0', '/job:worker/replica:0/task:1/device:GPU:1')
  """
  names = [f"{task}/device:GPU:{i}" for i in range(gpus)] or [f"{task}/device:CPU:0"]
  return tuple(device_util.canonicalize(name) for name in names)


def leader(cluster_spec):
  """The task that leads collective groups and the coordination service.

  >>> leader(tf.train.ClusterSpec({"worker": ["a:1", "b:1"]}))
  '/job:worker/replica:0/task:0'
  """
  return task_name(*_leader_task(cluster_spec))


def _leader_task(cluster_spec):
  return ("chief" if "chief" in cluster_spec.jobs else "worker"), 0


def task_name(task_type, task_id):
  """The full name of a task.

  >>> task_name("worker", 1)
  '/job:worker/replica:0/task:1'
  """
  return f"/job:{task_type}/replica:0/task:{task_id}"


# --- Joining.

_joined = {}


def join(resolver):
  """The `Layout` of the task `resolver` names. A chief or worker first
  starts the server and waits until every training task has joined; a
  process joins one cluster (`RuntimeError` for another).
  """
  cluster_spec = resolver.cluster_spec()
  task_type, task_id = resolver.task_type, resolver.task_id
  task = ""
  if cluster_spec.jobs:
    validate_task(cluster_spec, task_type, task_id)
    if task_type == "ps":
      raise ValueError(
          "There is no id for task_type 'ps': only 'chief' and 'worker' tasks "
          "train with MultiWorkerMirroredStrategy (and an 'evaluator' on its "
          "own); a 'ps' task serves ParameterServerStrategy.")
    if task_type != "evaluator":
      task = _start_server(cluster_spec, task_type, task_id, resolver.rpc_layer)
  return dataclasses.replace(task_layout(cluster_spec, task_type, task_id),
                             devices=replica_devices(task, gpus_per_task(resolver)), task=task)


def _start_server(cluster_spec, task_type, task_id, rpc_layer):
  """Joins the cluster as the task; returns the task's name."""
  key = (repr(cluster_spec.as_dict()), task_type, task_id)
  if _joined:
    if _joined["key"] != key:
      raise RuntimeError(
          f"This process already joined the cluster {_joined['key'][0]} as "
          f"{_joined['task']}; it cannot also join {key[0]} as "
          f"{task_name(task_type, task_id)}. Start one process per task.")
    return _joined["task"]
  timeout = startup_timeout()
  margin = min(_MARGIN_SECONDS, timeout / 4)
  probe_seconds = margin / 2
  register_deadline = time.monotonic() + timeout - margin
  leader_job, leader_index = _leader_task(cluster_spec)
  if (task_type, task_id) != (leader_job, leader_index) and not _answers_by(
      cluster_spec.task_address(leader_job, leader_index), register_deadline):
    raise tf.errors.DeadlineExceededError(None, None, _startup_failure(
        cluster_spec, task_type, task_id, timeout, probe_seconds,
        f"the coordination service leader {task_name(leader_job, leader_index)} "
        f"did not answer"))
  server_def = tf.train.ServerDef(
      cluster=cluster_spec.as_cluster_def(), job_name=task_type,
      task_index=task_id, protocol=rpc_layer or "grpc",
      default_session_config=_session_config(
          cluster_spec, task_type, task_id,
          max(register_deadline - time.monotonic(), probe_seconds)))
  on_sigterm = signal.getsignal(signal.SIGTERM)
  _tf_bridge.enable_collective_ops(server_def)
  try:
    tf.config.list_logical_devices()  # starts the context: the server joins
  except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
    raise type(e)(None, None, _startup_failure(
        cluster_spec, task_type, task_id, timeout, probe_seconds, e.message)) from None
  _take_back_sigterm(on_sigterm, task_type, task_id)
  task = task_name(task_type, task_id)
  device_util.set_local_task(task)
  _joined.update(key=key, task=task)
  return task


def _take_back_sigterm(on_sigterm, task_type, task_id):
  """Gives SIGTERM back the program's handler; the default one becomes
  "record the notice, then end"."""
  if threading.current_thread() is not threading.main_thread():
    return  # signal handlers can only be set from the main thread

  def end(signum, frame):
    del frame
    publish_preemption_notice(task_type, task_id)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
  signal.signal(signal.SIGTERM, end if on_sigterm in (signal.SIG_DFL, None) else on_sigterm)


def on_sigterm(callback):
  """Makes SIGTERM call `callback()` (from the main thread only)."""
  signal.signal(signal.SIGTERM, lambda signum, frame: callback())


def publish_preemption_notice(task_type, task_id):
  """Records the task's termination notice in the coordination service, as
  TensorFlow does (the first stays); waits at most `NOTICE_TIMEOUT_SECONDS`."""
  def publish():
    try:
      _tf_bridge.coordination_set(PREEMPTION_NOTICE_KEY, f"/job:{task_type}/task:{task_id}")
    except tf.errors.OpError:
      pass  # another task's notice came first, or the service is gone
  thread = threading.Thread(target=publish, name="PreemptionNotice", daemon=True)
  thread.start()
  thread.join(NOTICE_TIMEOUT_SECONDS)


def configure_collectives(config, cluster_spec=None, task_type=None, task_id=None):
  """Sets up `config` in place for collective ops (in a cluster, with its leader)."""
  rewrites = config.graph_options.rewrite_options
  rewrites.scoped_allocator_optimization = rewrites.ON
  del rewrites.scoped_allocator_opts.enable_op[:]
  rewrites.scoped_allocator_opts.enable_op.append("CollectiveReduce")
  if cluster_spec is not None:
    config.experimental.collective_group_leader = leader(cluster_spec)
    del config.device_filters[:]
    config.device_filters.append(f"/job:{task_type}/task:{task_id}")


def _session_config(cluster_spec, task_type, task_id, register_seconds):
  """The context's config, with collectives and the coordination service."""
  config = _tf_bridge.eager_context_config()
  configure_collectives(config, cluster_spec, task_type, task_id)
  coordination = config.experimental.coordination_config
  coordination.service_type = "standalone"
  coordination.service_leader = leader(cluster_spec)
  coordination.cluster_register_timeout_in_ms = max(int(register_seconds * 1000), 1)
  coordination.cluster_register_with_barrier = True
  coordination.heartbeat_timeout_in_ms = int(HEARTBEAT_TIMEOUT_SECONDS * 1000)
  coordination.shutdown_barrier_timeout_in_ms = int(HEARTBEAT_TIMEOUT_SECONDS * 1000)
  for job in _COORDINATED_JOBS:
    if job in cluster_spec.jobs:
      coordinated = coordination.coordinated_job_list.add()
      coordinated.name = job
      coordinated.num_tasks = cluster_spec.num_tasks(job)
  return config


def _startup_failure(cluster_spec, task_type, task_id, timeout, probe_seconds, detail):
  """The message of a failed start, naming the tasks whose servers do not
  answer within `probe_seconds`."""
  others = [task for task in _tasks(cluster_spec) if task[:2] != (task_type, task_id)]
  with concurrent.futures.ThreadPoolExecutor(max(len(others), 1)) as pool:
    answered = list(pool.map(lambda task: _listening(task[2], probe_seconds), others))
  missing = [task for task, answers in zip(others, answered) if not answers]
  me = task_name(task_type, task_id)
  if missing:
    names = ", ".join(f"{task_name(job, index)} at {address}" for job, index, address in missing)
    return (f"Task {me} could not start the cluster within {timeout:g} s: no "
            f"server answers for {names}. Start every task of the cluster "
            f"(one process each, with its own TF_CONFIG), or set "
            f"${STARTUP_TIMEOUT_VARIABLE} to wait longer. ({detail})")
  return (f"Task {me} could not start the cluster within {timeout:g} s: every "
          f"task's server answers, but not all of them joined; see "
          f"TensorFlow's message: {detail}")


def _tasks(cluster_spec, jobs=_COORDINATED_JOBS):
  """`(job, index, address)` of each task of `jobs` (the training tasks)."""
  return [(job, index, cluster_spec.task_address(job, index)) for job in jobs
          if job in cluster_spec.jobs for index in range(cluster_spec.num_tasks(job))]


def unanswered_tasks(cluster_spec, jobs, deadline):
  """`(job, index, address)` of each task of `jobs` whose server does not
  answer before `deadline` (`time.monotonic()`)."""
  return [task for task in _tasks(cluster_spec, jobs) if not _answers_by(task[2], deadline)]


def _answers_by(address, deadline):
  """Whether `address` accepts TCP connections before `deadline` (checked
  here, as TensorFlow's backoff may sleep past its deadline)."""
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      return False
    if _listening(address, min(left, _MARGIN_SECONDS / 2)):
      return True
    time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))


def _listening(address, timeout):
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
      return True
  except (OSError, ValueError):
    return False
