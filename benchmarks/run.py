"""Benchmarks plain TensorFlow, tf.distribute and tf_distribute_lite.

    python benchmarks/run.py [--repeats N] [--scenarios a,b] [--quick]

Every measurement runs in a fresh worker process with 4 logical CPU devices
(`run.py --worker <scenario> <impl>`, which prints one JSON line); the three
implementations take turns so they see the same machine load. The table shows
medians across repeats and whether the implementations computed the same
numbers. The exit code is 1 if any measurement failed or disagreed.
"""

import argparse
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
IMPLS = ("plain", "tf.distribute", "tfd")
SCENARIOS = (
    "eager_run_1", "eager_run_4", "mlp_step", "mlp_first_call",
    "mlp_retrace", "deep_mlp_retrace", "mlp_step_x4", "mlp_first_call_x4",
    "mlp_retrace_x4", "deep_mlp_retrace_x4", "allreduce_16mb",
    "reduce_none", "reduce_axis0", "build_20_layer_mlp",
    "build_20_layer_mlp_x4", "variables_mb_x4", "variables_peak_mb_x4",
    "mlp_step_peak_mb_x4", "dataset_iter_python", "dataset_iter_function",
    "iterator_create", "iterator_teardown", "keras2_fit",
    "orbit_controller_train")
RTOL, ATOL = 1e-4, 1e-6


# --- Worker: one measurement in this process.


def worker(scenario, impl, quick, timeout):
  """Measures `scenario` with `impl`, prints one JSON line and exits."""
  import faulthandler  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  faulthandler.dump_traceback_later(timeout, exit=True)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if is_memory(scenario):  # An allocator that counts its bytes.
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import scenarios  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * scenarios.NUM_DEVICES)
  tf.config.list_logical_devices()  # Starts the runtime before any timing.
  if impl == "tfd":
    sys.path.insert(0, str(HERE.parent))
    import tf_distribute_lite as module  # pylint: disable=g-import-not-at-top
  else:
    module = {"plain": None, "tf.distribute": tf.distribute}[impl]
  budget = scenarios.QUICK if quick else scenarios.Budget()
  result = {"scenario": scenario, "impl": impl}
  try:
    value, fingerprint = scenarios.SCENARIOS[scenario](module, budget)
    result.update(value=value, fingerprint=fingerprint)
  except Exception as e:  # pylint: disable=broad-except
    result.update(error=f"{type(e).__name__}: {_summary(e)}")
    traceback.print_exc()
  print(json.dumps(result))
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(1 if "error" in result else 0)  # Skips TensorFlow's slow teardown.


def is_memory(scenario):
  """Whether `scenario` measures MB allocated rather than ms."""
  return "mb" in scenario.split("_")


def _summary(error):
  """The first line of `error`'s message; for tf.function errors, the last."""
  lines = [l.strip() for l in str(error).strip().splitlines() if l.strip()]
  if lines and lines[0] == "in user code:":
    lines = [l for l in lines if l.startswith(type(error).__name__ + ":")]
    return lines[-1].split(":", 1)[1].strip() if lines else "in user code"
  return lines[0] if lines else ""


# --- Parent: run the workers, print the table.


def run_worker(scenario, impl, quick, timeout):
  """One worker process's result dict; failures become {"error": ...}."""
  cmd = [sys.executable, str(HERE / "run.py"), "--worker", scenario, impl,
         "--timeout", str(timeout)] + (["--quick"] if quick else [])
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=timeout + 30)
  except subprocess.TimeoutExpired:
    return {"error": f"killed after {timeout + 30} s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  if "Timeout (" in proc.stderr:
    return {"error": f"timed out after {timeout} s (a hang?)"}
  tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return {"error": f"worker exited with code {proc.returncode}: {tail}"}


def machine_summary():
  """CPU, OS and library versions, without importing TensorFlow."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f
                 if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  versions = []
  for dist in ("tensorflow", "keras", "tf_distribute_lite"):
    try:
      versions.append(f"{dist} {importlib.metadata.version(dist)}")
    except importlib.metadata.PackageNotFoundError:
      pass
  load = ", load average {:.2f}".format(os.getloadavg()[0]) if hasattr(
      os, "getloadavg") else ""
  return (f"machine: {os.cpu_count()} CPUs ({cpu}), {platform.system()} "
          f"{platform.machine()}, Python {platform.python_version()}{load}\n"
          f"versions: {', '.join(versions)}")


def fingerprints_agree(a, b):
  return a.keys() == b.keys() and all(
      np.isclose(a[k], b[k], rtol=RTOL, atol=ATOL) for k in a)


def check(runs):
  """Returns "OK", "MISMATCH: ..." or "-" for one scenario's results."""
  done = [(impl, r["fingerprint"]) for impl in IMPLS for r in runs[impl]
          if "error" not in r]
  if len({impl for impl, _ in done}) < 2:
    return "-"
  ref_impl, ref = done[0]
  for impl, fingerprint in done[1:]:
    if not fingerprints_agree(ref, fingerprint):
      return f"MISMATCH: {impl} {fingerprint} vs {ref_impl} {ref}"
  return "OK"


def fmt_cell(value):
  return (f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100
          else f"{value:.1f}")


def report(results, scenarios):
  """Prints the table, the failures and mismatches; returns the exit code."""
  header = ["scenario", *IMPLS, "tfd/tf.distribute", "tfd/plain", "check"]
  rows, notes, failed = [], [], False
  for scenario in scenarios:
    runs = results[scenario]
    medians, cells = {}, []
    for impl in IMPLS:
      errors = [r["error"] for r in runs[impl] if "error" in r]
      if errors:
        notes.append(f"[{len(notes) + 1}] {impl} {scenario}: {errors[0]}"
                     f"  (rerun: .venv/bin/python benchmarks/run.py --worker "
                     f"{scenario} {impl})")
        cells.append(f"error [{len(notes)}]")
      elif runs[impl]:
        medians[impl] = statistics.median(r["value"] for r in runs[impl])
        cells.append(fmt_cell(medians[impl]))
      else:
        cells.append("-")
    ratios = [f"{medians['tfd'] / medians[base]:.2f}"
              if "tfd" in medians and base in medians else "-"
              for base in ("tf.distribute", "plain")]
    status = check(runs)
    if status.startswith("MISMATCH"):
      notes.append(f"[{len(notes) + 1}] {scenario}: {status}")
      status = f"MISMATCH [{len(notes)}]"
    failed = failed or status.startswith("MISMATCH") or any(
        c.startswith("error") for c in cells)
    rows.append([scenario, *cells, *ratios, status])
  widths = [max(len(row[i]) for row in [header] + rows)
            for i in range(len(header))]
  def line(row):
    return "| " + " | ".join(
        c.ljust(w) if i == 0 else c.rjust(w)
        for i, (c, w) in enumerate(zip(row, widths))) + " |"
  print(line(header))
  print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
  for row in rows:
    print(line(row))
  for note in notes:
    print(note)
  return 1 if failed else 0


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=None,
                      help="worker processes per (scenario, impl); default 3, "
                      "or 1 with --quick")
  parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                      help="comma-separated subset of: " + ", ".join(SCENARIOS))
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: 1 repeat, few iterations")
  parser.add_argument("--timeout", type=int, default=600,
                      help="seconds before a worker is stopped (default 600)")
  parser.add_argument("--worker", nargs=2, metavar=("SCENARIO", "IMPL"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    worker(*args.worker, args.quick, args.timeout)

  scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
  unknown = sorted(set(scenarios) - set(SCENARIOS))
  if unknown:
    parser.error(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}")
  repeats = args.repeats or (1 if args.quick else 3)
  print(machine_summary())
  print(f"4 logical CPU devices, {repeats} fresh worker process(es) per "
        f"(scenario, impl); times in ms (rows with _mb: MB allocated), medians "
        f"across repeats"
        f"{'; --quick' if args.quick else ''}", flush=True)
  start = time.perf_counter()
  results = {s: {impl: [] for impl in IMPLS} for s in scenarios}
  total, count = len(scenarios) * repeats * len(IMPLS), 0
  for scenario in scenarios:
    for repeat in range(repeats):
      for impl in IMPLS:
        t0 = time.perf_counter()
        result = run_worker(scenario, impl, args.quick, args.timeout)
        results[scenario][impl].append(result)
        count += 1
        outcome = (f"error: {result['error']}" if "error" in result
                   else f"{fmt_cell(result['value'])} "
                   f"{'MB' if is_memory(scenario) else 'ms'}")
        print(f"[{count}/{total}] {scenario} {impl} #{repeat + 1}: "
              f"{outcome} ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
  print()
  code = report(results, scenarios)
  minutes, seconds = divmod(round(time.perf_counter() - start), 60)
  print(f"total time: {minutes} min {seconds} s for {total} worker processes")
  return code


if __name__ == "__main__":
  sys.exit(main())
