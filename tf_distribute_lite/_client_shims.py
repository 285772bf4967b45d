"""Adaptations of Keras 3 and tf_keras to tfd's strategies, through their
private names; only the package's `__init__` imports it. Each checks the
client names it relies on first, and if one is missing warns once and
leaves that feature as the client has it.
"""

import functools
import importlib
import importlib.metadata
import os
import sys
import tempfile
import warnings

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import collective_all_reduce_strategy
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import failure_handling
from tf_distribute_lite import input_lib

_KERAS_TRAINER = "keras.src.backend.tensorflow.trainer"
_TF_KERAS_TRAINING_STATE = "tf_keras.src.distribute.worker_training_state"
_TF_KERAS_CALLBACKS = "tf_keras.src.callbacks"
# The paths each Keras 3 callback that saves writes to, by class.
_KERAS_CHECKPOINT_PATHS = {
    "BackupAndRestore": ("backup_dir", "_weights_path", "_training_metadata_path",
                         "_prev_weights_path", "_prev_training_metadata_path"),
    "ModelCheckpoint": ("filepath",),
}

# (feature, {module: the client's names it relies on}).
_KERAS_REDUCE = ("Keras 3's reduction of step outputs across workers", {
    _KERAS_TRAINER: "reduce_per_replica"})
_KERAS_CHECKPOINTS = ("Keras 3's checkpoint writes on workers other than the chief", {
    "keras.callbacks": " ".join(
        [f"{name}._save_model" for name in _KERAS_CHECKPOINT_PATHS] +
        ["BackupAndRestore.on_train_end"] +
        [f"{name}().{path}" for name, paths in _KERAS_CHECKPOINT_PATHS.items()
         for path in paths])})
_TF_KERAS_BACKUPS = ("tf_keras's backups before preemption", {
    _TF_KERAS_CALLBACKS: "BackupAndRestore._implements_train_batch_hooks",
    _TF_KERAS_TRAINING_STATE: "WorkerTrainingState.__init__ distributed_file_utils._on_gcp "
                              "WorkerTrainingState()._enable_save_before_preemption "
                              "WorkerTrainingState().read_checkpoint_manager",
    "tf_keras.src.distribute.distributed_training_utils":
        "maybe_preemption_handler_scope(_preemption_handler)"})

_CHECKED = {}  # {feature: whether the client has its names}, checked once


def _has_client_names(feature, names):
  """Whether the client has every name `feature` relies on; warns once if not."""
  if feature not in _CHECKED:
    missing = _tf_bridge.missing_names(names)
    _CHECKED[feature] = not missing
    if missing:
      warnings.warn(
          f"tf_distribute_lite cannot adapt {feature} to its strategies: the "
          f"installed client has no {', '.join(missing)}. That feature works "
          f"as the client has it for TensorFlow's strategies.", RuntimeWarning,
          stacklevel=3)
  return _CHECKED[feature]


def install():
  """Hooks scope entries; gives distributed datasets the base Keras 3 looks for."""
  distribute_lib.set_scope_entry_hook(_on_scope_entry)
  if (_keras_major_version() or 0) >= 3:
    input_lib.DistributedDataset.__bases__ += (type("DistributedDataset", (), {
        "__module__": "tensorflow.python.distribute.input_lib",
        "__doc__": "Marks a distributed dataset for Keras 3's data adapters."}),)


_keras_routed = []  # one entry once Keras 3 is routed for multi-worker strategies


def _on_scope_entry(strategy):
  route_tf_keras()
  if not _keras_routed and _is_multi_worker(strategy):
    _keras_routed.append(True)
    route_keras_reduce_per_replica()
    route_keras_checkpoint_writes()


def _saves_before_preemption(strategy):
  """Whether tf_keras's backups save through tfd's handler (tfd's MWMS)."""
  return isinstance(strategy, distribute_lib.StrategyBase) and isinstance(
      strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _is_multi_worker(strategy):
  return isinstance(getattr(strategy, "extended", None),
                    collective_all_reduce_strategy.CollectiveAllReduceExtended) and (
                        strategy.extended._in_multi_worker_mode())  # pylint: disable=protected-access


def _saves_elsewhere(strategy):
  """Whether Keras callbacks save into temporary directories (non-chief)."""
  return _is_multi_worker(strategy) and not strategy.extended.should_checkpoint


def _keras_reduce(values, strategy, reduction):
  """Keras' `reduce_per_replica` over every replica of the cluster."""
  def reduce(value):
    if reduction == "first":
      return strategy.experimental_local_results(value)[0]
    if reduction == "sum":
      return strategy.reduce("SUM", value, axis=None)
    if reduction == "concat":
      return _concat_in_input_order(value, strategy)
    return strategy.reduce("MEAN", value, axis=None)
  return tf.nest.map_structure(reduce, values)


def _concat_in_input_order(value, strategy):
  """The replicas' batches in input order (replica r of worker w: w + r * workers)."""
  sizes = strategy.gather(strategy.run(
      lambda v: tf.shape(v, out_type=tf.int64)[:1], args=(value,)), axis=0)
  parts = tf.split(strategy.gather(value, axis=0), sizes, num=strategy.num_replicas_in_sync)
  per_worker = len(strategy.extended.worker_devices)
  ordered = [part for r in range(per_worker) for part in parts[r::per_worker]]
  return tf.concat(ordered, axis=0)


@functools.lru_cache(maxsize=None)
def _keras_major_version():
  """The installed Keras' major version or None, without importing it."""
  try:
    return int(importlib.metadata.version("keras").split(".")[0])
  except (importlib.metadata.PackageNotFoundError, ValueError):
    return None


def route_keras_reduce_per_replica():
  """Routes Keras 3's `reduce_per_replica` to `_keras_reduce` across workers."""
  if _keras_major_version() != 3 or not _has_client_names(*_KERAS_REDUCE):
    return
  trainer = importlib.import_module(_KERAS_TRAINER)
  original = trainer.reduce_per_replica
  if not getattr(original, "tfd_routed", False):
    @functools.wraps(original)
    def reduce_per_replica(values, strategy, reduction):
      if _is_multi_worker(strategy):
        return _keras_reduce(values, strategy, reduction)
      return original(values, strategy, reduction)
    reduce_per_replica.tfd_routed = True
    trainer.reduce_per_replica = reduce_per_replica


def route_keras_checkpoint_writes():
  """Makes Keras 3's checkpointing callbacks on non-chief workers save aside."""
  if _keras_major_version() != 3 or not _has_client_names(*_KERAS_CHECKPOINTS):
    return
  callbacks = importlib.import_module("keras.callbacks")
  for name, paths in _KERAS_CHECKPOINT_PATHS.items():
    callback_class = getattr(callbacks, name)
    if not getattr(callback_class._save_model, "tfd_routed", False):  # pylint: disable=protected-access
      callback_class._save_model = _saving_elsewhere(callback_class._save_model, paths)  # pylint: disable=protected-access
      if name == "BackupAndRestore":
        callback_class.on_train_end = _skipped_elsewhere(callback_class.on_train_end)


def _elsewhere(callback):
  return _saves_elsewhere(getattr(callback.model, "distribute_strategy", None))


def _saving_elsewhere(save_model, paths):
  @functools.wraps(save_model)
  def _save_model(self, *args, **kwargs):
    if not _elsewhere(self):
      return save_model(self, *args, **kwargs)
    given = {name: getattr(self, name) for name in paths}
    with tempfile.TemporaryDirectory() as temporary:
      for name, path in given.items():
        setattr(self, name, os.path.join(temporary, os.path.basename(path)))
      try:
        return save_model(self, *args, **kwargs)
      finally:
        for name, path in given.items():
          setattr(self, name, path)
  _save_model.tfd_routed = True
  return _save_model


def _skipped_elsewhere(method):
  @functools.wraps(method)
  def skipped(self, *args, **kwargs):
    return None if _elsewhere(self) else method(self, *args, **kwargs)
  return skipped


def route_tf_keras():
  """Makes tf_keras's `BackupAndRestore(save_before_preemption=True)` save
  through tfd's `PreemptionCheckpointHandler` (once tf_keras is imported)."""
  callbacks = sys.modules.get(_TF_KERAS_CALLBACKS)
  state = sys.modules.get(_TF_KERAS_TRAINING_STATE)
  if (callbacks is None and state is None) or not _has_client_names(*_TF_KERAS_BACKUPS):
    return
  if callbacks is not None and not getattr(callbacks.BackupAndRestore, "_tfd_routed", False):
    _route_backup(callbacks.BackupAndRestore)
  if state is not None and not getattr(state.WorkerTrainingState, "_tfd_routed", False):
    _route_training_state(state)


def _route_backup(callback_class):
  """With `save_before_preemption`, `BackupAndRestore` takes batch hooks."""
  implements_batch_hooks = callback_class._implements_train_batch_hooks  # pylint: disable=protected-access

  @functools.wraps(implements_batch_hooks)
  def batch_hooks(self):
    model = getattr(self, "model", None)
    return implements_batch_hooks(self) or bool(
        self.save_before_preemption and model is not None
        and _saves_before_preemption(model.distribute_strategy))

  callback_class._implements_train_batch_hooks = batch_hooks  # pylint: disable=protected-access
  callback_class._tfd_routed = True  # pylint: disable=protected-access


def _route_training_state(module):
  """Gives tf_keras's backup state tfd's preemption handler (on Google Cloud)."""
  state_class = module.WorkerTrainingState
  init = state_class.__init__

  @functools.wraps(init)
  def routed(self, model, checkpoint_dir, save_freq="epoch", save_before_preemption_arg=None):
    strategy = model.distribute_strategy
    ours = bool(save_before_preemption_arg) and _saves_before_preemption(strategy)
    init(self, model, checkpoint_dir, save_freq, False if ours else save_before_preemption_arg)
    if ours and module.distributed_file_utils._on_gcp():  # pylint: disable=protected-access
      self._enable_save_before_preemption = True  # pylint: disable=protected-access
      self.preemption_handler = failure_handling.PreemptionCheckpointHandler(
          strategy.cluster_resolver, self.read_checkpoint_manager)
      model._preemption_handler = self.preemption_handler  # pylint: disable=protected-access
  state_class.__init__ = routed
  state_class._tfd_routed = True  # pylint: disable=protected-access


