"""The package's only contact with TensorFlow's private names, all listed in
`_REQUIRED` and `_OPTIONAL` (checked at import; each has a contract test in
`tests/test_tf_bridge.py`). The package is exempt from AutoGraph."""

import functools
import importlib
import os
import threading
import weakref

import tensorflow as tf

_STACK_ATTRIBUTE = "_distribution_strategy_stack"
_CREATOR_ATTRIBUTE = "_variable_creator_stack"
_PY = "tensorflow.python."

# {module: its names the package needs wherever it runs, as `has_name` reads them}.
_REQUIRED = {
    "tensorflow": "__internal__.CompositeTensor __internal__.types.Tensor "
                  "__internal__.tracking.Trackable __internal__.EagerTensor "
                  "__internal__.tracking.CheckpointInitialValue __internal__.FuncGraph "
                  "__internal__.autograph.tf_convert __internal__.autograph.control_status_ctx "
                  "__internal__.distribute.ShardedVariable",
    _PY + "framework.ops": f"Graph.{_STACK_ATTRIBUTE} Graph.{_CREATOR_ATTRIBUTE} "
                           "Graph._get_control_flow_context EagerTensor._copy_to_device",
    _PY + "framework.type_spec": "TypeSpec._flat_tensor_specs",
    _PY + "framework.type_spec_registry": "register",
    _PY + "framework.func_graph": "FuncGraph.capture_call_time_value "
                                  "FuncGraph.mark_as_unsaveable FuncGraph.replace_capture",
    _PY + "saved_model.save_context": "in_save_context get_save_options",
    _PY + "autograph.core.config": "CONVERSION_RULES DoNotConvert",
    _PY + "eager.record": "could_possibly_record",
    _PY + "eager.context": "context executor_scope Context.device_name",
    _PY + "eager.executor": "new_executor",
    _PY + "eager.polymorphic_function.polymorphic_function": "Function._clone Function.function_spec",
    _PY + "eager.polymorphic_function.function_type_utils": "FunctionSpec.jit_compile",
    _PY + "ops.summary_ops_v2": "_summary_state.writer _summary_state.step "
                                "_summary_state.is_recording "
                                "_summary_state.is_recording_distribution_strategy",
    _PY + "ops.control_flow_v2_func_graphs": "CondBranchFuncGraph WhileBodyFuncGraph "
                                             "WhileCondFuncGraph",
    _PY + "ops.resource_variable_ops": (
        "UninitializedVariable BaseResourceVariable write_object_proto_for_resource_variable "
        "ResourceVariable()._shared_name ResourceVariable()._unique_id "
        "ResourceVariable()._graph_key ResourceVariable()._distribute_strategy "
        "ResourceVariable._as_graph_element ResourceVariable._export_to_saved_model_graph "
        "ResourceVariable._write_object_proto"),
    _PY + "distribute.distribute_lib": "UpdateContext get_update_replica_id",
    _PY + "util.tf_stack": "_source_mapper_stacks _source_filter_stacks",
    _PY + "autograph.pyct.error_utils": "ErrorMetadataBase().cause_message",
}

# {feature: (what fails without it, {module: names})}.
_OPTIONAL = {
    "cluster runtime": ("tfd cannot join or coordinate a cluster", {
        # The two knobs of `remote_ops_run_synchronously`: functions that read them.
        _PY + "eager.context": "Context.config Context.enable_collective_ops "
                               "Context.set_config_key_value Context.get_config_key_value "
                               "Context.report_error_to_cluster "
                               "Context.check_collective_ops_peer_health "
                               "async_wait(TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY) "
                               "async_scope(TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE)"}),
    "TPU topology proto": ("TPUClusterResolver cannot report the hardware", {
        "tensorflow.core.protobuf.tpu.topology_pb2": "TopologyProto"}),
    "XLA sharding ops": ("TPUStrategy cannot annotate logical devices", {
        _PY + "compiler.xla.experimental.xla_sharding": "assign_device tile replicate"}),
    "compiler IR export": ("an emulated TPU cannot check that a step compiles", {
        _PY + "eager.context": "Context.get_compiler_ir"}),
    "saveable objects": ("tf.compat.v1.train.Saver cannot save distributed variables", {
        _PY + "training.saving.saveable_object": "SaveableObject SaveSpec"}),
    "RPC ops": ("tf_distribute_lite.experimental.rpc cannot run", {
        "tensorflow.distribute.experimental.rpc.kernels.gen_rpc_ops": "rpc_server",
        "tensorflow.distribute.experimental.rpc.proto.tf_rpc_service_pb2": "RegisteredMethod",
        "tensorflow": "__internal__.saved_model.encode_structure "
                      "__internal__.saved_model.decode_proto"}),
}


def _names_in_code(member, name):
  """Whether function (or property) `member`'s code names or quotes `name`."""
  function = getattr(member, "fget", member)
  code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
  return code is not None and (name in code.co_names or name in code.co_consts)


def has_name(module, path):
  """Whether `module` has `path`: "A.b"; "A()._b", set by `A`'s methods;
  "f(NAME)", a function whose code uses `NAME`."""
  try:
    found = importlib.import_module(module)
  except ImportError:
    return False
  *parents, last = path.split(".")
  for name in parents:
    if name.endswith("()"):
      cls = getattr(found, name[:-2], None)
      return isinstance(cls, type) and any(
          _names_in_code(member, last) for c in cls.__mro__ for member in vars(c).values())
    found = getattr(found, name, None)
  function, _, used = last.partition("(")
  if used:
    return _names_in_code(getattr(found, function, None), used[:-1])
  return hasattr(found, last)


def missing_names(names):
  """The "module.path"s of `names` ({module: "path path ..."}) not found."""
  return [f"{module}.{path}" for module, paths in names.items()
          for path in paths.split() if not has_name(module, path)]


def _check_tensorflow():
  """Checks `_REQUIRED` (or raises ImportError); {optional feature: missing names}."""
  missing = missing_names(_REQUIRED)
  if missing or not tf.__version__.startswith("2."):
    raise ImportError(
        f"tf_distribute_lite does not recognise the internals of TensorFlow {tf.__version__} "
        f"(missing: {', '.join(missing) or 'TF 2.x'}); it needs a TensorFlow 2.x release that "
        "keeps the distribution strategy stack on tf.Graph.")
  missing = {feature: missing_names(names) for feature, (_, names) in _OPTIONAL.items()}
  return {feature: names for feature, names in missing.items() if names}


_UNAVAILABLE = _check_tensorflow()


def _require(feature):
  """Raises ImportError where the installed TensorFlow lacks `feature`."""
  if feature in _UNAVAILABLE:
    raise ImportError(
        f"TensorFlow {tf.__version__} has no {feature} "
        f"({', '.join(_UNAVAILABLE[feature])}): {_OPTIONAL[feature][0]}.")


# pylint: disable=g-import-not-at-top,g-bad-import-order
from tensorflow.python.autograph.core import config as _autograph_config
from tensorflow.python.distribute import distribute_lib as _tf_distribute_lib
from tensorflow.python.eager import context as _context
from tensorflow.python.eager import executor as _executor
from tensorflow.python.eager import record as _record
from tensorflow.python.ops import control_flow_v2_func_graphs as _control_flow_graphs
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.ops import summary_ops_v2 as _summary_ops
from tensorflow.python.saved_model import save_context as _save_context
from tensorflow.python.util import tf_stack as _tf_stack
# pylint: enable=g-import-not-at-top,g-bad-import-order

# Base classes tfd's classes subclass or check against.
CompositeTensor = tf.__internal__.CompositeTensor
TensorBase = tf.__internal__.types.Tensor  # what `tf.is_tensor` accepts
Trackable = tf.__internal__.tracking.Trackable
CheckpointInitialValue = tf.__internal__.tracking.CheckpointInitialValue
EagerTensor = tf.__internal__.EagerTensor


_RULE = _autograph_config.DoNotConvert(__name__.split(".")[0])
if not any(str(r) == str(_RULE) for r in _autograph_config.CONVERSION_RULES):
  _autograph_config.CONVERSION_RULES = (_RULE,) + tuple(_autograph_config.CONVERSION_RULES)


def strategy_stack():
  """The current graph's per-thread stack of strategy contexts (a list)."""
  return getattr(tf.compat.v1.get_default_graph(), _STACK_ATTRIBUTE)


@functools.lru_cache(maxsize=None)
def tensorflow_default_strategy():
  """TensorFlow's own default strategy (one per process)."""
  stack = strategy_stack()
  entries = stack[:]
  del stack[:]
  try:
    return tf.distribute.get_strategy()
  finally:
    stack[:] = entries


def mark_function_unsaveable(reason):
  """Makes `tf.saved_model.save` refuse the function being traced, for `reason`."""
  if tf.inside_function() and not _save_context.in_save_context():
    tf.compat.v1.get_default_graph().mark_as_unsaveable(reason)


def register_type_spec(name):
  """A class decorator registering a `tf.TypeSpec` under `name` for SavedModels."""
  from tensorflow.python.framework import type_spec_registry  # pylint: disable=g-import-not-at-top
  return type_spec_registry.register(name)


def update_context(replica_id):
  """Inside it, updates go to replica `replica_id`'s components (TF's state)."""
  return _tf_distribute_lib.UpdateContext(replica_id)


def update_replica_id():
  return _tf_distribute_lib.get_update_replica_id()


def saving_without_distribution():
  """True while `tf.saved_model.save` traces without expanding variables."""
  if not _save_context.in_save_context():
    return False
  policy = _save_context.get_save_options().experimental_variable_policy
  return policy != tf.saved_model.experimental.VariablePolicy.EXPAND_DISTRIBUTED_VARIABLES


def _creator_stack(graph):
  return getattr(graph, _CREATOR_ATTRIBUTE)


def _set_creator_stack(graph, stack):
  setattr(graph, _CREATOR_ATTRIBUTE, stack)


class VariableCreatorScope:
  """`tf.variable_creator_scope(creator)`, without its costly generator scopes."""

  _PRIORITY = 100

  __slots__ = ("_creator", "_graph", "_outer", "_stack")

  def __init__(self, creator):
    self._creator = creator

  def __enter__(self):
    self._graph = tf.compat.v1.get_default_graph()
    self._outer = _creator_stack(self._graph)
    self._stack = self._outer + [(self._PRIORITY, self._creator)]
    if self._outer and self._outer[-1][0] > self._PRIORITY:
      self._stack.sort(key=lambda item: item[0])  # stable, as TensorFlow's
    _set_creator_stack(self._graph, self._stack)

  def __exit__(self, *exc_info):
    if _creator_stack(self._graph) is not self._stack:
      raise RuntimeError("Exiting variable_creator_scope without proper nesting.")
    _set_creator_stack(self._graph, self._outer)


def control_flow_context():
  """The TF 1.x control-flow context new ops go into, or None."""
  return tf.compat.v1.get_default_graph()._get_control_flow_context()  # pylint: disable=protected-access


def is_function_graph(graph):
  return isinstance(graph, tf.__internal__.FuncGraph)


def control_flow_kind(graph):
  """"cond" for a `tf.cond` branch, "while" for a `tf.while_loop` graph, else None."""
  if isinstance(graph, _control_flow_graphs.CondBranchFuncGraph):
    return "cond"
  if isinstance(graph, (_control_flow_graphs.WhileBodyFuncGraph,
                        _control_flow_graphs.WhileCondFuncGraph)):
    return "while"
  return None


# `tf.summary`'s state: one object whose attributes are per thread.
_summary_state = _summary_ops._summary_state  # pylint: disable=protected-access


class RecordSummariesIf:
  """A context manager: `tf.summary` records only where `condition()` holds."""

  def __init__(self, condition):
    self._condition = condition
    self._outer = None

  def __enter__(self):
    self._outer = _summary_state.is_recording_distribution_strategy
    _summary_state.is_recording_distribution_strategy = self._condition

  def __exit__(self, *exc_info):
    _summary_state.is_recording_distribution_strategy = self._outer


class ThreadState:
  """Gives the current thread the variable creators and `tf.summary` state of
  the thread that made it (several threads at once)."""

  def __init__(self):
    self._state = self._read()
    self._outer = {}  # by thread

  @staticmethod
  def _read():
    return (list(_creator_stack(tf.compat.v1.get_default_graph())),
            (_summary_state.writer, _summary_state.step, _summary_state.is_recording))

  @staticmethod
  def _write(state):
    creators, (_summary_state.writer, _summary_state.step, _summary_state.is_recording) = state
    _set_creator_stack(tf.compat.v1.get_default_graph(), list(creators))

  def __enter__(self):
    self._outer[threading.get_ident()] = self._read()
    self._write(self._state)
    return self

  def __exit__(self, *exc_info):
    self._write(self._outer.pop(threading.get_ident()))


def eager_device_name():
  return _context.context().device_name or ""


def plain_variable(initial_value, device, name):
  """A plain variable on `device`, created past any variable creator."""
  graph = tf.compat.v1.get_default_graph()
  creators = _creator_stack(graph)
  _set_creator_stack(graph, [])
  try:
    with tf.device(device):
      return tf.Variable(initial_value, trainable=False, name=name)
  finally:
    _set_creator_stack(graph, creators)


def clone_function(function, python_function):
  """A `tf.function` like `function` (same options) around `python_function`."""
  return function._clone(python_function=python_function)  # pylint: disable=protected-access


def is_jit_compiled(function):
  return bool(function.function_spec.jit_compile)


def autograph_convert(fn):
  """`fn` converted by AutoGraph if its caller is (eagerly `fn`)."""
  if tf.executing_eagerly():
    return fn
  return tf.__internal__.autograph.tf_convert(
      fn, tf.__internal__.autograph.control_status_ctx(), convert_by_default=False)


class TraceMapperGuard:
  """Restores this thread's stack-trace mappers (AutoGraph's) if code fails."""

  def __init__(self):
    key = threading.get_ident()
    self._stacks = [_tf_stack._source_mapper_stacks[key],  # pylint: disable=protected-access
                    _tf_stack._source_filter_stacks[key]]  # pylint: disable=protected-access
    self._depths = [len(s) for s in self._stacks]

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *unused):
    if exc_type is not None:
      for stack, depth in zip(self._stacks, self._depths):
        del stack[depth:]
    return False


def add_error_note(error, note):
  """Adds `note` to `error`, and to the message AutoGraph rebuilds it from."""
  error.add_note(note)
  metadata = getattr(error, "ag_error_metadata", None)
  if metadata is not None:
    metadata.cause_message = f"{metadata.cause_message}\n{note}"


def gradient_tape_active():
  return _record.could_possibly_record()


def flat_tensor_specs(element_spec):
  """The tensor-level specs a dataset op's `output_types`/`output_shapes` take."""
  return [flat for spec in tf.nest.flatten(element_spec)
          for flat in spec._flat_tensor_specs]  # pylint: disable=protected-access


def copy_to_device(eager_tensor, device):
  """`eager_tensor` copied onto `device` (ten times cheaper than `tf.identity`)."""
  return eager_tensor._copy_to_device(device)  # pylint: disable=protected-access


def eager_context_config():
  """A copy of the eager context's `ConfigProto`, read without starting it."""
  _require("cluster runtime")
  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(_context.context().config)
  return config


def enable_collective_ops(server_def):
  """Starts this process's gRPC server for eager collective ops, before any op."""
  _require("cluster runtime")
  _context.context().enable_collective_ops(server_def)


def remote_ops_run_synchronously():
  """Makes remote ops run one at a time, so an error reaches its own call."""
  _require("cluster runtime")
  os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"] = "False"
  os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] = "True"


def parse_topology_proto(serialized):
  """The `TopologyProto` parsed from `serialized`."""
  _require("TPU topology proto")
  from tensorflow.core.protobuf.tpu import topology_pb2  # pylint: disable=g-import-not-at-top
  proto = topology_pb2.TopologyProto()
  proto.ParseFromString(serialized)
  return proto


def xla_sharding_annotation(tensor, kind, detail):
  """`tensor` sharded "maximal" (on device `detail`), "tiled" or "replicated"."""
  _require("XLA sharding ops")
  from tensorflow.python.compiler.xla.experimental import xla_sharding  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if kind == "maximal":
    return xla_sharding.assign_device(tensor, detail, use_sharding_op=True)
  if kind == "tiled":
    tiles = np.arange(int(np.prod(detail))).reshape(detail)
    return xla_sharding.tile(tensor, tiles, use_sharding_op=True)
  return xla_sharding.replicate(tensor, use_sharding_op=True)


def hlo_text(concrete_function, arg_specs, captured_inputs, device):
  """The HLO of `concrete_function` on `device` (`ValueError` if XLA refuses it)."""
  _require("compiler IR export")
  return _context.context().get_compiler_ir(
      device_name=device, platform_name=None, function_name=concrete_function.name,
      flat_args=list(arg_specs), captured_inputs=list(captured_inputs),
      stage="hlo").decode("utf-8")


def variable_of_handle(handle, like):
  """A `tf.Variable` over resource `handle`, otherwise like variable `like`."""
  return _resource_variable_ops.BaseResourceVariable(
      trainable=like.trainable, shape=like.shape, dtype=like.dtype, handle=handle,
      name=like.name.split(":")[0], unique_id=f"{like.name}_replicated",
      handle_name=like.name.split(":")[0], in_graph_mode=True)


def tf1_saveable(variable, name, device, read, restore):
  """What a TF 1.x `Saver` saves for `variable`: `read()`, restored by `restore`."""
  _require("saveable objects")
  from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-import-not-at-top

  class VariableSaveable(saveable_object.SaveableObject):

    def restore(self, restored_tensors, restored_shapes):
      del restored_shapes
      return restore(restored_tensors[0])

  spec = saveable_object.SaveSpec(read, "", name, dtype=variable.dtype, device=device)
  return VariableSaveable(variable, [spec], name)


# --- A variable standing for others: TensorFlow's private variable interface.

_VARIABLE_KEYS = ("_shared_name", "_unique_id", "_graph_key")


def variable_key(variable, name):
  """`variable`'s `name`, one of the keys `_VARIABLE_KEYS`."""
  if name not in _VARIABLE_KEYS:
    raise ValueError(f"`name` must be one of {_VARIABLE_KEYS}; got {name!r}.")
  return getattr(variable, name)


def variable_strategy(variable):
  return getattr(variable, "_distribute_strategy", None)


def graph_element(value):
  """A variable's graph element (for `tf.group`, `Session.run`), else `value`."""
  as_element = getattr(value, "_as_graph_element", None)
  return as_element() if callable(as_element) else value


def export_to_saved_model(variable, object_map, tensor_map, options, **kwargs):
  """Adds `variable` to the SavedModel being written; its resources."""
  return variable._export_to_saved_model_graph(  # pylint: disable=protected-access
      object_map=object_map, tensor_map=tensor_map, options=options, **kwargs)


def write_object_proto(variable, proto, options):
  """Writes `variable` into its SavedModel object proto, as it writes itself."""
  variable._write_object_proto(proto, options)  # pylint: disable=protected-access


def replace_capture(concrete_function, value, placeholder):
  """Makes loaded `concrete_function` capture `value` as `placeholder`."""
  concrete_function.graph.replace_capture(value, placeholder)


def _container_holder(component):
  return component.handle if isinstance(component, CompositeTensor) else component


def set_distributed_container(component, container):
  """Records `container` on `component`, where TensorFlow and Keras look."""
  _container_holder(component)._distributed_container = weakref.ref(container)  # pylint: disable=protected-access


def distributed_container_of(component):
  """What `set_distributed_container` recorded on `component`, or None."""
  reference = getattr(_container_holder(component), "__dict__", {}).get("_distributed_container")
  return reference() if reference is not None else None


def set_sharded_container(shard, container):
  """Records on `shard` its sharded variable, where tf_keras looks."""
  shard._sharded_container = weakref.ref(container)  # pylint: disable=protected-access


# --- Parameter-server training.

# TensorFlow's sharded variable class, which tfd's stands for.
TENSORFLOW_SHARDED_VARIABLE = tf.__internal__.distribute.ShardedVariable


def in_save_context():
  return _save_context.in_save_context()


def uninitialized_variable(shape, dtype, name, trainable):
  """A variable with no value, made outside every creator."""
  with tf.init_scope(), tf.device(None):
    return _resource_variable_ops.UninitializedVariable(
        shape=shape, dtype=dtype, name=name, trainable=trainable,
        synchronization=tf.VariableSynchronization.NONE,
        aggregation=tf.VariableAggregation.NONE)


def write_variable_proto(variable, proto, options):
  """Writes `variable` into a SavedModel object proto, as a variable."""
  _resource_variable_ops.write_object_proto_for_resource_variable(
      variable, proto, options, enforce_naming=False)


def call_time_value(closure, spec):
  """A placeholder in the function being traced that `closure()` fills per call."""
  return tf.compat.v1.get_default_graph().capture_call_time_value(closure, spec)


def worker_executor():
  """A factory of scopes whose eager ops share one synchronous executor."""
  own = _executor.new_executor(enable_async=False)
  return lambda: _context.executor_scope(own)


# --- The coordination service of a cluster's runtime.

def coordination_set(key, value):
  """Stores `value` under `key` in the coordination service (once per key)."""
  _require("cluster runtime")
  _context.context().set_config_key_value(key, value)


def coordination_get(key, timeout_seconds):
  """The value under `key`, waiting at most `timeout_seconds` for it."""
  _require("cluster runtime")
  return _context.context().get_config_key_value(key, max(int(timeout_seconds * 1000), 1))


def report_error_to_cluster(error):
  """Makes the coordination service fail every task with `error` (an OpError)."""
  _require("cluster runtime")
  _context.context().report_error_to_cluster(error.error_code, error.message)


def task_answers(task, timeout_seconds):
  """Whether `task` ("/job:worker/replica:0/task:1") answers within the timeout."""
  _require("cluster runtime")
  try:
    _context.context().check_collective_ops_peer_health(task, max(int(timeout_seconds * 1000), 1))
  except (tf.errors.UnavailableError, tf.errors.FailedPreconditionError,
          tf.errors.AbortedError, tf.errors.NotFoundError):
    return False
  return True


# --- Remote procedure calls.

_RPC_PACKAGE = "tensorflow.distribute.experimental.rpc"


def rpc_kernels():
  """TensorFlow's wrappers of its RPC ops (not in `tf.raw_ops`)."""
  _require("RPC ops")
  return importlib.import_module(f"{_RPC_PACKAGE}.kernels.gen_rpc_ops")


def parse_registered_method(serialized):
  """The `RegisteredMethod` proto parsed from `serialized`."""
  _require("RPC ops")
  proto = importlib.import_module(f"{_RPC_PACKAGE}.proto.tf_rpc_service_pb2").RegisteredMethod()
  proto.ParseFromString(serialized)
  return proto


def encode_specs(structure):
  """`structure` (a nest of `tf.TypeSpec`s) as a serialized `StructuredValue`."""
  _require("RPC ops")
  return tf.__internal__.saved_model.encode_structure(structure).SerializeToString()


def decode_specs(proto):
  """The nest of `tf.TypeSpec`s a `StructuredValue` proto holds."""
  _require("RPC ops")
  return tf.__internal__.saved_model.decode_proto(proto)
