"""The TF 1.x strategy API (`tfd.compat.v1`) against
`tf.compat.v1.distribute`, eagerly and in TF1 graphs run by a Session."""

import contextlib
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import multi_step

from outcomes import program_outcomes
from oracle import compare
import strategies

HERE = pathlib.Path(__file__).resolve().parent
TF1 = tf.compat.v1.distribute
OURS = tfd.compat.v1


def _mirrored(mod):
  return mod.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=mod.ReductionToOneDevice())


def _dataset():
  return tf.data.Dataset.range(8).map(lambda x: tf.cast(x, tf.float32)).batch(4)


def test_tf1_metric_value_fetched_without_pulling_the_next_input():
  """A TF 1.x metric's value, fetched after its update, reads the summed
  state of every replica and does not run the step's input again."""
  def metric(mod):
    with tf.Graph().as_default():
      strategy = _mirrored(mod)
      with strategy.scope():
        iterator = strategy.make_dataset_iterator(
            tf.data.Dataset.from_tensor_slices([1.0, 2.0, 3.0, 4.0]).batch(4))
        mean, update = strategy.extended.call_for_each_replica(
            tf.compat.v1.metrics.mean, args=(iterator.get_next(),))
      with tf.compat.v1.Session() as session:
        session.run([iterator.initializer, tf.compat.v1.local_variables_initializer()])
        updates = session.run(strategy.experimental_local_results(update))
        return [float(x) for x in updates], float(session.run(mean))
  assert compare(metric, (TF1,), (OURS,)) == ([1.5, 3.5], 2.5)


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


@pytest.mark.parametrize("name", ["mirrored_pair", "one_device", "default"])
def test_tf2_strategies_have_the_tf1_methods_like_tf(name):
  """Every strategy's extended object is a TF 1.x `StrategyExtended`, and
  the TF 2.x strategies (the default one too) keep TF 1.x's methods."""
  def run(mod):
    strategy = strategies.make(name, ours=mod is OURS)
    iterator = strategy.make_dataset_iterator(tf.data.Dataset.range(4).batch(4))
    doubled = strategy.experimental_run(lambda x: x * 2, iterator)
    numpy_dataset = strategy.extended.experimental_make_numpy_dataset(np.arange(3))
    return (isinstance(strategy.extended, mod.StrategyExtended),
            [t.numpy().tolist() for t in strategy.experimental_local_results(doubled)],
            int(numpy_dataset.cardinality()),
            type(strategy.update_config_proto(tf.compat.v1.ConfigProto())).__name__,
            hasattr(strategy.extended, "experimental_run_steps_on_iterator"))
  assert compare(run, (TF1,), (OURS,))[::2] == (True, 3, True)


@pytest.mark.parametrize("name", ["experimental_run", "make_dataset_iterator",
                                  "make_input_fn_iterator", "configure", "group",
                                  "update_config_proto", "experimental_make_numpy_dataset",
                                  "reduce", "unwrap", "colocate_vars_with"])
def test_v1_methods_have_tfs_signatures(name):
  import inspect  # pylint: disable=g-import-not-at-top
  ours = inspect.signature(getattr(OURS.Strategy, name))
  theirs = inspect.signature(getattr(TF1.Strategy, name))
  assert list(ours.parameters) == list(theirs.parameters)


@pytest.mark.parametrize("name", ["read_var", "value_container", "broadcast_to",
                                  "update_non_slot", "call_for_each_replica",
                                  "experimental_run_steps_on_iterator"])
def test_extended_methods_have_tfs_signatures(name):
  import inspect  # pylint: disable=g-import-not-at-top
  ours = inspect.signature(getattr(type(_mirrored(OURS).extended), name))
  theirs = inspect.signature(getattr(type(_mirrored(TF1).extended), name))
  assert list(ours.parameters) == list(theirs.parameters)


def test_extended_flags_are_properties_like_tf():
  names = ["should_checkpoint", "should_save_summary", "experimental_should_init",
           "experimental_between_graph", "experimental_require_static_shapes"]
  def kinds(mod):
    extended = type(_mirrored(mod).extended)
    return [type(getattr(extended, name)).__name__ for name in names]
  assert compare(kinds, (TF1,), (OURS,)) == ["property"] * len(names)


def test_experimental_run_on_an_iterator_eagerly_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    iterator = strategy.make_dataset_iterator(_dataset())
    assert iterator.initializer is None and iterator.initialize() is None
    first = strategy.experimental_run(lambda x: x * 2.0, iterator)
    second = strategy.experimental_run(tf.reduce_sum, iterator)
    return ([t.numpy().tolist() for t in strategy.experimental_local_results(first)],
            strategy.reduce("SUM", second).numpy().item())
  assert compare(run, (TF1,), (OURS,)) == ([[0.0, 2.0], [4.0, 6.0]], 22.0)


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
  assert compare(run, (TF1,), (OURS,)) == (
      [(1, 0, 2)], [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]])
  assert compare(lambda m: _mirrored(m).make_input_fn_iterator(
      lambda ctx: _dataset(), tf.distribute.InputReplicationMode.PER_REPLICA),
                 (TF1,), (OURS,)) == ValueError


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind", ["mirrored", "one_device", "central_storage"])
def test_input_fn_returning_a_callable_like_tf(kind, graph):
  """Each get_next calls the callable once per replica (in a graph, once per
  get_next built); initialize() is a no-op."""
  def run(mod):
    with tf.Graph().as_default() if graph else contextlib.nullcontext():
      strategy = {"mirrored": lambda: _mirrored(mod),
                  "one_device": lambda: mod.OneDeviceStrategy("/cpu:1"),
                  "central_storage": lambda: mod.experimental.CentralStorageStrategy(
                      ["/cpu:0", "/cpu:1"])}[kind]()
      calls = []

      def input_fn(context):
        del context
        return lambda: tf.constant(len(calls.append(None) or calls) * 10)
      iterator = strategy.make_input_fn_iterator(input_fn)
      initialize = iterator.initialize()
      steps = [strategy.experimental_local_results(iterator.get_next()) for _ in range(2)]
      if graph:
        with tf.compat.v1.Session() as session:
          session.run(initialize)
          steps = session.run(steps)
      else:
        assert initialize is None
      return [[int(v) for v in step] for step in steps], len(calls)
  replicas = 1 if kind == "one_device" else 2
  values = list(range(10, 10 * (2 * replicas + 1), 10))
  assert compare(run, (TF1,), (OURS,)) == (
      [values[:replicas], values[replicas:]], 2 * replicas)


@pytest.mark.parametrize("made", [[1, 2], 42])
def test_input_fn_returning_neither_dataset_nor_callable_raises_value_error(made):
  def run(mod):
    return _mirrored(mod).make_input_fn_iterator(lambda ctx: made)
  assert compare(run, (TF1,), (OURS,)) == ValueError
  with pytest.raises(ValueError, match="input_fn must return a tf.data.Dataset or a "
                                       "callable; .* returned 42 of type int"):
    _mirrored(OURS).make_input_fn_iterator(lambda ctx: 42)


def test_default_strategy_calls_a_callable_input_fn():
  """TensorFlow 2.21's default strategy fails on it (AttributeError)."""
  iterator = OURS.get_strategy().make_input_fn_iterator(lambda ctx: lambda: tf.constant(7))
  assert iterator.initialize() is None
  assert int(iterator.get_next()) == 7


def _read_to_the_end(strategy, iterator, graph):
  """Every step of `iterator`: each replica's values, as lists."""
  steps = []
  if graph:
    values = strategy.experimental_local_results(iterator.get_next())
    with tf.compat.v1.Session() as session:
      session.run(iterator.initializer)
      try:
        while True:
          steps.append([np.asarray(v).tolist() for v in session.run(values)])
      except tf.errors.OutOfRangeError:
        return steps
  try:
    while True:
      steps.append([v.numpy().tolist() for v in
                    strategy.experimental_local_results(iterator.get_next())])
  except tf.errors.OutOfRangeError:
    return steps


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("input_fn, expected", [
    (lambda ctx: tf.data.Dataset.range(5), [[0, 1], [2, 3]]),
    (lambda ctx: tf.data.Dataset.range(10).batch(2), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
], ids=["scalars", "batches"])
def test_input_fn_iterator_ends_at_a_partial_step_like_tf(input_fn, expected, graph):
  def run(mod):
    with tf.Graph().as_default() if graph else contextlib.nullcontext():
      strategy = _mirrored(mod)
      return _read_to_the_end(strategy, strategy.make_input_fn_iterator(input_fn), graph)
  assert compare(run, (TF1,), (OURS,)) == expected


@pytest.mark.parametrize("make", ["make_dataset_iterator", "make_input_fn_iterator"])
def test_eager_initialize_restarts_the_iterator_like_tf(make):
  def run(mod):
    strategy = _mirrored(mod)
    dataset = tf.data.Dataset.range(8).batch(2)
    iterator = getattr(strategy, make)(
        dataset if make == "make_dataset_iterator" else lambda ctx: dataset)
    first = lambda: [t.numpy().tolist() for t in strategy.experimental_local_results(
        iterator.get_next())]
    read = [first(), first()]
    returned = iterator.initialize()
    read.append(first())
    initializer = iterator.initializer
    return read + [first(), returned, initializer]
  expected = compare(run, (TF1,), (OURS,))
  assert expected[0] == expected[2] == expected[3] != expected[1]
  assert expected[-2:] == [None, None]


def test_graph_initialize_returns_an_op_like_tf():
  def run(mod):
    with tf.Graph().as_default():
      strategy = _mirrored(mod)
      iterator = strategy.make_dataset_iterator(_dataset())
      initialize = iterator.initialize()
      result = strategy.reduce("SUM", strategy.experimental_run(tf.reduce_sum, iterator))
      with tf.compat.v1.Session() as session:
        session.run(initialize)
        return type(initialize).__name__, session.run(result)
  assert compare(run, (TF1,), (OURS,)) == ("Operation", 6.0)


@pytest.mark.parametrize("make", ["make_dataset_iterator", "make_input_fn_iterator"])
def test_default_strategy_graph_iterators_like_tf(make):
  """The default strategy's TF 1.x iterators in a graph iterate the dataset
  itself; their `initializer` is a list of one op, as in TF."""
  def run(mod):
    with tf.Graph().as_default():
      strategy = mod.get_strategy()
      iterator = getattr(strategy, make)(
          _dataset() if make == "make_dataset_iterator" else lambda ctx: _dataset())
      initializer = iterator.initializer
      element = iterator.get_next()
      optional = iterator.get_next_as_optional()
      with tf.compat.v1.Session() as session:
        session.run(initializer)
        first = session.run(element).tolist()
        session.run(iterator.initialize())
        again = session.run(element).tolist()
        second = session.run(optional.get_value()).tolist()
        return type(initializer).__name__, len(initializer), first, again, second
  assert compare(run, (tf.distribute,), (tfd,)) == (
      "list", 1, [0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])


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
  assert compare(run, (TF1,), (OURS,)) == ((3.0, 3.0), True)


def test_numpy_datasets_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    on_strategy = strategy.experimental_make_numpy_dataset(np.arange(3, dtype=np.float32))
    on_extended = strategy.extended.experimental_make_numpy_dataset(
        (np.ones([2, 2], np.float32), np.arange(2)), session=None)
    return [float(x) for x in on_strategy], [(a.numpy().tolist(), int(b)) for a, b in on_extended]
  assert compare(run, (TF1,), (OURS,)) == ([0.0, 1.0, 2.0], [([1.0, 1.0], 0), ([1.0, 1.0], 1)])


def test_graph_numpy_datasets_with_a_session_like_tf():
  def run(mod):
    with tf.Graph().as_default():
      strategy = _mirrored(mod)
      with tf.compat.v1.Session() as session:
        on_strategy = strategy.experimental_make_numpy_dataset(
            np.arange(4, dtype=np.float32), session=session)
        on_extended = strategy.extended.experimental_make_numpy_dataset(
            np.ones([2, 2], np.float32), session=session)
        iterator = strategy.make_dataset_iterator(on_strategy.batch(4))
        plain = tf.compat.v1.data.make_initializable_iterator(on_extended)
        session.run([iterator.initializer, plain.initializer])
        return ([a.tolist() for a in session.run(
            strategy.experimental_local_results(iterator.get_next()))],
                session.run(plain.get_next()).tolist())
  assert compare(run, (TF1,), (OURS,)) == ([[0.0, 1.0], [2.0, 3.0]], [1.0, 1.0])


def test_graph_reduce_along_an_axis_like_tf():
  def run(mod):
    with tf.Graph().as_default():
      strategy = _mirrored(mod)
      iterator = strategy.make_dataset_iterator(_dataset())
      per_replica = strategy.experimental_run(lambda x: x, iterator)
      reduced = [strategy.reduce("MEAN", per_replica, axis=0),
                 strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica),
                 strategy.reduce("SUM", per_replica, axis=0)]
      with tf.compat.v1.Session() as session:
        session.run(iterator.initializer)
        return [np.asarray(r).tolist() for r in session.run(reduced)]
  assert compare(run, (TF1,), (OURS,)) == [1.5, [2.0, 4.0], 6.0]


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
  compare(run, (TF1,), (OURS,))


def test_config_protos_like_tf():
  def run(mod):
    strategy = _mirrored(mod)
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    updated = strategy.update_config_proto(config)
    strategy.configure(config)
    return updated is config, updated.allow_soft_placement, config.allow_soft_placement
  compare(run, (TF1,), (OURS,))


CLUSTER = {"worker": ["localhost:12345", "localhost:12346"]}


def test_configure_with_a_cluster_is_ignored_by_one_device_strategy_like_tf():
  def run(mod):
    strategy = mod.OneDeviceStrategy("/cpu:0")
    strategy.configure(cluster_spec=CLUSTER, task_type="worker", task_id=0)
    return strategy.extended.worker_devices
  assert compare(run, (TF1,), (OURS,)) == ("/job:localhost/replica:0/task:0/device:CPU:0",)


@pytest.mark.parametrize("make, match", [
    (lambda: _mirrored(OURS), "In-graph multi-worker training"),
    (lambda: OURS.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]), "one machine"),
], ids=["mirrored", "central_storage"])
def test_configure_with_a_cluster_raises_for_one_machine_strategies(make, match):
  # TensorFlow 2.21 replicates a MirroredStrategy in-graph onto the cluster's
  # tasks (where it picks its cross-device ops, it raises this ValueError; for
  # one worker an AssertionError) and fails for CentralStorageStrategy with
  # an AttributeError.
  with pytest.raises(ValueError, match=match):
    make().configure(cluster_spec=CLUSTER, task_type="worker", task_id=0)


def test_configure_names_the_cluster_multi_worker_mirrored_strategy_joined():
  strategy = OURS.experimental.MultiWorkerMirroredStrategy()
  strategy.extended._cluster_resolver = tfd.cluster_resolver.SimpleClusterResolver(  # pylint: disable=protected-access
      tf.train.ClusterSpec(CLUSTER), task_type="worker", task_id=1)
  config = tf.compat.v1.ConfigProto()
  strategy.configure(config, cluster_spec=CLUSTER, task_type="worker", task_id=1)
  assert config.graph_options.rewrite_options.scoped_allocator_opts.enable_op == ["CollectiveReduce"]
  with pytest.raises(ValueError, match=r"made for cluster_spec=.*task_id=1; got .*task_id=0"):
    strategy.configure(cluster_spec=CLUSTER, task_type="worker", task_id=0)
  with pytest.raises(ValueError, match="SimpleClusterResolver"):
    OURS.experimental.MultiWorkerMirroredStrategy().configure(
        cluster_spec=CLUSTER, task_type="worker", task_id=0)


# name: (what fn returns, where it records its output, reduce_op,
# initial_loop_values).
RUN_STEPS_CASES = {
    "in_replicas": ("op", "replica", "SUM", {"out": 0.0}),
    "cross_replica": ("op", "cross", None, {"out": (0.0, 0.0)}),
    "cross_replica_reduced": ("op", "cross", "MEAN", {"out": 0.0}),
    "returns_a_tensor": ("tensor", "replica", "SUM", {"out": 0.0}),
    "returns_none": ("none", "replica", "SUM", {"out": 0.0}),
    "no_initial_values": ("op", "replica", "SUM", None),
    "int_initial_value": ("op", "replica", "SUM", {"out": 0}),
}


def _run_steps(mod, case, graph, iterations=3):
  """`experimental_run_steps_on_iterator` over batches of 0..15 (repeated)
  adding each batch's sum to a variable: the last step's output, the
  non-tensor outputs, the variable, and the `run_op`'s type."""
  returns, where, reduce_op, initial = RUN_STEPS_CASES[case]
  strategy = _mirrored(mod)
  iterator = strategy.make_dataset_iterator(
      tf.data.Dataset.range(16).map(lambda v: tf.cast(v, tf.float32)).batch(4).repeat())
  with strategy.scope():
    total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

  def step(ctx, inputs):
    def replica_fn(x):
      if where == "replica":
        ctx.set_last_step_output("out", tf.reduce_sum(x), reduce_op=reduce_op)
        ctx.set_non_tensor_output("note", 7)
      return total.assign_add(tf.reduce_sum(x))
    result = strategy.extended.call_for_each_replica(replica_fn, args=(inputs,))
    if where == "cross":
      ctx.set_last_step_output("out", result, reduce_op=reduce_op)
      ctx.set_non_tensor_output("note", 7)
    return {"op": strategy.group(result), "tensor": tf.constant(1.0), "none": None}[returns]
  ctx = strategy.extended.experimental_run_steps_on_iterator(
      step, iterator, iterations=iterations, initial_loop_values=initial)
  fetches = [strategy.experimental_local_results(ctx.last_step_outputs["out"]),
             strategy.experimental_local_results(total)]
  if graph:
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
      fetches[0] = session.run([ctx.run_op, fetches[0]])[1]
      fetches[1] = session.run(fetches[1])
  fetches = tf.nest.map_structure(float, fetches)
  return fetches, ctx.non_tensor_outputs, type(ctx.run_op).__name__


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("case", RUN_STEPS_CASES)
def test_run_steps_on_iterator_like_tf(case, graph):
  def run(mod):
    with tf.Graph().as_default() if graph else contextlib.nullcontext():
      return _run_steps(mod, case, graph)
  outcome = compare(run, (TF1,), (OURS,))
  if case == "in_replicas":  # the last step's batch is [8..11]; totals of 0..11
    assert outcome == ([(38.0,), (66.0, 66.0)], {"note": (7,)},
                       "Operation" if graph else "NoneType")


def test_run_steps_loop_is_built_once():
  def graph_size(iterations):
    with tf.Graph().as_default() as graph:
      _run_steps(OURS, "in_replicas", graph=True, iterations=iterations)
      return len(graph.get_operations())
  assert graph_size(2) == graph_size(50)


V1_AGGREGATION = tf.compat.v1.VariableAggregation


# The last step's batch is [8..11]: replica 0 sums 8 + 9, replica 1 10 + 11.
AGGREGATIONS = {
    "sum": (tf.VariableAggregation.SUM, [38.0]),
    "mean": (tf.VariableAggregation.MEAN, [19.0]),
    "v1_mean": (V1_AGGREGATION.MEAN, [19.0]),
    "only_first_replica": (tf.VariableAggregation.ONLY_FIRST_REPLICA, [17.0]),
    "v1_only_first_tower": (V1_AGGREGATION.ONLY_FIRST_TOWER, [17.0]),
    "none": (tf.VariableAggregation.NONE, [17.0, 21.0]),
}


@pytest.mark.parametrize("aggregation, where", [
    (name, where) for name in AGGREGATIONS for where in ("replica", "cross")
    if (name, where) != ("none", "replica")])  # see the test below
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_set_last_step_output_takes_tf1_12s_aggregation(aggregation, where, graph):
  """TF 1.11-1.12 code names the reduction `aggregation`, a
  `VariableAggregation`; NONE keeps each replica's value (cross-replica)."""
  aggregation, expected = AGGREGATIONS[aggregation]
  with tf.Graph().as_default() if graph else contextlib.nullcontext():
    strategy = _mirrored(OURS)
    iterator = strategy.make_dataset_iterator(
        tf.data.Dataset.range(16).map(lambda v: tf.cast(v, tf.float32)).batch(4))

    def step(ctx, inputs):
      def replica_fn(x):
        if where == "replica":
          ctx.set_last_step_output("out", tf.reduce_sum(x), aggregation=aggregation)
        return tf.reduce_sum(x)
      result = strategy.extended.call_for_each_replica(replica_fn, args=(inputs,))
      if where == "cross":
        ctx.set_last_step_output("out", result, aggregation=aggregation)
      return strategy.group(result)
    ctx = strategy.extended.experimental_run_steps_on_iterator(
        step, iterator, iterations=3, initial_loop_values={"out": [0.0] * len(expected)})
    out = strategy.experimental_local_results(ctx.last_step_outputs["out"])
    if graph:
      with tf.compat.v1.Session() as session:
        session.run(iterator.initializer)
        out = session.run([ctx.run_op, out])[1]
    assert [float(v) for v in out] == expected


def test_set_last_step_output_needs_one_reduction():
  strategy = _mirrored(OURS)
  ctx = multi_step.MultiStepContext()
  with strategy.scope():
    with pytest.raises(ValueError, match=r"`reduce_op` or `aggregation`.*not both; "
                       r"got reduce_op='SUM' and aggregation=.*SUM"):
      ctx.set_last_step_output("out", 1.0, reduce_op="SUM",
                               aggregation=tf.VariableAggregation.SUM)
  with pytest.raises(ValueError, match=r"`reduce_op` \(or an `aggregation` other than NONE\)"):
    strategy.extended.call_for_each_replica(lambda: ctx.set_last_step_output(
        "out", 1.0, aggregation=tf.VariableAggregation.NONE))


@pytest.fixture(scope="module")
def tf1_programs():
  return program_outcomes(HERE / "tf1_programs.py")


def test_tf1_tutorial_gives_tensorflows_losses(tf1_programs):
  theirs, ours = tf1_programs
  assert ours["tutorial"] == theirs["tutorial"]
  assert ours["tutorial"]["losses"][-1] != ours["tutorial"]["losses"][0]


def test_tf1_multi_step_loop_like_tf(tf1_programs):
  theirs, ours = tf1_programs
  assert ours["run_steps"] == theirs["run_steps"] == {"total": 66.0, "last": 66.0}


def test_tf1_device_names_like_tf(tf1_programs):
  """With eager execution disabled, TensorFlow's names have no job."""
  theirs, ours = tf1_programs
  assert ours["devices"] == theirs["devices"]
  assert ours["devices"]["MirroredStrategy"]["worker_devices"] == [
      "/replica:0/task:0/device:CPU:0", "/replica:0/task:0/device:CPU:1"]
  assert ours["devices"]["contrib.OneDeviceStrategy"]["components"] == [
      "/replica:0/task:0/device:CPU:1"]


@pytest.fixture(scope="module")
def tf1_client_programs():
  return program_outcomes(HERE / "tf1_client_programs.py")


def test_tf1_moving_averages_like_tf(tf1_client_programs):
  """TensorFlow's moving-average helper inside `extended.update` updates
  each component once and finds its debiasing variables by the variable's
  `op.name` (docs/client_private_names.md): Mirrored, OneDevice,
  CentralStorage, MultiWorkerMirrored on one worker and the emulated TPU
  (against TF's Mirrored on its 4 CPUs)."""
  theirs, ours = tf1_client_programs
  assert ours["moving_averages"] == theirs["moving_averages"]
  assert len(ours["moving_averages"]) == 10
  assert ours["moving_averages"]["v1_mirrored_pair/False"][0] == [[1.5, 3.0], [1.5, 3.0]]


def test_tf1_metric_value_made_outside_the_step_loop_like_tf(tf1_client_programs):
  """`tf.compat.v1.metrics.mean` in `experimental_run_steps_on_iterator`
  makes its value outside the loop (`extended._outer_control_flow_context`):
  without it the value is made inside and cannot be fetched."""
  theirs, ours = tf1_client_programs
  assert ours["metric_in_a_step_loop"] == theirs["metric_in_a_step_loop"] == {"mean": 2.5}


def test_tf1_keras_session_initializes_and_reads_variables_like_tf(tf1_client_programs):
  theirs, ours = tf1_client_programs
  assert ours["keras_session"] == theirs["keras_session"] == {
      "value": 3.0, "marked": True, "batch": [3.0], "eval": 6.0}


def test_outer_control_flow_context_only_while_a_step_loop_is_built():
  strategy = _mirrored(OURS)
  iterator = strategy.make_dataset_iterator(_dataset())
  seen = []

  def step(ctx, inputs):
    del ctx, inputs
    seen.append(hasattr(strategy.extended, "_outer_control_flow_context"))
  strategy.extended.experimental_run_steps_on_iterator(step, iterator, iterations=1)
  assert seen == [True]
  assert not hasattr(strategy.extended, "_outer_control_flow_context")
  assert not hasattr(_mirrored(TF1).extended, "_outer_control_flow_context")


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



@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("call", ["run", "call_for_each_replica"])
def test_get_variable_in_every_replica_gives_one_variable_like_tf(call, graph):
  def run(mod):
    strategy = _mirrored(mod)
    reuse = []

    def fn():
      replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
      with tf.compat.v1.variable_scope("model"):
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.constant_initializer(2.0))
        reuse.append(bool(tf.compat.v1.get_variable_scope().reuse))
        total = tf.distribute.get_replica_context().merge_call(
            lambda _, per_replica: strategy.reduce("SUM", per_replica, axis=None),
            args=(replica,))
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.ones_initializer())
      return w * (replica + 1.0) + b + total
    with strategy.scope():
      result = getattr(strategy if call == "run" else strategy.extended, call)(fn)
      variables = [(type(v).__name__, v.name) for v in tf.compat.v1.global_variables()]
    values = strategy.experimental_local_results(result)
    if graph:
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values = session.run(values)
    return [float(v) for v in values], reuse, variables if graph else None

  if graph:
    with tf.Graph().as_default():
      theirs = run(TF1)
    with tf.Graph().as_default():
      ours = run(OURS)
  else:
    theirs, ours = run(TF1), run(OURS)
  assert ours == theirs
  assert ours[:2] == ([4.0, 6.0], [not graph, True])  # eagerly scopes always reuse
  if graph:
    assert ours[2] == [("MirroredVariable", "model/w:0"), ("MirroredVariable", "model/b:0")]


# --- Checkpoints of TF1 graphs: tf.compat.v1.train.Saver and
# MonitoredTrainingSession save a distributed variable as the variable it
# stands for.

def _tf1_model(mod):
  """A strategy, a mirrored `w`, a sync-on-read `count`, and a train op."""
  strategy = _mirrored(mod)
  with strategy.scope():
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.constant_initializer(3.0))
    count = tf.compat.v1.get_variable(
        "count", [], initializer=tf.compat.v1.zeros_initializer(),
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)

    def step():
      with tf.control_dependencies([count.assign_add(1.0)]):
        return optimizer.minimize(tf.reduce_sum(w * w), global_step=global_step)
    train_op = tf.group(strategy.experimental_local_results(
        strategy.extended.call_for_each_replica(step)))
  return strategy, w, count, train_op


@pytest.mark.parametrize("restore_into", ["plain", "strategy"])
@pytest.mark.parametrize("apis", [(TF1, OURS), (tf.distribute, tfd)], ids=["v1", "v2"])
def test_saver_saves_and_restores_distributed_variables_like_tf(tmp_path, apis, restore_into):
  def run(mod):
    path = str(tmp_path / mod.__name__.replace(".", "_") / "ckpt")
    with tf.Graph().as_default():
      _, _, _, train_op = _tf1_model(mod)
      saver = tf.compat.v1.train.Saver()
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op)
        saver.save(session, path)
    saved = {name: tf.train.load_checkpoint(path).get_tensor(name).tolist()
             for name, _ in tf.train.list_variables(path)}
    with tf.Graph().as_default():
      if restore_into == "plain":
        w = tf.compat.v1.get_variable("w", [2])
        count = tf.compat.v1.get_variable("count", [])
        fetches = [w, count]
      else:
        strategy, w, count, _ = _tf1_model(mod)
        fetches = [strategy.experimental_local_results(w),
                   strategy.experimental_local_results(count), count]
      with tf.compat.v1.Session() as session:
        tf.compat.v1.train.Saver([w, count]).restore(session, path)
        restored = session.run(fetches)
    return saved, tf.nest.map_structure(lambda a: np.asarray(a).tolist(), restored)
  saved, restored = compare(run, apis[:1], apis[1:])
  assert saved == {"w": [pytest.approx(1.8)] * 2, "count": 2.0, "global_step": 1}
  if restore_into == "strategy":  # each replica's count holds its share
    assert restored[1:] == [(1.0, 1.0), 2.0]


def test_monitored_training_session_checkpoints_and_resumes_like_tf(tmp_path):
  def train(mod, checkpoint_dir, last_step):
    with tf.Graph().as_default():
      strategy, w, count, train_op = _tf1_model(mod)
      values = [strategy.experimental_local_results(w), strategy.extended.read_var(count)]
      hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_step)]
      with tf.compat.v1.train.MonitoredTrainingSession(
          checkpoint_dir=checkpoint_dir, hooks=hooks, save_summaries_steps=None,
          log_step_count_steps=None) as session:
        while not session.should_stop():
          session.run(train_op)
        final = session.run_step_fn(lambda step_context: step_context.session.run(values))
    return tf.nest.map_structure(lambda a: np.asarray(a).tolist(), final)

  def run(mod):
    checkpoint_dir = str(tmp_path / mod.__name__.replace(".", "_"))
    first = train(mod, checkpoint_dir, last_step=2)
    resumed = train(mod, checkpoint_dir, last_step=3)
    return first, resumed, tf.train.latest_checkpoint(checkpoint_dir).rsplit("/", 1)[1]
  first, resumed, latest = compare(run, (TF1,), (OURS,))
  assert first[1] == 4.0 and resumed[1] == 6.0 and latest == "model.ckpt-3"
  assert resumed[0][0] == resumed[0][1] != first[0][0]
