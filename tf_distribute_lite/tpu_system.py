"""Starting and stopping the TPU system of a given resolver (TensorFlow's
functions accept only its own resolver class; `tpu_cluster_resolver` defines
the public ones). On a TPU: the system ops on the TPU_SYSTEM device, eagerly
through a `tf.function`, in a TF1 graph through a session on the master, or
added to a `tf.function` being traced. On an emulated slice: its topology (an
eager `initialize` of a multi-host slice connects to its hosts)."""

import tensorflow as tf

from tf_distribute_lite import tpu_pod_emulation

_initialized = {}


def _checked(cluster_resolver):
  if not isinstance(cluster_resolver, tf.distribute.cluster_resolver.ClusterResolver):
    raise TypeError(f"cluster_resolver must be a TPUClusterResolver; got {cluster_resolver!r}.")
  return cluster_resolver


def tracing_a_function():
  """True inside a `tf.function` being traced (not eagerly, not in a TF1 graph)."""
  return not tf.executing_eagerly() and tf.compat.v1.executing_eagerly_outside_functions()


def _job(cluster_resolver):
  """The task running the system ops: the first TPU host, None when local."""
  if cluster_resolver.master():
    return f"{cluster_resolver.get_job_name()}/replica:0/task:0"
  return None


def system_device(cluster_resolver):
  """The TPU_SYSTEM device that runs the system ops for the resolver's TPU."""
  job = _job(cluster_resolver)
  return f"/job:{job}/device:TPU_SYSTEM:0" if job else "/device:TPU_SYSTEM:0"


def _run_system_op(cluster_resolver, step, function, make_op):
  """Runs a TPU system op, returning its value: eagerly `function(job)` on the TPU_SYSTEM
  device, in a TF1 graph `make_op()` on the master. No TPU: `NotFoundError`, as in TF."""
  try:
    if tf.executing_eagerly():
      if not tf.config.list_logical_devices("TPU_SYSTEM"):
        raise tf.errors.NotFoundError(
            None, None,
            f"No TPU was found: TensorFlow lists no TPU_SYSTEM device (master "
            f"{cluster_resolver.master()!r}; devices: "
            f"{[d.name for d in tf.config.list_logical_devices()]}). On a Cloud "
            f"TPU VM use TPUClusterResolver('local'); to run without a TPU use "
            f"TPUClusterResolver('emulated:v3-8').")
      with tf.device(system_device(cluster_resolver)):  # where the function's op runs
        result = function(_job(cluster_resolver))()
      return None if result is None else result.numpy()
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    cluster = cluster_resolver.cluster_spec()
    if cluster.jobs:
      config.cluster_def.CopyFrom(cluster.as_cluster_def())
    with tf.Graph().as_default(), tf.compat.v1.Session(cluster_resolver.master(),
                                                       config=config) as session:
      return session.run(make_op())
  except tf.errors.InvalidArgumentError as e:
    raise tf.errors.NotFoundError(
        None, None, f"TPUs not found in the cluster (master "
        f"{cluster_resolver.master()!r}). Failed in {step}: {e.message}") from None


def _configure_op(job):
  return tf.compat.v1.tpu.initialize_system(
      job=job, compilation_failure_closes_chips=False,
      tpu_cancellation_closes_chips=False)


def initialize_function(job=None):
  """The `tf.function` initializing the TPU system (returns its topology)."""
  return tf.function(lambda: _configure_op(job), autograph=False)


def shutdown_function(job=None):
  """The `tf.function` that shuts the TPU system down."""
  @tf.function(autograph=False)
  def shutdown():
    tf.compat.v1.tpu.shutdown_system(job=job)
  return shutdown


def initialize(cluster_resolver):
  """Initializes the TPU system of `cluster_resolver` (see
  `tpu_cluster_resolver.initialize_tpu_system`)."""
  resolver = _checked(cluster_resolver)
  emulated = getattr(resolver, "emulated_slice", None)
  if emulated is not None:
    if emulated.num_hosts == 1:
      emulated.ensure_devices()
    elif tf.executing_eagerly():
      tpu_pod_emulation.connect(resolver)
    topology = emulated.topology()
    if tracing_a_function():
      return tf.constant(topology.serialized())
    resolver.set_tpu_topology(topology.serialized())
  elif tracing_a_function():
    return _configure_op(_job(resolver))
  else:
    serialized = _run_system_op(resolver, "initialization", initialize_function,
                                tf.compat.v1.tpu.initialize_system)
    topology = tf.tpu.experimental.Topology(serialized=serialized)
    resolver.set_tpu_topology(serialized)
  _initialized[resolver.master()] = topology
  return topology


def shutdown(cluster_resolver):
  """Shuts down the TPU system `initialize` started (see
  `tpu_cluster_resolver.shutdown_tpu_system`)."""
  resolver = _checked(cluster_resolver)
  if getattr(resolver, "emulated_slice", None) is None:
    _run_system_op(resolver, "shutdown", shutdown_function, tf.compat.v1.tpu.shutdown_system)
  _initialized.pop(resolver.master(), None)


def initialized_topology(cluster_resolver):
  """The topology `initialize` returned for this TPU, or None."""
  return _initialized.get(cluster_resolver.master())

