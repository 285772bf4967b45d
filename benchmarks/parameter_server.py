"""Benchmarks parameter-server training (`ParameterServerStrategy` and
`ClusterCoordinator`) of tf.distribute and tf_distribute_lite on a cluster
of 2 workers and 2 ps on this machine.

    python benchmarks/parameter_server.py [--repeats N] [--quick]

Each repeat starts a fresh cluster on 127.0.0.1 for each implementation in
turn: 4 server processes (`tf.distribute.Server`, the same for both) and a
chief process, the coordinator, which measures every scenario
(`python parameter_server.py --chief IMPL`). The table shows the chief's
medians across repeats, the ratio tfd / tf.distribute and whether both
learned the same; the exit code is 1 if a measurement failed or disagreed.

The model is the MLP of `mlp_step` (784-256-10, SGD), its variables on the
ps tasks; each worker reads one fixed global batch of 256 from its
per-worker dataset, so that a step's result does not depend on the worker
that runs it.

* `ps_train_step`: ms per scheduled training step: rounds of steps scheduled
  back to back (`schedule` of the traced step with the per-worker
  iterator), then one `join`; a round's time over its steps. The steps'
  `RemoteValue`s are held (their losses are fetched afterwards, for the
  check), so both implementations copy each loss to the coordinator before
  `join` returns.
* `ps_train_step_chief_cpu`: the chief's CPU time (user and system, all its
  threads) per step of `ps_train_step`: what coordinating costs, which the
  machine's load changes less than it changes wall time.
* `ps_train_step_dropped`: the same, no `RemoteValue` held once `schedule`
  returns (a loop that ignores the losses): neither copies them.
* `ps_schedule`: ms that one `schedule` call of `ps_train_step` takes to
  return (tracing done, the workers busy with the steps before it).
* `ps_join_idle`: ms of `join()` with nothing scheduled.
* `ps_join_after_tiny`: ms of `join()` called right after `schedule` of a
  tiny function (a scalar computed on the worker), its `RemoteValue` held:
  the function's round trip to a worker, the copy of its scalar and the
  wake-up of `join`.
* `ps_join_after_tiny_dropped`: the same, the `RemoteValue` dropped at once.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

import multi_worker
import run
import scenarios

HERE = pathlib.Path(__file__).resolve().parent
IMPLS = ("tf.distribute", "tfd")
SCENARIOS = ("ps_train_step", "ps_train_step_chief_cpu", "ps_train_step_dropped", "ps_schedule",
             "ps_join_idle", "ps_join_after_tiny", "ps_join_after_tiny_dropped")
NUM_WORKERS, NUM_PS = 2, 2
SERVER_START_SECONDS = 120
CHECKED_STEPS = 3  # scheduled one at a time: learned the same, exactly


@dataclasses.dataclass(frozen=True)
class Counts:
  """How much each chief measures; fixed counts, so that every run does the
  same work."""
  warmup_steps: int = 20
  rounds: int = 5
  steps_per_round: int = 50
  join_calls: int = 50


QUICK = Counts(warmup_steps=3, rounds=2, steps_per_round=5, join_calls=5)


# --- Chief: the coordinator, every scenario.


def chief(impl, quick):
  """Measures every scenario as the cluster's chief; prints one JSON line."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if impl == "tfd":
    sys.path.insert(0, str(HERE.parent))
    import tf_distribute_lite as module  # pylint: disable=g-import-not-at-top
  else:
    module = tf.distribute
  counts = QUICK if quick else Counts()
  results = {}
  try:
    strategy = module.experimental.ParameterServerStrategy(
        module.cluster_resolver.TFConfigClusterResolver())
    coordinator = module.experimental.coordinator.ClusterCoordinator(strategy)
    for measure in (_training, _joins):
      results.update(measure(strategy, coordinator, counts))
  except Exception as e:  # pylint: disable=broad-except
    error = {"error": f"{type(e).__name__}: {run._summary(e)}"}  # pylint: disable=protected-access
    results.update({name: error for name in SCENARIOS if name not in results})
  print(json.dumps(results))
  sys.stdout.flush()
  os._exit(0)  # Skips TensorFlow's slow teardown.


def _training(strategy, coordinator, counts):
  """The `ps_train_step*` and `ps_schedule` rows."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  initial, x, y = multi_worker.mlp_data()
  with strategy.scope():
    params = [tf.Variable(v) for v in initial]
    steps_run = tf.Variable(0, dtype=tf.int64)
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((x, y)).repeat()))

  def step_fn(batch):
    loss, grads = scenarios.loss_and_grads(params, *batch, replicas=1)
    for v, g in zip(params, grads):
      v.assign_sub(scenarios.LEARNING_RATE * g)
    steps_run.assign_add(1)
    return loss

  @tf.function
  def train_step(iterator):
    return strategy.run(step_fn, args=(next(iterator),))

  # Steps one at a time give each implementation the same weights; the
  # timed steps overlap, and read weights that the other worker is updating,
  # so their losses differ from run to run: they are checked for learning.
  losses = [float(coordinator.fetch(coordinator.schedule(train_step, args=(iterator,))))
            for _ in range(CHECKED_STEPS)]
  change = sum(scenarios.checksum(p.numpy() - w0, np.abs) for p, w0 in zip(params, initial))
  for _ in range(counts.warmup_steps):
    coordinator.schedule(train_step, args=(iterator,))
  coordinator.join()
  cpu_start = time.process_time()
  step_ms, schedule_ms, kept = _rounds(coordinator, train_step, (iterator,), counts, keep=True)
  cpu_ms = (time.process_time() - cpu_start) * 1e3 / (counts.rounds * counts.steps_per_round)
  kept_ran = {"steps_run": float(steps_run.numpy())}
  dropped_ms, _, _ = _rounds(coordinator, train_step, (iterator,), counts, keep=False)
  fingerprint = dict(kept_ran, loss_1=losses[0], loss_3=losses[-1], weight_change=change,
                     timed_steps_learned=float(np.mean([v.fetch() for v in kept]) < losses[0]))
  return {
      "ps_train_step": {"value": statistics.median(step_ms), "fingerprint": fingerprint},
      "ps_train_step_chief_cpu": {"value": cpu_ms, "fingerprint": kept_ran},
      "ps_train_step_dropped": {"value": statistics.median(dropped_ms),
                                "fingerprint": {"steps_run": float(steps_run.numpy())}},
      "ps_schedule": {"value": statistics.median(schedule_ms), "fingerprint": kept_ran}}


def _rounds(coordinator, fn, args, counts, keep):
  """Rounds of `fn(*args)` scheduled back to back, then joined: ms per
  function of each round, ms of each `schedule`, and the `RemoteValue`s if
  `keep` (else none is held once `schedule` returns)."""
  function_ms, schedule_ms, kept = [], [], []
  for _ in range(counts.rounds):
    start = time.perf_counter()
    for _ in range(counts.steps_per_round):
      before = time.perf_counter()
      if keep:
        kept.append(coordinator.schedule(fn, args=args))
      else:
        coordinator.schedule(fn, args=args)
      schedule_ms.append((time.perf_counter() - before) * 1e3)
    coordinator.join()
    function_ms.append((time.perf_counter() - start) * 1e3 / counts.steps_per_round)
  return function_ms, schedule_ms, kept


def _joins(strategy, coordinator, counts):
  """The `ps_join_idle`, `ps_join_after_tiny` and `ps_join_after_tiny_dropped`
  rows."""
  del strategy
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def tiny():
    return tf.ones([]) * 2.0

  coordinator.join()
  coordinator.fetch(coordinator.schedule(tiny))  # traced
  idle_ms, kept_ms, dropped_ms, kept = [], [], [], []
  for _ in range(counts.join_calls):
    idle_ms.append(_join_ms(coordinator))
  for _ in range(counts.join_calls):
    kept.append(coordinator.schedule(tiny))
    kept_ms.append(_join_ms(coordinator))
  for _ in range(counts.join_calls):
    coordinator.schedule(tiny)
    dropped_ms.append(_join_ms(coordinator))
  done = {"done": float(coordinator.done())}
  return {
      "ps_join_idle": {"value": statistics.median(idle_ms), "fingerprint": done},
      "ps_join_after_tiny": {"value": statistics.median(kept_ms), "fingerprint": {
          "mean_value": float(np.mean([v.fetch() for v in kept]))}},
      "ps_join_after_tiny_dropped": {"value": statistics.median(dropped_ms),
                                     "fingerprint": done}}


def _join_ms(coordinator):
  start = time.perf_counter()
  coordinator.join()
  return (time.perf_counter() - start) * 1e3


def serve(lifetime, ready_path):
  """Serves as the task of `TF_CONFIG`, once listening says so by creating
  `ready_path`, until killed, the driver ends, or `lifetime` seconds have
  passed."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  config = json.loads(os.environ["TF_CONFIG"])
  tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), protocol="grpc",
                       job_name=config["task"]["type"], task_index=config["task"]["index"])
  pathlib.Path(ready_path).touch()
  driver, deadline = os.getppid(), time.monotonic() + lifetime
  while os.getppid() == driver and time.monotonic() < deadline:
    time.sleep(0.2)
  os._exit(0)


# --- Driver.


def run_cluster(impl, quick, timeout, directory):
  """The chief's results of one cluster run of `impl`, by scenario."""
  ports = multi_worker.free_ports(1 + NUM_WORKERS + NUM_PS)
  addresses = [f"127.0.0.1:{p}" for p in ports]
  cluster = {"chief": addresses[:1], "worker": addresses[1:1 + NUM_WORKERS],
             "ps": addresses[1 + NUM_WORKERS:]}
  script = str(HERE / "parameter_server.py")

  def start(job, index, args, **streams):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": job, "index": index}}))
    return subprocess.Popen([sys.executable, script, *args], env=env, **streams)  # pylint: disable=consider-using-with

  log_path = directory / f"{impl}-cluster.log"
  processes = []
  try:
    with open(log_path, "w") as log:
      ready = []
      for job in ("worker", "ps"):
        for index in range(len(cluster[job])):
          ready.append(directory / f"{impl}-{job}{index}.ready")
          ready[-1].unlink(missing_ok=True)
          lifetime = timeout + SERVER_START_SECONDS
          processes.append(start(job, index, ["--serve", str(lifetime), str(ready[-1])],
                                 stdout=subprocess.DEVNULL, stderr=log))
      deadline = time.monotonic() + SERVER_START_SECONDS
      while not all(path.exists() for path in ready):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
          return _failed(f"a server exited or did not start within {SERVER_START_SECONDS} s",
                         log_path)
        time.sleep(0.1)
      processes.append(start("chief", 0, ["--chief", impl] + (["--quick"] if quick else []),
                             stdout=subprocess.PIPE, stderr=log, text=True))
      try:
        out, _ = processes[-1].communicate(timeout=timeout)
      except subprocess.TimeoutExpired:
        return _failed(f"chief ran past {timeout} s", log_path)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else _failed(
        f"chief exited with code {processes[-1].returncode}", log_path)
  finally:
    for process in processes:
      if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
      process.wait(timeout=10)


def _failed(reason, log_path):
  error = {"error": f"{reason}: {log_path.read_text()[-2000:]}"}
  return {name: error for name in SCENARIOS}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  multi_worker.add_options(parser)
  parser.add_argument("--chief", metavar="IMPL", help=argparse.SUPPRESS)
  parser.add_argument("--serve", nargs=2, metavar=("LIFETIME", "READY"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.serve:
    serve(float(args.serve[0]), args.serve[1])
  if args.chief:
    chief(args.chief, args.quick)
  repeats = args.repeats or (1 if args.quick else 3)
  print(run.machine_summary())
  print(f"{NUM_WORKERS} workers and {NUM_PS} ps on 127.0.0.1, a chief coordinating; "
        f"{repeats} cluster(s) per implementation; the chief's times in ms, "
        f"medians across repeats{'; --quick' if args.quick else ''}", flush=True)
  return multi_worker.compare(
      lambda impl, directory: run_cluster(impl, args.quick, args.timeout, directory),
      SCENARIOS, repeats, "tfd_ps_bench")


if __name__ == "__main__":
  sys.exit(main())
