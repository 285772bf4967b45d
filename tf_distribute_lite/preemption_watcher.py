"""`PreemptionWatcher`: a task's termination notice, from the coordination service."""

import logging
import threading
import time

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite.tf_classes import StandsFor

POLL_SECONDS = 1.0
# A lost task leaves the service within its heartbeat timeout.
EXIT_TIMEOUT_SECONDS = 3 * cluster_runtime.HEARTBEAT_TIMEOUT_SECONDS


class PreemptionWatcher(StandsFor, stands_for=tf.distribute.experimental.PreemptionWatcher):
  """Watches the joined cluster for a termination notice: `preemption_message`
  then names the task, such as "/job:worker/task:1" (TensorFlow 2.21's
  stays None off Google's TPU platform).

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

  preemption_message = property(lambda self: self._preemption_message,
                                doc="The task a termination notice came to, or None.")

  def _watch(self):
    try:
      while self._preemption_message is None:
        try:
          self._preemption_message = _tf_bridge.coordination_get(
              cluster_runtime.PREEMPTION_NOTICE_KEY, POLL_SECONDS)
        except tf.errors.DeadlineExceededError:
          pass  # no notice yet, but a service to ask
        self._has_service.set()
        self._checked.set()
    except tf.errors.FailedPreconditionError:
      logging.warning("PreemptionWatcher: this process has joined no cluster; "
                      "there is no termination notice to watch.")
    except tf.errors.OpError:
      pass  # the cluster is going away
    finally:
      self._checked.set()

  def block_until_worker_exit(self):
    """After a notice, waits (at most `EXIT_TIMEOUT_SECONDS`) until the
    preempted task no longer answers."""
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
