"""Remote calls of `tf.function`s between programs: `tf.distribute.experimental.rpc`.

A `Server` serves `tf.function`s under method names over gRPC. A `Client`
calls them by name; a call returns a `StatusOrResult` at once, whose
`is_ok()`, `get_error()` and `get_value()` wait for the answer. Both run on
TensorFlow's own RPC ops and describe methods with TensorFlow's encoding of
type specs, so a tfd client calls a TensorFlow server and the reverse.

A timeout of 0 means none, as in TensorFlow: a client then waits for its
server without limit (gRPC's wait-for-ready), so give one wherever the
server may be gone.

Where TensorFlow 2.21 fails on valid use, these do better:

* `get_value()` of a call made without `output_specs` returns the method's
  outputs as a flat list, as TF documents (TF asks for no outputs and fails
  with "Incorrect number of output types"); a method returning nothing
  still gives None.
* A method that returns None inside a structure (`{"a": x, "b": None}`)
  gives None there (TF's client methods raise `AttributeError`).
* `<method>_blocking(...)` raises the call's error with a readable message,
  inside a `tf.function` too (TF's error keeps its message as bytes, so
  printing it fails, and inside a `tf.function` it takes a symbolic tensor
  for a Python bool).
* A client's methods and calls keep it: `Client.create(...).NAME` works
  (TF destroys the client with the object, and its methods then fail with
  `NotFoundError`). A client with a call never awaited (no `is_ok()`,
  `get_error()` or `get_value()`) is never destroyed: the call may be in
  flight, and TensorFlow's client crashes or hangs when destroyed during a
  call, as TF's does after such a call.
* Clients of the same name and server stay apart (in TF they share one
  resource, which the first of them to go destroys: the other's calls then
  fail with `NotFoundError`, or hang or crash the process if pending; a
  client made in a loop hits this).
* A call made inside a `tf.function` is released inside that function (TF
  releases it when the result is collected, eagerly if tracing has ended,
  which fails and prints an ignored exception).
* Bad arguments fail at once with a message naming them: `output_specs`
  that are not type specs raise `TypeError` (TF: `AttributeError` from
  `get_value()`), a negative timeout `ValueError` (TF takes it for none).
"""

import inspect
import itertools
import numbers
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite.tf_classes import StandsFor

_RPC_LAYER = "grpc"

# TensorFlow keeps a client under its name and address; a number of its own
# keeps each client apart from others of the same name (see the module doc).
_client_numbers = itertools.count()

_ABSTRACT = "{0} is an interface: make one with {0}.create(rpc_layer, address)."


class Server(StandsFor, stands_for=tf.distribute.experimental.rpc.Server):
  """A server answering remote calls of the `tf.function`s registered on it.

  Make one with `Server.create`, register its methods, then start it:

  >>> import socket
  >>> with socket.socket() as s:
  ...   s.bind(("127.0.0.1", 0))
  ...   address = "127.0.0.1:%d" % s.getsockname()[1]
  >>> @tf.function(input_signature=[tf.TensorSpec([], tf.int32),
  ...                               tf.TensorSpec([], tf.int32)])
  ... def add(a, b):
  ...   return a + b
  >>> server = Server.create("grpc", address)
  >>> server.register("add", add)
  >>> server.start()
  >>> Client.create("grpc", address, timeout_in_ms=10000).add_blocking(2, 3)
  <tf.Tensor: shape=(), dtype=int32, numpy=5>
  """

  @staticmethod
  def create(rpc_layer, address):
    """A new server to listen at `address` ("host:port") once started.

    The server stops when its last reference goes. It is made outside any
    `tf.function` (inside one: `NotImplementedError`).

    Args:
      rpc_layer: "grpc", the only RPC layer; any other raises `ValueError`.
      address: where to listen, "host:port".

    Returns:
      A `Server`.
    """
    _check_rpc_layer(rpc_layer)
    return GrpcServer(address)

  def register(self, method_name, func):
    """Serves `func` under `method_name`; every method is registered
    before `start()` (after it: `tf.errors.FailedPreconditionError`).

    Args:
      method_name: the name clients call it by (a name twice:
        `tf.errors.InvalidArgumentError`).
      func: a `tf.function` with an `input_signature` (or no arguments), or
        a concrete function; anything else raises `ValueError`.
    """
    raise NotImplementedError(_ABSTRACT.format("Server"))

  def start(self):
    """Starts listening: from now on clients can call the methods."""
    raise NotImplementedError(_ABSTRACT.format("Server"))


class Client(StandsFor, stands_for=tf.distribute.experimental.rpc.Client):
  """A client calling the methods of a `Server` by name.

  `Client.create` asks the server for its methods and adds two callables
  per method: `client.NAME(*args)` returns a `StatusOrResult`, and
  `client.NAME_blocking(*args)` the value (or raises the call's error).

  >>> import socket
  >>> with socket.socket() as s:
  ...   s.bind(("127.0.0.1", 0))
  ...   address = "127.0.0.1:%d" % s.getsockname()[1]
  >>> @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
  ... def stats(x):
  ...   return {"sum": tf.reduce_sum(x), "max": tf.reduce_max(x)}
  >>> server = Server.create("grpc", address)
  >>> server.register("stats", stats)
  >>> server.start()
  >>> client = Client.create("grpc", address, timeout_in_ms=10000)
  >>> result = client.stats(tf.constant([1.0, 4.0]))
  >>> bool(result.is_ok())
  True
  >>> result.get_value()["max"]
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  >>> result = client.call("stats", [tf.constant([2.0])],
  ...                      output_specs={"sum": tf.TensorSpec([], tf.float32),
  ...                                    "max": tf.TensorSpec([], tf.float32)})
  >>> result.get_value()["sum"]
  <tf.Tensor: shape=(), dtype=float32, numpy=2.0>
  >>> code, message = client.call("mean", [tf.constant([2.0])]).get_error()
  >>> int(code), message.numpy()[:22]
  (3, b'mean is not registered')
  """

  @staticmethod
  def create(rpc_layer, address, name="", timeout_in_ms=0):
    """A client of the server at `address`, with its methods as attributes.

    The client is made eagerly (inside a `tf.function`:
    `NotImplementedError`); it asks the server for its methods, waiting for
    the server to answer.

    Args:
      rpc_layer: "grpc", the only RPC layer; any other raises `ValueError`.
      address: the server's "host:port".
      name: a name telling clients of the same server apart.
      timeout_in_ms: how long to wait for the server, and the default of
        each call, in milliseconds; 0 for no limit. Past it:
        `tf.errors.DeadlineExceededError`.

    Returns:
      A `Client`.
    """
    _check_rpc_layer(rpc_layer)
    return GrpcClient(address, name=name, timeout_in_ms=timeout_in_ms)

  def call(self, method_name, args=None, output_specs=None, timeout_in_ms=0):
    """Calls `method_name` on the server with `args`, without waiting.

    Args:
      method_name: the method's registered name.
      args: the method's arguments, a structure of tensors (flattened).
      output_specs: the structure of `tf.TypeSpec`s of the method's outputs,
        which `get_value()` returns; None for the flat list of outputs.
      timeout_in_ms: the deadline of this call in milliseconds; 0 for the
        client's.

    Returns:
      A `StatusOrResult`; an unknown method or arguments that do not match
      the method's fail there, with `tf.errors.InvalidArgumentError`'s code.
    """
    raise NotImplementedError(_ABSTRACT.format("Client"))


class GrpcServer(Server):
  """A `Server` on TensorFlow's gRPC RPC ops (`Server.create("grpc", ...)`).

  >>> GrpcServer("127.0.0.1:0").register("f", lambda: 1)
  Traceback (most recent call last):
  ...
  ValueError: func must be a tf.function or a concrete function; received: <function <lambda> at ...>
  """

  def __init__(self, address):
    if not tf.executing_eagerly():
      raise NotImplementedError(
          "An RPC server is made eagerly: call Server.create outside tf.function.")
    self._resource = _Resource(_tf_bridge.rpc_kernels().rpc_server(
        server_address=_checked_string("address", address)))

  def register(self, method_name, func):
    concrete = _concrete_function(func)
    output_specs = tf.nest.map_structure(tf.type_spec_from_value,
                                         concrete.structured_outputs)
    _tf_bridge.rpc_kernels().rpc_server_register(
        self._resource.handle, method_name=_checked_string("method_name", method_name),
        captured_inputs=concrete.captured_inputs, f=concrete,
        input_specs=_tf_bridge.encode_specs(concrete.structured_input_signature[0]),
        output_specs=_tf_bridge.encode_specs(output_specs))

  def start(self):
    _tf_bridge.rpc_kernels().rpc_server_start(self._resource.handle)


class GrpcClient(Client):
  """A `Client` on TensorFlow's gRPC RPC ops (`Client.create("grpc", ...)`).

  >>> GrpcClient("127.0.0.1:1", timeout_in_ms=-1)
  Traceback (most recent call last):
  ...
  ValueError: timeout_in_ms must be 0 (no limit) or a positive number of milliseconds; received: timeout_in_ms=-1
  """

  def __init__(self, address, name="", timeout_in_ms=0):
    if not tf.executing_eagerly():
      raise NotImplementedError(
          "An RPC client is made eagerly: call Client.create outside tf.function "
          "(its calls may be inside one).")
    handle, listed = _tf_bridge.rpc_kernels().rpc_client(
        server_address=_checked_string("address", address),
        shared_name=f"{_checked_string('name', name)}#{next(_client_numbers)}",
        timeout_in_ms=_checked_timeout(timeout_in_ms), list_registered_methods=True)
    self._resource = _Resource(handle)
    self._server_address = address
    self._output_specs = {}
    for serialized in listed.numpy():
      method = _tf_bridge.parse_registered_method(serialized)
      output_specs = _tf_bridge.decode_specs(method.output_specs)
      self._output_specs[method.method] = output_specs
      self._add_method(method.method, output_specs,
                       _tf_bridge.decode_specs(method.input_specs))

  def _add_method(self, method_name, output_specs, input_specs):
    """Adds `client.NAME(*args, timeout_in_ms=0)` and `NAME_blocking`.
    They hold the client's resource, not the client: no reference cycle
    delays its end, and `Client.create(...).NAME(...)` works."""
    resource = self._resource

    def call(*args, timeout_in_ms=0):
      _check_arguments(method_name, args, input_specs)
      return _call(resource, method_name, args, output_specs, timeout_in_ms)

    def call_blocking(*args, timeout_in_ms=0):
      return call(*args, timeout_in_ms=timeout_in_ms).get_value()

    for name, function in ((method_name, call), (f"{method_name}_blocking", call_blocking)):
      function.__name__ = function.__qualname__ = name
      function.__doc__ = f"RPC Call for {method_name} method to server {self._server_address}"
      setattr(self, name, function)

  def __getattr__(self, name):
    methods = self.__dict__.get("_output_specs")
    if methods is None or name.startswith("__"):
      raise AttributeError(name)
    raise AttributeError(
        f"'{type(self).__name__}' object has no attribute {name!r}: the server "
        f"at {self._server_address} listed the methods {sorted(methods)} "
        f"(each also as NAME_blocking) when the client was made.")

  def call(self, method_name, args=None, output_specs=None, timeout_in_ms=0):
    if output_specs is None:
      if _checked_string("method_name", method_name) in self._output_specs:
        output_specs = tf.nest.flatten(self._output_specs[method_name],
                                       expand_composites=True) or None
    else:
      _check_output_specs(output_specs)
    return _call(self._resource, method_name, args, output_specs, timeout_in_ms)


class StatusOrResult:
  """The answer to one remote call; each method waits for it.

  `is_ok()` is a boolean tensor, `get_error()` a pair of tensors (the
  `tf.errors` code, 0 for none, and the message), `get_value()` the
  method's outputs in the structure of the call's `output_specs` (it raises
  the call's error if it failed). `Client`'s example shows them.
  """

  def __init__(self, status_or, deleter, output_specs, client):
    self._status_or = status_or
    self._output_specs = output_specs
    self._client = client  # the client's `_Resource`, kept while this is
    self._error = None
    if tf.executing_eagerly():
      self._deleter = deleter  # the future is deleted with this tensor
    else:
      weakref.finalize(self, _release_in_graph, tf.compat.v1.get_default_graph(),
                       status_or, deleter).atexit = False

  def is_ok(self):
    """Whether the call succeeded: a boolean scalar tensor."""
    return tf.equal(self.get_error()[0], tf.constant(0, tf.int64))

  def get_error(self):
    """(error code, error message): int64 and string scalar tensors; code 0
    and an empty message for a call that succeeded."""
    if self._error is None:
      self._error = tuple(_tf_bridge.rpc_kernels().rpc_check_status(self._status_or))
      self._client.unawaited_calls[0] -= 1
    return self._error

  def get_value(self):
    """The method's outputs, structured as the call's `output_specs`; the
    call's error as a `tf.errors` exception if it failed."""
    self.get_error()
    specs = self._output_specs
    flat_specs = [] if specs is None else tf.nest.flatten(specs, expand_composites=True)
    values = _tf_bridge.rpc_kernels().rpc_get_value(
        self._status_or, Tout=[s.dtype for s in flat_specs])
    if specs is None:
      return None
    return tf.nest.pack_sequence_as(specs, values, expand_composites=True)


def _call(client, method_name, args, output_specs, timeout_in_ms):
  future, deleter = _tf_bridge.rpc_kernels().rpc_call(
      client.handle, method_name=_checked_string("method_name", method_name),
      args=tf.nest.flatten([] if args is None else args),
      timeout_in_ms=_checked_timeout(timeout_in_ms))
  client.unawaited_calls[0] += 1
  return StatusOrResult(future, deleter, output_specs, client)


def _release_in_graph(graph, future, deleter):
  """Deletes a call's `future` made in the traced function `graph`, after
  its last use there, if that function is still being traced. The op takes
  `deleter`, whose last reference deletes the future: without a use, it
  would go as soon as the call is made."""
  if tf.compat.v1.get_default_graph() is graph:
    _tf_bridge.rpc_kernels().delete_rpc_future_resource(handle=future, deleter=deleter)


class _Resource:
  """Owns the resource `handle` of a server or client: destroys it when the
  last reference to this object goes (a server stops then).

  A client through which a call was made and never awaited (its status
  never asked, eagerly or in the traced function) stays: the call may be in
  flight, and TensorFlow's client crashes or hangs when destroyed during one.
  """

  def __init__(self, handle):
    self.handle = handle
    self.unawaited_calls = [0]  # a counter the finalizer shares
    weakref.finalize(self, _destroy_resource, handle, self.unawaited_calls).atexit = False


def _destroy_resource(handle, unawaited_calls):
  if unawaited_calls[0]:
    return
  with tf.init_scope(), tf.device(handle.device):
    tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def _concrete_function(func):
  if isinstance(func, tf.types.experimental.ConcreteFunction):
    return func
  if isinstance(func, tf.types.experimental.PolymorphicFunction):
    if func.input_signature is None and _positional_parameters(func.python_function):
      raise ValueError(
          f"Input signature not specified for the function: a tf.function "
          f"with arguments is registered with an input_signature; received: "
          f"{func.python_function.__name__}{inspect.signature(func.python_function)}.")
    return func.get_concrete_function()
  raise ValueError(f"func must be a tf.function or a concrete function; "
                   f"received: {func!r}")


def _positional_parameters(python_function):
  return [p for p in inspect.signature(python_function).parameters.values()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _check_rpc_layer(rpc_layer):
  if rpc_layer != _RPC_LAYER:
    raise ValueError(f"rpc_layer must be {_RPC_LAYER!r}, the only RPC layer "
                     f"supported; received: rpc_layer={rpc_layer!r}")


def _checked_string(name, value):
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a string; received: {name}={value!r}")
  return value


def _checked_timeout(timeout_in_ms):
  if tf.is_tensor(timeout_in_ms):
    return timeout_in_ms
  if isinstance(timeout_in_ms, bool) or not isinstance(timeout_in_ms, numbers.Integral):
    raise TypeError(f"timeout_in_ms must be an integer number of milliseconds; "
                    f"received: timeout_in_ms={timeout_in_ms!r}")
  if timeout_in_ms < 0:
    raise ValueError(f"timeout_in_ms must be 0 (no limit) or a positive number "
                     f"of milliseconds; received: timeout_in_ms={timeout_in_ms}")
  return timeout_in_ms


def _check_arguments(method_name, args, input_specs):
  if not input_specs:
    return
  try:
    tf.nest.assert_same_structure(args, input_specs)
  except (TypeError, ValueError) as e:
    raise type(e)(f"Method {method_name!r} takes arguments structured as "
                  f"{input_specs}; received: {args}") from None


def _check_output_specs(output_specs):
  if not all(isinstance(s, tf.TypeSpec) for s in tf.nest.flatten(output_specs)):
    raise TypeError(f"output_specs must be a structure of tf.TypeSpec (such as "
                    f"tf.TensorSpec); received: output_specs={output_specs!r}")
