"""Top-k correctness events."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from top1_jax.core import events


def test_topk_correct_matches_loop():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(300, 10)).astype(np.float32)
  labels = rng.integers(0, 10, 300)
  for k in (1, 2, 5, 10):
    expected = [labels[i] in np.argsort(-logits[i], kind="stable")[:k] for i in range(300)]
    np.testing.assert_array_equal(events.topk_correct(logits, labels, k), expected)


def test_ties_break_towards_lower_index():
  logits = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]])
  np.testing.assert_array_equal(events.topk_correct(logits, [0, 2], 1), [True, False])
  np.testing.assert_array_equal(events.topk_correct(logits, [1, 2], 2), [True, True])


@pytest.mark.parametrize(
  "logits, labels, k, message",
  [
    (np.zeros((3, 4)), [0, 1, 4], 1, r"labels: labels out of range \[0, 4\): min 0, max 4"),
    (np.zeros((3, 4)), [0, -1, 2], 1, "labels out of range"),
    (np.zeros((3, 4)), [0, 1], 1, "length mismatch: logits has 3, labels has 2"),
    (np.zeros((3, 4)), [0, 1, 2], 5, "k: expected at least 1, at most 4, got 5"),
    (np.zeros((3, 4)), [0.5, 1, 2], 1, "labels: expected integer class labels"),
    (np.full((3, 4), np.nan), [0, 1, 2], 1, "logits: 12 non-finite"),
  ],
)
def test_bad_input(logits, labels, k, message):
  with pytest.raises(ValueError, match=message):
    events.topk_correct(logits, labels, k)


@pytest.mark.parametrize("k", [2, 3, 7])
def test_topk_correct_by_rank_equals_lax_top_k_with_many_ties(k):
  # The one-pass rank must break ties as lax.top_k does: the lower class index first.
  rng = np.random.default_rng(k)
  logits = np.round(rng.normal(size=(3000, 12))) + 0.0  # + 0.0: no -0.0 beside 0.0
  labels = rng.integers(0, 12, 3000)
  _, top = jax.lax.top_k(jnp.asarray(logits, jnp.float32), k)
  expected = np.any(np.asarray(top) == labels[:, None], axis=-1)
  np.testing.assert_array_equal(events.topk_correct(logits, labels, k), expected)


def test_label_terms_are_rank_top_class_and_the_softmax_brier_and_pmax():
  rng = np.random.default_rng(3)
  logits = np.round(3 * rng.normal(size=(2000, 7)), 1).astype(np.float32)  # tied tops
  labels = rng.integers(0, 7, 2000)
  terms = events.label_terms(logits, labels)
  np.testing.assert_array_equal(terms.rank, events.label_rank(logits, labels))
  np.testing.assert_array_equal(terms.top_class, np.argmax(logits, axis=-1))
  # float64 oracle of softmax(logits): sum_k (p_k - y_k)^2 and max_k p_k.
  z = logits.astype(np.float64)
  probs = np.exp(z - z.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  brier = np.sum((probs - np.eye(7)[labels]) ** 2, axis=1)
  np.testing.assert_allclose(terms.multiclass_brier, brier, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(terms.pmax, probs.max(1), rtol=1e-6)
  assert terms.rank.dtype == terms.top_class.dtype == jnp.int32
  with pytest.raises(ValueError, match="length mismatch: logits has 2000, labels has 3"):
    events.label_terms(logits, labels[:3])
