"""`ClusterCoordinator`: a dispatch thread per worker runs queued functions; a
lost worker requeues its function and rebuilds its resources once back."""

import collections.abc
import contextlib
import logging
import threading
import time
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import auto_shard
from tf_distribute_lite import cluster_runtime
from tf_distribute_lite import coordinator_values
from tf_distribute_lite.tf_classes import StandsFor

COORDINATOR_JOB = "chief"
COORDINATOR_CPU = f"/job:{COORDINATOR_JOB}/replica:0/task:0/device:CPU:0"
WORKER_RECOVERY_SECONDS = 600.0
_POLL_SECONDS = 0.25
_LOG = logging.getLogger("tensorflow")
_WORKER_ERROR_TYPES = (tf.errors.UnavailableError, tf.errors.AbortedError,
                       tf.errors.CancelledError, tf.errors.InvalidArgumentError,
                       tf.errors.NotFoundError, tf.errors.UnknownError,
                       tf.errors.DeadlineExceededError, tf.errors.FailedPreconditionError)


class ClusterCoordinator(StandsFor, stands_for=tf.distribute.coordinator.ClusterCoordinator):
  """Schedules `tf.function`s on the workers of a `ParameterServerStrategy`.

  >>> ClusterCoordinator(tf_distribute_lite.OneDeviceStrategy("/cpu:0"))
  Traceback (most recent call last):
  ...
  ValueError: Only `tf.distribute.experimental.ParameterServerStrategy` is supported to work with `tf.distribute.experimental.coordinator.ClusterCoordinator` currently; got a OneDeviceStrategy.
  """

  def __new__(cls, strategy):
    if not (isinstance(strategy, StandsFor) and
            isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)):
      raise ValueError(
          f"Only `tf.distribute.experimental.ParameterServerStrategy` is "
          f"supported to work with `tf.distribute.experimental.coordinator."
          f"ClusterCoordinator` currently; got a {type(strategy).__name__}.")
    if strategy._coordinator is None:  # pylint: disable=protected-access
      coordinator = super().__new__(cls)
      strategy._coordinator = coordinator._start(strategy)  # pylint: disable=protected-access
    return strategy._coordinator  # pylint: disable=protected-access

  def _start(self, strategy):
    self._strategy = strategy
    cluster_spec = strategy.extended._cluster_spec  # pylint: disable=protected-access
    self._num_workers = cluster_spec.num_tasks("worker")
    self._ps_addresses = [cluster_spec.task_address("ps", i)
                          for i in range(cluster_spec.num_tasks("ps"))]
    self._queue = _ClosureQueue(self._num_workers)
    self._cluster_lock = _ReadWriteLock()
    self._resources = [[] for _ in range(self._num_workers)]
    self._workers = [_Worker(self, i, cluster_spec.task_address("worker", i))
                     for i in range(self._num_workers)]
    for worker in self._workers:
      worker.start()
    return self

  strategy = property(lambda self: self._strategy, doc="The strategy whose cluster runs them.")

  def schedule(self, fn, args=None, kwargs=None):
    """Queues `fn(*args, **kwargs)` for the next idle worker; its `RemoteValue`."""
    if not isinstance(fn, (tf.types.experimental.PolymorphicFunction,
                           tf.types.experimental.ConcreteFunction)):
      raise TypeError(
          "`tf.distribute.experimental.coordinator.ClusterCoordinator.schedule` "
          "only accepts a `tf.function` or a concrete function.")
    if args is not None and not isinstance(args, (list, tuple)):
      raise TypeError(
          f"`args` of ClusterCoordinator.schedule must be a tuple or list of "
          f"the positional arguments of `fn`; got the {type(args).__name__} "
          f"{args!r}. For one argument x pass args=(x,).")
    if kwargs is not None and not isinstance(kwargs, collections.abc.Mapping):
      raise TypeError(
          f"`kwargs` of ClusterCoordinator.schedule must be a dict of keyword "
          f"arguments for `fn`; got the {type(kwargs).__name__} {kwargs!r}.")
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    if any(isinstance(x, coordinator_values.RemoteValue) for x in tf.nest.flatten((args, kwargs))):
      raise ValueError(
          "`tf.distribute.experimental.coordinator.RemoteValue` used as an "
          "input to scheduled function is not yet supported.")
    self._queue.done()  # raises an earlier function's error
    function = fn
    if isinstance(fn, tf.types.experimental.PolymorphicFunction):
      specs = tf.nest.map_structure(_spec_for_tracing, (args, kwargs))
      with self._strategy.scope():
        self._strategy.extended._being_scheduled = True  # pylint: disable=protected-access
        try:
          function = fn.get_concrete_function(*specs[0], **specs[1])
        finally:
          self._strategy.extended._being_scheduled = False  # pylint: disable=protected-access
    remote_value = coordinator_values.RemoteValueImpl()
    self._queue.put(_Closure(function, args, kwargs, remote_value))
    return remote_value

  def join(self):
    """Waits for every scheduled function; raises (once) a failed one's error."""
    self._queue.wait()

  def done(self):
    """Whether every scheduled function has run; raises as `join` does."""
    return self._queue.done()

  def fetch(self, val):
    """`val` with each `RemoteValue` in it replaced by its fetched value."""
    def fetch_one(value):
      if isinstance(value, coordinator_values.RemoteValue):
        return value.fetch()
      if isinstance(value, coordinator_values.PerWorkerValues):
        return tuple(fetch_one(v) for v in value._values)  # pylint: disable=protected-access
      return value
    return tf.nest.map_structure(fetch_one, val)

  def create_per_worker_dataset(self, dataset_fn):
    """A dataset on each worker, from `dataset_fn()` or a `tf.data.Dataset`."""
    if isinstance(dataset_fn, tf.data.Dataset):
      dataset_fn = auto_shard.dataset_remaker(dataset_fn)
    return coordinator_values.PerWorkerDataset(self, dataset_fn)

  def _per_worker_resource(self, index, create):
    """A resource `create()` makes on worker `index` now and on each return."""
    worker = self._workers[index]

    def create_there():
      with tf.device(worker.device), worker.executor_scope(), (
          coordinator_values.running_on(index)):
        return create()
    resource = coordinator_values._WorkerResource(create_there)  # pylint: disable=protected-access
    self._resources[index].append(resource)
    if worker.up:
      try:
        with self._cluster_lock.reading():
          resource.rebuild()
      except Exception as e:  # pylint: disable=broad-except
        if not (isinstance(e, tf.errors.OpError) and worker.failed(e)):
          self._resources[index].remove(resource)  # never made again
          raise
    return resource

  def _reconnect(self, worker):
    """Renews the cluster connection and rebuilds `worker`'s resources."""
    with self._cluster_lock.writing():
      self._strategy._reconnect()  # pylint: disable=protected-access
    with self._cluster_lock.reading():
      for resource in self._resources[worker.index]:
        resource.rebuild()




def _spec_for_tracing(value):
  if isinstance(value, coordinator_values.PerWorkerValues):
    return value._type_spec.worker_spec()  # pylint: disable=protected-access
  return value


class _Closure:
  """A scheduled call and its `RemoteValue`, held weakly (unheld: not copied)."""

  def __init__(self, function, args, kwargs, remote_value):
    self.function, self.args, self.kwargs = function, args, kwargs
    self._remote_value = weakref.ref(remote_value)

  def run_on(self, worker):
    def on_worker(value):
      if isinstance(value, coordinator_values.PerWorkerValues):
        return value._value_on(worker.index)  # pylint: disable=protected-access
      return value
    args, kwargs = tf.nest.map_structure(on_worker, (self.args, self.kwargs))
    with tf.device(worker.device), coordinator_values.running_on(worker.index):
      return self.function(*args, **kwargs)

  def copy_outputs(self, outputs):
    """`outputs` copied to the coordinator; None if the value is not held."""
    if self._remote_value() is None:
      return None
    with tf.device(COORDINATOR_CPU):
      return tf.nest.map_structure(
          lambda x: tf.identity(x) if isinstance(x, tf.Tensor) else x, outputs)

  def set_value(self, copies, outputs):
    """Sets the `RemoteValue`, if held, keeping the worker's `outputs` alive."""
    remote_value = self._remote_value()
    if remote_value is not None:
      remote_value._set(copies, keep_alive=outputs)  # pylint: disable=protected-access

  def set_error(self, error):
    remote_value = self._remote_value()
    if remote_value is not None:
      remote_value._set_error(error)  # pylint: disable=protected-access

  def cancel(self):
    self.set_error(tf.errors.CancelledError(
        None, None, "The corresponding function is cancelled. Please reschedule the function."))


class _Worker:
  """One worker and the thread that runs functions on it."""

  def __init__(self, coordinator, index, address):
    self.coordinator, self.index, self.address = coordinator, index, address
    self.device = f"/job:worker/replica:0/task:{index}"
    self.up = True
    self.executor_scope = _tf_bridge.worker_executor()
    self._thread = threading.Thread(target=self._loop, daemon=True,
                                    name=f"ps-coordinator-worker-{index}")

  def start(self):
    self._thread.start()

  def _loop(self):
    queue = self.coordinator._queue  # pylint: disable=protected-access
    while True:
      closure = queue.get()
      try:
        with self.coordinator._cluster_lock.reading():  # pylint: disable=protected-access
          with self.executor_scope():
            outputs = closure.run_on(self)
            copies = closure.copy_outputs(outputs)
      except Exception as e:  # pylint: disable=broad-except
        if not self.failed(e):
          queue.fail(closure, e)
          continue
        queue.put_back(closure)
        if not self._recover():
          queue.worker_lost(self.index, self.address)
          return
      else:
        queue.finish(closure, copies, outputs)
        # Released outside the executor scope, whose exit would wait for it.
        del outputs, copies

  def failed(self, error):
    """Whether `error` means this worker (not a ps) is lost; marks it down."""
    if not isinstance(error, _WORKER_ERROR_TYPES):
      return False
    message = str(error)
    if "/job:ps" in message or any(
        address in message for address in self.coordinator._ps_addresses):  # pylint: disable=protected-access
      return False  # a ps is lost: the error is the function's
    names_me = self.device in message or self.address in message
    lost = not cluster_runtime._listening(self.address, 1.0)  # pylint: disable=protected-access
    if lost or (names_me and isinstance(error, (
        tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError))):
      self.up = False
      _LOG.warning(
          "Worker %d at %s is lost (%s: %s); its function goes back on the queue.",
          self.index, self.address, type(error).__name__, message.splitlines()[0][:200])
      return True
    return False

  def _recover(self):
    """Reconnects once this worker's address answers; False on timeout."""
    deadline = time.monotonic() + WORKER_RECOVERY_SECONDS
    while time.monotonic() < deadline:
      if cluster_runtime._listening(self.address, 1.0):  # pylint: disable=protected-access
        try:
          self.coordinator._reconnect(self)  # pylint: disable=protected-access
          self.up = True
          _LOG.warning("Worker %d at %s is back.", self.index, self.address)
          return True
        except tf.errors.OpError as e:
          _LOG.info("Worker %d not reconnected yet: %s", self.index, str(e)[:200])
      time.sleep(_POLL_SECONDS)
    return False


class _ClosureQueue:
  """Scheduled functions not yet done, and the first error not raised yet."""

  def __init__(self, num_workers):
    self._condition = threading.Condition()
    self._num_workers = num_workers
    self._pending = collections.deque()
    self._running = 0
    self._error = None
    self._workers_lost = set()
    self._lost_error = None

  def put(self, closure):
    with self._condition:
      self._raise_error_locked()
      if self._lost_error is not None:
        raise self._lost_error
      self._pending.append(closure)
      self._condition.notify_all()

  def get(self):
    with self._condition:
      while not self._pending:
        self._condition.wait()
      self._running += 1
      return self._pending.popleft()

  def put_back(self, closure):
    with self._condition:
      self._running -= 1
      if self._error is not None:
        closure.cancel()
      else:
        self._pending.appendleft(closure)
      self._condition.notify_all()

  def finish(self, closure, copies, outputs):
    with self._condition:
      self._running -= 1
      closure.set_value(copies, outputs)
      self._condition.notify_all()

  def fail(self, closure, error):
    with self._condition:
      self._running -= 1
      closure.set_error(error)
      self._error = self._error or error
      while self._pending:
        self._pending.popleft().cancel()
      self._condition.notify_all()

  def worker_lost(self, index, address):
    """Gives worker `index` up; with all gone, every function fails."""
    with self._condition:
      self._workers_lost.add(index)
      if len(self._workers_lost) == self._num_workers:
        self._lost_error = tf.errors.UnavailableError(
            None, None, f"Every worker is lost: the last, worker {index} at "
            f"{address}, did not come back within {WORKER_RECOVERY_SECONDS:g} s.")
        self._error = self._error or self._lost_error
        while self._pending:
          self._pending.popleft().set_error(self._lost_error)
      self._condition.notify_all()

  def _raise_error_locked(self):
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def wait(self):
    with self._condition:
      while self._error is None and (self._pending or self._running):
        self._condition.wait()
      self._raise_error_locked()

  def done(self):
    with self._condition:
      self._raise_error_locked()
      return not self._pending and not self._running


class _ReadWriteLock:
  """Functions run under the read side; reconnecting takes the write side."""

  def __init__(self):
    self._condition = threading.Condition()
    self._readers = 0
    self._writers = 0  # waiting or writing: new readers wait for them
    self._writing = False

  @contextlib.contextmanager
  def reading(self):
    with self._condition:
      while self._writers:
        self._condition.wait()
      self._readers += 1
    try:
      yield
    finally:
      with self._condition:
        self._readers -= 1
        self._condition.notify_all()

  @contextlib.contextmanager
  def writing(self):
    with self._condition:
      self._writers += 1
      while self._writing or self._readers:
        self._condition.wait()
      self._writing = True
    try:
      yield
    finally:
      with self._condition:
        self._writing = False
        self._writers -= 1
        self._condition.notify_all()

