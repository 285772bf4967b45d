"""The strategies the tests run under: one table, by name, of TensorFlow's
strategy and tfd's of each kind.

A test file parametrizes over the names it needs (its ids are the names)
and takes the `run_mode` fixture (tests/conftest.py: eagerly and in a
`tf.function`) as the other axis. Each row makes a new strategy on the
process's 4 logical CPUs; `shared` makes one per process.

- Every TensorFlow MirroredStrategy here reduces with ReductionToOneDevice,
  as tfd's does on CPUs (the same sums, the same bits): TensorFlow's
  collective ops are for `oracle.tf_mirrored()` alone (tests/oracle.py).
- TensorFlow has no TPUStrategy without a TPU: tfd's, on an emulated v4-8
  (the 4 CPUs), is compared with TensorFlow's MirroredStrategy on them.
- A MultiWorkerMirroredStrategy is on one worker (no cluster is set).
- A contrib strategy is compared with TensorFlow's compat.v1 strategy of
  its kind (TensorFlow 2 has no contrib).

This module imports neither pytest nor conftest: programs that run in a
process of their own (tests/tf1_client_programs.py) take it too.
"""

import collections

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as tf_cross_device_ops

import tf_distribute_lite as tfd

PAIR = ("CPU:0", "CPU:1")
TF1 = tf.compat.v1.distribute


def new_tf_mirrored(devices=None, cross_device_ops=None, module=tf.distribute):
  """A new TF MirroredStrategy that never runs TF's collective ops.

  It reduces with `cross_device_ops`, by default `ReductionToOneDevice`.
  `module` may be `tf.compat.v1.distribute`.
  """
  if isinstance(cross_device_ops, tf_cross_device_ops.CollectiveAllReduce):
    raise ValueError("only oracle.tf_mirrored() may use TF's collective all-reduce")
  return module.MirroredStrategy(
      None if devices is None else list(devices),
      cross_device_ops=cross_device_ops or tf.distribute.ReductionToOneDevice())


def _new_tf1_mirrored(devices=None):
  return new_tf_mirrored(devices, module=TF1)


def _on_emulated_tpu(strategy_class):
  return lambda: strategy_class(tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8"))


Row = collections.namedtuple("Row", ["tf", "tfd"])  # each makes a new strategy

STRATEGIES = {
    "default": Row(tf.distribute.get_strategy, tfd.get_strategy),
    "mirrored": Row(new_tf_mirrored, tfd.MirroredStrategy),
    "mirrored_pair": Row(lambda: new_tf_mirrored(PAIR), lambda: tfd.MirroredStrategy(PAIR)),
    "one_device": Row(lambda: tf.distribute.OneDeviceStrategy("CPU:1"),
                      lambda: tfd.OneDeviceStrategy("CPU:1")),
    "central_storage": Row(tf.distribute.experimental.CentralStorageStrategy,
                           tfd.experimental.CentralStorageStrategy),
    "central_storage_pair": Row(
        lambda: tf.distribute.experimental.CentralStorageStrategy(PAIR),
        lambda: tfd.experimental.CentralStorageStrategy(PAIR)),
    "multi_worker": Row(tf.distribute.MultiWorkerMirroredStrategy,
                        tfd.MultiWorkerMirroredStrategy),
    "tpu": Row(new_tf_mirrored, _on_emulated_tpu(tfd.TPUStrategy)),
    "v1_mirrored": Row(_new_tf1_mirrored, tfd.compat.v1.MirroredStrategy),
    "v1_mirrored_pair": Row(lambda: _new_tf1_mirrored(PAIR),
                            lambda: tfd.compat.v1.MirroredStrategy(PAIR)),
    "v1_one_device": Row(lambda: TF1.OneDeviceStrategy("CPU:1"),
                         lambda: tfd.compat.v1.OneDeviceStrategy("CPU:1")),
    "v1_central_storage_pair": Row(
        lambda: TF1.experimental.CentralStorageStrategy(PAIR),
        lambda: tfd.compat.v1.experimental.CentralStorageStrategy(PAIR)),
    "v1_multi_worker": Row(TF1.experimental.MultiWorkerMirroredStrategy,
                           tfd.compat.v1.experimental.MultiWorkerMirroredStrategy),
    "v1_tpu": Row(_new_tf1_mirrored, _on_emulated_tpu(tfd.compat.v1.experimental.TPUStrategy)),
    "contrib_mirrored_pair": Row(lambda: _new_tf1_mirrored(PAIR),
                                 lambda: tfd.contrib.MirroredStrategy(PAIR)),
    "contrib_one_device": Row(lambda: TF1.OneDeviceStrategy("CPU:1"),
                              lambda: tfd.contrib.OneDeviceStrategy("CPU:1")),
}


def make(name, ours):
  """A new strategy of row `name`: tfd's if `ours`, else TensorFlow's."""
  row = STRATEGIES[name]
  return (row.tfd if ours else row.tf)()


_shared = {}


def shared(name, ours):
  """`make(name, ours)`, made once per process; rows with one maker share
  its strategy (TensorFlow's for "tpu" is that of "mirrored")."""
  row = STRATEGIES[name]
  maker = row.tfd if ours else row.tf
  if maker not in _shared:
    _shared[maker] = maker()
  return _shared[maker]
