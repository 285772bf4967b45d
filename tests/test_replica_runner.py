"""The replica runner's failure paths, against TensorFlow's MirroredStrategy
on 4 CPUs: replicas that call `merge_call` unevenly, that create different
variables, or one that fails while the others are parked at `merge_call`.
Each raises TensorFlow's exception class, eagerly and in a `tf.function`;
tfd's error says which replica, and the strategy runs on afterwards."""

import threading

import pytest
import tensorflow as tf

import oracle
from oracle import TF, TFD


def _replica_id(a):
  """This replica's id as a Python int."""
  return tf.get_static_value(a.mod.get_replica_context().replica_id_in_sync_group)


def _merge(a):
  a.mod.get_replica_context().merge_call(lambda strategy: None)


def _run(a, replica_fn):
  return a.mirrored.run(lambda: replica_fn(a))


def _run_in_scope(a, replica_fn):
  with a.mirrored.scope():
    return _run(a, replica_fn)


def _fails_naming_the_replica(replica_fn, replica, run_mode, run=_run):
  """`run(a, replica_fn)` raises the same exception class with TF and tfd;
  tfd's says it concerns `replica` (in its message or, for
  the replica's own exception, in a note); the strategy's next run then
  all-reduces as before, and no replica thread is left running."""
  before = set(threading.enumerate())
  raised = oracle.compare(run, (TF, replica_fn), (TFD, replica_fn), run_mode, ours=True)
  assert isinstance(raised, oracle.Raised), raised
  said = "\n".join([raised.message] + getattr(raised.error, "__notes__", []))
  assert f"replica {replica}" in said.lower(), said
  summed = oracle.compare(
      lambda a: a.mirrored.experimental_local_results(a.mirrored.run(
          lambda: a.mod.get_replica_context().all_reduce("SUM", a.replica_id() + 1.0))),
      (TF,), (TFD,), run_mode, alike=oracle.same_repr, ours=True)
  assert [float(v) for v in summed] == [10.0] * 4
  for thread in set(threading.enumerate()) - before:
    if thread.name.startswith("replica_"):
      thread.join(timeout=30)
      assert not thread.is_alive(), thread.name
  return raised


@pytest.mark.parametrize("calls", ["more", "fewer"])
def test_uneven_merge_calls_raise_naming_the_replica(calls, run_mode):
  """Replica 2 calls `merge_call` once more, or once less, than the others."""
  def replica_fn(a):
    _merge(a)
    if (_replica_id(a) == 2) == (calls == "more"):
      _merge(a)
    return tf.constant(1.0)
  raised = _fails_naming_the_replica(replica_fn, 2, run_mode)
  assert raised == RuntimeError
  assert "merge_call" in raised.message


@pytest.mark.parametrize("after_merge", [False, True], ids=["on_the_caller", "on_threads"])
def test_replicas_creating_different_variables_raise_naming_the_replica(after_merge, run_mode):
  """Replica 2 names its variable differently: TensorFlow's RuntimeError,
  before any `merge_call` (replicas run one after another on the caller's
  thread) and after one (each replica on a thread of its own)."""
  def replica_fn(a):
    if after_merge:
      _merge(a)
    v = tf.Variable(1.0, name="other" if _replica_id(a) == 2 else "v")
    return tf.identity(v)
  raised = _fails_naming_the_replica(replica_fn, 2, run_mode, _run_in_scope)
  assert raised == RuntimeError
  assert "mismatching name" in raised.message


@pytest.mark.parametrize("failing", [0, 2])
def test_a_replica_failing_while_the_others_wait_at_merge_call(failing, run_mode):
  """After a first `merge_call`, replica `failing` raises while the others
  go on to a second one, where they wait: its own exception comes out."""
  def replica_fn(a):
    _merge(a)
    if _replica_id(a) == failing:
      raise ValueError("this replica's input is bad")
    _merge(a)
    return tf.constant(1.0)
  raised = _fails_naming_the_replica(replica_fn, failing, run_mode)
  assert raised == ValueError
  assert "this replica's input is bad" in raised.message
