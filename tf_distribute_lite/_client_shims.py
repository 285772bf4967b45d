"""How Keras 3 and tf_keras are adapted to tfd's strategies.

Keras 3 and tf_keras treat TensorFlow's own strategy classes specially in a
few places that `isinstance` (which tfd's classes answer, `tf_classes.py`)
does not reach; there they are adapted here, by reading or wrapping their
private names:

- Keras 3 accepts a distributed dataset only if a base class is named like
  TensorFlow's (`install`, at package import);
- Keras 3 reduces its steps' outputs across workers only for TensorFlow's
  multi-worker class (`route_keras_reduce_per_replica`), and saves
  checkpoints from every worker into the same files
  (`route_keras_checkpoint_writes`): both routed on the first scope entry of
  a multi-worker strategy;
- tf_keras's backups save before preemption through TensorFlow's handler
  (`route_tf_keras`, checked at every scope entry, as tf_keras may be
  imported at any time).

This module sits above the strategies: the package's `__init__` calls
`install()` once, which hands `distribute_lib` the scope-entry hook; no
other module imports it. Each adaptation checks the client's names it
relies on (`_KERAS_REDUCE`, `_KERAS_CHECKPOINTS`, `_TF_KERAS_BACKUPS`)
before it patches; where one is missing it warns once, naming it, and that
one feature is left as the client has it: `strategy.scope()` never fails
for it. `tests/test_client_shims.py` holds their contract tests.
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
# The module tf_keras keeps its backup state in, and whose
# `WorkerTrainingState` it looks up by name when `BackupAndRestore` starts.
_TF_KERAS_TRAINING_STATE = "tf_keras.src.distribute.worker_training_state"
_TF_KERAS_CALLBACKS = "tf_keras.src.callbacks"

# (feature, the client's names it relies on: (module, path as
# `_tf_bridge.has_name` reads it)).
_KERAS_REDUCE = ("Keras 3's reduction of step outputs across workers", (
    (_KERAS_TRAINER, "reduce_per_replica"),))
_KERAS_CHECKPOINTS = ("Keras 3's checkpoint writes on workers other than the chief", (
    ("keras.callbacks", "BackupAndRestore._save_model"),
    ("keras.callbacks", "BackupAndRestore.on_train_end"),
    ("keras.callbacks", "ModelCheckpoint._save_model"),
    *(("keras.callbacks", f"BackupAndRestore().{name}")
      for name in ("backup_dir", "_weights_path", "_training_metadata_path",
                   "_prev_weights_path", "_prev_training_metadata_path")),
    ("keras.callbacks", "ModelCheckpoint().filepath")))
_TF_KERAS_BACKUPS = ("tf_keras's backups before preemption", (
    (_TF_KERAS_CALLBACKS, "BackupAndRestore._implements_train_batch_hooks"),
    (_TF_KERAS_TRAINING_STATE, "WorkerTrainingState.__init__"),
    (_TF_KERAS_TRAINING_STATE, "WorkerTrainingState()._enable_save_before_preemption"),
    (_TF_KERAS_TRAINING_STATE, "WorkerTrainingState().read_checkpoint_manager"),
    (_TF_KERAS_TRAINING_STATE, "distributed_file_utils._on_gcp"),
    ("tf_keras.src.distribute.distributed_training_utils",
     "maybe_preemption_handler_scope(_preemption_handler)")))

_DEGRADED = set()  # the features left as the client has them, warned about


def _has_client_names(feature, names):
  """Whether the client has every name `feature` relies on; warns once,
  naming the missing ones, where it does not."""
  if feature in _DEGRADED:
    return False
  missing = _tf_bridge.missing_names(names)
  if missing:
    _DEGRADED.add(feature)
    warnings.warn(
        f"tf_distribute_lite cannot adapt {feature} to its strategies: the "
        f"installed client has no {', '.join(missing)}. That feature works "
        f"as the client has it for TensorFlow's strategies.", RuntimeWarning,
        stacklevel=3)
  return not missing


def install():
  """Called once by the package's `__init__`: gives tfd's distributed
  datasets the base Keras 3 looks for, and adapts Keras and tf_keras to a
  strategy whenever its scope is entered."""
  input_lib.DistributedDataset.__bases__ += _keras_dataset_bases(_keras_major_version())
  distribute_lib.set_scope_entry_hook(_on_scope_entry)


_keras_routed = []  # one entry once Keras 3 is routed for multi-worker strategies


def _on_scope_entry(strategy):
  route_tf_keras(_saves_before_preemption)
  if not _keras_routed and _is_multi_worker(strategy):
    _keras_routed.append(True)
    route_keras_reduce_per_replica(_is_multi_worker, _keras_reduce)
    route_keras_checkpoint_writes(_saves_elsewhere)


def _saves_before_preemption(strategy):
  """Whether tf_keras's backups save at a termination notice through tfd's
  handler: for tfd's MultiWorkerMirroredStrategy, as tf_keras asks of
  TensorFlow's."""
  return isinstance(strategy, distribute_lib.StrategyBase) and isinstance(
      strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _is_multi_worker(strategy):
  return isinstance(getattr(strategy, "extended", None),
                    collective_all_reduce_strategy.CollectiveAllReduceExtended) and (
                        strategy.extended._in_multi_worker_mode())  # pylint: disable=protected-access


def _saves_elsewhere(strategy):
  """Whether Keras callbacks of this worker save into temporary directories:
  a worker of a multi-worker strategy other than the chief."""
  return _is_multi_worker(strategy) and not strategy.extended.should_checkpoint


def _keras_reduce(values, strategy, reduction):
  """What Keras' `reduce_per_replica` gives for a multi-worker strategy.

  Keras averages the replicas' metrics of its training and evaluation steps
  on each worker alone (TensorFlow's own strategy gets an average along an
  axis that scalars do not have); here they are averaged over every replica
  of the cluster, so every worker logs the same values. `concat` (predict)
  gathers every replica's outputs in the order of the input.
  """
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
  """The replicas' batches concatenated in the order the input had them:
  worker w's local replica r held piece w + r * workers of each step."""
  sizes = strategy.gather(strategy.run(
      lambda v: tf.shape(v, out_type=tf.int64)[:1], args=(value,)), axis=0)
  parts = tf.split(strategy.gather(value, axis=0), sizes,
                   num=strategy.num_replicas_in_sync)
  per_worker = len(strategy.extended.worker_devices)
  ordered = [part for r in range(per_worker) for part in parts[r::per_worker]]
  return tf.concat(ordered, axis=0)


@functools.lru_cache(maxsize=None)
def _keras_major_version():
  """The installed Keras' major version (None without Keras), read from its
  package metadata: importing Keras here would cost every user seconds."""
  try:
    return int(importlib.metadata.version("keras").split(".")[0])
  except (importlib.metadata.PackageNotFoundError, ValueError):
    return None


def _keras_dataset_bases(keras_major_version):
  """Extra base classes of our distributed datasets, for Keras to accept them.

  Keras 3's `fit`, `evaluate` and `predict` choose a data adapter with
  `keras.src.trainers.data_adapters.is_tf_dataset`, which accepts an object
  only if a class in its MRO is named `DistributedDataset` (or `DatasetV2`,
  `DistributedDatasetsFromFunction`) and has a module under
  `tensorflow.python.`; `isinstance(x, tf.distribute.DistributedDataset)`
  is not enough. Past that check Keras uses only the public interface
  (`isinstance` against `tf.distribute.DistributedDataset` and
  `DistributedIterator`, iteration, `get_next_as_optional`, `cardinality`,
  `element_spec`, `strategy.run`). An empty class named like TensorFlow's
  own distributed dataset answers the check. Keras 2 checks with
  `isinstance` and needs none.
  """
  if keras_major_version is None or keras_major_version < 3:
    return ()
  return (type("DistributedDataset", (), {
      "__module__": "tensorflow.python.distribute.input_lib",
      "__doc__": "Marks a distributed dataset for Keras 3's data adapters."}),)


def route_keras_reduce_per_replica(takes, reduce):
  """Makes Keras 3 reduce the per-replica outputs of its training,
  evaluation and prediction steps with `reduce(values, strategy, reduction)`
  for strategies where `takes(strategy)`, and as before for the others.

  Keras treats a multi-worker strategy specially only if it is an instance
  of TensorFlow's own class (`_collective_all_reduce_multi_worker`);
  otherwise each worker averages its own replicas' metrics and logs values
  that differ from worker to worker. Keras calls its module-level
  `reduce_per_replica` by name, so wrapping that name is enough. Without
  Keras 3 this does nothing; it imports Keras.
  """
  if _keras_major_version() != 3 or not _has_client_names(*_KERAS_REDUCE):
    return
  trainer = importlib.import_module(_KERAS_TRAINER)
  original = trainer.reduce_per_replica
  if getattr(original, "routes", None) is not None:
    if (takes, reduce) not in original.routes:
      original.routes.append((takes, reduce))
    return
  routes = [(takes, reduce)]

  def reduce_per_replica(values, strategy, reduction):
    for route_takes, route_reduce in routes:
      if route_takes(strategy):
        return route_reduce(values, strategy, reduction)
    return original(values, strategy, reduction)
  reduce_per_replica.routes = routes
  trainer.reduce_per_replica = reduce_per_replica


# The paths each Keras 3 callback that saves writes to, by class.
_KERAS_CHECKPOINT_PATHS = {
    "BackupAndRestore": ("backup_dir", "_weights_path", "_training_metadata_path",
                         "_prev_weights_path", "_prev_training_metadata_path"),
    "ModelCheckpoint": ("filepath",),
}


def route_keras_checkpoint_writes(takes):
  """Makes Keras 3's `BackupAndRestore` and `ModelCheckpoint` callbacks
  save into a temporary directory, removed at once, when `takes(strategy)`
  for the strategy of the model they serve; there `BackupAndRestore` also
  leaves the backup alone at the end of training. Elsewhere they work as
  before.

  Keras 3 has no check for multi-worker training in these callbacks (tf.keras
  asked `distributed_file_utils.write_dirpath`, that is the strategy's
  `extended.should_checkpoint`): every worker saves into the same files (two
  processes writing one HDF5 file fail with `BlockingIOError`) and deletes
  the backup. Every worker must still save, as saving reads variables that
  all workers take part in; as in TensorFlow's multi-worker tutorial, the
  other workers' files go to a temporary directory that is removed. While
  `_save_model` runs, the callback's paths (`_KERAS_CHECKPOINT_PATHS`)
  point into that directory. Without Keras 3 this does nothing; it imports
  Keras.
  """
  if _keras_major_version() != 3 or not _has_client_names(*_KERAS_CHECKPOINTS):
    return
  callbacks = importlib.import_module("keras.callbacks")
  for name, paths in _KERAS_CHECKPOINT_PATHS.items():
    callback_class = getattr(callbacks, name)
    routes = getattr(callback_class._save_model, "routes", None)  # pylint: disable=protected-access
    if routes is None:
      routes = []
      callback_class._save_model = _saving_elsewhere(  # pylint: disable=protected-access
          callback_class._save_model, paths, routes)  # pylint: disable=protected-access
      if name == "BackupAndRestore":
        callback_class.on_train_end = _skipped_where(callback_class.on_train_end, routes)
    if takes not in routes:
      routes.append(takes)


def _routed(callback, routes):
  strategy = getattr(callback.model, "distribute_strategy", None)
  return any(takes(strategy) for takes in routes)


def _saving_elsewhere(save_model, paths, routes):
  @functools.wraps(save_model)
  def _save_model(self, *args, **kwargs):
    if not _routed(self, routes):
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
  _save_model.routes = routes
  return _save_model


def _skipped_where(method, routes):
  @functools.wraps(method)
  def skipped(self, *args, **kwargs):
    if not _routed(self, routes):
      return method(self, *args, **kwargs)
    return None
  return skipped


def route_tf_keras(saves_before_preemption):
  """Makes tf_keras's `BackupAndRestore(..., save_before_preemption=True)`
  save at a termination notice through tfd's `PreemptionCheckpointHandler`
  for the strategies where `saves_before_preemption(strategy)`.

  tf_keras turns the feature on for TensorFlow's MultiWorkerMirroredStrategy
  on Google Cloud, with TensorFlow's handler, which TensorFlow 2.21 switches
  off on VMs without GPUs (tf_keras then fails at the first batch). Call it
  whenever a strategy becomes current: it changes nothing until tf_keras is
  imported, routes once, and costs two dictionary look-ups after.
  """
  if _TF_KERAS_BACKUPS[0] in _DEGRADED:
    return
  callbacks = sys.modules.get(_TF_KERAS_CALLBACKS)
  if (callbacks is not None or _TF_KERAS_TRAINING_STATE in sys.modules) and not (
      _has_client_names(*_TF_KERAS_BACKUPS)):
    return
  if callbacks is not None and getattr(
      callbacks.BackupAndRestore, "_tfd_routed", None) is not saves_before_preemption:
    _route_backup(callbacks.BackupAndRestore, saves_before_preemption)
  state = sys.modules.get(_TF_KERAS_TRAINING_STATE)
  if state is not None and getattr(
      state.WorkerTrainingState, "_tfd_routed", None) is not saves_before_preemption:
    _route_training_state(state, saves_before_preemption)


def _route_backup(callback_class, saves_before_preemption):
  """With `save_before_preemption`, `BackupAndRestore` asks for the batch
  hooks, in which tf_keras checks for a notice, wherever
  `saves_before_preemption` (tf_keras asks for them only to save every
  `save_freq` batches, so with `save_freq="epoch"` and no other callback
  that wants them, such as `verbose=0`, it never checks)."""
  implements_batch_hooks = callback_class._implements_train_batch_hooks  # pylint: disable=protected-access

  @functools.wraps(implements_batch_hooks)
  def batch_hooks(self):
    model = getattr(self, "model", None)
    return implements_batch_hooks(self) or bool(
        self.save_before_preemption and model is not None
        and saves_before_preemption(model.distribute_strategy))

  callback_class._implements_train_batch_hooks = batch_hooks  # pylint: disable=protected-access
  callback_class._tfd_routed = saves_before_preemption  # pylint: disable=protected-access


def _route_training_state(module, saves_before_preemption):
  """tf_keras's backup state builds TensorFlow's handler for
  `save_before_preemption`, from the manager that writes this worker's
  backup (a temporary folder on workers other than the chief), and turns it
  on only on Google Cloud (`distributed_file_utils._on_gcp`). Where
  `saves_before_preemption` the state is built without it, and on Google
  Cloud it is driven by tfd's handler over the manager that reads
  the backup, so every worker restores the chief's backup."""
  state_class = module.WorkerTrainingState
  init = state_class.__init__

  @functools.wraps(init)
  def routed(self, model, checkpoint_dir, save_freq="epoch", save_before_preemption_arg=None):
    strategy = model.distribute_strategy
    ours = bool(save_before_preemption_arg) and saves_before_preemption(strategy)
    init(self, model, checkpoint_dir, save_freq, False if ours else save_before_preemption_arg)
    if ours and module.distributed_file_utils._on_gcp():  # pylint: disable=protected-access
      self._enable_save_before_preemption = True  # pylint: disable=protected-access
      self.preemption_handler = failure_handling.PreemptionCheckpointHandler(
          strategy.cluster_resolver, self.read_checkpoint_manager)
      model._preemption_handler = self.preemption_handler  # pylint: disable=protected-access
  state_class.__init__ = routed
  state_class._tfd_routed = saves_before_preemption  # pylint: disable=protected-access


