"""tfd objects are instances of the public TensorFlow classes they stand for.

Clients tell strategies and their parts apart with `isinstance` against
TensorFlow's public classes (`tf.distribute.Strategy`, `TPUStrategy`, ...).
A tfd class names those it stands for::

    class MirroredStrategy(Strategy, stands_for=tf.distribute.MirroredStrategy)

and `isinstance` answers yes for its instances against those classes (and
their bases), for any caller. A subclass that names none stands for what its
parent stands for; one declared with `covers_parent=True` (a deprecated
variant) is also answered for every instance of its parent.

How: `isinstance(obj, cls)` looks at `obj.__class__` when `type(obj)` does
not match (the rule `unittest.mock`'s `spec` relies on). An instance of a
class here reports as `__class__` a class made for it once, a subclass of
its own type and of the TensorFlow classes, with the same name. `type(obj)`,
attribute look-up and method resolution stay tfd's: nothing of TensorFlow's
implementation is inherited, and private names that clients read are
supplied by tfd's classes themselves (`docs/client_private_names.md`).
Enums and named tuples (`ReduceOp`, `RunOptions`, ...) keep their own
classes, as `__class__` cannot be changed for them.

>>> import tensorflow as tf
>>> import tf_distribute_lite as tfd
>>> strategy = tfd.OneDeviceStrategy("/cpu:0")
>>> isinstance(strategy, tf.distribute.OneDeviceStrategy)
True
>>> isinstance(strategy, tf.distribute.MirroredStrategy)
False
>>> type(strategy) is tfd.OneDeviceStrategy, strategy.__class__.__name__
(True, 'OneDeviceStrategy')
"""

import copyreg
import functools


class StandsFor:
  """Base of the tfd classes that stand for public TensorFlow classes.

  `class X(..., stands_for=tf.X)` (a class or a tuple of classes) declares
  them; `covers_parent=True`, that the parent's instances are X's too.
  """

  _tensorflow_classes = ()

  def __init_subclass__(cls, stands_for=None, covers_parent=False, **kwargs):
    super().__init_subclass__(**kwargs)
    if stands_for is not None:
      cls._tensorflow_classes = (
          tuple(stands_for) if isinstance(stands_for, tuple) else (stands_for,))
    if covers_parent:
      parent = cls.__bases__[0]
      parent._tensorflow_classes = parent._tensorflow_classes + (cls,)

  @property
  def __class__(self):
    return reported_class(type(self))

  def __reduce_ex__(self, protocol):
    # `pickle` refuses `copyreg.__newobj__` of a class other than
    # `__class__`: rebuild from the type.
    reduced = super().__reduce_ex__(protocol)
    if reduced[0] is copyreg.__newobj__:
      return (_new,) + reduced[1:]
    return reduced


def _new(cls, *args):
  return cls.__new__(cls, *args)


@functools.lru_cache(maxsize=None)
def reported_class(cls):
  """What instances of `cls` give as `__class__`: `cls` itself, or a
  subclass of `cls` (or of its covering subclasses) and of the TensorFlow
  classes it stands for.

  >>> import tensorflow as tf
  >>> import tf_distribute_lite as tfd
  >>> reported = reported_class(tfd.MirroredStrategy)
  >>> issubclass(reported, tfd.MirroredStrategy), issubclass(reported, tf.distribute.Strategy)
  (True, True)
  """
  missing = tuple(c for c in getattr(cls, "_tensorflow_classes", ())
                  if not issubclass(cls, c))
  if not missing:
    return cls
  covering = tuple(c for c in missing if issubclass(c, cls))
  bases = (covering or (cls,)) + tuple(c for c in missing if c not in covering)
  namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
               "__doc__": cls.__doc__}
  return _metaclass_of(bases)(cls.__name__, bases, namespace)


def _metaclass_of(bases):
  """The metaclass a class with `bases` needs (made where none derives
  from the others)."""
  metaclasses = []
  for meta in map(type, bases):
    if not any(issubclass(m, meta) for m in metaclasses):
      metaclasses = [m for m in metaclasses if not issubclass(meta, m)] + [meta]
  if len(metaclasses) == 1:
    return metaclasses[0]
  return type("_".join(m.__name__ for m in metaclasses), tuple(metaclasses), {})
