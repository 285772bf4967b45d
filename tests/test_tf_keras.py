"""tf_keras (Keras 2) under every tfd strategy gives what it gives under
`tf.distribute`: the cases of tests/tf_keras_cases.py (fit, evaluate and
predict on each kind of input, callbacks, metrics, custom loops with both
kinds of optimizers, saving, mixed precision, sharpness-aware minimization)
run under a TF strategy and the same tfd strategy, and their histories,
weights, predictions, files and exceptions are compared. TF has no TPUStrategy without a TPU: ours runs on
an emulated v4-8 (the 4 CPUs) and, in a process of its own, on an emulated
v3-8 (8 CPUs), against TF's MirroredStrategy on the same devices. Then the
private strategy names tf_keras reads (docs/client_private_names.md)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

import tf_distribute_lite as tfd

import oracle
import tf_keras_cases
from tf_keras_cases import ABSENT
from tf_keras_cases import CASES

HERE = os.path.dirname(os.path.abspath(__file__))
PAIR = ("CPU:0", "CPU:1")
# TF and tfd reduce alike: the same bits. TPUStrategy and MirroredStrategy
# sum metrics across replicas in different orders.
EXACT, TPU_TOLERANCE = 0.0, 1e-6
# float16 predictions may round differently in the last bit (2**-10): grappler
# fuses a replica's float16 ops differently in TensorFlow's graph and in
# tfd's, although weights, losses and metrics come out equal bit for bit.
FLOAT16_TOLERANCE = 2.0 ** -10

# Each strategy's TF and tfd versions, made once. TF's MirroredStrategy
# reduces with ReductionToOneDevice, as ours does on CPUs: same sums, same
# bits. TF has no TPUStrategy without a TPU: ours, on an emulated v4-8 (the
# 4 CPUs), is compared with TF's MirroredStrategy on those devices.
_STRATEGIES = {
    "mirrored_2": (lambda: oracle.TF.pair, lambda: oracle.TFD.pair),
    "mirrored_4": (oracle.new_tf_mirrored, lambda: oracle.TFD.mirrored),
    "one_device": (oracle.TF.one_device, oracle.TFD.one_device),
    "central_storage": (lambda: tf.distribute.experimental.CentralStorageStrategy(PAIR),
                        lambda: tfd.experimental.CentralStorageStrategy(PAIR)),
    "tpu": (lambda: _strategy("mirrored_4", tf.distribute),
            lambda: tfd.TPUStrategy(tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8"))),
    "default": (tf.distribute.get_strategy, tfd.get_strategy),
}
_made = {}
_outcomes = {}


def _strategy(name, module):
  key = (name, module.__name__)
  if key not in _made:
    _made[key] = _STRATEGIES[name][module is tfd]()
  return _made[key]


def _outcome(case, strategy, workdir):
  """`tf_keras_cases.outcome`, once per case and strategy."""
  key = (case, id(strategy))
  if key not in _outcomes:
    _outcomes[key] = tf_keras_cases.outcome(case, strategy, workdir)
  return _outcomes[key]


# Every case runs under a MirroredStrategy; fit and custom loops under all.
MATRIX = {
    "mirrored_2": ["fit_dataset", "fit_distributed_dataset", "fit_dataset_creator",
                   "input_batch_size", "metrics_and_losses", "model_checkpoint",
                   "backup_and_restore", "custom_loop", "saving", "mixed_float16",
                   "sharpness_aware"],
    "mirrored_4": ["fit_arrays", "fit_datasets_from_function", "steps_per_execution",
                   "early_stopping", "tensorboard", "custom_loop_legacy"],
    "one_device": ["fit_arrays", "custom_loop_legacy", "mixed_float16", "sharpness_aware"],
    "central_storage": ["fit_arrays", "custom_loop", "custom_loop_legacy", "saving",
                        "backup_and_restore", "mixed_float16", "sharpness_aware"],
    "tpu": ["fit_arrays", "fit_distributed_dataset", "steps_per_execution", "custom_loop",
            "saving", "backup_and_restore"],
    "default": ["custom_loop", "custom_loop_legacy"],
}
# On an emulated v3-8, in a process of its own (8 devices).
V3_8_CASES = ["fit_arrays", "custom_loop_legacy"]


def assert_same(actual, expected, tolerance=EXACT, path="result"):
  """`actual` equals `expected` leaf by leaf (numbers to `tolerance`); an
  exception only by its class."""
  if isinstance(expected, dict) and "raised" in expected:
    assert isinstance(actual, dict) and actual.get("raised") == expected["raised"], (
        f"{path}: TF raised {expected['raised']}: {expected['message']}\n"
        f"tfd gave: {str(actual)[:3000]}")
    return
  if isinstance(actual, dict) and "raised" in actual:
    pytest.fail(f"{path}: tfd raised {actual['raised']}: {actual['message']}")
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for key in expected:
      assert_same(actual[key], expected[key], tolerance, f"{path}[{key!r}]")
  elif _is_array(expected):
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance,
                               err_msg=path)
  elif isinstance(expected, list):
    assert len(actual) == len(expected), path
    for i, (a, e) in enumerate(zip(actual, expected)):
      assert_same(a, e, tolerance, f"{path}[{i}]")
  else:
    assert actual == expected, path


def _is_array(value):
  """Whether `value` is a number or nested lists of numbers of one shape."""
  try:
    return np.asarray(value).dtype.kind in "fiu"
  except ValueError:
    return False


@pytest.mark.parametrize("strategy, case", [
    pytest.param(strategy, case, id=f"{strategy}-{case}")
    for strategy, cases in MATRIX.items() for case in cases])
def test_matches_tf_distribute(strategy, case, tmp_path):
  expected = _outcome(case, _strategy(strategy, tf.distribute), str(tmp_path / "tf"))
  actual = _outcome(case, _strategy(strategy, tfd), str(tmp_path / "tfd"))
  if strategy == "tpu":
    tolerance = TPU_TOLERANCE
  else:
    tolerance = FLOAT16_TOLERANCE if case == "mixed_float16" else EXACT
  assert_same(actual, expected, tolerance)
  if case == "tensorboard":  # Each epoch's loss was logged for training and validation.
    assert [len(actual["scalars"][f"{kind}/epoch_loss"]) for kind in ("train", "validation")] == [
        tf_keras_cases.EPOCHS] * 2


@pytest.fixture(scope="module")
def v3_8_results(tmp_path_factory):
  """`V3_8_CASES` on an emulated v3-8 and under TF's MirroredStrategy on
  its 8 devices, in one process."""
  env = dict(os.environ, TPU_NAME="emulated:v3-8")
  result = subprocess.run(
      [sys.executable, os.path.join(HERE, "tf_keras_cases.py"),
       str(tmp_path_factory.mktemp("v3_8")), *V3_8_CASES],
      env=env, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", V3_8_CASES)
def test_tpu_strategy_on_8_cores_matches_mirrored_strategy(v3_8_results, case):
  assert v3_8_results["replicas"] == 8
  assert_same(v3_8_results[case]["tpu"], v3_8_results[case]["mirrored"], TPU_TOLERANCE)


def test_model_calls_run_under_the_default_strategy_it_was_built_in():
  """A model built in the default strategy's scope finds that same strategy
  current in its `call` during `fit` and `evaluate`, as tf_keras's own
  strategy test checks; and `get_strategy()` is that object inside and
  outside `run` and `scope()`, eagerly and in a `tf.function`."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top

  def snippet(module):
    class CheckingModel(keras.Model):
      def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.x = None

      def build(self, input_shape):
        self.x = tf.Variable(1.0)

      def call(self, inputs, training=None, mask=None):
        if module.get_strategy() is not self.strategy:
          raise ValueError("Model must execute call w/ the original strategy")
        return self.x * inputs

    strategy = module.get_strategy()
    with strategy.scope():
      in_scope = module.get_strategy() is strategy
      model = CheckingModel(strategy)
      model.compile(keras.optimizers.Adam(1e-4), keras.losses.MeanSquaredError(),
                    metrics=["binary_accuracy"])
      dataset = tf.data.Dataset.from_tensor_slices((tf.ones([64]), tf.ones([64]))).batch(8)
      model.fit(dataset, epochs=2, verbose=0)
    in_run = strategy.run(lambda: module.get_strategy() is strategy)
    in_function = tf.function(
        lambda: strategy.run(lambda: tf.constant(module.get_strategy() is strategy)))()
    return [in_scope, in_run, bool(in_function)] + model.evaluate(dataset, verbose=0)
  assert oracle.compare(snippet, (tf.distribute,), (tfd,)) == [True, True, True, 0.0, 1.0]


def test_losses_reduce_by_default_in_the_default_strategys_run():
  """tf_keras losses refuse their default reduction inside the `run` of a
  strategy, but not of the default strategy."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top

  def loss_in_run(module):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return float(module.get_strategy().run(lambda: loss([0, 1], [[2.0, 0.0], [0.0, 1.0]])))
  oracle.compare(loss_in_run, (tf.distribute,), (tfd,))


class _TensorFlowsPerReplica(tf_values.DistributedValues):
  """Gradients of TensorFlow's own per-replica kind, as tf_keras's
  custom-aggregation tests make them."""

  @property
  def values(self):
    return self._values


@pytest.mark.parametrize("optimizer, kwargs, expected", [
    ("legacy", dict(experimental_aggregate_gradients=True), [[-0.3, -0.3]] * 2),
    ("legacy", dict(experimental_aggregate_gradients=False), [[-0.1, -0.1], [-0.2, -0.2]]),
    ("new", dict(experimental_aggregate_gradients=False), [[-0.1, -0.1], [-0.2, -0.2]]),
    ("new", dict(skip_gradients_aggregation=True), [[-0.1, -0.1], [-0.2, -0.2]]),
], ids=["legacy-aggregated", "legacy-not-aggregated", "new-not-aggregated", "new-skipped"])
def test_apply_gradients_with_or_without_aggregation_matches_tf(optimizer, kwargs, expected):
  """Each replica's own gradient updates its own copy when the optimizer
  does not aggregate: per-replica arguments of `extended.update` in
  `merge_call` reach each device as that device's component."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top

  def snippet(module):
    strategy = oracle.new_mirrored(module, PAIR)
    with strategy.scope():
      v = tf.Variable([0.0, 0.0])
      sgd = keras.optimizers.legacy.SGD(0.1) if optimizer == "legacy" else (
          keras.optimizers.SGD(0.1))

    @tf.function
    def optimize():
      gradients = []
      for i, device in enumerate(strategy.extended.worker_devices):
        with tf.device(device):
          gradients.append(tf.fill([2], i + 1.0))

      def step_fn(g):
        sgd.apply_gradients([(g, v)], **kwargs)
        return v.read_value()
      return strategy.experimental_local_results(
          strategy.run(step_fn, args=(_TensorFlowsPerReplica(gradients),)))
    return np.asarray(optimize()).tolist()
  np.testing.assert_allclose(oracle.compare(snippet, (tf.distribute,), (tfd,)), expected)


_CENTRAL_STORAGE = {
    "v2": (lambda: tf.distribute.experimental.CentralStorageStrategy(PAIR),
           lambda: tfd.experimental.CentralStorageStrategy(PAIR)),
    "v1": (lambda: tf.compat.v1.distribute.experimental.CentralStorageStrategy(PAIR),
           lambda: tfd.compat.v1.experimental.CentralStorageStrategy(PAIR)),
}


@pytest.mark.parametrize("api", sorted(_CENTRAL_STORAGE))
@pytest.mark.parametrize("optimizer_kwargs, apply_kwargs", [
    pytest.param(dict(clipnorm=1.0), {}, id="clipnorm"),
    pytest.param(dict(clipvalue=1.0), {}, id="clipvalue"),
    pytest.param(dict(global_clipnorm=1.0), {}, id="global_clipnorm"),
    pytest.param({}, dict(experimental_aggregate_gradients=False), id="not_aggregated"),
])
def test_central_storage_refuses_what_tf_keras_refuses_under_tf(
    api, optimizer_kwargs, apply_kwargs):
  """tf_keras's legacy optimizers refuse gradient clipping (ValueError) and
  `experimental_aggregate_gradients=False` (NotImplementedError) under
  CentralStorageStrategy, as under TF's."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top

  def snippet(make_strategy):
    strategy = make_strategy()
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
      sgd = keras.optimizers.legacy.SGD(0.1, **optimizer_kwargs)
    strategy.run(lambda: sgd.apply_gradients([(tf.constant([3.0, 4.0]), v)], **apply_kwargs))
    return v.numpy().tolist()
  outcome = oracle.compare(snippet, *[(make,) for make in _CENTRAL_STORAGE[api]])
  assert outcome.type is (NotImplementedError if apply_kwargs else ValueError)


def _mean_in_a_tf1_graph(make_strategy):
  """tf_keras's Mean in a TF1 graph, updated by each replica on its batch of
  an input-function iterator, as tf_keras's metric tests do: its result
  after each step, until 4 batches are read."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top
  results = []
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    strategy = make_strategy()
    with strategy.scope():
      metric = keras.metrics.Mean()
      iterator = strategy.make_input_fn_iterator(
          lambda _: tf.data.Dataset.range(16).map(tf.compat.v1.to_float).batch(4))
      updates = strategy.experimental_local_results(
          strategy.run(metric, args=(iterator.get_next(),)))
      session.run(iterator.initializer)
      session.run([v.initializer for v in metric.variables])
      for _ in range(4 // strategy.num_replicas_in_sync):
        session.run(updates)
        results.append(float(session.run(metric.result())))
  return results


@pytest.mark.parametrize("strategy, expected", [
    ("default", [1.5, 3.5, 5.5, 7.5]), ("one_device", [1.5, 3.5, 5.5, 7.5]),
    ("mirrored", [3.5, 7.5])])
def test_metric_in_a_tf1_graph_matches_tf(strategy, expected):
  make_theirs, make_ours = _NAMED_STRATEGIES[strategy]
  assert oracle.compare(_mean_in_a_tf1_graph, (make_theirs,), (make_ours,)) == expected


# --- The private names tf_keras reads (docs/client_private_names.md).

_NAMED_STRATEGIES = {
    "default": (tf.distribute.get_strategy, tfd.get_strategy),
    "one_device": (lambda: tf.distribute.OneDeviceStrategy("CPU:0"),
                   lambda: tfd.OneDeviceStrategy("CPU:0")),
    "mirrored": (lambda: oracle.new_tf_mirrored(PAIR), lambda: tfd.MirroredStrategy(PAIR)),
    "central_storage": (lambda: tf.distribute.experimental.CentralStorageStrategy(PAIR),
                        lambda: tfd.experimental.CentralStorageStrategy(PAIR)),
    "multi_worker_mirrored": (tf.distribute.MultiWorkerMirroredStrategy,
                              tfd.MultiWorkerMirroredStrategy),
    "v1_one_device": (lambda: tf.compat.v1.distribute.OneDeviceStrategy("CPU:0"),
                      lambda: tfd.compat.v1.OneDeviceStrategy("CPU:0")),
    "v1_mirrored": (lambda: oracle.new_tf_mirrored(PAIR, module=tf.compat.v1.distribute),
                    lambda: tfd.compat.v1.MirroredStrategy(PAIR)),
    "v1_central_storage": (
        lambda: tf.compat.v1.distribute.experimental.CentralStorageStrategy(PAIR),
        lambda: tfd.compat.v1.experimental.CentralStorageStrategy(PAIR)),
    "v1_multi_worker_mirrored": (tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy,
                                 tfd.compat.v1.experimental.MultiWorkerMirroredStrategy),
}


@pytest.mark.parametrize("name", _NAMED_STRATEGIES)
def test_client_private_names_match_tensorflow(name):
  make_theirs, make_ours = _NAMED_STRATEGIES[name]
  theirs = tf_keras_cases.client_private_names(make_theirs())
  assert tf_keras_cases.client_private_names(make_ours()) == theirs
  assert theirs["extended._global_batch_size"] is True
  assert theirs["_should_use_with_coordinator"] is False


@pytest.mark.parametrize("make", [
    tfd.TPUStrategy, tfd.experimental.TPUStrategy, tfd.compat.v1.experimental.TPUStrategy])
def test_tpu_strategy_client_private_names_are_tensorflows(make):
  """TF makes no TPUStrategy without a TPU: its values, from its source
  (tpu_strategy.py), are those of a strategy on one machine that keeps its
  resolver in `extended._tpu_cluster_resolver`."""
  resolver = tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  assert tf_keras_cases.client_private_names(make(resolver)) == {
      "_should_use_with_coordinator": False, "_num_workers": ABSENT, "_mesh": ABSENT,
      "_scale_loss_for_estimator": False,
      "extended._in_multi_worker_mode": False, "extended._global_batch_size": True,
      "extended._use_merge_call": True, "extended._task_id": ABSENT, "extended._cluster_resolver": ABSENT,
      "extended._tpu_cluster_resolver": ["TPUClusterResolver", "worker", 0],
      "extended._std_server_started": ABSENT,
      "extended._retrace_functions_for_each_device": True,  # more than one core
      "extended._outer_control_flow_context": ABSENT, "extended._device_assignment": None}
