"""`MultiWorkerMirroredStrategy`: its names and one-worker form in this
process, then clusters of 2 and 3 worker processes on this machine
(marked `multi_worker`), compared with `tf.distribute` on the same cluster,
with single-process training, and under failures."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from keras_models import classification_data
from keras_models import classifier
from keras_models import TOLERANCE
import multi_worker
import oracle
from multi_worker import LocalCluster
from multi_worker import run_once
from multi_worker import run_together

MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])
MODULE_NAMES = ("tf", "tfd")  # as the worker processes name them
CLASSES = [
    (tfd.MultiWorkerMirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy),
    (tfd.experimental.MultiWorkerMirroredStrategy,
     tf.distribute.experimental.MultiWorkerMirroredStrategy),
    (tfd.compat.v1.experimental.MultiWorkerMirroredStrategy,
     tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy)]


# --- In this process: names, arguments, one worker.

@pytest.mark.parametrize("ours, theirs", CLASSES)
def test_constructors_take_tensorflows_arguments(ours, theirs):
  assert str(inspect.signature(ours.__init__)) == str(inspect.signature(theirs.__init__))


def test_experimental_and_compat_forms():
  strategy = tfd.MultiWorkerMirroredStrategy()
  assert isinstance(strategy, tfd.experimental.MultiWorkerMirroredStrategy)
  experimental = tfd.experimental.MultiWorkerMirroredStrategy("RING")
  assert isinstance(experimental, tfd.MultiWorkerMirroredStrategy)
  assert experimental.extended._communication_options.implementation.value == "RING"  # pylint: disable=protected-access
  v1 = tfd.compat.v1.experimental.MultiWorkerMirroredStrategy()
  assert isinstance(v1, tfd.compat.v1.Strategy)
  assert float(v1.reduce("SUM", v1.run(lambda: tf.constant(2.0)))) == 2.0


def test_session_config_on_one_worker_is_tensorflows(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  config = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_filters=["/job:a"])
  ours, theirs = (mod.MultiWorkerMirroredStrategy().extended._update_config_proto(config)  # pylint: disable=protected-access
                  for mod in (tfd, tf.distribute))
  assert ours == theirs and ours != config


@MODULES
def test_one_worker_without_a_cluster(mod, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  strategy = mod.MultiWorkerMirroredStrategy()
  extended = strategy.extended
  assert strategy.num_replicas_in_sync == 1
  assert extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
  assert extended.parameter_devices == extended.worker_devices
  assert not extended._in_multi_worker_mode()  # pylint: disable=protected-access
  assert extended.should_checkpoint and extended.should_save_summary
  assert extended.experimental_between_graph and extended.experimental_should_init
  assert strategy.cluster_resolver.task_type is None
  with strategy.scope():
    v = tf.Variable(1.0)
  assert repr(v) == ("MirroredVariable:{\n  0: <tf.Variable 'Variable:0' shape=() "
                     "dtype=float32, numpy=1.0>\n}")
  batch = next(iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.range(4).batch(2))))
  assert batch.numpy().tolist() == [0, 1]


def test_one_worker_reduces_and_trains(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  strategy = tfd.MultiWorkerMirroredStrategy()
  with strategy.scope():
    v = tf.Variable(3.0)

  @tf.function
  def step():
    def replica_fn():
      v.assign_add(1.0)
      return tfd.get_replica_context().all_reduce("SUM", v * 2.0)
    return strategy.run(replica_fn)
  assert float(step()) == 8.0
  assert float(strategy.reduce("MEAN", strategy.run(lambda: v + 0.0), axis=None)) == 4.0


@MODULES
def test_a_ps_task_is_refused_before_joining(mod, monkeypatch):
  """As in TensorFlow, at once: a "ps" task has no place in this strategy."""
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1"], '
                     '"ps": ["localhost:2"]}, "task": {"type": "ps", "index": 0}}')
  with pytest.raises(ValueError, match="^There is no id for task_type 'ps'"):
    mod.MultiWorkerMirroredStrategy()


_NOT_A_RESOLVER = ("cluster_resolver must be an instance of "
                   "tf.distribute.cluster_resolver.ClusterResolver")


@pytest.mark.parametrize("snippet, fragments", [
    (lambda a: a.mod.MultiWorkerMirroredStrategy(cluster_resolver="localhost:2222"),
     [_NOT_A_RESOLVER, "got the str 'localhost:2222'"]),
    (lambda a: a.mod.experimental.MultiWorkerMirroredStrategy(cluster_resolver=3),
     [_NOT_A_RESOLVER, "got the int 3"]),
    (lambda a: a.v1.experimental.MultiWorkerMirroredStrategy(
        cluster_resolver=tf.train.ClusterSpec({"worker": ["localhost:2222"]})),
     [_NOT_A_RESOLVER, "got the ClusterSpec"]),
    (lambda a: a.mod.MultiWorkerMirroredStrategy(communication_options={"timeout_seconds": 1}),
     ["communication_options must be an instance of "
      "tf.distribute.experimental.CommunicationOptions", "{'timeout_seconds': 1}"]),
], ids=["string_resolver", "int_resolver", "v1_cluster_spec", "options_dict"])
def test_bad_arguments_raise_value_error_as_in_tf(snippet, fragments, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  oracle.check_misuse(snippet, ValueError, ValueError, fragments)


@pytest.mark.parametrize("tf_config, field", [
    ('{"cluster": {"worker": ["localhost:1"]', "TF_CONFIG"),
    ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}}', "`task`"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}',
     "`task.index`"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "chief", "index": 0}}',
     "`task.type`"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": "worker"}', "`task`"),
])
def test_malformed_tf_config_raises_value_error_naming_the_field(tf_config, field, monkeypatch):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    tfd.MultiWorkerMirroredStrategy()


@pytest.mark.multi_worker
def test_checkpoint_written_on_two_workers_restores_on_one(two_worker_training, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  strategy = tfd.MultiWorkerMirroredStrategy()
  with strategy.scope():
    model = classifier()
    optimizer = keras.optimizers.Adam(learning_rate=0.01)
    optimizer.build(model.trainable_variables)
  tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
      two_worker_training["last_checkpoint"]).expect_partial()
  _assert_close(model.get_weights(), two_worker_training["results"][0]["saved"],
                tolerance=0)
  assert int(optimizer.iterations.numpy()) == 4


# --- Clusters of worker processes.

def test_a_cluster_that_cannot_start_a_worker_kills_those_it_started(tmp_path, monkeypatch):
  started = []

  class FakeProcess:
    pid = -1

    def __init__(self, *unused_args, **unused_kwargs):
      if started:
        raise OSError("cannot start")
      started.append(self)
      self.killed = False

    def poll(self):
      return 0 if self.killed else None

    def wait(self, timeout):
      del timeout

  monkeypatch.setattr(multi_worker.subprocess, "Popen", FakeProcess)
  monkeypatch.setattr(multi_worker.os, "kill",
                      lambda pid, signal: setattr(started[0], "killed", True))
  with pytest.raises(OSError, match="cannot start"):
    LocalCluster(2, tmp_path).start("basics")
  assert started[0].killed

def _assert_close(actual, expected, tolerance=TOLERANCE):
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=tolerance)


def _plain_training(steps, restore=None):
  """The custom loop of `multi_worker_scenarios.custom_loop` in one process, no strategy."""
  model = classifier()
  optimizer = keras.optimizers.Adam(learning_rate=0.01)
  optimizer.build(model.trainable_variables)
  if restore:
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(restore)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  losses = []
  for x, y in tf.data.Dataset.from_tensor_slices(
      classification_data(16 * steps)).batch(16):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(loss_fn(y, model(x)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    losses.append(float(loss))
  return losses, model.get_weights()


@pytest.fixture(scope="module")
def two_worker_training(tmp_path_factory):
  """2 workers train 4 steps; the chief checkpoints after each."""
  def run(directory):
    checkpoints = directory / "checkpoints"
    results = LocalCluster(2, directory / "cluster").run(
        "custom_loop", args={"steps": 4, "checkpoint": str(checkpoints),
                             "local_strategy_first": True})
    return {"results": results, "last_checkpoint": str(checkpoints / "ckpt-3")}
  return run_once(tmp_path_factory, "two_worker_training", run)


@pytest.fixture(scope="module")
def two_worker_runs(tmp_path_factory):
  """TensorFlow's custom-loop tutorial, Keras fit and the strategy's API
  (last: it ends with a collective that times out) on 2 workers: with tfd
  one after another in one cluster; with tf.distribute in a cluster each,
  as its strategies collide in one program (a later one reuses the
  collective instance keys of an earlier one). The clusters run at the
  same time. Results by module, then task index, then scenario."""
  scenarios = ["tutorial_custom_loop", "keras_fit", "client_libraries", "basics"]

  def run(directory):
    (directory / "tmp").mkdir()
    runs = [(LocalCluster(2, directory / "tfd"), "several", "tfd", {
        "env": {"TMPDIR": str(directory / "tmp")}, "args": {"scenarios": scenarios}})]
    runs += [(LocalCluster(2, directory / f"tf_{name}"), "several", "tf",
              {"args": {"scenarios": [name]}}) for name in scenarios]
    ours, *theirs = run_together(runs, timeout=600)
    return {"tfd": ours, "tf": {index: {name: result[index][name]
                                        for name, result in zip(scenarios, theirs)}
                                for index in range(2)}}
  return run_once(tmp_path_factory, "two_worker_runs", run)


def _scenario(results, name):
  """Each worker's result of scenario `name`, by task index."""
  return {index: result[name] for index, result in results.items()}


@pytest.mark.multi_worker
def test_strategy_api_matches_tensorflow_on_two_workers(two_worker_runs):
  _assert_strategy_api_matches_tensorflow(
      {mod: _scenario(results, "basics") for mod, results in two_worker_runs.items()})


@pytest.mark.multi_worker
def test_strategy_api_matches_tensorflow_on_three_workers(tmp_path):
  results = run_together([(LocalCluster(3, tmp_path / mod), "basics", mod, {})
                          for mod in MODULE_NAMES])
  _assert_strategy_api_matches_tensorflow(dict(zip(MODULE_NAMES, results)))


def _assert_strategy_api_matches_tensorflow(results):
  """`basics` gave the same on every worker with tf.distribute and tfd,
  results by module and task index, and what it should."""
  num_workers = len(results["tfd"])
  for index in range(num_workers):
    ours, theirs = results["tfd"][index], results["tf"][index]
    assert "error" not in ours, ours.get("traceback")
    collective_ops = ours.pop("collective_ops")
    our_timeout, their_timeout = ours.pop("timeout"), theirs.pop("timeout")
    assert ours == theirs
    assert ours["num_replicas"] == num_workers
    assert ours["worker_devices"] == [f"/job:worker/replica:0/task:{index}/device:CPU:0"]
    assert ours["chief_flags"] == [index == 0, index == 0, True, True]
    assert ours["replica_ids"] == ours["value_ids"] == [index]
    names = ours["client_private_names"]
    assert (names["extended._in_multi_worker_mode"], names["extended._task_id"]) == (True, index)
    assert f'device_filters: "/job:worker/task:{index}"' in ours["session_config"]
    assert 'collective_group_leader: "/job:worker/replica:0/task:0"' in ours["session_config"]
    assert ours["initial_value"] == ours["read_in_replica_context_by_hand"] == 10.0  # the chief's
    assert ours["counter"] == num_workers
    assert ours["saving_all_reduce"] is True  # TF's refusal of collectives
    # Every field of CommunicationOptions reaches the collective ops; with
    # none the timeout is finite. Two strategies in one program do not collide.
    default_timeout = tfd.communicator.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    assert collective_ops == [[3, ["ring"], [7.5], 35.0 * num_workers],
                              [1, ["auto"], [default_timeout], 35.0 * num_workers]]
    if index == 0:
      assert our_timeout[0] == their_timeout[0] == "DeadlineExceededError"
      assert our_timeout[1] < 10
  assert results["tfd"][0]["reduce"] == [sum(range(1, num_workers + 1)),
                                         sum(range(1, num_workers + 1)) / num_workers]
  # IndexedSlices stay slices: every replica's rows and indices, in order.
  rows = [[float(i + 1)] * 2 for i in range(num_workers)]
  means = (np.float32(rows) / np.float32(num_workers)).tolist()
  indices = list(range(num_workers))
  assert results["tfd"][0]["indexed_slices"] == [
      [[rows, indices, None]], [[rows, indices, None]], [rows, indices, None],
      [[means, indices, None]], [[means, indices, None]], [means, indices, None],
      [[rows, indices, [4, 2]]], [[rows, indices, [4, 2]]], [rows, indices, [4, 2]],
      [[means, indices, [4, 2]]], [[means, indices, [4, 2]]], [means, indices, [4, 2]]]


@pytest.mark.multi_worker
def test_custom_loop_on_two_workers_gives_single_process_weights(two_worker_training):
  """Worker 0 made a MirroredStrategy of collective ops first: the
  multi-worker strategy's collective keys are those of worker 1 all the same."""
  losses, weights = _plain_training(steps=4)
  for result in two_worker_training["results"].values():
    assert "error" not in result, result.get("traceback")
    np.testing.assert_allclose(result["losses"], losses, atol=TOLERANCE)
    _assert_close(result["weights"], weights)
    assert result["leftover_dirs"] == []  # non-chiefs removed their checkpoints
  assert two_worker_training["results"][0]["local_sum"] == [3.0, 3.0]


@pytest.mark.multi_worker
def test_checkpoint_written_on_two_workers_restores_on_three(two_worker_training, tmp_path):
  checkpoint = two_worker_training["last_checkpoint"]
  results = LocalCluster(3, tmp_path).run(
      "custom_loop", args={"steps": 2, "restore": checkpoint})
  losses, weights = _plain_training(steps=2, restore=checkpoint)
  for result in results.values():
    assert "error" not in result, result.get("traceback")
    _assert_close(result["restored"], two_worker_training["results"][0]["saved"])
    np.testing.assert_allclose(result["losses"], losses, atol=TOLERANCE)
    _assert_close(result["weights"], weights)


@pytest.mark.multi_worker
def test_keras_fit_on_two_workers(two_worker_runs):
  """Every worker logs the same metrics, equal to single-process `fit`, and
  ends with its weights. (TensorFlow 2.21's own strategy fails in `fit`.)"""
  ours = _scenario(two_worker_runs["tfd"], "keras_fit")
  theirs = _scenario(two_worker_runs["tf"], "keras_fit")
  assert theirs[0]["type"] == "ValueError"
  model = classifier()
  model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(64)).batch(16)
  history = model.fit(dataset, epochs=2, verbose=0).history
  evaluation = model.evaluate(dataset, verbose=0, return_dict=True)
  predictions = model.predict(classification_data(24)[0], batch_size=8, verbose=0)
  assert "error" not in ours[0], ours[0].get("traceback")
  assert ours[0]["batch_logs"] == ours[1]["batch_logs"]
  for result in ours.values():
    assert result["history"] == ours[0]["history"]
    for name, values in history.items():
      np.testing.assert_allclose(result["history"][name], values, atol=TOLERANCE)
    _assert_close(result["weights"], model.get_weights())
    for name, value in evaluation.items():
      assert result["evaluation"][name] == pytest.approx(value, abs=TOLERANCE)
    np.testing.assert_allclose(result["predictions"], predictions, atol=TOLERANCE)
  _assert_checkpointing_as_in_the_tutorial(ours)


@pytest.mark.multi_worker
def test_client_libraries_on_two_workers_match_tensorflow(two_worker_runs):
  """tf_keras trains, evaluates, predicts, backs up and resumes on 2 workers
  as under TensorFlow's MultiWorkerMirroredStrategy, with the same files;
  Orbit's Controller trains, evaluates, checkpoints and restores alike."""
  ours = _scenario(two_worker_runs["tfd"], "client_libraries")
  theirs = _scenario(two_worker_runs["tf"], "client_libraries")
  for index in range(2):
    assert "error" not in ours[index], ours[index].get("traceback")
    assert "error" not in theirs[index], theirs[index].get("traceback")
    mine, expected = ours[index], theirs[index]
    for key in ("history", "evaluation"):
      for name, value in expected[key].items():
        np.testing.assert_allclose(mine[key][name], value, atol=TOLERANCE)
    np.testing.assert_allclose(mine["predictions"], expected["predictions"], atol=TOLERANCE)
    _assert_close(mine["weights"], expected["weights"])
    checkpointing, expected_checkpointing = mine["checkpointing"], expected["checkpointing"]
    for key in ("interrupted", "backup_after_interruption", "resumed_epochs",
                "backup_after_training", "checkpoints"):
      assert checkpointing[key] == expected_checkpointing[key], key
    assert checkpointing["temporary_files"] == []
    np.testing.assert_allclose(checkpointing["resumed_loss"],
                               expected_checkpointing["resumed_loss"], atol=TOLERANCE)
    _assert_close(checkpointing["weights"], expected_checkpointing["weights"])
    orbit, expected_orbit = mine["orbit"], expected["orbit"]
    assert orbit["checkpoints"] == expected_orbit["checkpoints"]
    assert orbit["restored"] == expected_orbit["restored"]
    assert [kind for kind, _ in orbit["outputs"]] == [kind for kind, _ in expected_orbit["outputs"]]
    for (_, values), (_, expected_values) in zip(orbit["outputs"], expected_orbit["outputs"]):
      for name, value in expected_values.items():
        assert values[name] == pytest.approx(value, abs=TOLERANCE), name
    _assert_close(orbit["weights"], expected_orbit["weights"])
  assert ours[0]["checkpointing"]["resumed_epochs"] == [2]
  assert ours[0]["checkpointing"]["checkpoints"] == [
      "epoch1.weights.h5", "epoch2.weights.h5", "epoch3.weights.h5"]
  assert ours[0]["orbit"]["restored"] == {"step": 6, "weights_equal": True}


def _assert_checkpointing_as_in_the_tutorial(results):
  """`BackupAndRestore` and `ModelCheckpoint` on 2 workers: the chief writes
  the shared files, the other worker's go away; training resumed after an
  interruption at epoch 2 runs epoch 2 only and ends where 3 uninterrupted
  epochs of single-process `fit` do."""
  model = classifier()
  model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(tf.data.Dataset.from_tensor_slices(classification_data(64)).batch(16)
                      .repeat(), epochs=3, steps_per_epoch=4, verbose=0).history
  for result in results.values():
    checkpointing = result["checkpointing"]
    assert checkpointing["interrupted"] == "interrupted"
    assert checkpointing["backup_after_interruption"] == [
        "latest.weights.h5", "training_metadata.json"]
    assert checkpointing["resumed_epochs"] == [2]
    np.testing.assert_allclose(checkpointing["resumed_loss"], history["loss"][2:],
                               atol=TOLERANCE)
    _assert_close(checkpointing["weights"], model.get_weights())
    assert checkpointing["checkpoints"] == [f"epoch{e}.weights.h5" for e in (1, 2, 3)]
    assert checkpointing["temporary_files"] == []
  assert results[0]["checkpointing"]["backup_after_training"] is False


@pytest.mark.multi_worker
def test_tutorial_custom_loop_gives_tensorflows_losses(two_worker_runs):
  results = {mod: _scenario(results, "tutorial_custom_loop")
             for mod, results in two_worker_runs.items()}
  for index in range(2):
    ours, theirs = results["tfd"][index], results["tf"][index]
    assert "error" not in ours, ours.get("traceback")
    np.testing.assert_allclose(ours["losses"], theirs["losses"], atol=TOLERANCE)
    _assert_close(ours["weights"], theirs["weights"])
    assert ours["leftover_dirs"] == []


@pytest.mark.multi_worker
def test_missing_worker_fails_within_the_startup_timeout(tmp_path):
  """A missing worker, and a missing task 0 (the coordination service's
  leader, which TensorFlow's agent retries with a backoff that overruns its
  deadline): the others fail in time, naming the missing task. The two
  clusters start together."""
  timeout = 4
  no_worker = LocalCluster(3, tmp_path / "no_worker")
  no_leader = LocalCluster(2, tmp_path / "no_leader")
  env = {"TF_DISTRIBUTE_LITE_STARTUP_TIMEOUT": str(timeout)}
  results = run_together([(no_worker, "start_up", "tfd", {"skip": (1,), "env": env}),
                          (no_leader, "start_up", "tfd", {"skip": (0,), "env": env})])
  for cluster, result, missing in [(no_worker, results[0][0], 1), (no_worker, results[0][2], 1),
                                   (no_leader, results[1][1], 0)]:
    assert result.get("type") == "DeadlineExceededError", result
    assert (f"within {timeout} s: no server answers for /job:worker/replica:0/"
            f"task:{missing} at {cluster.addresses[missing]}.") in result["error"]
    assert result["seconds"] < timeout + 2  # TensorFlow's agent alone took 5 s more


@pytest.mark.multi_worker
def test_killed_worker_fails_the_others_and_keeps_the_last_checkpoint(tmp_path):
  cluster = LocalCluster(3, tmp_path / "cluster")
  checkpoints = tmp_path / "checkpoints"
  cluster.start("custom_loop", args={"steps": 8, "checkpoint": str(checkpoints),
                                     "die_after": [1, 2], "timeout": 30})
  try:
    assert cluster.wait_for_file(tmp_path / "cluster" / "ready_to_die", 120), cluster.logs()
    cluster.kill(1)
    results = cluster.finish(timeout=90)
  finally:
    cluster.stop()
  for index in (0, 2):
    error_type, message, seconds = results[index]["error"]
    assert error_type == "UnavailableError"
    assert "/job:worker/replica:0/task:1" in message
    assert seconds < 30
  saved = sorted(checkpoints.glob("ckpt-*.index"))
  assert saved[-1].name == "ckpt-2.index"
  model = classifier()
  tf.train.Checkpoint(model=model).restore(str(saved[-1])[:-len(".index")]).expect_partial()
  _assert_close(model.get_weights(), results[0]["saved"], tolerance=0)
