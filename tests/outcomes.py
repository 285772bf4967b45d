"""What programs in processes of their own give under TensorFlow's classes
and under ours (`program_outcomes`), and the names a strategy gives its
devices (`device_names`). Outcomes in this process: `oracle.compare`."""

import json
import os
import subprocess
import sys

import tensorflow as tf

import tf_distribute_lite as tfd


def program_outcomes(path, timeout=300):
  """Runs the program at `path` in a fresh process; it prints one JSON
  object for TensorFlow's classes, then one for ours: returns both."""
  result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  theirs, ours = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  return theirs, ours


def device_names(strategy, in_function=False):
  """What `strategy` calls its devices: worker and parameter devices, the
  components of a variable made in its scope, each replica's devices (read
  in a `tf.function` if `in_function`). `strategy` may be a contrib one."""
  contrib = isinstance(strategy, tfd.contrib.DistributionStrategy)
  extended = strategy if contrib else strategy.extended
  with strategy.scope():
    variable = tf.Variable(1.0)
  components = strategy.unwrap(variable) if contrib else (
      strategy.experimental_local_results(variable))
  replicas = []

  def replica_fn():
    if contrib:
      replicas.append([tfd.contrib.get_tower_context().device])
    else:
      replicas.append(tf.nest.flatten(tf.distribute.get_replica_context().devices))
    return tf.constant(1.0)

  def read():
    if contrib:
      with strategy.scope():
        strategy.call_for_each_tower(replica_fn)
    else:
      strategy.run(replica_fn)
    return {"worker_devices": list(extended.worker_devices),
            "parameter_devices": list(extended.parameter_devices),
            "variable": variable.device,
            "components": [c.device for c in components],
            "replicas": replicas}
  if not in_function:
    return read()
  names = []
  tf.function(lambda: names.append(read()) or 0, autograph=False)()
  return names[-1]
