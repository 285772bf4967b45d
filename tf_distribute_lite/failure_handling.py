"""`PreemptionCheckpointHandler`: on a termination notice at any worker,
every worker saves a checkpoint at the same step, then exits.

Workers agree through the coordination service: the first with a notice
leads (`_LEAD_KEY`), publishes the step after its next (`_STEP_KEYS`; no
worker is more than a step apart) and waits for every worker's ack. With a
grace period, a final step follows shortly before it ends.
"""

import contextlib
import os
import threading
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import gce_metadata
from tf_distribute_lite import termination_config as termination_config_lib
from tf_distribute_lite.cluster_resolver import cluster_resolver as cluster_resolver_lib
from tf_distribute_lite.layout import Layout
from tf_distribute_lite.tf_classes import StandsFor

_PREFIX = "TF_DISTRIBUTE_LITE_PREEMPTION"
_LEAD_KEY = f"{_PREFIX}_LEADER"
_STEP_KEYS = (f"{_PREFIX}_STEP", f"{_PREFIX}_FINAL_STEP")
# The checkpoint's count of `run` calls, named as by TensorFlow's handler.
_RUN_COUNT_NAME = "checkpointed_runs"
# How often a custom watcher is called, and how long one wait on the store lasts.
POLL_SECONDS = 1.0
# How long the leader waits for every worker to acknowledge the step.
AGREEMENT_TIMEOUT_SECONDS = 60.0


class PreemptionCheckpointHandler(
    StandsFor, stands_for=tf.distribute.experimental.PreemptionCheckpointHandler):
  """Saves a checkpoint on every worker at the same step when any worker
  gets a termination notice (SIGTERM by default), then exits.

  Args:
    cluster_resolver: the strategy's `cluster_resolver` (None: one worker).
    checkpoint_or_checkpoint_manager: a `tf.train.CheckpointManager`, or a
      `tf.train.Checkpoint` saved into and restored from `checkpoint_dir`.
    termination_config: a `TerminationConfig`, for the platform's defaults.

  Call each step through `run` (or `save_checkpoint_if_preempted` after
  it): after a notice the workers save after the next step and exit through
  `exit_fn`. (TensorFlow 2.21 turns the handler off on a Google Cloud VM
  without GPUs; this one works there too.)

  >>> import tempfile
  >>> step = tf.Variable(0)
  >>> never = termination_config_lib.TerminationConfig(termination_watcher_fn=lambda: False)
  >>> handler = PreemptionCheckpointHandler(
  ...     None, tf.train.Checkpoint(step=step), tempfile.mkdtemp(), never)
  >>> for _ in range(3):
  ...   _ = handler.run(lambda: step.assign_add(1))
  >>> int(step.numpy()), int(handler.total_run_calls)
  (3, 3)
  """

  def __init__(self, cluster_resolver, checkpoint_or_checkpoint_manager,
               checkpoint_dir=None, termination_config=None):
    checkpoint = _checkpoint_of(checkpoint_or_checkpoint_manager, checkpoint_dir)
    if termination_config is not None and not isinstance(
        termination_config, termination_config_lib.TerminationConfig):
      raise TypeError("termination_config must be a tf.distribute.experimental."
                      f"TerminationConfig or None; received: {termination_config!r}.")
    if cluster_resolver is not None:
      cluster_resolver_lib.check_resolver(cluster_resolver)
    self._cluster_resolver = cluster_resolver
    self._task = _task_layout(cluster_resolver)
    self._platform = gce_metadata.detect_platform()
    self._termination = termination_config_lib.complete(termination_config, self._platform)
    self._checkpoint = checkpoint
    if isinstance(checkpoint_or_checkpoint_manager, tf.train.CheckpointManager):
      self._read_checkpoint_manager = checkpoint_or_checkpoint_manager
    else:
      self._read_checkpoint_manager = tf.train.CheckpointManager(
          checkpoint, directory=checkpoint_dir, max_to_keep=1)
    if not hasattr(checkpoint, _RUN_COUNT_NAME):
      setattr(checkpoint, _RUN_COUNT_NAME, tf.Variable(
          tf.constant(0, dtype=tf.int64), trainable=False, name=_RUN_COUNT_NAME))
    self._checkpointed_runs = getattr(checkpoint, _RUN_COUNT_NAME)
    self._read_checkpoint_manager.restore_or_initialize()
    self._run_counter = self._checkpointed_runs.numpy()
    self._estimated_run_time = 0.0
    self._final_countdown = False
    self._own_notice_time = None
    self._deadline = None
    self._step_to_save = None
    self._own_notice = threading.Event()
    self._step_received = threading.Event()
    self._stop = threading.Event()
    self._threads = []
    if self._task.task_type is not None:
      self._start_thread(self._watch_step_keys, "PeerTerminationWatcher")
    if self._termination.watcher_fn:
      self._start_thread(self._poll_watcher_fn, "WorkerTerminationSignalWatcher")
    else:
      cluster_runtime.on_sigterm(self._claim_lead)

  total_run_calls = property(lambda self: self._run_counter,
                             doc="How many steps were run, counting those before a restart.")

  def run(self, distributed_train_function, *args, **kwargs):
    """Runs one training step, first saving and exiting if a notice calls
    for it; an error also fails the other workers' waits."""
    with self.watch_preemption_scope():
      self._check_preemption_and_maybe_checkpoint()
      start = time.monotonic()
      result = distributed_train_function(*args, **kwargs)
      self._run_counter += 1
      self._estimated_run_time += (
          time.monotonic() - start - self._estimated_run_time) / self._run_counter
    return result

  def save_checkpoint_if_preempted(self, *args, **kwargs):
    """Saves and exits if a notice calls for it; call it after each step
    instead of `run`. The arguments go to the save."""
    self._check_preemption_and_maybe_checkpoint(*args, **kwargs)
    self._run_counter += 1
    self._estimated_run_time = 0.0

  @contextlib.contextmanager
  def watch_preemption_scope(self):
    """A scope reporting a TensorFlow error to the other workers."""
    try:
      yield
    except tf.errors.OpError as error:
      if self._task.task_type is not None:
        with contextlib.suppress(Exception):
          _tf_bridge.report_error_to_cluster(error)
      raise

  # --- Notices.

  def _start_thread(self, target, name):
    thread = threading.Thread(target=target, name=f"{name}-{self._task.worker_index}", daemon=True)
    self._threads.append(thread)
    thread.start()

  def _poll_watcher_fn(self):
    while not self._stop.is_set() and not self._final_countdown:
      if self._termination.watcher_fn():
        self._claim_lead()
        return
      self._stop.wait(POLL_SECONDS)

  def _claim_lead(self):
    if self._task.task_type is not None:
      cluster_runtime.publish_preemption_notice(self._task.task_type, self._task.task_id)
      try:
        _tf_bridge.coordination_set(_LEAD_KEY, str(self._task.worker_index))
      except tf.errors.AlreadyExistsError:
        return
    self._own_notice_time = time.time()
    self._own_notice.set()

  def _watch_step_keys(self):
    for key in _STEP_KEYS[:2 if self._termination.grace_period > 0 else 1]:
      value = self._wait_for_key(key)
      if value is None:
        return
      self._step_to_save = int(value)
      self._step_received.set()
      _tf_bridge.coordination_set(f"{key}_ACK_{self._task.worker_index}", "1")

  def _wait_for_key(self, key):
    while not self._stop.is_set():
      try:
        return _tf_bridge.coordination_get(key, POLL_SECONDS)
      except tf.errors.DeadlineExceededError:
        continue
      except tf.errors.OpError:  # the cluster is going away
        return None
    return None

  # --- Saving.

  def _check_preemption_and_maybe_checkpoint(self, *args, **kwargs):
    if self._step_received.is_set():
      if self._step_to_save == self._run_counter:
        self._save(*args, **kwargs)
        if self._termination.grace_period <= 0 or self._final_countdown:
          self._exit()
          return  # an `exit_fn` that returns lets training go on
        self._final_countdown = True
        self._step_received.clear()
    elif self._own_notice.is_set():
      if self._final_countdown and time.time() < self._deadline:
        return
      self._publish_step(self._run_counter + 1)
      if self._termination.grace_period > 0 and not self._final_countdown:
        # Time for the other workers, up to two steps behind, to save.
        self._deadline = (self._own_notice_time + self._termination.grace_period
                          - 6 * self._estimated_run_time)

  def _publish_step(self, step):
    if self._task.task_type is None:
      self._step_to_save = step
      self._step_received.set()
      return
    key = _STEP_KEYS[1 if self._final_countdown else 0]
    _tf_bridge.coordination_set(key, str(step))
    deadline = time.monotonic() + AGREEMENT_TIMEOUT_SECONDS
    for worker in range(self._task.num_workers):
      try:
        _tf_bridge.coordination_get(f"{key}_ACK_{worker}", max(deadline - time.monotonic(), 0.001))
      except tf.errors.DeadlineExceededError:
        raise tf.errors.DeadlineExceededError(
            None, None, f"Worker {worker} of the cluster did not acknowledge the "
            f"step to save at ({step}) within {AGREEMENT_TIMEOUT_SECONDS:g} s of "
            f"a termination notice.") from None

  def _save(self, *args, **kwargs):
    self._checkpointed_runs.assign(self._run_counter)
    manager = self._write_checkpoint_manager()
    try:
      if self._termination.save_fn:
        self._termination.save_fn(*args, **kwargs)
      else:
        manager.save(*args, **kwargs)
        self._checkpoint.sync()  # an asynchronous save completes before exit
    except tf.errors.OpError as error:
      raise type(error)(None, None, f"PreemptionCheckpointHandler could not save "
                        f"a checkpoint into {manager.directory!r}: {error.message}") from error
    finally:
      temporary = os.path.dirname(manager.directory)
      if manager is not self._read_checkpoint_manager and tf.io.gfile.exists(temporary):
        tf.io.gfile.rmtree(temporary)

  def _write_checkpoint_manager(self):
    """The chief's manager, else one writing into a temporary folder."""
    if self._task.is_chief:
      return self._read_checkpoint_manager
    given = self._read_checkpoint_manager.directory.rstrip("/")
    temporary = os.path.join(os.path.dirname(given), f"workertemp_{self._task.task_id}",
                             os.path.basename(given))
    return tf.train.CheckpointManager(self._checkpoint, temporary, max_to_keep=1)

  def _exit(self):
    self._stop_watching()
    self._termination.exit_fn()

  def _stop_watching(self):
    self._stop.set()
    for thread in self._threads:
      if thread is not threading.current_thread():
        thread.join(2 * POLL_SECONDS)
    self._threads = []

  def __del__(self):
    if getattr(self, "_stop", None) is not None:
      self._stop_watching()


def _checkpoint_of(checkpoint_or_checkpoint_manager, checkpoint_dir):
  if isinstance(checkpoint_or_checkpoint_manager, tf.train.CheckpointManager):
    return checkpoint_or_checkpoint_manager.checkpoint
  if not isinstance(checkpoint_or_checkpoint_manager, tf.train.Checkpoint):
    raise TypeError(
        "checkpoint_or_checkpoint_manager must be a tf.train.Checkpoint or a "
        f"tf.train.CheckpointManager; received: {checkpoint_or_checkpoint_manager!r}.")
  if not checkpoint_dir:
    raise MissingCheckpointDirError(
        None, None, "checkpoint_dir must be given with a tf.train.Checkpoint (the "
        "folder to save it into and restore it from); received: "
        f"checkpoint_dir={checkpoint_dir!r}. Alternatively pass a "
        "tf.train.CheckpointManager as checkpoint_or_checkpoint_manager.")
  return checkpoint_or_checkpoint_manager


class MissingCheckpointDirError(tf.errors.InvalidArgumentError, TypeError):
  """No `checkpoint_dir`: TensorFlow means `InvalidArgumentError` and raises
  `TypeError`; this is both."""


def _task_layout(resolver):
  """This worker among those that agree on a step (a TPU client: alone)."""
  if resolver is None or hasattr(resolver, "get_tpu_system_metadata"):
    return Layout()
  spec = resolver.cluster_spec()
  if "ps" in spec.jobs:
    raise NotImplementedError(
        "PreemptionCheckpointHandler does not support a cluster with a 'ps' "
        "job (ParameterServerStrategy); it handles MultiWorkerMirroredStrategy, "
        f"MirroredStrategy, OneDeviceStrategy and TPUStrategy. Cluster: {spec.as_dict()}.")
  return cluster_runtime.task_layout(spec, resolver.task_type, resolver.task_id)

