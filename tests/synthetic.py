"""Synthetic inputs shared by the tests: a classifier's logits, a saved calibrator."""

import numpy as np


def classifier_logits(num: int, num_classes: int = 10, seed: int = 0):
  """[num, K] float32 logits of a fairly accurate, over-confident classifier, and [num]
  labels: the true class gets a gamma-distributed boost over Gaussian noise."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, num)
  logits = rng.normal(size=(num, num_classes))
  logits[np.arange(num), labels] += rng.gamma(2.0, 1.0, num)
  return (3 * logits).astype(np.float32), labels


def version_1_calibrator() -> dict:
  """A calibrator as top1_jax wrote it before "method" (version 1: the bins' fields at
  the top), 4 bins of neg_log_pmax on 10 classes."""
  return {
    "format": "top1_jax.Calibrator",
    "version": 1,
    "score": "neg_log_pmax",
    "n_bins": 4,
    "k": 1,
    "inputs": "logits",
    "num_classes": 10,
    "edges": [0.25, 0.5, 1.5],
    "counts": [25, 25, 25, 25],
    "hits": [24, 20, 12, 3],
    "prior": 0.59,
    "prob": [0.9458, 0.7919, 0.4842, 0.1381],
  }
