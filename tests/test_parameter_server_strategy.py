"""ParameterServerStrategy, ClusterCoordinator and ShardedVariable.

Cluster programs (`ps_scenarios.py`) run in a chief process of a
`multi_worker.LocalCluster`, once with `tf.distribute` and once with
`tf_distribute_lite`, and their facts are compared; worker and ps tasks are
processes of their own (TensorFlow's servers in one process with the
coordinator deadlock under concurrent functions on a 2-core machine), but
for the one-worker training run, whose servers start in the chief's
process as in TensorFlow's tutorial.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_distribute_lite as tfd
from tf_distribute_lite.sharded_variable import ShardedVariable
from tf_distribute_lite.sharded_variable import shard_arguments

from multi_worker import LocalCluster
from multi_worker import run_once
from multi_worker import run_together
import oracle

MODULES = ["tf", "tfd"]


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
  """basics on 2 workers and 2 ps processes, training and keras_fit on 1
  worker with in-process servers, for both modules; keras_fit on 2 workers
  for tfd; at the same time."""
  def run(directory):
    runs = [(LocalCluster(2, directory / f"basics_{m}", num_ps=2), "ps_scenarios.basics", m, {})
            for m in MODULES]
    runs += [(LocalCluster(1, directory / f"training_{m}", num_ps=2), "ps_scenarios.training", m,
              {"args": {"servers": "in_process"}}) for m in MODULES]
    runs += [(LocalCluster(1, directory / f"keras_fit_{m}", num_ps=2), "ps_scenarios.keras_fit", m,
              {"args": {"servers": "in_process", "evaluation_shards": "auto"}})
             for m in MODULES]
    runs.append((LocalCluster(2, directory / "keras_fit_2", num_ps=2),
                 "ps_scenarios.keras_fit", "tfd", {}))
    results = run_together(runs, timeout=300)
    return {(scenario, m, cluster.num_workers): result[("chief", 0)]
            for (cluster, scenario, m, _), result in zip(runs, results)}
  return run_once(tmp_path_factory, "ps_cluster_runs", run)


def _facts(runs, scenario, module, workers=1):
  facts = runs[(f"ps_scenarios.{scenario}", module, workers)]
  assert "error" not in facts, facts.get("traceback", facts)
  return facts


def _without(facts, key):
  return {k: v for k, v in facts.items() if k != key}


def test_strategy_and_coordinator_match_tensorflow(cluster_runs):
  ours, theirs = (_facts(cluster_runs, "basics", "tfd", 2),
                  _facts(cluster_runs, "basics", "tf", 2))
  assert _without(ours, "bad_input") == _without(theirs, "bad_input")
  assert ours["counter"] == 10.0 and ours["counter_after"] == 11.0
  assert ours["unbuilt_iter"] == "ValueError"
  assert ours["plain_dataset_on_workers"] == ours["distributed_dataset_on_workers"] == 0
  assert ours["tf_coordinator_is_this"] and ours["tf_remote_value"]
  assert ours["placement"][2:4] == [["/job:ps/replica:0/task:0/device:CPU:0", [51, 4]],
                                    ["/job:ps/replica:0/task:1/device:CPU:0", [50, 4]]]
  assert ours["misuse"] == {"python_function": "TypeError",
                            "remote_value_argument": "ValueError",
                            "worker_index_outside": "RuntimeError"}
  assert ours["user_error"] == {"join": "InvalidArgumentError",
                                "fetch": "InvalidArgumentError", "works_after": True}
  assert ours["dropped_values"] == {"counter": 14.0, "failed_join": "InvalidArgumentError"}


@pytest.mark.parametrize("name, theirs, ours, fragments", [
    ("kwargs_list", "TypeError", "TypeError",
     ["`kwargs` of ClusterCoordinator.schedule", "must be a dict", "got the list [1.0]"]),
    ("args_not_a_tuple", "TypeError", "TypeError",
     ["`args` of ClusterCoordinator.schedule", "tuple or list", "got the float 3.0"]),
    ("dataset_not_a_function", "ValueError", "ValueError",
     ["create_per_worker_dataset takes a function returning a dataset", "got the int 42"]),
    # TF takes the function and fails at iter() on `element_spec`.
    ("dataset_fn_returns_int", "AttributeError", "ValueError",
     ["`dataset_fn` of create_per_worker_dataset must return a tf.data.Dataset",
      "it returned the int 42"]),
])
def test_coordinator_bad_input_raises_a_clear_error(cluster_runs, name, theirs, ours, fragments):
  their_error = _facts(cluster_runs, "basics", "tf", 2)["bad_input"][name]
  our_error = _facts(cluster_runs, "basics", "tfd", 2)["bad_input"][name]
  assert their_error[0] == theirs and our_error[0] == ours, (their_error, our_error)
  for fragment in fragments:
    assert fragment in our_error[1]


def test_tf_keras_training_with_sharded_variables_matches_tensorflow(cluster_runs):
  ours, theirs = _facts(cluster_runs, "training", "tfd"), _facts(cluster_runs, "training", "tf")
  assert ours["embedding"] == ["ShardedVariable", [[5, 3], [5, 3]]] == theirs["embedding"]
  assert ours["trainable"] == theirs["trainable"]
  np.testing.assert_allclose(ours["loss"], theirs["loss"], rtol=1e-6)
  for a, b in zip(ours["weights"], theirs["weights"]):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_tf_keras_fit_evaluate_predict_match_tensorflow(cluster_runs):
  """tf_keras makes TensorFlow's `ClusterCoordinator(strategy)`, which
  answers tfd's coordinator: on one worker, steps run in order and every
  number equals TensorFlow's."""
  ours, theirs = _facts(cluster_runs, "keras_fit", "tfd"), _facts(cluster_runs, "keras_fit", "tf")
  assert ours == theirs
  assert ours["steps"] == 16
  assert [v[1] for v in ours["variables"][:2]] == [[2, 4], [1, 4]]  # sharded kernel
  assert "epoch2.index" in ours["checkpoints"]
  assert ours["histories"][2]["loss"][0] < ours["histories"][0]["loss"][0] / 10


def test_tf_keras_fit_on_two_workers_trains_asynchronously(cluster_runs):
  ours, one_worker = _facts(cluster_runs, "keras_fit", "tfd", 2), _facts(cluster_runs, "keras_fit", "tfd")
  assert ours["steps"] == 16
  assert ours["checkpoints"] == one_worker["checkpoints"]
  assert ours["histories"][2]["loss"][0] < ours["histories"][0]["loss"][0] / 10


def test_keras3_fit_refuses_parameter_server_strategy_as_with_tensorflow(cluster_runs):
  ours, theirs = _facts(cluster_runs, "keras_fit", "tfd"), _facts(cluster_runs, "keras_fit", "tf")
  assert ours["keras3_fit"] == theirs["keras3_fit"]
  assert ours["keras3_fit"][0] == "ValueError"
  assert "create_per_worker_dataset" in ours["keras3_fit"][1]


def test_checkpoint_keys_match_tensorflow_and_restore_into_any_sharding(cluster_runs):
  ours, theirs = _facts(cluster_runs, "training", "tfd"), _facts(cluster_runs, "training", "tf")
  assert tf.train.list_variables(ours["checkpoint"]) == tf.train.list_variables(theirs["checkpoint"])
  key = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
  expected = np.asarray(ours["weights"][0] + ours["weights"][1])
  reader = tf.train.load_checkpoint(theirs["checkpoint"])
  np.testing.assert_allclose(reader.get_tensor(key), expected, rtol=1e-6)
  # TensorFlow's checkpoint into 3 shards of ours, ours into one variable.
  three = ShardedVariable([tf.Variable(tf.zeros([n, 3])) for n in (4, 3, 3)])
  plain = tf.Variable(tf.zeros([10, 3]))
  for variable, path in ((three, theirs["checkpoint"]), (plain, ours["checkpoint"])):
    holder = tf.train.Checkpoint(model=tf.train.Checkpoint(
        **{"layer_with_weights-0": tf.train.Checkpoint(embeddings=variable)}))
    holder.read(path).expect_partial()
    np.testing.assert_allclose(tf.convert_to_tensor(variable), expected, rtol=1e-6)


def test_saved_model_serves_lookups_as_tensorflows(cluster_runs):
  ours, theirs = _facts(cluster_runs, "training", "tfd"), _facts(cluster_runs, "training", "tf")
  ids = tf.constant([9, 0, 5, 4])
  loaded = [tf.saved_model.load(f["saved_model"]) for f in (ours, theirs)]
  served = [model.lookup(ids).numpy() for model in loaded]
  np.testing.assert_allclose(served[0], served[1], rtol=1e-6)
  whole = np.asarray(ours["weights"][0] + ours["weights"][1])
  np.testing.assert_allclose(served[0], whole[[9, 0, 5, 4]], rtol=1e-6)


def test_done_is_true_once_the_only_function_is_fetched(cluster_runs):
  for module in MODULES:
    assert _facts(cluster_runs, "basics", module, 2)["done_after_fetch"] == 30, module


def test_add_slot_of_a_sharded_variable_is_tensorflows(cluster_runs):
  """A legacy tf_keras optimizer's `add_slot` of a ShardedVariable: one
  whole variable on the coordinator, as in TensorFlow."""
  ours, theirs = (_facts(cluster_runs, "training", m)["legacy_slots"]["add_slot"] for m in ("tfd", "tf"))
  assert ours == theirs
  assert ours[:3] == ["ShardedVariable/rms:0", [10, 3], "/job:chief/replica:0/task:0/device:CPU:0"]


def test_legacy_optimizer_slots_of_a_sharded_variable_are_saved_as_tensorflows(cluster_runs):
  ours, theirs = (_facts(cluster_runs, "training", m)["legacy_slots"] for m in ("tfd", "tf"))
  assert ours["checkpoint_keys"] == theirs["checkpoint_keys"]
  assert ours["slot"][:2] == theirs["slot"][:2] == [
      "ShardedVariable", ["/job:ps/replica:0/task:0/device:CPU:0",
                          "/job:ps/replica:0/task:1/device:CPU:0"]]
  np.testing.assert_allclose(ours["slot"][2], theirs["slot"][2], rtol=1e-6)
  np.testing.assert_allclose(ours["checkpoint_slot"], ours["slot"][2], rtol=1e-6)
  assert np.min(ours["checkpoint_slot"]) > 0  # trained


def test_lost_worker_reruns_its_function_restarted_worker_is_used_lost_ps_fails(tmp_path):
  facts = LocalCluster(2, tmp_path, num_ps=1).run(
      "ps_scenarios.faults", "tfd", timeout=150)[("chief", 0)]
  assert "error" not in facts, facts.get("traceback", facts)
  assert facts["worker_lost"]["all_done"] and facts["worker_lost"]["counter_at_least"]
  assert facts["restarted_worker_used"]
  reads = facts["iterator_reads"]
  assert sorted(reads) == ["0", "1"], reads
  assert all(values == sorted(values) for values in reads.values()), reads
  assert facts["ps_lost"]["join"] == "UnavailableError"
  assert facts["ps_lost"]["fetch"] in ("UnavailableError", "CancelledError")
  assert facts["ps_lost"]["again"] == "UnavailableError"
  assert facts["ps_lost"]["seconds"] < 30


# --- TensorFlow's parameter-server tutorial (`ps_tutorial.py`).

@pytest.fixture(scope="module")
def tutorial_runs(tmp_path_factory):
  """The tutorial under both modules on 2 workers and 2 ps processes, and on
  1 worker with in-process servers (where every number is deterministic),
  at the same time."""
  def run(directory):
    runs = [(LocalCluster(workers, directory / f"tutorial_{m}_{workers}", num_ps=2),
             "ps_tutorial.tutorial", m, {"args": args})
            for workers, args in ((2, {}), (1, {"servers": "in_process"})) for m in MODULES]
    results = run_together(runs, timeout=300)
    return {(m, cluster.num_workers): result[("chief", 0)]
            for (cluster, _, m, _), result in zip(runs, results)}
  return run_once(tmp_path_factory, "ps_tutorial_runs", run)


def _tutorial(runs, module, workers):
  facts = runs[(module, workers)]
  assert "error" not in facts, facts.get("traceback", facts)
  return facts


def _assert_close(ours, theirs, path="facts"):
  """Equal structures, with floats equal to TensorFlow's within 1e-5."""
  if isinstance(theirs, dict):
    assert sorted(ours) == sorted(theirs), path
    for key in theirs:
      _assert_close(ours[key], theirs[key], f"{path}[{key!r}]")
  elif isinstance(theirs, list) and any(isinstance(x, (list, dict, str)) for x in theirs):
    assert len(ours) == len(theirs), path
    for i, (a, b) in enumerate(zip(ours, theirs)):
      _assert_close(a, b, f"{path}[{i}]")
  elif isinstance(theirs, (float, list)):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7, err_msg=path)
  else:
    assert ours == theirs, path


def test_tutorial_on_one_worker_gives_tensorflows_numbers(tutorial_runs):
  """Model.fit with its callbacks, the custom loop, the checkpoints, and the
  evaluations inline and side-car: every number is TensorFlow's."""
  ours, theirs = _tutorial(tutorial_runs, "tfd", 1), _tutorial(tutorial_runs, "tf", 1)
  _assert_close(ours, theirs)
  assert ours["epoch_accuracy"][-1] == 1.0
  assert ours["fit"]["history"]["loss"][1] < ours["fit"]["history"]["loss"][0]


def test_tutorial_on_two_workers_matches_tensorflow(tutorial_runs):
  """Asynchronous training: what does not depend on the order in which the
  workers update the variables is TensorFlow's; each checkpoint holds what
  the model and its optimizer held, and evaluations from it agree."""
  ours, theirs = _tutorial(tutorial_runs, "tfd", 2), _tutorial(tutorial_runs, "tf", 2)
  same = ("embedding_devices", "rms", "done_after_fetch", "restored_iterations",
          "restored_rms_matches", "side_car_embeddings_match", "checkpoint")
  assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
  assert ({k: v for k, v in ours["fit"].items() if k not in ("history", "weights")} ==
          {k: v for k, v in theirs["fit"].items() if k not in ("history", "weights")})
  assert len(ours["fit"]["history"]["loss"]) == len(theirs["fit"]["history"]["loss"]) == 2
  assert ours["checkpoint"]["embeddings_match"] and ours["checkpoint"]["rms_match"]
  assert ours["checkpoint"]["iterations"] == ours["restored_iterations"] == 12
  assert ours["done_after_fetch"] and ours["restored_rms_matches"]
  for facts in (ours, theirs):
    assert [name for name, _ in facts["side_car"]] == ["ckpt-3"]
    assert facts["side_car"][0][1]["binary_accuracy"] == facts["direct_eval_accuracy"]


def test_backup_and_restore_trains_and_removes_its_backup_as_tensorflow(tutorial_runs):
  """tf_keras's BackupAndRestore under ParameterServerStrategy: the chief
  backs up at each epoch and removes the backup when `fit` ends."""
  for workers in (1, 2):
    ours, theirs = _tutorial(tutorial_runs, "tfd", workers), _tutorial(tutorial_runs, "tf", workers)
    assert ours["fit"]["backup"] == theirs["fit"]["backup"] == []
    assert ours["fit"]["working_dir"] == ["backup", "ckpt", "log"]
    assert ours["fit"]["iterations"] == theirs["fit"]["iterations"] == 20


# --- Without a cluster.

_PS_AND_WORKER = {"worker": ["localhost:1"], "ps": ["localhost:2"]}


@pytest.mark.parametrize("cluster", [
    {"worker": ["localhost:1"]}, {"ps": ["localhost:1"]}, {"chief": ["localhost:1"]}, {},
    dict(_PS_AND_WORKER, chief=["localhost:3", "localhost:4"]),
    dict(_PS_AND_WORKER, evaluator=["localhost:3", "localhost:4"]),
    dict(_PS_AND_WORKER, trainer=["localhost:3"])])
@pytest.mark.parametrize("mod", [tfd, tf.distribute], ids=MODULES[::-1])
def test_a_cluster_it_cannot_train_in_is_a_value_error(mod, cluster):
  resolver = mod.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster))
  with pytest.raises(ValueError):
    mod.ParameterServerStrategy(resolver)


@pytest.mark.parametrize("snippet, fragments", [
    (lambda a: a.mod.ParameterServerStrategy("localhost:2222"), ["got the str 'localhost:2222'"]),
    (lambda a: a.mod.experimental.ParameterServerStrategy(None), ["got the NoneType None"]),
], ids=["string", "none"])
def test_what_is_not_a_resolver_is_a_value_error(snippet, fragments):
  """TF's ParameterServerStrategy fails on the missing `cluster_spec` with
  an AttributeError; its MultiWorkerMirroredStrategy says ValueError. Ours
  is both."""
  oracle.check_misuse(snippet, AttributeError, (ValueError, AttributeError), [
      "cluster_resolver must be an instance of tf.distribute.cluster_resolver.ClusterResolver"]
      + fragments)


def test_a_partitioner_that_is_no_function_is_a_type_error():
  """Before any server is reached; TF takes it and fails at the first
  variable with a TypeError ("'int' object is not callable")."""
  resolver = tfd.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}))
  with pytest.raises(TypeError, match="variable_partitioner must be .* got the int 2"):
    tfd.ParameterServerStrategy(resolver, variable_partitioner=2)


@pytest.mark.parametrize("mod", [tfd, tf.distribute], ids=MODULES[::-1])
def test_worker_index_outside_a_function_is_a_runtime_error(mod):
  with pytest.raises(RuntimeError, match="Cannot retrieve the worker index"):
    mod.coordinator.experimental_get_current_worker_index()


def test_coordinator_over_another_strategy_is_a_value_error():
  # TensorFlow 2.21 raises AttributeError; its docstring promises ValueError.
  with pytest.raises(AttributeError):
    tf.distribute.coordinator.ClusterCoordinator(tf.distribute.OneDeviceStrategy("/cpu:0"))
  with pytest.raises(ValueError, match="Only `tf.distribute.experimental.ParameterServerStrategy`"):
    tfd.coordinator.ClusterCoordinator(tfd.OneDeviceStrategy("/cpu:0"))


def _both(values):
  """Our ShardedVariable and TensorFlow's over fresh copies of `values`."""
  return [cls([tf.Variable(v) for v in values])
          for cls in (ShardedVariable, tf.__internal__.distribute.ShardedVariable)]


def test_sharded_variable_reads_and_updates_as_tensorflows():
  values = [np.arange(6.0, dtype=np.float32).reshape(3, 2),
            np.arange(6.0, 10.0, dtype=np.float32).reshape(2, 2)]
  for update in ("assign", "assign_add", "assign_sub"):
    results = []
    for sharded in _both(values):
      getattr(sharded, update)(tf.ones([5, 2]))
      results.append([tf.convert_to_tensor(sharded).numpy(), (sharded + 1.0).numpy(),
                      sharded.shape, sharded.dtype])
    np.testing.assert_equal(results[0], results[1])
  sparse = tf.IndexedSlices(tf.constant([[1.0, 1.0], [2.0, 2.0]]), tf.constant([4, 1]))
  results = []
  for sharded in _both(values):
    sharded.scatter_add(sparse)
    after_add = sharded.numpy()
    sharded.batch_scatter_update(sparse)
    results.append([after_add, sharded.numpy(),
                    tf.nn.embedding_lookup(sharded, tf.constant([[4, 2], [0, 3]])).numpy()])
  np.testing.assert_equal(results[0], results[1])
  # TensorFlow's sparse_read returns the rows shard by shard, not in order.
  np.testing.assert_equal(_both(values)[0].sparse_read([4, 0]).numpy(), [[8, 9], [0, 1]])


def test_embedding_lookup_in_a_function_reads_shards_with_gradients():
  # TensorFlow 2.21's own ShardedVariable fails here on shards of unequal
  # sizes; the reference is one plain variable.
  whole = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
  sharded = ShardedVariable([tf.Variable(whole[:2]), tf.Variable(whole[2:])])
  plain = tf.Variable(whole)
  results = []
  for v in (sharded, plain):
    @tf.function
    def lookup_grad(v=v):
      parts = v.variables if isinstance(v, ShardedVariable) else [v]
      with tf.GradientTape() as tape:
        looked_up = tf.nn.embedding_lookup(v, tf.constant([[2, 0], [2, 1]]))
        loss = tf.reduce_sum(looked_up * tf.constant([1.0, 10.0]))
      return looked_up, tf.concat([tf.convert_to_tensor(g) for g in tape.gradient(loss, parts)], 0)
    results.append([t.numpy() for t in lookup_grad()])
  np.testing.assert_equal(results[0], results[1])


def test_checkpoint_of_ours_and_tensorflows_sharded_variables_are_interchangeable(tmp_path):
  ours, theirs = _both([np.arange(4.0, dtype=np.float32).reshape(2, 2),
                        np.arange(4.0, 6.0, dtype=np.float32).reshape(1, 2)])
  paths = [tf.train.Checkpoint(v=v).save(str(tmp_path / name))
           for v, name in ((ours, "ours"), (theirs, "theirs"))]
  assert tf.train.list_variables(paths[0]) == tf.train.list_variables(paths[1])
  for path in paths:
    target = ShardedVariable([tf.Variable(tf.zeros([1, 2])) for _ in range(3)])
    tf.train.Checkpoint(v=target).read(path).expect_partial()
    np.testing.assert_equal(target.numpy(), np.arange(6.0).reshape(3, 2))


def test_legacy_optimizer_slots_of_ours_and_tensorflows_sharded_variables_are_saved_alike(tmp_path):
  """tf_keras's legacy optimizers give the slot of a ShardedVariable as one
  of TensorFlow's ShardedVariables over its shards' slots (recognised with
  `isinstance`), which a checkpoint saves next to the variable."""
  saved = []
  for cls in (ShardedVariable, tf.__internal__.distribute.ShardedVariable):
    # Named as ParameterServerStrategy names shards: tf_keras keys a
    # ShardedVariable's slots by its first shard's id with "part_0" replaced.
    sharded = cls([tf.Variable([[1.0, 2.0], [3.0, 4.0]], name="v/part_0"),
                   tf.Variable([[5.0, 6.0]], name="v/part_1")])
    assert isinstance(sharded, tf.__internal__.distribute.ShardedVariable)
    optimizer = tf_keras.optimizers.legacy.RMSprop(0.1)
    optimizer.apply_gradients(zip([tf.ones([2, 2]), tf.fill([1, 2], 2.0)], sharded.variables))
    slot = optimizer.get_slot(sharded, "rms")
    path = tf.train.Checkpoint(v=sharded, optimizer=optimizer).save(
        str(tmp_path / cls.__module__ / "ckpt"))
    saved.append([type(slot).__name__, slot.numpy(), tf.train.list_variables(path),
                  tf.train.load_checkpoint(path).get_tensor(
                      "v/.OPTIMIZER_SLOT/optimizer/rms/.ATTRIBUTES/VARIABLE_VALUE")])
  np.testing.assert_equal(saved[0], saved[1])
  np.testing.assert_allclose(saved[0][3], [[0.1, 0.1], [0.1, 0.1], [0.4, 0.4]], rtol=1e-6)


def test_sharded_variable_rejects_what_tensorflows_rejects():
  for make in (ShardedVariable, tf.__internal__.distribute.ShardedVariable):
    with pytest.raises(TypeError):
      make([])
    with pytest.raises(ValueError):
      make([tf.Variable([1.0]), tf.Variable([1])])
    with pytest.raises(ValueError):
      make([tf.Variable([[1.0]]), tf.Variable([[1.0, 2.0]])])


def test_shard_arguments_give_each_shard_its_rows_of_the_initial_value():
  whole = np.arange(10.0, dtype=np.float32).reshape(5, 2)
  made = []

  def only_its_rows(partition_shape, partition_offset):
    made.append((partition_shape, partition_offset))
    return whole[partition_offset[0]:partition_offset[0] + partition_shape[0]]
  partitioner = tfd.experimental.partitioners.FixedShardsPartitioner(2)
  for initial_value, given in ((whole, {}), (only_its_rows, {"shape": (5, 2), "dtype": "float32"})):
    shards = shard_arguments(dict(given, initial_value=initial_value, name="v"), partitioner)
    assert [(s["name"], s["shape"]) for s in shards] == [("v/part_0", (3, 2)), ("v/part_1", (2, 2))]
    np.testing.assert_equal(np.concatenate([s["initial_value"]() for s in shards]), whole)
  assert made == [((3, 2), (0, 0)), ((2, 2), (3, 0))]
  # Whole: no partitioner, a scalar, one row.
  assert shard_arguments({"initial_value": whole}, None) is None
  assert shard_arguments({"initial_value": 1.0}, partitioner) is None
  assert shard_arguments({"initial_value": [[1.0, 2.0]]}, partitioner) is None
  with pytest.raises(ValueError, match="without specifying `initial_value`"):
    shard_arguments({"shape": (5, 2), "dtype": "float32"}, partitioner)
  with pytest.raises(ValueError, match="elements are 1 besides the first element"):
    shard_arguments({"initial_value": whole}, lambda shape, dtype: [2, 2])
