"""Benchmarks a training step on emulated TPU slices against MirroredStrategy.

The same step runs under MirroredStrategy on as many logical CPU devices as
the slice has cores, in one process.

    python benchmarks/tpu_emulation.py [--repeats N] [--quick] [--pods]

By default the slice is a v3-8 (one host, 8 cores, emulated in the worker's
process). `--pods` measures how the step's cost grows with hosts instead:
v4-8 (1 host, 4 cores), v4-16 (2 hosts, 8 cores), v4-32 (4 hosts, 16
cores) and v3-32 (4 hosts, 32 cores); a multi-host slice's hosts are local
processes and the worker's process is their client. Each repeat runs each
(slice, strategy) in a fresh process, taking turns. The step is the
benchmarks' MLP step (784-256-10, SGD, global batch 256, gradients
all-reduced, the loss fetched); cells are median ms per step across repeats,
the ratio is TPUStrategy / MirroredStrategy and `check` compares the losses
both computed.
"""

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
IMPLS = ("MirroredStrategy", "TPUStrategy")
SLICES = {"v3-8": (1, 8), "v4-8": (1, 4), "v4-16": (2, 8), "v4-32": (4, 16),
          "v3-32": (4, 32)}  # slice type -> (hosts, cores)
PODS = ("v4-8", "v4-16", "v4-32", "v3-32")
TIMEOUT_SECONDS = 600  # a worker's whole life, its pod's start included


def worker(impl, slice_type, quick):
  """Measures one strategy on one slice's replicas; prints one JSON line."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  sys.path[:0] = [str(HERE), str(HERE.parent)]
  import scenarios  # pylint: disable=g-import-not-at-top
  import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
  num_cores = SLICES[slice_type][1]
  if impl == "TPUStrategy":
    resolver = tfd.cluster_resolver.TPUClusterResolver(f"emulated:{slice_type}")
    tfd.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tfd.TPUStrategy(resolver)
  else:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * num_cores)
    strategy = tfd.MirroredStrategy([f"CPU:{i}" for i in range(num_cores)])
  assert strategy.num_replicas_in_sync == num_cores, strategy.num_replicas_in_sync
  rng = np.random.default_rng(0)
  x = rng.random((scenarios.GLOBAL_BATCH, 784), np.float32)
  y = rng.integers(0, 10, scenarios.GLOBAL_BATCH).astype(np.int32)
  with strategy.scope():
    params = [tf.Variable(rng.normal(0, 0.05, (784, 256)).astype(np.float32)),
              tf.Variable(np.zeros(256, np.float32)),
              tf.Variable(rng.normal(0, 0.05, (256, 10)).astype(np.float32)),
              tf.Variable(np.zeros(10, np.float32))]

  def step_fn(xs, ys):
    with tf.GradientTape() as tape:
      logits = tf.nn.relu(xs @ params[0] + params[1]) @ params[2] + params[3]
      loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(ys, logits))
      loss /= scenarios.GLOBAL_BATCH
    grads = tfd.get_replica_context().all_reduce("SUM", tape.gradient(loss, params))
    for v, g in zip(params, grads):
      v.assign_sub(scenarios.LEARNING_RATE * g)
    return loss

  @tf.function
  def train_step(batch):
    return strategy.reduce("SUM", strategy.run(step_fn, args=batch), axis=None)

  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
  losses = [float(train_step(batch)) for _ in range(3)]
  budget = scenarios.QUICK if quick else scenarios.Budget()
  # The loss is fetched: a pod's client only dispatches the step to its hosts.
  ms = scenarios.median_ms(lambda: train_step(batch).numpy(), budget)
  print(json.dumps({"impl": impl, "ms": ms, "losses": losses}))
  sys.stdout.flush()
  # Skips TensorFlow's slow teardown; an emulated pod's hosts exit with
  # their client.
  os._exit(0)


def run_worker(impl, slice_type, quick):
  """Runs `worker` in a fresh process (its own process group, so that a pod's
  hosts die with it if it fails or outlives `TIMEOUT_SECONDS`)."""
  cmd = [sys.executable, str(HERE / "tpu_emulation.py"), "--worker", impl,
         "--slice", slice_type] + (["--quick"] if quick else [])
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  try:
    stdout, stderr = proc.communicate(timeout=TIMEOUT_SECONDS)
  except subprocess.TimeoutExpired:
    stdout, stderr = "", f"timed out after {TIMEOUT_SECONDS} s"
  lines = [l for l in stdout.splitlines() if l.startswith("{")]
  if proc.returncode != 0 or not lines:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.communicate()
    raise RuntimeError(f"{impl} worker on {slice_type} failed: {stderr.strip()[-800:]}")
  return json.loads(lines[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=None,
                      help="fresh processes per strategy; default 3, or 1 with --quick")
  parser.add_argument("--quick", action="store_true", help="smoke run")
  parser.add_argument("--pods", action="store_true",
                      help="v4-8, v4-16, v4-32 and v3-32 instead of v3-8")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--slice", default="v3-8", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker, args.slice, args.quick)
  import run  # pylint: disable=g-import-not-at-top
  print(run.machine_summary())
  repeats = args.repeats or (1 if args.quick else 3)
  slices = PODS if args.pods else ("v3-8",)
  results = {(s, impl): [] for s in slices for impl in IMPLS}
  for _ in range(repeats):
    for s in slices:
      for impl in IMPLS:
        results[s, impl].append(run_worker(impl, s, args.quick))
        print(f"  {s} {impl}: {results[s, impl][-1]['ms']:.3f} ms", file=sys.stderr)
  print(f"{repeats} fresh process(es) per strategy and slice; MLP step, ms, "
        "medians across repeats; MirroredStrategy on as many logical CPU "
        "devices as the slice has cores, in one process")
  print("| slice | hosts | cores | MirroredStrategy | TPUStrategy (emulated) | ratio | check |")
  print("|---|---|---|---|---|---|---|")
  ok = True
  for s in slices:
    mirrored, tpu = (statistics.median(r["ms"] for r in results[s, impl]) for impl in IMPLS)
    same = np.allclose(results[s, "TPUStrategy"][0]["losses"],
                       results[s, "MirroredStrategy"][0]["losses"], rtol=1e-5)
    ok &= same
    print(f"| {s} | {SLICES[s][0]} | {SLICES[s][1]} | {run.fmt_cell(mirrored)} | "
          f"{run.fmt_cell(tpu)} | {tpu / mirrored:.2f} | {'OK' if same else 'MISMATCH'} |")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
