"""TPUClusterResolver against a fake metadata server and Cloud TPU API on
127.0.0.1, compared with TensorFlow's where TensorFlow has the behaviour."""

import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import tpu_system
from tf_distribute_lite.cluster_resolver import tpu_cluster_resolver

from cloud_fakes import FakeCloud
from cloud_fakes import FakeTpuService
from cloud_fakes import node
from multi_worker import free_ports
import oracle

OURS = tfd.cluster_resolver.TPUClusterResolver
THEIRS = tf.distribute.cluster_resolver.TPUClusterResolver
PROJECT, ZONE = "test-project", "us-central1-b"
FULL_NAME = f"projects/{PROJECT}/locations/{ZONE}/nodes/my-tpu"
HTTP_TIMEOUT = 0.3


@pytest.fixture
def cloud(monkeypatch, tmp_path):
  """The fakes, with this machine's environment pointing at them."""
  fake = FakeCloud()
  fake.metadata("project/project-id", PROJECT)
  fake.metadata("instance/zone", f"projects/123/zones/{ZONE}")
  fake.metadata("instance/service-accounts/default/token",
                {"access_token": "secret", "token_type": "Bearer"})
  for name in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG",
               "GCE_METADATA_IP", "TPU_API_DISCOVERY_URL",
               "TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("GCE_METADATA_HOST", fake.address)
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT", f"http://{fake.address}")
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_HTTP_TIMEOUT", str(HTTP_TIMEOUT))
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_PCI_DEVICES", str(tmp_path / "pci"))
  yield fake
  fake.close()


def _same(call):
  return oracle.compare(call, (THEIRS,), (OURS,))


def _answers(resolver):
  return (resolver.master(), resolver.cluster_spec().as_dict(), resolver.get_master(),
          resolver.get_job_name(), resolver.get_coordination_service_leader(),
          resolver.environment, resolver.task_type, resolver.task_id)


# --- Addresses, local, and the environment: as in TensorFlow.

@pytest.mark.parametrize("tpu", [
    "grpc://10.0.0.2:8470", "grpc://10.0.0.2", "grpc://10.0.0.2:1,grpc://10.0.0.3:2",
    ["grpc://10.0.0.2:8471"], b"grpc://10.0.0.4:8470", "local", [], ["a", "b"]])
def test_addresses_and_local_like_tf(tpu, cloud):
  del cloud
  _same(lambda r: _answers(r(tpu)))


def test_local_counts_local_tpu_cores_like_tf(cloud):
  assert _same(lambda r: r("local").num_accelerators()) == {"TPU": 0}
  metadata = _same(lambda r: r("local").get_tpu_system_metadata()[:4])
  assert metadata == (0, 0, 0, None)
  assert not cloud.hits  # "local" asks no server


@pytest.mark.parametrize("variables", [
    {"TPU_NAME": "grpc://10.0.0.5:8470"},
    {"KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS": "grpc://10.0.0.6:8470,grpc://10.0.0.7:8470",
     "TPU_NAME": "grpc://10.0.0.5:8470"},
])
def test_environment_variables_like_tf(variables, cloud, monkeypatch):
  del cloud
  for name, value in variables.items():
    monkeypatch.setenv(name, value)
  _same(lambda r: _answers(r()))
  _same(lambda r: _answers(r("")))


def test_coordinator_joins_the_cluster_like_tf(cloud):
  del cloud
  _same(lambda r: _answers(r("grpc://10.0.0.2:8470", coordinator_name="coordinator",
                             coordinator_address="10.0.0.9:9000")))


def test_a_coordinator_without_an_address_is_served_here_like_tf(cloud):
  cloud.metadata("instance/network-interfaces/0/ip", "10.1.2.3")

  def coordinator_host(r):
    resolver = r("grpc://10.0.0.2:8470", coordinator_name="coordinator")
    (address,) = resolver.cluster_spec().job_tasks("coordinator")
    host, port = address.split(":")
    return host, int(port) > 0
  assert _same(coordinator_host) == ("10.1.2.3", True)


# --- Names through the Cloud TPU API.

@pytest.mark.parametrize("description", [node(hosts=1), node(hosts=4), node(legacy=True)])
def test_name_lookup_with_a_service_like_tf(description, cloud):
  del cloud
  service = FakeTpuService({FULL_NAME: description})
  answers = _same(lambda r: _answers(r("my-tpu", service=service)))
  hosts = len(description.get("networkEndpoints", [None]))
  assert len(answers[1]["worker"]) == hosts
  assert answers[0] == "grpc://" + answers[1]["worker"][0]


@pytest.mark.parametrize("state", ["CREATING", "PREEMPTED", "TERMINATED"])
def test_a_node_that_is_not_ready_raises_like_tf(state, cloud):
  del cloud
  service = FakeTpuService({FULL_NAME: node(state)})
  assert _same(lambda r: r("my-tpu", service=service).master()) == RuntimeError
  with pytest.raises(RuntimeError, match=f'TPU "my-tpu" is not yet ready; state: "{state}"'):
    OURS("my-tpu", service=service).cluster_spec()


def test_a_failed_lookup_raises_value_error_like_tf(cloud):
  del cloud
  service = FakeTpuService({FULL_NAME: KeyError("no such node")})
  assert _same(lambda r: r("my-tpu", service=service).master()) == ValueError


def test_a_node_without_endpoints_raises_value_error_like_tf(cloud):
  del cloud
  service = FakeTpuService({FULL_NAME: {"state": "READY", "networkEndpoints": []}})
  assert _same(lambda r: r("my-tpu", service=service).cluster_spec()) == {"worker": {}}
  assert _same(lambda r: r("my-tpu", service=service).master()) == ValueError


def test_project_and_zone_may_be_bytes_like_tf(cloud):
  service = FakeTpuService({FULL_NAME: node(hosts=2)})
  answers = _same(lambda r: _answers(r(b"my-tpu", project=PROJECT.encode(),
                                       zone=ZONE.encode(), service=service)))
  assert answers[0] == "grpc://10.240.1.2:8470"
  assert not cloud.hits  # nothing asked of the metadata server


def test_with_statement_gives_the_resolver(cloud):
  """TensorFlow 2.21's `__enter__` raises AttributeError."""
  del cloud
  with OURS("grpc://10.0.0.2") as resolver:
    assert resolver.master() == "grpc://10.0.0.2:8470"
  with pytest.raises(KeyError):  # exceptions in the block propagate
    with OURS("grpc://10.0.0.2"):
      raise KeyError("inside")
  with pytest.raises(AttributeError):
    with THEIRS("grpc://10.0.0.2"):
      pass


@pytest.mark.parametrize("hosts", [1, 4])
def test_name_lookup_over_http(hosts, cloud):
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node(hosts=hosts)))
  resolver = OURS("my-tpu")
  assert resolver.cluster_spec().as_dict() == {
      "worker": [f"10.240.1.{i + 2}:8470" for i in range(hosts)]}
  assert resolver.master() == "grpc://10.240.1.2:8470"
  assert cloud.headers[f"/v1/{FULL_NAME}"]["Authorization"] == "Bearer secret"


def test_project_and_zone_may_be_given(cloud):
  cloud.node("p2", "z2", "my-tpu", (200, node(legacy=True)))
  assert OURS("my-tpu", zone="z2", project="p2").master() == "grpc://10.240.1.2:8470"
  assert cloud.hits["/computeMetadata/v1/project/project-id"] == 0


def test_a_ready_node_is_looked_up_once(cloud):
  """TensorFlow asks the API again at every `master()` and `cluster_spec()`."""
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node(hosts=4)))
  resolver = OURS("my-tpu")
  for _ in range(3):
    resolver.master()
    resolver.cluster_spec()
  assert cloud.hits[f"/v1/{FULL_NAME}"] == 1


class FakeClock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  fake = FakeClock()
  monkeypatch.setattr(tpu_cluster_resolver, "clock", fake)
  return fake


def test_a_stale_answer_is_asked_again_and_notices_preemption(cloud, clock):
  """As TensorFlow (which asks at every call), a preempted or recreated node
  is noticed once the cached answer is older than the cache time (10 s)."""
  del cloud
  nodes = {FULL_NAME: node(hosts=2)}
  service = FakeTpuService(nodes)
  resolver = OURS("my-tpu", service=service)
  assert resolver.master() == "grpc://10.240.1.2:8470"
  nodes[FULL_NAME] = node("PREEMPTED")
  clock.now += 9.9
  assert resolver.cluster_spec().num_tasks("worker") == 2  # still fresh
  assert service.calls == 1
  clock.now += 0.1
  with pytest.raises(RuntimeError, match='TPU "my-tpu" is not yet ready; state: "PREEMPTED"'):
    resolver.master()
  nodes[FULL_NAME] = {"state": "READY", "networkEndpoints": [{"ipAddress": "10.9.9.9",
                                                              "port": 8470}]}
  assert resolver.master() == "grpc://10.9.9.9:8470"
  assert service.calls == 3


def test_preemption_and_recreation_like_tf_when_the_cache_is_off(cloud, monkeypatch):
  del cloud
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS", "0")

  def answers(r):
    nodes = {FULL_NAME: node(hosts=1)}
    service = FakeTpuService(nodes)
    resolver = r("my-tpu", service=service)
    first = resolver.master()
    nodes[FULL_NAME] = node("PREEMPTED")
    preempted = oracle.outcome(resolver.master)
    nodes[FULL_NAME] = {"state": "READY", "networkEndpoints": [{"ipAddress": "10.9.9.9",
                                                                "port": 8470}]}
    return first, preempted, resolver.master(), resolver.cluster_spec().as_dict(), service.calls
  assert _same(answers) == ("grpc://10.240.1.2:8470", RuntimeError, "grpc://10.9.9.9:8470",
                            {"worker": ["10.9.9.9:8470"]}, 4)


def test_cache_time_must_be_a_number(cloud, monkeypatch):
  del cloud
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS", "soon")
  resolver = OURS("my-tpu", service=FakeTpuService({FULL_NAME: node()}))
  with pytest.raises(ValueError, match=r"\$TF_DISTRIBUTE_LITE_TPU_CACHE_SECONDS must be a "
                                       r"non-negative number; it is 'soon'"):
    resolver.master()


def test_a_node_not_ready_is_asked_again(cloud):
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node("CREATING")), (200, node()))
  resolver = OURS("my-tpu")
  with pytest.raises(RuntimeError, match="CREATING"):
    resolver.master()
  assert resolver.master() == "grpc://10.240.1.2:8470"


def test_server_errors_are_retried(cloud):
  cloud.node(PROJECT, ZONE, "my-tpu", (500, "busy"), (503, "busy"), (200, node()))
  assert OURS("my-tpu").master() == "grpc://10.240.1.2:8470"
  assert cloud.hits[f"/v1/{FULL_NAME}"] == 3


def test_an_api_that_keeps_failing_gives_a_clear_error(cloud):
  cloud.node(PROJECT, ZONE, "my-tpu", (500, "broken"))
  with pytest.raises(ValueError, match="my-tpu.*HTTP 500"):
    OURS("my-tpu").master()
  assert cloud.hits[f"/v1/{FULL_NAME}"] == 3  # the first try and 2 retries


def test_malformed_json_gives_a_clear_error(cloud):
  cloud.node(PROJECT, ZONE, "my-tpu", (200, "{not json"))
  with pytest.raises(ValueError, match="did not return JSON: '{not json'"):
    OURS("my-tpu").master()


def test_the_fake_metadata_server_wants_the_flavor_header(cloud):
  url = f"http://{cloud.address}/computeMetadata/v1/project/project-id"
  with pytest.raises(urllib.error.HTTPError) as raised:
    urllib.request.urlopen(url, timeout=5)
  assert raised.value.code == 404
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node()))
  OURS("my-tpu").master()  # ours sends the header
  assert cloud.headers["/computeMetadata/v1/project/project-id"]["Metadata-Flavor"] == "Google"


def test_metadata_404_raises_http_error_like_tf(cloud):
  cloud.metadata("project/project-id", "gone", status=404)
  assert _same(lambda r: r("my-tpu", service=FakeTpuService({}))) == urllib.error.HTTPError


def test_a_hanging_metadata_server_times_out(cloud, monkeypatch):
  monkeypatch.setenv("TF_DISTRIBUTE_LITE_HTTP_RETRIES", "1")
  cloud.metadata("project/project-id", PROJECT, delay=3)
  start = time.monotonic()
  with pytest.raises(TimeoutError, match="no answer within 0.3 s"):
    OURS("my-tpu")
  assert time.monotonic() - start < 2.5


def test_tpu_config_names_the_node(cloud, monkeypatch):
  monkeypatch.setenv("TPU_CONFIG", '{"tpu_node_name": "my-tpu", "project": "p3", "zone": "z3"}')
  cloud.node("p3", "z3", "my-tpu", (200, node(hosts=2)))
  assert OURS().cluster_spec().num_tasks("worker") == 2


def test_discovery_document_gives_the_api_root(cloud, monkeypatch):
  monkeypatch.delenv("TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT")
  cloud.answer("/discovery", (200, {"rootUrl": f"http://{cloud.address}/", "servicePath": ""}))
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node()))
  resolver = OURS("my-tpu", discovery_url=f"http://{cloud.address}/discovery")
  assert resolver.master() == "grpc://10.240.1.2:8470"


def test_discovery_url_variable_overrides_the_argument(cloud, monkeypatch):
  monkeypatch.delenv("TF_DISTRIBUTE_LITE_TPU_API_ENDPOINT")
  cloud.answer("/tpu/v1/rest", (200, {"rootUrl": f"http://{cloud.address}/",
                                      "servicePath": ""}))
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node(hosts=2)))
  monkeypatch.setenv("TPU_API_DISCOVERY_URL", f"http://{cloud.address}/{{api}}/{{apiVersion}}/rest")
  resolver = OURS("my-tpu", discovery_url="http://127.0.0.1:1/unused")
  assert resolver.cluster_spec().num_tasks("worker") == 2


# --- Finding the TPU of a Cloud TPU VM, beyond TensorFlow.

def _pci_device(root, address, vendor, device):
  folder = root / address
  folder.mkdir(parents=True)
  (folder / "vendor").write_text(vendor + "\n")
  (folder / "device").write_text(device + "\n")


def test_nothing_found_lists_every_source(cloud):
  del cloud
  with pytest.raises(ValueError) as raised:
    OURS()
  message = str(raised.value)
  for source in ("Please provide a TPU Name", "$TPU_NAME: not set",
                 "$KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS: not set", "$TPU_CONFIG: not set",
                 "TPU chips on the PCI bus", "Cloud TPU VM metadata", "HTTP 404"):
    assert source in message
  assert isinstance(raised.value, ValueError)
  with pytest.raises(ValueError):  # TensorFlow's class
    THEIRS()


def test_tpu_chips_on_the_pci_bus_mean_local(cloud, tmp_path):
  del cloud
  _pci_device(tmp_path / "pci", "0000:00:04.0", "0x1ae0", "0x0042")  # a gVNIC, no TPU
  with pytest.raises(ValueError):
    OURS()
  _pci_device(tmp_path / "pci", "0000:00:05.0", "0x1ae0", "0x005e")
  resolver = OURS()
  assert (resolver.master(), resolver.cluster_spec().as_dict()) == ("", {})
  assert resolver.num_accelerators() == {"TPU": 0}  # TensorFlow has no TPU here


def test_tpu_vm_metadata_means_local(cloud):
  cloud.metadata("instance/attributes/accelerator-type", "v4-8")
  cloud.metadata("instance/attributes/agent-worker-number", "0")
  assert OURS("").master() == ""
  assert cloud.hits["/computeMetadata/v1/instance/attributes/accelerator-type"] == 1


def _tpu_vm(cloud, hosts, worker=None):
  cloud.metadata("instance/attributes/accelerator-type", f"v4-{8 * hosts}")
  cloud.metadata("instance/attributes/worker-network-endpoints",
                 ",".join(f"unknown:unknown:10.130.0.{i + 2}" for i in range(hosts)))
  if worker is not None:
    cloud.metadata("instance/attributes/agent-worker-number", str(worker))


def test_a_multi_host_tpu_vm_slice_gives_one_worker_per_host(cloud, tmp_path):
  _pci_device(tmp_path / "pci", "0000:00:05.0", "0x1ae0", "0x005e")  # this host's chips
  _tpu_vm(cloud, hosts=4, worker=2)
  resolver = OURS()
  assert resolver.cluster_spec().as_dict() == {
      "worker": [f"10.130.0.{i + 2}:8470" for i in range(4)]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 2)
  assert resolver.master() == "grpc://10.130.0.4:8470"
  assert resolver.master("worker", 0) == "grpc://10.130.0.2:8470"


# What each host of a v4-32 (16 chips, 2x2x4, four 2x2x1 hosts) finds in its
# `tpu-env` metadata attribute, which libtpu reads.
V4_32_TPU_ENV = ("ACCELERATOR_TYPE: 'v4-32'\nCHIPS_PER_HOST_BOUNDS: '2,2,1'\n"
                 "HOST_BOUNDS: '1,1,4'\nTOPOLOGY: '2x2x4'\n")


@pytest.mark.parametrize("worker", range(4))
def test_each_host_of_a_v4_32_finds_the_slice_the_emulated_v4_32_has(cloud, tmp_path, worker):
  _pci_device(tmp_path / "pci", "0000:00:05.0", "0x1ae0", "0x005e")
  _tpu_vm(cloud, hosts=4, worker=worker)
  cloud.metadata("instance/attributes/tpu-env", V4_32_TPU_ENV + f"WORKER_ID: '{worker}'\n")
  resolver = OURS()
  workers = resolver.cluster_spec().job_tasks("worker")
  assert workers == [f"10.130.0.{i + 2}:8470" for i in range(4)]
  assert (resolver.task_type, resolver.task_id) == ("worker", worker)
  assert resolver.master() == f"grpc://{workers[worker]}"
  # The emulated slice of that accelerator type has the same shape.
  env = dict(line.split(": ") for line in V4_32_TPU_ENV.splitlines())
  emulated = tfd.tpu_emulation.parse("emulated:" + env["ACCELERATOR_TYPE"].strip("'"))
  topology = emulated.topology()
  chips_per_host = [int(n) for n in env["CHIPS_PER_HOST_BOUNDS"].strip("'").split(",")]
  assert topology.num_tasks == emulated.num_hosts == len(workers)
  assert topology.num_tpus_per_task == math.prod(chips_per_host)  # a v4 chip is one core
  assert "x".join(map(str, topology.mesh_shape[:3])) == env["TOPOLOGY"].strip("'")
  assert list(emulated.host_bounds) == [int(n) for n in env["HOST_BOUNDS"].strip("'").split(",")]
  # This host's task holds its own box of chips: z = worker.
  assert {c[2] for c in topology.device_coordinates[worker].tolist()} == {worker}


def test_a_single_host_tpu_vm_is_local(cloud):
  _tpu_vm(cloud, hosts=1, worker=0)
  resolver = OURS()
  assert (resolver.master(), resolver.cluster_spec().as_dict(), resolver.task_id) == ("", {}, 0)


def test_a_slice_host_without_its_worker_number_says_so(cloud):
  _tpu_vm(cloud, hosts=2)
  with pytest.raises(ValueError, match="lists 2 hosts in `worker-network-endpoints` but not "
                                       "this host's `agent-worker-number`"):
    OURS()


def test_an_empty_tpu_name_counts_as_unset(cloud, monkeypatch):
  """TensorFlow looks up a TPU named "" instead."""
  monkeypatch.setenv("TPU_NAME", "")
  with pytest.raises(ValueError, match=r"\$TPU_NAME: empty"):
    OURS()
  monkeypatch.setenv("TPU_CONFIG", '{"tpu_node_name": "my-tpu"}')
  cloud.node(PROJECT, ZONE, "my-tpu", (200, node(hosts=2)))
  assert OURS().cluster_spec().num_tasks("worker") == 2


def test_an_unreachable_metadata_server_is_reported(cloud, monkeypatch):
  del cloud
  monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:1")
  with pytest.raises(ValueError, match="unreachable"):
    OURS()


# --- TPU system initialization, and the topology it reports.

def test_initialize_without_a_tpu_raises_not_found(cloud):
  del cloud
  with pytest.raises(tf.errors.NotFoundError, match="No TPU was found"):
    tfd.tpu.experimental.initialize_tpu_system(OURS("local"))
  with pytest.raises(tf.errors.NotFoundError):
    tfd.tpu.experimental.shutdown_tpu_system(OURS("local"))


@pytest.mark.parametrize("system_function", ["initialize_tpu_system", "shutdown_tpu_system"])
def test_without_a_resolver_or_a_tpu_not_found_lists_the_places(system_function, cloud):
  """TensorFlow raises ValueError("Please provide a TPU Name to connect to.")."""
  del cloud
  with pytest.raises(tf.errors.NotFoundError) as raised:
    getattr(tfd.tpu.experimental, system_function)()
  for place in ("No TPU was found", "$TPU_NAME: not set", "TPU chips on the PCI bus",
                "Cloud TPU VM metadata"):
    assert place in raised.value.message


def _system_ops(graph):
  return [(op.type, op.device) for op in graph.get_operations()
          if op.type.endswith("DistributedTPU")]


@pytest.mark.parametrize("tpu, device", [
    ("local", "/device:TPU_SYSTEM:0"),
    ("grpc://10.0.0.2:8470", "/job:worker/replica:0/task:0/device:TPU_SYSTEM:0")])
def test_initialize_in_a_function_adds_the_op_and_returns_the_topology_like_tf(
    tpu, device, cloud):
  del cloud

  def traced(r, initialize):
    function = tf.function(lambda: initialize(r(tpu)))
    concrete = function.get_concrete_function()
    return _system_ops(concrete.graph), concrete.structured_outputs.dtype
  ours = traced(OURS, tfd.tpu.experimental.initialize_tpu_system)
  assert ours == traced(THEIRS, tf.tpu.experimental.initialize_tpu_system)
  assert ours == ([("ConfigureDistributedTPU", device)], tf.string)


def test_shutdown_in_a_function_raises_runtime_error_like_tf(cloud):
  del cloud
  for r, shutdown in ((OURS, tfd.tpu.experimental.shutdown_tpu_system),
                      (THEIRS, tf.tpu.experimental.shutdown_tpu_system)):
    with pytest.raises(RuntimeError, match="not supported within"):
      tf.function(lambda: shutdown(r("local"))).get_concrete_function()  # pylint: disable=cell-var-from-loop


@pytest.mark.parametrize("tpu, job, device", [
    ("local", None, "/device:TPU_SYSTEM:0"),
    ("grpc://10.0.0.2:8470", "worker/replica:0/task:0",
     "/job:worker/replica:0/task:0/device:TPU_SYSTEM:0")])
def test_the_system_functions_build_tensorflows_tpu_system_ops(tpu, job, device, cloud):
  del cloud
  assert tpu_system.system_device(OURS(tpu)) == device
  initialize = tpu_system.initialize_function(job).get_concrete_function().graph
  shutdown = tpu_system.shutdown_function(job).get_concrete_function().graph
  assert _system_ops(initialize) == [("ConfigureDistributedTPU", device)]
  assert _system_ops(shutdown) == [("ShutdownDistributedTPU", device)]
  (op,) = [op for op in initialize.get_operations() if op.type == "ConfigureDistributedTPU"]
  assert op.get_attr("compilation_failure_closes_chips") is False


@pytest.mark.parametrize("system_function", ["initialize_tpu_system", "shutdown_tpu_system"])
def test_tf1_graphs_run_the_system_op_in_a_session(system_function, cloud):
  """TensorFlow runs the op in a session too, and raises its
  InvalidArgumentError; ours says no TPU was found."""
  del cloud
  with tf.Graph().as_default():
    with pytest.raises(tf.errors.InvalidArgumentError) as theirs:
      getattr(tf.tpu.experimental, system_function)(THEIRS("local"))
    with pytest.raises(tf.errors.NotFoundError, match="TPUs not found in the cluster "
                                                      "\\(master ''\\)") as ours:
      getattr(tfd.tpu.experimental, system_function)(OURS("local"))
  assert "DistributedTPU" in theirs.value.message
  assert "DistributedTPU" in ours.value.message


def test_set_topology_and_hardware_feature_like_tf(cloud):
  del cloud
  serialized = tfd.tpu_emulation.PRESETS["v4-8"].topology().serialized()

  def feature(r):
    resolver = r("grpc://10.0.0.2:8470")
    before = resolver.tpu_hardware_feature
    resolver.set_tpu_topology(serialized)
    return before, resolver.tpu_hardware_feature
  assert _same(feature)[0] is None


def test_system_metadata_devices_have_tensorflows_attributes(cloud):
  del cloud

  def devices(r):
    return [(d.name, d.device_type, d.memory_limit_bytes, d.incarnation)
            for d in r("local").get_tpu_system_metadata().devices]
  assert _same(devices)[0] == ("/job:localhost/replica:0/task:0/device:CPU:0", "CPU", 0, 0)


def test_asking_an_unreachable_master_is_bounded(cloud):
  """TensorFlow tries 120 times, each try unbounded unless the config sets
  a timeout."""
  del cloud
  (port,) = free_ports(1)
  config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=100)
  with tf.Graph().as_default():
    with pytest.raises(RuntimeError, match=f"Failed to connect to master.*localhost:{port}.*"
                                           "3 tries of 0.1 s each timed out"):
      OURS(f"grpc://localhost:{port}").num_accelerators(config_proto=config)


# --- Emulated slices.

def test_emulated_slice_from_the_argument_or_tpu_name(cloud, monkeypatch):
  del cloud
  resolver = OURS("emulated:v4-8")
  assert resolver.emulated_slice.name == "v4-8"
  assert (resolver.master(), resolver.cluster_spec().as_dict()) == ("", {})
  monkeypatch.setenv("TPU_NAME", "emulated:v4-8")
  for tpu in (None, ""):
    assert OURS(tpu).num_accelerators() == {"TPU": 4}
  metadata = OURS().get_tpu_system_metadata()
  assert (metadata.num_cores, metadata.num_hosts, metadata.num_of_cores_per_host) == (4, 1, 4)
  assert [d.name for d in metadata.devices] == [
      f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]


def test_initialized_emulated_slice_gives_its_topology(cloud):
  del cloud
  topology = tfd.tpu.experimental.initialize_tpu_system(OURS("emulated:v4-8"))
  assert topology.mesh_shape.tolist() == [2, 2, 1, 1]
  assignment = tfd.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=[1, 1, 1, 1], num_replicas=4)
  assert assignment.num_replicas == 4


def test_connect_initializes_the_tpu_system_it_finds(cloud):
  del cloud
  tfd.tpu.experimental.shutdown_tpu_system(OURS("emulated:v4-8"))
  assert tpu_system.initialized_topology(OURS("emulated:v4-8")) is None
  resolver = OURS.connect("emulated:v4-8")
  assert tpu_system.initialized_topology(resolver).mesh_shape.tolist() == [2, 2, 1, 1]


def test_unknown_emulated_slice_lists_the_presets(cloud):
  del cloud
  with pytest.raises(ValueError, match="emulated:v2-8, emulated:v3-8, emulated:v4-8, "
                                       "emulated:v5litepod-8"):
    OURS("emulated:v9-8")


def test_too_few_devices_for_a_started_tensorflow_says_how_to_fix_it(cloud):
  del cloud
  with pytest.raises(RuntimeError, match="needs 8 logical CPU devices.*started with 4.*"
                                         "before any other TensorFlow operation"):
    OURS("emulated:v3-8")


def test_a_fresh_program_gets_a_v3_8_slice_from_tpu_name():
  script = ("import tensorflow as tf, tf_distribute_lite as tfd\n"
            "resolver = tfd.cluster_resolver.TPUClusterResolver()\n"
            "topology = tfd.tpu.experimental.initialize_tpu_system(resolver)\n"
            "print(len(tf.config.list_logical_devices('CPU')), topology.mesh_shape.tolist())\n")
  env = dict(os.environ, TPU_NAME="emulated:v3-8")
  result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip().splitlines()[-1] == "8 [2, 2, 1, 2]"
