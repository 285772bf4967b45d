"""Benchmarks MultiWorkerMirroredStrategy of tf.distribute and tf_distribute_lite
across 2 worker processes on this machine.

    python benchmarks/multi_worker.py [--repeats N] [--quick]

Each repeat starts a fresh 2-task cluster on 127.0.0.1 (one process per task,
one replica each, on its CPU) for each implementation in turn, and every
task measures every scenario (`python multi_worker.py --worker IMPL` with its
`TF_CONFIG`). The table shows task 0's medians across repeats, the ratio
tfd / tf.distribute and whether both computed the same numbers; the exit
code is 1 if a measurement failed or disagreed.

* `mw_allreduce_16mb`: `ReplicaContext.all_reduce` (SUM) of 50 float32
  tensors of ~16 MB in all, inside a `tf.function`; ms per call.
* `mw_mlp_step`: one SGD step of a 784-256-10 MLP on a global batch of 256
  (128 per worker), gradients all-reduced across the workers; ms per step.
* `mw_keras_step`: the same step with a Keras model and a Keras SGD
  optimizer, which all-reduces the gradients itself (`apply_gradients`
  under the strategy), as in TensorFlow's multi-worker custom-loop
  tutorial; ms per step. (Keras 3 `fit` is not measured: with TensorFlow's
  own strategy it fails on several workers.)
"""

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np

import run
import scenarios

HERE = pathlib.Path(__file__).resolve().parent
IMPLS = ("tf.distribute", "tfd")
SCENARIOS = ("mw_allreduce_16mb", "mw_mlp_step", "mw_keras_step")
NUM_WORKERS = 2


# --- Worker: one task of the cluster, every scenario.


def _median_ms(fn, budget):
  """Median ms of `fn()` over `budget.min_iters` calls after `budget.warmup`:
  a fixed count, as every task must make the same collective calls (a
  time-bound loop would leave one task waiting for a call the other never
  makes)."""
  for _ in range(budget.warmup):
    fn()
  times = []
  for _ in range(budget.min_iters):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times)) * 1e3


def _strategy(module):
  return module.MultiWorkerMirroredStrategy()


def mw_allreduce_16mb(module, strategy, budget):
  rng = np.random.default_rng(0)
  arrays = [rng.random(s, np.float32) for s in scenarios._allreduce_shapes()]  # pylint: disable=protected-access
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  values = strategy.experimental_distribute_values_from_function(
      lambda ctx: [tf.constant(a) + float(ctx.replica_id_in_sync_group) for a in arrays])

  # Captured rather than passed: TensorFlow's strategy cannot all-reduce
  # function arguments ("destinations can not be empty").
  @tf.function
  def fn():
    return strategy.run(lambda v: module.get_replica_context().all_reduce(
        module.ReduceOp.SUM, v), args=(values,))
  ms = _median_ms(fn, budget)
  return ms, {"sum": scenarios.checksum(strategy.experimental_local_results(fn()))}


def mlp_data():
  """Initial weights of a 784-256-10 MLP and a global batch (x, y)."""
  rng = np.random.default_rng(0)
  initial = [rng.normal(0, 0.05, (784, 256)).astype(np.float32), np.zeros(256, np.float32),
             rng.normal(0, 0.05, (256, 10)).astype(np.float32), np.zeros(10, np.float32)]
  x = rng.random((scenarios.GLOBAL_BATCH, 784), np.float32)
  y = rng.integers(0, 10, scenarios.GLOBAL_BATCH).astype(np.int32)
  return initial, x, y


def _replica_batches(strategy, x, y):
  """Each replica's consecutive rows of the global batch (x, y)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rows = scenarios.GLOBAL_BATCH // strategy.num_replicas_in_sync
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: (tf.constant(x[ctx.replica_id_in_sync_group * rows:][:rows]),
                   tf.constant(y[ctx.replica_id_in_sync_group * rows:][:rows])))


def _train_step(module, strategy, step_fn):
  """A `tf.function` running `step_fn` on each replica's part of a batch and
  returning the summed loss."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def train_step(batch):
    return strategy.reduce(module.ReduceOp.SUM, strategy.run(step_fn, args=(batch,)),
                           axis=None)
  return train_step


def mw_mlp_step(module, strategy, budget):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  initial, x, y = mlp_data()
  with strategy.scope():
    params = [tf.Variable(v) for v in initial]
  batch = _replica_batches(strategy, x, y)

  def step_fn(inputs):
    features, labels = inputs
    loss, grads = scenarios.loss_and_grads(params, features, labels,
                                           strategy.num_replicas_in_sync)
    grads = module.get_replica_context().all_reduce(module.ReduceOp.SUM, grads)
    for v, g in zip(params, grads):
      v.assign_sub(scenarios.LEARNING_RATE * g)
    return loss

  train_step = _train_step(module, strategy, step_fn)
  losses = [float(train_step(batch)) for _ in range(3)]
  change = sum(scenarios.checksum(p.numpy() - w0, np.abs) for p, w0 in zip(params, initial))
  ms = _median_ms(lambda: train_step(batch), budget)
  return ms, {"loss_1": losses[0], "loss_3": losses[2], "weight_change": change}


def mw_keras_step(module, strategy, budget):
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  initial, x, y = mlp_data()
  with strategy.scope():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.set_weights(initial)
    optimizer = keras.optimizers.SGD(learning_rate=scenarios.LEARNING_RATE)
    optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  batch = _replica_batches(strategy, x, y)

  def step_fn(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_fn(labels, model(features, training=True)),
                                        global_batch_size=scenarios.GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  train_step = _train_step(module, strategy, step_fn)
  losses = [float(train_step(batch)) for _ in range(3)]
  change = sum(scenarios.checksum(w - w0, np.abs)
               for w, w0 in zip(model.get_weights(), initial))
  ms = _median_ms(lambda: train_step(batch), budget)
  return ms, {"loss_1": losses[0], "loss_3": losses[2], "weight_change": change}


def worker(impl, quick, result_path):
  """Runs every scenario as one task of the cluster `TF_CONFIG` names."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if impl == "tfd":
    sys.path.insert(0, str(HERE.parent))
    import tf_distribute_lite as module  # pylint: disable=g-import-not-at-top
  else:
    module = tf.distribute
  budget = scenarios.QUICK if quick else scenarios.Budget()
  strategy = _strategy(module)
  results = {}
  for name in SCENARIOS:
    try:
      ms, fingerprint = globals()[name](module, strategy, budget)
      results[name] = {"value": ms, "fingerprint": fingerprint}
    except Exception as e:  # pylint: disable=broad-except
      results[name] = {"error": f"{type(e).__name__}: {run._summary(e)}"}  # pylint: disable=protected-access
  with open(result_path, "w") as f:
    json.dump(results, f)
  time.sleep(600)  # the driver kills every task once all have written


# --- Driver.


def free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def run_cluster(impl, quick, timeout, directory):
  """Every task's results of one cluster run of `impl`, by task index."""
  addresses = [f"127.0.0.1:{p}" for p in free_ports(NUM_WORKERS)]
  paths = [directory / f"{impl}-{i}.json" for i in range(NUM_WORKERS)]
  processes = []
  try:
    for index, path in enumerate(paths):
      path.unlink(missing_ok=True)
      env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
          {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}))
      with open(str(path) + ".log", "w") as log:
        processes.append(subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(HERE / "multi_worker.py"), "--worker", impl, str(path)]
            + (["--quick"] if quick else []), env=env, stdout=subprocess.DEVNULL,
            stderr=log))
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
      if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
        log = pathlib.Path(str(paths[0]) + ".log").read_text()[-2000:]
        error = {"error": f"cluster failed or timed out after {timeout} s: {log}"}
        return [{name: error for name in SCENARIOS}] * NUM_WORKERS
      time.sleep(0.1)
    return [json.loads(p.read_text()) for p in paths]
  finally:
    for process in processes:
      if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
      process.wait(timeout=10)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_options(parser)
  parser.add_argument("--worker", nargs=2, metavar=("IMPL", "RESULT"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker[0], args.quick, args.worker[1])
    return 0
  repeats = args.repeats or (1 if args.quick else 3)
  print(run.machine_summary())
  print(f"{NUM_WORKERS} worker processes on 127.0.0.1, one replica each (CPU); "
        f"{repeats} cluster(s) per implementation; task 0's times in ms, "
        f"medians across repeats{'; --quick' if args.quick else ''}", flush=True)

  def task_zero(impl, directory):
    tasks = run_cluster(impl, args.quick, args.timeout, directory)
    return {name: _task_zero_or_disagreement(tasks, name) for name in SCENARIOS}
  return compare(task_zero, SCENARIOS, repeats, "tfd_mw_bench")


def add_options(parser):
  """The options of every cluster benchmark."""
  parser.add_argument("--repeats", type=int, default=None,
                      help="clusters per implementation; default 3, or 1 with --quick")
  parser.add_argument("--quick", action="store_true", help="smoke run")
  parser.add_argument("--timeout", type=int, default=600,
                      help="seconds before a cluster is stopped (default 600)")


def compare(run_one, scenarios_run, repeats, name):
  """Runs `run_one(impl, directory)`, which returns each scenario's result
  on a fresh cluster, for each implementation in turn, `repeats` times;
  prints the progress and the table, and returns the exit code."""
  directory = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}_{os.getpid()}"
  directory.mkdir(parents=True, exist_ok=True)
  results = {s: {impl: [] for impl in run.IMPLS} for s in scenarios_run}
  start = time.perf_counter()
  for repeat in range(repeats):
    for impl in IMPLS:
      t0 = time.perf_counter()
      outcome = run_one(impl, directory)
      for scenario in scenarios_run:
        results[scenario][impl].append(outcome[scenario])
      print(f"[{repeat + 1}/{repeats}] {impl}: " + ", ".join(
          f"{s} {run.fmt_cell(r['value'])} ms" if "value" in r else f"{s} {r['error'][:300]}"
          for s, r in outcome.items()) + f" ({time.perf_counter() - t0:.1f} s)",
            file=sys.stderr, flush=True)
  print()
  code = run.report(results, scenarios_run)
  minutes, seconds = divmod(round(time.perf_counter() - start), 60)
  print(f"total time: {minutes} min {seconds} s for {repeats * len(IMPLS)} clusters")
  return code


def _task_zero_or_disagreement(tasks, name):
  """Task 0's result, or an error where the tasks computed different numbers."""
  first = tasks[0][name]
  if "error" in first:
    return first
  for index, task in enumerate(tasks[1:], 1):
    if "error" in task[name]:
      return task[name]
    if not run.fingerprints_agree(first["fingerprint"], task[name]["fingerprint"]):
      return {"error": f"task {index} computed {task[name]['fingerprint']}, "
                       f"task 0 {first['fingerprint']}"}
  return first


if __name__ == "__main__":
  sys.exit(main())
