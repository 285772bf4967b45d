"""`PreemptionCheckpointHandler`: on a termination notice at any worker,
every worker saves a checkpoint at the same step, then exits; a restarted
job restores it.

How the workers agree (several workers, through the coordination service's
key-value store of the cluster's runtime):

1. the first worker to get a notice claims the lead (`_LEAD_KEY`; a later
   claim finds the key set and leaves the lead to it);
2. before its next step the leader publishes the step to save after, one
   past the steps it has run (`_STEP_KEYS`), and waits until every worker
   has acknowledged it; in synchronous training no worker is more than one
   step apart, so none has passed it;
3. every worker's watcher thread reads the step and acknowledges it; each
   worker saves once it has run that many steps, then exits through
   `exit_fn`. With a grace period, they save, train on, and the leader
   publishes a second, final step shortly before the period ends.

One worker alone (MirroredStrategy, OneDeviceStrategy, TPUStrategy, whose
single client drives every TPU host) skips the store.
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
# The name under which the checkpoint keeps the number of `run` calls, as
# TensorFlow's handler names it: checkpoints of either restore in the other.
_RUN_COUNT_NAME = "checkpointed_runs"
# How often a custom watcher is called, and how long one wait of the watcher
# thread on the store lasts before it checks whether to stop.
POLL_SECONDS = 1.0
# How long the leader waits for every worker to acknowledge the step.
AGREEMENT_TIMEOUT_SECONDS = 60.0


class PreemptionCheckpointHandler(
    StandsFor, stands_for=tf.distribute.experimental.PreemptionCheckpointHandler):
  """Saves a checkpoint on every worker at the same step when any worker
  gets a termination notice (SIGTERM by default), then exits.

  Args:
    cluster_resolver: the strategy's `cluster_resolver` (None, or an empty
      cluster, for one worker).
    checkpoint_or_checkpoint_manager: a `tf.train.Checkpoint`, saved into
      `checkpoint_dir`, or a `tf.train.CheckpointManager`.
    checkpoint_dir: where a `tf.train.Checkpoint` is saved and restored
      from. Workers other than the chief save into a temporary folder next
      to it and remove it.
    termination_config: a `TerminationConfig` for what the platform's
      defaults do not fit.

  The latest checkpoint in the folder is restored at once. Call each
  training step through `run` (or call `save_checkpoint_if_preempted` after
  each): when a notice has come, the workers save at the first step every
  one of them can reach, the one after the notice, and exit through
  `exit_fn` (`sys.exit(42)` by default, 143 on Google Cloud).

  Unlike TensorFlow 2.21, which turns the handler off on a Google Cloud VM
  without GPUs (its `run` only calls the function and a SIGTERM ends the job
  unsaved), the handler works there too, on SIGTERM.

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

  @property
  def total_run_calls(self):
    """How many times `run` (or `save_checkpoint_if_preempted`) was called,
    counting those before a restart, restored from the checkpoint."""
    return self._run_counter

  def run(self, distributed_train_function, *args, **kwargs):
    """`distributed_train_function(*args, **kwargs)`, one training step,
    first saving and exiting if a termination notice calls for it. Its
    result and errors pass through unchanged; on several workers an error
    also fails the others' waits at once.
    """
    with self.watch_preemption_scope():
      self._check_preemption_and_maybe_checkpoint()
      start = time.monotonic()
      result = distributed_train_function(*args, **kwargs)
      self._run_counter += 1
      self._estimated_run_time += (
          time.monotonic() - start - self._estimated_run_time) / self._run_counter
    return result

  def save_checkpoint_if_preempted(self, *args, **kwargs):
    """Saves a checkpoint and exits if a termination notice calls for it;
    call it after each training step instead of using `run`. `args` and
    `kwargs` go to `tf.train.CheckpointManager.save` (or to `save_fn`)."""
    self._check_preemption_and_maybe_checkpoint(*args, **kwargs)
    self._run_counter += 1
    self._estimated_run_time = 0.0

  @contextlib.contextmanager
  def watch_preemption_scope(self):
    """A scope in which a TensorFlow error, on several workers, is also
    reported to the others (their waits fail at once), then raised."""
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
    """This worker got a notice: it leads, unless another one already does."""
    if self._task.task_type is not None:
      cluster_runtime.publish_preemption_notice(self._task.task_type, self._task.task_id)
      try:
        _tf_bridge.coordination_set(_LEAD_KEY, str(self._task.worker_index))
      except tf.errors.AlreadyExistsError:
        return
    self._own_notice_time = time.time()
    self._own_notice.set()

  def _watch_step_keys(self):
    """Reads each step to save at from the store and acknowledges it."""
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
        _tf_bridge.coordination_get(f"{key}_ACK_{worker}",
                                    max(deadline - time.monotonic(), 0.001))
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
    """The chief's manager, or one that writes into a temporary folder (the
    others' saves read the same distributed variables, so they must save)."""
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
  """The checkpoint the handler saves, with a clear error for bad input."""
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
  """A `tf.train.Checkpoint` came without `checkpoint_dir`: TensorFlow means
  to raise `InvalidArgumentError` and, through a bug, raises `TypeError`; this
  error is both."""


def _task_layout(resolver):
  """Where this worker stands among those that agree on a step to save at;
  a TPU's single client, or a process without a cluster, stands alone."""
  if resolver is None or hasattr(resolver, "get_tpu_system_metadata"):
    return Layout()
  spec = resolver.cluster_spec()
  if "ps" in spec.jobs:
    raise NotImplementedError(
        "PreemptionCheckpointHandler does not support a cluster with a 'ps' "
        "job (ParameterServerStrategy); it handles MultiWorkerMirroredStrategy, "
        f"MirroredStrategy, OneDeviceStrategy and TPUStrategy. Cluster: {spec.as_dict()}.")
  return cluster_runtime.task_layout(spec, resolver.task_type, resolver.task_id)

