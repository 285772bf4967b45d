"""tfd objects are instances of the public TensorFlow classes they stand for
(`tf_classes.py`), and of no others."""

import enum
import inspect
import pickle

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import tf_classes

import oracle
import strategies
from test_namespace import NAMESPACES


def _class_pairs():
  """(name, tfd class, TF class) for every public class whose TF
  counterpart is another class, but enums and named tuples."""
  pairs = {}
  for ours, theirs, _ in NAMESPACES:
    for name in dir(theirs):
      mine, tfs = getattr(ours, name, None), getattr(theirs, name)
      if (name.startswith("_") or not inspect.isclass(tfs) or mine is tfs
          or issubclass(tfs, (enum.Enum, tuple))):
        continue
      pairs[f"{theirs.__name__.split('v2.')[-1]}.{name}"] = (mine, tfs)
  return pairs


CLASS_PAIRS = _class_pairs()
# Every public TensorFlow class of tf.distribute, to ask each object about.
TF_CLASSES = sorted({tfs for _, tfs in CLASS_PAIRS.values()}, key=repr)


@pytest.mark.parametrize("name", sorted(CLASS_PAIRS))
def test_each_class_answers_isinstance_for_exactly_tensorflows_classes(name):
  """A tfd class's instances are instances of the TensorFlow class it stands
  for and of exactly the public TensorFlow classes that class derives from."""
  ours, theirs = CLASS_PAIRS[name]
  reported = tf_classes.reported_class(ours)
  assert {c for c in TF_CLASSES if issubclass(reported, c)} == {
      c for c in TF_CLASSES if issubclass(theirs, c)}
  assert issubclass(reported, ours) and reported.__name__ == ours.__name__


# Rows of tests/strategies.py, each strategy made once.
STRATEGIES = ["mirrored", "one_device", "central_storage", "default", "v1_mirrored"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategies_and_their_parts_answer_isinstance_as_tensorflows(name):
  def answers(ours):
    strategy = strategies.shared(name, ours)
    seen = strategy.run(lambda: tf.distribute.get_replica_context())
    context = strategy.experimental_local_results(seen)[0]
    return [[isinstance(obj, c) for c in TF_CLASSES]
            for obj in (strategy, strategy.extended, context)]
  oracle.compare(answers, (False,), (True,))


def test_tpu_strategy_is_tensorflows_tpu_strategy():
  resolver = tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  strategy = tfd.TPUStrategy(resolver)
  assert isinstance(strategy, tf.distribute.TPUStrategy)
  assert isinstance(strategy, tf.distribute.Strategy)
  assert not isinstance(strategy, tf.distribute.MirroredStrategy)
  assert isinstance(resolver, tf.distribute.cluster_resolver.TPUClusterResolver)


def test_every_strategy_is_an_instance_of_its_deprecated_experimental_variant():
  """As in TensorFlow; the variant stays a subclass only, not a base."""
  class MyStrategy(tfd.MultiWorkerMirroredStrategy):
    pass
  resolver = tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  multi_worker = tfd.experimental.MultiWorkerMirroredStrategy
  for strategy, variant in ((tfd.MultiWorkerMirroredStrategy(), multi_worker),
                            (MyStrategy(), multi_worker),
                            (tfd.TPUStrategy(resolver), tfd.experimental.TPUStrategy)):
    assert isinstance(strategy, variant) and not issubclass(type(strategy), variant)
    assert strategy.__class__.__name__ == type(strategy).__name__
  assert not isinstance(tfd.compat.v1.experimental.TPUStrategy(resolver), tfd.experimental.TPUStrategy)
  assert not isinstance(tfd.MirroredStrategy(), multi_worker)


def test_type_and_behaviour_stay_tfds():
  strategy = tfd.OneDeviceStrategy("/cpu:0")
  assert type(strategy) is tfd.OneDeviceStrategy
  assert not hasattr(strategy, "_device_map")  # no TensorFlow attribute leaks in
  assert tf_classes.reported_class(type(strategy)) is strategy.__class__
  assert repr(strategy.__class__) == (
      "<class 'tf_distribute_lite.one_device_strategy.OneDeviceStrategy'>")


def test_a_users_subclass_stands_for_what_its_parent_stands_for():
  class MyStrategy(tfd.OneDeviceStrategy):
    pass
  mine = MyStrategy("/cpu:0")
  assert isinstance(mine, tf.distribute.OneDeviceStrategy)
  assert isinstance(mine, MyStrategy) and mine.__class__.__name__ == "MyStrategy"


def test_objects_that_tensorflow_pickles_still_pickle():
  partitioner = tfd.experimental.partitioners.FixedShardsPartitioner(2)
  restored = pickle.loads(pickle.dumps(tfd.InputOptions()))
  assert restored == tfd.InputOptions()
  assert isinstance(partitioner, tf.distribute.experimental.partitioners.Partitioner)


@pytest.mark.parametrize("name", STRATEGIES)
def test_tf_keras_tells_strategies_apart_as_under_tensorflow(name):
  """tf_keras allows `mixed_float16`, backs training up and gathers
  predictions by `isinstance` against TensorFlow's classes."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from tf_keras.src.engine import training  # pylint: disable=g-import-not-at-top
  def answers(ours):
    strategy = strategies.shared(name, ours)
    with strategy.scope():
      try:
        tf_keras.layers.Dense(1, dtype="mixed_float16")
        mixed = "allowed"
      except ValueError as e:
        mixed = str(e)
    backup = tf_keras.callbacks.BackupAndRestore("unused")
    return (mixed, isinstance(strategy, backup._supported_strategies),  # pylint: disable=protected-access
            training._collective_all_reduce_multi_worker(strategy))  # pylint: disable=protected-access
  oracle.compare(answers, (False,), (True,))
