"""One worker process of a `multi_worker.LocalCluster`.

    python multi_worker_worker.py SCENARIO MODULE DIRECTORY ARGS_JSON RESULT_PATH

Configures 2 logical CPU devices (or ARGS_JSON's "logical_cpus"), runs `multi_worker_scenarios.SCENARIO`
with `tf.distribute` (MODULE "tf") or `tf_distribute_lite` ("tfd") and
writes what it returned, or the exception it raised, to RESULT_PATH as JSON.
A SCENARIO named "module.name" is `name` of that module (`ps_scenarios`);
"serve" starts this task's `tf.distribute.Server` and serves until killed
or until the process that started it ends.
"""

import importlib
import json
import os
import sys
import time
import traceback

import tensorflow as tf

_PARENT = os.getppid()  # the test process that started this one


def main(scenario, module, directory, args, result_path):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * json.loads(args).get("logical_cpus", 2))
  task = json.loads(os.environ["TF_CONFIG"])["task"]
  if scenario == "serve":
    serve(task)
  import multi_worker_scenarios  # pylint: disable=g-import-not-at-top
  scenarios = multi_worker_scenarios
  if "." in scenario:
    module_name, scenario = scenario.rsplit(".", 1)
    scenarios = importlib.import_module(module_name)
  if module == "tf":
    mod = tf.distribute
  else:
    import tf_distribute_lite as mod  # pylint: disable=g-import-not-at-top
  context = multi_worker_scenarios.Context(mod, task["index"], directory, json.loads(args))
  try:
    result = getattr(scenarios, scenario)(context)
  except Exception as e:  # pylint: disable=broad-except
    result = {"type": type(e).__name__, "error": str(e),
              "traceback": traceback.format_exc()[-3000:]}
  with open(result_path + ".tmp", "w") as f:
    json.dump(result, f)
  os.replace(result_path + ".tmp", result_path)
  sys.stdout.flush()
  # Wait to be killed: a task that left now could fail the others' last
  # collectives (it serves their reads) or their coordination service.
  wait_to_be_killed()


def serve(task):
  """Serves as `task` until killed (or `wait_to_be_killed` gives up)."""
  cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
  tf.distribute.Server(cluster, job_name=task["type"], task_index=task["index"],
                       protocol="grpc", start=True)
  wait_to_be_killed()


def wait_to_be_killed(timeout=600):
  """Waits until the cluster kills this process; ends it if the process
  that started it ends first, or after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while os.getppid() == _PARENT and time.monotonic() < deadline:
    time.sleep(0.2)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main(*sys.argv[1:])
