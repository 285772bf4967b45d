"""tfd objects are instances of the public TensorFlow classes they stand for
(`class X(..., stands_for=tf.distribute.X)`), though nothing of TensorFlow's
is inherited.

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
  """Base of the tfd classes that stand for (`stands_for`) TensorFlow classes."""

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
    # `pickle` refuses `__newobj__` of a class not `__class__`: use the type.
    reduced = super().__reduce_ex__(protocol)
    if reduced[0] is copyreg.__newobj__:
      return (_new,) + reduced[1:]
    return reduced


def _new(cls, *args):
  return cls.__new__(cls, *args)


@functools.lru_cache(maxsize=None)
def reported_class(cls):
  """What instances of `cls` give as `__class__`: `cls`, or a subclass of it and
  of the TensorFlow classes it stands for."""
  missing = tuple(c for c in getattr(cls, "_tensorflow_classes", ()) if not issubclass(cls, c))
  if not missing:
    return cls
  covering = tuple(c for c in missing if issubclass(c, cls))
  bases = (covering or (cls,)) + tuple(c for c in missing if c not in covering)
  namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
               "__doc__": cls.__doc__}
  return _metaclass_of(bases)(cls.__name__, bases, namespace)


def _metaclass_of(bases):
  """The metaclass a class with `bases` needs (made if none derives from all)."""
  metaclasses = []
  for meta in map(type, bases):
    if not any(issubclass(m, meta) for m in metaclasses):
      metaclasses = [m for m in metaclasses if not issubclass(meta, m)] + [meta]
  if len(metaclasses) == 1:
    return metaclasses[0]
  return type("_".join(m.__name__ for m in metaclasses), tuple(metaclasses), {})
