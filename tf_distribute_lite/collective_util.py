"""Options for cross-device communication (all-reduce, all-gather)."""

import enum
import numbers

import tensorflow as tf

from tf_distribute_lite import deprecation
from tf_distribute_lite.tf_classes import StandsFor


class CommunicationImplementation(enum.Enum):
  """Which algorithm collectives prefer: `AUTO`, `RING` or `NCCL` (GPUs).

  >>> CommunicationImplementation("RING")
  <CommunicationImplementation.RING: 'RING'>
  """
  AUTO = "AUTO"
  RING = "RING"
  NCCL = "NCCL"


CollectiveCommunication = CommunicationImplementation


class Options(StandsFor, stands_for=tf.distribute.experimental.CommunicationOptions):
  """`CommunicationOptions` (named `Options`, as TensorFlow's).

  >>> options = CommunicationOptions(bytes_per_pack=1024, implementation="ring")
  >>> print(options)
  Options(bytes_per_pack=1024,timeout_seconds=None, implementation=CommunicationImplementation.RING)
  >>> type(options).__name__
  'Options'
  """

  def __init__(self, bytes_per_pack=0, timeout_seconds=None,
               implementation=CommunicationImplementation.AUTO):
    if not isinstance(bytes_per_pack, numbers.Real):
      raise TypeError(
          f"Argument `bytes_per_pack` must be a non-negative number, "
          f"Received {bytes_per_pack!r} of type {type(bytes_per_pack).__name__}.")
    if bytes_per_pack < 0:
      raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {bytes_per_pack}.")
    if isinstance(implementation, str):
      try:
        implementation = CommunicationImplementation(implementation.upper())
      except ValueError:
        pass
    if not isinstance(implementation, CommunicationImplementation):
      raise ValueError(
          "Argument `implementation` must be instance of "
          "`tf.distribute.experimental.CommunicationImplementation` (AUTO, "
          f"RING or NCCL), Received {implementation!r}.")
    self.bytes_per_pack = bytes_per_pack
    self.timeout_seconds = timeout_seconds
    self.implementation = implementation

  def merge(self, options):
    """These options, where the fields `options` sets (not default) win."""
    fields = ("bytes_per_pack", "timeout_seconds", "implementation")
    unset = Options()
    options = unset if options is None else options
    return Options(**{
        f: getattr(self if getattr(options, f) == getattr(unset, f) else options, f)
        for f in fields})

  def __str__(self):
    return (f"Options(bytes_per_pack={self.bytes_per_pack},timeout_seconds={self.timeout_seconds}, "
            f"implementation={self.implementation})")


CommunicationOptions = Options


class CollectiveHints(StandsFor, stands_for=tf.distribute.experimental.CollectiveHints):
  """Deprecated: makes a `CommunicationOptions`, as in TensorFlow.

  >>> print(CollectiveHints(bytes_per_pack=1024, timeout_seconds=30.0))
  Options(bytes_per_pack=1024,timeout_seconds=30.0, implementation=CommunicationImplementation.AUTO)
  """

  def __new__(cls, bytes_per_pack=0, timeout_seconds=None):
    deprecation.warn_once(
        "CollectiveHints",
        "use `tf_distribute_lite.experimental.CommunicationOptions` instead.")
    return CommunicationOptions(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)
