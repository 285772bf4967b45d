"""The small Keras classifier the Keras parity tests train: its sizes and its
fixed initial weights."""

import numpy as np

NUM_FEATURES = 5
NUM_CLASSES = 3
TOLERANCE = 1e-5


def initial_weights():
  """Weights of Dense(8) -> Dense(3), the same for every run."""
  rng = np.random.RandomState(3)
  return [rng.normal(scale=0.5, size=(NUM_FEATURES, 8)).astype(np.float32),
          rng.normal(scale=0.1, size=(8,)).astype(np.float32),
          rng.normal(scale=0.5, size=(8, NUM_CLASSES)).astype(np.float32),
          rng.normal(scale=0.1, size=(NUM_CLASSES,)).astype(np.float32)]


def classification_data(*leading_shape, seed=7):
  """Fixed features (`leading_shape` + (NUM_FEATURES,)) and int32 labels
  (`leading_shape`) for the classifier."""
  rng = np.random.RandomState(seed)
  x = rng.normal(size=leading_shape + (NUM_FEATURES,)).astype(np.float32)
  y = rng.randint(0, NUM_CLASSES, size=leading_shape).astype(np.int32)
  return x, y


def classifier(keras=None):
  """Dense(8, relu) -> Dense(NUM_CLASSES), with `initial_weights()`, made
  with `keras` (a Keras module: Keras 3 by default, or `tf_keras`)."""
  if keras is None:
    import keras  # pylint: disable=g-import-not-at-top,redefined-outer-name  (workers import it late)
  model = keras.Sequential([
      keras.Input(shape=(NUM_FEATURES,)),
      keras.layers.Dense(8, activation="relu"),
      keras.layers.Dense(NUM_CLASSES)])
  model.set_weights(initial_weights())
  return model
