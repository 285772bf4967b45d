"""What a `ClusterCoordinator` hands out: `RemoteValue`s and `PerWorkerValues`."""

import contextlib
import threading

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite.tf_classes import StandsFor

_WORKER_INDEX_ERROR = (
    "Cannot retrieve the worker index. `get_worker_idx_and_num_workers` should be called from "
    "within a tf.function being executed on a worker. This method should only be called from "
    "either a dataset_fn that is passed into `ClusterCoordinator.create_per_worker_dataset`, or a "
    "tf.function that is passed into `ClusterCoordinator.schedule`.")

_dispatch = threading.local()  # .worker_index: the worker this thread runs on


@contextlib.contextmanager
def running_on(worker_index):
  """Marks this thread as running functions on worker `worker_index`."""
  previous = getattr(_dispatch, "worker_index", None)
  _dispatch.worker_index = worker_index
  try:
    yield
  finally:
    _dispatch.worker_index = previous


def experimental_get_current_worker_index():
  """The index of the worker running the current scheduled function (int64).

  >>> experimental_get_current_worker_index()
  Traceback (most recent call last):
  ...
  RuntimeError: Cannot retrieve the worker index. `get_worker_idx_and_num_workers` should be called from within a tf.function being executed on a worker. This method should only be called from either a dataset_fn that is passed into `ClusterCoordinator.create_per_worker_dataset`, or a tf.function that is passed into `ClusterCoordinator.schedule`.
  """
  if not tf.inside_function():
    raise RuntimeError(_WORKER_INDEX_ERROR)

  def index_of_this_call():
    index = getattr(_dispatch, "worker_index", None)
    if index is None:
      raise RuntimeError(_WORKER_INDEX_ERROR)
    return index

  return _tf_bridge.call_time_value(index_of_this_call, tf.TensorSpec([], tf.int64))


class RemoteValue(tf.distribute.experimental.coordinator.RemoteValue):
  """The value of a function scheduled on a worker (TensorFlow's, for tf_keras)."""


class RemoteValueImpl(RemoteValue):
  """A `RemoteValue` that a worker's dispatch loop fills in.

  >>> value = RemoteValueImpl()
  >>> value._set(tf.constant([1, 2]))
  >>> value.fetch()
  array([1, 2], dtype=int32)
  """

  def __init__(self):
    self._ready = threading.Event()
    self._values = None
    self._kept_alive = None
    self._error = None

  def _set(self, values, keep_alive=None):
    self._values, self._error, self._kept_alive = values, None, keep_alive
    self._ready.set()

  def _set_error(self, error):
    self._values, self._error = None, error
    self._ready.set()

  def _wait(self):
    self._ready.wait()
    if self._error is not None:
      raise self._error

  def get(self):
    self._wait()
    return self._values

  def fetch(self):
    self._wait()
    return tf.nest.map_structure(lambda v: v.numpy() if hasattr(v, "numpy") else v, self._values)


class PerWorkerValues(_tf_bridge.CompositeTensor, StandsFor,
                      stands_for=tf.distribute.coordinator.PerWorkerValue):
  """One value per worker: a scheduled function gets its worker's value."""

  def __init__(self, values):
    self._values = tuple(values)

  _type_spec = property(lambda self: PerWorkerValuesSpec(self._values, type(self)))

  def _value_on(self, worker_index):
    value = self._values[worker_index]
    return value._current() if isinstance(value, _WorkerResource) else value  # pylint: disable=protected-access


class PerWorkerValuesSpec(tf.TypeSpec):
  """The type spec of `PerWorkerValues`: that of any one of its values."""

  def __init__(self, values, value_type=PerWorkerValues):
    self._values = values
    self._value_type = value_type

  value_type = property(lambda self: self._value_type)

  def _serialize(self):
    return (self.worker_spec(),)

  def worker_spec(self):
    """The type spec of the value a scheduled function receives."""
    for value in self._values:
      spec = value._spec if isinstance(value, _WorkerResource) else (  # pylint: disable=protected-access
          tf.type_spec_from_value(value))
      if spec is not None:
        return spec
    raise tf.errors.UnavailableError(None, None, "No worker holds this per-worker value.")

  def _unresolved(self, *unused):
    raise NotImplementedError("PerWorkerValues are resolved per worker before a call.")

  _component_specs = property(_unresolved)
  _to_components = _from_components = _unresolved


class _WorkerResource:
  """A worker's resource (dataset, iterator), remade by `create` on its return."""

  def __init__(self, create):
    self._create = create
    self._value = None
    self._spec = None

  def rebuild(self):
    self._value = self._create()
    self._spec = tf.type_spec_from_value(self._value)

  def _current(self):
    if self._value is None:
      raise tf.errors.UnavailableError(None, None, "This worker's resource is not built.")
    return self._value


class PerWorkerDataset:
  """A dataset on every worker. A bad `dataset_fn` fails at once (TF: at `iter()`)."""

  def __init__(self, coordinator, dataset_fn):
    self._coordinator = coordinator
    build = getattr(dataset_fn, "build", None)  # distribute_datasets_from_function's
    if build is None and not callable(dataset_fn):
      raise ValueError(
          f"create_per_worker_dataset takes a function returning a dataset, or "
          f"what `strategy.distribute_datasets_from_function` returns; got "
          f"the {type(dataset_fn).__name__} {dataset_fn!r}.")
    if build is None:
      python_function = getattr(dataset_fn, "python_function", dataset_fn)
      build = lambda: _as_dataset(python_function())  # pylint: disable=unnecessary-lambda-assignment
    self._dataset_fn = tf.function(build)
    self._datasets = PerWorkerValues(
        coordinator._per_worker_resource(i, self._dataset_fn)  # pylint: disable=protected-access
        for i in range(coordinator._num_workers))  # pylint: disable=protected-access

  def build(self):
    """Each worker's dataset, as `PerWorkerValues`."""
    return self._datasets

  def __iter__(self):
    make_iterator = tf.function(lambda dataset: iter(dataset))
    resources = [
        self._coordinator._per_worker_resource(  # pylint: disable=protected-access
            i, lambda i=i: make_iterator(self._datasets._value_on(i)))  # pylint: disable=protected-access
        for i in range(len(self._datasets._values))]  # pylint: disable=protected-access
    return PerWorkerIterator(resources)

  @property
  def element_spec(self):
    return self._datasets._type_spec.worker_spec().element_spec  # pylint: disable=protected-access


def _as_dataset(made):
  """What a `dataset_fn` returned, as a `tf.data.Dataset`."""
  build = getattr(made, "build", None)
  dataset = build() if build is not None else made
  if not isinstance(dataset, tf.data.Dataset):
    raise ValueError(
        f"The `dataset_fn` of create_per_worker_dataset must return a "
        f"tf.data.Dataset (or what `strategy.distribute_datasets_from_function` "
        f"returns); it returned the {type(made).__name__} {made!r}.")
  return dataset


class PerWorkerIterator(PerWorkerValues):
  """Each worker's iterator; `next()` only inside a scheduled function."""

  def __next__(self):
    raise NotImplementedError(
        "Iterating over an `AsyncDistributedIterator` is not supported right now.")

  next = __next__

  def get_next(self):
    return self.__next__()
