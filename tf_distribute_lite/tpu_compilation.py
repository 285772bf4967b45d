"""What an emulated TPU checks of a traced step: that XLA can compile every
op of it, as a TPU compiles the whole step with XLA. A step that uses an op
XLA has no kernel for fails on the emulation as it would on a TPU, with an
error that names the op.
"""

import tensorflow as tf

from tf_distribute_lite import _tf_bridge

# Graph plumbing that XLA compiles away rather than through a kernel.
_STRUCTURAL = frozenset({"Placeholder", "_Arg", "_Retval", "NoOp"})


def check_compilable(graph, ops):
  """Raises `tf.errors.InvalidArgumentError` naming the ops in `ops` (and in
  the functions they call) that XLA cannot compile.

  >>> with tf.Graph().as_default() as graph:
  ...   ok = tf.constant([1.0]) * 2.0
  ...   bad = tf.strings.format("{}", ok)
  >>> check_compilable(graph, [ok.op])
  >>> check_compilable(graph, [bad.op])
  Traceback (most recent call last):
  ...
  tensorflow.python.framework.errors_impl.InvalidArgumentError: ...StringFormat...
  """
  library = None
  unsupported = {}
  pending = [(op.name, op.type, op.node_def) for op in ops]
  seen_functions = set()
  while pending:
    name, op_type, node_def = pending.pop()
    if op_type not in _STRUCTURAL and not _tf_bridge.has_xla_kernel(op_type):
      unsupported.setdefault(op_type, name)
    for function_name in _called_functions(node_def):
      if function_name in seen_functions:
        continue
      seen_functions.add(function_name)
      if library is None:
        library = {f.signature.name: f for f in graph.as_graph_def().library.function}
      if function_name in library:
        pending.extend((n.name, n.op, n) for n in library[function_name].node_def)
  if unsupported:
    listed = ", ".join(f"{op_type} (op {name!r})" for op_type, name in sorted(unsupported.items()))
    raise tf.errors.InvalidArgumentError(
        None, None,
        f"Detected unsupported operations when trying to compile the step "
        f"with XLA, as a TPU does: {listed} have no XLA kernel. Move them out "
        f"of the function given to strategy.run (into the input pipeline or "
        f"the host code), or replace them with ops XLA supports.")


def _called_functions(node_def):
  """Names of the functions a node calls (function-valued attributes)."""
  names = []
  for value in node_def.attr.values():
    if value.HasField("func"):
      names.append(value.func.name)
    names.extend(f.name for f in value.list.func)
  return names
