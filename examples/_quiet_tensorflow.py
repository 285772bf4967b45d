"""Starts TensorFlow without its start-up log lines; the examples import it
before anything else.

TensorFlow 2.21 logs its oneDNN and CUDA-driver notices as it loads, before
it reads `TF_CPP_MIN_LOG_LEVEL`, so no log level silences them; without a
GPU, finding the devices then logs a failed `cuInit` as an error. A newcomer
reads them as failures. Unless `TF_CPP_MIN_LOG_LEVEL` is set (then
TensorFlow logs as that level says), this sets it to 2 (errors only) and
imports TensorFlow and lists its devices while passing on to stderr all but
those lines.
"""

import contextlib
import os
import re
import sys
import threading

# absl's format: severity, date, time, thread, file:line]
_LOG_LINE = re.compile(rb"([IWEF])\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] (.*)")


def _is_start_up_line(line):
  if line.startswith(b"WARNING: All log messages before absl::InitializeLog()"):
    return True
  match = _LOG_LINE.match(line)
  if not match:
    return False
  severity, source, message = match.groups()
  return severity in b"IW" or (source == b"cuda_platform.cc" and
                               message.startswith(b"failed call to cuInit"))


@contextlib.contextmanager
def _start_up_lines_dropped():
  """Runs the block with stderr (the file descriptor, which TensorFlow's C++
  code writes to) passed on line by line, less start-up lines."""
  sys.stderr.flush()
  stderr = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)

  def pass_on():
    with os.fdopen(read_end, "rb") as lines:
      for line in lines:
        if not _is_start_up_line(line):
          os.write(stderr, line)
  thread = threading.Thread(target=pass_on, daemon=True)
  thread.start()
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(stderr, 2)  # closes the pipe: `pass_on` reads to its end
    thread.join(timeout=10)
    os.close(stderr)


if "TF_CPP_MIN_LOG_LEVEL" not in os.environ and "tensorflow" not in sys.modules:
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
  with _start_up_lines_dropped():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()
