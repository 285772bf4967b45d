"""Auto-sharding a dataset across simulated input workers.

`auto_shard` is checked for every `AutoShardPolicy` against the elements or
files each worker must read, spelled out, and where it can be imported
against tf.data's own `_AutoShardDataset`. `worker_share`, and
`distribute_dataset` with an `InputContext` of several workers, must give
each worker's replicas exactly the pieces of every global batch that
TensorFlow's own multi-worker input pipeline gives them.

The file datasets read 6 files (TFRecord or text), file `f` holding the
records `b"f{f}-r0"`, `b"f{f}-r1"`, `b"f{f}-r2"`.
"""

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import input_lib
from tf_distribute_lite.auto_shard import auto_shard
from tf_distribute_lite.auto_shard import piece_sizes
from tf_distribute_lite.auto_shard import worker_share

from conftest import DEVICES
import oracle

Policy = tf.data.experimental.AutoShardPolicy
SHARD_HINT = tf.data.experimental.SHARD_HINT

NUM_FILES = 6
RECORDS_PER_FILE = 3
WORKER_COUNTS = [2, 3]


def _records(file_ids):
  """Every record of the files `file_ids`, file by file."""
  return [f"f{f}-r{r}".encode() for f in file_ids
          for r in range(RECORDS_PER_FILE)]


ALL_RECORDS = _records(range(NUM_FILES))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """`{"tfrecord": paths, "text": paths, "dir": directory}` of 6 files each."""
  directory = tmp_path_factory.mktemp("auto_shard")
  paths = {"tfrecord": [], "text": [], "dir": str(directory)}
  for f in range(NUM_FILES):
    records = _records([f])
    tfrecord = str(directory / f"f{f}.tfrecord")
    with tf.io.TFRecordWriter(tfrecord) as writer:
      for record in records:
        writer.write(record)
    text = directory / f"f{f}.txt"
    text.write_bytes(b"".join(record + b"\n" for record in records))
    paths["tfrecord"].append(tfrecord)
    paths["text"].append(str(text))
  return paths


# Each makes a dataset of all 18 records, file by file, from `files`.
FILE_SOURCES = {
    "tfrecord_list": lambda files: tf.data.TFRecordDataset(files["tfrecord"]),
    "list_files_interleave": lambda files: tf.data.Dataset.list_files(
        files["dir"] + "/*.tfrecord", shuffle=False).interleave(
            tf.data.TFRecordDataset, cycle_length=1),
    "file_names_flat_map": lambda files: tf.data.Dataset.from_tensor_slices(
        files["tfrecord"]).flat_map(tf.data.TFRecordDataset),
    "text_list": lambda files: tf.data.TextLineDataset(files["text"]),
    "text_list_files_flat_map": lambda files: tf.data.Dataset.list_files(
        files["dir"] + "/*.txt", shuffle=False).flat_map(
            tf.data.TextLineDataset),
}


def _with_policy(dataset, policy):
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = policy
  return dataset.with_options(options)


def _to_python(value):
  if isinstance(value, tf.RaggedTensor):
    return value.to_list()
  value = value.numpy()
  return value.tolist() if hasattr(value, "tolist") else value


def _elements(dataset):
  """Every element of `dataset` as (nested) Python values."""
  return [tf.nest.map_structure(_to_python, x) for x in dataset]


def _tf_auto_shard(dataset, num_workers, index, num_replicas):
  """tf.data's own auto-shard rewrite, or a skip if this TF lacks it."""
  try:
    from tensorflow.python.data.experimental.ops import distribute as tf_distribute  # pylint: disable=g-import-not-at-top
    tf_auto_shard_dataset = tf_distribute._AutoShardDataset  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    pytest.skip("tf.data's _AutoShardDataset is not available")
  return tf_auto_shard_dataset(dataset, num_workers, index, num_replicas)


def _shards(make_dataset, policy, num_workers, num_replicas=4):
  """Each worker's elements under `auto_shard`, checked equal to tf.data's."""
  shards = []
  for index in range(num_workers):
    ours = _elements(auto_shard(_with_policy(make_dataset(), policy),
                                num_workers, index, num_replicas))
    theirs = _elements(_tf_auto_shard(_with_policy(make_dataset(), policy),
                                      num_workers, index, num_replicas))
    assert ours == theirs, f"worker {index} of {num_workers}"
    shards.append(ours)
  return shards


def _assert_partition(shards, everything):
  """The shards together hold every element of `everything` exactly once."""
  merged = sorted(x for shard in shards for x in shard)
  assert merged == sorted(everything)


# --- FILE.


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
@pytest.mark.parametrize("source", sorted(FILE_SOURCES))
def test_file_policy_gives_each_worker_its_files(files, source, num_workers):
  """Worker i reads files i, i + W, ... whole; together, every record once."""
  shards = _shards(lambda: FILE_SOURCES[source](files), Policy.FILE,
                   num_workers)
  for index, shard in enumerate(shards):
    assert shard == _records(range(index, NUM_FILES, num_workers))
  _assert_partition(shards, ALL_RECORDS)


def test_file_policy_with_uneven_files_per_worker(files):
  """6 files over 4 workers: the first two workers get a second file."""
  shards = _shards(lambda: tf.data.TFRecordDataset(files["tfrecord"]),
                   Policy.FILE, 4)
  assert shards == [_records([0, 4]), _records([1, 5]), _records([2]),
                    _records([3])]


def test_file_policy_keeps_the_interleave_order(files):
  """Sharding happens before `interleave`, which then mixes the worker's files."""
  shards = _shards(
      lambda: tf.data.Dataset.from_tensor_slices(files["tfrecord"]).interleave(
          tf.data.TFRecordDataset, cycle_length=2), Policy.FILE, 2)
  assert shards == [
      [b"f0-r0", b"f2-r0", b"f0-r1", b"f2-r1", b"f0-r2", b"f2-r2",
       b"f4-r0", b"f4-r1", b"f4-r2"],
      [b"f1-r0", b"f3-r0", b"f1-r1", b"f3-r1", b"f1-r2", b"f3-r2",
       b"f5-r0", b"f5-r1", b"f5-r2"]]


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_file_policy_on_batched_records(files, num_workers):
  """Batches after the reader are made from the worker's own records."""
  shards = _shards(lambda: tf.data.TFRecordDataset(files["tfrecord"]).batch(2),
                   Policy.FILE, num_workers)
  for index, shard in enumerate(shards):
    records = _records(range(index, NUM_FILES, num_workers))
    assert shard == [records[k:k + 2] for k in range(0, len(records), 2)]


@pytest.mark.parametrize("policy", [Policy.FILE, Policy.AUTO],
                         ids=lambda policy: policy.name)
def test_fewer_files_than_workers_fails(files, policy):
  """2 files cannot be split over 3 workers by file; TF fails the same way."""
  for shard in (auto_shard, _tf_auto_shard):
    dataset = shard(_with_policy(
        tf.data.TFRecordDataset(files["tfrecord"][:2]), policy), 3, 0, 4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Could not apply FILE based sharding"):
      _elements(dataset)


def test_file_policy_on_range_fails():
  """FILE needs a file reader; `range` has none, so sharding it fails."""
  for shard in (auto_shard, _tf_auto_shard):
    with pytest.raises(tf.errors.NotFoundError, match="unshardable source"):
      _elements(shard(_with_policy(tf.data.Dataset.range(6), Policy.FILE),
                      2, 0, 4))


# --- DATA.


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_data_policy_gives_every_wth_element(num_workers):
  """Worker i gets elements i, i + W, ... of the dataset."""
  shards = _shards(lambda: tf.data.Dataset.range(10), Policy.DATA, num_workers)
  assert shards == [list(range(index, 10, num_workers))
                    for index in range(num_workers)]
  _assert_partition(shards, range(10))


@pytest.mark.parametrize("num_workers, expected", [
    (2, [[b"f0-r0", b"f0-r2", b"f1-r1", b"f2-r0", b"f2-r2", b"f3-r1",
          b"f4-r0", b"f4-r2", b"f5-r1"],
         [b"f0-r1", b"f1-r0", b"f1-r2", b"f2-r1", b"f3-r0", b"f3-r2",
          b"f4-r1", b"f5-r0", b"f5-r2"]]),
    (3, [[f"f{f}-r{r}".encode() for f in range(NUM_FILES)] for r in range(3)]),
])
def test_data_policy_on_files_shards_records_not_files(files, num_workers,
                                                       expected):
  """DATA ignores file boundaries: every worker reads every file."""
  shards = _shards(lambda: tf.data.TFRecordDataset(files["tfrecord"]),
                   Policy.DATA, num_workers)
  assert shards == expected
  assert shards == [ALL_RECORDS[index::num_workers]
                    for index in range(num_workers)]


@pytest.mark.parametrize("num_replicas", [1, 8])
@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_data_policy_on_batches_gives_every_wth_batch(num_workers,
                                                      num_replicas):
  """A batched dataset is sharded by whole batches, whatever the replicas."""
  shards = _shards(lambda: tf.data.Dataset.range(24).batch(4), Policy.DATA,
                   num_workers, num_replicas)
  batches = [list(range(k, k + 4)) for k in range(0, 24, 4)]
  assert shards == [batches[index::num_workers] for index in range(num_workers)]
  _assert_partition(shards, batches)


def test_data_policy_on_structured_elements():
  """Dicts, tuples and ragged elements keep their structure and spec."""
  def make():
    return tf.data.Dataset.range(6).map(lambda i: {
        "x": i, "pair": (tf.strings.as_string(i), tf.range(i % 3))})

  dataset = _with_policy(make(), Policy.DATA)
  sharded = auto_shard(dataset, 2, 1, 4)
  assert sharded.element_spec == dataset.element_spec
  assert _shards(make, Policy.DATA, 2)[1] == [
      {"x": 1, "pair": (b"1", [0])},
      {"x": 3, "pair": (b"3", [])},
      {"x": 5, "pair": (b"5", [0, 1])}]
  ragged = lambda: tf.data.Dataset.from_tensor_slices(
      tf.ragged.constant([[1], [2, 3], [], [4, 5, 6], [7], [8, 9]]))
  assert _shards(ragged, Policy.DATA, 3) == [[[1], [4, 5, 6]], [[2, 3], [7]],
                                              [[], [8, 9]]]


def test_sharded_dataset_keeps_its_options():
  """The policy and other options of the input carry over to the shard."""
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = Policy.DATA
  options.deterministic = False
  options.threading.private_threadpool_size = 3
  sharded = auto_shard(tf.data.Dataset.range(6).with_options(options), 2, 0, 4)
  assert sharded.options().experimental_distribute.auto_shard_policy == Policy.DATA
  assert sharded.options().deterministic is False
  assert sharded.options().threading.private_threadpool_size == 3
  assert int(sharded.cardinality()) == 3


# --- AUTO.


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
@pytest.mark.parametrize("source", ["tfrecord_list", "text_list"])
def test_auto_policy_shards_file_datasets_by_file(files, source, num_workers):
  """AUTO on a file reader is FILE: worker i gets files i, i + W, ..."""
  shards = _shards(lambda: FILE_SOURCES[source](files), Policy.AUTO,
                   num_workers)
  assert shards == [_records(range(index, NUM_FILES, num_workers))
                    for index in range(num_workers)]


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_auto_policy_falls_back_to_data_without_files(num_workers):
  """AUTO on `range` (no files) is DATA: elements, or batches, i, i + W, ..."""
  assert _shards(lambda: tf.data.Dataset.range(10), Policy.AUTO,
                 num_workers) == [list(range(index, 10, num_workers))
                                  for index in range(num_workers)]
  batches = [list(range(k, k + 4)) for k in range(0, 24, 4)]
  assert _shards(lambda: tf.data.Dataset.range(24).batch(4), Policy.AUTO,
                 num_workers) == [batches[index::num_workers]
                                  for index in range(num_workers)]


def test_auto_is_the_default_policy(files):
  """A dataset without options is sharded by file, as AUTO does."""
  dataset = tf.data.TFRecordDataset(files["tfrecord"])
  assert dataset.options().experimental_distribute.auto_shard_policy == Policy.AUTO
  assert _elements(auto_shard(dataset, 2, 1, 4)) == _records([1, 3, 5])


# --- HINT.


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_hint_policy_replaces_the_placeholder(num_workers):
  """`shard(SHARD_HINT, SHARD_HINT)` becomes `shard(W, i)`."""
  shards = _shards(
      lambda: tf.data.Dataset.range(12).shard(SHARD_HINT, SHARD_HINT),
      Policy.HINT, num_workers)
  assert shards == [list(range(index, 12, num_workers))
                    for index in range(num_workers)]


def test_hint_policy_leaves_explicit_shards_alone():
  """Only the placeholder changes; an explicit `shard(2, 0)` stays as it is."""
  shards = _shards(
      lambda: tf.data.Dataset.range(24).shard(2, 0).shard(SHARD_HINT,
                                                          SHARD_HINT),
      Policy.HINT, 3)
  assert shards == [[0, 6, 12, 18], [2, 8, 14, 20], [4, 10, 16, 22]]


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_hint_policy_on_a_file_list(files, num_workers):
  """A placeholder on the file names shards by file."""
  shards = _shards(
      lambda: tf.data.Dataset.from_tensor_slices(files["tfrecord"]).shard(
          SHARD_HINT, SHARD_HINT).flat_map(tf.data.TFRecordDataset),
      Policy.HINT, num_workers)
  assert shards == [_records(range(index, NUM_FILES, num_workers))
                    for index in range(num_workers)]


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
@pytest.mark.parametrize("source", ["range", "tfrecord_list"])
def test_hint_policy_without_placeholder_keeps_everything(files, source,
                                                          num_workers):
  """Without a placeholder HINT shards nothing, not even files."""
  if source == "range":
    make, everything = (lambda: tf.data.Dataset.range(10)), list(range(10))
  else:
    make, everything = (lambda: FILE_SOURCES[source](files)), ALL_RECORDS
  assert _shards(make, Policy.HINT, num_workers) == [everything] * num_workers


@pytest.mark.parametrize("policy", [Policy.DATA, Policy.AUTO, Policy.OFF],
                         ids=lambda policy: policy.name)
def test_placeholder_outside_hint_policy_fails(policy):
  """Other policies leave the placeholder unfilled, so reading fails."""
  for shard in (auto_shard, _tf_auto_shard):
    dataset = shard(_with_policy(
        tf.data.Dataset.range(12).shard(SHARD_HINT, SHARD_HINT), policy),
                    2, 0, 4)
    with pytest.raises(tf.errors.FailedPreconditionError):
      _elements(dataset)


# --- OFF, one worker, invalid workers.


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
@pytest.mark.parametrize("source", ["range", "tfrecord_list"])
def test_off_policy_gives_every_worker_everything(files, source, num_workers):
  """OFF returns the dataset itself to every worker."""
  if source == "range":
    make, everything = (lambda: tf.data.Dataset.range(10)), list(range(10))
  else:
    make, everything = (lambda: FILE_SOURCES[source](files)), ALL_RECORDS
  assert _shards(make, Policy.OFF, num_workers) == [everything] * num_workers
  dataset = _with_policy(make(), Policy.OFF)
  assert all(auto_shard(dataset, num_workers, index, 4) is dataset
             for index in range(num_workers))


@pytest.mark.parametrize("policy", [Policy.FILE, Policy.DATA, Policy.AUTO,
                                    Policy.HINT, Policy.OFF],
                         ids=lambda policy: policy.name)
def test_one_worker_returns_the_dataset_unchanged(files, policy):
  """With one worker there is nothing to shard, whatever the policy."""
  for make in (lambda: tf.data.Dataset.range(5),
               lambda: tf.data.TFRecordDataset(files["tfrecord"])):
    dataset = _with_policy(make(), policy)
    assert auto_shard(dataset, 1, 0, 4) is dataset
  assert _elements(auto_shard(_with_policy(tf.data.Dataset.range(5), policy),
                              1, 0, 1)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("policy", [Policy.DATA, Policy.OFF],
                         ids=lambda policy: policy.name)
@pytest.mark.parametrize("num_workers, worker_index",
                         [(2, -1), (2, 2), (3, 3), (3, 7), (1, 1)])
def test_invalid_worker_index_raises(policy, num_workers, worker_index):
  """`worker_index` outside [0, num_workers) is a ValueError, for any policy."""
  dataset = _with_policy(tf.data.Dataset.range(6), policy)
  with pytest.raises(ValueError, match=(
      rf"`worker_index` must be in \[0, {num_workers}\); "
      rf"got {worker_index}\.")):
    auto_shard(dataset, num_workers, worker_index, 4)


# --- Through distribute_dataset: each worker's pieces of every global batch.


def _tf_worker_pieces(dataset, num_workers, index):
  """TensorFlow's own input pipeline of worker `index` (4 replicas) in a
  multi-worker strategy: its stream of per-replica pieces."""
  from tensorflow.python.distribute import input_lib as tf_input_lib  # pylint: disable=g-import-not-at-top
  workers = tf_input_lib.InputWorkers([(DEVICES[0], DEVICES)])
  context = tf.distribute.InputContext(num_workers, index, len(DEVICES) * num_workers)
  dist = tf_input_lib.DistributedDataset(
      workers, oracle.tf_mirrored(), dataset,
      num_replicas_in_sync=len(DEVICES) * num_workers, input_context=context)
  return [_to_python(x) for x in dist._cloned_datasets[0]]  # pylint: disable=protected-access


def _distributed_steps(dataset, num_workers, index):
  """Worker `index`'s steps: per step, each of its 4 replicas' parts."""
  context = tfd.InputContext(num_input_pipelines=num_workers,
                             input_pipeline_id=index,
                             num_replicas_in_sync=len(DEVICES) * num_workers)
  dist = input_lib.distribute_dataset(dataset, DEVICES, host=DEVICES[0],
                                      input_context=context)
  steps = []
  for step in dist:
    assert [part.device for part in step.values] == list(DEVICES)
    steps.append([_to_python(part) for part in step.values])
  return steps


def _check_distributed(make_dataset, policy, num_workers):
  """Per worker, its replicas' parts are TensorFlow's pieces for it, in
  order (a last step padded with empty parts). Returns each worker's steps."""
  all_steps = []
  for index in range(num_workers):
    steps = _distributed_steps(_with_policy(make_dataset(), policy), num_workers, index)
    expected = _tf_worker_pieces(_with_policy(make_dataset(), policy), num_workers, index)
    parts = [part for step in steps for part in step]
    assert parts[:len(expected)] == expected
    assert all(part == [] for part in parts[len(expected):])
    all_steps.append(steps)
  return all_steps


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_distribute_dataset_data_policy(num_workers):
  """Every global batch of 24 is cut into one piece per replica of the
  cluster; worker i's replica r gets piece i + r * workers."""
  all_steps = _check_distributed(lambda: tf.data.Dataset.range(72).batch(24),
                                 Policy.DATA, num_workers)
  size = 24 // (len(DEVICES) * num_workers)
  for index, steps in enumerate(all_steps):
    assert steps == [[list(range(24 * b + size * (index + num_workers * r),
                                 24 * b + size * (index + num_workers * r + 1)))
                      for r in range(len(DEVICES))] for b in range(3)]
  _assert_partition([[x for step in steps for part in step for x in part]
                     for steps in all_steps], range(72))


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_distribute_dataset_file_policy(files, num_workers):
  """Each worker cuts batches of 4 of its own files' records into pieces."""
  all_steps = _check_distributed(
      lambda: tf.data.TFRecordDataset(files["tfrecord"]).batch(4), Policy.FILE,
      num_workers)
  for index, steps in enumerate(all_steps):
    records = [x for step in steps for part in step for x in part]
    assert records == _records(range(index, NUM_FILES, num_workers))


def test_distribute_dataset_auto_policy_on_text_files(files):
  """AUTO shards text files by file: worker 1 of 2 reads files 1, 3 and 5,
  each batch of 4 cut into pieces for the cluster's 8 replicas."""
  steps = _check_distributed(
      lambda: tf.data.Dataset.list_files(
          files["dir"] + "/*.txt", shuffle=False).flat_map(
              tf.data.TextLineDataset).batch(4), Policy.AUTO, 2)[1]
  assert [x for step in steps for part in step for x in part] == _records([1, 3, 5])


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_distribute_dataset_off_policy(num_workers):
  """With OFF every worker cuts every global batch into pieces and reads
  them all."""
  all_steps = _check_distributed(lambda: tf.data.Dataset.range(16).batch(8),
                                 Policy.OFF, num_workers)
  for steps in all_steps:
    assert sorted(x for step in steps for part in step for x in part) == list(range(16))


def test_distribute_dataset_one_worker_is_not_sharded():
  """An `InputContext` with one pipeline changes nothing."""
  dataset = _with_policy(tf.data.Dataset.range(16).batch(8), Policy.DATA)
  steps = _distributed_steps(dataset, 1, 0)
  assert steps == [[[0, 1], [2, 3], [4, 5], [6, 7]],
                   [[8, 9], [10, 11], [12, 13], [14, 15]]]
  dist = input_lib.distribute_dataset(dataset, DEVICES, host=DEVICES[0])
  assert [[_to_python(p) for p in step.values] for step in dist] == steps


def test_distribute_dataset_hint_policy():
  """HINT fills the placeholder before the global batches are cut."""
  _check_distributed(lambda: tf.data.Dataset.range(24).shard(
      SHARD_HINT, SHARD_HINT).batch(4), Policy.HINT, 3)


@pytest.mark.parametrize("make_dataset", [
    lambda: tf.data.Dataset.range(21).batch(7),
    lambda: tf.data.Dataset.range(20).batch(6, drop_remainder=True),
    lambda: tf.data.Dataset.range(30).filter(lambda x: x % 3 > 0).batch(5),
], ids=["uneven", "drop_remainder", "batch_size_known_at_run_time"])
@pytest.mark.parametrize("policy", [Policy.AUTO, Policy.OFF])
def test_worker_share_cuts_global_batches_as_tensorflow(make_dataset, policy):
  for num_workers in WORKER_COUNTS:
    for index in range(num_workers):
      ours = _elements(worker_share(_with_policy(make_dataset(), policy), num_workers,
                                    index, len(DEVICES) * num_workers))
      assert ours == _tf_worker_pieces(_with_policy(make_dataset(), policy),
                                       num_workers, index)


def test_piece_sizes_add_up_to_the_global_batch_on_every_step():
  """Each step takes one piece per replica from every worker: together the
  pieces of one step are one global batch."""
  sizes = [piece_sizes(7, 2, 2, w) for w in range(2)]
  assert sizes == [[2, 2, 2, 1], [2, 1, 2, 2]]
  assert sum(sizes[0][:2]) + sum(sizes[1][:2]) == 7
  dynamic = piece_sizes(tf.constant(7, tf.int64), 2, 2, 1)
  assert dynamic.numpy().tolist() == [2, 1, 2, 2]


def test_worker_share_needs_as_many_replicas_on_every_worker():
  with pytest.raises(ValueError, match=r"`num_replicas_in_sync` \(5\)"):
    worker_share(tf.data.Dataset.range(8).batch(4), 2, 0, 5)
