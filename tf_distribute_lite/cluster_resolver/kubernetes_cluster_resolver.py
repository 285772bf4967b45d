"""`KubernetesClusterResolver`: the running pods that label selectors pick."""

import enum

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import task_master


class ExecutableLocation(enum.Enum):
  """Where the program runs: inside the Kubernetes cluster, or outside it.

  >>> KubernetesExecutableLocation.OFF_CLUSTER
  <ExecutableLocation.OFF_CLUSTER: 1>
  """
  WITHIN_CLUSTER = 0
  OFF_CLUSTER = 1


KubernetesExecutableLocation = ExecutableLocation


def _executable_location(given):
  """Our member for `given`, ours or TensorFlow's (the same name and value)."""
  for location in ExecutableLocation:
    if given is location or (isinstance(given, enum.Enum) and
                             (given.name, given.value) == (location.name, location.value)):
      return location
  raise ValueError("The executable location provided is invalid.")


def _kubernetes():
  try:
    import kubernetes  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "The Kubernetes Python client must be installed before using the Kubernetes "
        "Cluster Resolver. To install the Kubernetes Python client, run `pip install "
        "kubernetes` on your command line.") from None
  return kubernetes


class KubernetesClusterResolver(ClusterResolver,
                                stands_for=tf.distribute.cluster_resolver.KubernetesClusterResolver):
  """Each job is the pods its label selectors pick (sorted by name); all must be
  running. Without `override_client`, the `kubernetes` package must be installed.

  >>> from types import SimpleNamespace as Obj
  >>> class FakeClient:
  ...   def list_pod_for_all_namespaces(self, label_selector):
  ...     pod = Obj(metadata=Obj(name="tf-0"),
  ...               status=Obj(phase="Running", host_ip="10.1.0.4"))
  ...     return Obj(items=[pod])
  >>> resolver = KubernetesClusterResolver(override_client=FakeClient())
  >>> resolver.cluster_spec().as_dict(), resolver.master("worker", 0)
  ({'worker': ['10.1.0.4:8470']}, 'grpc://10.1.0.4:8470')
  """

  def __init__(self, job_to_label_mapping=None, tf_server_port=8470,
               rpc_layer="grpc", override_client=None,
               executable_location=ExecutableLocation.WITHIN_CLUSTER):
    if not override_client:
      config = _kubernetes().config
      if _executable_location(executable_location) == ExecutableLocation.OFF_CLUSTER:
        config.load_kube_config()
      else:
        config.load_incluster_config()
    self._job_to_label_mapping = job_to_label_mapping or {"worker": ["job-name=tensorflow"]}
    self._tf_server_port = tf_server_port
    self._override_client = override_client
    self.rpc_layer = rpc_layer

  master = task_master

  def cluster_spec(self):
    """Asks the Kubernetes API for the pods (each must be running)."""
    client = self._override_client
    if not client:
      kubernetes = _kubernetes()
      kubernetes.config.load_kube_config()
      client = kubernetes.client.CoreV1Api()
    cluster = {}
    for job, selectors in self._job_to_label_mapping.items():
      addresses = []
      for selector in selectors:
        pods = client.list_pod_for_all_namespaces(label_selector=selector).items
        for pod in sorted(pods, key=lambda p: p.metadata.name):
          if pod.status.phase != "Running":
            raise RuntimeError(f'Pod "{pod.metadata.name}" is not running; '
                               f'phase: "{pod.status.phase}"')
          addresses.append(f"{pod.status.host_ip}:{self._tf_server_port}")
      cluster[job] = addresses
    return tf.train.ClusterSpec(cluster)
