"""What an emulated TPU checks of a step: that XLA compiles it, as a TPU
compiles every step with XLA.

The check traces the function given to `strategy.run` once more, for replica
0 alone, in a `tf.function(jit_compile=True)`, and lowers it to XLA's HLO
without running it (unknown dimensions of the inputs as 1, as a TPU pads
dynamic batches to a static shape). Inside that trace the cross-replica
operations are stand-ins of the same shapes (a CPU cannot run TPU
collectives), and variables are replica 0's components. So an op XLA has no
kernel for, or a shape XLA needs to know at compile time and cannot, fails
on the emulation as it would on a TPU: `tf.errors.InvalidArgumentError` with
XLA's message. TF 1.x graphs (run by a Session) are not checked: XLA
compiles functions, which such graphs cannot capture their variables into.
"""

import contextlib

import tensorflow as tf

from tf_distribute_lite import tpu_replication
from tf_distribute_lite import values as values_lib


class _CreatesVariables(Exception):
  """The step creates variables: nothing to check until they exist."""


class XlaCheckReplicaContext(tpu_replication.TPUReplicaContext):
  """Replica 0 of the compile check: collectives keep their input's shape."""

  @property
  def replica_id_in_sync_group(self):
    return tf.constant(0, tf.int32)

  def all_reduce(self, reduce_op, value, options=None):
    del reduce_op, options
    return tf.nest.map_structure(tf.identity, value)


def check_compiles(strategy, fn, args, kwargs):
  """Raises `tf.errors.InvalidArgumentError` if XLA cannot compile
  `fn(*args, **kwargs)` as replica 0 runs it.

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
  extended = strategy.extended
  inputs = values_lib.select_replica(0, (tuple(args), dict(kwargs)))
  leaves = tf.nest.flatten(inputs)
  positions = [i for i, leaf in enumerate(leaves) if tf.is_tensor(leaf)]
  specs = [_static(tf.type_spec_from_value(leaves[i])) for i in positions]
  if None in specs:
    return  # an input of unknown rank or structure: XLA would need its shape

  def replica_step(*tensors):
    flat = list(leaves)
    for position, tensor in zip(positions, tensors):
      flat[position] = tensor
    replica_args, replica_kwargs = tf.nest.pack_sequence_as(inputs, flat)
    with tf.variable_creator_scope(_refuse_variables), XlaCheckReplicaContext(strategy):
      result = fn(*replica_args, **replica_kwargs)
    return [t for t in tf.nest.flatten(result, expand_composites=True) if tf.is_tensor(t)]

  with _mode(extended, "xla_check"):
    try:
      tf.function(replica_step, jit_compile=True).experimental_get_compiler_ir(*specs)(
          stage="hlo")
    except _CreatesVariables:
      return
    except (ValueError, tf.errors.OpError) as e:
      message = str(e).split("Failed getting HLO text: ", 1)[-1]
      raise tf.errors.InvalidArgumentError(
          None, None,
          f"XLA cannot compile the step, as a TPU must: {message}") from None


def _static(spec):
  """`spec` with its unknown dimensions as 1: a TPU pads a dynamic batch to
  a static shape, so any size shows whether the step compiles. None where
  the rank is unknown or the spec is not a dense tensor's."""
  if isinstance(spec, tf.TensorSpec) and spec.shape.rank is not None:
    return tf.TensorSpec([1 if d is None else d for d in spec.shape.as_list()], spec.dtype)
  if isinstance(spec, tf.TensorSpec):
    return None
  return spec if spec.shape.is_fully_defined() else None


@contextlib.contextmanager
def _mode(extended, mode):
  extended._tpu_mode = mode  # pylint: disable=protected-access
  try:
    yield
  finally:
    extended._tpu_mode = None  # pylint: disable=protected-access


def _refuse_variables(next_creator, **kwargs):
  del next_creator, kwargs
  raise _CreatesVariables()
