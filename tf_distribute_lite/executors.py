"""Executors: how a strategy runs a function once per replica, for `run` and
`experimental_distribute_values_from_function` (stateless: threads may run
steps with other `RunOptions` at once)."""

import os
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import distribute_lib
from tf_distribute_lite import replica_context
from tf_distribute_lite import replica_runner
from tf_distribute_lite import tpu_replication
from tf_distribute_lite import values as values_lib

# The type of `tf.function` objects (named GenericFunction before TF 2.15).
_TF_FUNCTION = getattr(tf.types.experimental, "PolymorphicFunction", None) or (
    tf.types.experimental.GenericFunction)

# Set to 1, an emulated slice runs an eager `run` of a plain Python function,
# which a TPU refuses (for debugging; see `TPUStrategyV2.run`).
EAGER_RUN_VARIABLE = "TFD_EMULATED_TPU_EAGER"


class _MirroredReplicaContext(replica_context.ReplicaContext):
  """The context of a local replica, named as in TensorFlow."""


class LocalReplicas:
  """Runs a function once per local replica (`first_replica`, ... of
  `num_replicas`), each on its device in a `context_class`."""

  def __init__(self, strategy, devices, context_class=_MirroredReplicaContext,
               first_replica=0, num_replicas=None):
    self._strategy = weakref.ref(strategy)
    self._devices = tuple(devices)
    self._context_class = context_class
    self._first_replica = first_replica
    self._num_replicas = len(self._devices) if num_replicas is None else num_replicas
    # Per function and run options: one trace for all replicas, or a TPU step.
    self._made = weakref.WeakKeyDictionary()

  def replica_context(self, replica_id, runner=None):
    """The context of local replica `replica_id`, run by `runner`."""
    return self._context_class(self._strategy(), replica_id, runner)

  def run(self, fn, args, kwargs, options=None):
    """`fn(*args, **kwargs)` on every replica, regrouped; a `tf.function` as one
    function running every replica. Only TPUs take `options`."""
    if isinstance(fn, _TF_FUNCTION):
      return self._one_function(fn, options)(*args, **kwargs)
    return self._run_replicas(fn, args, kwargs)

  def _run_replicas(self, fn, args, kwargs):
    fn = _tf_bridge.autograph_convert(fn)
    inputs = [values_lib.select_replica(i, (args, kwargs)) for i in range(len(self._devices))]
    if len(inputs) == 1:  # no merge_call to wait at: no runner
      (args, kwargs), = inputs
      with replica_runner.conversion_guard(), \
          self.replica_context(0), tf.device(self._devices[0]):
        return values_lib.regroup([fn(*args, **kwargs)])
    runner = replica_runner.ReplicaRunner(
        self._strategy(), fn, inputs, self._devices, self.replica_context)
    return values_lib.regroup(runner.run())

  def _one_function(self, function, options):
    """`function` run on every replica inside one traced function."""
    def run_replicas(*args, **kwargs):
      return self.run(function.python_function, args, kwargs, options)
    return self._made_once(function, options,
                           lambda: _tf_bridge.clone_function(function, run_replicas))

  def _made_once(self, fn, options, make):
    """`make()`, made once per `fn` (while it lives) and `options`."""
    try:
      made = self._made.setdefault(fn, {})
    except TypeError:  # not weakly referenceable
      made = {}
    if options not in made:
      made[options] = make()
    return made[options]

  def distribute_values_from_function(self, value_fn):
    """Each local replica's `value_fn(ValueContext)`, as one distributed value."""
    return values_lib.regroup(
        [value_fn(distribute_lib.ValueContext(self._first_replica + i, self._num_replicas))
         for i in range(len(self._devices))], always_wrap=True)


class TPUReplicate(LocalReplicas):
  """Runs a TPU's replicas (on `devices`, their first cores) as one
  `tpu.replicate` computation; an eager `run` as a `tf.function` of it."""

  _pure_eager_hint = ""  # ends the error of a pure eager `run`

  def __init__(self, strategy, devices, device_assignment, use_spmd_for_xla_partitioning):
    super().__init__(strategy, devices, _EmulatedReplicaContext)
    self._device_assignment = device_assignment
    self._use_spmd = use_spmd_for_xla_partitioning

  def run(self, fn, args, kwargs, options=None):
    options = options or distribute_lib.RunOptions()
    if tf.executing_eagerly():
      return self._step_function(fn, options)(args, kwargs)
    return tpu_replication.replicate(self._strategy(), fn, args, kwargs,
                                     self._device_assignment, options, self._use_spmd)

  def _step_function(self, fn, options):
    """`fn`'s replicated step as a `tf.function`."""
    def replicated_step(args, kwargs):
      return self.run(fn, args, kwargs, options)
    return self._made_once(fn, options, lambda: tf.function(replicated_step))

  def refuse_pure_eager(self, fn):
    """Raises TF's NotImplementedError for an eager `run` of a non-`tf.function`."""
    if (not tf.executing_eagerly() or
        isinstance(fn, (_TF_FUNCTION, tf.types.experimental.ConcreteFunction)) or
        isinstance(getattr(fn, "__call__", None), _TF_FUNCTION)):
      return
    raise NotImplementedError(
        f"TPUStrategy.run(fn, ...) does not support pure eager execution. "
        f"please make sure the function passed into `strategy.run` is a "
        f"`tf.function` or `strategy.run` is called inside a `tf.function` if "
        f"eager behavior is enabled.{self._pure_eager_hint}")


class EmulatedTPU(TPUReplicate):
  """Runs an emulated slice's replicas as local replicas on its CPU devices, in
  one traced step that fails where XLA cannot compile it; a `jit_compile=True`
  function runs as its Python function (XLA cannot span those devices)."""

  _pure_eager_hint = (f" (For debugging, an emulated slice runs it where the "
                      f"environment variable {EAGER_RUN_VARIABLE}=1.)")

  def run(self, fn, args, kwargs, options=None):
    options = options or distribute_lib.RunOptions()
    function = isinstance(fn, _TF_FUNCTION)
    if function and not _tf_bridge.is_jit_compiled(fn):  # runs this with its Python function
      return self._one_function(fn, options)(*args, **kwargs)
    if tf.executing_eagerly():  # as on a TPU: a compiled step function
      return self._step_function(fn, options)(args, kwargs)
    if function:
      fn = fn.python_function
    inputs, _ = tpu_replication.split_inputs(values_lib.select_replica(0, (args, kwargs)))
    tpu_replication.maximum_shapes(inputs, options)  # raises as on a TPU
    created = []

    def record_variable(next_creator, **kwargs):
      created.append(next_creator(**kwargs))
      return created[-1]
    with tf.variable_creator_scope(record_variable):
      result = self._run_replicas(fn, args, kwargs)
    tpu_replication.check_compiles(self._strategy(), fn, args, kwargs, created)
    return result

  def refuse_pure_eager(self, fn):
    """As on a TPU, unless `$TFD_EMULATED_TPU_EAGER` is `1`."""
    if os.environ.get(EAGER_RUN_VARIABLE) != "1":
      super().refuse_pure_eager(fn)


class _EmulatedReplicaContext(tpu_replication.LogicalDevices, replica_context.ReplicaContext):
  """A replica's context on an emulated slice."""

  def merge_call(self, merge_fn, args=(), kwargs=None):
    """As `ReplicaContext.merge_call`, but `merge_fn` gets replica 0's of each
    Python object passed, as a TPU's one trace would (a `zip` is consumed once)."""
    def merge_traced_once(strategy, *grouped_args, **grouped_kwargs):
      grouped_args, grouped_kwargs = tf.nest.map_structure(
          _replica_0_object, (grouped_args, grouped_kwargs))
      return merge_fn(strategy, *grouped_args, **grouped_kwargs)
    return super().merge_call(merge_traced_once, args, kwargs)


def _replica_0_object(value):
  """Replica 0's component of a PerReplica of Python objects, else `value`."""
  if isinstance(value, values_lib.PerReplica) and not any(
      tf.is_tensor(v) or isinstance(v, (tf.Variable, tf.distribute.DistributedValues))
      for v in value.values):
    return value.values[0]
  return value
