"""Emulated TPU slices (`TPUClusterResolver("emulated:v3-8")` or
`TPU_NAME=emulated:v3-8`): a TPU's topology, a logical CPU device per core,
on which `TPUStrategy` refuses what a TPU refuses (an eager `run` of a Python
function too, unless `TFD_EMULATED_TPU_EAGER=1`). A multi-host slice (v4-16,
v4-32, v3-32, v5litepod-16) has a process per host (`tpu_pod_emulation`).
Presets follow Cloud TPU's documentation: a v2/v3 chip has 2 cores, a v3 host
4 chips; a v4 chip is one core to TensorFlow (megacore), a v4 host 2x2x1 chips
(v4-32 is 16 cores on 4 hosts); a v5e chip has 1 core, a multi-host v5e slice
2x2-chip hosts. Hosts tile the mesh, x first."""

import dataclasses
import itertools
import math

import tensorflow as tf

PREFIX = "emulated:"


@dataclasses.dataclass(frozen=True)
class EmulatedSlice:
  """A TPU slice: its type, mesh `(x, y, z, cores per chip)` and hosts along x, y, z.

  >>> PRESETS["v3-8"]
  EmulatedSlice(name='v3-8', mesh_shape=(2, 2, 1, 2), host_bounds=(1, 1, 1))
  >>> EmulatedSlice("v4-8", (2, 2, 1, 1)).devices[-1]
  '/job:localhost/replica:0/task:0/device:CPU:3'
  >>> PRESETS["v4-32"].devices[-1]
  '/job:worker/replica:0/task:3/device:CPU:3'
  """
  name: str
  mesh_shape: tuple
  host_bounds: tuple = (1, 1, 1)
  addresses: tuple = dataclasses.field(default=(), repr=False)  # hosts' "ip:port"

  def on(self, addresses):
    """This slice, its hosts at `addresses`."""
    return dataclasses.replace(self, addresses=tuple(addresses))

  @property
  def tpu_name(self):
    """The TPU name giving this slice on its hosts ("emulated:<type>@<address>,...")."""
    return PREFIX + self.name + ("@" + ",".join(self.addresses) if self.addresses else "")

  @property
  def num_cores(self):
    return math.prod(self.mesh_shape)

  @property
  def num_hosts(self):
    return math.prod(self.host_bounds)

  @property
  def num_cores_per_host(self):
    return self.num_cores // self.num_hosts

  @property
  def devices(self):
    """The CPU devices standing for the cores, in the topology's order."""
    job = "localhost" if self.num_hosts == 1 else "worker"
    return [f"/job:{job}/replica:0/task:{task}/device:CPU:{i}"
            for task in range(self.num_hosts) for i in range(self.num_cores_per_host)]

  def device_coordinates(self):
    """Each core's `(x, y, z, core)`, host after host, each x first."""
    *chips, cores = self.mesh_shape
    per_host = [n // hosts for n, hosts in zip(chips, self.host_bounds)]
    return [[hx * per_host[0] + cx, hy * per_host[1] + cy, hz * per_host[2] + cz, core]
            for hz, hy, hx in _x_first(self.host_bounds)
            for cz, cy, cx in _x_first(per_host) for core in range(cores)]

  def topology(self):
    """The slice's `tf.tpu.experimental.Topology`: a task per host."""
    coordinates = self.device_coordinates()
    per_host = self.num_cores_per_host
    return tf.tpu.experimental.Topology(
        mesh_shape=list(self.mesh_shape),
        device_coordinates=[coordinates[i:i + per_host]
                            for i in range(0, self.num_cores, per_host)])

  def ensure_devices(self):
    """Gives this process a logical CPU device per core, or raises `RuntimeError`."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
      configured = tf.config.get_logical_device_configuration(cpus[0])
      if configured is None or len(configured) < self.num_cores:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * self.num_cores)
      return
    except RuntimeError:
      pass  # TensorFlow has started: check what it has.
    have = len(tf.config.list_logical_devices("CPU"))
    if have < self.num_cores:
      raise RuntimeError(
          f"The emulated TPU slice {self.name} needs {self.num_cores} logical "
          f"CPU devices, one per TPU core, but TensorFlow started with {have}. "
          f"Create the TPUClusterResolver before any other TensorFlow "
          f"operation, or call tf.config.set_logical_device_configuration("
          f"tf.config.list_physical_devices('CPU')[0], "
          f"[tf.config.LogicalDeviceConfiguration()] * {self.num_cores}) "
          f"at the start of the program.")


def _x_first(bounds):
  """The `(z, y, x)` points of a box, x varying fastest."""
  x, y, z = bounds
  return itertools.product(range(z), range(y), range(x))


PRESETS = {
    "v2-8": EmulatedSlice("v2-8", (2, 2, 1, 2)),
    "v3-8": EmulatedSlice("v3-8", (2, 2, 1, 2)),
    "v4-8": EmulatedSlice("v4-8", (2, 2, 1, 1)),
    "v5litepod-8": EmulatedSlice("v5litepod-8", (2, 4, 1, 1)),
    "v4-16": EmulatedSlice("v4-16", (2, 2, 2, 1), (1, 1, 2)),
    "v4-32": EmulatedSlice("v4-32", (2, 2, 4, 1), (1, 1, 4)),
    "v3-32": EmulatedSlice("v3-32", (4, 4, 1, 2), (2, 2, 1)),
    "v5litepod-16": EmulatedSlice("v5litepod-16", (4, 4, 1, 1), (2, 2, 1)),
}


def parse(tpu):
  """The slice an "emulated:<type>" TPU name asks for, else None; running hosts
  follow as "@<host 0's ip:port>,<host 1's>,..." (`tpu_pod_emulation`).

  >>> parse("emulated:v4-8").num_cores, parse("my-tpu")
  (4, None)
  >>> parse("emulated:v4-16@127.0.0.1:5000,127.0.0.1:5001").addresses
  ('127.0.0.1:5000', '127.0.0.1:5001')
  """
  if not isinstance(tpu, str) or not tpu.startswith(PREFIX):
    return None
  name, at, hosts = tpu[len(PREFIX):].partition("@")
  if name not in PRESETS:
    raise ValueError(f"Unknown emulated TPU {name!r} in tpu={tpu!r}; the "
                     f"emulated slices are {', '.join(PREFIX + p for p in PRESETS)}.")
  tpu_slice = PRESETS[name]
  if not at:
    return tpu_slice
  addresses = hosts.split(",")
  if (tpu_slice.num_hosts == 1 or len(addresses) != tpu_slice.num_hosts or
      not all(a.rpartition(":")[2].isdigit() for a in addresses)):
    raise ValueError(f"tpu={tpu!r} must name the {tpu_slice.num_hosts} hosts of the "
                     f"emulated TPU {name!r} after '@', each as ip:port, separated by "
                     f"commas" + (" (a one-host slice names none)."
                                  if tpu_slice.num_hosts == 1 else "."))
  return tpu_slice.on(addresses)
