"""Emulated TPU slices: a TPU's topology with one logical CPU device per core.

`TPUClusterResolver(tpu="emulated:v3-8")` (or `TPU_NAME=emulated:v3-8`) gives
a slice from here: a TPU program runs with the same topology and rules on a
machine without one, and `TPUStrategy` refuses there what a TPU refuses (an
eager `run` of a Python function too, unless `TFD_EMULATED_TPU_EAGER=1`).

>>> tpu_slice = parse("emulated:v3-8")
>>> tpu_slice
EmulatedSlice(name='v3-8', mesh_shape=(2, 2, 1, 2))
>>> tpu_slice.num_cores, tpu_slice.topology().num_tasks
(8, 1)
"""

import dataclasses
import itertools

import tensorflow as tf

PREFIX = "emulated:"


@dataclasses.dataclass(frozen=True)
class EmulatedSlice:
  """A one-host TPU slice: its type and mesh `(x, y, z, cores per chip)`.

  >>> EmulatedSlice("v4-8", (2, 2, 1, 1)).devices[-1]
  '/job:localhost/replica:0/task:0/device:CPU:3'
  """
  name: str
  mesh_shape: tuple

  @property
  def num_cores(self):
    x, y, z, cores_per_chip = self.mesh_shape
    return x * y * z * cores_per_chip

  @property
  def devices(self):
    """The CPU devices standing for the cores, in the topology's order."""
    return [f"/job:localhost/replica:0/task:0/device:CPU:{i}"
            for i in range(self.num_cores)]

  def device_coordinates(self):
    """Each core's `(x, y, z, core)` in a TPU host's order (x first)."""
    x, y, z, cores = self.mesh_shape
    return [[cx, cy, cz, core] for cz, cy, cx, core in
            itertools.product(range(z), range(y), range(x), range(cores))]

  def topology(self):
    """The slice's `tf.tpu.experimental.Topology` (one task)."""
    return tf.tpu.experimental.Topology(
        mesh_shape=list(self.mesh_shape),
        device_coordinates=[self.device_coordinates()])

  def ensure_devices(self):
    """Gives this process one logical CPU device per core; `RuntimeError`
    if TensorFlow has already started with fewer."""
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


PRESETS = {
    "v2-8": EmulatedSlice("v2-8", (2, 2, 1, 2)),
    "v3-8": EmulatedSlice("v3-8", (2, 2, 1, 2)),
    "v4-8": EmulatedSlice("v4-8", (2, 2, 1, 1)),
    "v5litepod-8": EmulatedSlice("v5litepod-8", (2, 4, 1, 1)),
}


def parse(tpu):
  """The slice an "emulated:<type>" TPU name asks for; None otherwise.

  >>> parse("emulated:v4-8").num_cores, parse("my-tpu")
  (4, None)
  """
  if not isinstance(tpu, str) or not tpu.startswith(PREFIX):
    return None
  name = tpu[len(PREFIX):]
  if name not in PRESETS:
    raise ValueError(f"Unknown emulated TPU {name!r} in tpu={tpu!r}; the "
                     f"emulated slices are {', '.join(PREFIX + p for p in PRESETS)}.")
  return PRESETS[name]
