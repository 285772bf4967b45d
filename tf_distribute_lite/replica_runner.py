"""Runs a function once per replica, pausing every replica at `merge_call`.

Replicas run one after another on the calling thread, each under its device
and in its `ReplicaContext`. Only `merge_call` needs more: it must hold every
replica at the same point until all have arrived, then run `merge_fn` once
with their arguments grouped. When replica 0 first calls `merge_call`, the
other replicas start on threads of their own, each running until it reaches
`merge_call` too; from then on the replicas advance in lockstep, always in
replica order, so the ops they build come out in a deterministic order.
A function that never calls `merge_call` never starts a thread.
"""

import contextlib
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
    self.variable_scope = None if self.eager else tf.compat.v1.get_variable_scope()
    self.creators = list(_tf_bridge.variable_creator_stack(self.graph))
    summaries = _tf_bridge.summary_state()
    self.summaries = (summaries.writer, summaries.step, summaries.is_recording)

  def enter(self, stack):
    """Enters this state on the current thread, using `stack` (ExitStack)."""
    if not self.eager:
      stack.enter_context(self.graph.as_default())
    # Eagerly each thread has a default graph of its own: the creators go
    # onto this thread's.
    _tf_bridge.set_variable_creator_stack(
        tf.compat.v1.get_default_graph(), list(self.creators))
    summaries = _tf_bridge.summary_state()
    summaries.writer, summaries.step, summaries.is_recording = self.summaries
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
    if self.runner.aborting:
      self.done = True
      self._paused.set()
      return
    try:
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
  """The ops the current `tf.control_dependencies` blocks of this thread make
  new ops wait for (read off a no-op made here); none eagerly."""
  if tf.executing_eagerly():
    return ()
  return tuple(tf.no_op(name="merge_call_control_inputs").control_inputs)


def conversion_guard():
  """Keeps AutoGraph's per-thread state intact if replica code fails on the
  caller's thread; only tracing converts code, so eagerly it does nothing."""
  if tf.executing_eagerly():
    return contextlib.nullcontext()
  return _tf_bridge.TraceMapperGuard()


def _input_barrier(replica_inputs):
  """In a `tf.function`, `[op]` where `op` waits for every replica's input
  tensors.

  Every op of the step depends on it, so none starts before the whole step's
  input is there, as with a function call. Otherwise a step whose input
  fails at run time (the end of a dataset) could apply some of its updates:
  some components of a variable updated and others not. A TF 1.x graph has
  none: there a `Session` runs only what is fetched, and fetching a value
  (a metric's result, say) must not pull the next input.
  """
  if not isinstance(tf.compat.v1.get_default_graph(), tf.__internal__.FuncGraph):
    return []
  # Only tensors: variables (Keras ones too, which `tf.group` refuses) are
  # never input that fails at run time.
  tensors = [t for t in tf.nest.flatten(replica_inputs, expand_composites=True)
             if isinstance(t, tf.Tensor)]
  return [tf.group(tensors, name="replica_inputs")] if tensors else []


class ReplicaRunner:
  """Calls `fn` once per replica and returns the per-replica results.

  Args:
    strategy: the strategy the replicas belong to.
    fn: the function to run.
    replica_inputs: per replica, the `(args, kwargs)` it is called with.
    devices: per replica, its device.
    make_replica_context: `(replica_id, runner) -> ReplicaContext`.
  """

  def __init__(self, strategy, fn, replica_inputs, devices, make_replica_context):
    self._strategy = strategy
    self._fn = fn
    self._inputs = replica_inputs
    self._devices = devices
    self._make_replica_context = make_replica_context
    self._state = None
    self._threads = None
    self._main_thread = threading.current_thread()
    self._created_variables = []
    self._taken_variables = [0] * len(replica_inputs)
    self._running = threading.local()
    self._input_barrier = []
    self._merge_calls = 0
    self.aborting = False

  @property
  def num_replicas(self):
    return len(self._inputs)

  def run(self):
    with conversion_guard(), _tf_bridge.VariableCreatorScope(self._share_variable):
      self._state = _ThreadState()
      self._input_barrier = _input_barrier(self._inputs)
      try:
        first = self.call_replica(0)
      except BaseException:
        self._abort()
        raise
      if self._threads is None:
        return [first] + [self.call_replica(i) for i in range(1, self.num_replicas)]
    results = [first]
    for thread in self._threads:
      self._advance(thread)
      if not thread.done:
        self._abort()
        raise RuntimeError(
            f"Replica {thread.replica_id} called merge_call more often than "
            f"replica 0 ({self._merge_calls} times): every replica must call "
            f"merge_call (directly or through all_reduce, variable updates, "
            f"optimizers) the same number of times.")
      results.append(thread.result)
    return results

  def call_replica(self, replica_id):
    """Runs `fn` as replica `replica_id` on the current thread."""
    args, kwargs = self._inputs[replica_id]
    replica_context = self._make_replica_context(replica_id, self)
    self._running.replica_id = replica_id
    try:
      with replica_context, tf.device(self._devices[replica_id]), \
          tf.control_dependencies(self._input_barrier):
        if replica_id > 0 and not tf.executing_eagerly():
          # Every `run` in a graph shares one scope per replica, as in
          # TensorFlow: the trailing "/" re-enters it rather than adding
          # "replica_1_1". `tf.compat.v1.get_variable` in replicas after the
          # first reuses the first's variables, in the caller's variable scope.
          outer = tf.compat.v1.get_default_graph().get_name_scope()
          with tf.compat.v1.variable_scope(self._state.variable_scope, reuse=True,
                                           auxiliary_name_scope=False), \
              tf.name_scope(f"{outer}/replica_{replica_id}/".lstrip("/")):
            return self._fn(*args, **kwargs)
        return self._fn(*args, **kwargs)
    finally:
      self._running.replica_id = None

  def _share_variable(self, next_creator, **kwargs):
    """Replica 0 creates variables; the others get the same ones, in order."""
    replica_id = getattr(self._running, "replica_id", None)
    if not replica_id:
      variable = next_creator(**kwargs)
      if replica_id == 0:
        self._created_variables.append(variable)
      return variable
    taken = self._taken_variables[replica_id]
    if taken >= len(self._created_variables):
      raise RuntimeError(
          f"Replica {replica_id} created variable {kwargs.get('name')!r} "
          f"that replica 0 did not create: every replica must create the "
          f"same variables in the same order.")
    self._taken_variables[replica_id] = taken + 1
    return self._created_variables[taken]

  def merge_call(self, replica_id, merge_fn, args, kwargs):
    """Pauses replica `replica_id` until all replicas call merge; runs it."""
    self._check_not_in_a_nested_function()
    if threading.current_thread() is not self._main_thread:
      return self._threads[replica_id - 1].wait_for_merge((args, kwargs))
    if replica_id != 0:
      raise RuntimeError(
          f"Replica {replica_id} called merge_call but replica 0 did not: "
          f"every replica must call merge_call (directly or through "
          f"all_reduce, variable updates, optimizers) the same number of "
          f"times.")
    self._merge_calls += 1
    if self._threads is None:
      if not self._state.eager:
        # Each replica thread gets its own device, colocation and control
        # dependency stacks, starting from this thread's.
        self._state.graph.switch_to_thread_local()
      self._threads = [_ReplicaThread(self, i, self._state)
                       for i in range(1, self.num_replicas)]
      for thread in self._threads:
        thread.start()
    requests = [(args, kwargs)]
    control_inputs = []
    for thread in self._threads:
      self._advance(thread)
      if thread.done:
        self._abort()
        raise RuntimeError(
            f"Replica 0 called merge_call (call {self._merge_calls}) but "
            f"replica {thread.replica_id} returned without calling it: every "
            f"replica must call merge_call the same number of times.")
      requests.append(thread.merge_request)
      control_inputs.extend(thread.merge_control_inputs)
    self._check_readable(requests)
    merged_args = values_lib.regroup([r[0] for r in requests])
    merged_kwargs = values_lib.regroup([r[1] for r in requests])
    try:
      # `merge_fn` runs after what every replica's `tf.control_dependencies`
      # blocks wait for, not only replica 0's (this thread's), as in
      # TensorFlow: a tf_keras metric's result after each replica's update.
      with contexts.Entered(contexts.ContextEntry.cross_replica(self._strategy)), \
          tf.device(None), tf.control_dependencies(self._in_this_graph(control_inputs)):
        result = merge_fn(self._strategy, *merged_args, **merged_kwargs)
    except BaseException:
      self._abort()
      raise
    for thread in self._threads:
      thread.merge_result = values_lib.select_replica(thread.replica_id, result)
    return values_lib.select_replica(0, result)

  @staticmethod
  def _in_this_graph(ops):
    """`ops` without repeats, less those of other graphs (another replica's
    control-flow branch, whose ops this graph cannot wait for)."""
    graph = tf.compat.v1.get_default_graph()
    unique = {id(op): op for op in ops if op.graph is graph}
    return list(unique.values())

  def _check_not_in_a_nested_function(self):
    """Raises TensorFlow's RuntimeError for a `merge_call` (an all-reduce, an
    optimizer's update) inside a `tf.function` that the replica function
    calls: each replica traces that function on its own, so the replicas
    cannot meet there. (A `tf.cond` or `tf.while_loop` branch may hold one.)"""
    graph = tf.compat.v1.get_default_graph()
    while graph is not self._state.graph and isinstance(graph, tf.__internal__.FuncGraph):
      if not _tf_bridge.is_control_flow_graph(graph):
        raise RuntimeError(
            f"`merge_call` called while defining a new graph or a "
            f"tf.function: {graph.name}, a tf.function that the function "
            f"passed to strategy.run calls, reaches a synchronization point "
            f"(such as all_reduce or optimizer.apply_gradients), where the "
            f"replicas, each tracing it on its own, cannot meet. Remove that "
            f"tf.function, or wrap the whole strategy.run call (or the "
            f"function passed to it) in a tf.function instead.")
      graph = graph.outer_graph

  def _check_readable(self, requests):
    """Raises TensorFlow's RuntimeError where a replica hands `merge_call`
    a tensor of its own control-flow branch or nested function, which the
    merge, in replica 0's graph, cannot read."""
    if self._state.eager:
      return
    readable = []
    outer = tf.compat.v1.get_default_graph()
    while outer is not None:
      readable.append(outer)
      outer = getattr(outer, "outer_graph", None)
    for replica_id, request in enumerate(requests):
      for tensor in tf.nest.flatten(request, expand_composites=True):
        if not isinstance(tensor, tf.Tensor):
          continue
        graph = getattr(tensor, "graph", None)  # None for eager tensors
        if graph is not None and not any(graph is g for g in readable):
          self._abort()
          raise RuntimeError(
              f"`merge_call` called while defining a new graph or a "
              f"tf.function: replica {replica_id} passes it {tensor.name} of "
              f"graph {graph.name}, a control-flow branch or nested "
              f"function of its own, which other replicas cannot read. Move "
              f"the synchronization (all_reduce, optimizer.apply_gradients) "
              f"out of the branch or nested tf.function, or the control flow "
              f"out of the function passed to strategy.run.")

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
