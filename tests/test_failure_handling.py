"""`PreemptionCheckpointHandler`, `TerminationConfig` and
`PreemptionWatcher`: in this process
(arguments, errors, custom watchers, save and exit functions), then in
worker processes that get a real SIGTERM in the middle of training, exit,
restart and end with the weights of an uninterrupted run, compared with
`tf.distribute` where TensorFlow 2.21 has the same behaviour."""

import contextlib
import inspect
import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import gce_metadata

from cloud_fakes import FakeCloud
from multi_worker import LocalCluster
from multi_worker import run_together
import oracle
from preemption_scenarios import keras_plain_weights
from preemption_scenarios import plain_weights

MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])
SCENARIO = "preemption_scenarios.train"
KERAS_SCENARIO = "preemption_scenarios.keras_fit"
RESTART_EXIT_CODE = 42
GCE_RESTART_EXIT_CODE = 143


class Exited(Exception):
  """Raised by the `exit_fn` of the tests in this process."""


@pytest.fixture
def not_on_google_cloud(monkeypatch):
  """No metadata server: nothing listens at its address."""
  monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:1")


@pytest.fixture
def google_cloud(monkeypatch):
  """A fake metadata server that answers as a Google Cloud VM's."""
  fake = FakeCloud()
  fake.metadata("instance/hostname", "vm-1")
  fake.metadata("instance/maintenance-event", "NONE")
  monkeypatch.setenv("GCE_METADATA_IP", fake.address)
  yield fake
  fake.close()


def _handler(mod, directory, watcher_fn=lambda: False, **config):
  """A one-worker handler of a `Checkpoint` of one step counter, with a
  custom watcher (no SIGTERM handler is set in this process)."""
  step = tf.Variable(0)
  termination = mod.experimental.TerminationConfig(
      termination_watcher_fn=watcher_fn, **config)
  handler = mod.experimental.PreemptionCheckpointHandler(
      None, tf.train.Checkpoint(step=step), str(directory), termination)
  return handler, step


def _saved_runs(directory):
  """The `run` count each checkpoint in `directory` holds, oldest first."""
  state = tf.train.get_checkpoint_state(str(directory))
  if state is None:
    return []
  return [int(tf.train.load_checkpoint(path).get_tensor(
      "checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE"))
          for path in state.all_model_checkpoint_paths]


# --- In this process.

@pytest.mark.parametrize("name", ["__init__", "run", "save_checkpoint_if_preempted"])
def test_handler_takes_tensorflows_arguments(name):
  ours = getattr(tfd.experimental.PreemptionCheckpointHandler, name)
  theirs = getattr(tf.distribute.experimental.PreemptionCheckpointHandler, name)
  assert inspect.signature(ours) == inspect.signature(theirs)


def test_termination_config_takes_tensorflows_arguments():
  assert inspect.signature(tfd.experimental.TerminationConfig) == inspect.signature(
      tf.distribute.experimental.TerminationConfig)


def _raise(error):
  raise error


def _run_until_exit(handler, step, notice=None, notice_after=2, max_steps=200):
  """Runs steps of `step.assign_add(1)`, pausing 50 ms after each, until
  `exit_fn` raises `Exited`; sets `notice` after `notice_after` steps."""
  for _ in range(max_steps):
    handler.run(step.assign_add, 1)
    if notice is not None and int(step.numpy()) == notice_after:
      notice.set()
    time.sleep(0.05)
  raise AssertionError(f"no exit after {max_steps} steps")


@MODULES
def test_run_passes_arguments_results_and_errors_through(mod, tmp_path, not_on_google_cloud):
  handler, step = _handler(mod, tmp_path)
  assert handler.run(lambda a, b=0: step.assign_add(a + b).numpy(), 2, b=3) == 5
  error = tf.errors.InvalidArgumentError(None, None, "bad step")
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    handler.run(_raise, error)
  assert raised.value is error
  with pytest.raises(ValueError, match="not TensorFlow's"):
    handler.run(_raise, ValueError("not TensorFlow's"))
  with handler.watch_preemption_scope():
    handler.save_checkpoint_if_preempted()
  assert int(handler.total_run_calls) == 2  # the failed calls do not count
  assert int(step.numpy()) == 5
  assert os.listdir(tmp_path) == []  # no notice, no save


@MODULES
def test_custom_watcher_and_exit_fn_are_honoured_and_the_run_count_restored(
    mod, tmp_path, not_on_google_cloud):
  """The watcher reports a notice after step 2: a later step is saved, then
  `exit_fn` runs; a new handler restores the step and the number of runs."""
  notice = threading.Event()
  handler, step = _handler(mod, tmp_path, watcher_fn=notice.is_set,
                           exit_fn=lambda: _raise(Exited()))
  with pytest.raises(Exited):
    _run_until_exit(handler, step, notice)
  assert _saved_runs(tmp_path) == [int(step.numpy())]
  assert int(step.numpy()) >= 3
  restored, restored_step = _handler(mod, tmp_path)
  assert int(restored.total_run_calls) == int(restored_step.numpy()) == int(step.numpy())


@MODULES
def test_save_fn_replaces_the_save(mod, tmp_path, not_on_google_cloud):
  """`save_checkpoint_if_preempted`'s arguments go to `save_fn`; nothing
  else is written."""
  notice, saves = threading.Event(), []
  handler, step = _handler(mod, tmp_path, watcher_fn=notice.is_set,
                           exit_fn=lambda: _raise(Exited()),
                           save_fn=lambda *args, **kwargs: saves.append((args, kwargs)))
  notice.set()
  with pytest.raises(Exited):
    for _ in range(200):
      step.assign_add(1)
      handler.save_checkpoint_if_preempted(7, check_interval=False)
      time.sleep(0.05)
  assert saves == [((7,), {"check_interval": False})]
  assert os.listdir(tmp_path) == []


@MODULES
def test_a_checkpoint_without_checkpoint_dir_is_refused(mod):
  """TensorFlow means `InvalidArgumentError`, and raises `TypeError` (it
  builds the error without its first two arguments); tfd's error is both,
  and names the argument."""
  with pytest.raises(TypeError) as raised:
    mod.experimental.PreemptionCheckpointHandler(None, tf.train.Checkpoint())
  if mod is tfd:
    assert isinstance(raised.value, tf.errors.InvalidArgumentError)
    assert "checkpoint_dir must be given with a tf.train.Checkpoint" in str(raised.value)


@pytest.mark.parametrize("resolver", ["localhost:2222", 3], ids=["string", "int"])
def test_what_is_not_a_resolver_is_refused(resolver, tmp_path, not_on_google_cloud):
  """TF fails on the missing `cluster_spec` with an AttributeError; its
  MultiWorkerMirroredStrategy says ValueError for a resolver. Ours is both."""
  oracle.check_misuse(
      lambda mod: mod.experimental.PreemptionCheckpointHandler(
          resolver, tf.train.Checkpoint(), str(tmp_path)),
      AttributeError, (ValueError, AttributeError),
      ["cluster_resolver must be an instance of tf.distribute.cluster_resolver.ClusterResolver",
       f"got the {type(resolver).__name__} {resolver!r}"], apis=(tf.distribute, tfd))


@MODULES
def test_a_cluster_with_a_ps_job_is_not_implemented(mod, tmp_path, not_on_google_cloud):
  resolver = tfd.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}),
      task_type="worker", task_id=0)
  with pytest.raises(NotImplementedError, match="ParameterServerStrategy"):
    mod.experimental.PreemptionCheckpointHandler(
        resolver, tf.train.Checkpoint(), str(tmp_path))


def test_a_folder_that_cannot_be_written_fails_when_the_save_is_due(
    tmp_path, not_on_google_cloud):
  """A folder under a file: the handler is made, the error comes with the
  save, of TensorFlow's class; tfd's message names the folder."""
  (tmp_path / "file").write_text("")
  directory = tmp_path / "file" / "checkpoints"
  errors = {}
  for mod in (tf.distribute, tfd):
    notice = threading.Event()
    notice.set()
    handler, step = _handler(mod, directory, watcher_fn=notice.is_set,
                             exit_fn=lambda: _raise(Exited()))
    with pytest.raises(tf.errors.OpError) as raised:
      _run_until_exit(handler, step)
    errors[mod] = raised.value
  assert type(errors[tfd]) is type(errors[tf.distribute])
  assert f"could not save a checkpoint into {str(directory)!r}" in str(errors[tfd])


@pytest.mark.parametrize("grace_period", [-1, -0.5, float("nan"), "60"])
def test_a_grace_period_must_be_a_number_of_seconds(grace_period):
  """TensorFlow takes any value, and a negative one saves once and exits at
  once; tfd refuses it."""
  with pytest.raises(ValueError, match=r"grace_period must be a number of seconds >= 0"):
    tfd.experimental.TerminationConfig(grace_period=grace_period)


def test_termination_functions_must_be_callable():
  with pytest.raises(TypeError, match="exit_fn must be a function"):
    tfd.experimental.TerminationConfig(exit_fn=42)


def test_off_google_cloud_an_unanswering_metadata_server_does_not_block(tmp_path, monkeypatch):
  """A server that accepts connections and never answers: the handler is
  made (off Google Cloud) within the lookup's timeout."""
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{server.getsockname()[1]}")
    assert gce_metadata.detect_platform() is gce_metadata.Platform.OTHER
    handler, step = _handler(tfd, tmp_path)
    handler.run(step.assign_add, 1)
  assert int(handler.total_run_calls) == 1


def test_on_google_cloud_without_gpus_tensorflow_turns_the_handler_off(tmp_path, google_cloud):
  """TensorFlow's handler on a (fake) Google Cloud CPU VM only calls the
  function: it counts nothing and saves nothing. tfd's works."""
  theirs, their_step = _handler(tf.distribute, tmp_path / "tf")
  theirs.run(their_step.assign_add, 1)
  with pytest.raises(AttributeError):
    theirs.total_run_calls  # pylint: disable=pointless-statement
  ours, step = _handler(tfd, tmp_path / "tfd")
  ours.run(step.assign_add, 1)
  assert int(ours.total_run_calls) == 1
  assert google_cloud.hits["/computeMetadata/v1/instance/hostname"] >= 1


# --- Worker processes that get SIGTERM.

@contextlib.contextmanager
def _sigterm_to_last_workers(runs, scenario, after_steps, env=None, timeout=120):
  """Starts `scenario` on each `(cluster, module, args)` of `runs` at once;
  the last worker of each gets SIGTERM once it has run `after_steps` steps
  (arg "signal_at"), and the file `signal-sent` once it has taken the
  signal. Every worker is killed when the block ends."""
  try:
    for cluster, mod, args in runs:
      cluster.start(scenario, mod, env=env, args=dict(
          args, signal_at=[cluster.num_workers - 1, after_steps]))
    for cluster, _, _ in runs:
      last = cluster.num_workers - 1
      assert cluster.wait_for_file(cluster.directory / f"ready-{last}", timeout), cluster.logs()
      cluster.send_signal(last, signal.SIGTERM)
      (cluster.directory / "signal-sent").write_text("")
    yield
  finally:
    for cluster, _, _ in runs:
      cluster.stop()
      (cluster.directory / "signal-sent").unlink(missing_ok=True)


def _preempt_and_restart(runs, after_steps, timeout=120):
  """Runs `train` on each `(cluster, module, args)` of `runs` at once; the
  last worker of each gets SIGTERM after `after_steps` steps. Returns, per
  run, the exit codes of the first run and the results of the restarted one."""
  with _sigterm_to_last_workers(runs, SCENARIO, after_steps, timeout=timeout):
    exit_codes = [cluster.wait_for_exits(timeout) for cluster, _, _ in runs]
  restarted = run_together([(cluster, SCENARIO, mod, {"args": args})
                            for cluster, mod, args in runs], timeout=timeout)
  return list(zip(exit_codes, restarted))


def _assert_resumed(restarted, saved_at, steps):
  for result in restarted.values():
    assert "error" not in result, result.get("traceback")
    assert result["restored"] == saved_at
    if result["total_run_calls"] is not None:
      assert result["total_run_calls"] == steps
    np.testing.assert_allclose(result["weights"], plain_weights(steps), atol=1e-5)


@pytest.mark.multi_worker
def test_two_workers_save_at_the_step_after_sigterm_and_resume(tmp_path):
  """Worker 1 gets SIGTERM after step 3: both workers run step 4, the chief
  saves, worker 1 writes into a temporary folder and removes it, both exit
  with 42; the restarted job resumes at step 4 and ends where 8
  uninterrupted steps do, as with TensorFlow's handler (which leaves worker
  1's temporary folder behind)."""
  runs = [(LocalCluster(2, tmp_path / mod), mod, {"steps": 8}) for mod in ("tf", "tfd")]
  outcomes = dict(zip(("tf", "tfd"), _preempt_and_restart(runs, after_steps=3)))
  for mod, (exit_codes, restarted) in outcomes.items():
    assert exit_codes == {0: RESTART_EXIT_CODE, 1: RESTART_EXIT_CODE}, mod
    _assert_resumed(restarted, saved_at=4, steps=8)
  assert outcomes["tf"][1][1]["next_to_checkpoint_dir"] == ["checkpoints", "workertemp_1"]
  assert outcomes["tfd"][1][1]["next_to_checkpoint_dir"] == ["checkpoints"]
  assert _saved_runs(tmp_path / "tfd" / "run" / "checkpoints") == [4]


@pytest.mark.multi_worker
def test_orbit_action_saves_on_two_tfd_workers_and_the_job_resumes(tmp_path):
  """Orbit's `SaveCheckpointIfPreempted` builds TensorFlow's own handler from
  the strategy's cluster resolver; it needs nothing else of the strategy,
  and works with tfd's MultiWorkerMirroredStrategy as with TensorFlow's."""
  runs = [(LocalCluster(2, tmp_path / mod), mod, {"steps": 8, "orbit": True})
          for mod in ("tf", "tfd")]
  for mod, (exit_codes, restarted) in zip(("tf", "tfd"), _preempt_and_restart(
      runs, after_steps=3)):
    assert exit_codes == {0: RESTART_EXIT_CODE, 1: RESTART_EXIT_CODE}, mod
    # The action runs after each step: the one after the signal (step 4)
    # publishes the step, the next one saves, numbered by the step variable.
    _assert_resumed(restarted, saved_at=5, steps=8)
    assert restarted[0]["checkpoints"] == ["checkpoint", "ckpt-5.data-00000-of-00001",
                                           "ckpt-5.index"]


@pytest.mark.multi_worker
def test_one_worker_strategies_save_at_the_step_after_sigterm_and_resume(tmp_path):
  """MirroredStrategy (2 replicas) with tf.distribute and tfd,
  OneDeviceStrategy, and TPUStrategy on an emulated v4-8 slice (4 replicas; TensorFlow
  has no emulation): SIGTERM after step 2, saved at 3, resumed to 6."""
  kinds = [("mirrored", "tf"), ("mirrored", "tfd"), ("one_device", "tfd"), ("tpu", "tfd")]
  runs = [(LocalCluster(1, tmp_path / f"{kind}_{mod}"), mod,
           {"steps": 6, "kind": kind, "logical_cpus": 4}) for kind, mod in kinds]
  for (kind, mod), (exit_codes, restarted) in zip(
      kinds, _preempt_and_restart(runs, after_steps=2)):
    assert exit_codes == {0: RESTART_EXIT_CODE}, (kind, mod)
    _assert_resumed(restarted, saved_at=3, steps=6)


@pytest.mark.multi_worker
def test_grace_period_saves_at_once_trains_on_and_saves_again_before_it_ends(tmp_path):
  """A grace period of 1.5 s and steps of 50 ms, with a CheckpointManager
  keeping 2 checkpoints and an `exit_fn` exiting with 7: after SIGTERM at
  step 2 the handler saves at step 3, trains on, saves again and exits long
  before the 100 steps end, as TensorFlow's does."""
  args = {"steps": 100, "kind": "one_device", "grace_period": 1.5, "step_seconds": 0.05,
          "keep": 2, "exit_code": 7}
  runs = [(LocalCluster(1, tmp_path / mod), mod, args) for mod in ("tf", "tfd")]
  with _sigterm_to_last_workers(runs, SCENARIO, after_steps=2):
    exit_codes = [cluster.wait_for_exits(120) for cluster, _, _ in runs]
  for (cluster, mod, _), codes in zip(runs, exit_codes):
    assert codes == {0: 7}, mod
    first, final = _saved_runs(cluster.directory / "run" / "checkpoints")
    assert first == 3 and 3 < final < 100, mod


@pytest.mark.multi_worker
def test_on_google_cloud_without_gpus_sigterm_still_saves(tmp_path, google_cloud):
  """On a (fake) Google Cloud CPU VM TensorFlow's handler is off: SIGTERM
  ends the job unsaved. tfd's saves, exits with Google Cloud's restart
  code, and the restarted job resumes."""
  env = {"GCE_METADATA_IP": google_cloud.address}
  runs = [(LocalCluster(1, tmp_path / mod), mod, {"steps": 6, "kind": "one_device"})
          for mod in ("tf", "tfd")]
  with _sigterm_to_last_workers(runs, SCENARIO, after_steps=2, env=env):
    theirs, ours = [cluster.wait_for_exits(120) for cluster, _, _ in runs]
  assert theirs == {0: -signal.SIGTERM}
  assert ours == {0: GCE_RESTART_EXIT_CODE}
  assert _saved_runs(tmp_path / "tf" / "run" / "checkpoints") == []
  assert _saved_runs(tmp_path / "tfd" / "run" / "checkpoints") == [3]


def _result_or_exit_code(cluster, index, timeout):
  """Worker `index`'s result, or its exit code if it exited without one,
  waiting at most `timeout` seconds (another worker may have exited)."""
  path = cluster.directory / f"worker{index}.json"
  deadline = time.monotonic() + timeout
  while not path.exists():
    if cluster.exit_code(index) is not None:
      return cluster.exit_code(index)
    assert time.monotonic() < deadline, cluster.logs()
    time.sleep(0.05)
  return json.loads(path.read_text())


def test_preemption_watcher_without_a_cluster_has_no_message():
  for mod in (tf.distribute, tfd):
    watcher = mod.experimental.PreemptionWatcher()
    assert watcher.preemption_message is None
    watcher.block_until_worker_exit()  # returns at once


@pytest.mark.multi_worker
def test_sigterm_without_a_handler_and_the_preemption_watcher(tmp_path):
  """Worker 1 of 2 gets SIGTERM, with no handler. TensorFlow's runtime
  takes the signal: its worker 1 lives on, and its watcher, which works only
  on Google's TPU platform, has no message. A tfd worker ends, killed by the
  signal as a program that set no handler, after recording the notice:
  worker 0's watcher names it and returns from `block_until_worker_exit`
  once it no longer answers."""
  runs = [(LocalCluster(2, tmp_path / mod), mod, {"watch_seconds": watch_seconds})
          for mod, watch_seconds in (("tf", 3), ("tfd", 30))]
  with _sigterm_to_last_workers(runs, "preemption_scenarios.without_handler", after_steps=0):
    results = {mod: [_result_or_exit_code(cluster, index, timeout=90) for index in (0, 1)]
               for cluster, mod, _ in runs}
  lived_on = {"lived_on": True, "preemption_message": None, "blocked_until_exit": True}
  assert results["tf"] == [lived_on, lived_on]
  assert results["tfd"] == [dict(lived_on, preemption_message="/job:worker/task:1"),
                            -signal.SIGTERM]


# --- tf_keras's BackupAndRestore.

def _assert_weights(weights, expected):
  for ours, theirs in zip(weights, expected, strict=True):
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _fit_with_save_before_preemption(mod, backup_dir, save_freq="epoch"):
  """tf_keras's `fit`, 2 epochs of 3 steps (`verbose=0`) with
  `BackupAndRestore(backup_dir, save_freq, save_before_preemption=True)`
  under `mod`'s MultiWorkerMirroredStrategy on one worker; the model."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from keras_models import classification_data, classifier  # pylint: disable=g-import-not-at-top
  with mod.MultiWorkerMirroredStrategy().scope():
    model = classifier(tf_keras)
    model.compile(optimizer="sgd", loss=tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
  dataset = tf.data.Dataset.from_tensor_slices(classification_data(16)).batch(8).repeat()
  on_sigterm = signal.getsignal(signal.SIGTERM)
  try:
    model.fit(dataset, epochs=2, steps_per_epoch=3, verbose=0, callbacks=[
        tf_keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=save_freq,
                                            save_before_preemption=True)])
  finally:
    signal.signal(signal.SIGTERM, on_sigterm)  # a handler sets its own
  return model


def test_tf_keras_saves_before_preemption_with_tfds_handler_on_google_cloud(
    tmp_path, google_cloud):
  """On a (fake) Google Cloud CPU VM tf_keras turns `save_before_preemption`
  on for MultiWorkerMirroredStrategy, and with TensorFlow's, whose handler
  is off there, fails at the first step end it checks for a notice. With
  tfd's strategy tfd's handler counts every step, also where tf_keras would
  check none (`save_freq="epoch"` and `verbose=0`: no callback asks for the
  batch hooks)."""
  with pytest.raises(AttributeError, match="_run_counter"):
    _fit_with_save_before_preemption(tf.distribute, tmp_path / "tf", save_freq=2)
  for save_freq in (2, "epoch"):
    model = _fit_with_save_before_preemption(tfd, tmp_path / f"tfd_{save_freq}", save_freq)
    handler = model._preemption_handler  # pylint: disable=protected-access
    assert isinstance(handler, tfd.experimental.PreemptionCheckpointHandler)
    assert int(handler.total_run_calls) == 6


def test_tf_keras_saves_before_preemption_only_on_google_cloud(tmp_path, not_on_google_cloud):
  """Elsewhere tf_keras leaves `save_before_preemption` off, with
  TensorFlow's strategy and with tfd's: no handler is made."""
  for mod in (tf.distribute, tfd):
    model = _fit_with_save_before_preemption(mod, tmp_path / mod.__name__)
    assert not hasattr(model, "_preemption_handler"), mod


@pytest.mark.multi_worker
def test_tf_keras_backup_and_restore_resumes_after_sigterm(tmp_path):
  """`BackupAndRestore(save_freq=3)`, 2 epochs of 4 steps; the last worker
  gets SIGTERM after step 4. tfd's 2 workers stop: worker 1 ends by the
  signal, worker 0's next collective fails once worker 1 no longer answers.
  TensorFlow's ignore the signal and finish, an uninterrupted run. On one
  worker, MirroredStrategy, TensorFlow's and tfd's, the signal ends the
  process. Each restarted job resumes from the backup made after step 3,
  at the last step of epoch 0, runs the 5 steps left and ends with the
  weights of an uninterrupted run."""
  args = {"epochs": 2, "save_freq": 3}
  runs = {(kind, mod): (LocalCluster(workers, tmp_path / f"{kind}_{mod}"), mod,
                        dict(args, kind=kind))
          for kind, workers in (("multi_worker", 2), ("mirrored", 1)) for mod in ("tf", "tfd")}
  with _sigterm_to_last_workers(runs.values(), KERAS_SCENARIO, after_steps=4):
    first = {key: [_result_or_exit_code(cluster, index, timeout=90)
                   for index in range(cluster.num_workers)]
             for key, (cluster, _, _) in runs.items()}
  uninterrupted = keras_plain_weights(8)
  for result in first[("multi_worker", "tf")]:
    assert result["ran"] == [[epoch, batch] for epoch in range(2) for batch in range(4)]
    _assert_weights(result["weights"], uninterrupted)
  worker0, worker1 = first[("multi_worker", "tfd")]
  assert worker0["type"] == "UnavailableError" and "/task:1" in worker0["error"]
  assert worker1 == -signal.SIGTERM
  assert first[("mirrored", "tf")] == first[("mirrored", "tfd")] == [-signal.SIGTERM]
  restarted = [key for key in runs if key != ("multi_worker", "tf")]
  results = run_together([(cluster, KERAS_SCENARIO, mod, {"args": run_args})
                          for cluster, mod, run_args in (runs[key] for key in restarted)])
  for key, workers in zip(restarted, results):
    for result in workers.values():
      assert result.get("ran") == [[0, 3], [1, 0], [1, 1], [1, 2], [1, 3]], (key, result)
      _assert_weights(result["weights"], uninterrupted)


@pytest.mark.multi_worker
def test_tf_keras_saves_before_preemption_on_two_tfd_workers(tmp_path, google_cloud):
  """`BackupAndRestore(save_before_preemption=True)` on a (fake) Google Cloud
  VM: worker 1 of tfd's 2 gets SIGTERM after step 5 (epoch 1, batch 0);
  both save at step 6, the chief into the backup, and exit with Google
  Cloud's restart code. The restarted job restores the chief's backup on
  both workers, runs the last 2 steps and ends with the weights of an
  uninterrupted run. (TensorFlow's handler is off on a CPU VM, and tf_keras
  fails at the first step.)"""
  env = {"GCE_METADATA_IP": google_cloud.address}
  args = {"epochs": 2, "save_before_preemption": True}
  cluster = LocalCluster(2, tmp_path)
  with _sigterm_to_last_workers([(cluster, "tfd", args)], KERAS_SCENARIO, after_steps=5, env=env):
    assert cluster.wait_for_exits(90) == {0: GCE_RESTART_EXIT_CODE, 1: GCE_RESTART_EXIT_CODE}
  assert _saved_runs(tmp_path / "run" / "backup" / "chief") == [6]
  assert sorted(os.listdir(tmp_path / "run" / "backup")) == ["chief"]
  restarted = cluster.run(KERAS_SCENARIO, "tfd", args=args, env=env)
  uninterrupted = keras_plain_weights(8)
  for result in restarted.values():
    assert result.get("ran") == [[1, 2], [1, 3]], result
    assert result["handler"] == "tf_distribute_lite.failure_handling"
    _assert_weights(result["weights"], uninterrupted)
