"""Sharding one dataset across input workers with tf.data's `AutoShardDataset`,
and remaking a dataset elsewhere from its graph."""

import tensorflow as tf

from tf_distribute_lite import _tf_bridge

AutoShardPolicy = tf.data.experimental.AutoShardPolicy


def auto_shard(dataset, num_workers, worker_index, num_replicas_in_sync):
  """The part of `dataset` that input worker `worker_index` reads.

  >>> options = tf.data.Options()
  >>> options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
  >>> dataset = tf.data.Dataset.range(6).with_options(options)
  >>> [int(x) for x in auto_shard(dataset, 3, 1, num_replicas_in_sync=3)]
  [1, 4]
  """
  if not 0 <= worker_index < num_workers:
    raise ValueError(f"`worker_index` must be in [0, {num_workers}); got {worker_index}.")
  policy = dataset.options().experimental_distribute.auto_shard_policy
  if num_workers == 1 or policy == AutoShardPolicy.OFF:
    return dataset
  return _dataset_op(tf.raw_ops.AutoShardDataset, dataset, dataset.element_spec,
                     num_workers=num_workers, index=worker_index,
                     auto_shard_policy=int(policy), num_replicas=num_replicas_in_sync)


def worker_share(dataset, num_workers, worker_index, num_replicas_in_sync):
  """The pieces of `dataset` (batched globally) worker `worker_index` feeds its
  replicas: each global batch cut as TensorFlow does, then auto-sharded.

  >>> dataset = tf.data.Dataset.range(16).batch(8)
  >>> [x.numpy().tolist() for x in worker_share(dataset, 2, 1, 2)]
  [[4, 5, 6, 7], [12, 13, 14, 15]]
  """
  if num_replicas_in_sync % num_workers:
    raise ValueError(
        "Every worker must have the same number of replicas, but `num_replicas_in_sync` "
        f"({num_replicas_in_sync}) is not a multiple of the number of workers ({num_workers}).")
  replicas_per_worker = num_replicas_in_sync // num_workers
  batch_size = _static_batch_size(dataset)

  def rebatched():
    return dataset.rebatch(piece_sizes(batch_size, num_workers, replicas_per_worker, worker_index))

  def rebatched_at_run_time():
    """Each batch cut into `num_replicas_in_sync` pieces at run time."""
    return _dataset_op(tf.raw_ops.RebatchDataset, dataset,
                       _with_unknown_batch(dataset.element_spec),
                       num_replicas=num_replicas_in_sync, use_fallback=True)

  if isinstance(batch_size, int):
    pieces = rebatched() if batch_size >= 0 else rebatched_at_run_time()
  else:
    to_variant = tf.data.experimental.to_variant
    variant = tf.cond(batch_size >= 0, lambda: to_variant(rebatched()),
                      lambda: to_variant(rebatched_at_run_time()))
    pieces = tf.data.experimental.from_variant(variant, _with_unknown_batch(dataset.element_spec))
  return auto_shard(pieces.prefetch(replicas_per_worker), num_workers,
                    worker_index, num_replicas_in_sync)


def dataset_remaker(dataset):
  """A function remaking `dataset` from its graph (e.g. on a worker); external
  state (a generator, a resource) is dropped with a warning, as in TensorFlow.

  >>> remake = dataset_remaker(tf.data.Dataset.range(3).map(lambda x: 2 * x))
  >>> [int(x) for x in remake()]
  [0, 2, 4]
  """
  graph = tf.raw_ops.DatasetToGraphV2(
      input_dataset=tf.data.experimental.to_variant(dataset), strip_device_assignment=True,
      external_state_policy=int(tf.data.experimental.ExternalStatePolicy.WARN.value))
  element_spec = dataset.element_spec
  return lambda: tf.data.experimental.from_variant(
      tf.raw_ops.DatasetFromGraph(graph_def=graph), element_spec)


def rebuilt_on(device, dataset):
  """`dataset` rebuilt on `device` (another host's) from its graph."""
  remake = dataset_remaker(dataset)
  with tf.device(device):
    return remake()


def piece_sizes(global_batch_size, num_workers, replicas_per_worker, worker_index):
  """The sizes worker `worker_index` cuts each global batch into (the workers'
  pieces add up to the global batch).

  >>> piece_sizes(7, num_workers=2, replicas_per_worker=2, worker_index=1)
  [2, 1, 2, 2]
  """
  pieces = num_workers * replicas_per_worker
  offset = worker_index * replicas_per_worker
  if isinstance(global_batch_size, int):
    small, larger = divmod(global_batch_size, pieces)
    sizes = [small + 1] * larger + [small] * (pieces - larger)
    return sizes[offset:] + sizes[:offset]
  small = global_batch_size // pieces
  larger = global_batch_size - small * pieces
  sizes = small + tf.cast(tf.range(pieces, dtype=tf.int64) < larger, tf.int64)
  return tf.concat([sizes[offset:], sizes[:offset]], axis=0)


def _dataset_op(op, dataset, element_spec, **attrs):
  """The dataset of the raw tf.data `op` over `dataset`, of `element_spec`."""
  flat_specs = _tf_bridge.flat_tensor_specs(element_spec)
  variant = op(input_dataset=tf.data.experimental.to_variant(dataset),
               output_types=[s.dtype for s in flat_specs],
               output_shapes=[s.shape for s in flat_specs], **attrs)
  return tf.data.experimental.from_variant(variant, element_spec)


def _static_batch_size(dataset):
  """The batch size of `dataset` (-1 if unknown), in a `tf.function` maybe a tensor."""
  specs = tf.nest.flatten(dataset.element_spec)
  dims = [spec.shape[0] if spec.shape.rank else None
          for spec in specs if isinstance(spec, tf.TensorSpec)]
  if dims and len(dims) == len(specs) and None not in dims:
    return dims[0] if all(d == dims[0] for d in dims) else -1
  size = tf.raw_ops.ComputeBatchSize(input_dataset=tf.data.experimental.to_variant(dataset))
  return int(size) if tf.executing_eagerly() else size


def _with_unknown_batch(element_spec):
  def unknown(spec):
    if not isinstance(spec, tf.TensorSpec) or not spec.shape.rank:
      return spec
    return tf.TensorSpec(tf.TensorShape([None]).concatenate(spec.shape[1:]), spec.dtype)
  return tf.nest.map_structure(unknown, element_spec)
