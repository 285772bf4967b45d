"""What an emulated TPU checks of a step: that XLA compiles it, as a TPU
compiles every step with XLA.

Once the replicas' step is traced, the function given to `strategy.run` is
traced once more, for replica 0 alone, in a `tf.function(jit_compile=True)`
with the input shapes the replicas saw, and lowered to XLA's HLO without
running it (unknown dimensions as 1, as a TPU pads a dynamic batch to a
static shape). In that trace the cross-replica operations are stand-ins of
the same shapes (a CPU cannot run TPU collectives), variables are replica
0's components, and a variable the step creates is the one its replicas
created: the check creates nothing and never stops the step's code partway.
An op XLA has no kernel for, or a shape XLA needs at compile time and cannot
know, fails as on a TPU: `tf.errors.InvalidArgumentError` with XLA's
message. An error of the step's own code is raised by the replicas' trace,
before the check, with its own class.

The emulation checks what XLA compiles but computes with TensorFlow's
kernels on the CPU devices: XLA on a CPU has no collectives, so no replica's
step can run as one XLA program. Where XLA's semantics are laxer (it clamps
an out-of-range gather index, which TensorFlow rejects), the emulation is
the stricter of the two.

Not checked: TF 1.x graphs (run by a Session; XLA compiles functions, which
such graphs cannot capture their variables into), steps with an input that
is not a dense tensor of known rank, and steps that capture a resource made
inside the step's function (a table, an iterator).
"""

import contextlib

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import device_util
from tf_distribute_lite import tpu_replication
from tf_distribute_lite import values as values_lib


class XlaCheckReplicaContext(tpu_replication.TPUReplicaContext):
  """Replica 0 of the compile check: collectives give results of the right
  shapes (the input itself, or replica 0's value for every replica), and
  distributed variables are replica 0's components."""

  @property
  def replica_id_in_sync_group(self):
    return tf.constant(0, tf.int32)

  def all_reduce(self, reduce_op, value, options=None):
    del reduce_op, options
    return tf.nest.map_structure(tf.identity, value)

  def all_gather(self, value, axis, options=None):
    del options
    count = self.num_replicas_in_sync
    return tf.nest.map_structure(lambda v: tf.concat([v] * count, axis), value)

  def local_variable(self, variable):
    return variable.values[0]

  def reduce_shared(self, reduce_op, value):
    del reduce_op
    return value

  def logical_device_scope(self, logical_device_id):
    del logical_device_id  # replica 0 computes on one device
    return contextlib.nullcontext()


def check_compiles(strategy, fn, args, kwargs, created_variables=()):
  """Raises `tf.errors.InvalidArgumentError` if XLA cannot compile
  `fn(*args, **kwargs)` as replica 0 runs it. `created_variables` are the
  variables the replicas' trace of `fn` created, in order.

  >>> resolver = tf_distribute_lite.cluster_resolver.TPUClusterResolver("emulated:v4-8")
  >>> strategy = tf_distribute_lite.TPUStrategy(resolver)
  >>> check_compiles(strategy, lambda x: x * 2.0, (tf.constant(1.0),), {})
  >>> check_compiles(strategy, lambda x: tf.strings.length(tf.strings.as_string(x)),
  ...                (tf.constant(1.0),), {})
  Traceback (most recent call last):
  ...
  tensorflow.python.framework.errors_impl.InvalidArgumentError: ...AsString...
  """
  if not tf.compat.v1.get_default_graph().building_function and not tf.executing_eagerly():
    return  # a TF 1.x graph
  inputs, with_tensors = tpu_replication.split_inputs(
      values_lib.select_replica(0, (tuple(args), dict(kwargs))))
  specs = [tf.type_spec_from_value(tensor) for tensor in inputs]
  strings = [tensor for tensor, spec in zip(inputs, specs)
             if getattr(spec, "dtype", None) == tf.string]  # composites have none
  if strings:
    raise tf.errors.InvalidArgumentError(
        None, None,
        f"XLA cannot compile the step, as a TPU must: a TPU computes no strings, "
        f"and the step takes tf.string inputs {strings}. Turn them into numbers "
        f"before `strategy.run` (in the input pipeline).")
  static_specs = [_static(spec) for spec in specs]
  if None in static_specs:
    return
  reused = iter(created_variables)

  def reuse_variable(next_creator, **kwargs):
    variable = next(reused, None)
    return next_creator(**kwargs) if variable is None else variable

  def replica_step(unused, *tensors):
    del unused
    replica_args, replica_kwargs = with_tensors(tensors)
    with tf.variable_creator_scope(reuse_variable), XlaCheckReplicaContext(strategy):
      result = fn(*replica_args, **replica_kwargs)
    return tpu_replication.output_tensors(result)

  traced = tf.function(replica_step, jit_compile=True).get_concrete_function(
      _UNUSED, *specs)
  device = strategy.extended.worker_devices[0]
  captured = _lowerable(traced, device)
  if captured is None:
    return
  try:
    _tf_bridge.hlo_text(traced, [_UNUSED] + static_specs, captured, device)
  except (ValueError, tf.errors.OpError) as e:
    message = str(e).split("Failed getting HLO text: ", 1)[-1]
    raise tf.errors.InvalidArgumentError(
        None, None,
        f"XLA cannot compile the step, as a TPU must: {message}") from None


# Given argument specs, XLA compiles a step's captured values as inputs, as a
# TPU does; given none, as constants. So every checked step takes one.
_UNUSED = tf.TensorSpec([], tf.int32)


def _static(spec):
  """`spec` with its unknown dimensions as 1: a TPU pads a dynamic batch to
  a static shape, so any size shows whether the step compiles. None where
  the spec is not a dense tensor's of known rank."""
  if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
    return None
  return tf.TensorSpec([1 if d is None else d for d in spec.shape.as_list()], spec.dtype)


def _lowerable(traced, device):
  """The values to compile `traced` with on `device`, for what it captured
  (XLA needs their shapes, not their values); None where a capture has no
  stand-in."""
  variables = {id(v.handle): v for v in traced.variables}
  with tf.init_scope():
    values = [_lowerable_value(value, variables.get(id(value)), device)
              for value in traced.captured_inputs]
  return None if any(value is None for value in values) else values


def _lowerable_value(value, variable, device):
  """An eager `value` itself, unless it is a variable (`variable`) not yet
  initialized or on another device than `device` (as replica 0's variables
  on its other logical devices are): a variable of zeros of its shape on
  `device`. A tensor of the enclosing trace: zeros of its shape (a TPU
  computation takes such a tensor as an input, not a constant). None for a
  resource of the enclosing trace, or a shape of unknown rank."""
  if tf.is_symbolic_tensor(value):
    spec = _static(tf.TensorSpec(value.shape, value.dtype))
    if spec is None or value.dtype in (tf.resource, tf.variant):
      return None
    return tf.zeros(spec.shape, spec.dtype)
  if value.dtype != tf.resource or (
      tf.raw_ops.VarIsInitializedOp(resource=value) and
      device_util.canonicalize(value.device) == device_util.canonicalize(device)):
    return value
  spec = None if variable is None else _static(tf.TensorSpec(variable.shape, variable.dtype))
  if spec is None:
    return None
  return _tf_bridge.plain_variable(tf.zeros(spec.shape, spec.dtype), device,
                                   "stand_in").handle

