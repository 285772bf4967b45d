"""Benchmarks a training step on an emulated TPU v3-8 slice against the same
step under MirroredStrategy on the same 8 logical CPU devices.

    python benchmarks/tpu_emulation.py [--repeats N] [--quick]

Each repeat runs each strategy in a fresh process (8 logical CPU devices),
taking turns. The step is the benchmarks' MLP step (784-256-10, SGD, global
batch 256, gradients all-reduced); cells are median ms per step across
repeats, and `check` compares the losses both computed.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
IMPLS = ("MirroredStrategy", "TPUStrategy")
NUM_CORES = 8


def worker(impl, quick):
  """Measures one strategy; prints one JSON line."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  sys.path[:0] = [str(HERE), str(HERE.parent)]
  import scenarios  # pylint: disable=g-import-not-at-top
  import tf_distribute_lite as tfd  # pylint: disable=g-import-not-at-top
  resolver = tfd.cluster_resolver.TPUClusterResolver("emulated:v3-8")  # 8 devices
  if impl == "TPUStrategy":
    strategy = tfd.TPUStrategy(resolver)
  else:
    strategy = tfd.MirroredStrategy([f"CPU:{i}" for i in range(NUM_CORES)])
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
  ms = scenarios.median_ms(lambda: train_step(batch), budget)
  print(json.dumps({"impl": impl, "ms": ms, "losses": losses}))
  sys.stdout.flush()
  os._exit(0)  # Skips TensorFlow's slow teardown.


def run_worker(impl, quick):
  cmd = [sys.executable, str(HERE / "tpu_emulation.py"), "--worker", impl] + (
      ["--quick"] if quick else [])
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if not lines:
    raise RuntimeError(f"{impl} worker failed: {proc.stderr.strip()[-500:]}")
  return json.loads(lines[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=None,
                      help="fresh processes per strategy; default 3, or 1 with --quick")
  parser.add_argument("--quick", action="store_true", help="smoke run")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(args.worker, args.quick)
  import run  # pylint: disable=g-import-not-at-top
  print(run.machine_summary())
  repeats = args.repeats or (1 if args.quick else 3)
  results = {impl: [] for impl in IMPLS}
  for _ in range(repeats):
    for impl in IMPLS:
      results[impl].append(run_worker(impl, args.quick))
  medians = {impl: statistics.median(r["ms"] for r in rs) for impl, rs in results.items()}
  same = np.allclose(results["TPUStrategy"][0]["losses"],
                     results["MirroredStrategy"][0]["losses"], rtol=1e-5)
  print(f"8 logical CPU devices, {repeats} fresh process(es) per strategy; "
        f"MLP step, ms, medians across repeats")
  print("| scenario | MirroredStrategy | TPUStrategy (emulated v3-8) | ratio | check |")
  print("|---|---|---|---|---|")
  print(f"| mlp_step_8_cores | {run.fmt_cell(medians['MirroredStrategy'])} | "
        f"{run.fmt_cell(medians['TPUStrategy'])} | "
        f"{medians['TPUStrategy'] / medians['MirroredStrategy']:.2f} | "
        f"{'OK' if same else 'MISMATCH'} |")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
