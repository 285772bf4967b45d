"""TF 1.x's `ParameterServerStrategy` (`tfd.compat.v1.experimental`)
against `tf.compat.v1.distribute.experimental.ParameterServerStrategy`:
graphs built for clusters of several workers and ps tasks here, training
on servers of a fresh process (tests/ps_v1_programs.py)."""

import inspect
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

import oracle
from outcomes import program_outcomes

HERE = pathlib.Path(__file__).resolve().parent
TF1 = tf.compat.v1.distribute
OURS = tfd.compat.v1
CLUSTER = {"worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1", "p2:1"]}
EAGER_ERROR = ("`tf.compat.v1.distribute.experimental.ParameterServerStrategy` "
               "currently only works with the tf.Estimator API")


def _strategy(mod, cluster=None, task_type="worker", task_id=0, **resolver_args):
  resolver = mod.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(CLUSTER if cluster is None else cluster),
      task_type=task_type, task_id=task_id, **resolver_args)
  return mod.experimental.ParameterServerStrategy(resolver)


def _in_graph(call):
  """`call` for the module pair, each in a graph of its own."""
  def run(mod):
    with tf.Graph().as_default():
      return call(mod)
  return run


@pytest.fixture(scope="module")
def programs():
  return program_outcomes(HERE / "ps_v1_programs.py")


def test_training_on_a_worker_and_two_ps_servers_matches_tensorflow(programs):
  theirs, ours = programs
  assert ours["cluster"] == theirs["cluster"]
  facts = ours["cluster"]
  assert facts["devices"] == {"weights": "/job:ps/task:0", "bias": "/job:ps/task:1",
                              "global_step": "/job:ps/task:0"}
  assert facts["reprs"][0] == "<tf.Variable 'weights:0' shape=(3, 1) dtype=float32>"
  assert facts["values"]["global_step"] == 5
  losses = facts["losses"]  # two batches in turn, each fitted better
  assert losses[2] < losses[0] and losses[3] < losses[1]
  assert facts["strategy"] == "ParameterServerStrategyV1"
  assert facts["worker_devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"]
  assert facts["parameter_devices"] == ["/job:ps/task:0", "/job:ps/task:1"]
  assert facts["config"].startswith('device_filters: "/job:worker/task:0"\n'
                                    'device_filters: "/job:ps"\n')


@pytest.mark.parametrize("resolver", ["local", "default_resolver"])
def test_training_without_a_cluster_matches_tensorflow(programs, resolver):
  theirs, ours = programs
  assert ours[resolver] == theirs[resolver]
  assert ours[resolver]["values"] == ours["cluster"]["values"]
  assert set(ours[resolver]["devices"].values()) == {"/replica:0/task:0/device:CPU:0"}
  assert "isolate_session_state: true" in ours[resolver]["config"]


@pytest.mark.parametrize("call", [
    lambda s: s.scope(), lambda s: s.run(lambda: 1.0),
    lambda s: s.experimental_distribute_dataset(tf.data.Dataset.range(2)),
    lambda s: s.distribute_datasets_from_function(lambda _: tf.data.Dataset.range(2)),
    lambda s: s.extended.call_for_each_replica(lambda: 1.0),
    lambda s: s.make_input_fn_iterator(lambda _: tf.data.Dataset.range(2)),
    lambda s: s.experimental_run(lambda: 1.0),
], ids=["scope", "run", "experimental_distribute_dataset",
        "distribute_datasets_from_function", "call_for_each_replica",
        "make_input_fn_iterator", "experimental_run"])
def test_eager_execution_raises_like_tf(call):
  for mod in (TF1, OURS):
    strategy = _strategy(mod)
    with pytest.raises(NotImplementedError) as error:
      call(strategy)
    assert str(error.value) == EAGER_ERROR


def test_made_eagerly_like_tf():
  def made(mod):
    strategy = _strategy(mod, task_id=1)
    extended = strategy.extended
    return (strategy.num_replicas_in_sync, extended.worker_devices,
            extended.parameter_devices, extended.worker_devices_by_replica,
            extended.should_checkpoint, extended.should_save_summary,
            extended.experimental_should_init, extended.experimental_between_graph,
            extended._in_multi_worker_mode(), strategy.cluster_resolver)  # pylint: disable=protected-access
  assert oracle.compare(made, (TF1,), (OURS,)) == (
      1, ["/job:worker/replica:0/task:1/device:CPU:0"],
      ("/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:2"),
      [["/job:worker/replica:0/task:1/device:CPU:0"]],
      False, False, False, True, True, None)


def test_class_names_and_signatures_like_tf():
  for mod in (TF1, OURS):
    strategy = _strategy(mod)
    assert (type(strategy).__name__, type(strategy.extended).__name__) == (
        "ParameterServerStrategyV1", "ParameterServerStrategyExtended")
    assert isinstance(strategy, mod.Strategy)
    assert isinstance(strategy.extended, mod.StrategyExtended)
  for name in ("__init__", "scope", "run", "experimental_distribute_dataset",
               "distribute_datasets_from_function", "configure", "reduce"):
    ours = inspect.signature(getattr(OURS.experimental.ParameterServerStrategy, name))
    theirs = inspect.signature(getattr(TF1.experimental.ParameterServerStrategy, name))
    assert ours.parameters.keys() == theirs.parameters.keys(), name


def test_variables_go_to_the_ps_tasks_in_turn_like_tf():
  """Variables of any size take the next ps task (so do partitions); a
  colocated one takes its variable's and no turn; other ops stay on the
  worker."""
  def placed(mod):
    strategy = _strategy(mod, task_id=1)
    with strategy.scope():
      big = tf.Variable(tf.zeros([1000, 10]), name="big")
      step = tf.compat.v1.train.get_or_create_global_step()
      parts = tf.compat.v1.get_variable(
          "parts", [10, 2], partitioner=tf.compat.v1.fixed_size_partitioner(2))
      with strategy.extended.colocate_vars_with(big):
        slot = tf.Variable(0.0, name="slot")
      small = tf.compat.v1.get_variable("small", [2])
      other = tf.constant(1.0)
    return ([(v.op.name, v.device) for v in tf.compat.v1.global_variables()],
            [v.op.name for v in tf.compat.v1.trainable_variables()],
            type(parts).__name__, slot.device, other.device, repr(small))
  assert oracle.compare(_in_graph(placed), (TF1,), (OURS,)) == (
      [("big", "/job:ps/task:0"), ("global_step", "/job:ps/task:1"),
       ("parts/part_0", "/job:ps/task:2"), ("parts/part_1", "/job:ps/task:0"),
       ("slot", "/job:ps/task:0"), ("small", "/job:ps/task:1")],
      ["big", "parts/part_0", "parts/part_1", "slot", "small"],
      "PartitionedVariable", "/job:ps/task:0", "/job:worker/task:1",
      "<tf.Variable 'small:0' shape=(2,) dtype=float32>")


def test_a_worker_with_gpus_runs_a_replica_on_each_like_tf():
  def replicas(mod):
    strategy = _strategy(mod, task_id=1, num_accelerators={"GPU": 2})
    with strategy.scope():
      v = tf.Variable(1.0, aggregation=tf.VariableAggregation.MEAN)
      result = strategy.extended.call_for_each_replica(lambda: v + 1.0)
    return (strategy.num_replicas_in_sync, strategy.extended.worker_devices,
            type(v).__name__, v.device, [t.device for t in result.values],
            strategy.reduce("SUM", result).device)
  assert oracle.compare(_in_graph(replicas), (TF1,), (OURS,)) == (
      2, ["/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1"],
      "AggregatingVariable", "/job:ps/task:0",
      ["/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1"],
      "/job:worker/replica:0/task:1/device:CPU:0")


def test_reductions_stay_on_the_worker_or_go_to_the_ps_like_tf():
  def reduced(mod):
    strategy = _strategy(mod, task_id=1)
    extended = strategy.extended
    value = tf.constant(2.0)
    with strategy.scope():
      v = tf.Variable(1.0)
    return (strategy.reduce("SUM", value).device,
            extended.reduce_to("SUM", value, "/job:ps/task:2").device,
            [t.device for t in extended.batch_reduce_to(
                "SUM", [(value, v), (value, "/job:worker/task:1/device:CPU:0")])],
            extended.broadcast_to(value, "/job:ps/task:1").device)
  assert oracle.compare(_in_graph(reduced), (TF1,), (OURS,)) == (
      "/job:worker/replica:0/task:1/device:CPU:0", "/job:ps/replica:0/task:2/device:CPU:0",
      ["/job:ps/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"],
      "/job:ps/replica:0/task:1/device:CPU:0")


@pytest.mark.parametrize("call", [
    lambda e, x: e.reduce_to("SUM", x, "/job:worker/task:0"),
    lambda e, x: e.batch_reduce_to("SUM", [(x, "/job:ps/task:0"), (x, "/job:worker/task:0")]),
], ids=["reduce_to", "batch_reduce_to"])
def test_reducing_to_another_worker_raises_like_tf(call):
  messages = []
  for mod in (TF1, OURS):
    with tf.Graph().as_default():
      with pytest.raises(ValueError) as error:
        call(_strategy(mod, task_id=1).extended, tf.constant(1.0))
      messages.append(str(error.value))
  assert messages[1] == messages[0] == (
      "Cannot reduce to another worker: '/job:worker/replica:0/task:0/device:CPU:0', "
      "current worker is '/job:worker/task:1'")


def test_updates_run_where_the_variables_are_like_tf():
  def updated(mod):
    strategy = _strategy(mod)
    extended = strategy.extended
    with strategy.scope():
      v = tf.Variable([1.0, 2.0], name="weights")
      step = tf.compat.v1.train.get_or_create_global_step()
      update = extended.update(v, lambda var, d: var.assign_add(d), args=(tf.constant([1.0, 1.0]),))
      ungrouped = extended.update(v, lambda var: var.assign_add([1.0, 1.0]), group=False)
      non_slot = extended.update_non_slot(extended.non_slot_devices([v, step]),
                                          lambda: tf.constant(3.0))
    return (update.device, type(ungrouped).__name__, len(ungrouped), non_slot.device,
            extended.non_slot_devices([v, step]).op.name, extended.read_var(v).device,
            extended.value_container(v) is v)
  assert oracle.compare(_in_graph(updated), (TF1,), (OURS,)) == (
      "/job:ps/task:0", "tuple", 1, "/job:ps/task:1", "global_step", "", True)


@pytest.mark.parametrize("cluster, task_type, task_id", [
    (CLUSTER, "worker", 0),
    (CLUSTER, "worker", 1),
    (dict(CLUSTER, chief=["c0:1"]), "chief", 0),
    (dict(CLUSTER, chief=["c0:1"]), "worker", 0),
    (CLUSTER, "evaluator", 0),
    (CLUSTER, "ps", 2),
])
def test_each_task_sees_its_own_devices_like_tf(cluster, task_type, task_id):
  def seen(mod):
    strategy = _strategy(mod, cluster, task_type, task_id)
    config = strategy.update_config_proto(tf.compat.v1.ConfigProto(allow_soft_placement=True))
    return (str(config), strategy.extended.worker_devices, strategy.extended.should_checkpoint,
            strategy.extended.experimental_should_init)
  config, devices, chief, _ = oracle.compare(seen, (TF1,), (OURS,))
  assert devices == [f"/job:{task_type}/replica:0/task:{task_id}/device:CPU:0"]
  assert chief == (task_type in ("chief", "evaluator") or
                   (task_type, task_id, "chief" in cluster) == ("worker", 0, False))
  assert "isolate_session_state" not in config and "allow_soft_placement: true" in config


@pytest.mark.parametrize("cluster, task_type, task_id", [
    ({"worker": ["w0:1"]}, "worker", 0),
    (CLUSTER, None, None),
    (CLUSTER, "worker", None),
    (CLUSTER, "worker", 2),
    (dict(CLUSTER, trainer=["t0:1"]), "worker", 0),
], ids=["no_ps", "no_task", "no_task_id", "task_id_outside", "unknown_job"])
def test_clusters_it_cannot_train_in_raise_value_error_like_tf(cluster, task_type, task_id):
  made = lambda mod: _strategy(mod, cluster, task_type, task_id)
  assert oracle.compare(made, (TF1,), (OURS,)) == ValueError


def test_what_is_not_a_resolver_is_a_value_error():
  """TF's strategy fails on the missing `cluster_spec` with an
  AttributeError; its MultiWorkerMirroredStrategy says ValueError. Ours is
  both."""
  oracle.check_misuse(
      lambda a: a.v1.experimental.ParameterServerStrategy("w0:1"), AttributeError,
      (ValueError, AttributeError),
      ["cluster_resolver must be an instance of tf.distribute.cluster_resolver.ClusterResolver",
       "got the str 'w0:1'"])


def test_configure_joins_a_cluster_like_tf():
  """A strategy made on one machine and configured, as a TF 1.x
  coordinator does, becomes the task's, and adjusts the session's config."""
  def configured(mod):
    strategy = _strategy(mod, cluster={})
    local = list(strategy.extended.worker_devices)
    config = tf.compat.v1.ConfigProto()
    strategy.configure(config, cluster_spec=CLUSTER, task_type="worker", task_id=1)
    with tf.Graph().as_default(), strategy.scope():
      devices = [tf.Variable(1.0).device for _ in range(4)]
    return (local, strategy.extended.worker_devices, strategy.extended.parameter_devices,
            strategy.extended.should_checkpoint, str(config), devices)
  assert oracle.compare(configured, (TF1,), (OURS,)) == (
      ["/job:localhost/replica:0/task:0/device:CPU:0"],
      ["/job:worker/replica:0/task:1/device:CPU:0"],
      ("/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:2"), False,
      'device_filters: "/job:worker/task:1"\ndevice_filters: "/job:ps"\n',
      ["/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:2", "/job:ps/task:0"])
  assert oracle.compare(lambda mod: _strategy(mod, cluster={}).configure(cluster_spec=CLUSTER),
                 (TF1,), (OURS,)) == ValueError


def test_the_default_resolver_reads_tf_config_like_tf(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER,
                                              "task": {"type": "worker", "index": 1}}))
  def made(mod):
    extended = mod.experimental.ParameterServerStrategy().extended
    return extended.worker_devices, extended.parameter_devices, extended.should_checkpoint
  assert oracle.compare(made, (TF1,), (OURS,))[0] == ["/job:worker/replica:0/task:1/device:CPU:0"]


@pytest.mark.parametrize("cluster, task_type, task_id", [
    (dict(CLUSTER, chief=["c0:1"]), "chief", 0),
    (dict(CLUSTER, chief=["c0:1"]), "worker", 1),
    (dict(CLUSTER, evaluator=["e0:1"]), "evaluator", 0),
])
def test_input_functions_get_this_workers_share_like_tf(cluster, task_type, task_id):
  def contexts(mod):
    strategy = _strategy(mod, cluster, task_type, task_id)
    seen = []
    iterator = strategy.make_input_fn_iterator(
        lambda ctx: seen.append(ctx) or tf.data.Dataset.range(4))
    host = strategy.experimental_local_results(iterator.get_next())[0].device
    return [(c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync)
            for c in seen], host
  seen, host = oracle.compare(_in_graph(contexts), (TF1,), (OURS,))
  assert host == f"/job:{task_type}/replica:0/task:{task_id}/device:CPU:0"
  assert seen == [(1, 0, 1)] if task_type == "evaluator" else [
      (3, 0 if task_type == "chief" else task_id + 1, 1)]


def test_an_evaluator_outside_the_cluster_reads_its_own_input():
  """TensorFlow 2.21 looks the evaluator job up in the cluster: `KeyError`."""
  def contexts(mod):
    seen = []
    _strategy(mod, task_type="evaluator").make_input_fn_iterator(
        lambda ctx: seen.append(ctx) or tf.data.Dataset.range(4))
    return [(c.num_input_pipelines, c.input_pipeline_id) for c in seen]
  assert _in_graph(contexts)(OURS) == [(1, 0)]
  with pytest.raises(KeyError):
    _in_graph(contexts)(TF1)


def test_run_and_datasets_return_their_results_where_tensorflow_loses_them():
  """TensorFlow 2.21's `run`, `experimental_distribute_dataset` and
  `distribute_datasets_from_function` return None in a graph."""
  with tf.Graph().as_default():
    theirs = _strategy(TF1)
    assert theirs.run(lambda: tf.constant(1.0)) is None
    assert theirs.experimental_distribute_dataset(tf.data.Dataset.range(2)) is None
  with tf.Graph().as_default():
    strategy = _strategy(OURS, cluster={})
    doubled = strategy.run(lambda x: x * 2.0, args=(tf.constant(2.0),))
    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(4).batch(2)).make_initializable_iterator()
    from_function = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.range(3)).make_initializable_iterator()
    with tf.compat.v1.Session() as session:
      session.run([batches.initializer, from_function.initializer])
      assert session.run(doubled) == 4.0
      assert session.run(batches.get_next()).tolist() == [0, 1]
      assert session.run(from_function.get_next()) == 0


def test_per_replica_input_is_refused_like_tf():
  options = tf.distribute.InputOptions(
      experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
  def per_replica(mod):
    with tf.Graph().as_default():
      _strategy(mod).distribute_datasets_from_function(
          lambda ctx: tf.data.Dataset.range(2), options)
  assert oracle.compare(per_replica, (TF1,), (OURS,)) == NotImplementedError


def test_numpy_datasets_come_from_the_worker():
  with tf.Graph().as_default():
    strategy = _strategy(OURS, task_id=1)
    dataset = strategy.experimental_make_numpy_dataset(np.arange(3))
    assert [op.device for op in tf.compat.v1.get_default_graph().get_operations()
            if op.type == "Const"] == ["/job:worker/replica:0/task:1/device:CPU:0"]
    assert dataset.element_spec == tf.TensorSpec([], tf.int64)
