"""What input functions are told (`InputContext`) and how input is placed."""

import collections
import enum

import tensorflow as tf

from tf_distribute_lite.tf_classes import StandsFor


class InputReplicationMode(enum.Enum):
  """Whether an input function makes one pipeline per worker or per replica.

  >>> InputReplicationMode.PER_WORKER.value
  'PER_WORKER'
  """
  PER_WORKER = "PER_WORKER"
  PER_REPLICA = "PER_REPLICA"


class InputContext(StandsFor, stands_for=tf.distribute.InputContext):
  """Which input pipeline `dataset_fn` is building, out of how many.

  >>> context = InputContext(num_input_pipelines=2, input_pipeline_id=1,
  ...                        num_replicas_in_sync=4)
  >>> context.get_per_replica_batch_size(64)
  16
  >>> print(context)
  tf.distribute.InputContext(input pipeline id 1, total: 2)
  """

  def __init__(self, num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1):
    self._num_input_pipelines = num_input_pipelines
    self._input_pipeline_id = input_pipeline_id
    self._num_replicas_in_sync = num_replicas_in_sync

  num_input_pipelines = property(lambda self: self._num_input_pipelines, doc="Pipelines.")
  input_pipeline_id = property(lambda self: self._input_pipeline_id, doc="This one's, from 0.")
  num_replicas_in_sync = property(lambda self: self._num_replicas_in_sync, doc="Replicas.")

  def get_per_replica_batch_size(self, global_batch_size):
    """`global_batch_size` divided (evenly, else `ValueError`) by the replicas."""
    if global_batch_size % self._num_replicas_in_sync:
      raise ValueError(
          f"The `global_batch_size` {global_batch_size!r} is not divisible by "
          f"`num_replicas_in_sync` {self._num_replicas_in_sync!r} ")
    return global_batch_size // self._num_replicas_in_sync

  def __str__(self):
    return (f"tf.distribute.InputContext(input pipeline id "
            f"{self._input_pipeline_id}, total: {self._num_input_pipelines})")


class InputOptions(collections.namedtuple("InputOptions", [
    "experimental_fetch_to_device", "experimental_replication_mode",
    "experimental_place_dataset_on_device",
    "experimental_per_replica_buffer_size"])):
  """How a distributed dataset places and prefetches its batches.

  >>> InputOptions(experimental_fetch_to_device=False)
  InputOptions(experimental_fetch_to_device=False, experimental_replication_mode=<InputReplicationMode.PER_WORKER: 'PER_WORKER'>, experimental_place_dataset_on_device=False, experimental_per_replica_buffer_size=1)
  """

  def __new__(cls, experimental_fetch_to_device=None,
              experimental_replication_mode=InputReplicationMode.PER_WORKER,
              experimental_place_dataset_on_device=False,
              experimental_per_replica_buffer_size=1):
    if experimental_fetch_to_device is None:
      experimental_fetch_to_device = True
    return super().__new__(cls, experimental_fetch_to_device,
                           experimental_replication_mode,
                           experimental_place_dataset_on_device,
                           experimental_per_replica_buffer_size)


def is_per_replica(options):
  """Whether `options` asks for one input pipeline per replica."""
  if options is None:
    return False
  mode = options.experimental_replication_mode  # ours or TensorFlow's enum
  return getattr(mode, "value", mode) == InputReplicationMode.PER_REPLICA.value


def refuse_per_replica(options):
  """Raises TensorFlow's error where `options` ask for a pipeline per replica."""
  if is_per_replica(options):
    raise NotImplementedError(
        "InputReplicationMode.PER_REPLICA is only supported in "
        "`distribute_datasets_from_function` of tf.distribute.MirroredStrategy")


def check_function_options(options):
  """Raises TensorFlow's errors for inconsistent `options` of an input function."""
  if options is None or not options.experimental_place_dataset_on_device:
    return
  if not is_per_replica(options):
    raise ValueError(
        "When `experimental_place_dataset_on_device` is set for dataset placement, you must also "
        "specify `PER_REPLICA` for the replication mode")
  if options.experimental_fetch_to_device:
    raise ValueError(
        "`experimental_place_dataset_on_device` can not be set to True when "
        "experimental_fetch_to_device is True and replication mode is set to `PER_REPLICA`")
