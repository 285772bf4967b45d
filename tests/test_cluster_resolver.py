"""The cluster resolvers that read no network, against TensorFlow's own:
the same calls give the same results and exception classes."""

import json
import os
import subprocess
import sys
import types
from types import SimpleNamespace as Obj

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from multi_worker import free_ports
import oracle

TF = tf.distribute.cluster_resolver
OURS = tfd.cluster_resolver
BOTH = pytest.mark.parametrize("mod", [TF, OURS], ids=["tf", "tfd"])


def _same(call):
  return oracle.compare(call, (TF,), (OURS,))


def test_every_tensorflow_resolver_is_here():
  names = {n for n in dir(TF) if not n.startswith("_")}
  assert names <= set(dir(OURS))
  assert tfd.compat.v1.cluster_resolver.TPUClusterResolver is OURS.TPUClusterResolver
  assert tfd.Server is tf.distribute.Server


@pytest.mark.parametrize("make", [
    lambda: OURS.SimpleClusterResolver(tf.train.ClusterSpec({})),
    lambda: OURS.TFConfigClusterResolver(),
    lambda: OURS.TPUClusterResolver("local")])
def test_our_resolvers_are_tensorflows_cluster_resolvers(make):
  resolver = make()
  assert isinstance(resolver, TF.ClusterResolver)
  assert tf.config.experimental_connect_to_cluster(resolver) is None  # local: no server


def test_tensorflows_resolvers_are_ours():
  theirs = TF.SimpleClusterResolver(tf.train.ClusterSpec({}))
  assert isinstance(theirs, OURS.ClusterResolver)
  assert not isinstance(theirs, OURS.SimpleClusterResolver)
  assert not issubclass(TF.ClusterResolver, OURS.ClusterResolver)  # the base itself is not
  assert OURS.UnionResolver(theirs).cluster_spec().as_dict() == {}


def test_tensorflow_connects_to_the_cluster_our_resolver_names():
  # Connecting changes this process's eager context for good: do it in a
  # fresh process, which also serves the one-task cluster it connects to.
  script = (
      "import sys, tensorflow as tf, tf_distribute_lite as tfd\n"
      "address = 'localhost:' + sys.argv[1]\n"
      "cluster = tf.train.ClusterSpec({'worker': [address]})\n"
      "server = tfd.Server(cluster, job_name='worker', task_index=0)\n"
      "resolver = tfd.cluster_resolver.SimpleClusterResolver(cluster, 'grpc://' + address)\n"
      "tf.config.experimental_connect_to_cluster(resolver)\n"
      "x = tf.constant(1.0) + 1\n"
      "print(x.device, x.numpy())\n")
  result = subprocess.run([sys.executable, "-c", script, str(free_ports(1)[0])],
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["/job:worker/replica:0/task:0/device:CPU:0", "2.0"]


# --- SimpleClusterResolver and UnionResolver.

CLUSTER = {"ps": ["p0:2222"], "worker": ["w0:2222", "w1:2222"]}


@pytest.mark.parametrize("call", [
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER)).master(),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER), "m:1",
                                      rpc_layer="grpc").master(),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER)).master(
        "worker", 1, "grpc"),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER)).num_accelerators(),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER),
                                      num_accelerators={"GPU": 2}).num_accelerators(),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER), task_type="ps",
                                      task_id=0, environment="google").environment,
    lambda m: m.SimpleClusterResolver(CLUSTER),
    lambda m: m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER), master=3),
])
def test_simple_resolver_like_tf(call):
  _same(call)


def test_simple_resolver_keeps_and_sets_the_task():
  def task(m):
    resolver = m.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER), task_type="ps",
                                       task_id=0, rpc_layer="grpc")
    before = (resolver.task_type, resolver.task_id, resolver.rpc_layer)
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "grpc+verbs"
    return before, (resolver.task_type, resolver.task_id, resolver.rpc_layer)
  assert _same(task) == (("ps", 0, "grpc"), ("worker", 1, "grpc+verbs"))


def _simple(m, cluster, **kwargs):
  return m.SimpleClusterResolver(tf.train.ClusterSpec(cluster), **kwargs)


@pytest.mark.parametrize("clusters", [
    [{"worker": ["w0:1"]}, {"ps": ["p0:1", "p1:1"]}],
    [{"worker": ["w0:1"]}, {"worker": ["w1:1", "w2:1"]}],
    [{"worker": {0: "w0:1"}}, {"worker": {3: "w3:1"}}],
    [{"worker": ["w0:1", "w1:1"]}, {"worker": {5: "w5:1"}}],
    [{"worker": ["w0:1"]}, {"worker": {0: "x:1"}}],  # index 0 twice: KeyError
])
def test_union_merges_like_tf(clusters):
  _same(lambda m: m.UnionResolver(*[_simple(m, c) for c in clusters]).cluster_spec())


@pytest.mark.parametrize("call", [
    lambda m: m.UnionResolver(),
    lambda m: m.UnionResolver(_simple(m, CLUSTER), task="worker"),
    lambda m: m.UnionResolver("not a resolver"),
    lambda m: m.UnionResolver(_simple(m, CLUSTER, master="m:1"), _simple(m, {})).master(),
    lambda m: m.UnionResolver(_simple(m, CLUSTER), _simple(m, {"chief": ["c:1"]}),
                              rpc_layer="grpc").master("chief", 0),
    lambda m: (lambda r: (r.task_type, r.task_id, r.rpc_layer, r.environment,
                          r.num_accelerators()))(
                              m.UnionResolver(_simple(m, CLUSTER, task_type="ps", task_id=0,
                                                      rpc_layer="grpc",
                                                      num_accelerators={"GPU": 1}))),
    lambda m: m.UnionResolver(_simple(m, CLUSTER), task_type="worker",
                              task_id=1).task_id,
    lambda m: (lambda r: (r.task_type, r.rpc_layer))(
        m.UnionResolver(_simple(m, CLUSTER, task_type="ps", rpc_layer="grpc"),
                        task_type="", rpc_layer="")),
    lambda m: m.UnionResolver.__name__,
])
def test_union_answers_like_tf(call):
  _same(call)


def test_union_task_id_zero_overrides_the_first_resolvers():
  """TF 2.21 returns the first resolver's task id when given `task_id=0`."""
  first = _simple(OURS, CLUSTER, task_type="worker", task_id=1)
  assert OURS.UnionResolver(first, task_id=0).task_id == 0
  assert TF.UnionResolver(_simple(TF, CLUSTER, task_type="worker", task_id=1),
                          task_id=0).task_id == 1


# --- TFConfigClusterResolver.

SPEC_CONFIG = {"cluster": {"chief": ["host0:2222"],
                           "worker": ["host1:2222", "host2:2222", "host3:2222"],
                           "ps": ["host4:2222", "host5:2222"]},
               "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("config", [
    SPEC_CONFIG,
    dict(SPEC_CONFIG, rpc_layer="grpc"),
    dict(SPEC_CONFIG, session_master="grpc://sm:1"),
    {"cluster": {"worker": ["only:1"]}, "task": {"type": "worker", "index": "0"}},
    {},
    {"task": {"type": "evaluator", "index": 0}},
    {"cluster": {"worker": {"1": "a:1"}}},  # one task, in slot 1
])
def test_tf_config_resolver_like_tf(config, monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps(config))
  _same(lambda m: m.TFConfigClusterResolver().cluster_spec())
  _same(lambda m: m.TFConfigClusterResolver().master())
  _same(lambda m: m.TFConfigClusterResolver().num_accelerators())
  _same(lambda m: (lambda r: (r.task_type, r.task_id, r.rpc_layer, r.environment))(
      m.TFConfigClusterResolver()))
  _same(lambda m: m.TFConfigClusterResolver(task_type="ps", task_id=1,
                                            rpc_layer="grpc").master())
  _same(lambda m: m.TFConfigClusterResolver().master("worker", 1, "grpc"))


def test_a_sparse_job_of_one_task_is_not_a_local_master_like_tf(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": {"1": "a:1"}}}')
  assert _same(lambda m: m.TFConfigClusterResolver().master("worker", 1, "grpc")) == (
      "grpc://a:1")
  assert _same(lambda m: m.TFConfigClusterResolver().master()) == ValueError


def test_tf_config_is_read_at_every_call(monkeypatch):
  resolver = OURS.TFConfigClusterResolver()
  monkeypatch.setenv("TF_CONFIG", json.dumps(SPEC_CONFIG))
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  monkeypatch.setenv("TF_CONFIG", json.dumps(dict(SPEC_CONFIG, task={"type": "ps", "index": 0})))
  assert (resolver.task_type, resolver.task_id) == ("ps", 0)
  assert resolver.master(rpc_layer="grpc") == "grpc://host4:2222"


@pytest.mark.parametrize("text, message", [
    ("[]", r"\$TF_CONFIG must be a JSON object with `cluster` and `task` entries; "
           r"it is '\[\]'"),
    ("5", r"\$TF_CONFIG must be a JSON object .*; it is '5'"),
    ('{"task": null}', r"\$TF_CONFIG's `task` must be a JSON object such as "
                       r"\{\"type\": \"worker\", \"index\": 0\}; it is null"),
    ('{"cluster": ["a:1"]}', r"\$TF_CONFIG's `cluster` must be a JSON object .*; "
                             r"it is \[\"a:1\"\]"),
])
def test_tf_config_that_is_not_an_object_gets_a_value_error_naming_the_field(
    text, message, monkeypatch):
  """TensorFlow reads "[]" as {} and fails with a TypeError on the others."""
  monkeypatch.setenv("TF_CONFIG", text)
  resolver = OURS.TFConfigClusterResolver()
  for call in (resolver.cluster_spec, resolver.master, lambda: resolver.task_type):
    with pytest.raises(ValueError, match=message):
      call()


def test_malformed_tf_config_names_the_variable(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]')
  _same(lambda m: m.TFConfigClusterResolver().cluster_spec())  # json.JSONDecodeError
  with pytest.raises(ValueError, match=r"\$TF_CONFIG is not valid JSON"):
    OURS.TFConfigClusterResolver().cluster_spec()


# --- SlurmClusterResolver.

SLURM = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4",
         "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


@pytest.fixture
def slurm_env(monkeypatch):
  for name, value in SLURM.items():
    monkeypatch.setenv(name, value)
  # Registered with monkeypatch, so the resolvers' setting of it is undone.
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
  return monkeypatch


@pytest.mark.parametrize("kwargs", [
    {"gpus_per_node": 4},
    {"gpus_per_node": 4, "jobs": {"ps": 1, "worker": 3}, "port_base": 9000},
    {"gpus_per_node": 2, "gpus_per_task": 1, "tasks_per_node": 2},
    {"gpus_per_node": 4, "tasks_per_node": {"a": 1, "b": 3}},
    {"gpus_per_node": 2, "gpus_per_task": 2},  # more GPUs than the node has
    {"gpus_per_node": 4, "jobs": {"worker": 5}},  # more tasks than Slurm gave
])
def test_slurm_resolver_like_tf(kwargs, slurm_env):
  def answers(m):
    resolver = m.SlurmClusterResolver(**kwargs)
    spec = resolver.cluster_spec().as_dict()
    return (spec, resolver.get_task_info(), resolver.master(), resolver.num_accelerators(),
            os.environ["CUDA_VISIBLE_DEVICES"])
  _same(answers)


@pytest.mark.parametrize("hostlist", ["node[01-03,07],gpu1", "a,b[8-10]", "x[1-2]y", "a,,b",
                                      "n[1-2", "n[1-2]\n", "a\n,b[1-2]\n", "n[1-2\n]"])
def test_slurm_hostlists_like_tf(hostlist):
  from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver  # pylint: disable=g-import-not-at-top
  from tf_distribute_lite.cluster_resolver import slurm_cluster_resolver as ours  # pylint: disable=g-import-not-at-top
  assert (oracle.outcome(lambda: ours.expand_hostlist(hostlist)) ==
          oracle.outcome(lambda: slurm_cluster_resolver.expand_hostlist(hostlist)))


@pytest.mark.parametrize("tasks_per_node", ["2(x3),1", "2(x2)\n", "1\n,3\n", "2\n\n", "x"])
def test_slurm_tasks_per_node_like_tf(tasks_per_node):
  from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver  # pylint: disable=g-import-not-at-top
  from tf_distribute_lite.cluster_resolver import slurm_cluster_resolver as ours  # pylint: disable=g-import-not-at-top
  assert (oracle.outcome(lambda: ours.expand_tasks_per_node(tasks_per_node)) ==
          oracle.outcome(lambda: slurm_cluster_resolver.expand_tasks_per_node(tasks_per_node)))


def test_slurm_variables_ending_in_a_newline_like_tf(slurm_env):
  slurm_env.setenv("SLURM_STEP_NODELIST", "node[07-08]\n")
  slurm_env.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)\n")
  assert _same(lambda m: m.SlurmClusterResolver(gpus_per_node=4).cluster_spec())["worker"] == [
      "node07:8888", "node07:8889", "node08:8888", "node08:8889"]


def test_slurm_outside_a_step_raises_like_tf(monkeypatch):
  monkeypatch.delenv("SLURM_PROCID", raising=False)
  assert _same(lambda m: m.SlurmClusterResolver(gpus_per_node=0)) == RuntimeError


def test_slurm_on_nodes_without_gpus(slurm_env):
  """TF 2.21 fails here (a range with step 0); every task gets no GPU."""
  resolver = OURS.SlurmClusterResolver(gpus_per_node=0)
  assert resolver.cluster_spec().as_dict() == {
      "worker": ["node07:8888", "node07:8889", "node08:8888", "node08:8889"]}
  assert resolver.get_task_info() == ("worker", 3)
  assert resolver.num_accelerators() == {"GPU": 0}
  with pytest.raises(ValueError):
    TF.SlurmClusterResolver(gpus_per_node=0).cluster_spec()


# --- Kubernetes and GCE, through fake clients.

def _pod(name, phase="Running", ip="10.0.0.1"):
  return Obj(metadata=Obj(name=name), status=Obj(phase=phase, host_ip=ip))


class FakeKubernetes:

  def __init__(self, pods):
    self.pods = pods

  def list_pod_for_all_namespaces(self, label_selector):
    return Obj(items=self.pods.get(label_selector, []))


@pytest.mark.parametrize("pods, mapping", [
    ({"job-name=tensorflow": [_pod("b", ip="10.0.0.2"), _pod("a")]}, None),
    ({"j=ps": [_pod("p")], "j=w": [_pod("w1", ip="10.0.0.3"), _pod("w0")]},
     {"ps": ["j=ps"], "worker": ["j=w"]}),
    ({"job-name=tensorflow": [_pod("a", phase="Pending")]}, None),
])
def test_kubernetes_resolver_like_tf(pods, mapping):
  def answers(m):
    resolver = m.KubernetesClusterResolver(mapping, override_client=FakeKubernetes(pods))
    resolver.task_type, resolver.task_id = (mapping and "worker") or "worker", 0
    return resolver.cluster_spec().as_dict(), resolver.master()
  _same(answers)


def test_executable_location_is_named_like_tfs():
  assert _same(lambda m: (m.KubernetesExecutableLocation.__name__,
                          repr(m.KubernetesExecutableLocation.OFF_CLUSTER),
                          [m.value for m in m.KubernetesExecutableLocation])) == (
                              "ExecutableLocation", "<ExecutableLocation.OFF_CLUSTER: 1>", [0, 1])


@pytest.fixture
def fake_kubernetes_package(monkeypatch):
  """A `kubernetes` package whose config loaders record their calls."""
  loaded = []
  package = types.ModuleType("kubernetes")
  package.config = Obj(load_kube_config=lambda: loaded.append("kube config"),
                       load_incluster_config=lambda: loaded.append("in cluster"))
  package.client = Obj(CoreV1Api=lambda: FakeKubernetes(
      {"job-name=tensorflow": [_pod("a")]}))
  monkeypatch.setitem(sys.modules, "kubernetes", package)
  return loaded


@pytest.mark.parametrize("location", [
    TF.KubernetesExecutableLocation.OFF_CLUSTER, OURS.KubernetesExecutableLocation.OFF_CLUSTER,
    TF.KubernetesExecutableLocation.WITHIN_CLUSTER,
    OURS.KubernetesExecutableLocation.WITHIN_CLUSTER],
                         ids=["tf-off", "tfd-off", "tf-within", "tfd-within"])
def test_kubernetes_accepts_tensorflows_executable_locations(location, fake_kubernetes_package):
  """TensorFlow accepts only its own enum (ValueError for ours)."""
  resolver = OURS.KubernetesClusterResolver(executable_location=location)
  assert fake_kubernetes_package == [
      "kube config" if location.name == "OFF_CLUSTER" else "in cluster"]
  assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.1:8470"]}


def test_kubernetes_rejects_other_executable_locations_like_tf(fake_kubernetes_package):
  del fake_kubernetes_package
  for location in (1, "OFF_CLUSTER"):
    assert _same(lambda m: m.KubernetesClusterResolver(executable_location=location)) == (  # pylint: disable=cell-var-from-loop
        ValueError)


def test_kubernetes_without_its_package_raises_import_error_naming_it():
  assert _same(lambda m: m.KubernetesClusterResolver()) == ImportError
  with pytest.raises(ImportError, match="pip install kubernetes"):
    OURS.KubernetesClusterResolver()


class FakeCompute:
  """Two pages of instances, as googleapiclient's Compute service pages them."""

  def __init__(self):
    self.ips = {"vm-b": "10.0.0.9", "vm-a": "10.0.0.8", "vm-c": "10.0.0.7"}

  def instanceGroups(self):  # pylint: disable=invalid-name
    pages = [["vm-b", "vm-a"], ["vm-c"]]

    class Groups:
      def listInstances(self, **kwargs):  # pylint: disable=invalid-name
        return Obj(page=0, execute=lambda: {"items": [
            {"instance": f"zones/z/instances/{n}"} for n in pages[0]]})

      def listInstances_next(self, previous_request, previous_response):  # pylint: disable=invalid-name
        del previous_response
        page = previous_request.page + 1
        if page == len(pages):
          return None
        return Obj(page=page, execute=lambda: {"items": [
            {"instance": f"zones/z/instances/{n}"} for n in pages[page]]})
    return Groups()

  def instances(self):
    ips = self.ips
    return Obj(get=lambda project, zone, instance: Obj(
        execute=lambda: {"networkInterfaces": [{"networkIP": ips[instance]}]}))


def test_gce_resolver_like_tf():
  def answers(m):
    resolver = m.GCEClusterResolver("p", "z", "g", 8470, task_id=2, service=FakeCompute())
    resolver.task_id = 1
    return resolver.cluster_spec().as_dict(), resolver.master(), resolver.master(rpc_layer="x")
  assert _same(answers)[0] == {"worker": ["10.0.0.7:8470", "10.0.0.8:8470", "10.0.0.9:8470"]}


def test_gce_task_type_is_fixed_and_client_optional_like_tf():
  def reset(m):
    m.GCEClusterResolver("p", "z", "g", 1, service=FakeCompute()).task_type = "ps"
  assert _same(reset) == RuntimeError
  assert _same(lambda m: m.GCEClusterResolver("p", "z", "g", 1)) == ImportError
