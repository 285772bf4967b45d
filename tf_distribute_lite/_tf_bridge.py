"""The project's only contact with TensorFlow internals.

TensorFlow keeps "which strategy is current" in a per-graph, per-thread stack
and copies it into every `tf.function` graph it traces. Pushing our entries
onto that same stack is what makes `tf.distribute.get_strategy()`, Keras,
`tf.nn.compute_average_loss` and tracing see our strategies. The stack lives
behind a private attribute, so every private access sits here, behind a
check that refuses a TensorFlow whose internals look different.

TensorFlow keeps "which replica's components an `extended.update` is
updating" in a per-thread state of its own too, which its moving-average
helper reads; our updates set that same state (`update_context`).

The other private contacts are `tf.summary`'s per-thread state (which
replica records summaries, and what replica threads inherit), the classes
of control-flow graphs (a `merge_call` may sit in a `tf.cond`, not in a
nested `tf.function`), the saving
context (a `tf.saved_model.save` in progress maps distributed variables onto
single ones; a function traced before it that updates them across replicas
is marked unsaveable, `mark_function_unsaveable`), the per-thread variable-creator stack that replica threads
inherit, and AutoGraph's list of
libraries it leaves alone: like TensorFlow's own `tf.distribute` (and Keras),
this package is library code that AutoGraph must not rewrite when a user's
`tf.function` calls into it (rewriting it costs seconds per trace).

A process that joins a cluster starts TensorFlow's gRPC server with
collective ops through the eager context (`enable_collective_ops`, with the
context's own config, `eager_context_config`), as TensorFlow's
MultiWorkerMirroredStrategy does: there is no public call for it.

`TPUClusterResolver.tpu_hardware_feature` reads TensorFlow's TPU topology
proto (`parse_topology_proto`), and `TPUStrategy`'s logical-device
annotations are XLA sharding ops (`xla_sharding_annotation`): no public
module exports either. An emulated TPU lowers each step to XLA's HLO with
the values it captured given explicitly (`hlo_text`). Inside a TPU computation a mirrored variable is a
variable over a replicated handle (`variable_of_handle`).

Parameter-server training stores a sharded variable in a SavedModel as one
variable with no value of its own (`uninitialized_variable`,
`write_variable_proto`), and a scheduled function reads the index of the
worker it runs on as a value captured at each call (`call_time_value`).
tfd's sharded variable stands for TensorFlow's, whose class only
`tf.__internal__` exports (`TENSORFLOW_SHARDED_VARIABLE`).

Four contacts answer Keras rather than TensorFlow: Keras 3 recognises a
distributed dataset by the name and module of a base class
(`KERAS_DATASET_BASES`), reduces its steps' outputs across workers only
for TensorFlow's own multi-worker class (`route_keras_reduce_per_replica`),
and saves checkpoints from every worker into the same files
(`route_keras_checkpoint_writes`); tf_keras's backups save before
preemption through tfd's handler (`route_tf_keras`).

`tf.distribute.experimental.rpc` runs on TensorFlow's RPC ops, whose
generated wrappers (`rpc_kernels`) and whose proto of a server's listed
methods (`parse_registered_method`) only private modules export.
"""

import functools
import importlib
import importlib.metadata
import os
import sys
import tempfile
import threading

import tensorflow as tf

_STACK_ATTRIBUTE = "_distribution_strategy_stack"
_CREATOR_ATTRIBUTE = "_variable_creator_stack"


# (module under tensorflow.python, attribute path) of the internal names the
# strategies need wherever they run, checked at import.
_INTERNALS = (
    ("saved_model.save_context", "in_save_context"),
    ("autograph.core.config", "CONVERSION_RULES"),
    ("eager.record", "could_possibly_record"),
    ("ops.summary_ops_v2", "_summary_state.is_recording_distribution_strategy"),
    ("ops.control_flow_v2_func_graphs", "CondBranchFuncGraph"),
    ("ops.control_flow_v2_func_graphs", "WhileBodyFuncGraph"),
    ("ops.control_flow_v2_func_graphs", "WhileCondFuncGraph"),
    ("ops.resource_variable_ops", "UninitializedVariable"),
    ("ops.resource_variable_ops", "write_object_proto_for_resource_variable"),
    ("framework.func_graph", "FuncGraph.capture_call_time_value"),
    ("framework.func_graph", "FuncGraph.mark_as_unsaveable"),
    ("eager.executor", "new_executor"),
    ("eager.context", "executor_scope"),
    ("distribute.distribute_lib", "UpdateContext"),
    ("distribute.distribute_lib", "get_update_replica_id"),
    ("framework.ops", "Graph._get_control_flow_context"),
)


def _has_internal(module, path):
  try:
    found = importlib.import_module(f"tensorflow.python.{module}")
    for name in path.split("."):
      found = getattr(found, name)
  except (ImportError, AttributeError):
    return False
  return True


def _check_tensorflow():
  graph = tf.Graph
  missing = [a for a in (_STACK_ATTRIBUTE, _CREATOR_ATTRIBUTE)
             if not hasattr(graph, a)]
  missing += [f"{module}.{path}" for module, path in _INTERNALS
              if not _has_internal(module, path)]
  if not hasattr(getattr(tf.__internal__, "distribute", None), "ShardedVariable"):
    missing.append("tf.__internal__.distribute.ShardedVariable")
  if missing or not tf.__version__.startswith("2."):
    raise ImportError(
        f"tf_distribute_lite does not recognise the internals of TensorFlow "
        f"{tf.__version__} (missing: {', '.join(missing) or 'TF 2.x'}); "
        f"it needs a TensorFlow 2.x release that keeps the distribution "
        f"strategy stack on tf.Graph.")


_check_tensorflow()
from tensorflow.python.distribute import distribute_lib as _tf_distribute_lib  # pylint: disable=g-import-not-at-top,g-bad-import-order
from tensorflow.python.saved_model import save_context as _save_context  # pylint: disable=g-import-not-at-top,g-bad-import-order


def _exempt_from_autograph(package):
  from tensorflow.python.autograph.core import config  # pylint: disable=g-import-not-at-top
  rule = config.DoNotConvert(package)
  if not any(str(r) == str(rule) for r in config.CONVERSION_RULES):
    config.CONVERSION_RULES = (rule,) + tuple(config.CONVERSION_RULES)


_exempt_from_autograph(__name__.split(".")[0])


def strategy_stack():
  """The current graph's per-thread stack of strategy contexts (a list)."""
  return getattr(tf.compat.v1.get_default_graph(), _STACK_ATTRIBUTE)


@functools.lru_cache(maxsize=None)
def tensorflow_default_strategy():
  """TensorFlow's own default strategy, one object per process.

  TensorFlow pushes its contexts onto the stack we share, for example when
  Keras runs a step on `tf.distribute.get_strategy()` outside every scope;
  that strategy is what `tf.distribute.get_strategy()` returns with the
  stack empty, so the stack is emptied for the call.
  """
  stack = strategy_stack()
  entries = stack[:]
  del stack[:]
  try:
    return tf.distribute.get_strategy()
  finally:
    stack[:] = entries


def mark_function_unsaveable(reason):
  """Makes `tf.saved_model.save` refuse the `tf.function` being traced here
  (and any function calling it) with TensorFlow's ValueError, which gives
  `reason`; nothing eagerly or while `tf.saved_model.save` traces, which
  maps distributed variables onto single ones."""
  if tf.inside_function() and not _save_context.in_save_context():
    tf.compat.v1.get_default_graph().mark_as_unsaveable(reason)


def update_context(replica_id):
  """A context manager: code inside it updates replica `replica_id`'s
  components of distributed variables (`extended.update` applies its
  function to one component at a time).

  TensorFlow's own helpers ask TensorFlow's per-thread state for this
  (`tf.__internal__.train.assign_moving_average`, under
  `tf.train.ExponentialMovingAverage` and tf_keras's
  `backend.moving_average_update`, updates the variable it is given
  directly there, and through `extended.update` elsewhere), so this state
  is TensorFlow's, and `update_replica_id` reads it back.
  """
  return _tf_distribute_lib.UpdateContext(replica_id)


def update_replica_id():
  """The replica an enclosing `update_context` updates, or None (read on
  every access to a distributed variable)."""
  return _tf_distribute_lib.get_update_replica_id()


def saving_without_distribution():
  """True while `tf.saved_model.save` traces without expanding variables."""
  if not _save_context.in_save_context():
    return False
  policy = _save_context.get_save_options().experimental_variable_policy
  return policy != tf.saved_model.experimental.VariablePolicy.EXPAND_DISTRIBUTED_VARIABLES


def variable_creator_stack(graph):
  """The variable creators active on `graph` in this thread."""
  return getattr(graph, _CREATOR_ATTRIBUTE)


def set_variable_creator_stack(graph, stack):
  setattr(graph, _CREATOR_ATTRIBUTE, stack)


class VariableCreatorScope:
  """`tf.variable_creator_scope(creator)` for the default graph, without
  its two generator context managers: an eager `strategy.run` enters one
  per call, and they cost as much as the rest of its scope.

  Creators are kept ordered by priority, TensorFlow's default one here, and
  scopes must nest with TensorFlow's, as in `tf.variable_creator_scope`.
  """

  _PRIORITY = 100

  __slots__ = ("_creator", "_graph", "_outer", "_stack")

  def __init__(self, creator):
    self._creator = creator

  def __enter__(self):
    self._graph = tf.compat.v1.get_default_graph()
    self._outer = variable_creator_stack(self._graph)
    self._stack = self._outer + [(self._PRIORITY, self._creator)]
    if self._outer and self._outer[-1][0] > self._PRIORITY:
      self._stack.sort(key=lambda item: item[0])  # stable, as TensorFlow's
    set_variable_creator_stack(self._graph, self._stack)

  def __exit__(self, *exc_info):
    if variable_creator_stack(self._graph) is not self._stack:
      raise RuntimeError("Exiting variable_creator_scope without proper nesting.")
    set_variable_creator_stack(self._graph, self._outer)


def control_flow_context():
  """The TF 1.x control flow (a `tf.while_loop` or `tf.cond` context of
  control flow v1) ops made now go into, or None; an opaque object with
  `Enter()` and `Exit()`, which TensorFlow's TF 1.x metrics call."""
  return tf.compat.v1.get_default_graph()._get_control_flow_context()  # pylint: disable=protected-access


def control_flow_kind(graph):
  """"cond" where `graph` is a branch of a `tf.cond` (or `tf.switch_case`),
  "while" where it is the body or condition of a `tf.while_loop` (control
  flow v2), None for any other graph (a function's, say)."""
  from tensorflow.python.ops import control_flow_v2_func_graphs as graphs  # pylint: disable=g-import-not-at-top
  if isinstance(graph, graphs.CondBranchFuncGraph):
    return "cond"
  if isinstance(graph, (graphs.WhileBodyFuncGraph, graphs.WhileCondFuncGraph)):
    return "while"
  return None


@functools.lru_cache(maxsize=None)
def summary_state():
  """`tf.summary`'s state: one object whose attributes are per thread (the
  default writer, its step and the conditions under which summaries record:
  `is_recording`, and `is_recording_distribution_strategy`, which a replica
  context sets so that only replica 0 writes, as TensorFlow's does)."""
  from tensorflow.python.ops import summary_ops_v2  # pylint: disable=g-import-not-at-top
  return summary_ops_v2._summary_state  # pylint: disable=protected-access


def eager_device_name():
  """The device named by the innermost eager `tf.device` scope, or ""."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.context().device_name or ""


def plain_variable(initial_value, device, name):
  """A plain variable on `device`, created past any variable creator.

  The collective ops' ordering tokens and key counters are variables of
  their own; they must not become distributed variables when created inside
  a strategy's scope.
  """
  graph = tf.compat.v1.get_default_graph()
  creators = variable_creator_stack(graph)
  set_variable_creator_stack(graph, [])
  try:
    with tf.device(device):
      return tf.Variable(initial_value, trainable=False, name=name)
  finally:
    set_variable_creator_stack(graph, creators)


def clone_function(function, python_function):
  """A `tf.function` like `function` (same options) around `python_function`."""
  return function._clone(python_function=python_function)  # pylint: disable=protected-access


class TraceMapperGuard:
  """Restores this thread's stack-trace mappers if a replica function fails.

  AutoGraph pushes a source-map entry when it enters a converted function;
  if building that entry fails (TensorFlow cannot map functions whose source
  file is unknown, such as those defined in doctests), the entry stays on
  the thread's stack and breaks every later conversion on that thread.
  TensorFlow runs replicas on throwaway threads, so the damage dies with
  them; replica 0 runs on the caller's thread here, so we clean up.
  """

  def __init__(self):
    from tensorflow.python.util import tf_stack  # pylint: disable=g-import-not-at-top
    key = threading.get_ident()
    self._stacks = [tf_stack._source_mapper_stacks[key],  # pylint: disable=protected-access
                    tf_stack._source_filter_stacks[key]]  # pylint: disable=protected-access
    self._depths = [len(s) for s in self._stacks]

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *unused):
    if exc_type is not None:
      for stack, depth in zip(self._stacks, self._depths):
        del stack[depth:]
    return False


def gradient_tape_active():
  """Whether any `tf.GradientTape` is recording on this thread."""
  from tensorflow.python.eager import record  # pylint: disable=g-import-not-at-top
  return record.could_possibly_record()


def flat_tensor_specs(element_spec):
  """The tensor-level specs a dataset op's `output_types`/`output_shapes` take."""
  return [flat for spec in tf.nest.flatten(element_spec)
          for flat in spec._flat_tensor_specs]  # pylint: disable=protected-access


def copy_to_device(eager_tensor, device):
  """`eager_tensor` copied onto `device`: one C call, where `tf.identity`
  under `tf.device` costs ten times as much per step of an input loop."""
  return eager_tensor._copy_to_device(device)  # pylint: disable=protected-access


def _keras_major_version():
  """The installed Keras' major version (None without Keras), read from its
  package metadata: importing Keras here would cost every user seconds."""
  try:
    return int(importlib.metadata.version("keras").split(".")[0])
  except (importlib.metadata.PackageNotFoundError, ValueError):
    return None


def _keras_dataset_bases(keras_major_version):
  """Extra base classes of our distributed datasets, for Keras to accept them.

  Keras 3's `fit`, `evaluate` and `predict` choose a data adapter with
  `keras.src.trainers.data_adapters.is_tf_dataset`, which accepts an object
  only if a class in its MRO is named `DistributedDataset` (or `DatasetV2`,
  `DistributedDatasetsFromFunction`) and has a module under
  `tensorflow.python.`; `isinstance(x, tf.distribute.DistributedDataset)`
  is not enough. Past that check Keras uses only the public interface
  (`isinstance` against `tf.distribute.DistributedDataset` and
  `DistributedIterator`, iteration, `get_next_as_optional`, `cardinality`,
  `element_spec`, `strategy.run`). An empty class named like TensorFlow's
  own distributed dataset answers the check. Keras 2 checks with
  `isinstance` and needs none.
  """
  if keras_major_version is None or keras_major_version < 3:
    return ()
  return (type("DistributedDataset", (), {
      "__module__": "tensorflow.python.distribute.input_lib",
      "__doc__": "Marks a distributed dataset for Keras 3's data adapters."}),)


KERAS_DATASET_BASES = _keras_dataset_bases(_keras_major_version())


def eager_context_config():
  """A copy of the `tf.compat.v1.ConfigProto` this process's eager context
  was configured with (logical devices, threads, placement), read without
  starting the context: a process joining a cluster hands it to its server,
  which would otherwise start with defaults (one device per type)."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(context.context().config)
  return config


def enable_collective_ops(server_def):
  """Starts this process's gRPC server as the task `server_def` names and
  lets eager collective ops reach the other tasks of its cluster.

  TensorFlow has no public call for this (`tf.distribute.Server` starts a
  server that eager ops do not use); its own MultiWorkerMirroredStrategy
  makes this one. Call it before any op runs, as TensorFlow asks.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  context.context().enable_collective_ops(server_def)


_KERAS_TRAINER = "keras.src.backend.tensorflow.trainer"


def route_keras_reduce_per_replica(takes, reduce):
  """Makes Keras 3 reduce the per-replica outputs of its training,
  evaluation and prediction steps with `reduce(values, strategy, reduction)`
  for strategies where `takes(strategy)`, and as before for the others.

  Keras treats a multi-worker strategy specially only if it is an instance
  of TensorFlow's own class (`_collective_all_reduce_multi_worker`);
  otherwise each worker averages its own replicas' metrics and logs values
  that differ from worker to worker. Keras calls its module-level
  `reduce_per_replica` by name, so wrapping that name is enough. Without
  Keras 3 this does nothing; it imports Keras, so call it only when a
  multi-worker strategy is made.
  """
  if _keras_major_version() != 3:
    return
  trainer = importlib.import_module(_KERAS_TRAINER)
  original = trainer.reduce_per_replica
  if getattr(original, "routes", None) is not None:
    if (takes, reduce) not in original.routes:
      original.routes.append((takes, reduce))
    return
  routes = [(takes, reduce)]

  def reduce_per_replica(values, strategy, reduction):
    for route_takes, route_reduce in routes:
      if route_takes(strategy):
        return route_reduce(values, strategy, reduction)
    return original(values, strategy, reduction)
  reduce_per_replica.routes = routes
  trainer.reduce_per_replica = reduce_per_replica


# The paths each Keras 3 callback that saves writes to, by class.
_KERAS_CHECKPOINT_PATHS = {
    "BackupAndRestore": ("backup_dir", "_weights_path", "_training_metadata_path",
                         "_prev_weights_path", "_prev_training_metadata_path"),
    "ModelCheckpoint": ("filepath",),
}


def route_keras_checkpoint_writes(takes):
  """Makes Keras 3's `BackupAndRestore` and `ModelCheckpoint` callbacks
  save into a temporary directory, removed at once, when `takes(strategy)`
  for the strategy of the model they serve; there `BackupAndRestore` also
  leaves the backup alone at the end of training. Elsewhere they work as
  before.

  Keras 3 has no check for multi-worker training in these callbacks (tf.keras
  asked `distributed_file_utils.write_dirpath`, that is the strategy's
  `extended.should_checkpoint`): every worker saves into the same files (two
  processes writing one HDF5 file fail with `BlockingIOError`) and deletes
  the backup. Every worker must still save, as saving reads variables that
  all workers take part in; as in TensorFlow's multi-worker tutorial, the
  other workers' files go to a temporary directory that is removed. While
  `_save_model` runs, the callback's paths (`_KERAS_CHECKPOINT_PATHS`)
  point into that directory. Without Keras 3 this does nothing; it imports
  Keras, so call it only when a multi-worker strategy is made.
  """
  if _keras_major_version() != 3:
    return
  callbacks = importlib.import_module("keras.callbacks")
  for name, paths in _KERAS_CHECKPOINT_PATHS.items():
    callback_class = getattr(callbacks, name)
    routes = getattr(callback_class._save_model, "routes", None)  # pylint: disable=protected-access
    if routes is None:
      routes = []
      callback_class._save_model = _saving_elsewhere(  # pylint: disable=protected-access
          callback_class._save_model, paths, routes)  # pylint: disable=protected-access
      if name == "BackupAndRestore":
        callback_class.on_train_end = _skipped_where(callback_class.on_train_end, routes)
    if takes not in routes:
      routes.append(takes)


def _routed(callback, routes):
  strategy = getattr(callback.model, "distribute_strategy", None)
  return any(takes(strategy) for takes in routes)


def _saving_elsewhere(save_model, paths, routes):
  @functools.wraps(save_model)
  def _save_model(self, *args, **kwargs):
    if not _routed(self, routes):
      return save_model(self, *args, **kwargs)
    given = {name: getattr(self, name) for name in paths}
    with tempfile.TemporaryDirectory() as temporary:
      for name, path in given.items():
        setattr(self, name, os.path.join(temporary, os.path.basename(path)))
      try:
        return save_model(self, *args, **kwargs)
      finally:
        for name, path in given.items():
          setattr(self, name, path)
  _save_model.routes = routes
  return _save_model


def _skipped_where(method, routes):
  @functools.wraps(method)
  def skipped(self, *args, **kwargs):
    if not _routed(self, routes):
      return method(self, *args, **kwargs)
    return None
  return skipped


# The module tf_keras keeps its backup state in, and whose
# `WorkerTrainingState` it looks up by name when `BackupAndRestore` starts.
_TF_KERAS_TRAINING_STATE = "tf_keras.src.distribute.worker_training_state"
_TF_KERAS_CALLBACKS = "tf_keras.src.callbacks"


# tfd's `PreemptionCheckpointHandler`, which `failure_handling` registers
# when imported (the package's `__init__` imports it): tf_keras's backups
# save before preemption through it.
_preemption_handler = {}


def register_preemption_handler(handler_class):
  """Called once by `failure_handling` with its `PreemptionCheckpointHandler`."""
  _preemption_handler["class"] = handler_class


def route_tf_keras(saves_before_preemption):
  """Makes tf_keras's `BackupAndRestore(..., save_before_preemption=True)`
  save at a termination notice through tfd's `PreemptionCheckpointHandler`
  (as registered) for the strategies where `saves_before_preemption(strategy)`.

  tf_keras turns the feature on for TensorFlow's MultiWorkerMirroredStrategy
  on Google Cloud, with TensorFlow's handler, which TensorFlow 2.21 switches
  off on VMs without GPUs (tf_keras then fails at the first batch). Call it
  whenever a strategy becomes current: it changes nothing until tf_keras is
  imported, routes once, and costs two dictionary look-ups after.
  """
  callbacks = sys.modules.get(_TF_KERAS_CALLBACKS)
  if callbacks is not None and getattr(
      callbacks.BackupAndRestore, "_tfd_routed", None) is not saves_before_preemption:
    _route_backup(callbacks.BackupAndRestore, saves_before_preemption)
  state = sys.modules.get(_TF_KERAS_TRAINING_STATE)
  if state is not None and getattr(
      state.WorkerTrainingState, "_tfd_routed", None) is not saves_before_preemption:
    _route_training_state(state, saves_before_preemption)


def _route_backup(callback_class, saves_before_preemption):
  """With `save_before_preemption`, `BackupAndRestore` asks for the batch
  hooks, in which tf_keras checks for a notice, wherever
  `saves_before_preemption` (tf_keras asks for them only to save every
  `save_freq` batches, so with `save_freq="epoch"` and no other callback
  that wants them, such as `verbose=0`, it never checks)."""
  implements_batch_hooks = callback_class._implements_train_batch_hooks  # pylint: disable=protected-access

  @functools.wraps(implements_batch_hooks)
  def batch_hooks(self):
    model = getattr(self, "model", None)
    return implements_batch_hooks(self) or bool(
        self.save_before_preemption and model is not None
        and saves_before_preemption(model.distribute_strategy))

  callback_class._implements_train_batch_hooks = batch_hooks  # pylint: disable=protected-access
  callback_class._tfd_routed = saves_before_preemption  # pylint: disable=protected-access


def _route_training_state(module, saves_before_preemption):
  """tf_keras's backup state builds TensorFlow's handler for
  `save_before_preemption`, from the manager that writes this worker's
  backup (a temporary folder on workers other than the chief), and turns it
  on only on Google Cloud (`distributed_file_utils._on_gcp`). Where
  `saves_before_preemption` the state is built without it, and on Google
  Cloud it is driven by the registered handler over the manager that reads
  the backup, so every worker restores the chief's backup."""
  state_class = module.WorkerTrainingState
  init = state_class.__init__

  @functools.wraps(init)
  def routed(self, model, checkpoint_dir, save_freq="epoch", save_before_preemption_arg=None):
    strategy = model.distribute_strategy
    ours = bool(save_before_preemption_arg) and saves_before_preemption(strategy)
    init(self, model, checkpoint_dir, save_freq, False if ours else save_before_preemption_arg)
    if ours and module.distributed_file_utils._on_gcp():  # pylint: disable=protected-access
      self._enable_save_before_preemption = True  # pylint: disable=protected-access
      self.preemption_handler = _preemption_handler["class"](
          strategy.cluster_resolver, self.read_checkpoint_manager)
      model._preemption_handler = self.preemption_handler  # pylint: disable=protected-access
  state_class.__init__ = routed
  state_class._tfd_routed = saves_before_preemption  # pylint: disable=protected-access


def parse_topology_proto(serialized):
  """The `TopologyProto` TensorFlow's TPU system initialization returns
  (serialized), whose `tpu_hardware_feature` `TPUClusterResolver` reports:
  `tf.tpu.experimental.Topology` parses the same bytes but keeps only the
  mesh."""
  try:
    from tensorflow.core.protobuf.tpu import topology_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(f"TensorFlow {tf.__version__} has no TPU topology proto "
                      "(tensorflow.core.protobuf.tpu.topology_pb2).") from None
  proto = topology_pb2.TopologyProto()
  proto.ParseFromString(serialized)
  return proto


def xla_sharding_annotation(tensor, kind, detail):
  """`tensor` behind an XLA sharding op: "maximal" on logical device
  `detail`, "tiled" by `detail` pieces per dimension, or "replicated".

  TensorFlow's TPU strategy annotates through its private `xla_sharding`
  module; there is no public one.
  """
  from tensorflow.python.compiler.xla.experimental import xla_sharding  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if kind == "maximal":
    return xla_sharding.assign_device(tensor, detail, use_sharding_op=True)
  if kind == "tiled":
    tiles = np.arange(int(np.prod(detail))).reshape(detail)
    return xla_sharding.tile(tensor, tiles, use_sharding_op=True)
  return xla_sharding.replicate(tensor, use_sharding_op=True)


def hlo_text(concrete_function, arg_specs, captured_inputs, device):
  """The HLO XLA compiles `concrete_function` (traced with `jit_compile=True`)
  to on `device`, for arguments of `arg_specs` (static shapes) and with
  `captured_inputs` in place of what it captured (eager values, in the order
  of `concrete_function.captured_inputs`). Raises `ValueError` with XLA's
  message where XLA cannot compile it.

  `tf.function.experimental_get_compiler_ir` lowers with the captured values
  themselves, which inside another function's trace are symbolic.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  if not hasattr(context.Context, "get_compiler_ir"):
    raise ImportError(f"TensorFlow {tf.__version__} has no compiler IR export "
                      "(tensorflow.python.eager.context.Context.get_compiler_ir).")
  return context.context().get_compiler_ir(
      device_name=device, platform_name=None, function_name=concrete_function.name,
      flat_args=list(arg_specs), captured_inputs=list(captured_inputs),
      stage="hlo").decode("utf-8")


def variable_of_handle(handle, like):
  """A `tf.Variable` over an existing resource `handle`, with the dtype,
  shape, name and trainability of variable `like`: reads and updates through
  it are variable ops on `handle` that `tf.GradientTape` records, as for any
  variable. TensorFlow builds its TPU variables on this private base class;
  there is no public constructor taking a handle."""
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  return resource_variable_ops.BaseResourceVariable(
      trainable=like.trainable, shape=like.shape, dtype=like.dtype, handle=handle,
      name=like.name.split(":")[0], unique_id=f"{like.name}_replicated",
      handle_name=like.name.split(":")[0], in_graph_mode=True)


def tf1_saveable(variable, name, device, read, restore):
  """What `tf.compat.v1.train.Saver` saves for `variable`, a `tf.Variable`
  that is not a resource variable: `read()` (a tensor on `device`) under
  `name`, restored by `restore(tensor)` (an op).

  The Saver asks such a variable for these through
  `_gather_saveables_for_checkpoint`, whose entries must subclass a private
  base class; given the variable itself it recurses without end.
  """
  try:
    from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(f"TensorFlow {tf.__version__} has no saveable objects "
                      "(tensorflow.python.training.saving.saveable_object); "
                      "tf.compat.v1.train.Saver cannot save distributed "
                      "variables.") from None

  class VariableSaveable(saveable_object.SaveableObject):

    def restore(self, restored_tensors, restored_shapes):
      del restored_shapes
      return restore(restored_tensors[0])

  spec = saveable_object.SaveSpec(read, "", name, dtype=variable.dtype,
                                  device=device)
  return VariableSaveable(variable, [spec], name)


# --- Parameter-server training.

# TensorFlow's sharded variable class, which tfd's `ShardedVariable` stands
# for (`tf_classes`): tf_keras's legacy optimizers give the slot of a
# sharded variable, in `get_slot` and when restoring it, only for instances
# of this class.
TENSORFLOW_SHARDED_VARIABLE = tf.__internal__.distribute.ShardedVariable


def in_save_context():
  """Whether a `tf.saved_model.save` is in progress (a sharded variable is
  then one whole variable)."""
  return _save_context.in_save_context()


def uninitialized_variable(shape, dtype, name, trainable):
  """A variable with no value yet: what a SavedModel stores for a sharded
  variable, whose value the checkpoint inside the SavedModel supplies. It is
  made outside every variable creator (a strategy's would shard it)."""
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  with tf.init_scope(), tf.device(None):
    return resource_variable_ops.UninitializedVariable(
        shape=shape, dtype=dtype, name=name, trainable=trainable,
        synchronization=tf.VariableSynchronization.NONE,
        aggregation=tf.VariableAggregation.NONE)


def write_variable_proto(variable, proto, options):
  """Writes `variable` into a SavedModel object proto, as a variable."""
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  resource_variable_ops.write_object_proto_for_resource_variable(
      variable, proto, options, enforce_naming=False)


def call_time_value(closure, spec):
  """A placeholder in the `tf.function` being traced whose value `closure`
  gives at each call: the coordinator's worker index of the call."""
  return tf.compat.v1.get_default_graph().capture_call_time_value(closure, spec)


def worker_executor():
  """A context manager factory: the eager ops run inside it go through one
  synchronous executor of their own, whose errors stay its own."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import executor  # pylint: disable=g-import-not-at-top
  own = executor.new_executor(enable_async=False)
  return lambda: context.executor_scope(own)


# --- The coordination service of a cluster's runtime.

def coordination_set(key, value):
  """Stores `value` (a string) under `key` in the coordination service's
  key-value store, which every task of the cluster reads. A key is set once:
  a second set raises `tf.errors.AlreadyExistsError`; without a service,
  `tf.errors.FailedPreconditionError`.

  TensorFlow reaches the store only through its eager context.
  """
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  context.context().set_config_key_value(key, value)


def coordination_get(key, timeout_seconds):
  """The value stored under `key`, waiting at most `timeout_seconds` (> 0)
  for a task to set it: `tf.errors.DeadlineExceededError` after that."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  return context.context().get_config_key_value(key, max(int(timeout_seconds * 1000), 1))


def report_error_to_cluster(error):
  """Makes the coordination service fail every task of the cluster with
  `error` (a `tf.errors.OpError`), so that the others' waits end at once."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  context.context().report_error_to_cluster(error.error_code, error.message)


def task_answers(task, timeout_seconds):
  """Whether `task` ("/job:worker/replica:0/task:1") is alive, as the
  cluster's runtime sees it (a restarted task is another one), asking for
  at most `timeout_seconds`."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  try:
    context.context().check_collective_ops_peer_health(
        task, max(int(timeout_seconds * 1000), 1))
  except (tf.errors.UnavailableError, tf.errors.FailedPreconditionError,
          tf.errors.AbortedError, tf.errors.NotFoundError):
    return False
  return True


# --- Remote procedure calls.

_RPC_PACKAGE = "tensorflow.distribute.experimental.rpc"


@functools.lru_cache(maxsize=None)
def _rpc_module(name):
  try:
    return importlib.import_module(f"{_RPC_PACKAGE}.{name}")
  except ImportError:
    raise ImportError(f"TensorFlow {tf.__version__} has no RPC ops "
                      f"({_RPC_PACKAGE}.{name}), which "
                      "tf_distribute_lite.experimental.rpc runs on.") from None


def rpc_kernels():
  """TensorFlow's generated wrappers of its RPC ops: `rpc_server`,
  `rpc_server_register`, `rpc_server_start`, `rpc_client`, `rpc_call`,
  `rpc_check_status`, `rpc_get_value` and `delete_rpc_future_resource`.
  `tf.raw_ops` does not list them."""
  return _rpc_module("kernels.gen_rpc_ops")


def parse_registered_method(serialized):
  """The `RegisteredMethod` proto (`method`, and its `input_specs` and
  `output_specs` as `StructuredValue`s) that the `RpcClient` op lists, one
  serialized string per method of the server."""
  proto = _rpc_module("proto.tf_rpc_service_pb2").RegisteredMethod()
  proto.ParseFromString(serialized)
  return proto
