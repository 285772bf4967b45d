"""Partitioners give TF's shard counts for every shape, dtype and axis TF
handles, one shard where TF fails on a valid shape, and TF's error classes."""

import inspect
import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_distribute_lite as tfd

OURS = tfd.experimental.partitioners
THEIRS = tf.distribute.experimental.partitioners

SHAPES = [[7], [1], [6, 1], [10, 3], [3, 5, 2], [1024, 1024], [100000, 64],
          [33, 17, 9, 4], [2, 300000], [65536, 1]]
DTYPES = [tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int8, tf.uint16,
          tf.int64, tf.bool, tf.complex128, tf.string, "float32", np.int32]
AXES = [0, 1, -1, -2]

# Arguments of each partitioner, TF's docstring examples among them.
CONFIGS = {
    "FixedShardsPartitioner": [(1,), (2,), (3,), (7,), (1000,)],
    "MinSizePartitioner": [(), (4, 2), (4, 10), (256 << 10, 8), (1000, 100),
                           (2.5, 3), (1, 1000, 3), (100, 4, 1)],
    "MaxSizePartitioner": [(4,), (4, 2), (1024,), ((64 << 20) - 1,),
                           (100, None), (7.5, 5), (1, None, 1), (64, 3, 50),
                           (48, 0)],
}


def _shapes_and_axes():
  for dims, axis in itertools.product(SHAPES, AXES):
    if -len(dims) <= axis < len(dims):
      yield tf.TensorShape(dims), axis


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_shard_counts_match_tf(name):
  checked = 0
  for args in CONFIGS[name]:
    ours, theirs = getattr(OURS, name)(*args), getattr(THEIRS, name)(*args)
    for (shape, axis), dtype in itertools.product(_shapes_and_axes(), DTYPES):
      expected = theirs(shape, dtype, axis=axis)
      actual = ours(shape, dtype, axis=axis)
      assert actual == expected, (name, args, shape, dtype, axis)
      assert all(type(n) is int for n in actual)
      checked += 1
  assert checked > 1000


def test_docstring_examples_give_tfs_numbers():
  shape = tf.TensorShape([6, 1])
  for ours, theirs in [
      (OURS.FixedShardsPartitioner(num_shards=2),
       THEIRS.FixedShardsPartitioner(num_shards=2)),
      (OURS.MinSizePartitioner(min_shard_bytes=4, max_shards=2),
       THEIRS.MinSizePartitioner(min_shard_bytes=4, max_shards=2)),
      (OURS.MaxSizePartitioner(max_shard_bytes=4, max_shards=2),
       THEIRS.MaxSizePartitioner(max_shard_bytes=4, max_shards=2))]:
    assert ours(shape, tf.float32) == theirs(shape, tf.float32) == [2, 1]
  assert OURS.FixedShardsPartitioner(2)(tf.TensorShape([10, 3]), tf.float32) == [2, 1]
  assert OURS.MinSizePartitioner(4, 10)(shape, tf.float32) == [6, 1]
  assert OURS.MaxSizePartitioner(4)(shape, tf.float32) == [6, 1]
  assert OURS.MaxSizePartitioner(1024)(shape, tf.float32) == [1, 1]


def test_a_shape_may_be_a_list():
  """TF 2.21 wants a `tf.TensorShape`; anything it takes does here."""
  for partitioner in [OURS.FixedShardsPartitioner(2),
                      OURS.MinSizePartitioner(4, 3),
                      OURS.MaxSizePartitioner(8)]:
    assert partitioner([6, 2], tf.float32) == partitioner(
        tf.TensorShape([6, 2]), tf.float32)


@pytest.mark.parametrize("dims, dtype", [
    ([0, 3], tf.float32), ([6, 0], tf.float32), ([6, 2], tf.resource),
    ([6, 2], tf.variant)])
def test_empty_slices_get_one_shard(dims, dtype):
  """Where TF 2.21's MaxSizePartitioner divides by zero."""
  shape = tf.TensorShape(dims)
  assert OURS.MaxSizePartitioner(8, 5)(shape, dtype) == [1, 1]
  assert OURS.MinSizePartitioner(4, 3)(shape, dtype) == THEIRS.MinSizePartitioner(
      4, 3)(shape, dtype) == [1, 1]
  with pytest.raises(ZeroDivisionError):
    THEIRS.MaxSizePartitioner(8, 5)(shape, dtype)


def test_an_empty_axis_gets_one_fixed_shard():
  """Where TF 2.21 answers 0 shards."""
  shape = tf.TensorShape([0, 3])
  assert OURS.FixedShardsPartitioner(2)(shape, tf.float32) == [1, 1]
  assert THEIRS.FixedShardsPartitioner(2)(shape, tf.float32) == [0, 1]
  assert OURS.FixedShardsPartitioner(2)(tf.TensorShape([6, 0]), tf.float32) == [2, 1]


def test_fixed_shards_ignore_unknown_other_axes():
  shape = tf.TensorShape([6, None])
  assert OURS.FixedShardsPartitioner(4)(shape, tf.float32) == THEIRS.FixedShardsPartitioner(4)(
      shape, tf.float32) == [4, 1]


@pytest.mark.parametrize("name, args, kwargs, error, argument", [
    ("MinSizePartitioner", (0,), {}, ValueError, "min_shard_bytes"),
    ("MinSizePartitioner", (), {"max_shards": 0}, ValueError, "max_shards"),
    ("MinSizePartitioner", (), {"bytes_per_string": 0}, ValueError, "bytes_per_string"),
    ("MinSizePartitioner", (None,), {}, TypeError, "min_shard_bytes"),
    ("MaxSizePartitioner", (0,), {}, ValueError, "max_shard_bytes"),
    ("MaxSizePartitioner", (0.5,), {}, ValueError, "max_shard_bytes"),
    ("MaxSizePartitioner", (4, -1), {}, ValueError, "max_shards"),
    ("MaxSizePartitioner", (4,), {"bytes_per_string": 0}, ValueError, "bytes_per_string"),
    ("MaxSizePartitioner", (None,), {}, TypeError, "max_shard_bytes"),
])
def test_bad_constructor_arguments_raise_like_tf(name, args, kwargs, error,
                                                 argument):
  with pytest.raises(error):
    getattr(THEIRS, name)(*args, **kwargs)
  with pytest.raises(error, match=f"`{argument}`.*Received: {argument}="):
    getattr(OURS, name)(*args, **kwargs)


@pytest.mark.parametrize("make, error", [
    (lambda: OURS.FixedShardsPartitioner(0), ValueError),
    (lambda: OURS.FixedShardsPartitioner(-2), ValueError),
    (lambda: OURS.FixedShardsPartitioner(2.5), TypeError),
    (lambda: OURS.FixedShardsPartitioner(None), TypeError),
    (lambda: OURS.MinSizePartitioner(4, 2.5), TypeError),
    (lambda: OURS.MaxSizePartitioner(4, 2.5), TypeError),
])
def test_shard_counts_must_be_positive_integers(make, error):
  """TF 2.21 takes these and answers with them (0 or 2.5 shards)."""
  with pytest.raises(error, match="Received: "):
    make()


def _partitioner_pairs():
  return [(getattr(OURS, name)(*CONFIGS[name][1]),
           getattr(THEIRS, name)(*CONFIGS[name][1])) for name in sorted(CONFIGS)]


def _raised(call):
  with pytest.raises(Exception) as error:  # pylint: disable=broad-except
    call()
  return error.value


@pytest.mark.parametrize("shape, dtype, axis", [
    (tf.TensorShape([6, 2]), tf.float32, 2),
    (tf.TensorShape([6, 2]), tf.float32, -3),
    (tf.TensorShape([]), tf.float32, 0),
])
def test_axis_out_of_range_raises_tfs_class(shape, dtype, axis):
  """TF raises `IndexError` or `ValueError`, by partitioner; ours is both."""
  for ours, theirs in _partitioner_pairs():
    their_error = _raised(lambda: theirs(shape, dtype, axis=axis))  # pylint: disable=cell-var-from-loop
    assert isinstance(their_error, (IndexError, ValueError))
    with pytest.raises(type(their_error), match=f"Received: axis={axis}"):
      ours(shape, dtype, axis=axis)


@pytest.mark.parametrize("shape, dtype, axis, error", [
    (tf.TensorShape(None), tf.float32, 0, ValueError),
    (tf.TensorShape([6, 2]), tf.float32, 1.0, TypeError),
])
def test_unknown_rank_and_float_axis_raise_like_tf(shape, dtype, axis, error):
  for ours, theirs in _partitioner_pairs():
    with pytest.raises(error):
      theirs(shape, dtype, axis=axis)
    with pytest.raises(error):
      ours(shape, dtype, axis=axis)


def test_bad_dtype_raises_like_tf():
  for ours, theirs in _partitioner_pairs()[1:]:  # Fixed shards ignore dtypes.
    for dtype in ["nope", None]:
      with pytest.raises(TypeError):
        theirs(tf.TensorShape([6, 2]), dtype)
      with pytest.raises(TypeError):
        ours(tf.TensorShape([6, 2]), dtype)
  assert OURS.FixedShardsPartitioner(2)(tf.TensorShape([6, 2]), None) == [2, 1]


@pytest.mark.parametrize("dims", [[None, 2], [6, None]])
def test_unknown_lengths_raise_value_error(dims):
  shape = tf.TensorShape(dims)
  with pytest.raises(ValueError, match="not fully defined"):
    OURS.MinSizePartitioner(4, 3)(shape, tf.float32)
  with pytest.raises(ValueError, match="not fully defined"):
    OURS.MaxSizePartitioner(8)(shape, tf.float32)
  with pytest.raises(ValueError):
    THEIRS.MaxSizePartitioner(8)(shape, tf.float32)
  if dims[0] is None:
    with pytest.raises(ValueError, match="not known along axis 0"):
      OURS.FixedShardsPartitioner(2)(shape, tf.float32)


def test_base_class_must_be_implemented():
  for module in (OURS, THEIRS):
    with pytest.raises(NotImplementedError):
      module.Partitioner()(tf.TensorShape([2]), tf.float32)

  class EveryRow(OURS.Partitioner):
    def __call__(self, shape, dtype, axis=0):
      return [shape[0]] + [1] * (shape.rank - 1)
  assert EveryRow()(tf.TensorShape([3, 2]), tf.float32) == [3, 1]


@pytest.mark.parametrize("name", sorted(CONFIGS) + ["Partitioner"])
def test_classes_signatures_and_reprs_match_tf(name):
  ours, theirs = getattr(OURS, name), getattr(THEIRS, name)
  assert issubclass(ours, OURS.Partitioner)
  for method in ["__init__", "__call__"]:
    our_signature = inspect.signature(getattr(ours, method))
    their_signature = inspect.signature(getattr(theirs, method))
    assert list(our_signature.parameters) == list(their_signature.parameters)
    assert [p.default for p in our_signature.parameters.values()] == [
        p.default for p in their_signature.parameters.values()]
  args = CONFIGS.get(name, [()])[0]
  our_repr, their_repr = repr(ours(*args)), repr(theirs(*args))
  assert our_repr.startswith(f"<tf_distribute_lite.partitioners.{name} object at ")
  assert their_repr.startswith(f"<tensorflow.python.distribute.sharded_variable.{name} object at ")
