"""`tf.distribute.experimental.rpc` on TensorFlow's RPC ops. Unlike TF 2.21's:
`get_value()` without `output_specs` gives the flat outputs; a client lives
while its methods or an unawaited call do; bad arguments fail at once."""

import inspect
import itertools
import numbers
import weakref

import tensorflow as tf

from tf_distribute_lite import _tf_bridge
from tf_distribute_lite.tf_classes import StandsFor

_RPC_LAYER = "grpc"

_client_numbers = itertools.count()

_ABSTRACT = "{0} is an interface: make one with {0}.create(rpc_layer, address)."


class Server(StandsFor, stands_for=tf.distribute.experimental.rpc.Server):
  """A server answering remote calls of its registered `tf.function`s.

  >>> import socket
  >>> with socket.socket() as s:
  ...   s.bind(("127.0.0.1", 0))
  ...   address = "127.0.0.1:%d" % s.getsockname()[1]
  >>> add = tf.function(lambda a, b: a + b, input_signature=[
  ...     tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])
  >>> server = Server.create("grpc", address)
  >>> server.register("add", add)
  >>> server.start()
  >>> Client.create("grpc", address, timeout_in_ms=10000).add_blocking(2, 3)
  <tf.Tensor: shape=(), dtype=int32, numpy=5>
  """

  @staticmethod
  def create(rpc_layer, address):
    """A server (made eagerly) for `address` ("host:port"); `rpc_layer`: "grpc"."""
    _check_rpc_layer(rpc_layer)
    return GrpcServer(address)

  def register(self, method_name, func):
    """Serves `func` (with an `input_signature`) as `method_name`, before `start()`."""
    raise NotImplementedError(_ABSTRACT.format("Server"))

  def start(self):
    """Starts answering calls."""
    raise NotImplementedError(_ABSTRACT.format("Server"))


class Client(StandsFor, stands_for=tf.distribute.experimental.rpc.Client):
  """A client calling a `Server`'s methods: `client.NAME(*args)` returns a
  `StatusOrResult`, `client.NAME_blocking(*args)` the value.

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
  >>> client.stats(tf.constant([1.0, 4.0])).get_value()["max"]
  <tf.Tensor: shape=(), dtype=float32, numpy=4.0>
  """

  @staticmethod
  def create(rpc_layer, address, name="", timeout_in_ms=0):
    """A client (made eagerly) of the server at `address`, its methods as attributes."""
    _check_rpc_layer(rpc_layer)
    return GrpcClient(address, name=name, timeout_in_ms=timeout_in_ms)

  def call(self, method_name, args=None, output_specs=None, timeout_in_ms=0):
    """Calls `method_name` with `args` without waiting: a `StatusOrResult`."""
    raise NotImplementedError(_ABSTRACT.format("Client"))


class GrpcServer(Server):
  """A `Server` on TensorFlow's gRPC RPC ops (`Server.create("grpc", ...)`)."""

  def __init__(self, address):
    if not tf.executing_eagerly():
      raise NotImplementedError(
          "An RPC server is made eagerly: call Server.create outside tf.function.")
    self._resource = _Resource(_tf_bridge.rpc_kernels().rpc_server(
        server_address=_checked_string("address", address)))

  def register(self, method_name, func):
    concrete = _concrete_function(func)
    output_specs = tf.nest.map_structure(tf.type_spec_from_value, concrete.structured_outputs)
    _tf_bridge.rpc_kernels().rpc_server_register(
        self._resource.handle, method_name=_checked_string("method_name", method_name),
        captured_inputs=concrete.captured_inputs, f=concrete,
        input_specs=_tf_bridge.encode_specs(concrete.structured_input_signature[0]),
        output_specs=_tf_bridge.encode_specs(output_specs))

  def start(self):
    _tf_bridge.rpc_kernels().rpc_server_start(self._resource.handle)


class GrpcClient(Client):
  """A `Client` on TensorFlow's gRPC RPC ops (`Client.create("grpc", ...)`)."""

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
      self._add_method(method.method, output_specs, _tf_bridge.decode_specs(method.input_specs))

  def _add_method(self, method_name, output_specs, input_specs):
    """Adds `NAME` and `NAME_blocking`, which hold the resource, not `self`."""
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
    elif not all(isinstance(s, tf.TypeSpec) for s in tf.nest.flatten(output_specs)):
      raise TypeError(f"output_specs must be a structure of tf.TypeSpec (such as "
                      f"tf.TensorSpec); received: output_specs={output_specs!r}")
    return _call(self._resource, method_name, args, output_specs, timeout_in_ms)


class StatusOrResult:
  """The answer to one remote call; each method waits for it."""

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
    """(code, message) scalar tensors; code 0 for success."""
    if self._error is None:
      self._error = tuple(_tf_bridge.rpc_kernels().rpc_check_status(self._status_or))
      self._client.unawaited_calls[0] -= 1
    return self._error

  def get_value(self):
    """The outputs, structured as `output_specs`; raises the call's error."""
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
  """Deletes `future` in `graph` if it is still being traced."""
  if tf.compat.v1.get_default_graph() is graph:
    _tf_bridge.rpc_kernels().delete_rpc_future_resource(handle=future, deleter=deleter)


class _Resource:
  """Owns `handle`; destroys it with itself unless a call was never awaited."""

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
    parameters = inspect.signature(func.python_function).parameters.values()
    if func.input_signature is None and any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters):
      raise ValueError(
          f"Input signature not specified for the function: a tf.function "
          f"with arguments is registered with an input_signature; received: "
          f"{func.python_function.__name__}{inspect.signature(func.python_function)}.")
    return func.get_concrete_function()
  raise ValueError(f"func must be a tf.function or a concrete function; received: {func!r}")


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

