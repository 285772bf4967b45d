"""The client shims: each adaptation of Keras 3 and tf_keras, against the
client itself, and each one's degradation where a client's name is missing."""

import contextlib
import inspect
import os
import tempfile
import warnings

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import _client_shims
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import failure_handling
from tf_distribute_lite import input_lib


def test_install_adds_the_dataset_base_and_the_scope_entry_hook():
  assert distribute_lib._on_scope_entry is _client_shims._on_scope_entry  # pylint: disable=protected-access
  base = input_lib.DistributedDataset.__bases__[-1]
  assert (base.__module__, base.__name__) == (
      "tensorflow.python.distribute.input_lib", "DistributedDataset")
  # No behaviour of its own: only the dunders Python gives every class.
  assert not [name for name in vars(base) if not name.startswith("__")]
  assert _client_shims._keras_major_version() >= 3  # pylint: disable=protected-access
  assert issubclass(input_lib.DistributedDatasetsFromFunction, base)


def test_keras_3_takes_our_distributed_datasets_for_tensorflows():
  """The check the base `install` adds answers: Keras 3 picks its dataset
  adapter by base-class name and module, and accepts ours only with them."""
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.trainers import data_adapters  # pylint: disable=g-import-not-at-top
  assert _client_shims._keras_major_version() == int(keras.__version__.split(".")[0]) >= 3
  strategy = tfd.MirroredStrategy(["CPU:0", "CPU:1"])
  dataset = tf.data.Dataset.range(4).batch(2)
  for distributed in [
      strategy.experimental_distribute_dataset(dataset),
      strategy.distribute_datasets_from_function(lambda _: dataset)]:
    assert data_adapters.is_tf_dataset(distributed)
    adapter = data_adapters.get_data_adapter(distributed)
    assert type(adapter).__name__ == "TFDatasetAdapter"
    assert adapter.get_tf_dataset() is distributed
    assert adapter.num_batches == 2

  class PublicInterfaceOnly(tf.distribute.DistributedDataset):
    pass
  assert not data_adapters.is_tf_dataset(PublicInterfaceOnly())


def test_keras_reduce_per_replica_is_routed_for_multi_worker_strategies(monkeypatch):
  trainer = __import__(_client_shims._KERAS_TRAINER, fromlist=["_"])  # pylint: disable=protected-access
  for make in ("_make_function", "make_predict_function"):
    assert "reduce_per_replica(" in inspect.getsource(getattr(trainer.TensorFlowTrainer, make))
  chosen = tfd.OneDeviceStrategy("CPU:0")
  monkeypatch.setattr(_client_shims, "_is_multi_worker", lambda strategy: strategy is chosen)
  monkeypatch.setattr(_client_shims, "_keras_reduce",
                      lambda values, strategy, reduction: ("ours", reduction))
  _client_shims.route_keras_reduce_per_replica()
  _client_shims.route_keras_reduce_per_replica()  # once only
  assert trainer.reduce_per_replica({"loss": 1.0}, chosen, "auto") == ("ours", "auto")
  other = tfd.OneDeviceStrategy("CPU:1")
  assert trainer.reduce_per_replica({"loss": tf.constant(2.0)}, other, "auto")["loss"] == 2.0


def test_tf_keras_save_before_preemption_is_routed_for_chosen_strategies(tmp_path, monkeypatch):
  """tf_keras's backup state turns `save_before_preemption` on where
  `distributed_file_utils._on_gcp()` says Google Cloud; for a strategy that
  the shims are told save before preemption it is driven by tfd's
  `PreemptionCheckpointHandler`, made
  from the strategy's cluster resolver and the manager that reads the
  backup, through the handler's names tf_keras reads. `BackupAndRestore` then asks for the
  batch hooks, where tf_keras checks for a notice."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import distributed_file_utils  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import distributed_training_utils  # pylint: disable=g-import-not-at-top
  from tf_keras.src.distribute import worker_training_state  # pylint: disable=g-import-not-at-top
  state_class = worker_training_state.WorkerTrainingState
  assert list(inspect.signature(state_class.__init__).parameters) == [
      "self", "model", "checkpoint_dir", "save_freq", "save_before_preemption_arg"]
  for routed in ((state_class, "__init__"), (state_class, "_tfd_routed"),
                 (tf_keras.callbacks.BackupAndRestore, "_implements_train_batch_hooks"),
                 (tf_keras.callbacks.BackupAndRestore, "_tfd_routed")):
    monkeypatch.setattr(*routed, getattr(*routed, None), raising=False)
  monkeypatch.setattr(distributed_file_utils, "_on_gcp", lambda: 200)
  made = []

  class Handler:

    def __init__(self, cluster_resolver, checkpoint_manager):
      made.append(self)
      self.made_with = (cluster_resolver, checkpoint_manager)
      self._run_counter = 0
      self.checks = self.scopes = 0

    def _check_preemption_and_maybe_checkpoint(self):
      self.checks += 1

    @contextlib.contextmanager
    def watch_preemption_scope(self):
      self.scopes += 1
      yield

  monkeypatch.setattr(failure_handling, "PreemptionCheckpointHandler", Handler)
  monkeypatch.setattr(_client_shims, "_saves_before_preemption", lambda strategy: True)
  _client_shims.route_tf_keras()
  model = tf_keras.Sequential([tf_keras.Input((1,)), tf_keras.layers.Dense(1)])
  backup = tf_keras.callbacks.BackupAndRestore(str(tmp_path), save_before_preemption=True)
  backup.set_model(model)
  assert backup._implements_train_batch_hooks()  # pylint: disable=protected-access
  state = state_class(model, str(tmp_path), "epoch", True)
  (handler,) = made
  assert handler.made_with == (model.distribute_strategy.cluster_resolver,
                               state.read_checkpoint_manager)
  assert model._preemption_handler is handler  # pylint: disable=protected-access
  state.backup_if_preempted()
  with distributed_training_utils.maybe_preemption_handler_scope(model):
    pass
  assert (handler._run_counter, handler.checks, handler.scopes) == (1, 1, 1)  # pylint: disable=protected-access
  monkeypatch.setattr(distributed_file_utils, "_on_gcp", lambda: False)
  assert not state_class(model, str(tmp_path), "epoch", True)._enable_save_before_preemption  # pylint: disable=protected-access
  assert len(made) == 1


def test_keras_checkpoint_writes_are_routed_for_chosen_strategies(tmp_path, monkeypatch):
  """Keras 3 callbacks save through `_save_model` to the paths the shims
  name; for a chosen strategy they save into a temporary directory that
  is removed, and `BackupAndRestore` leaves the backup alone at the end."""
  import keras  # pylint: disable=g-import-not-at-top
  from keras_models import classification_data, classifier  # pylint: disable=g-import-not-at-top
  chosen = tfd.OneDeviceStrategy("CPU:0")
  monkeypatch.setattr(_client_shims, "_saves_elsewhere", lambda strategy: strategy is chosen)
  _client_shims.route_keras_checkpoint_writes()
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  saved = []
  save_weights = keras.Model.save_weights

  def recorded_save_weights(model, filepath, **kwargs):
    saved.append(os.path.dirname(filepath))
    return save_weights(model, filepath, **kwargs)
  monkeypatch.setattr(keras.Model, "save_weights", recorded_save_weights)

  def fit(strategy, directory):
    with strategy.scope():
      model = classifier()
      model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    backup = keras.callbacks.BackupAndRestore(str(directory / "backup"), delete_checkpoint=False)
    model.fit(*classification_data(8), epochs=2, verbose=0, callbacks=[
        backup, keras.callbacks.ModelCheckpoint(str(directory / "e{epoch}.weights.h5"),
                                                save_weights_only=True)])
    assert {name: getattr(backup, name)
            for name in _client_shims._KERAS_CHECKPOINT_PATHS["BackupAndRestore"]} == {  # pylint: disable=protected-access
                "backup_dir": str(directory / "backup"),
                "_weights_path": str(directory / "backup" / "latest.weights.h5"),
                "_training_metadata_path": str(directory / "backup" / "training_metadata.json"),
                "_prev_weights_path": str(directory / "backup" / "latest.weights.h5.bkp"),
                "_prev_training_metadata_path":
                    str(directory / "backup" / "training_metadata.json.bkp")}

  fit(chosen, tmp_path / "chosen")
  assert not (tmp_path / "chosen").exists() and not list(scratch.iterdir())
  assert len(saved) == 4 and all(path.startswith(str(scratch)) for path in saved)
  fit(tfd.OneDeviceStrategy("CPU:1"), tmp_path / "other")
  assert sorted(p.name for p in (tmp_path / "other").iterdir()) == [
      "backup", "e1.weights.h5", "e2.weights.h5"]


@pytest.fixture
def degraded(monkeypatch):
  """Each test starts with no feature degraded, and leaves none."""
  monkeypatch.setattr(_client_shims, "_CHECKED", {})


def test_a_missing_tf_keras_name_degrades_its_backups_with_one_warning(monkeypatch, degraded):
  import tf_keras  # pylint: disable=g-import-not-at-top
  feature, names = _client_shims._TF_KERAS_BACKUPS  # pylint: disable=protected-access
  callbacks = _client_shims._TF_KERAS_CALLBACKS  # pylint: disable=protected-access
  monkeypatch.setattr(_client_shims, "_TF_KERAS_BACKUPS", (feature, {
      **names, callbacks: names[callbacks] + " BackupAndRestore._renamed_helper"}))
  for routed in ((tf_keras.callbacks.BackupAndRestore, "_implements_train_batch_hooks"),
                 (tf_keras.callbacks.BackupAndRestore, "_tfd_routed")):
    monkeypatch.setattr(*routed, getattr(*routed, None), raising=False)
  monkeypatch.delattr(tf_keras.callbacks.BackupAndRestore, "_tfd_routed", raising=False)
  unrouted = tf_keras.callbacks.BackupAndRestore._implements_train_batch_hooks  # pylint: disable=protected-access
  strategy = tfd.OneDeviceStrategy("CPU:0")
  with pytest.warns(RuntimeWarning, match=r"tf_keras's backups before preemption.*"
                                          r"tf_keras\.src\.callbacks\.BackupAndRestore\._renamed_helper"):
    with strategy.scope():
      v = tf.Variable(1.0)
  assert float(v) == 1.0  # the scope works
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # warned once
    with strategy.scope():
      pass
  assert tf_keras.callbacks.BackupAndRestore._implements_train_batch_hooks is unrouted  # pylint: disable=protected-access


def test_a_missing_keras_name_leaves_keras_reduction_as_it_is(monkeypatch, degraded):
  trainer = __import__(_client_shims._KERAS_TRAINER, fromlist=["_"])  # pylint: disable=protected-access
  original = trainer.reduce_per_replica
  monkeypatch.setattr(trainer, "reduce_per_replica", original)
  monkeypatch.setattr(_client_shims, "_KERAS_REDUCE", (
      "Keras 3's reduction", {_client_shims._KERAS_TRAINER: "renamed_reduce"}))  # pylint: disable=protected-access
  with pytest.warns(RuntimeWarning, match=r"Keras 3's reduction.*trainer\.renamed_reduce"):
    _client_shims.route_keras_reduce_per_replica()
  assert trainer.reduce_per_replica is original


def test_a_missing_keras_callback_name_leaves_checkpoint_writes_as_they_are(
    monkeypatch, degraded):
  import keras  # pylint: disable=g-import-not-at-top
  feature, names = _client_shims._KERAS_CHECKPOINTS  # pylint: disable=protected-access
  assert "BackupAndRestore()._weights_path" in names["keras.callbacks"].split()
  monkeypatch.setattr(_client_shims, "_KERAS_CHECKPOINTS", (feature, {
      "keras.callbacks": names["keras.callbacks"] + " BackupAndRestore()._renamed_path"}))
  save_model = keras.callbacks.ModelCheckpoint._save_model  # pylint: disable=protected-access
  with pytest.warns(RuntimeWarning, match=r"keras\.callbacks\.BackupAndRestore\(\)\._renamed_path"):
    _client_shims.route_keras_checkpoint_writes()
  assert keras.callbacks.ModelCheckpoint._save_model is save_model  # pylint: disable=protected-access
