"""A cluster of worker processes on this machine, for multi-worker tests.

`LocalCluster(n, directory).run(scenario, module)` starts `n` processes of
`multi_worker_worker.py` on 127.0.0.1 with free ports, one `TF_CONFIG` each
(2 logical CPU devices per worker), runs the named scenario of
`multi_worker_scenarios.py` in every one and returns what each returned;
`run_together` runs several clusters at the same time, `run_once` shares a
run between the tests (and pytest-xdist workers) that check its results.
Every wait is bounded; a worker that does not finish in time, and every
worker still running when a run ends or fails, is killed by its process id.

A parameter-server cluster (`num_ps` > 0) has a chief task, which runs the
scenario (module `ps_scenarios`), and worker and ps tasks that only serve
(`tf.distribute.Server`); with `servers="in_process"` the chief starts
them in its own process instead, as TensorFlow's tutorial does. A scenario
may ask the cluster to kill or restart one of its tasks (`request`), which
`finish` does by process id while it waits. A test may send a worker a
signal (`send_signal`, which returns once the worker has taken it) and wait
for every worker to exit (`wait_for_exits`).
"""

import fcntl
import json
import os
import pathlib
import pickle
import random
import signal
import socket
import subprocess
import sys
import time

WORKER = pathlib.Path(__file__).resolve().parent / "multi_worker_worker.py"
REPO_ROOT = WORKER.parent.parent


def free_ports(count):
  """`count` ports nothing listens on now, none given out before in this
  process, all below the kernel's ephemeral range: clusters started
  together open outgoing connections, which take ephemeral ports, and one
  could take a port another cluster was given before its server binds it."""
  first_ephemeral = _first_ephemeral_port()
  ports = []
  while len(ports) < count:
    port = _random.randrange(_LOWEST_PORT, first_ephemeral)
    if port in _given_ports:
      continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
    _given_ports.add(port)
    ports.append(port)
  return ports


_LOWEST_PORT = 10000
_given_ports = set()
_random = random.Random()  # seeded per process: xdist workers pick apart


def _first_ephemeral_port():
  try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
      return max(int(f.read().split()[0]), _LOWEST_PORT + 1000)
  except (OSError, ValueError, IndexError):
    return 32768


def run_together(runs, timeout=120):
  """Starts every cluster of `runs`, a list of `(cluster, scenario, module,
  start_args)`, then waits for each (`LocalCluster.finish`); their results
  in order. Every worker is killed at the end, whatever happens."""
  try:
    for cluster, scenario, module, start_args in runs:
      cluster.start(scenario, module, **start_args)
    return [cluster.finish(timeout) for cluster, *_ in runs]
  finally:
    for cluster, *_ in runs:
      cluster.stop()


def run_once(tmp_path_factory, name, run):
  """`run(directory)` once per test session; for a module fixture whose
  tests pytest-xdist may spread over its workers, each of which sets up
  the fixture. The first worker to ask runs it under a file lock, the
  others wait for it and read its result."""
  if "PYTEST_XDIST_WORKER" not in os.environ:
    return run(tmp_path_factory.mktemp(name))
  shared = tmp_path_factory.getbasetemp().parent  # this session's, for every worker
  with open(shared / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # held at most as long as `run` runs
    done = shared / f"{name}.pickle"
    if not done.exists():
      (shared / name).mkdir(exist_ok=True)
      done.write_bytes(pickle.dumps(run(shared / name)))
    return pickle.loads(done.read_bytes())


def _signal_pending(pid, signum):
  """Whether signal `signum` sent to process `pid` still waits to be
  delivered (Linux's /proc/PID/status; False where it cannot be read)."""
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
  except OSError:
    return False
  pending = 0
  for line in status.splitlines():
    if line.startswith(("SigPnd:", "ShdPnd:")):
      pending |= int(line.split()[1], 16)
  return bool(pending >> (signum - 1) & 1)


class WorkerFailed(AssertionError):
  """A worker exited badly or ran out of time; carries every worker's log."""


class LocalCluster:
  """`num_workers` worker tasks of one cluster on 127.0.0.1.

  Args:
    num_workers: how many tasks the cluster names (job "worker").
    directory: where logs, results and files the scenarios write go.
  """

  def __init__(self, num_workers, directory, num_ps=0):
    self.num_workers = num_workers
    self.num_ps = num_ps
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    ports = [f"127.0.0.1:{p}" for p in free_ports(num_workers + (num_ps + 1 if num_ps else 0))]
    self.addresses = ports[:num_workers]
    self.cluster = {"worker": self.addresses}
    if num_ps:
      self.cluster.update(chief=ports[num_workers:num_workers + 1],
                          ps=ports[num_workers + 1:])
    self._processes = {}
    self._services = {}  # parameter-server tasks that only serve

  def tf_config(self, index):
    job, index = ("worker", index) if isinstance(index, int) else index
    return json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})

  def start(self, scenario, module="tfd", skip=(), env=None, args=None):
    """Starts every worker but those in `skip`, running `scenario` with
    `module` ("tfd" or "tf") and `args` (a JSON-able dict). If one cannot
    be started, those already started are killed."""
    base_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                    PYTHONPATH=os.pathsep.join(
                        [str(REPO_ROOT), str(WORKER.parent)] +
                        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    base_env.pop("TF_CONFIG", None)
    base_env.update(env or {})
    self._env = base_env
    try:
      if self.num_ps:
        if (args or {}).get("servers") != "in_process":
          for task in self._serving_tasks():
            self._start_worker(task, "serve", module, dict(base_env), None)
        self._start_worker(("chief", 0), scenario, module, dict(base_env), args)
        return
      for index in range(self.num_workers):
        if index not in skip:
          self._start_worker(index, scenario, module, dict(base_env), args)
    except BaseException:
      self.stop()
      raise

  def _serving_tasks(self):
    return ([("worker", i) for i in range(self.num_workers)] +
            [("ps", i) for i in range(self.num_ps)])

  def _start_worker(self, index, scenario, module, env, args):
    env["TF_CONFIG"] = self.tf_config(index)
    self._path(index, "json").unlink(missing_ok=True)
    with open(self._path(index, "log"), "a" if scenario == "serve" else "w") as log:
      process = subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, str(WORKER), scenario, module, str(self.directory),
           json.dumps(args or {}), str(self._path(index, "json"))],
          env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    (self._services if scenario == "serve" else self._processes)[index] = process

  def _answer_requests(self):
    """Kills or restarts the tasks a scenario asked for (files
    `request-N.json`), then answers with `request-N.done`."""
    for path in sorted(self.directory.glob("request-*.json")):
      request = json.loads(path.read_text())
      task = (request["job"], request["index"])
      if request["action"] == "kill":
        self._kill_process(self._services.pop(task))
      else:
        self._start_worker(task, "serve", "tf", dict(self._env), None)
      path.rename(path.with_suffix(".done"))

  def wait_for_file(self, path, timeout):
    """Waits until `path` exists (a worker's signal); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if pathlib.Path(path).exists():
        return True
      if any(p.poll() is not None for p in self._processes.values()):
        return pathlib.Path(path).exists()
      time.sleep(0.05)
    return False

  def send_signal(self, index, signum, timeout=30):
    """Sends worker `index` the signal `signum`, by its process id; returns
    once the worker has taken it (the kernel holds it pending no longer:
    its handler has run or is running, or the signal ended the worker)."""
    process = self._processes[index]
    os.kill(process.pid, signum)
    deadline = time.monotonic() + timeout
    while process.poll() is None and _signal_pending(process.pid, signum):
      if time.monotonic() > deadline:
        raise WorkerFailed(f"worker {index} did not take signal {signum} in {timeout} s\n"
                           + self.logs())
      time.sleep(0.01)

  def exit_code(self, index):
    """Worker `index`'s exit code, None while it runs."""
    return self._processes[index].poll()

  def wait_for_exits(self, timeout):
    """Waits at most `timeout` seconds until every started worker has
    exited; their exit codes by index (those still running are killed and
    reported as None)."""
    deadline = time.monotonic() + timeout
    try:
      while (any(p.poll() is None for p in self._processes.values())
             and time.monotonic() < deadline):
        time.sleep(0.05)
      return {index: p.poll() for index, p in sorted(self._processes.items())}
    finally:
      self.stop()

  def kill(self, index):
    """Kills worker `index` by its process id, at once (SIGKILL); `finish`
    then waits for the others only."""
    self._kill_process(self._processes.pop(index))

  @staticmethod
  def _kill_process(process):
    if process.poll() is None:
      os.kill(process.pid, signal.SIGKILL)
      process.wait(timeout=10)

  def finish(self, timeout):
    """Waits at most `timeout` seconds until every started worker has
    written its result (what its scenario returned, or {"error": ...,
    "type": ...}), then kills them all; returns the results by index."""
    deadline = time.monotonic() + timeout
    try:
      results = {}
      while len(results) < len(self._processes):
        self._answer_requests()
        for index, process in self._processes.items():
          path = self._path(index, "json")
          if index not in results and path.exists():
            results[index] = json.loads(path.read_text())
          elif index not in results and process.poll() is not None:
            raise WorkerFailed(f"worker {index} exited with status "
                               f"{process.returncode} and no result\n" + self.logs())
        if time.monotonic() > deadline:
          missing = sorted(set(self._processes) - set(results))
          raise WorkerFailed(f"workers {missing} ran past {timeout} s\n" + self.logs())
        time.sleep(0.05)
      return dict(sorted(results.items()))
    finally:
      self.stop()

  def run(self, scenario, module="tfd", timeout=120, **start_args):
    """`start`, then `finish`: each worker's result, by task index."""
    self.start(scenario, module, **start_args)
    return self.finish(timeout)

  def stop(self):
    """Kills every worker (and serving task) still running, by process id."""
    for index in list(self._processes):
      self.kill(index)
    for task in list(self._services):
      self._kill_process(self._services.pop(task))

  def logs(self):
    tasks = list(range(self.num_workers))
    if self.num_ps:
      tasks = [("chief", 0)] + self._serving_tasks()
    return "\n".join(f"--- {self._path(i, 'log').stem} log:\n"
                     f"{self._path(i, 'log').read_text()[-4000:]}"
                     for i in tasks if self._path(i, "log").exists())

  def _path(self, index, kind):
    name = f"worker{index}" if isinstance(index, int) else f"{index[0]}{index[1]}"
    return self.directory / f"{name}.{kind}"
