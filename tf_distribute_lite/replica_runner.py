"""Runs a function once per replica: in turn on the calling thread until
replica 0 first calls `merge_call`, then the others on threads of their own,
all advancing in lockstep, in replica order (so ops come out in order)."""

import collections
import contextlib
import re
import threading

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import contexts
from tf_distribute_lite import values as values_lib


class _Abort(BaseException):
  """Unwinds a paused replica thread when another replica failed."""


class _ThreadState:
  """What a replica thread must inherit from the thread that called `run`."""

  def __init__(self):
    self.eager = tf.executing_eagerly()
    self.graph = tf.compat.v1.get_default_graph()
    self.name_scope = "" if self.eager else self.graph.get_name_scope()
    self.variable_scope = tf.compat.v1.get_variable_scope()
    self.tensorflow_state = _tf_bridge.ThreadState()  # creators, summaries

  def enter(self, stack):
    """Enters this state on the current thread, using ExitStack `stack`."""
    if not self.eager:
      stack.enter_context(self.graph.as_default())
    stack.enter_context(self.tensorflow_state)
    if self.name_scope:
      stack.enter_context(tf.name_scope(self.name_scope + "/"))


class _ReplicaThread(threading.Thread):
  """Runs one replica; pauses at each `merge_call` until told to go on."""

  def __init__(self, runner, replica_id, state):
    super().__init__(name=f"replica_{replica_id}", daemon=True)
    self.runner = runner
    self.replica_id = replica_id
    self.state = state
    self._go = threading.Event()
    self._paused = threading.Event()
    self.merge_request = None
    self.merge_control_inputs = ()
    self.merge_result = None
    self.result = None
    self.error = None
    self.done = False

  def run(self):
    self._go.wait()
    self._go.clear()
    try:
      if not self.runner.aborting:
        with contextlib.ExitStack() as stack:
          self.state.enter(stack)
          self.result = self.runner.call_replica(self.replica_id)
      self.done = True
    except _Abort:
      self.done = True
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e
    finally:
      self._paused.set()

  def advance(self):
    """From the main thread: let this replica run to its next pause."""
    self._go.set()
    self._paused.wait()
    self._paused.clear()

  def wait_for_merge(self, request):
    """From this replica's thread: park at `merge_call` until resumed."""
    self.merge_request = request
    self.merge_control_inputs = _control_inputs_here()
    self._paused.set()
    self._go.wait()
    self._go.clear()
    if self.runner.aborting:
      raise _Abort()
    return self.merge_result


def _control_inputs_here():
  """The ops this thread's `tf.control_dependencies` make new ops wait for."""
  return () if tf.executing_eagerly() else tuple(
      tf.no_op(name="merge_call_control_inputs").control_inputs)


_NEW_GRAPH = "`merge_call` called while defining a new graph or a tf.function: "
_SAME_MERGE_CALLS = ("every replica must call merge_call (directly or through all_reduce, "
                     "variable updates, optimizers) the same number of times.")


def _in_graph(ops, graph):
  """`ops` of `graph`, without repeats."""
  return list({id(op): op for op in ops if op.graph is graph}.values())


def _canonical_name(name):
  """`name` (or "Variable") without the `_<n>` suffixes that make names unique."""
  return re.sub(r"_\d+(?=/|$)", "", name or "Variable")


def conversion_guard():
  """Keeps AutoGraph's thread state intact if replica code fails (tracing only)."""
  return contextlib.nullcontext() if tf.executing_eagerly() else _tf_bridge.TraceMapperGuard()


def _input_barrier(replica_inputs):
  """In a `tf.function`, `[op]` waiting for every replica's input (so that the
  end of data updates no variable half-way)."""
  if not _tf_bridge.is_function_graph(tf.compat.v1.get_default_graph()):
    return []
  tensors = _tensors(replica_inputs)
  return [tf.group(tensors, name="replica_inputs")] if tensors else []


def _tensors(value):
  """The tensors in the nest `value`, composites' components too."""
  return [t for t in tf.nest.flatten(value, expand_composites=True) if isinstance(t, tf.Tensor)]


def _symbolic_tensors(value):
  return [t for t in _tensors(value) if tf.is_symbolic_tensor(t)]


def _branch_condition(branch):
  """The condition (or index) of the `tf.cond` (`tf.switch_case`) `branch` is of."""
  for op in branch.outer_graph.get_operations():
    if op.type in ("If", "StatelessIf"):
      names = [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
    elif op.type in ("Case", "StatelessCase"):
      names = [function.name for function in op.get_attr("branches")]
    else:
      continue
    if branch.name in names:
      return op.inputs[0]
  return None


class ReplicaRunner:
  """Calls `fn` per replica with its `(args, kwargs)` from `replica_inputs`,
  on its device, in `make_replica_context(replica_id, runner)`."""

  def __init__(self, strategy, fn, replica_inputs, devices, make_replica_context):
    self._strategy = strategy
    self._fn = fn
    self._inputs = replica_inputs
    self._devices = devices
    self._make_replica_context = make_replica_context
    self._state = None
    self._threads = None
    self._main_thread = threading.current_thread()
    self._created_variables = collections.defaultdict(list)  # by canonical name
    self._taken_variables = [collections.Counter() for _ in replica_inputs]
    self._running = threading.local()
    self._input_barrier = []
    self._merge_calls = 0
    self._merges_in_branches = []  # per such merge_call, each replica's graph
    self._shared = set()  # refs of the tensors merges handed to replicas
    self._replica_local = set()  # refs of tensors each replica has its own of
    self._named_errors = []  # errors that need no note naming a replica
    self.aborting = False
    self.num_replicas = len(replica_inputs)

  def run(self):
    with conversion_guard(), _tf_bridge.VariableCreatorScope(self._share_variable):
      self._state = _ThreadState()
      self._input_barrier = _input_barrier(self._inputs)
      with self._aborting_on_error():
        first = self.call_replica(0)
      if self._threads is None:
        return [first] + [self.call_replica(i) for i in range(1, self.num_replicas)]
    results = [first]
    for thread in self._threads:
      try:
        self._advance(thread)
      except Exception as e:
        # A merge's result used in a branch of the replica's own: say why.
        self._check_branch_conditions(complete=False, cause=e)
        raise
      if not thread.done:
        self._abort()
        raise RuntimeError(f"Replica {thread.replica_id} called merge_call more often than "
                           f"replica 0 ({self._merge_calls} times): {_SAME_MERGE_CALLS}")
      results.append(thread.result)
    self._check_branch_conditions()
    return results

  def call_replica(self, replica_id):
    args, kwargs = self._inputs[replica_id]
    replica_context = self._make_replica_context(replica_id, self)
    self._running.replica_id = replica_id
    try:
      with replica_context, tf.device(self._devices[replica_id]), \
          tf.control_dependencies(self._input_barrier):
        if replica_id == 0:
          return self._fn(*args, **kwargs)
        # As in TensorFlow: replica 0's `get_variable`s, a name scope per replica.
        name_scope = contextlib.nullcontext()
        if not tf.executing_eagerly():
          outer = tf.compat.v1.get_default_graph().get_name_scope()
          name_scope = tf.name_scope(f"{outer}/replica_{replica_id}/".lstrip("/"))
        with tf.compat.v1.variable_scope(self._state.variable_scope, reuse=True,
                                         auxiliary_name_scope=False), name_scope:
          return self._fn(*args, **kwargs)
    except Exception as error:
      # Noted once (a thread's error passes through replica 0 too).
      if not any(error is e for e in self._named_errors):
        self._named_errors.append(error)
        _tf_bridge.add_error_note(error, f"(raised by replica {replica_id} of {self.num_replicas})")
      raise
    finally:
      self._running.replica_id = None

  def _error(self, message):
    """A RuntimeError of the runner's own, which names its replicas itself."""
    error = RuntimeError(message)
    self._named_errors.append(error)
    return error

  def _share_variable(self, next_creator, **kwargs):
    """Replica 0 creates variables; the others get replica 0's, by canonical name."""
    replica_id = getattr(self._running, "replica_id", None)
    name = _canonical_name(kwargs.get("name"))
    if not replica_id:
      variable = next_creator(**kwargs)
      if replica_id == 0:
        self._created_variables[name].append(variable)
      return variable
    taken = self._taken_variables[replica_id][name]
    if taken >= len(self._created_variables[name]):
      raise self._error(
          f"Tried to create variable {kwargs.get('name')} with mismatching name on device "
          f"{replica_id}: replica {replica_id} created a variable that replica 0 did not; every "
          "replica must create the same variables, with the same names.")
    self._taken_variables[replica_id][name] = taken + 1
    return self._created_variables[name][taken]

  def merge_call(self, replica_id, merge_fn, args, kwargs):
    """Pauses replica `replica_id` until all replicas call merge; runs it."""
    graph = tf.compat.v1.get_default_graph()
    self._check_where_replicas_meet(replica_id, graph)
    if threading.current_thread() is not self._main_thread:
      return self._threads[replica_id - 1].wait_for_merge((args, kwargs, graph))
    if replica_id != 0:
      raise self._error(f"Replica {replica_id} called merge_call but replica 0 did not: "
                         f"{_SAME_MERGE_CALLS}")
    self._merge_calls += 1
    if self._threads is None:
      if not self._state.eager:
        # Each thread gets its own device and control stacks, from this one's.
        self._state.graph.switch_to_thread_local()
      self._threads = [_ReplicaThread(self, i, self._state) for i in range(1, self.num_replicas)]
      for thread in self._threads:
        thread.start()
    requests = [(args, kwargs, graph)]
    control_inputs = []
    for thread in self._threads:
      self._advance(thread)
      if thread.done:
        self._abort()
        raise self._error(
            f"Replica 0 called merge_call (call {self._merge_calls}) but "
            f"replica {thread.replica_id} returned without calling it: every "
            f"replica must call merge_call the same number of times.")
      requests.append(thread.merge_request)
      control_inputs.extend(thread.merge_control_inputs)
    self._check_readable(requests, graph)
    all_args, all_kwargs, graphs = zip(*requests)
    merged_args = values_lib.regroup(list(all_args))
    merged_kwargs = values_lib.regroup(list(all_kwargs))
    # After what every replica's `tf.control_dependencies` wait for, as in TF.
    with self._aborting_on_error(named=True), \
        contexts.Entered(contexts.ContextEntry.cross_replica(self._strategy)), \
        tf.device(None), tf.control_dependencies(_in_graph(control_inputs, graph)):
      result = merge_fn(self._strategy, *merged_args, **merged_kwargs)
    results = [values_lib.select_replica(i, result) for i in range(self.num_replicas)]
    if not self._state.eager:
      self._shared.update(t.ref() for t in _symbolic_tensors(results))
      if any(g is not self._state.graph for g in graphs):
        self._merges_in_branches.append((self._merge_calls, graphs))
    for thread in self._threads:
      thread.merge_result = results[thread.replica_id]
    return results[0]

  def _check_where_replicas_meet(self, replica_id, graph):
    """Raises TF's RuntimeError for a `merge_call` in a nested function or loop."""
    while graph is not self._state.graph and _tf_bridge.is_function_graph(graph):
      kind = _tf_bridge.control_flow_kind(graph)
      if kind == "while":
        inside = (f"{graph.name}, the body of a tf.while_loop (a Python loop "
                  f"on a tensor, in a tf.function)")
        fix = "move the loop out of the function passed to strategy.run"
      elif kind is None:
        inside = f"{graph.name}, a tf.function that the function passed to strategy.run calls"
        fix = ("remove that tf.function, or wrap the whole strategy.run call "
               "(or the function passed to it) in a tf.function instead")
      else:
        graph = graph.outer_graph
        continue
      raise self._error(
          f"{_NEW_GRAPH}replica {replica_id} reaches a synchronization point (such as all_reduce "
          f"or optimizer.apply_gradients) inside {inside}, which each replica traces on its own, "
          f"so the replicas cannot meet there. Move the synchronization out of it, or {fix}.")

  def _check_readable(self, requests, graph):
    """Raises TF's RuntimeError for a tensor of a replica's own `tf.cond` branch."""
    if self._state.eager:
      return
    readable = [graph]
    while getattr(readable[-1], "outer_graph", None) is not None:
      readable.append(readable[-1].outer_graph)
    for replica_id, request in enumerate(requests):
      for tensor in _symbolic_tensors(request):
        if not any(tensor.graph is g for g in readable):
          self._abort()
          raise self._error(
              f"{_NEW_GRAPH}replica {replica_id} passes it {tensor.name} of graph "
              f"{tensor.graph.name}, a tf.cond branch of its own, which other replicas cannot "
              "read. Move the synchronization (all_reduce, optimizer.apply_gradients) out of the "
              "branch, or the control flow out of the function passed to strategy.run.")

  def _check_branch_conditions(self, complete=True, cause=None):
    """Raises TF's RuntimeError for a `merge_call` in a replica-dependent branch
    (unless `complete`: only if the condition is built)."""
    for call, graphs in self._merges_in_branches:
      for replica_id, graph in enumerate(graphs):
        while graph is not self._state.graph:
          condition = _branch_condition(graph)
          if (condition is None and complete) or (
              condition is not None and self._depends_on_the_replica(condition, replica_id)):
            raise RuntimeError(
                f"{_NEW_GRAPH}replica {replica_id} calls merge_call (call {call}, directly "
                f"or through all_reduce, variable updates, optimizers) inside {graph.name}, "
                f"a branch of a tf.cond whose condition depends on the replica (its replica "
                f"id, its own input or a sync-on-read variable), so only some replicas may "
                f"take it: every replica must call merge_call the same number of times. "
                f"Move the synchronization out of the branch (a Python `if` on a tensor, "
                f"in a tf.function, is a tf.cond).") from cause
          graph = graph.outer_graph

  def _depends_on_the_replica(self, tensor, replica_id):
    """Whether `tensor` may differ between replicas (not through a merge)."""
    others = {t.ref() for i, inputs in enumerate(self._inputs) if i != replica_id
              for t in _tensors(inputs)}
    own = {t.ref() for t in _tensors(self._inputs[replica_id])} - others
    seen, pending, captured = set(), [tensor], {}
    while pending:
      tensor = pending.pop()
      key = tensor.ref()
      if key in seen or key in self._shared:
        continue
      seen.add(key)
      if key in own or key in self._replica_local:
        return True
      if not tf.is_symbolic_tensor(tensor):
        continue
      op = tensor.op
      if op.type == "Const" and op.name.rsplit("/", 1)[-1].startswith("replica_id_in_sync_group"):
        return True
      if not op.inputs:  # a placeholder or constant that stands for a captured value
        if op.graph not in captured:
          captured[op.graph] = {internal.ref(): external for external, internal
                                in getattr(op.graph, "captures", ())}
        if key in captured[op.graph]:
          pending.append(captured[op.graph][key])
      # A custom gradient's IdentityN passes each input to its own output.
      pending.extend([op.inputs[tensor.value_index]] if op.type == "IdentityN" else op.inputs)
    return False

  def note_replica_local(self, tensor):
    self._replica_local.add(tensor.ref())

  @contextlib.contextmanager
  def _aborting_on_error(self, named=False):
    """Aborts the replicas on an error; a `named` error gets no replica note."""
    try:
      yield
    except BaseException as error:
      if named:
        self._named_errors.append(error)
      self._abort()
      raise

  def _advance(self, thread):
    thread.advance()
    if thread.error is not None:
      self._abort()
      raise thread.error

  def _abort(self):
    """Unwinds every replica thread that is still paused."""
    if not self._threads or self.aborting:
      return
    self.aborting = True
    for thread in self._threads:
      if thread.is_alive() and not thread.done and thread.error is None:
        thread.advance()
