"""Distributed datasets and iterators: every step, one batch per replica.

A `DistributedDataset` is host-side `tf.data` pipelines plus a `_Layout` of
the replicas they feed (a global batch cut per replica, or a pipeline per
worker or replica); its iterators copy the parts to the replicas' devices
as `PerReplica` values. Both are composite tensors (`tf.function` arguments).
"""

import collections
import functools
import itertools

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite import auto_shard
from tf_distribute_lite import contexts
from tf_distribute_lite import deprecation
from tf_distribute_lite import device_util
from tf_distribute_lite import input_context as input_context_lib
from tf_distribute_lite import values as values_lib

Optional = tf.experimental.Optional

# devices: each replica's; homes: each pipeline's device; split: an element
# is a global batch to cut across the replicas (else one replica's); feeds:
# the pipeline of each replica (None: consecutive replicas share each one);
# fetch_to_device: copy each part to its replica's device; workers: the key
# of the `WorkerSync` of several workers, or None; partial_steps: `get_next`
# gives a last, partial step of per-replica pipelines; strategy: the `id` of
# the strategy whose method made the dataset (`owned_by`), or None.
_Layout = collections.namedtuple(
    "_Layout", ["devices", "homes", "split", "fetch_to_device", "workers",
                "partial_steps", "strategy", "feeds"],
    defaults=[None, True, None, None])


def input_workers(devices, host):
  """The input pipelines' devices and the pipeline feeding each replica: one
  on `host`; for replicas on several tasks (the hosts of a TPU pod, in one
  program), one on each task's CPU:0, feeding that task's replicas.

  >>> input_workers(["/job:w/replica:0/task:1/device:CPU:0",
  ...                "/job:w/replica:0/task:0/device:CPU:1"], "CPU:0")
  (('/job:w/replica:0/task:1/device:CPU:0', '/job:w/replica:0/task:0/device:CPU:0'), (0, 1))
  """
  tasks = [device.rpartition("/device:")[0] for device in devices]
  hosts = list(dict.fromkeys(tasks))
  if len(hosts) < 2:
    return (host,), None
  return tuple(task + "/device:CPU:0" for task in hosts), tuple(map(hosts.index, tasks))


def owned_by(distributed, strategy):
  """`distributed`, marked as `strategy`'s input: as in TensorFlow, its
  iterators' `get_next` raises RuntimeError under another strategy."""
  if isinstance(distributed, DistributedDataset):
    distributed._layout = distributed._layout._replace(strategy=id(strategy))  # pylint: disable=protected-access
  return distributed


def _check_strategy(layout):
  if layout.strategy is not None and contexts.has_strategy() and (
      id(contexts.top().strategy) != layout.strategy):
    raise RuntimeError(
        f"Mixing different tf.distribute.Strategy objects: "
        f"{contexts.top().strategy} is not the strategy that distributed this "
        f"input. Iterate it in that strategy's scope (or outside every scope), "
        f"or distribute the dataset with the strategy in use.")


class WorkerSync:
  """What several workers' iterators agree on each step: whether any worker
  still has data (`any_worker_has` maps this worker's bool tensor to the
  cluster's); while one has, the others run on empty batches, so no collective
  waits for ever. Type specs hold its `key`; it lives as long as the process."""

  _by_key = {}
  _keys = itertools.count()

  def __init__(self, any_worker_has):
    self.any_worker_has = any_worker_has
    self.key = next(WorkerSync._keys)
    WorkerSync._by_key[self.key] = self

  @staticmethod
  def of(key):
    """The `WorkerSync` with `key`."""
    return WorkerSync._by_key[key]


def check_dataset(dataset):
  """Raises `TypeError` unless `dataset` is a `tf.data.Dataset` (TensorFlow
  2.21 fails on its missing `_variant_tensor`)."""
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(
        f"`dataset` must be a tf.data.Dataset; got {dataset!r} of type "
        f"{type(dataset).__name__}. To distribute values that are not a "
        f"dataset, use `experimental_distribute_values_from_function`.")


def distribute_dataset(dataset, devices, host, options=None, input_context=None, workers=None):
  """A `DistributedDataset` cutting each global batch of `dataset` across
  `devices` as TensorFlow does: each replica in turn gets `ceil(b / replicas)`
  elements or what is left (sparse too, where TensorFlow 2.21 fails on empty
  shares). With a pipeline per worker in `input_context` (synced by `workers`),
  this pipeline's auto-sharded share of each global batch, a piece per replica;
  with replicas on several hosts (`input_workers`), each host's share there."""
  check_dataset(dataset)
  devices = tuple(devices)
  options = options or input_context_lib.InputOptions()
  homes, feeds = input_workers(devices, host)
  if input_context is not None and input_context.num_input_pipelines > 1:
    shares = [(dataset, input_context.num_input_pipelines, input_context.input_pipeline_id,
               input_context.num_replicas_in_sync)]
  elif len(homes) > 1:
    shares = [(auto_shard.rebuilt_on(home, dataset), len(homes), index, len(devices))
              for index, home in enumerate(homes)]
  else:
    shares = None
  buffer_size = options.experimental_per_replica_buffer_size
  if shares:
    _check_batched(dataset.element_spec, shares[0][3])
    datasets = []
    for home, share in zip(homes, shares):
      with tf.device(home):
        datasets.append(auto_shard.worker_share(*share).prefetch(
            buffer_size * (len(devices) // len(homes))))
    split, sync_key = False, getattr(workers, "key", None)
  else:
    made_on = tf.data.experimental.to_variant(dataset).device if tf.executing_eagerly() else ""
    if made_on and device_util.canonicalize(made_on) != device_util.canonicalize(host):
      dataset = auto_shard.rebuilt_on(host, dataset)  # made on a pod's host, read here
    datasets, split, sync_key = [dataset.prefetch(buffer_size)], len(devices) > 1, None
    if split:
      _check_batched(dataset.element_spec, len(devices))
  return DistributedDataset(_Layout(devices, homes, split,
                                    bool(options.experimental_fetch_to_device), sync_key,
                                    feeds=feeds), datasets)


def distribute_datasets_from_function(dataset_fn, devices, host, options=None,
                                      input_context=None, workers=None,
                                      partial_steps=True):
  """A `DistributedDatasetsFromFunction` of the datasets `dataset_fn(InputContext)`
  makes once (`PER_WORKER`) or per replica, as `options` say for this call
  only (TensorFlow 2.21 keeps `PER_REPLICA` once asked); `workers` syncs the
  steps of several workers. Replicas whose pipelines end first get empty
  batches in a last, partial step (by `get_next` only if `partial_steps`),
  except for fully known shapes (TensorFlow 2.21 makes up zeros)."""
  devices = tuple(devices)
  options = options or input_context_lib.InputOptions()
  hosts, feeds = input_workers(devices, host)
  if not input_context_lib.is_per_replica(options):
    homes = hosts
  elif options.experimental_place_dataset_on_device:
    homes, feeds = devices, None
  else:
    homes, feeds = tuple(hosts[f] for f in feeds or [0] * len(devices)), None
  datasets = []
  for index, home in enumerate(homes):
    context = input_context or input_context_lib.InputContext(len(homes), index, len(devices))
    with tf.device(home):
      dataset = dataset_fn(context)
      if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"`dataset_fn` must return a tf.data.Dataset; for {context} it "
            f"returned {dataset!r} of type {type(dataset).__name__}.")
      replicas_fed = len(devices) // len(homes)
      datasets.append(dataset.prefetch(options.experimental_per_replica_buffer_size * replicas_fed))
  return DistributedDatasetsFromFunction(
      _Layout(devices, homes, False, bool(options.experimental_fetch_to_device),
              getattr(workers, "key", None), partial_steps, feeds=feeds),
      tuple(datasets))


def _fully_shaped(element_spec):
  """Whether every component's shape is known (ragged, sparse: its batch)."""
  for spec in tf.nest.flatten(element_spec):
    if isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)):
      if spec.shape.rank and spec.shape[0] is None:
        return False
    elif not all(flat.shape.is_fully_defined() for flat in _tf_bridge.flat_tensor_specs(spec)):
      return False
  return True


class DistributedDataset(tf.distribute.DistributedDataset, _tf_bridge.CompositeTensor):
  """Each step, a batch for every replica (from
  `strategy.experimental_distribute_dataset`); Keras 3's `fit` takes it.

  >>> dist = distribute_dataset(tf.data.Dataset.range(4).batch(2),
  ...                           ["CPU:0", "CPU:1"], host="CPU:0")
  >>> [[int(t) for part in step.values for t in part] for step in dist]
  [[0, 1], [2, 3]]
  """

  def __init__(self, layout, datasets):
    self._layout = layout
    self._datasets = tuple(datasets)
    # Known for a dataset made eagerly, as in TensorFlow.
    with tf.device(layout.homes[0]):
      self._cardinality = (self._datasets[0].cardinality().numpy()
                           if tf.executing_eagerly() else tf.data.UNKNOWN_CARDINALITY)

  def __iter__(self):
    return DistributedIterator(self._layout, self._iterators(_iterator))

  def _iterators(self, make):
    iterators = []
    for home, dataset in zip(self._layout.homes, self._datasets):
      with tf.device(home):
        iterators.append(make(dataset))
    return iterators

  def make_initializable_iterator(self):
    """TF 1.x graphs: an iterator whose `initializer` op (re)starts it."""
    return InitializableIterator(self._layout, self._iterators(
        _graph_only(tf.compat.v1.data.make_initializable_iterator)))

  def make_one_shot_iterator(self):
    """TF 1.x graphs: an iterator that needs no initialization."""
    return DistributedIterator(self._layout, self._iterators(
        _graph_only(tf.compat.v1.data.make_one_shot_iterator)))

  @property
  def element_spec(self):
    """The type spec of each step's value: `PerReplicaSpec`s in a nest."""
    return _distributed_spec(self._layout, _part_spec(self._layout, self._datasets[0].element_spec))

  @property
  def cardinality(self):
    """The first pipeline's cardinality (unknown if made in a `tf.function`)."""
    return self._cardinality

  def reduce(self, initial_state, reduce_fn):
    """`reduce_fn(state, step_value)` folded over every step."""
    iterator = iter(self)

    def body(unused_has_value, state):
      has_value, value_fn = iterator._next_if_any()  # pylint: disable=protected-access
      state = tf.cond(has_value, lambda: reduce_fn(state, value_fn()), lambda: state)
      return has_value, state

    _, state = tf.while_loop(lambda has_value, _: has_value, body,
                             (tf.constant(True), initial_state))
    return state

  @property
  def _type_spec(self):
    return DistributedDatasetSpec(
        isinstance(self, DistributedDatasetsFromFunction), self._layout,
        tuple(tf.data.DatasetSpec(d.element_spec) for d in self._datasets))

  def __getattr__(self, name):
    hint = ""
    if not name.startswith("_") and hasattr(tf.data.Dataset, name):
      hint = (f": a distributed dataset cannot be transformed further. Call `{name}` on the "
              f"tf.data.Dataset before distributing it, or build each input pipeline "
              f"yourself with `strategy.distribute_datasets_from_function`.")
    raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'{hint}")


class DistributedDatasetsFromFunction(DistributedDataset):
  """The datasets of `strategy.distribute_datasets_from_function`."""


class _InputSpec(tf.TypeSpec):
  """Type spec of a distributed dataset or iterator: layout and pipelines' specs."""

  __slots__ = ("_layout", "_pipeline_specs")

  def __init__(self, layout, pipeline_specs):
    self._layout = layout
    self._pipeline_specs = pipeline_specs

  _component_specs = property(lambda self: self._pipeline_specs)

  def _serialize(self):
    return (self._layout, self._pipeline_specs)

  def _from_components(self, components):
    return self.value_type(self._layout, components)


class DistributedDatasetSpec(_InputSpec):
  """Type spec of a distributed dataset."""

  __slots__ = ("_from_function",)

  def __init__(self, from_function, layout, dataset_specs):
    super().__init__(layout, dataset_specs)
    self._from_function = from_function

  value_type = property(lambda self: (DistributedDatasetsFromFunction if self._from_function
                                      else DistributedDataset))

  def _serialize(self):
    return (self._from_function,) + super()._serialize()

  def _to_components(self, value):
    return value._datasets  # pylint: disable=protected-access


class DistributedIteratorSpec(_InputSpec):
  """Type spec of a `DistributedIterator`."""

  value_type = property(lambda self: DistributedIterator)

  def _to_components(self, value):
    return value._iterators  # pylint: disable=protected-access


class DistributedIterator(tf.distribute.DistributedIterator, _tf_bridge.CompositeTensor):
  """Iterator over a distributed dataset: each step a nest of `PerReplica`
  values (plain values with one replica), each on its replica's device.

  >>> dist = distribute_dataset(tf.data.Dataset.range(3).batch(3),
  ...                           ["CPU:0", "CPU:1"], host="CPU:0")
  >>> iter(dist).get_next()
  PerReplica:{
    0: <tf.Tensor: shape=(2,), dtype=int64, numpy=array([0, 1])>,
    1: <tf.Tensor: shape=(1,), dtype=int64, numpy=array([2])>
  }
  """

  def __init__(self, layout, iterators):
    self._layout = layout
    self._iterators = tuple(iterators)
    self._copy_to = tuple(
        device if layout.fetch_to_device and device != self._home_of(r) else None
        for r, device in enumerate(layout.devices))
    self._part_spec = _part_spec(layout, self._iterators[0].element_spec)
    self._has_empty_form = not _fully_shaped(self._part_spec)
    # One dequeue gives the whole step (a split global batch, or one
    # replica), unless a worker without data must give its replicas empty ones.
    self._one_dequeue = (layout.split or len(layout.devices) == 1) and (layout.workers is None)

  def __iter__(self):
    return self

  def __next__(self):
    """The next step's value; raises `StopIteration` at the end."""
    try:
      return self.get_next()
    except tf.errors.OutOfRangeError:
      raise StopIteration from None

  next = __next__

  @property
  def element_spec(self):
    """The type spec of each step's value."""
    return _distributed_spec(self._layout, self._part_spec)

  def get_next(self):
    """The next step's value; raises `tf.errors.OutOfRangeError` at the end
    (a last, partial step may give some replicas empty batches)."""
    _check_strategy(self._layout)
    _refuse_in_a_replica("next(iterator)", "args=(next(iterator),)")
    if self._layout.workers is not None or (
        self._layout.feeds is not None and tf.executing_eagerly()):
      # Eagerly, a pod's hosts' iterators end through optionals: the error an
      # exhausted remote iterator raises, TensorFlow's executor raises again later.
      return self._next_of_any_worker()
    if self._one_dequeue:
      return self._distribute_element(self._iterators[0].get_next())
    return self._distribute_parts(self._parts(self._value_or_empty))

  def _next_of_any_worker(self):
    """`get_next` of one worker of several: `OutOfRangeError` (raised by the
    exhausted host iterator) once every worker's input has ended."""
    has_value, value_fn = self._next_if_any()
    if tf.executing_eagerly():
      if not has_value:
        raise tf.errors.OutOfRangeError(None, None, "End of sequence")
      return value_fn()

    def end_of_input():
      element = self._iterators[0].get_next()  # raises OutOfRangeError
      return tf.reduce_all([tf.size(t) < 0 for t in tf.nest.flatten(element)])
    checked = tf.cond(has_value, lambda: tf.constant(True), end_of_input)

    def after_check(tensor):
      with tf.device(tensor.device), tf.control_dependencies([checked]):
        return tf.identity(tensor)
    return tf.nest.map_structure(after_check, value_fn(), expand_composites=True)

  def get_next_as_optional(self):
    """The next step's value as a `tf.experimental.Optional`, empty at the
    end; also in a `tf.while_loop` (TensorFlow 2.21's `MirroredStrategy`
    fails there: "You must feed a value for placeholder tensor")."""
    _refuse_in_a_replica("iterator.get_next_as_optional()",
                         "args=(iterator.get_next_as_optional().get_value(),)")
    has_value, value_fn = self._next_if_any()
    if tf.executing_eagerly():
      return (Optional.from_value(value_fn()) if has_value else Optional.empty(self.element_spec))
    if self._one_dequeue:
      spec = self.element_spec
      present = lambda: Optional.from_value(value_fn())
    else:  # parts with an empty stand-in are safe to build outside the cond
      value = value_fn()
      spec = tf.nest.map_structure(tf.type_spec_from_value, value)
      present = lambda: Optional.from_value(value)
    return tf.cond(has_value, present, lambda: Optional.empty(spec))

  def _next_if_any(self):
    """Dequeues one step: `(has_value, value_fn)`; call `value_fn` only where
    `has_value` holds (it reads an optional's value)."""
    if self._one_dequeue:
      optional = self._iterators[0].get_next_as_optional()
      return optional.has_value(), lambda: self._distribute_element(optional.get_value())
    optionals = []

    def optional_part(replica):
      optionals.append(self._iterator_of(replica).get_next_as_optional())
      return self._optional_or_empty(optionals[-1], replica)
    parts = self._parts(optional_part)
    if self._has_empty_form or self._layout.workers is not None:
      has_value = optionals[0].has_value()
    else:
      has_value = tf.reduce_all([optional.has_value() for optional in optionals])
    if self._layout.workers is not None:
      has_value = WorkerSync.of(self._layout.workers).any_worker_has(has_value)
    return has_value, lambda: self._distribute_parts(parts)

  def _parts(self, take):
    """Each replica's batch, `take(replica)`; replicas sharing a pipeline
    dequeue in replica order (in a TF1 graph nothing else orders them)."""
    parts, last = [], {}  # pipeline -> the part it gave last
    for replica in range(len(self._layout.devices)):
      pipeline = self._pipeline_of(replica)
      after = tf.nest.flatten(last.get(pipeline, []), expand_composites=True)
      with tf.control_dependencies([t for t in after if tf.is_tensor(t)]):
        parts.append(take(replica))
      last[pipeline] = parts[-1]
    return parts

  def _iterator_of(self, replica):
    return self._iterators[self._pipeline_of(replica)]

  def _home_of(self, replica):
    return self._layout.homes[self._pipeline_of(replica)]

  def _pipeline_of(self, replica):
    if self._layout.feeds is not None:
      return self._layout.feeds[replica]
    return replica * len(self._layout.homes) // len(self._layout.devices)

  def _value_or_empty(self, replica):
    """The batch of `replica`; once its pipeline has ended, an empty one if a
    partial step is allowed, else (as for replica 0) `OutOfRangeError`."""
    iterator = self._iterator_of(replica)
    if replica == 0 or not (self._layout.partial_steps and self._has_empty_form):
      return iterator.get_next()
    return self._optional_or_empty(iterator.get_next_as_optional(), replica)

  def _optional_or_empty(self, optional, replica):
    if tf.executing_eagerly():
      return optional.get_value() if optional.has_value() else self._empty(replica)
    return tf.cond(optional.has_value(), optional.get_value, lambda: self._empty(replica))

  def _empty(self, replica):
    """The batch of a replica without data on the last step, placed where
    TensorFlow puts it."""
    layout = self._layout
    shared_on_host = (not layout.fetch_to_device and len(layout.homes) < len(layout.devices))
    with tf.device(self._home_of(replica) if shared_on_host else layout.devices[replica]):
      return _empty_like(self._part_spec)

  def _distribute_element(self, element):
    """A global batch (or one replica's batch) -> the step's value."""
    split = self._layout.split
    columns = [_split_leaf(leaf, len(self._copy_to)) if split else [leaf]
               for leaf in tf.nest.flatten(element)]
    return self._regroup(element, columns)

  def _distribute_parts(self, parts):
    """One batch per replica -> the step's value."""
    columns = zip(*[tf.nest.flatten(part) for part in parts])
    return self._regroup(parts[0], columns)

  def _regroup(self, structure, columns):
    """`columns[leaf][replica]`, each moved to its replica's device, as a nest
    like `structure` of `PerReplica` values (plain values for one replica)."""
    leaves = []
    for column in columns:
      placed = [value if device is None else _copy_to_device(value, device)
                for value, device in zip(column, self._copy_to)]
      leaves.append(placed[0] if len(placed) == 1 and self._layout.workers is None
                    else values_lib.PerReplica(tuple(placed)))
    return tf.nest.pack_sequence_as(structure, leaves)

  @property
  def _type_spec(self):
    return DistributedIteratorSpec(
        self._layout, tuple(tf.type_spec_from_value(it) for it in self._iterators))


def _refuse_in_a_replica(call, args):
  """Raises TensorFlow's ValueError for `call` inside `strategy.run`."""
  if contexts.has_strategy() and not contexts.in_cross_replica_context():
    raise ValueError(f"{call} should be called from outside of replica_fn. "
                     f"e.g. strategy.run(replica_fn, {args})")


class InitializableIterator(DistributedIterator):
  """A TF 1.x graph's `DistributedIterator`, with an `initializer` op."""

  @property
  def initializer(self):
    """The op that (re)starts the iterator."""
    return tf.group([it.initializer for it in self._iterators])

  def initialize(self):
    """Deprecated: the `initializer`."""
    deprecation.warn_once("DistributedIterator.initialize",
                          "Use the iterator's `initializer` property instead.")
    return self.initializer


def _iterator(dataset):
  """`iter(dataset)`, made by a function when eager on another task (a pod's
  host): TensorFlow's remote runtime lets a step read an iterator once the op
  making it has run, maybe before the eager op that starts it (it has no
  output), so Keras 3's step found it uninitialized; a function's iterator
  exists only once started."""
  home = device_util.current()
  if home and home not in device_util.local_devices():
    return _started_iterator(dataset)
  return iter(dataset)


_started_iterator = tf.function(lambda dataset: iter(dataset))  # pylint: disable=unnecessary-lambda


def _graph_only(make_iterator):
  def make(dataset):
    if tf.executing_eagerly():
      raise RuntimeError(
          "TF 1.x dataset iterators are not supported when eager execution is "
          "enabled; iterate the distributed dataset with `for` or `iter()`.")
    return make_iterator(dataset)
  return make


def _part_spec(layout, pipeline_spec):
  """The spec of one replica's batch, from the spec of a pipeline's element."""
  if not layout.split:
    return pipeline_spec
  replicas = len(layout.devices)

  def part(spec):
    batch = spec.shape[0]
    size = batch // replicas if batch is not None and batch % replicas == 0 else None
    shape = tf.TensorShape([size]).concatenate(spec.shape[1:])
    if isinstance(spec, tf.RaggedTensorSpec):
      return tf.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank,
                                 spec.row_splits_dtype,
                                 flat_values_spec=spec.flat_values_spec)
    if isinstance(spec, tf.SparseTensorSpec):
      return tf.SparseTensorSpec(shape, spec.dtype)
    return tf.TensorSpec(shape, spec.dtype)
  return tf.nest.map_structure(part, pipeline_spec)


def _distributed_spec(layout, part_spec):
  replicas = len(layout.devices)
  if replicas == 1 and layout.workers is None:
    return part_spec
  return tf.nest.map_structure(
      lambda spec: values_lib.PerReplicaSpec(*[spec] * replicas), part_spec)


def _check_batched(element_spec, replicas):
  """Raises unless every component of `element_spec` can be cut by rows."""
  supported = (tf.TensorSpec, tf.RaggedTensorSpec, tf.SparseTensorSpec)
  for path, leaf in values_lib.flatten_with_paths(element_spec):
    where = f"component {path}" if path else "the element"
    cannot = f"Cannot split the elements of `dataset` across {replicas} replicas: {where}"
    if not isinstance(leaf, supported):
      raise ValueError(
          f"{cannot} is a {type(leaf).__name__}, not a batch of tensors, ragged or sparse "
          f"tensors. Use `distribute_datasets_from_function` instead.")
    if leaf.shape.rank == 0:
      raise ValueError(
          f"{cannot} has shape {leaf.shape}, with no batch dimension. Batch the dataset "
          f"by the global batch size first, e.g. `dataset.batch(global_batch_size)`.")


def _split_leaf(value, replicas):
  """`replicas` chunks of `value` of `ceil(batch / replicas)` rows or what is
  left; in a graph, static shapes only for an even static batch."""
  batch = value.shape[0]
  if tf.executing_eagerly() or (batch is not None and batch % replicas == 0):
    size = -(-batch // replicas)
  else:
    size = -(-_batch_size(value) // replicas)
  if isinstance(value, tf.SparseTensor):
    return [_sparse_rows(value, i * size, size) for i in range(replicas)]
  if isinstance(value, tf.Tensor) and isinstance(size, int):
    return tf.split(value, replicas if batch % replicas == 0 else _uneven_sizes(batch, replicas))
  return [value[i * size:(i + 1) * size] for i in range(replicas)]


@functools.lru_cache(maxsize=64)
def _uneven_sizes(batch, replicas):
  """Eager chunk sizes of an uneven batch, as a tensor made once."""
  size = -(-batch // replicas)
  with tf.init_scope(), tf.device("/device:CPU:0"):
    return tf.constant([max(0, min(size, batch - i * size)) for i in range(replicas)], tf.int64)


def _copy_to_device(value, device):
  if (isinstance(value, _tf_bridge.EagerTensor) and
      device_util.is_present(device)):  # else tf.device soft-places the copy
    return _tf_bridge.copy_to_device(value, device)
  return device_util.on_device(value, device, copy=True)


def _batch_size(value):
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int32)
  if isinstance(value, tf.SparseTensor):
    return tf.cast(value.dense_shape[0], tf.int32)
  # Read at run time: a static but uneven batch must still give unknown shapes.
  return tf.compat.v1.placeholder_with_default(tf.shape(value)[0], shape=())


def _sparse_rows(value, start, rows):
  """Rows `[start, start + rows)` of a sparse `value`, keeping static dims."""
  rank = tf.size(value.dense_shape)
  begin = tf.concat([[tf.cast(start, tf.int64)], tf.zeros([rank - 1], tf.int64)], 0)
  size = tf.concat([[tf.cast(rows, tf.int64)], value.dense_shape[1:]], 0)
  piece = tf.sparse.slice(value, begin, size)
  if not tf.executing_eagerly():  # in a graph, int `rows` divide the batch evenly
    batch = rows if isinstance(rows, int) else None
    piece.set_shape(tf.TensorShape([batch]).concatenate(value.shape[1:]))
  return piece


def _empty_like(spec):
  """Empty stand-ins (batch and unknown dimensions 0, as in TensorFlow)."""
  def empty(leaf):
    if isinstance(leaf, tf.RaggedTensorSpec):
      shape = leaf.shape[:1].concatenate(leaf.shape[1 + leaf.ragged_rank:])
    else:
      shape = leaf.shape
    dims = [0 if d is None else d for d in shape.as_list()] if shape.rank else []
    if dims and (isinstance(leaf, tf.RaggedTensorSpec) or shape.is_fully_defined()):
      dims[0] = 0
    if isinstance(leaf, tf.SparseTensorSpec):
      return tf.SparseTensor(tf.zeros((0, len(dims)), tf.int64), tf.zeros([0], leaf.dtype), dims)
    dense = tf.zeros(dims, leaf.dtype)
    if isinstance(leaf, tf.RaggedTensorSpec):
      splits = (tf.zeros([1], leaf.row_splits_dtype),) * leaf.ragged_rank
      return tf.RaggedTensor.from_nested_row_splits(dense, splits, validate=False)
    return dense
  return tf.nest.map_structure(empty, spec)


def numpy_dataset(numpy_input, device):
  """A dataset of the slices of `numpy_input`, as tensors on `device`."""
  with tf.init_scope(), tf.device(device):  # eager tensors: captured, not Const
    tensors = tf.nest.map_structure(tf.convert_to_tensor, numpy_input)
  return tf.data.Dataset.from_tensor_slices(tensors)


def initializable_iterator(distributed_dataset):
  """The TF 1.x iterator over a distributed dataset."""
  if tf.executing_eagerly():
    return _EagerIterator(distributed_dataset)
  if isinstance(distributed_dataset, tf.data.Dataset):  # the default strategy's
    return _GraphDatasetIterator(distributed_dataset)
  return distributed_dataset.make_initializable_iterator()


class _TF1Iterator:

  initialize = InitializableIterator.initialize

  def get_next(self):
    return self._iterator.get_next()


class _GraphDatasetIterator(_TF1Iterator):
  """The default strategy's TF 1.x iterator in a TF1 graph."""

  def __init__(self, dataset):
    self._iterator = tf.compat.v1.data.make_initializable_iterator(dataset)

  @property
  def initializer(self):
    """`[op]`, as in TensorFlow."""
    return [self._iterator.initializer]

  def get_next_as_optional(self):
    return self._iterator.get_next_as_optional()


class CallableIterator(_TF1Iterator):
  """The TF 1.x iterator over a callable an `input_fn` returned, called on
  `host` once per replica."""

  def __init__(self, fn, num_replicas, host):
    self._fn, self._num_replicas, self._host = fn, num_replicas, host

  @property
  def initializer(self):
    """Nothing to (re)start: an op that does nothing (eagerly None)."""
    return tf.group([])

  def get_next(self):
    with tf.device(self._host):
      return values_lib.regroup([self._fn() for _ in range(self._num_replicas)])


class _EagerIterator(_TF1Iterator):
  """An eager distributed iterator, restarted by `initialize()`."""

  def __init__(self, distributed_dataset):
    self._dataset = distributed_dataset
    self._iterator = iter(distributed_dataset)

  @property
  def initializer(self):
    """None: reading it restarts the iterator, as in TensorFlow."""
    self._iterator = iter(self._dataset)

  def __getattr__(self, name):
    return getattr(self._iterator, name)
