"""Starting and stopping the TPU system (`tfd.tpu.experimental`), for our
resolvers: TensorFlow's own `tf.tpu.experimental.initialize_tpu_system`
accepts only TensorFlow's resolver class.

On a TPU these run TensorFlow's TPU system ops (`ConfigureDistributedTPU`,
`ShutdownDistributedTPU`) on the TPU_SYSTEM device; on an emulated slice
they give the slice's topology.
"""

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.tpu_cluster_resolver import TPUClusterResolver

_initialized = {}


def _resolver(cluster_resolver):
  if cluster_resolver is None:
    return TPUClusterResolver("")
  if not isinstance(cluster_resolver, tf.distribute.cluster_resolver.ClusterResolver):
    raise TypeError(f"cluster_resolver must be a TPUClusterResolver; got "
                    f"{cluster_resolver!r}.")
  return cluster_resolver


def system_device(cluster_resolver):
  """The TPU_SYSTEM device that runs the system ops for the resolver's TPU.

  >>> system_device(TPUClusterResolver("grpc://10.0.0.2:8470"))
  '/job:worker/replica:0/task:0/device:TPU_SYSTEM:0'
  """
  if cluster_resolver.master():
    return f"/job:{cluster_resolver.get_job_name()}/replica:0/task:0/device:TPU_SYSTEM:0"
  return "/device:TPU_SYSTEM:0"


def _require_tpu_system(cluster_resolver):
  if not tf.config.list_logical_devices("TPU_SYSTEM"):
    raise tf.errors.NotFoundError(
        None, None,
        f"No TPU was found: TensorFlow lists no TPU_SYSTEM device (master "
        f"{cluster_resolver.master()!r}; devices: "
        f"{[d.name for d in tf.config.list_logical_devices()]}). On a Cloud "
        f"TPU VM use TPUClusterResolver('local'); to run without a TPU use "
        f"TPUClusterResolver('emulated:v3-8').")


def initialize_function(job=None):
  """The `tf.function` that initializes the TPU system and returns its
  serialized topology."""
  @tf.function(autograph=False)
  def initialize():
    return tf.compat.v1.tpu.initialize_system(
        job=job, compilation_failure_closes_chips=False,
        tpu_cancellation_closes_chips=False)
  return initialize


def initialize_tpu_system(cluster_resolver=None):
  """Initializes the TPU system of `cluster_resolver` (by default the TPU
  `TPUClusterResolver("")` finds) and returns its
  `tf.tpu.experimental.Topology`. Without a TPU, raises
  `tf.errors.NotFoundError` saying where it looked.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> initialize_tpu_system(resolver).mesh_shape.tolist()
  [2, 2, 1, 1]
  """
  resolver = _resolver(cluster_resolver)
  emulated = getattr(resolver, "emulated_slice", None)
  if emulated is not None:
    emulated.ensure_devices()
    topology = emulated.topology()
  else:
    _require_tpu_system(resolver)
    job = resolver.get_job_name() if resolver.master() else None
    with tf.device(system_device(resolver)):
      serialized = initialize_function(job)().numpy()
    topology = tf.tpu.experimental.Topology(serialized=serialized)
    resolver.set_tpu_topology(serialized)
  _initialized[resolver.master()] = topology
  return topology


def shutdown_tpu_system(cluster_resolver=None):
  """Shuts down the TPU system `initialize_tpu_system` started.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> _ = initialize_tpu_system(resolver)
  >>> shutdown_tpu_system(resolver)
  """
  resolver = _resolver(cluster_resolver)
  if getattr(resolver, "emulated_slice", None) is None:
    _require_tpu_system(resolver)
    job = resolver.get_job_name() if resolver.master() else None

    @tf.function(autograph=False)
    def shutdown():
      tf.compat.v1.tpu.shutdown_system(job=job)
    with tf.device(system_device(resolver)):
      shutdown()
  _initialized.pop(resolver.master(), None)


def initialized_topology(cluster_resolver):
  """The topology `initialize_tpu_system` returned for this TPU, or None."""
  return _initialized.get(cluster_resolver.master())
