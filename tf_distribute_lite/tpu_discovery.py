"""Finding the TPU a `TPUClusterResolver` talks to: the `tpu` argument, the
environment variables TensorFlow reads ("" counts as unset), then, beyond
TensorFlow, TPU chips on this machine's PCI bus and the Cloud TPU VM metadata
(several `worker-network-endpoints`: this is one host of a multi-host slice)."""

import dataclasses
import json
import os
import pathlib
import urllib.error

from tf_distribute_lite import cloud_http
from tf_distribute_lite import tpu_emulation

DEFAULT_PORT = "8470"
PCI_VARIABLE = "TF_DISTRIBUTE_LITE_PCI_DEVICES"
_GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of TPU chips (v2/v3, v4, v5p, v5e, v6e and later).
_TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
_TPU_VM_ATTRIBUTES = ("accelerator-type", "agent-worker-number", "worker-network-endpoints")


@dataclasses.dataclass(frozen=True)
class Target:
  """What a TPU name means: `kind` "local" (TPU chips here), "grpc" (`endpoints`),
  "api" (a Cloud TPU node `name`) or "emulated"; `source`: where it was found."""
  kind: str
  name: str
  source: str
  endpoints: tuple = ()
  task_id: int = 0
  project: str = None
  zone: str = None
  emulated_slice: tpu_emulation.EmulatedSlice = None
  details: dict = dataclasses.field(default_factory=dict)


class NoTpuFoundError(ValueError):
  """No source names a TPU (the message lists each source's answer)."""


def grpc_endpoints(addresses):
  """The endpoints of "grpc://host[:port],..." (port 8470 by default).

  >>> grpc_endpoints("grpc://10.0.0.2,grpc://10.0.0.3:8471")
  ({'ipAddress': '10.0.0.2', 'port': '8470'}, {'ipAddress': '10.0.0.3', 'port': '8471'})
  """
  endpoints = []
  for address in addresses.split(","):
    address = address[len("grpc://"):] if address.startswith("grpc://") else address
    host, _, port = address.partition(":")
    endpoints.append({"ipAddress": host, "port": port or DEFAULT_PORT})
  return tuple(endpoints)


def _from_name(name, source, project=None, zone=None):
  if name == "local":
    return Target("local", "local", source)
  emulated = tpu_emulation.parse(name)
  if emulated is not None:
    return Target("emulated", name, source, emulated_slice=emulated)
  if name.startswith("grpc://"):
    return Target("grpc", name, source, endpoints=grpc_endpoints(name))
  return Target("api", name, source, project=project, zone=zone)


def _as_text(value):
  return value.decode("utf-8") if isinstance(value, bytes) else value


def find(tpu=None, project=None, zone=None):
  """The `Target` for a `TPUClusterResolver(tpu, zone, project)` (or bytes).

  >>> find("grpc://10.0.0.2:8470").kind, find("emulated:v3-8").kind
  ('grpc', 'emulated')
  >>> find(b"my-tpu", project=b"my-project", zone="us-central1-b").project
  'my-project'
  """
  if isinstance(tpu, list):
    if not tpu:
      raise ValueError("At least one TPU must be specified.")
    if len(tpu) != 1:
      raise NotImplementedError("Using multiple TPUs in a single session is not yet implemented")
    tpu = tpu[0]
  tpu, project, zone = _as_text(tpu), _as_text(project), _as_text(zone)
  if tpu:
    return _from_name(tpu, "the tpu argument", project, zone)
  tried = ["the tpu argument: not given"]
  for variable in ("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_NAME"):
    if os.environ.get(variable):
      return _from_name(os.environ[variable], f"${variable}", project, zone)
    tried.append(_unset(variable))
  if os.environ.get("TPU_CONFIG"):
    config = json.loads(os.environ["TPU_CONFIG"])
    if config.get("tpu_node_name"):
      return _from_name(config["tpu_node_name"], "$TPU_CONFIG",
                        project or config.get("project"), zone or config.get("zone"))
    tried.append("$TPU_CONFIG: no tpu_node_name")
  else:
    tried.append(_unset("TPU_CONFIG"))
  chips, pci_root = local_tpu_chips()
  attributes, answer = tpu_vm_attributes()
  hosts = slice_hosts(attributes)
  if len(hosts) > 1:
    return _slice_host(hosts, attributes)
  if chips:
    return Target("local", "local", f"{len(chips)} TPU chips under {pci_root}",
                  details={"pci_devices": chips, **attributes})
  if attributes:
    return Target("local", "local", "the Cloud TPU VM metadata", details=attributes)
  tried.append(f"TPU chips on the PCI bus ({pci_root}): none")
  tried.append(f"Cloud TPU VM metadata ({cloud_http.metadata_root()}): {answer}")
  raise NoTpuFoundError("Please provide a TPU Name to connect to. No TPU was found "
                        "in any of these places: " + "; ".join(tried) + ".")


def _unset(variable):
  return f"${variable}: {'empty' if variable in os.environ else 'not set'}"


def slice_hosts(attributes):
  """The IP addresses of the hosts of the TPU VM slice of metadata `attributes`.

  >>> slice_hosts({"worker-network-endpoints": "x:y:10.0.0.11,x:y:10.0.0.12"})
  ['10.0.0.11', '10.0.0.12']
  >>> slice_hosts({})
  []
  """
  endpoints = attributes.get("worker-network-endpoints", "").strip()
  return [entry.strip().split(":")[-1] for entry in endpoints.split(",")] if endpoints else []


def _slice_host(hosts, attributes):
  """The target of this host of a multi-host TPU VM slice."""
  if "agent-worker-number" not in attributes:
    raise ValueError(f"The Cloud TPU VM metadata lists {len(hosts)} hosts in "
                     f"`worker-network-endpoints` but not this host's "
                     f"`agent-worker-number`.")
  name = ",".join(f"grpc://{host}:{DEFAULT_PORT}" for host in hosts)
  return Target("grpc", name, f"the Cloud TPU VM metadata ({len(hosts)} hosts)",
                endpoints=grpc_endpoints(name),
                task_id=int(attributes["agent-worker-number"]), details=attributes)


def local_tpu_chips():
  """(PCI addresses of this machine's TPU chips, the folder searched)."""
  root = os.environ.get(PCI_VARIABLE, "/sys/bus/pci/devices")
  chips = []
  for folder in sorted(pathlib.Path(root).glob("*")):
    try:
      vendor, device = ((folder / name).read_text().strip() for name in ("vendor", "device"))
    except OSError:
      continue
    if vendor == _GOOGLE_PCI_VENDOR and device in _TPU_PCI_DEVICES:
      chips.append(folder.name)
  return chips, root


def tpu_vm_attributes():
  """(this machine's Cloud TPU VM attributes or {}, the server's answer in words)."""
  attributes = {}
  for name in _TPU_VM_ATTRIBUTES:
    try:
      attributes[name] = cloud_http.metadata(f"instance/attributes/{name}")
    except (OSError, ValueError) as e:
      if attributes:  # only the first is on every TPU VM
        continue
      if isinstance(e, urllib.error.HTTPError):
        return {}, f"HTTP {e.code}, not a TPU VM"
      return {}, f"unreachable ({e})"
  return attributes, "a TPU VM"
