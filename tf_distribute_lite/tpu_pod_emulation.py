"""The hosts of an emulated multi-host TPU slice (README: "Testing pod
programs without a pod"): a local process per host serves its cores as
logical CPU devices of task i of job "worker" on 127.0.0.1; the program
holding the `TPUClusterResolver("emulated:v4-32")` is their client. A host is
this module run as a program (`host_command`); hosts started by hand serve
until killed, and "emulated:v4-32@<their addresses>" names them:

    python -m tf_distribute_lite.tpu_pod_emulation --task 2 \\
        --tpu emulated:v4-32@127.0.0.1:5000,127.0.0.1:5001,127.0.0.1:5002,127.0.0.1:5003

`start` waits at most `$TF_DISTRIBUTE_LITE_POD_START_SECONDS` (120 s) for the
hosts. Those it started end with the client (each within 0.5 s of its parent's
death, even by SIGKILL) and are watched: once one exits or stays stopped
(SIGSTOP) 5 s, the others are ended and an eager `TPUStrategy.run` or `reduce`
names it in TensorFlow's error. Hosts started by hand are not watched: a
stopped one hangs the client (TensorFlow's eager RPCs have no deadline).
"""

import argparse
import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import tensorflow as tf

from tf_distribute_lite import tpu_emulation

START_SECONDS_VARIABLE = "TF_DISTRIBUTE_LITE_POD_START_SECONDS"
_START_SECONDS = 120.0
_POLL_SECONDS = 0.5
_KILL_WAIT_SECONDS = 10.0
_STOPPED_SECONDS = 5.0  # a started host stopped this long is lost
_LOST_WAIT_SECONDS = 2.0  # how long a failed step waits for the watch to name a host
_started = {}  # slice type -> the `Hosts` this program started


def host_command(tpu, task, parent=None):
  """The command running host `task` of the slice named `tpu`; with
  `parent`, the host exits once that process is no longer its parent."""
  command = [sys.executable, "-m", __name__, "--tpu", tpu, "--task", str(task)]
  return command + ["--parent", str(parent)] if parent is not None else command


class Hosts:
  """The running hosts of `tpu_slice`, and the processes of those this
  program started (none when the user did), which a thread watches."""

  def __init__(self, tpu_slice, processes=(), logs=()):
    self.tpu_slice = tpu_slice
    self._processes = list(processes)
    self._logs = list(logs)
    self._lock = threading.RLock()
    self._ended = threading.Event()
    self.lost = None  # the message naming the started host that was lost
    if self._processes:
      threading.Thread(target=self._watch, name="emulated TPU hosts", daemon=True).start()

  @property
  def pids(self):
    return [process.pid for process in self._processes]

  def check(self):
    """Raises `RuntimeError` naming a started host that was lost."""
    if self.lost is not None:
      raise RuntimeError(self.lost)

  def wait(self, timeout):
    """Returns once every host answers; raises once one is lost or at `timeout`."""
    deadline = time.monotonic() + timeout
    for task, address in enumerate(self.tpu_slice.addresses):
      while not _accepts(address):
        if time.monotonic() >= deadline:
          self._lose(task, f"did not accept connections within {timeout:g} s "
                           f"(${START_SECONDS_VARIABLE})")
        self.check()
        time.sleep(_POLL_SECONDS)
    self.check()

  def stop(self, lost=None):
    """Ends the hosts this program started, by process id; then (so that
    who sees `lost` finds them ended) names in `lost` the host that was lost."""
    with self._lock:
      for process in self._processes:
        if process.poll() is None:
          process.kill()
      for process in self._processes:
        process.wait(_KILL_WAIT_SECONDS)
      for log in self._logs:
        log.close()
      self._processes, self._logs = [], []
      self.lost = self.lost or lost
      self._ended.set()
      if _started.get(self.tpu_slice.name) is self:
        del _started[self.tpu_slice.name]

  def end_at_exit(self):
    """Leaves the hosts to end once the client has (within `_POLL_SECONDS`),
    after TensorFlow's last messages to them (ending them first makes
    TensorFlow log errors); a stopped host cannot, so it is killed."""
    for process in self._processes:
      if process_state(process.pid) == "T":
        process.kill()

  def _watch(self):
    stopped_since = {}
    while self._processes and self.lost is None:
      now = time.monotonic()
      for task, process in enumerate(self._processes):
        if process.poll() is not None:
          self._lose(task, f"exited with status {process.returncode}")
          break
        if process_state(process.pid) != "T":
          stopped_since.pop(task, None)
        elif now - stopped_since.setdefault(task, now) >= _STOPPED_SECONDS:
          self._lose(task, f"stayed stopped (SIGSTOP) for {_STOPPED_SECONDS:g} s; it was ended")
          break
      time.sleep(_POLL_SECONDS)

  def _lose(self, task, what):
    """Ends the hosts and names host `task` in `lost` (unless they had ended)."""
    with self._lock:
      lost = None
      if not self._ended.is_set():
        log = ""
        if self._logs:
          self._logs[task].seek(0)
          log = "; its log ends:\n" + self._logs[task].read()[-2000:]
        lost = (f"Host {task} of the emulated TPU slice {self.tpu_slice.name} (task {task} "
                f"of job 'worker', {self.tpu_slice.addresses[task]}) {what}{log}")
      self.stop(lost)


@contextlib.contextmanager
def naming_a_lost_host(hosts):
  """Raises an `UnavailableError` or `AbortedError` again, its message naming
  the host `hosts` (a `Hosts` or None) lost, if one was."""
  try:
    yield
  except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
    if hosts and hosts._processes:  # the watch may not have seen it yet
      hosts._ended.wait(_LOST_WAIT_SECONDS)
    if not (hosts and hosts.lost):
      raise
    raise type(error)(error.node_def, error.op, hosts.lost) from error


def start(tpu_slice):
  """The slice's hosts (started here unless `tpu_slice.addresses` names them)
  once they answer, or `RuntimeError` naming one, with its log. The resolvers
  of a slice type share the hosts started first for it."""
  if tpu_slice.addresses:
    hosts = Hosts(tpu_slice)
  elif tpu_slice.name in _started:
    hosts = _started[tpu_slice.name]
    hosts.check()
    return hosts
  else:
    tpu_slice = tpu_slice.on(_free_addresses(tpu_slice.num_hosts))
    logs = [tempfile.TemporaryFile("w+") for _ in range(tpu_slice.num_hosts)]
    processes = [
        subprocess.Popen(host_command(tpu_slice.tpu_name, task, os.getpid()),
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for task, log in enumerate(logs)]
    hosts = _started[tpu_slice.name] = Hosts(tpu_slice, processes, logs)
    atexit.register(hosts.end_at_exit)
  hosts.wait(float(os.environ.get(START_SECONDS_VARIABLE) or _START_SECONDS))
  return hosts


def connect(cluster_resolver):
  """Connects to the resolver's emulated hosts unless their devices are visible."""
  visible = {device.name for device in tf.config.list_logical_devices()}
  if not set(cluster_resolver.emulated_slice.devices) <= visible:
    tf.config.experimental_connect_to_cluster(cluster_resolver)


def _free_addresses(count):
  """`count` 127.0.0.1 addresses whose ports nothing listens on now."""
  with contextlib.ExitStack() as stack:
    sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return tuple(f"127.0.0.1:{s.getsockname()[1]}" for s in sockets)


def _accepts(address):
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host, int(port)), timeout=_POLL_SECONDS):
      return True
  except OSError:
    return False


def process_state(pid):
  """Linux's state letter of process `pid` ("T" stopped, "Z" ended but not
  yet reaped, ...), or None once it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()[0]
  except OSError:
    return None


def serve(tpu_slice, task, parent=None):
  """Serves host `task` of the slice until `parent`, if given, stops being the parent."""
  config = tf.compat.v1.ConfigProto(device_count={"CPU": tpu_slice.num_cores_per_host})
  # The server serves until this process ends, its Python object gone or not.
  tf.distribute.Server({"worker": list(tpu_slice.addresses)}, job_name="worker",
                       task_index=task, protocol="grpc", config=config, start=True)
  while parent is None or os.getppid() == parent:
    time.sleep(_POLL_SECONDS)
  os._exit(0)  # Leaves without shutting the server down, which can block.


def main(argv=None):
  parser = argparse.ArgumentParser(description="Runs one host of an emulated TPU slice.")
  parser.add_argument("--tpu", required=True,
                      help="emulated:<type>@<address of host 0>,<address of host 1>,...")
  parser.add_argument("--task", type=int, required=True, help="this host's index")
  parser.add_argument("--parent", type=int, help="exit when this process is gone")
  args = parser.parse_args(argv)
  tpu_slice = tpu_emulation.parse(args.tpu)
  if tpu_slice is None or not tpu_slice.addresses:
    parser.error(f"--tpu must name an emulated multi-host slice and its hosts; got {args.tpu!r}")
  if not 0 <= args.task < tpu_slice.num_hosts:
    parser.error(f"--task must be in [0, {tpu_slice.num_hosts}); got {args.task}")
  serve(tpu_slice, args.task, args.parent)


if __name__ == "__main__":
  main()
