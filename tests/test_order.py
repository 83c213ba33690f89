"""Row order statistics by max and count passes, against sort-based definitions."""

import jax.numpy as jnp
import numpy as np
import pytest

from top1_jax.core import events
from top1_jax.kernels import top_entries


def _tied_logits(rows=400, classes=12, seed=0):
  """Logits on a coarse grid, so most rows have ties, some at the top."""
  rng = np.random.default_rng(seed)
  return rng.integers(-3, 2, size=(rows, classes)).astype(np.float32)


def test_shifted_tail_is_the_sum_over_all_but_the_argmax():
  logits = _tied_logits()
  z, tail = top_entries.shifted(jnp.asarray(logits))
  top = np.argmax(logits, axis=-1)
  shifted = logits - logits.max(-1, keepdims=True)
  np.testing.assert_array_equal(z, shifted)
  expected = np.exp(shifted).sum(-1) - np.exp(shifted[np.arange(len(top)), top])
  np.testing.assert_allclose(tail, expected, rtol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 5, 12, 17])
def test_kth_largest_counts_repeats(k):
  classes = max(k, 12) + 3
  logits = _tied_logits(classes=classes)
  z, _ = top_entries.shifted(jnp.asarray(logits))
  expected = -np.sort(-np.asarray(z), axis=-1)[:, k - 1]  # 17 > TOP_K_BY_PASSES: lax.top_k
  np.testing.assert_array_equal(top_entries.kth_largest(z, k), expected)


def test_label_rank_breaks_ties_towards_the_lower_class():
  logits = _tied_logits()
  labels = np.random.default_rng(1).integers(0, logits.shape[1], len(logits))
  # Classes ahead of the label in a stable descending sort (argmax / lax.top_k's order).
  ranking = np.argsort(-logits, axis=-1, kind="stable")
  expected = np.argmax(ranking == labels[:, None], axis=-1)
  ranks = top_entries.label_rank(jnp.asarray(logits), jnp.asarray(labels))
  np.testing.assert_array_equal(ranks, expected)
  np.testing.assert_array_equal(events.label_rank(logits, labels), expected)
  for k in (1, 3):
    np.testing.assert_array_equal(events.topk_correct(logits, labels, k), expected < k)


def test_count_is_exact():
  mask = np.random.default_rng(2).random((50, 1000)) < 0.3
  np.testing.assert_array_equal(top_entries.count(jnp.asarray(mask)), mask.sum(-1))
