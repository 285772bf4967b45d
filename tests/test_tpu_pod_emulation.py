"""Emulated multi-host TPU slices: a process per host on 127.0.0.1, the
program that makes the resolver as their client, and the hosts' lifetime.

The slice a client connects to is its process's state, so the clients run
in fresh processes (tests/tpu_pod_client.py); one v4-32 (4 hosts) is shared
by the tests that read its answers. Every wait is bounded and every process
started here is killed by its id.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tf_distribute_lite as tfd
from tf_distribute_lite import tpu_pod_emulation

from multi_worker import free_ports
import oracle

HERE = pathlib.Path(__file__).resolve().parent
OURS = tfd.cluster_resolver.TPUClusterResolver
WORKERS = [f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
           for task in range(4) for core in range(4)]


def _gone(pid):
  """Whether process `pid` has ended (a zombie has)."""
  return tpu_pod_emulation.process_state(pid) in (None, "Z")


def _wait_until_gone(pids, timeout=30):
  deadline = time.monotonic() + timeout
  while not all(map(_gone, pids)) and time.monotonic() < deadline:
    time.sleep(0.1)
  return [pid for pid in pids if not _gone(pid)]


def _kill(pids):
  for pid in pids:
    if not _gone(pid):
      os.kill(pid, 9)


@pytest.fixture(scope="module")
def v4_32():
  """What the client of an emulated v4-32 saw, and whether its hosts were
  gone once it exited."""
  env = dict(os.environ, TPU_NAME="emulated:v4-32")
  result = subprocess.run([sys.executable, str(HERE / "tpu_pod_client.py")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  answers = json.loads(result.stdout.strip().splitlines()[-1])
  answers["left_running"] = _wait_until_gone(answers["pids"])
  _kill(answers["left_running"])
  return answers


@pytest.mark.multi_worker
def test_the_resolver_lists_the_hosts_as_workers(v4_32):
  workers = v4_32["cluster"]["worker"]
  assert list(v4_32["cluster"]) == ["worker"] and len(workers) == 4
  assert all(address.startswith("127.0.0.1:") for address in workers)
  assert v4_32["master"] == v4_32["get_master"] == f"grpc://{workers[0]}"
  assert v4_32["task"] == ["worker", 0]
  assert v4_32["shared"] == v4_32["cluster"]  # a second resolver, the same hosts


@pytest.mark.multi_worker
def test_the_resolver_answers_as_a_v4_32_slice(v4_32):
  assert v4_32["accelerators"] == {"TPU": 4}  # cores per host, as TensorFlow counts
  assert v4_32["metadata"] == [16, 4, 4, 4, 4]
  assert v4_32["metadata_devices"] == WORKERS
  tasks, per_task, mesh, coordinates = v4_32["topology"]
  assert (tasks, per_task, mesh) == (4, 4, [2, 2, 4, 1])
  assert coordinates[2] == [[0, 0, 2, 0], [1, 0, 2, 0], [0, 1, 2, 0], [1, 1, 2, 0]]
  assert (v4_32["feature_before"], v4_32["feature_after"]) == ("None", "TPUHardwareFeature")


@pytest.mark.multi_worker
def test_the_client_sees_every_hosts_devices_and_sums_across_hosts(v4_32):
  assert set(WORKERS) <= set(v4_32["devices"])
  assert v4_32["sum"] == [5.0, ["/job:worker/replica:0/task:1/device:CPU:2",
                                "/job:worker/replica:0/task:3/device:CPU:1",
                                "/job:worker/replica:0/task:3/device:CPU:1"]]


@pytest.mark.multi_worker
def test_the_hosts_end_when_the_client_exits(v4_32):
  assert len(v4_32["pids"]) == 4
  assert v4_32["left_running"] == []


@pytest.mark.multi_worker
def test_the_hosts_end_when_the_client_is_killed():
  script = ("import sys, time, tf_distribute_lite as tfd\n"
            "resolver = tfd.cluster_resolver.TPUClusterResolver('emulated:v4-16')\n"
            "print(*resolver._hosts.pids, flush=True)\n"
            "time.sleep(300)\n")
  client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
  pids = []
  try:
    pids = [int(pid) for pid in client.stdout.readline().split()]
    assert len(pids) == 2
    client.kill()
    client.wait(30)
    assert _wait_until_gone(pids) == []
  finally:
    client.kill()
    client.wait(30)
    _kill(pids)


def _listener():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  return server, f"127.0.0.1:{server.getsockname()[1]}"


def test_a_host_that_never_answers_is_named(monkeypatch):
  """Hosts the user started: host 0 answers, host 1 never does."""
  monkeypatch.setenv(tpu_pod_emulation.START_SECONDS_VARIABLE, "0.5")
  server, first = _listener()
  (port,) = free_ports(1)
  with server, pytest.raises(RuntimeError, match=(
      rf"^Host 1 of the emulated TPU slice v4-16 \(task 1 of job 'worker', "
      rf"127.0.0.1:{port}\) did not accept connections within 0.5 s "
      rf"\(\${tpu_pod_emulation.START_SECONDS_VARIABLE}\)$")):
    OURS(f"emulated:v4-16@{first},127.0.0.1:{port}")


def test_named_hosts_that_answer_are_the_cluster():
  first, second = _listener(), _listener()
  with first[0], second[0]:
    resolver = OURS(f"emulated:v4-16@{first[1]},{second[1]}")
    assert resolver.cluster_spec().as_dict() == {"worker": [first[1], second[1]]}
    assert resolver.master() == f"grpc://{first[1]}"
    assert resolver.num_accelerators() == {"TPU": 4}
    assert resolver.emulated_slice.tpu_name == f"emulated:v4-16@{first[1]},{second[1]}"


def test_a_host_that_exits_is_named_and_the_others_are_ended(monkeypatch):
  started = []

  class Recorded(subprocess.Popen):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      started.append(self)

  def command(tpu, task, parent=None):
    del tpu, parent
    if task == 2:
      return [sys.executable, "-c", "import sys; sys.exit('host 2 failed to start')"]
    return [sys.executable, "-c", "import time; time.sleep(60)"]
  monkeypatch.setattr(tpu_pod_emulation.subprocess, "Popen", Recorded)
  monkeypatch.setattr(tpu_pod_emulation, "host_command", command)
  try:
    with pytest.raises(RuntimeError, match=(
        r"(?s)^Host 2 of the emulated TPU slice v4-32 \(task 2 of job 'worker', "
        r"127.0.0.1:\d+\) exited with status 1; its log ends:\nhost 2 failed to start")):
      OURS("emulated:v4-32")
    assert len(started) == 4 and all(p.poll() is not None for p in started)
  finally:
    for process in started:
      process.kill()
      process.wait(30)


@pytest.mark.parametrize("tpu, message", [
    ("emulated:v4-8@127.0.0.1:5000", "a one-host slice names none"),
    ("emulated:v4-32@127.0.0.1:5000,127.0.0.1:5001", "must name the 4 hosts"),
    ("emulated:v4-16@127.0.0.1,127.0.0.1:5001", "each as ip:port")])
def test_badly_named_hosts_say_what_is_expected(tpu, message):
  with pytest.raises(ValueError, match=message):
    OURS(tpu)


def test_a_host_refuses_a_slice_without_its_hosts(capsys):
  with pytest.raises(SystemExit):
    tpu_pod_emulation.main(["--tpu", "emulated:v4-32", "--task", "0"])
  assert "--tpu must name an emulated multi-host slice and its hosts" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pod_programs(tmp_path_factory):
  """tests/tpu_pod_programs.py's answers on an emulated v4-32."""
  env = dict(os.environ, TPU_NAME="emulated:v4-32")
  result = subprocess.run([sys.executable, str(HERE / "tpu_pod_programs.py"),
                           str(tmp_path_factory.mktemp("pod"))], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.multi_worker
def test_tpu_strategy_spans_the_hosts(pod_programs):
  assert pod_programs["strategy"] == [16, 4, 4]  # replicas, hosts, replicas per host
  assert pod_programs["values"] == {"replicas": 16, "on_worker_devices": True, "sum": 120.0}


@pytest.mark.multi_worker
def test_each_host_reads_its_share_of_the_global_batch_on_its_cpu(pod_programs):
  """As TensorFlow cuts a global batch across workers: each host's share
  in pieces, one per replica of that host."""
  got = pod_programs["input"]
  assert got["values"] == [[h * 2 + 8 * r, h * 2 + 8 * r + 1] for h in range(4) for r in range(4)]
  assert got["pipelines"] == [f"/job:worker/replica:0/task:{h}/device:CPU:0"
                              for h in range(4) for _ in range(4)]
  assert got["replicas"] == [h for h in range(4) for _ in range(4)] and got["same_device"]
  assert got["contexts"] == [[4, h] for h in range(4)]
  assert got["from_function"] == [[100 * h + 2 * r, 100 * h + 2 * r + 1]
                                  for h in range(4) for r in range(4)]
  assert got["from_function_pipelines"] == got["replicas"]


@pytest.mark.multi_worker
def test_reductions_across_hosts(pod_programs):
  ids = [float(i) for i in range(1, 17)]
  assert pod_programs["reductions"] == {"all_reduce": [136.0, 136.0, 8.5], "all_gather": ids,
                                        "reduce": [136.0, [8.5]], "gather": ids}


@pytest.mark.multi_worker
def test_spec_programs_and_training_give_the_single_host_numbers(pod_programs):
  assert pod_programs["spec_2_0"] == {"sums": [120.0, 376.0], "from_function": [16.0, 16.0],
                                      "numpy": [16.0]}
  assert pod_programs["training"] == {"losses_equal": True, "weights_equal": True,
                                      "loss_fell": True}


@pytest.mark.multi_worker
def test_a_device_assignment_of_replicas_spanning_two_hosts(pod_programs):
  assert pod_programs["model_parallel"] == {"replicas": 8, "hosts": [2, 2],
                                            "replica_0_tasks": [0, 1], "equal": True}


@pytest.mark.multi_worker
def test_checkpoints_move_between_the_pod_and_one_host(pod_programs):
  assert pod_programs["checkpoints"] == {"on_one_host": [1.0, 2.0],
                                         "on_the_pod": [[3.0, 4.0]] * 4}


@pytest.mark.multi_worker
def test_tf_keras_fit_on_the_pod_equals_one_host(pod_programs):
  oracle.assert_same_numbers(pod_programs["tf_keras"]["pod"], pod_programs["tf_keras"]["local"],
                             1e-5)


@pytest.mark.multi_worker
def test_a_step_right_after_iter_reads_started_iterators_on_busy_hosts(pod_programs):
  assert pod_programs["busy_hosts"] == [1.0 * sum(range(32))] * 6


@pytest.mark.multi_worker
def test_keras_fit_on_the_pod_equals_one_host(pod_programs):
  oracle.assert_same_numbers(pod_programs["keras"]["pod"], pod_programs["keras"]["local"], 1e-5)


@pytest.mark.multi_worker
def test_orbit_controller_trains_checkpoints_and_restores_on_the_pod(pod_programs):
  orbit = pod_programs["orbit"]
  losses = [o["training_loss"] for kind, o in orbit["outputs"] if kind == "train"]
  assert len(losses) == 4 and losses[-1] < losses[0]
  assert orbit["restored"] == {"step": 6, "weights_equal": True}
  assert [step for step, _ in orbit["summaries"]["train/train_accuracy"]] == [2, 4, 6, 8]
  assert orbit["checkpoints"] == ["ckpt-2.index", "ckpt-6.index", "ckpt-8.index"]


@pytest.mark.multi_worker
def test_orbit_controller_on_the_pod_equals_one_host_when_replicas_read_the_same_data(
    pod_programs):
  """Each host's pipeline gives its replicas the batches one pipeline gives
  the same replicas on one host (tests/orbit_programs.per_replica_batches)."""
  pod, local = pod_programs["orbit_replica_data"]["pod"], pod_programs["orbit_replica_data"]["local"]
  oracle.assert_same_numbers(pod, local, 1e-5)
  assert local["step"] == 4 and len(local["outputs"]) == 2
  assert local["outputs"][1]["training_loss"] < local["outputs"][0]["training_loss"]


def _fault_client(mode, workdir, exit_code=0):
  """tests/tpu_pod_faults.py's answer in `mode` on an emulated v4-16, from a
  client that exits with `exit_code`; the client and the hosts it printed are
  killed by pid, even on failure (hosts that outlive a client's exit by 30 s
  are listed in the answer's "left_running")."""
  client = subprocess.Popen(
      [sys.executable, str(HERE / "tpu_pod_faults.py"), mode, str(workdir)],
      env=dict(os.environ, TPU_NAME="emulated:v4-16"), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  out = err = ""
  left_running = None
  try:
    out, err = client.communicate(timeout=180)
    lines = out.splitlines()
    left_running = _wait_until_gone([int(pid) for pid in lines[0].split()] if lines else [])
  except subprocess.TimeoutExpired:
    client.kill()
    out, err = client.communicate()
  finally:
    client.kill()
    client.wait(30)
    lines = out.splitlines()
    _kill([int(pid) for pid in lines[0].split()] if lines else [])
  assert client.returncode == exit_code, err[-3000:]
  return dict(json.loads(lines[-1]), left_running=left_running)


@pytest.fixture(scope="module")
def killed_host(tmp_path_factory):
  """A training loop whose host 1 is killed after 3 checkpointed steps."""
  workdir = tmp_path_factory.mktemp("faults") / "ckpt"
  return _fault_client("kill", workdir), workdir


def _host_1(what):
  return (rf"^Host 1 of the emulated TPU slice v4-16 \(task 1 of job 'worker', "
          rf"127\.0\.0\.1:\d+\) {what}; its log ends:\n")


@pytest.mark.multi_worker
def test_a_host_that_dies_in_training_is_named_and_the_others_are_ended(killed_host):
  answer, _ = killed_host
  name, unavailable, message = answer["error"]
  assert (name, unavailable) == ("UnavailableError", True)  # TensorFlow's class
  assert re.match(_host_1("exited with status -9"), message)
  assert answer["running"] == []
  assert (len(answer["losses"]), answer["checkpoint"]) == (3, "ckpt-3")


@pytest.mark.multi_worker
def test_a_stopped_host_is_ended_and_named_instead_of_hanging(tmp_path):
  answer = _fault_client("stop", tmp_path / "ckpt")
  name, unavailable, message = answer["error"]
  assert (name, unavailable) == ("UnavailableError", True)
  assert re.match(_host_1(r"stayed stopped \(SIGSTOP\) for 5 s; it was ended"), message)
  assert answer["running"] == []


def _assert_same_training(losses, weights, expected_losses, expected_weights):
  """Equal up to float reassociation: a step's sums across hosts may add
  in another order from one run to the next."""
  assert len(losses) == len(expected_losses)
  np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
  np.testing.assert_allclose(weights, expected_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.multi_worker
def test_a_restarted_job_resumes_from_its_last_checkpoint(killed_host):
  """Started again on a new pod, the killed job's last 3 steps give the
  numbers of the 6 steps trained without a fault."""
  before, workdir = killed_host
  after = _fault_client("resume", workdir)
  _assert_same_training(before["losses"] + after["losses"], after["weights"],
                        after["again"], after["weights_again"])


@pytest.mark.multi_worker
def test_a_preempted_job_saves_exits_and_resumes_where_the_handler_saved(tmp_path):
  """PreemptionCheckpointHandler on the emulated pod as on one host: the
  client gets SIGTERM after step 3, saves after step 4, exits with 42 (its
  hosts end with it); started again, it resumes at step 4 and its steps give
  the numbers of 6 steps trained without a notice."""
  workdir = str(tmp_path / "ckpt")
  before = _fault_client("preempt", workdir, exit_code=42)
  assert len(before["losses"]) == 4 and before["restored"] == {"losses": 0}
  assert before["left_running"] == []
  after = _fault_client("preempt", workdir)
  assert after["restored"] == {"losses": 4, "again": 0}
  _assert_same_training(before["losses"] + after["losses"], after["weights"],
                        after["again"], after["weights_again"])
