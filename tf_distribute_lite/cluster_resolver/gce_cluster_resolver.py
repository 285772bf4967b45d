"""`GCEClusterResolver`: the running instances of a Compute Engine group."""

import tensorflow as tf

from tf_distribute_lite.cluster_resolver.cluster_resolver import ClusterResolver
from tf_distribute_lite.cluster_resolver.cluster_resolver import task_master


def _compute_service(credentials):
  try:
    from googleapiclient import discovery  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("googleapiclient must be installed before using the GCE "
                      "cluster resolver") from None
  if credentials == "default":
    credentials = None  # the library finds the application default
  return discovery.build("compute", "v1", credentials=credentials)


class GCEClusterResolver(ClusterResolver, stands_for=tf.distribute.cluster_resolver.GCEClusterResolver):
  """Every running instance of `instance_group` is a task of job `task_type`.
  Without `service`, the `googleapiclient` package must be installed.

  >>> from types import SimpleNamespace as Obj
  >>> answer = lambda value: Obj(execute=lambda: value)
  >>> compute = Obj(
  ...     instanceGroups=lambda: Obj(
  ...         listInstances=lambda **kwargs: answer(
  ...             {"items": [{"instance": f"zones/z/instances/vm-{i}"} for i in (1, 2)]}),
  ...         listInstances_next=lambda previous_request, previous_response: None),
  ...     instances=lambda: Obj(get=lambda project, zone, instance: answer(
  ...         {"networkInterfaces": [{"networkIP": "10.0.0." + instance[-1]}]})))
  >>> resolver = GCEClusterResolver("project", "zone", "group", 8470, service=compute)
  >>> resolver.cluster_spec().as_dict(), resolver.master()
  ({'worker': ['10.0.0.1:8470', '10.0.0.2:8470']}, 'grpc://10.0.0.1:8470')
  """

  def __init__(self, project, zone, instance_group, port, task_type="worker",
               task_id=0, rpc_layer="grpc", credentials="default", service=None):
    self._project = project
    self._zone = zone
    self._instance_group = instance_group
    self._port = port
    self._task_type = task_type
    self._task_id = task_id
    self._rpc_layer = rpc_layer
    self._service = service if service is not None else _compute_service(credentials)

  def cluster_spec(self):
    """Asks the Compute API for the group's running instances."""
    groups = self._service.instanceGroups()
    request = groups.listInstances(
        project=self._project, zone=self._zone, instanceGroup=self._instance_group,
        body={"instanceState": "RUNNING"}, orderBy="name")
    addresses = []
    while request is not None:
      response = request.execute()
      for item in response.get("items", []):
        name = item["instance"].split("/")[-1]
        details = self._service.instances().get(
            project=self._project, zone=self._zone, instance=name).execute()
        addresses.append(f"{details['networkInterfaces'][0]['networkIP']}:{self._port}")
      request = groups.listInstances_next(previous_request=request, previous_response=response)
    return tf.train.ClusterSpec({self._task_type: sorted(addresses)})

  master = task_master

  @property
  def task_type(self):
    return self._task_type

  @task_type.setter
  def task_type(self, task_type):
    raise RuntimeError("You cannot reset the task_type of the "
                       "GCEClusterResolver after it has been created.")
