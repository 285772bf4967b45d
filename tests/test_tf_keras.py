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
import strategies
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

# Rows of tests/strategies.py (each strategy made once) and the cases run
# under each: every case under a MirroredStrategy; fit and custom loops
# under all.
MATRIX = {
    "mirrored_pair": ["fit_dataset", "fit_distributed_dataset", "fit_dataset_creator",
                      "input_batch_size", "metrics_and_losses", "model_checkpoint",
                      "backup_and_restore", "custom_loop", "saving", "mixed_float16",
                      "sharpness_aware"],
    "mirrored": ["fit_arrays", "fit_datasets_from_function", "steps_per_execution",
                 "early_stopping", "tensorboard", "custom_loop_legacy"],
    "one_device": ["fit_arrays", "custom_loop_legacy", "mixed_float16", "sharpness_aware"],
    "central_storage_pair": ["fit_arrays", "custom_loop", "custom_loop_legacy", "saving",
                             "backup_and_restore", "mixed_float16", "sharpness_aware"],
    "tpu": ["fit_arrays", "fit_distributed_dataset", "steps_per_execution", "custom_loop",
            "saving", "backup_and_restore"],
    "default": ["custom_loop", "custom_loop_legacy"],
}
# On an emulated v3-8, in a process of its own (8 devices).
V3_8_CASES = ["fit_arrays", "custom_loop_legacy"]


@pytest.mark.parametrize("strategy, case", [
    pytest.param(strategy, case, id=f"{strategy}-{case}")
    for strategy, cases in MATRIX.items() for case in cases])
def test_matches_tf_distribute(strategy, case, tmp_path):
  """TF's outcome once per case and TF strategy ("tpu" is compared with
  TF's strategy of "mirrored")."""
  if strategy == "tpu":
    tolerance = TPU_TOLERANCE
  else:
    tolerance = FLOAT16_TOLERANCE if case == "mixed_float16" else EXACT

  def outcome(ours):
    return tf_keras_cases.outcome(case, strategies.shared(strategy, ours),
                                  str(tmp_path / ("tfd" if ours else "tf")))
  actual = oracle.compare(outcome, (False,), (True,), alike=oracle.close(tolerance), ours=True,
                          tf_key=(__name__, case, strategies.STRATEGIES[strategy].tf))
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
  oracle.assert_same_numbers(v3_8_results[case]["tpu"], v3_8_results[case]["mirrored"],
                             TPU_TOLERANCE)


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


_CENTRAL_STORAGE = {"v2": "central_storage_pair", "v1": "v1_central_storage_pair"}


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

  def snippet(ours):
    strategy = strategies.make(_CENTRAL_STORAGE[api], ours)
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
      sgd = keras.optimizers.legacy.SGD(0.1, **optimizer_kwargs)
    strategy.run(lambda: sgd.apply_gradients([(tf.constant([3.0, 4.0]), v)], **apply_kwargs))
    return v.numpy().tolist()
  outcome = oracle.compare(snippet, (False,), (True,))
  assert outcome.type is (NotImplementedError if apply_kwargs else ValueError)


def _mean_in_a_tf1_graph(name, ours):
  """tf_keras's Mean in a TF1 graph, updated by each replica on its batch of
  an input-function iterator, as tf_keras's metric tests do: its result
  after each step, until 4 batches are read."""
  import tf_keras as keras  # pylint: disable=g-import-not-at-top
  results = []
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    strategy = strategies.make(name, ours)
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
    ("mirrored_pair", [3.5, 7.5])])
def test_metric_in_a_tf1_graph_matches_tf(strategy, expected):
  assert oracle.compare(_mean_in_a_tf1_graph, (strategy, False), (strategy, True)) == expected


# --- The private names tf_keras reads (docs/client_private_names.md).

# Rows of tests/strategies.py, each strategy made anew.
NAMED_STRATEGIES = ["default", "one_device", "mirrored_pair", "central_storage_pair",
                    "multi_worker", "v1_one_device", "v1_mirrored_pair",
                    "v1_central_storage_pair", "v1_multi_worker"]


@pytest.mark.parametrize("name", NAMED_STRATEGIES)
def test_client_private_names_match_tensorflow(name):
  theirs = oracle.compare(lambda ours: tf_keras_cases.client_private_names(
      strategies.make(name, ours)), (False,), (True,))
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
