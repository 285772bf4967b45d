"""The TF 1.x strategy API (`tfd.compat.v1`) against
`tf.compat.v1.distribute`, eagerly and in TF1 graphs run by a Session."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from outcomes import same

HERE = pathlib.Path(__file__).resolve().parent
TF1 = tf.compat.v1.distribute
OURS = tfd.compat.v1


def _mirrored(mod):
  return mod.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=mod.ReductionToOneDevice())


def _dataset():
  return tf.data.Dataset.range(8).map(lambda x: tf.cast(x, tf.float32)).batch(4)


def test_class_relations_like_tf():
  for mod, v2 in ((TF1, tf.distribute), (OURS, tfd)):
    strategy = _mirrored(mod)
    assert isinstance(strategy, mod.Strategy) and not isinstance(strategy, v2.Strategy)
    assert isinstance(strategy.extended, v2.StrategyExtended)
    assert not isinstance(v2.get_replica_context(), mod.ReplicaContext)
    assert mod.ReduceOp is v2.ReduceOp and mod.InputContext is v2.InputContext
    for name in ("gather", "experimental_distribute_values_from_function"):
      assert not hasattr(strategy, name)
    assert not hasattr(mod.ReplicaContext, "all_gather")
  assert OURS.get_loss_reduction().value == TF1.get_loss_reduction().value


@pytest.mark.parametrize("name", ["experimental_run", "make_dataset_iterator",
                                  "make_input_fn_iterator", "configure", "group",
                                  "update_config_proto", "experimental_make_numpy_dataset",
                                  "reduce", "unwrap", "colocate_vars_with"])
def test_v1_methods_have_tfs_signatures(name):
  import inspect  # pylint: disable=g-import-not-at-top
  ours = inspect.signature(getattr(OURS.Strategy, name))
  theirs = inspect.signature(getattr(TF1.Strategy, name))
  assert list(ours.parameters) == list(theirs.parameters)


def test_experimental_run_on_an_iterator_eagerly_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    iterator = strategy.make_dataset_iterator(_dataset())
    assert iterator.initializer is None and iterator.initialize() is None
    first = strategy.experimental_run(lambda x: x * 2.0, iterator)
    second = strategy.experimental_run(tf.reduce_sum, iterator)
    return ([t.numpy().tolist() for t in strategy.experimental_local_results(first)],
            strategy.reduce("SUM", second).numpy().item())
  assert same(run, TF1, OURS) == ([[0.0, 2.0], [4.0, 6.0]], 22.0)


def test_input_fn_iterator_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    contexts = []

    def input_fn(context):
      contexts.append((context.num_input_pipelines, context.input_pipeline_id,
                       context.num_replicas_in_sync))
      return _dataset()
    iterator = strategy.make_input_fn_iterator(input_fn)
    values = strategy.experimental_local_results(iterator.get_next())
    return contexts, [v.numpy().tolist() for v in values]
  assert same(run, TF1, OURS) == ([(1, 0, 2)], [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]])
  assert same(lambda m: _mirrored(m).make_input_fn_iterator(
      lambda ctx: _dataset(), tf.distribute.InputReplicationMode.PER_REPLICA),
              TF1, OURS) is ValueError


@pytest.mark.parametrize("mod", [TF1, OURS], ids=["tf", "tfd"])
def test_graph_iterators_need_their_initializer(mod):
  with tf.Graph().as_default():
    strategy = _mirrored(mod)
    iterator = strategy.make_dataset_iterator(_dataset())
    result = strategy.reduce("SUM", strategy.experimental_run(tf.reduce_sum, iterator))
    with tf.compat.v1.Session() as session:
      with pytest.raises(tf.errors.FailedPreconditionError):
        session.run(result)
      session.run(iterator.initializer)
      assert session.run(result) == 6.0
      assert session.run(result) == 22.0
      session.run(iterator.initialize())
      assert session.run(result) == 6.0


def test_graph_run_update_and_fetch_local_results_like_tf():
  def run(mod):
    with tf.Graph().as_default():
      strategy = _mirrored(mod)
      with strategy.scope():
        v = tf.Variable(1.0, aggregation=tf.VariableAggregation.MEAN)
        result = strategy.run(lambda: v.assign_add(2.0))
        grouped = strategy.group(result)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(grouped)
        return session.run(strategy.experimental_local_results(v)), isinstance(grouped, tf.Operation)
  assert same(run, TF1, OURS) == ((3.0, 3.0), True)


def test_numpy_datasets_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    on_strategy = strategy.experimental_make_numpy_dataset(np.arange(3, dtype=np.float32))
    on_extended = strategy.extended.experimental_make_numpy_dataset(
        (np.ones([2, 2], np.float32), np.arange(2)), session=None)
    return [float(x) for x in on_strategy], [(a.numpy().tolist(), int(b)) for a, b in on_extended]
  assert same(run, TF1, OURS) == ([0.0, 1.0, 2.0], [([1.0, 1.0], 0), ([1.0, 1.0], 1)])


def test_extended_v1_members_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    extended = strategy.extended
    with strategy.scope():
      v = tf.Variable(3.0)
      counter = tf.Variable(0.0)
    broadcast = extended.broadcast_to(tf.constant(1.0), v)
    extended.update_non_slot(extended.non_slot_devices([counter]),
                             lambda: counter.assign_add(1.0))
    return (extended.worker_devices_by_replica, extended.read_var(v).numpy().item(),
            [t.numpy().item() for t in strategy.experimental_local_results(broadcast)],
            counter.numpy().item(), extended.should_checkpoint, extended.should_save_summary,
            extended.experimental_should_init, extended.experimental_between_graph,
            len(extended.non_slot_devices([v])),
            strategy.reduce("SUM", extended.call_for_each_replica(lambda: tf.constant(1.0))).numpy().item())
  same(run, TF1, OURS)


def test_config_protos_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    updated = strategy.update_config_proto(config)
    strategy.configure(config)
    return updated is config, updated.allow_soft_placement, config.allow_soft_placement
  same(run, TF1, OURS)


def test_run_steps_on_iterator_eagerly():
  strategy = _mirrored(OURS)
  iterator = strategy.make_dataset_iterator(_dataset())
  with strategy.scope():
    total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

  def step(ctx, inputs):
    result = strategy.extended.call_for_each_replica(
        lambda x: total.assign_add(tf.reduce_sum(x)), args=(inputs,))
    ctx.set_last_step_output("total", result, reduce_op="MEAN")
    ctx.set_non_tensor_output("note", "ok")
  ctx = strategy.extended.experimental_run_steps_on_iterator(step, iterator, iterations=2)
  assert total.numpy() == 28.0
  assert ctx.last_step_outputs["total"].numpy() == 28.0
  assert ctx.non_tensor_outputs == {"note": "ok"} and ctx.run_op is None


@pytest.fixture(scope="module")
def tf1_programs():
  result = subprocess.run([sys.executable, str(HERE / "tf1_programs.py")], capture_output=True,
                          text=True, timeout=300, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  theirs, ours = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  return theirs, ours


def test_tf1_tutorial_gives_tensorflows_losses(tf1_programs):
  theirs, ours = tf1_programs
  assert ours["tutorial"] == theirs["tutorial"]
  assert ours["tutorial"]["losses"][-1] != ours["tutorial"]["losses"][0]


def test_tf1_multi_step_loop_like_tf(tf1_programs):
  theirs, ours = tf1_programs
  assert ours["run_steps"] == theirs["run_steps"] == {"total": 66.0, "last": 66.0}


# --- The spec page's examples (tf.compat.v1.distribute.MirroredStrategy).

def test_spec_variables_and_function_creation():
  strategy = OURS.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    x = tf.Variable(1.)
  assert type(x).__name__ == "MirroredVariable"
  created = []

  @tf.function
  def create_variable():
    if not created:
      created.append(tf.Variable(1.))
  with strategy.scope():
    create_variable()
  assert type(created[0]).__name__ == "MirroredVariable"


def test_spec_train_epoch_and_input_functions():
  strategy = OURS.MirroredStrategy(["/cpu:0", "/cpu:1"])
  dataset = tf.data.Dataset.range(8).map(lambda v: tf.cast(v, tf.float32)).batch(4)
  with strategy.scope():
    @tf.function
    def distribute_train_epoch(dataset):
      total_result = 0.0
      for x in dataset:
        per_replica_result = strategy.run(tf.reduce_sum, args=(x,))
        total_result += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_result, axis=None)
      return total_result
    dist_dataset = strategy.experimental_distribute_dataset(dataset)
    assert float(distribute_train_epoch(dist_dataset)) == 28.0

  def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(4)
    d = tf.data.Dataset.from_tensors([[1.]]).repeat(8).batch(batch_size)
    return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  inputs = strategy.experimental_distribute_datasets_from_function(dataset_fn)
  totals = [float(strategy.reduce("SUM", strategy.run(tf.reduce_sum, args=(batch,))))
            for batch in inputs]
  assert totals == [4.0, 4.0]
  with strategy.scope():
    iterator = strategy.make_input_fn_iterator(dataset_fn)
    replica_results = strategy.experimental_run(tf.reduce_sum, iterator)
  assert [float(r) for r in strategy.experimental_local_results(replica_results)] == [2.0, 2.0]
  numpy_dataset = strategy.experimental_make_numpy_dataset(np.ones([10], dtype=np.float32))
  dist = strategy.experimental_distribute_dataset(numpy_dataset.batch(4))
  assert [float(strategy.reduce("SUM", strategy.run(tf.reduce_sum, args=(b,)))) for b in dist] == [
      4.0, 4.0, 2.0]
