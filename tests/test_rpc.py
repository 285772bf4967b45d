"""`tfd.experimental.rpc` against `tf.distribute.experimental.rpc`: the same
programs, with servers in this process on free 127.0.0.1 ports, give the
same values, error codes and exception classes; where TF 2.21 fails on
valid use, ours does what TF documents.

Every client is made with a timeout, so no wait is unbounded; a method that
blocks waits on a queue that the test closes whatever happens.
"""

import contextlib
import gc
import inspect
import re
import sys

import pytest
import tensorflow as tf

import tf_distribute_lite as tfd
from tf_distribute_lite import _tf_bridge

from multi_worker import free_ports

OURS = tfd.experimental.rpc
THEIRS = tf.distribute.experimental.rpc

pytestmark = pytest.mark.filterwarnings(
    "ignore:Encoding a StructuredValue with type tf.NoneTensorSpec")  # TF's, on None outputs

TIMEOUT_MS = 10000
OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 3, 4


@tf.function(input_signature=[tf.TensorSpec([], tf.int32),
                              tf.TensorSpec([None], tf.float32)])
def scale(k, x):
  return {"scaled": x * tf.cast(k, tf.float32),
          "parts": (k + 1, [tf.reduce_sum(x), tf.shape(x)[0]])}


SCALE_SPECS = {"scaled": tf.TensorSpec([None], tf.float32),
               "parts": (tf.TensorSpec([], tf.int32),
                         [tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)])}


@tf.function(input_signature=[{"a": tf.TensorSpec([], tf.int64),
                               "b": tf.TensorSpec([], tf.int64)}])
def add_pair(pair):
  return pair["a"] + pair["b"]


@tf.function(input_signature=[])
def seven():
  return tf.constant(7)


@tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
def nothing(x):
  del x


METHODS = {"scale": scale, "add_pair": add_pair, "seven": seven, "nothing": nothing}


def _address():
  return f"127.0.0.1:{free_ports(1)[0]}"


def _serve(rpc, methods=None):
  """A started server of `methods` (by default METHODS), and its address."""
  address = _address()
  server = rpc.Server.create("grpc", address)
  for name, function in (methods or METHODS).items():
    server.register(name, function)
  server.start()
  return server, address


@pytest.fixture(name="rpc", params=[THEIRS, OURS], ids=["tf", "tfd"])
def _rpc(request):
  """TensorFlow's RPC module, then ours."""
  return request.param


@pytest.fixture(name="served")
def _served(rpc):
  """(rpc module, server, client) on METHODS."""
  server, address = _serve(rpc)
  return rpc, server, rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)


def _plain(structure):
  return tf.nest.map_structure(lambda t: None if t is None else t.numpy().tolist(),
                               structure)


def _error(result):
  """(code, the server's message without its function name): comparable
  between processes' function counters."""
  code, message = result.get_error()
  first_line = message.numpy().decode().split("\n")[0]
  return int(code), re.sub(r"^\{\{function_node [^}]*\}\} ", "", first_line)


@pytest.mark.parametrize("name", ["Server", "Client"])
def test_names_are_classes_with_tensorflows_methods_and_signatures(name):
  ours, theirs = getattr(OURS, name), getattr(THEIRS, name)
  assert ours.__name__ == theirs.__name__ and inspect.isclass(ours)
  public = lambda c: sorted(n for n in vars(c) if not n.startswith("_"))
  assert public(ours) == public(theirs)
  for method in public(theirs):
    ours_params = inspect.signature(getattr(ours, method)).parameters.values()
    theirs_params = inspect.signature(getattr(theirs, method)).parameters.values()
    assert [(p.name, p.default) for p in ours_params] == [
        (p.name, p.default) for p in theirs_params], method


def test_made_objects_are_grpc_classes(served):
  rpc, server, client = served
  assert type(server).__name__ == "GrpcServer" and isinstance(server, rpc.Server)
  assert type(client).__name__ == "GrpcClient" and isinstance(client, rpc.Client)
  assert repr(client).startswith(f"<{type(client).__module__}.GrpcClient object at 0x")
  result = client.seven()
  assert type(result).__name__ == "StatusOrResult"
  assert int(result.get_value()) == 7  # (a TF client going with a call in flight may crash)


def _several_args_and_nested_outputs(rpc, run_mode):
  server, address = _serve(rpc)
  client = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)

  def program():
    k, x = tf.constant(3), tf.constant([1.0, 2.0])
    by_call = client.call("scale", [k, x], output_specs=SCALE_SPECS)
    by_attribute = client.scale(k, x)
    return (by_call.is_ok(), by_call.get_error()[0], by_call.get_value(),
            by_attribute.get_value(),
            client.add_pair({"a": tf.constant(5, tf.int64), "b": tf.constant(6, tf.int64)}
                            ).get_value(),
            client.seven().get_value())

  values = _plain(run_mode(program))
  del server
  return values


def test_calls_with_several_args_and_nested_outputs(rpc, run_mode):
  scaled = {"scaled": [3.0, 6.0], "parts": (4, [3.0, 2])}
  expected = (True, OK, scaled, scaled, 11, 7)
  assert _several_args_and_nested_outputs(rpc, run_mode) == expected


def test_registered_methods_are_client_attributes(served):
  rpc, _, client = served
  for name in METHODS:
    assert callable(getattr(client, name)) and callable(getattr(client, f"{name}_blocking"))
    assert getattr(client, name).__doc__ == (
        f"RPC Call for {name} method to server {client._server_address}")  # pylint: disable=protected-access
  assert client.nothing(tf.constant(1)).get_value() is None
  assert client.nothing_blocking(tf.constant(1)) is None
  with pytest.raises(AttributeError):
    client.missing  # pylint: disable=pointless-statement


@pytest.mark.parametrize("args", [
    (tf.constant(1),),
    (tf.constant(1), tf.constant([1.0]), tf.constant(2)),
    ([tf.constant(1), tf.constant([1.0])],),
], ids=["too_few", "too_many", "one_list"])
def test_client_attributes_check_the_number_of_arguments(served, args):
  _, _, client = served
  with pytest.raises(ValueError):
    client.scale(*args)


def test_a_dict_argument_given_as_a_list_is_a_type_error(served):
  _, _, client = served
  with pytest.raises(TypeError):
    client.add_pair([tf.constant(1, tf.int64), tf.constant(2, tf.int64)])


def test_unknown_method(served, run_mode):
  _, _, client = served

  def program():
    result = client.call("missing", [tf.constant(1)])
    return result.is_ok(), result.get_error()

  is_ok, (code, message) = run_mode(program)
  assert not bool(is_ok) and int(code) == INVALID_ARGUMENT
  assert message.numpy().decode().startswith("missing is not registered.")
  with pytest.raises(tf.errors.InvalidArgumentError, match="missing is not registered"):
    client.call("missing", output_specs=tf.TensorSpec([], tf.int32)).get_value()


@pytest.mark.parametrize("call, expected", [
    (lambda c: c.call("scale", [tf.constant(1.5), tf.constant([1.0])]),
     (INVALID_ARGUMENT, "Expects arg[0] to be int32 but float is provided")),
    (lambda c: c.scale(tf.constant(1), tf.constant([1], tf.int64)),
     (INVALID_ARGUMENT, "Expects arg[1] to be float but int64 is provided")),
    (lambda c: c.call("scale", [tf.constant(1)]),
     (INVALID_ARGUMENT, "index 1 is out of range [0, 1)")),
    (lambda c: c.call("add_pair"),
     (INVALID_ARGUMENT, "index 0 is out of range [0, 0)")),
    (lambda c: c.call("seven", [1, 2]), (OK, "")),  # extra arguments are dropped
], ids=["float_for_int", "int64_for_float", "too_few", "none", "extra"])
def test_calls_with_wrong_argument_types_or_counts(served, call, expected):
  _, _, client = served
  assert _error(call(client)) == expected


def test_wrong_output_specs_fail_in_get_value(served):
  _, _, client = served
  with pytest.raises(tf.errors.InvalidArgumentError, match="Type mismatch"):
    client.call("seven", output_specs=tf.TensorSpec([], tf.float32)).get_value()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="Incorrect number of output types"):
    client.call("seven", output_specs=[tf.TensorSpec([], tf.int32)] * 2).get_value()


def test_a_client_of_no_server_times_out(rpc):
  with pytest.raises(tf.errors.DeadlineExceededError):
    rpc.Client.create("grpc", _address(), timeout_in_ms=200)


def test_calls_to_a_stopped_server_time_out(rpc):
  server, address = _serve(rpc)
  client = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
  assert client.seven_blocking() == 7
  del server
  gc.collect()
  assert _error(client.seven(timeout_in_ms=200))[0] == DEADLINE_EXCEEDED
  with pytest.raises(tf.errors.DeadlineExceededError):
    rpc.Client.create("grpc", address, name="late", timeout_in_ms=200)


@contextlib.contextmanager
def _waiting_server(rpc):
  """A server whose method "wait" answers once the test enqueues a value;
  the queue is closed at the end, which releases a waiting call."""
  queue = tf.queue.FIFOQueue(3, tf.float32, shapes=[])

  @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
  def wait(x):
    return queue.dequeue() + x

  try:
    server, address = _serve(rpc, {"wait": wait})
    yield server, address, queue
  finally:
    queue.close(cancel_pending_enqueues=True)


def test_a_call_past_its_timeout_is_deadline_exceeded(rpc, run_mode):
  with _waiting_server(rpc) as (_, address, queue):
    client = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
    late = run_mode(lambda: client.wait(tf.constant(1.0), timeout_in_ms=100).get_error()[0])
    assert int(late) == DEADLINE_EXCEEDED
    short = rpc.Client.create("grpc", address, name="short", timeout_in_ms=100)
    assert _error(short.call("wait", [tf.constant(1.0)]))[0] == DEADLINE_EXCEEDED
    queue.enqueue_many([[5.0] * 3])  # for the timed-out calls and the next
    result = client.call("wait", [tf.constant(1.0)], tf.TensorSpec([], tf.float32))
    assert float(result.get_value()) == 6.0


def test_clients_and_servers_are_made_eagerly(rpc):
  _server, address = _serve(rpc)
  with pytest.raises(NotImplementedError):
    tf.function(lambda: rpc.Client.create("grpc", address, timeout_in_ms=200))()
  with pytest.raises(NotImplementedError):
    tf.function(lambda: rpc.Server.create("grpc", _address()))()


@pytest.mark.parametrize("make", [lambda rpc, a: rpc.Server.create("http", a),
                                  lambda rpc, a: rpc.Client.create("grpc2", a)],
                         ids=["server", "client"])
def test_only_grpc_is_an_rpc_layer(rpc, make):
  with pytest.raises(ValueError):
    make(rpc, _address())


def test_registering(rpc):
  server = rpc.Server.create("grpc", _address())
  with pytest.raises(ValueError):
    server.register("no_signature", tf.function(lambda x: x))
  with pytest.raises(ValueError):
    server.register("python", lambda: 1)
  server.register("no_arguments", tf.function(lambda: tf.constant(1)))
  server.register("concrete", tf.function(lambda x: x + 1).get_concrete_function(
      tf.TensorSpec([], tf.int32)))
  with pytest.raises(tf.errors.InvalidArgumentError, match="already registered"):
    server.register("concrete", seven)
  server.start()
  with pytest.raises(tf.errors.FailedPreconditionError):
    server.register("late", seven)


def test_bad_argument_types_are_type_errors(rpc, served):
  _, _, client = served
  with pytest.raises(TypeError):
    rpc.Client.create("grpc", 1234, timeout_in_ms=200)
  with pytest.raises(TypeError):
    rpc.Client.create("grpc", _address(), timeout_in_ms=0.5)
  with pytest.raises(TypeError):
    client.call(7)


@pytest.mark.parametrize("server_rpc, client_rpc", [(THEIRS, OURS), (OURS, THEIRS)],
                         ids=["tf_server", "tfd_server"])
def test_tensorflow_and_tfd_talk_to_each_other(server_rpc, client_rpc):
  _server, address = _serve(server_rpc)
  client = client_rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
  assert _plain(client.scale(tf.constant(2), tf.constant([1.0])).get_value()) == {
      "scaled": [2.0], "parts": (3, [1.0, 1])}
  pair = {"a": tf.constant(1, tf.int64), "b": tf.constant(2, tf.int64)}
  assert _plain(client.call("add_pair", pair, tf.TensorSpec([], tf.int64)).get_value()) == 3
  assert _plain(client.scale_blocking(tf.constant(2), tf.constant([1.0]))["parts"]) == (3, [1.0, 1])


def _destroyed(handle):
  try:
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=False)
  except tf.errors.NotFoundError:
    return True
  return False


def test_resources_go_with_their_objects(rpc):
  server, address = _serve(rpc)
  client = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
  futures = []

  @tf.function
  def call_in_function():
    result = client.call("seven", output_specs=tf.TensorSpec([], tf.int32))
    return result.get_value()

  assert int(call_in_function()) == 7
  result = client.seven()
  futures.append(result._status_or)  # pylint: disable=protected-access
  assert int(result.get_value()) == 7
  del result
  if rpc is OURS:
    handles = [client._resource.handle, server._resource.handle]  # pylint: disable=protected-access
  else:
    handles = [client._client_handle, server._server_handle]  # pylint: disable=protected-access
  del client, server
  gc.collect()
  assert [_destroyed(h) for h in futures + handles] == [True, True, True]


# --- Where TensorFlow 2.21 fails on valid use.

@pytest.mark.parametrize("rpc, expected", [
    (THEIRS, tf.errors.InvalidArgumentError),
    (OURS, [4, 3.0, 2, [3.0, 6.0]])], ids=["tf", "tfd"])  # "parts" before "scaled"
def test_without_output_specs_a_call_gives_the_flat_outputs(served, expected):
  _, _, client = served
  result = client.call("scale", [tf.constant(3), tf.constant([1.0, 2.0])])
  if isinstance(expected, type):
    with pytest.raises(expected, match="Incorrect number of output types"):
      result.get_value()
  else:
    assert _plain(result.get_value()) == expected
  assert client.call("nothing", [1]).get_value() is None


def test_a_none_inside_the_outputs(rpc):
  _server, address = _serve(rpc, {"partly": tf.function(
      lambda x: {"x": x, "none": None}, input_signature=[tf.TensorSpec([], tf.int32)])})
  client = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
  if rpc is THEIRS:
    with pytest.raises(AttributeError):
      client.partly(1).get_value()
  else:
    assert _plain(client.partly(1).get_value()) == {"x": 1, "none": None}


def test_a_clients_methods_keep_it(rpc):
  _server, address = _serve(rpc)
  seven = rpc.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS).seven
  gc.collect()
  if rpc is THEIRS:
    with pytest.raises(tf.errors.NotFoundError):
      seven()
  else:
    assert int(seven().get_value()) == 7


def test_clients_of_one_name_stay_apart(rpc):
  _server, address = _serve(rpc)
  first, second = [rpc.Client.create("grpc", address, name="same", timeout_in_ms=TIMEOUT_MS)
                   for _ in range(2)]
  assert [int(c.seven_blocking()) for c in (first, second)] == [7, 7]
  del first
  gc.collect()
  if rpc is THEIRS:
    with pytest.raises(tf.errors.NotFoundError):
      second.seven()
  else:
    assert int(second.seven_blocking()) == 7


def test_a_client_with_a_call_never_awaited_stays():
  """TF's client crashes the process when it goes during a call, as after
  dropping a call's result unawaited, then the client: ours stays."""
  with _waiting_server(OURS) as (_server, address, queue):
    client = OURS.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
    client.wait(tf.constant(1.0))  # in flight until enqueued
    handle = client._resource.handle  # pylint: disable=protected-access
    del client
    gc.collect()
    queue.enqueue_many([[5.0] * 2])
    kernels = _tf_bridge.rpc_kernels()
    future, deleter = kernels.rpc_call(handle, method_name="wait", args=[tf.constant(1.0)],
                                       timeout_in_ms=TIMEOUT_MS)
    assert int(kernels.rpc_check_status(future)[0]) == OK
    del deleter


def test_a_pending_call_keeps_its_client():
  """(In TF a call whose client goes may never answer, or crash the process:
  not run here.) Each client of the loop has the default name."""
  _server, address = _serve(OURS)
  for _ in range(5):
    client = OURS.Client.create("grpc", address, timeout_in_ms=TIMEOUT_MS)
    pending = client.call("seven", output_specs=tf.TensorSpec([], tf.int32))
    del client  # the last reference: no cycle holds a client
    assert int(pending.get_value()) == 7


def test_blocking_calls_raise_readable_errors(served):
  rpc, _, client = served
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    client.scale_blocking(tf.constant(1.5), tf.constant([1.0]))
  if rpc is THEIRS:
    with pytest.raises(TypeError, match="non-string"):
      str(raised.value)
  else:
    assert "Expects arg[0] to be int32 but float is provided" in str(raised.value)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # TF's clean-up
def test_blocking_calls_inside_a_function(served):
  rpc, _, client = served
  blocking = tf.function(lambda: client.scale_blocking(tf.constant(2), tf.constant([1.0])))
  if rpc is THEIRS:
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
      blocking()
  else:
    assert _plain(blocking()) == {"scaled": [2.0], "parts": (3, [1.0, 1])}
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expects arg"):
      tf.function(lambda: client.scale_blocking(tf.constant(1.5), tf.constant([1.0])))()


def test_a_call_in_a_failed_trace_is_released_quietly(served):
  """A call's result that outlives the trace of its function (here, in the
  traceback of an error) is released without an error when collected."""
  rpc, _, client = served

  def fail():
    result = client.seven()
    raise ValueError(result)

  unraisable = []
  hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
  try:
    try:
      tf.function(fail)()
    except ValueError:
      pass
    gc.collect()
  finally:
    sys.unraisablehook = hook
  assert [type(u.exc_value) for u in unraisable] == ([TypeError] if rpc is THEIRS else [])


@pytest.mark.parametrize("rpc", [OURS], ids=["tfd"])
def test_bad_arguments_are_named(served):
  _, _, client = served
  with pytest.raises(TypeError, match=r"output_specs must be .*received: output_specs=3"):
    client.call("seven", output_specs=3)
  with pytest.raises(ValueError, match="received: timeout_in_ms=-1"):
    client.call("seven", timeout_in_ms=-1)
  with pytest.raises(ValueError, match="received: rpc_layer='http'"):
    OURS.Server.create("http", _address())
  with pytest.raises(TypeError, match="received: address=1234"):
    OURS.Client.create("grpc", 1234)
  with pytest.raises(ValueError, match=r"Input signature not specified .*received: <lambda>\(x\)"):
    OURS.Server.create("grpc", _address()).register("f", tf.function(lambda x: x))
  with pytest.raises(ValueError, match=r"Method 'scale' takes arguments structured as"):
    client.scale(1)
  with pytest.raises(AttributeError, match=r"listed the methods \['add_pair', 'nothing', "
                                           r"'scale', 'seven'\]"):
    client.sevn  # pylint: disable=pointless-statement
