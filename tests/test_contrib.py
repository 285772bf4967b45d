"""The TF 1.x contrib tower API (`tfd.contrib`): the spec page's behaviour,
eagerly and in TF1 graphs, and a contrib-era training script."""

import contextlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

from conftest import DEVICES
from test_example import environment_of_a_newcomer
from test_example import tensorflow_log_lines

contrib = tfd.contrib
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "contrib_training.py"


@pytest.fixture(scope="module")
def tpu_resolver():
  return tfd.cluster_resolver.TPUClusterResolver("emulated:v4-8")


def _mirrored():
  return contrib.MirroredStrategy(["/cpu:0", "/cpu:1"])


def test_properties_of_each_strategy(tpu_resolver):
  mirrored, one, tpu = _mirrored(), contrib.OneDeviceStrategy("/cpu:1"), contrib.TPUStrategy(
      tpu_resolver, steps_per_run=3)
  assert (mirrored.num_towers, mirrored.is_single_tower, mirrored.num_hosts,
          mirrored.num_towers_per_host) == (2, False, 1, 2)
  assert mirrored.worker_devices == DEVICES[:2] == mirrored.parameter_devices
  assert (mirrored.between_graph, mirrored.should_checkpoint, mirrored.should_init,
          mirrored.should_save_summary) == (False, True, True, True)
  assert one.worker_devices == (DEVICES[1],) and one.is_single_tower
  assert one.worker_device_index == 0
  assert [int(i) for i in mirrored.unwrap(mirrored.worker_device_index)] == [0, 1]
  assert isinstance(tpu, contrib.OneDeviceStrategy)
  assert (tpu.num_towers, tpu.steps_per_run, tpu.num_hosts, tpu.num_towers_per_host) == (4, 3, 1, 4)
  assert contrib.TPUStrategy(tpu_resolver, 1, num_cores=2).num_towers == 2


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_spec_merge_call_example(graph):
  def merge_fn(distribution, three_plus_tower_id):
    return sum(distribution.unwrap(three_plus_tower_id))

  def fn(three):
    tower_ctx = contrib.get_tower_context()
    v = three + tower_ctx.tower_id
    s = tower_ctx.merge_call(merge_fn, v)
    return s + v

  def run():
    distribution = _mirrored()
    with distribution.scope():
      assert contrib.get_cross_tower_context() is distribution
      assert contrib.get_distribution_strategy() is distribution
      merged_results = distribution.call_for_each_tower(fn, tf.constant(3), run_concurrently=False)
    return distribution.unwrap(merged_results)

  if graph:
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      assert session.run(run()) == [10, 11]
  else:
    assert [int(t) for t in run()] == [10, 11]


# --- The spec page's examples, as written there (`tf.get_tower_context` is
# `contrib.get_tower_context`, `tf.get_variable` `tf.compat.v1.get_variable`).

@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_spec_merge_call_example_verbatim(graph, capsys):
  distribution = _mirrored()
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    # Called once in "cross-tower" context.
    def merge_fn(distribution, three_plus_tower_id):
      # sum the values across towers
      return sum(distribution.unwrap(three_plus_tower_id))

    # Called once per tower in `distribution`, in a "tower" context.
    def fn(three):
      tower_ctx = contrib.get_tower_context()
      v = three + tower_ctx.tower_id
      # Computes the sum of the `v` values across all towers.
      s = tower_ctx.merge_call(merge_fn, v)
      return s + v

    with distribution.scope():
      # in "cross-tower" context
      merged_results = distribution.call_for_each_tower(fn, 3)
      # merged_results has the values from every tower execution of `fn`.
      print(distribution.unwrap(merged_results))  # Prints a list
  assert capsys.readouterr().out == "[10, 11]\n"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_spec_worker_device_index_example(graph):
  distribution_strategy = contrib.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
  ran_on = []
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    with distribution_strategy.scope():

      def fn(device_id):
        # device_id is an integer. `fn` is being executed on device:
        #    distribution_strategy.worker_devices[device_id].
        ran_on.append((device_id, distribution_strategy.worker_devices[device_id],
                       contrib.get_tower_context().device))

      distribution_strategy.call_for_each_tower(
          fn, distribution_strategy.worker_device_index)
  assert ran_on == [(i, DEVICES[i], DEVICES[i]) for i in range(3)]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_spec_colocate_vars_with_example(graph):
  distribution_strategy = _mirrored()
  seen = []
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    with distribution_strategy.scope():
      var1 = tf.compat.v1.get_variable("var1", [], initializer=tf.compat.v1.ones_initializer())
      with distribution_strategy.colocate_vars_with(var1):
        # var2 and var3 will be created on the same device(s) as var1
        var2 = tf.compat.v1.get_variable("var2", [], initializer=tf.compat.v1.ones_initializer())
        var3 = tf.compat.v1.get_variable("var3", [], initializer=tf.compat.v1.ones_initializer())

      def fn(v1, v2, v3):
        # operates on v1 from var1, v2 from var2, and v3 from var3
        seen.append((v1.device, v2.device, v3.device))
        return v1.assign_add(v2 + v3)

      # `fn` runs on every device `v1` is on, `v2` and `v3` will be there too.
      updated = distribution_strategy.update(var1, fn, var2, var3)
    values = distribution_strategy.unwrap(updated)
    if graph:
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values = session.run(values)
  assert [float(v) for v in values] == [3.0, 3.0]
  assert seen == [(d, d, d) for d in DEVICES[:2]]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_spec_distribute_dataset_example(graph):
  distribution_strategy = _mirrored()

  def tower_fn(x):
    return x * tf.cast(contrib.get_tower_context().tower_id + 1, tf.float32)

  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    def dataset_fn():
      return tf.data.Dataset.from_tensors([[1.]]).repeat()
    with distribution_strategy.scope():
      distributed_dataset = distribution_strategy.distribute_dataset(dataset_fn)
      iterator = distributed_dataset.make_one_shot_iterator()
      tower_results = distribution_strategy.call_for_each_tower(
          tower_fn, iterator.get_next())
    values = distribution_strategy.unwrap(tower_results)
    if graph:
      with tf.compat.v1.Session() as session:
        values = session.run(values)
  assert [np.asarray(v).tolist() for v in values] == [[[1.0]], [[2.0]]]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_tower_context_members(graph):
  seen = []

  def fn():
    tower = contrib.get_tower_context()
    seen.append((tower.tower_id, tower.num_towers, tower.is_single_tower, tower.device,
                 tower.distribution_strategy is distribution))
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    distribution = _mirrored()
    with distribution.scope():
      distribution.call_for_each_tower(fn)
    distribution = contrib.OneDeviceStrategy("/cpu:3")
    with distribution.scope():
      distribution.call_for_each_tower(fn)
  # A TF1 graph names devices without a job, as TensorFlow's compat.v1
  # strategies do there.
  devices = [d.replace("/job:localhost", "") if graph else d for d in DEVICES]
  assert seen == [(0, 2, False, devices[0], True), (1, 2, False, devices[1], True),
                  (0, 1, True, devices[3], True)]


def test_default_tower_context_and_strategy():
  tower = contrib.get_tower_context()
  assert (tower.tower_id, tower.num_towers, tower.is_single_tower) == (0, 1, True)
  with tf.device("/cpu:2"):
    assert contrib.get_tower_context().device == DEVICES[2]
  t = tf.constant(1.0)
  assert contrib.get_distribution_strategy().broadcast(t) is t


def test_outside_any_scope_the_default_tower_context():
  assert contrib.get_tower_context().tower_id == 0
  assert contrib.get_cross_tower_context() is None
  assert not contrib.has_distribution_strategy()
  assert contrib.get_distribution_strategy().num_towers == 1
  with _mirrored().scope():
    assert contrib.has_distribution_strategy()
    assert contrib.get_tower_context() is None


def test_get_variable_makes_one_copy_per_device():
  distribution = _mirrored()
  with tf.Graph().as_default():
    with distribution.scope():
      v = tf.compat.v1.get_variable("v", [2], initializer=tf.compat.v1.ones_initializer(),
                                    aggregation=tf.compat.v1.VariableAggregation.ONLY_FIRST_TOWER)
    assert [c.device for c in distribution.unwrap(v)] == list(DEVICES[:2])
    assert tf.compat.v1.trainable_variables() == [v]
    assert distribution.value_container(distribution.unwrap(v)[1]) is v


def test_reductions_and_updates():
  distribution = _mirrored()
  with distribution.scope():
    v = tf.Variable(1.0)
    values = distribution.call_for_each_tower(
        lambda: tf.cast(contrib.get_tower_context().tower_id, tf.float32) + 1.0)
  agg = tf.compat.v1.VariableAggregation
  assert distribution.reduce(agg.SUM, values, "/cpu:0").numpy() == 3.0
  assert [t.numpy() for t in distribution.unwrap(distribution.reduce(agg.MEAN, values, v))] == [1.5, 1.5]
  assert [t.numpy() for t in distribution.unwrap(
      distribution.reduce(agg.ONLY_FIRST_TOWER, values, v))] == [1.0, 1.0]
  summed, first = distribution.batch_reduce(
      tf.VariableAggregation.SUM, [(values, v), (values, "/cpu:1")])
  assert [t.numpy() for t in distribution.unwrap(summed)] == [3.0, 3.0] and first.numpy() == 3.0
  assert [t.numpy() for t in distribution.unwrap(distribution.broadcast(tf.constant(7.0)))] == [7.0, 7.0]
  distribution.update(v, lambda c, x: c.assign_add(x), 2.0)
  assert [c.numpy() for c in distribution.unwrap(v)] == [3.0, 3.0]
  assert distribution.read_var(v).numpy() == 3.0
  devices = distribution.non_slot_devices([v])
  distribution.update_non_slot(devices, lambda: v.assign_add(1.0))
  assert [c.numpy() for c in distribution.unwrap(v)] == [4.0, 4.0]
  mapped = distribution.map([1.0, 2.0, 3.0], lambda x, y: tf.constant(x) * y, 10.0)
  assert [[t.numpy() for t in per_device] for per_device in distribution.unwrap(mapped)] == [
      [10.0, 30.0], [20.0]]


def test_distribute_dataset_gives_tower_i_element_i_of_each_group():
  distribution = _mirrored()
  with distribution.scope():
    dataset = distribution.distribute_dataset(lambda: tf.data.Dataset.range(6))
  iterator = dataset.make_one_shot_iterator()
  steps = [[int(t) for t in distribution.unwrap(iterator.get_next())] for _ in range(3)]
  assert steps == [[0, 1], [2, 3], [4, 5]]
  with tf.Graph().as_default():
    dataset = distribution.distribute_dataset(lambda: tf.data.Dataset.range(4))
    iterator = dataset.make_initializable_iterator()
    values = distribution.unwrap(iterator.get_next())
    with tf.compat.v1.Session() as session:
      session.run(iterator.initializer)
      assert session.run(values) == [0, 1]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_distribute_dataset_drops_a_last_partial_group(graph):
  def read_all():
    distribution = _mirrored()
    dataset = distribution.distribute_dataset(lambda: tf.data.Dataset.range(5))
    iterator = dataset.make_one_shot_iterator()
    steps = []
    if graph:
      values = distribution.unwrap(iterator.get_next())
      with tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.OutOfRangeError):
          while True:
            steps.append([int(v) for v in session.run(values)])
      return steps
    with pytest.raises(tf.errors.OutOfRangeError):
      while True:
        steps.append([int(v) for v in distribution.unwrap(iterator.get_next())])
    return steps
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    assert read_all() == [[0, 1], [2, 3]]


@pytest.mark.parametrize("make, error, fragments", [
    (lambda r: contrib.MirroredStrategy(num_gpus=-1), ValueError,
     ["`num_gpus`", "at least 0", "num_gpus=-1"]),
    (lambda r: contrib.MirroredStrategy(num_gpus_per_worker=-2), ValueError,
     ["`num_gpus_per_worker`", "at least 0", "num_gpus_per_worker=-2"]),
    (lambda r: contrib.MirroredStrategy(num_gpus="2"), TypeError,
     ["`num_gpus`", "integer", "num_gpus='2' of type str"]),
    (lambda r: contrib.MirroredStrategy(num_gpus=1, num_gpus_per_worker=1), ValueError,
     ["`num_gpus` or `num_gpus_per_worker`, not both"]),
    (lambda r: contrib.MirroredStrategy(["/cpu:0"], num_gpus=1), ValueError,
     ["`devices` or `num_gpus`, not both", "devices=['/cpu:0']"]),
    (lambda r: contrib.MirroredStrategy(["/cpu:0"], cross_tower_ops="nccl"), TypeError,
     ["`cross_tower_ops`", "tf.distribute.CrossDeviceOps", "str 'nccl'"]),
    (lambda r: contrib.TPUStrategy(r, 1, num_cores=0), ValueError,
     ["`num_cores`", "at least 1", "num_cores=0"]),
    (lambda r: contrib.TPUStrategy(r, steps_per_run=-1), ValueError,
     ["`steps_per_run`", "at least 1", "steps_per_run=-1"]),
    (lambda r: _mirrored().reduce("SUM", tf.constant(1.0)), ValueError,
     ["`aggregation`", "tf.VariableAggregation.SUM", "got 'SUM'"]),
], ids=["negative_gpus", "negative_gpus_per_worker", "string_gpus", "both_gpu_counts",
        "devices_and_gpus", "string_tower_ops", "no_cores", "negative_steps", "reduce_op"])
def test_bad_arguments_raise_a_clear_error(tpu_resolver, make, error, fragments):
  """Each names its argument (a negative `num_gpus` is no count of GPUs,
  not every device)."""
  with pytest.raises(error) as raised:
    make(tpu_resolver)
  assert type(raised.value) is error
  for fragment in fragments:
    assert fragment in str(raised.value)


def test_lifecycle_and_configuration():
  distribution = _mirrored()
  assert distribution.initialize() is None and distribution.finalize() is None
  with tf.Graph().as_default():
    assert distribution.initialize() == [] and distribution.finalize() == []
  assert distribution.get_host_cpu_device(0) == DEVICES[0]
  config = tf.compat.v1.ConfigProto()
  distribution.configure(config)
  assert isinstance(config, tf.compat.v1.ConfigProto)


def test_run_steps_on_dataset_unpacks_inputs():
  distribution = _mirrored()
  with distribution.scope():
    total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)
    dataset = distribution.distribute_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((np.arange(8.0, dtype=np.float32),
                                                   np.ones(8, np.float32))))

  def step(context, x, y):
    result = distribution.call_for_each_tower(lambda a, b: total.assign_add(a * b), x, y)
    context.set_last_step_output("total", result, reduce_op="MEAN")
  context = distribution.run_steps_on_dataset(step, dataset.make_one_shot_iterator(), 3,
                                              initial_loop_values={"total": 0.0})
  assert total.numpy() == 15.0  # 0 + 1 + ... + 5
  assert context.last_step_outputs["total"].numpy() == 15.0


def test_run_steps_on_dataset_takes_tf1_12s_aggregation():
  """TF 1.11-1.12 contrib code passes the reduction as `aggregation`."""
  distribution = _mirrored()
  dataset = distribution.distribute_dataset(lambda: tf.data.Dataset.range(8))

  def step(context, x):
    def tower_fn(x):
      context.set_last_step_output("mean", tf.cast(x, tf.float32),
                                   aggregation=tf.VariableAggregation.MEAN)
      return x
    return distribution.group(distribution.call_for_each_tower(tower_fn, x))
  context = distribution.run_steps_on_dataset(step, dataset.make_one_shot_iterator(), 3,
                                              initial_loop_values={"mean": 0.0})
  assert context.last_step_outputs["mean"].numpy() == 4.5  # towers' last: 4 and 5


@pytest.mark.parametrize("strategy", ["mirrored", "one_device", "tpu"])
def test_contrib_era_training_script_matches_numpy_sgd(strategy):
  result = subprocess.run([sys.executable, str(EXAMPLE), "--strategy", strategy],
                          capture_output=True, text=True, timeout=300, check=False,
                          env=environment_of_a_newcomer())
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert not tensorflow_log_lines(result.stdout + result.stderr), result.stderr
  towers = {"mirrored": 4, "one_device": 1, "tpu": 4}[strategy]
  assert f"towers: {towers};" in result.stdout and ": equal" in result.stdout
