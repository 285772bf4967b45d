"""`SlurmClusterResolver`: the cluster of a Slurm job step, from `SLURM_*`."""

import os
import re
import subprocess

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import task_master


def expand_hostlist(hostlist):
  """The host names of a Slurm host list such as "node[01-03,07],gpu1"."""
  try:
    return [host for part in _top_level_parts(hostlist) for host in _expand_part(part)]
  except ValueError as e:
    raise ValueError(f'Invalid hostlist format "{hostlist}": {e}') from None


def _top_level_parts(hostlist):
  """Splits at the commas outside brackets."""
  parts, current, depth = [], "", 0
  for char in hostlist:
    if char == "[":
      if depth:
        raise ValueError("nested '['")
      depth = 1
    elif char == "]":
      depth = 0
    elif char == "," and not depth:
      if not current:
        raise ValueError("empty host name")
      parts.append(current)
      current = ""
      continue
    current += char
  if current:
    parts.append(current)
  return parts


def _expand_part(part):
  # As in TensorFlow, a part may end in a newline (Slurm's own output does).
  match = re.fullmatch(r"([^,\[\]]*)(?:\[([^\]]+)\])?\n?", part)
  if match is None:
    raise ValueError(f"Invalid part: {part}")
  prefix, ranges = match.group(1), match.group(2)
  if ranges is None:
    return [prefix]
  hosts = []
  for item in ranges.split(","):
    bounds = item.split("-")
    if len(bounds) > 2:
      raise ValueError(f"Invalid range: {item}")
    first, last = bounds[0], bounds[-1]
    hosts.extend(prefix + str(i).zfill(len(first)) for i in range(int(first), int(last) + 1))
  return hosts


def expand_tasks_per_node(tasks_per_node):
  """Tasks on each node, from Slurm's compressed form such as "2(x3),1"."""
  counts = []
  for part in tasks_per_node.split(","):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?\n?", part)
    if match is None:
      raise ValueError(f'Invalid tasks-per-node list format "{tasks_per_node}": '
                       f"cannot read {part!r}")
    counts.extend([int(match.group(1))] * int(match.group(2) or 1))
  return counts


def _slurm_variable(name):
  name = "SLURM_" + name
  if name not in os.environ:
    raise RuntimeError(f"{name} not found in environment. Not running inside "
                       "a SLURM step?")
  return os.environ[name]


def get_num_gpus():
  """GPUs on this node: `CUDA_VISIBLE_DEVICES` if set, else `nvidia-smi`,
  else 0 (TensorFlow 2.21 raises when `nvidia-smi` is missing)."""
  if "CUDA_VISIBLE_DEVICES" in os.environ:
    return len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
  try:
    output = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True,
                            text=True, timeout=30, check=True).stdout
  except FileNotFoundError:
    return 0
  except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
    raise RuntimeError("Could not get number of GPUs from nvidia-smi. Maybe it "
                       f"is missing?\nOutput: {getattr(e, 'output', '')}") from None
  return sum(line.startswith("GPU ") for line in output.strip().split("\n"))


class SlurmClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.SlurmClusterResolver):
  """Tasks of the Slurm job step, on ports from `port_base`, split into `jobs`
  in sorted order. Nodes without GPUs give every task none (TF 2.21 fails).

  >>> import os
  >>> os.environ.update(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="3",
  ...                   SLURM_STEP_NODELIST="node[1-2]",
  ...                   SLURM_STEP_TASKS_PER_NODE="2,1")
  >>> resolver = SlurmClusterResolver({"ps": 1, "worker": 2}, gpus_per_node=0,
  ...                                 auto_set_gpu=False)
  >>> resolver.cluster_spec().as_dict()
  {'ps': ['node1:8888'], 'worker': ['node1:8889', 'node2:8888']}
  >>> resolver.get_task_info(), resolver.master()
  (('worker', 0), 'grpc://node1:8889')
  >>> for name in ("PROCID", "STEP_NUM_TASKS", "STEP_NODELIST", "STEP_TASKS_PER_NODE"):
  ...   del os.environ["SLURM_" + name]
  """

  def __init__(self, jobs=None, port_base=8888, gpus_per_node=None,
               gpus_per_task=None, tasks_per_node=None, auto_set_gpu=True,
               rpc_layer="grpc"):
    self._rank = int(_slurm_variable("PROCID"))
    self._jobs = jobs if jobs is not None else {"worker": int(_slurm_variable("STEP_NUM_TASKS"))}
    self._port_base = port_base
    if tasks_per_node is None:
      hosts = expand_hostlist(_slurm_variable("STEP_NODELIST"))
      counts = expand_tasks_per_node(_slurm_variable("STEP_TASKS_PER_NODE"))
      self._tasks_per_node = dict(zip(hosts, counts))
    elif isinstance(tasks_per_node, dict):
      self._tasks_per_node = tasks_per_node
    else:
      self._tasks_per_node = {
          host: int(tasks_per_node)
          for host in expand_hostlist(_slurm_variable("STEP_NODELIST"))}
    most_tasks = max(self._tasks_per_node.values())
    self._gpus_per_node = get_num_gpus() if gpus_per_node is None else gpus_per_node
    self._gpus_per_task = (self._gpus_per_node // most_tasks
                           if gpus_per_task is None else gpus_per_task)
    self._auto_set_gpu = auto_set_gpu
    self.rpc_layer = rpc_layer
    if most_tasks * self._gpus_per_task > self._gpus_per_node:
      raise RuntimeError("Requested more GPUs per node than available.")
    total = sum(self._tasks_per_node.values())
    if sum(self._jobs.values()) != total:
      raise RuntimeError(f"Requested {sum(self._jobs.values())} tasks but only "
                         f"{total} were assigned.")

  def cluster_spec(self):
    """The cluster; also sets `task_type`, `task_id` (and `CUDA_VISIBLE_DEVICES`)."""
    addresses, gpus = [], []
    for host, num_tasks in sorted(self._tasks_per_node.items()):
      for offset in range(num_tasks):
        if self._gpus_per_task and offset * self._gpus_per_task >= self._gpus_per_node:
          break
        addresses.append(f"{host}:{self._port_base + offset}")
        first_gpu = offset * self._gpus_per_task
        gpus.append(",".join(str(g) for g in range(first_gpu, first_gpu + self._gpus_per_task)))
    cluster, start = {}, 0
    for job, num_tasks in sorted(self._jobs.items()):
      cluster[job] = addresses[start:start + num_tasks]
      if start <= self._rank < start + num_tasks:
        self.task_type, self.task_id = job, self._rank - start
      start += num_tasks
    if self._auto_set_gpu:
      os.environ["CUDA_VISIBLE_DEVICES"] = gpus[self._rank]
    return tf.train.ClusterSpec(cluster)

  def get_task_info(self):
    """(task_type, task_id), set by `cluster_spec()` (None before)."""
    return self.task_type, self.task_id

  master = task_master  # "" before `cluster_spec()` has found this task

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """{"GPU": GPUs per task}."""
    del task_type, task_id, config_proto
    return {"GPU": self._gpus_per_task}
