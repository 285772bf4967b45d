"""`TPUClusterResolver`, and `initialize_tpu_system` and `shutdown_tpu_system`,
which find the TPU when given no resolver."""

import collections
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cloud_http
from tf_distribute_lite import tpu_discovery
from tf_distribute_lite import tpu_pod_emulation
from tf_distribute_lite import tpu_system
from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import DeviceAttributes
from tf_distribute_lite.cluster_resolver.cluster_resolver import devices_of
from tf_distribute_lite.cluster_resolver.cluster_resolver import format_master_url

# Bounded tries at asking a TPU master (TensorFlow's 120 may be unbounded).
_MASTER_TRIES = 3
_MASTER_TIMEOUT_MS = 60 * 1000
# The clock the node address cache reads; tests replace it.
clock = time.monotonic


class TPUClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.TPUClusterResolver):
  """The TPU to run on.

  `tpu` is "local" (this Cloud TPU VM's chips), "grpc://host:port" addresses,
  a Cloud TPU name (in `project` and `zone`, by default this VM's), or
  "emulated:v3-8" (`tpu_emulation`; "emulated:v4-32@<ip:port>,..." runs at
  those hosts); None or "": the environment, then this machine (`tpu_discovery`).

  `service` replaces the Cloud TPU API client. Unlike TensorFlow's, a READY
  node's addresses are reused for `$TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS` (10
  by default), and it is a context manager.

  >>> resolver = TPUClusterResolver(tpu="grpc://10.0.0.2:8470")
  >>> resolver.master(), resolver.cluster_spec().as_dict()
  ('grpc://10.0.0.2:8470', {'worker': ['10.0.0.2:8470']})
  >>> TPUClusterResolver(tpu="emulated:v4-8").num_accelerators()
  {'TPU': 4}
  """

  def __init__(self, tpu=None, zone=None, project=None, job_name="worker",
               coordinator_name=None, coordinator_address=None,
               credentials="default", service=None, discovery_url=None):
    self._target = tpu_discovery.find(tpu, project, zone)
    self._service = service
    self._credentials = credentials
    self._discovery_url = discovery_url
    self._project = self._zone = None
    if self._target.kind == "api":
      self._project = self._target.project or cloud_http.metadata("project/project-id")
      self._zone = self._target.zone or cloud_http.metadata("instance/zone").split("/")[-1]
    self._emulated = self._target.emulated_slice
    self._hosts = None  # an emulated multi-host slice's `tpu_pod_emulation.Hosts`
    if self._emulated is not None and self._emulated.num_hosts > 1:
      self._hosts = tpu_pod_emulation.start(self._emulated)
      self._emulated = self._hosts.tpu_slice
    elif self._emulated is not None:
      self._emulated.ensure_devices()
    self._ready_node = None  # (when asked, endpoints) of the node once READY
    self.task_type = job_name
    self.task_id = self._target.task_id
    self._coordinator_name = coordinator_name
    self._coordinator_address = coordinator_address
    if coordinator_name and not coordinator_address:
      self._start_coordinator()
    self._tpu_topology = None

  @staticmethod
  def connect(tpu=None, zone=None, project=None):
    """Finds the TPU, connects this program to it and initializes it.

    >>> resolver = TPUClusterResolver.connect("emulated:v4-8")
    >>> resolver.emulated_slice.name
    'v4-8'
    """
    resolver = TPUClusterResolver(tpu, zone, project)
    tf.config.experimental_connect_to_cluster(resolver)
    tpu_system.initialize(resolver)
    return resolver

  @property
  def emulated_slice(self):
    """The `tpu_emulation.EmulatedSlice` run on, or None for a real TPU."""
    return self._emulated

  def _is_local(self):
    return self._target.kind in ("local", "emulated") and self._hosts is None

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc_value, traceback):
    del exc_type, exc_value, traceback

  def _endpoints(self):
    if self._target.kind == "grpc":
      return self._target.endpoints
    if self._hosts is not None:
      self._hosts.check()
      return tpu_discovery.grpc_endpoints(",".join(self._emulated.addresses))
    lifetime, now = cloud_http.cache_seconds(), clock()
    if self._ready_node is None or now - self._ready_node[0] >= lifetime:
      node = self._node()
      if node.get("state") != "READY":
        raise RuntimeError(f'TPU "{self._target.name}" is not yet ready; '
                           f'state: "{node.get("state")}"')
      if "networkEndpoints" in node:
        endpoints = tuple(node["networkEndpoints"])
      else:
        endpoints = ({"ipAddress": node["ipAddress"], "port": node["port"]},)
      self._ready_node = (now, endpoints)
    return self._ready_node[1]

  def _node(self):
    name = (f"projects/{self._project}/locations/{self._zone}/nodes/"
            f"{self._target.name}")
    try:
      if self._service is not None:
        return self._service.projects().locations().nodes().get(name=name).execute()
      token = getattr(self._credentials, "token", None) or cloud_http.access_token()
      return cloud_http.get_json(
          f"{cloud_http.tpu_api_root(self._discovery_url)}/v1/{name}",
          {"Authorization": f"Bearer {token}"})
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"Could not lookup TPU metadata from name '{self._target.name}'. "
          f"Please doublecheck the tpu argument in the TPUClusterResolver "
          f"constructor. Exception: {e}") from e

  def cluster_spec(self):
    """One task per TPU host (and the coordinator); empty for a local one-host TPU.

    >>> TPUClusterResolver("grpc://10.0.0.2,grpc://10.0.0.3").cluster_spec()
    ClusterSpec({'worker': ['10.0.0.2:8470', '10.0.0.3:8470']})
    >>> TPUClusterResolver("emulated:v4-8").cluster_spec()
    ClusterSpec({})
    """
    if self._is_local():
      return tf.train.ClusterSpec({})
    cluster = {self.task_type: [f"{e['ipAddress']}:{e['port']}" for e in self._endpoints()]}
    if self._coordinator_address:
      cluster[self._coordinator_name] = [self._coordinator_address]
    return tf.train.ClusterSpec(cluster)

  def master(self, task_type=None, task_id=None, rpc_layer=None):
    """The gRPC address of the given (by default this) TPU host; "" if local.

    >>> resolver = TPUClusterResolver("grpc://10.0.0.2,grpc://10.0.0.3")
    >>> resolver.master(), resolver.master("worker", 1)
    ('grpc://10.0.0.2:8470', 'grpc://10.0.0.3:8470')
    """
    del rpc_layer  # TPU hosts always speak gRPC.
    if self._is_local():
      return ""
    cluster = self.cluster_spec()
    if task_type is not None and task_id is not None:
      address = cluster.task_address(task_type, task_id)
    elif self.task_type is not None and self.task_id is not None:
      address = cluster.task_address(self.task_type, self.task_id)
    else:
      tasks = cluster.job_tasks(self.task_type)
      if not tasks:
        raise ValueError("No TPUs with the specified names exist.")
      address = tasks[0]
    return format_master_url(address, "grpc")

  def get_master(self):
    """`master()`."""
    return self.master()

  def get_job_name(self):
    """The job of the TPU hosts (`task_type`)."""
    return self.task_type

  def get_coordination_service_leader(self):
    """The task leading TensorFlow's coordination service: task 0."""
    return f"/job:{self.get_job_name()}/task:0"

  def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
    """{"TPU": cores per host}; a TPU master gets 3 tries, each bounded by
    `config_proto`'s timeout (default a minute)."""
    if self._emulated is not None:
      return {"TPU": self._emulated.num_cores_per_host}
    if self._target.kind == "local":
      return {"TPU": len(tf.config.list_logical_devices("TPU"))}
    cores = _cores_per_task(self._master_devices(config_proto, RuntimeError))
    if len(set(cores.values())) > 1:
      raise RuntimeError(f"TPU cores on each device is not the same. This "
                         f"should never happen. Devices: {dict(cores)}")
    return {"TPU": next(iter(cores.values()), 0)}

  def get_tpu_system_metadata(self):
    """The TPU system as `tf.tpu.experimental.TPUSystemMetadata` (an emulated
    slice's has its topology and CPU devices).

    >>> metadata = TPUClusterResolver("emulated:v4-8").get_tpu_system_metadata()
    >>> metadata.num_cores, metadata.num_hosts, metadata.topology.mesh_shape.tolist()
    (4, 1, [2, 2, 1, 1])
    >>> metadata.devices[1]
    DeviceAttributes(name='/job:localhost/replica:0/task:0/device:CPU:1', device_type='CPU', memory_limit_bytes=0, incarnation=0)
    """
    emulated = self._emulated
    if emulated is not None:
      devices = tuple(DeviceAttributes(name, "CPU") for name in emulated.devices)
      return tf.tpu.experimental.TPUSystemMetadata(
          num_cores=emulated.num_cores, num_hosts=emulated.num_hosts,
          num_of_cores_per_host=emulated.num_cores_per_host,
          topology=emulated.topology(), devices=devices)
    cluster = self.cluster_spec()
    config = tf.compat.v1.ConfigProto()
    if cluster.jobs:
      config.cluster_def.CopyFrom(cluster.as_cluster_def())
    devices = sorted(self._master_devices(config, ValueError), key=_device_order)
    per_task = _cores_per_task(devices)
    if len(set(per_task.values())) > 1:
      raise RuntimeError(f"TPU cores on each host is not same: {dict(per_task)}")
    return tf.tpu.experimental.TPUSystemMetadata(
        num_cores=sum(per_task.values()), num_hosts=len(per_task),
        num_of_cores_per_host=next(iter(per_task.values()), 0), topology=None,
        devices=tuple(devices))

  def _master_devices(self, config_proto, error):
    """The devices the master reaches, in `_MASTER_TRIES` bounded tries."""
    config = tf.compat.v1.ConfigProto()
    if config_proto is not None:
      config.CopyFrom(config_proto)
    config.operation_timeout_in_ms = config.operation_timeout_in_ms or _MASTER_TIMEOUT_MS
    master = self.master()
    for _ in range(_MASTER_TRIES):
      try:
        return devices_of(master, config)
      except tf.errors.DeadlineExceededError:
        continue
    raise error(f"Failed to connect to master. The TPU might not be ready (e.g. still "
                f"scheduling) or the master address is incorrect: got ({master}); "
                f"{_MASTER_TRIES} tries of {config.operation_timeout_in_ms / 1000:g} s "
                f"each timed out.")

  def set_tpu_topology(self, serialized_tpu_topology):
    """Keeps the topology `initialize_tpu_system` returned (serialized).

    >>> resolver = TPUClusterResolver("grpc://10.0.0.2")
    >>> topology = tf_distribute_lite.tpu_emulation.PRESETS["v4-8"].topology()
    >>> resolver.set_tpu_topology(topology.serialized())
    >>> type(resolver.tpu_hardware_feature).__name__
    'TPUHardwareFeature'
    """
    self._tpu_topology = _tf_bridge.parse_topology_proto(serialized_tpu_topology)

  @property
  def tpu_hardware_feature(self):
    """The TPU's hardware features once `set_tpu_topology` is called, else None."""
    if self._tpu_topology is None:
      return None
    return self._tpu_topology.tpu_hardware_feature

  @property
  def environment(self):
    return ""

  def _start_coordinator(self):
    """Serves the coordinator job from this process, at this VM's address."""
    address = cloud_http.metadata("instance/network-interfaces/0/ip")
    self._server = tf.distribute.Server({"local": ["0.0.0.0:0"]}, protocol="grpc", start=True)
    port = self._server.target.rsplit(":", 1)[-1]
    self._coordinator_address = f"{address}:{port}"

  def __deepcopy__(self, memo):
    return self


def _cores_per_task(devices):
  return collections.Counter(tf.DeviceSpec.from_string(d.name).task
                             for d in devices if d.device_type == "TPU")


def _device_order(device):
  spec = tf.DeviceSpec.from_string(device.name)
  return (spec.job or "", spec.replica or 0, spec.task or 0, spec.device_type or "",
          spec.device_index or 0)


def initialize_tpu_system(cluster_resolver=None):
  """Initializes the TPU system of `cluster_resolver` (default: the one found);
  its `tf.tpu.experimental.Topology` (in a `tf.function`, serialized). Without
  a TPU, `tf.errors.NotFoundError` (TF 2.21: `InvalidArgumentError` in TF1).

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> initialize_tpu_system(resolver).mesh_shape.tolist()
  [2, 2, 1, 1]
  >>> tf.function(lambda: initialize_tpu_system(resolver))().dtype
  tf.string
  """
  return tpu_system.initialize(_given_or_found(cluster_resolver))


def shutdown_tpu_system(cluster_resolver=None):
  """Shuts down the TPU system `initialize_tpu_system` started.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> _ = initialize_tpu_system(resolver)
  >>> shutdown_tpu_system(resolver)
  """
  if tpu_system.tracing_a_function():
    raise RuntimeError("shutdown_tpu_system is not supported within a tf.function; "
                       "call it outside the function.")
  tpu_system.shutdown(_given_or_found(cluster_resolver))


def _given_or_found(cluster_resolver):
  if cluster_resolver is not None:
    return cluster_resolver
  try:
    return TPUClusterResolver("")
  except tpu_discovery.NoTpuFoundError as e:
    raise tf.errors.NotFoundError(None, None, str(e)) from None
