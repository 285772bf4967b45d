"""`CentralStorageStrategy` compared with TensorFlow's on 4 logical CPUs:
devices, variables on the parameter device, aggregated updates, reductions,
input, checkpoints, a custom loop and Keras `fit`."""

import keras
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from conftest import DEVICES
from keras_models import classification_data
from keras_models import classifier
from keras_models import TOLERANCE
import oracle

MODULES = pytest.mark.parametrize("mod", [tf.distribute, tfd], ids=["tf", "tfd"])
_strategies = {}


def _strategy(mod, compute_devices=DEVICES, parameter_device=None):
  key = (mod.__name__, compute_devices, parameter_device)
  if key not in _strategies:
    _strategies[key] = mod.experimental.CentralStorageStrategy(
        None if compute_devices is None else list(compute_devices), parameter_device)
  return _strategies[key]


def _both(snippet, run_mode=None):
  """`oracle.compare` of `snippet(mod, strategy)` with TF and tfd by repr;
  returns tfd's outcome."""
  return oracle.compare(snippet, (tf.distribute, _strategy(tf.distribute)),
                        (tfd, _strategy(tfd)), run_mode, alike=oracle.same_repr, ours=True)


def _replica_id(mod):
  return tf.cast(mod.get_replica_context().replica_id_in_sync_group, tf.float32)


# --- Devices and variables.

@pytest.mark.parametrize("compute_devices, parameter_device", [
    (None, None), (DEVICES, None), (("CPU:2",), None), (DEVICES[:2], "CPU:3")])
def test_devices_like_tensorflows(compute_devices, parameter_device):
  def describe(mod):
    strategy = _strategy(mod, compute_devices, parameter_device)
    with strategy.scope():
      v = tf.Variable(1.0)
    return (strategy.num_replicas_in_sync, strategy.extended.worker_devices,
            strategy.extended.parameter_devices, v.device, repr(v),
            strategy.experimental_local_results(v)[0] is not v)
  ours = oracle.compare(describe, (tf.distribute,), (tfd,))
  if compute_devices is None:
    assert ours[:3] == (1, [DEVICES[0]], (DEVICES[0],))


def test_one_replica_gets_plain_variables_several_get_one_wrapped_variable():
  with _strategy(tfd, ("CPU:1",)).scope():
    plain = tf.Variable(1.0)
  with _strategy(tfd).scope():
    wrapped = tf.Variable(1.0)
  assert type(plain).__name__ == "ResourceVariable"
  assert type(wrapped).__name__ == "AggregatingVariable"
  assert wrapped.device == DEVICES[0]
  assert _strategy(tfd).extended.variable_created_in_scope(wrapped)


def test_the_wrapped_variable_is_not_a_distributed_value():
  """As in TensorFlow: reductions take it as a value every replica shares,
  eagerly and inside a tf.function."""
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])

    def attempt(fn):
      outcomes = []
      for run_mode in (lambda fn: fn(), lambda fn: tf.function(fn)()):
        try:
          result = run_mode(fn)
        except ValueError as e:  # in a tf.function, behind AutoGraph's traceback
          message = str(e).rsplit("ValueError: ", 1)[-1]
          outcomes.append("ValueError: " + message.split(" value ")[0])
        else:
          outcomes.append("itself" if result is v else repr(result))
      return outcomes
    return (isinstance(v, tf.distribute.DistributedValues), hasattr(v, "values"),
            attempt(lambda: strategy.reduce("SUM", v, axis=None)),
            attempt(lambda: strategy.extended.reduce_to("SUM", v, "CPU:1")),
            attempt(lambda: strategy.reduce("MEAN", v, axis=None)),
            attempt(lambda: strategy.extended.reduce_to("MEAN", v, "CPU:1")),
            strategy.experimental_local_results(v)[0] is v,
            attempt(lambda: strategy.run(lambda: v * 2.0)))
  result = _both(snippet)
  assert result[:5] == (False, False, ["ValueError: A non-DistributedValues"] * 2,
                        ["ValueError: A non-DistributedValues"] * 2,
                        ["itself", "<tf.Tensor: shape=(2,), dtype=float32, "
                                   "numpy=array([1., 2.], dtype=float32)>"])


@pytest.mark.parametrize("aggregation", ["SUM", "MEAN", "ONLY_FIRST_REPLICA"])
def test_updates_in_replicas_are_aggregated_then_applied_once(aggregation, run_mode):
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable(10.0, aggregation=getattr(tf.VariableAggregation, aggregation))
    run_mode(lambda: strategy.run(lambda: v.assign_add(_replica_id(mod) + 1.0)))
    return v.numpy().item()
  assert _both(snippet) == {"SUM": 20.0, "MEAN": 12.5, "ONLY_FIRST_REPLICA": 11.0}[aggregation]


def test_update_in_replica_without_aggregation_raises_value_error():
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable(1.0)
    try:
      strategy.run(lambda: v.assign(2.0))
    except ValueError as e:
      return "aggregation" in str(e)
  assert _both(snippet) is True


@pytest.mark.parametrize("method", ["batch_scatter_update", "scatter_nd_update",
                                    "scatter_nd_add", "scatter_nd_sub"])
@pytest.mark.parametrize("aggregation", ["NONE", "MEAN"])
def test_sparse_updates_in_replicas_apply_as_they_are_like_tf(method, aggregation, run_mode):
  """As in TensorFlow, each replica's sparse update reaches the one variable
  as it is, whatever its aggregation."""
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], aggregation=getattr(tf.VariableAggregation, aggregation))
    if method == "batch_scatter_update":
      update = lambda: v.batch_scatter_update(tf.IndexedSlices(tf.constant([5.0]), tf.constant([0])))
    else:
      update = lambda: getattr(v, method)(tf.constant([[0]]), tf.constant([5.0]))
    update()
    run_mode(lambda: strategy.run(update))
    return v.numpy().tolist()
  assert _both(snippet) == {"batch_scatter_update": [5.0, 2.0], "scatter_nd_update": [5.0, 2.0],
                            "scatter_nd_add": [26.0, 2.0], "scatter_nd_sub": [-24.0, 2.0]}[method]


def test_cross_replica_update_and_colocated_variables():
  def snippet(mod, strategy):
    with strategy.scope():
      v = tf.Variable([1.0, 2.0])
      with strategy.extended.colocate_vars_with(v):
        slot = tf.Variable(0.0)
    strategy.extended.update(v, lambda var, d: var.assign_add(d), args=([1.0, 1.0],))
    v.assign_sub([0.5, 0.5])
    return v.numpy().tolist(), slot.device, strategy.extended.non_slot_devices([slot, v]).name
  assert _both(snippet) == ([1.5, 2.5], DEVICES[0], "Variable:0")


# --- Reductions and input.

def test_reductions_onto_devices_and_back(run_mode):
  def snippet(mod, strategy):
    def reduce():
      value = strategy.run(lambda: _replica_id(mod) + 1.0)
      batch = strategy.extended.batch_reduce_to(
          "MEAN", [(value, "CPU:1"), (value, value)])
      return (strategy.reduce("SUM", value, axis=None),
              strategy.reduce("MEAN", value, axis=None),
              strategy.extended.reduce_to("SUM", value, "CPU:2"),
              batch[0], strategy.experimental_local_results(batch[1]))
    return tf.nest.map_structure(lambda t: (t.numpy().item(), t.device),
                                 run_mode(reduce))
  result = _both(snippet)
  assert [v for v in tf.nest.flatten(result) if isinstance(v, float)] == (
      [10.0, 2.5, 10.0, 2.5] + [2.5] * 4)


def test_distributed_dataset_splits_global_batches():
  def snippet(mod, strategy):
    dataset = tf.data.Dataset.range(10).batch(5)
    return [[t.numpy().tolist() for t in strategy.experimental_local_results(batch)]
            for batch in strategy.experimental_distribute_dataset(dataset)]
  assert _both(snippet) == [[[0, 1], [2, 3], [4], []], [[5, 6], [7, 8], [9], []]]


def test_compat_v1_form_reduces_with_axis_none_by_default():
  strategy = tfd.compat.v1.experimental.CentralStorageStrategy(["CPU:0", "CPU:1"])
  assert isinstance(strategy, tfd.compat.v1.Strategy)
  assert float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)))) == 4.0


def test_checkpoint_restores_into_a_plain_variable(tmp_path):
  with _strategy(tfd).scope():
    v = tf.Variable([3.0, 4.0])
  path = tf.train.Checkpoint(v=v).save(str(tmp_path / "ckpt"))
  plain = tf.Variable([0.0, 0.0])
  tf.train.Checkpoint(v=plain).restore(path).assert_consumed()
  assert plain.numpy().tolist() == [3.0, 4.0]


# --- Training.

def test_custom_training_loop_matches_tensorflow():
  def train(mod):
    strategy = _strategy(mod)
    with strategy.scope():
      model = classifier()
      optimizer = keras.optimizers.Adam(learning_rate=0.01)
      optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                         reduction=None)

    def step_fn(x, y):
      with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=16)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    @tf.function
    def step(x, y):
      return strategy.reduce("SUM", strategy.run(step_fn, args=(x, y)), axis=None)

    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(classification_data(48)).batch(16))
    losses = [float(step(x, y)) for x, y in dataset]
    return losses, model.get_weights()
  oracle.compare(train, (tf.distribute,), (tfd,), alike=oracle.close(TOLERANCE))


def test_keras_fit_matches_tensorflow():
  def fit(mod):
    with _strategy(mod).scope():
      model = classifier()
      model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"])
    history = model.fit(*classification_data(64), batch_size=16, epochs=2, shuffle=False, verbose=0)
    return history.history, model.get_weights()
  oracle.compare(fit, (tf.distribute,), (tfd,), alike=oracle.close(TOLERANCE))
