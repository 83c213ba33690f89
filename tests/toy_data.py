"""Small synthetic training data shared by the training and checkpoint tests."""

import numpy as np


def gaussian_blobs(num_examples=96, num_features=10, num_classes=4, seed=0):
  """Linearly separable-ish Gaussian blobs: [N, F] float32 images and [N] int32 labels."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, num_examples).astype(np.int32)
  centres = rng.normal(size=(num_classes, num_features)) * 2
  images = centres[labels] + rng.normal(size=(num_examples, num_features))
  return images.astype(np.float32), labels
