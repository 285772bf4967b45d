"""Warnings for deprecated names, logged once per name as TensorFlow does."""

import threading

import tensorflow as tf

_warned = set()
_lock = threading.Lock()


def warn_once(name, instructions):
  """Logs once that `name` is deprecated, with `instructions`.

  >>> warn_once("Strategy.unwrap", "use `experimental_local_results` instead.")
  """
  with _lock:
    if name in _warned:
      return
    _warned.add(name)
  tf.get_logger().warning(
      "%s is deprecated and will be removed in a future version.\n"
      "Instructions for updating:\n%s", name, instructions)
