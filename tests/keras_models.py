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
