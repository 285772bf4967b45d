"""`TerminationConfig` and each platform's defaults."""

import dataclasses
import numbers
import sys
from typing import Callable, Optional

import tensorflow as tf

from tf_distribute_lite import gce_metadata
from tf_distribute_lite.tf_classes import StandsFor


class TerminationConfig(StandsFor, stands_for=tf.distribute.experimental.TerminationConfig):
  """Customizes `PreemptionCheckpointHandler` for a platform.

  Args:
    termination_watcher_fn: polled each second, True after a notice; by
      default SIGTERM (a Google Cloud GPU VM's maintenance notice).
    exit_fn: by default `sys.exit(42)` (143 on Google Cloud).
    grace_period: seconds from notice to termination (by default 0; 3600 on
      a Google Cloud GPU VM); if positive, the handler saves twice.
    save_fn: replaces the handler's own save.

  >>> TerminationConfig(grace_period=-1)
  Traceback (most recent call last):
  ...
  ValueError: grace_period must be a number of seconds >= 0 (or None for the platform's default); received: grace_period=-1.
  """

  def __init__(self, termination_watcher_fn=None, exit_fn=None, grace_period=None, save_fn=None):
    for name, value in (("termination_watcher_fn", termination_watcher_fn),
                        ("exit_fn", exit_fn), ("save_fn", save_fn)):
      if value is not None and not callable(value):
        raise TypeError(f"{name} must be a function (or None for the default); "
                        f"received: {name}={value!r}.")
    if grace_period is not None and (
        isinstance(grace_period, bool) or not isinstance(grace_period, numbers.Real)
        or not grace_period >= 0):
      raise ValueError("grace_period must be a number of seconds >= 0 (or None "
                       f"for the platform's default); received: grace_period={grace_period!r}.")
    self.termination_watcher_fn = termination_watcher_fn
    self.exit_fn = exit_fn
    self.grace_period = grace_period
    self.save_fn = save_fn


@dataclasses.dataclass(frozen=True)
class Termination:
  """A `TerminationConfig` completed (`watcher_fn` None: SIGTERM)."""
  watcher_fn: Optional[Callable[[], bool]]
  exit_fn: Callable[[], None]
  grace_period: float
  save_fn: Optional[Callable[..., None]]


def exit_for_restart():
  sys.exit(gce_metadata.RESTART_EXIT_CODE)


def exit_for_restart_on_google_cloud():
  sys.exit(gce_metadata.GCE_RESTART_EXIT_CODE)


def complete(config, platform):
  """`config` (or None) completed with `platform`'s defaults.

  >>> done = complete(None, gce_metadata.Platform.OTHER)
  >>> done.watcher_fn, done.exit_fn.__name__, done.grace_period
  (None, 'exit_for_restart', 0)
  """
  config = config or TerminationConfig()
  watcher_fn, exit_fn, grace_period = None, exit_for_restart, 0
  if platform is gce_metadata.Platform.GCE_GPU:
    watcher_fn = gce_metadata.maintenance_imminent
    grace_period = gce_metadata.GCE_GRACE_PERIOD_SECONDS
  if platform.on_google_cloud:
    exit_fn = exit_for_restart_on_google_cloud
  return Termination(
      watcher_fn=config.termination_watcher_fn or watcher_fn,
      exit_fn=config.exit_fn or exit_fn,
      grace_period=grace_period if config.grace_period is None else config.grace_period,
      save_fn=config.save_fn)
