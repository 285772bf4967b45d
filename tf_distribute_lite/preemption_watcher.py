"""`PreemptionWatcher`: tells a program that a task of its cluster got a
termination notice, through the coordination service of the cluster's
runtime, and waits until the preempted tasks are gone."""

import logging
import threading
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite.tf_classes import StandsFor

# How long one wait on the coordination service lasts before the watcher
# checks whether to stop.
POLL_SECONDS = 1.0
# A lost task fails the service within its heartbeat timeout; this bounds
# `block_until_worker_exit`.
EXIT_TIMEOUT_SECONDS = 3 * cluster_runtime.HEARTBEAT_TIMEOUT_SECONDS


class PreemptionWatcher(StandsFor, stands_for=tf.distribute.experimental.PreemptionWatcher):
  """Watches the cluster for a termination notice and keeps its message.

  Make it after the strategy has joined the cluster. A task that gets
  SIGTERM records a notice in the cluster's coordination service (see
  `cluster_runtime`), as does a `PreemptionCheckpointHandler` that gets its
  notice; `preemption_message` then names that task, such as
  "/job:worker/task:1". TensorFlow 2.21's watcher works only on Google's
  internal TPU platform and elsewhere stays None.

  Without a cluster there is no notice to watch: `preemption_message`
  stays None and `block_until_worker_exit` returns at once.

  >>> watcher = PreemptionWatcher()  # no cluster here
  >>> watcher.preemption_message is None
  True
  >>> watcher.block_until_worker_exit()
  """

  def __init__(self):
    self._preemption_message = None
    self._has_service = threading.Event()
    self._checked = threading.Event()
    threading.Thread(target=self._watch, name="PreemptionWatcher", daemon=True).start()
    self._checked.wait(2 * POLL_SECONDS)

  @property
  def preemption_message(self):
    """The task a termination notice came to (a string), or None."""
    return self._preemption_message

  def _watch(self):
    while True:
      try:
        message = _tf_bridge.coordination_get(cluster_runtime.PREEMPTION_NOTICE_KEY,
                                              POLL_SECONDS)
      except tf.errors.DeadlineExceededError:
        self._has_service.set()
        self._checked.set()
        continue
      except tf.errors.FailedPreconditionError:
        logging.warning("PreemptionWatcher: this process has joined no cluster; "
                        "there is no termination notice to watch.")
        self._checked.set()
        return
      except tf.errors.OpError:  # the cluster is going away
        self._checked.set()
        return
      self._preemption_message = message
      self._has_service.set()
      self._checked.set()
      return

  def block_until_worker_exit(self):
    """After a notice, waits until the preempted task no longer answers, at most `EXIT_TIMEOUT_SECONDS`
    (`tf.errors.DeadlineExceededError` after that); without a notice or a
    cluster, returns at once."""
    if not self._has_service.is_set() or self._preemption_message is None:
      return
    job, _, index = self._preemption_message.strip("/").replace("job:", "").partition("/task:")
    task = cluster_runtime.task_name(job, int(index))
    deadline = time.monotonic() + EXIT_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
      if not _tf_bridge.task_answers(task, min(POLL_SECONDS, deadline - time.monotonic())):
        return
      time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
    raise tf.errors.DeadlineExceededError(
        None, None, f"The preempted task {self._preemption_message} was still "
        f"part of the cluster {EXIT_TIMEOUT_SECONDS:g} s after its termination notice.")
