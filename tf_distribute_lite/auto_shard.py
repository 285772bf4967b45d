"""Sharding one dataset across input workers, by files or by elements.

The policy comes from `dataset.options().experimental_distribute.
auto_shard_policy`; the rewrite itself is tf.data's own `AutoShardDataset`
op: `FILE` gives each worker its share of the reader datasets' files, `DATA`
every `num_workers`-th element, `AUTO` tries `FILE` and falls back to `DATA`
(logging a warning), `HINT` shards only where `shard(SHARD_HINT, SHARD_HINT)`
asks, `OFF` leaves the dataset whole.
"""

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
    raise ValueError(f"`worker_index` must be in [0, {num_workers}); got "
                     f"{worker_index}.")
  policy = dataset.options().experimental_distribute.auto_shard_policy
  if num_workers == 1 or policy == AutoShardPolicy.OFF:
    return dataset
  flat_specs = _tf_bridge.flat_tensor_specs(dataset.element_spec)
  variant = tf.raw_ops.AutoShardDataset(
      input_dataset=tf.data.experimental.to_variant(dataset),
      num_workers=num_workers, index=worker_index,
      auto_shard_policy=int(policy), num_replicas=num_replicas_in_sync,
      output_types=[s.dtype for s in flat_specs],
      output_shapes=[s.shape for s in flat_specs])
  return tf.data.experimental.from_variant(variant, dataset.element_spec)
