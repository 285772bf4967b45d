"""Where a job runs (a Google Cloud VM with or without GPUs, or elsewhere) and
whether its host announces a stopping maintenance (short timeouts, no retry)."""

import enum
import threading

import tensorflow as tf

from tf_distribute_lite import cloud_http

PROBE_SECONDS = 2.0
# TensorFlow's restart exit codes, on Google Cloud and elsewhere.
GCE_RESTART_EXIT_CODE = 143
RESTART_EXIT_CODE = 42
# The notice a GPU VM gets before host maintenance stops it.
GCE_GRACE_PERIOD_SECONDS = 3600


class Platform(enum.Enum):
  """Where the job runs, as far as preemption goes.

  >>> Platform.GCE_CPU.on_google_cloud
  True
  """
  GCE_GPU = "GCE_GPU"
  GCE_CPU = "GCE_CPU"  # and Cloud TPU VMs
  OTHER = "OTHER"

  @property
  def on_google_cloud(self):
    return self is not Platform.OTHER


_answers = {}  # metadata server -> whether it answered as Google Cloud's


def on_google_cloud():
  """Whether the metadata server answers, as on a Google Cloud VM.

  >>> import os
  >>> os.environ["GCE_METADATA_IP"] = "127.0.0.1:1"  # nothing listens there
  >>> on_google_cloud()
  False
  >>> del os.environ["GCE_METADATA_IP"]
  """
  root = cloud_http.metadata_root()
  if root not in _answers:
    answered = []

    def probe():
      try:
        cloud_http.metadata("instance/hostname", timeout=PROBE_SECONDS / 2, retries=0)
        answered.append(True)
      except (OSError, ValueError):
        pass
    thread = threading.Thread(target=probe, name="GceMetadataProbe", daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS)
    _answers[root] = bool(answered)
  return _answers[root]


def detect_platform():
  """The `Platform` this process runs on."""
  if not on_google_cloud():
    return Platform.OTHER
  if tf.config.list_logical_devices("GPU"):
    return Platform.GCE_GPU
  return Platform.GCE_CPU


def maintenance_imminent():
  """Whether the host announces a maintenance that stops this (GPU) VM."""
  try:
    event = cloud_http.metadata("instance/maintenance-event", timeout=PROBE_SECONDS / 2, retries=0)
  except (OSError, ValueError):
    return False
  return event == "TERMINATE_ON_HOST_MAINTENANCE"
