"""Scores: log-space stability, agreement with float64 NumPy, covariance norm."""

import jax
import numpy as np
import pytest
import reference
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from top1_jax.core import events, scores


def _softmax64(logits):
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _saturated(top):
  logits = np.zeros((1, 10), np.float32)
  logits[0, 3] = top
  return logits


@pytest.mark.parametrize(
  "fn", [scores.neg_log_pmax, scores.entropy, lambda x: scores.neg_log_topk_mass(x, 2)]
)
def test_saturated_softmax_does_not_tie(fn):
  # float32 softmax is exactly 1.0 for both; the log-space scores must differ.
  assert float(scores.pmax(_saturated(20.0))[0]) == 1.0
  a, b = float(fn(_saturated(20.0))[0]), float(fn(_saturated(26.0))[0])
  assert a > b > 0


def test_neg_log_pmax_relative_precision_when_saturated():
  value = float(scores.neg_log_pmax(_saturated(20.0))[0])
  np.testing.assert_allclose(value, 9 * np.exp(-20.0), rtol=1e-5)


def test_entropy_relative_precision_when_saturated():
  p = _softmax64(_saturated(20.0).astype(np.float64))
  expected = -(p * np.log(p)).sum()
  np.testing.assert_allclose(float(scores.entropy(_saturated(20.0))[0]), expected, rtol=1e-4)


@given(
  hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 6), st.integers(2, 12)),
    elements=st.floats(-30, 30, width=32),
  )
)
@pytest.mark.slow
def test_scores_match_float64_numpy(logits):
  p = _softmax64(logits)
  np.testing.assert_allclose(scores.pmax(logits), p.max(-1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(scores.neg_log_pmax(logits), -np.log(p.max(-1)), rtol=1e-4, atol=1e-6)
  ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(scores.entropy(logits), ent, rtol=1e-4, atol=1e-6)
  k = min(3, logits.shape[1])
  top = np.sort(p, -1)[:, ::-1][:, :k].sum(-1)
  np.testing.assert_allclose(
    scores.neg_log_topk_mass(logits, k), -np.log(top), rtol=1e-4, atol=1e-6
  )
  s = np.sort(logits.astype(np.float64), -1)
  np.testing.assert_allclose(scores.margin(logits), s[:, -1] - s[:, -2], rtol=1e-5, atol=1e-5)


def test_topk_mass_with_k1_is_neg_log_pmax():
  logits = np.random.default_rng(0).normal(size=(50, 7)).astype(np.float32) * 5
  np.testing.assert_allclose(
    scores.neg_log_topk_mass(logits, 1), scores.neg_log_pmax(logits), rtol=1e-6
  )


def test_entropy_bounds():
  logits = np.random.default_rng(1).normal(size=(200, 5)).astype(np.float32) * 3
  ent = np.asarray(scores.entropy(logits))
  assert (ent >= 0).all() and (ent <= np.log(5) + 1e-6).all()
  np.testing.assert_allclose(scores.entropy(np.zeros((1, 5), np.float32)), [np.log(5)], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 5, 30), (4, 3, 1000), (40, 6, 10)])
def test_covariance_norm_matches_numpy_cov(shape):
  # (40, 6, 10) takes the K x K path (K <= S), the others the S x S Gram path.
  samples = np.random.default_rng(2).normal(size=shape).astype(np.float32)
  np.testing.assert_allclose(
    scores.covariance_norm(samples), reference.covariance_norm(samples), rtol=1e-4
  )


def test_covariance_norm_of_identical_samples_is_zero():
  samples = np.tile(np.random.default_rng(3).normal(size=(1, 4, 6)), (5, 1, 1))
  np.testing.assert_allclose(scores.covariance_norm(samples), 0.0, atol=1e-5)


def test_covariance_norm_scales_quadratically():
  samples = np.random.default_rng(4).normal(size=(6, 3, 8)).astype(np.float32)
  np.testing.assert_allclose(
    scores.covariance_norm(3 * samples), 9 * scores.covariance_norm(samples), rtol=1e-4
  )


def test_human_entropy():
  probs = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
  np.testing.assert_allclose(scores.human_entropy(probs), [0.0, np.log(2), np.log(3)], rtol=1e-6)


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: scores.neg_log_pmax(np.zeros(5)), "logits: expected a 2-D array"),
    (lambda: scores.entropy(np.array([[0.0, np.nan]])), "logits: 1 non-finite"),
    (lambda: scores.pmax(np.array([[np.inf, 0.0]])), "non-finite"),
    (lambda: scores.margin(np.zeros((3, 1))), "at least 2 classes"),
    (lambda: scores.neg_log_topk_mass(np.zeros((3, 4)), 5), "k: expected at least 1, at most 4"),
    (lambda: scores.neg_log_topk_mass(np.zeros((3, 4)), 0), "k: expected at least 1"),
    (lambda: scores.covariance_norm(np.zeros((1, 3, 4))), "at least 2 samples"),
    (lambda: scores.covariance_norm(np.zeros((3, 4))), "samples: expected a 3-D"),
    (lambda: scores.human_entropy([[0.5, 0.6]]), "probs: each row must sum to 1"),
    (lambda: scores.human_entropy([[1.5, -0.5]]), "probs: probabilities must lie in"),
    (lambda: scores.entropy([["a", "b"]]), "logits: expected a real-valued array"),
  ],
)
def test_bad_input_raises_clear_error(call, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    call()


def test_covariance_norm_keeps_a_tiny_spread_around_a_large_mean():
  # Tiny dropout rates: samples differ by 1e-3 around logits of 10. Centring after the
  # Gram product would lose this to float32 cancellation.
  rng = np.random.default_rng(5)
  samples = (10 + 1e-3 * rng.normal(size=(16, 8, 200))).astype(np.float32)
  np.testing.assert_allclose(
    scores.covariance_norm(samples), reference.covariance_norm(samples), rtol=1e-3
  )


@pytest.mark.slow
def test_from_predictions():
  rng = np.random.default_rng(10)
  samples = rng.normal(size=(4, 50, 6)).astype(np.float32)
  scored = scores.from_predictions(logits=samples, topk=(1, 3))
  log_probs, values = scored.log_probs, scored.scores
  assert scored.label_terms is None  # one return type: the terms only when asked for
  np.testing.assert_allclose(np.exp(log_probs).sum(1), 1, rtol=1e-5)
  assert {"pmax", "entropy", "neg_log_top3_mass", "covariance_norm_probs"} <= set(values)
  assert "neg_log_top1_mass" not in values  # that is neg_log_pmax
  # Stored scores (computed in log space on device) win, and give pmax.
  stored = {"neg_log_pmax": np.full(50, 2.0, np.float32)}
  probs = np.exp(np.asarray(log_probs))
  values = scores.from_predictions(mean_probs=probs, stored_scores=stored).scores
  np.testing.assert_allclose(values["pmax"], np.exp(-2.0), rtol=1e-6)
  assert "covariance_norm_probs" not in values
  with pytest.raises(ValueError, match="expected at least one of them"):
    scores.from_predictions()
  # The label terms from the same pass, for sample files and probabilities alike.
  labels = rng.integers(0, 6, 50)
  for inputs in ({"logits": samples}, {"mean_probs": probs}):
    log_probs, _, terms = scores.from_predictions(**inputs, labels=labels, label_terms=True)
    assert isinstance(terms, events.LabelTerms)
    expected = events.label_terms(log_probs, labels)
    for name, value in expected._asdict().items():
      np.testing.assert_allclose(getattr(terms, name), value, rtol=1e-6, err_msg=name)
  with pytest.raises(ValueError, match="labels: label_terms=True needs the labels, got None"):
    scores.from_predictions(logits=samples, label_terms=True)


def test_from_predictions_refuses_probabilities_as_logits_and_takes_their_logs():
  rng = np.random.default_rng(11)
  samples = rng.normal(size=(3, 40, 5)).astype(np.float32)
  probs = np.exp(samples) / np.exp(samples).sum(-1, keepdims=True)
  with pytest.raises(ValueError, match=r"^logits: these look like probabilities .*; pass mean"):
    scores.from_predictions(logits=probs)
  # The fix the message names: [N, K] as mean_probs, samples' logs as logits.
  from_logs = scores.from_predictions(logits=np.log(probs)).scores
  np.testing.assert_allclose(
    from_logs["entropy"], scores.from_predictions(logits=samples).scores["entropy"], rtol=1e-5
  )
  mean = probs.mean(0)
  np.testing.assert_allclose(
    scores.from_predictions(mean_probs=mean).scores["entropy"], from_logs["entropy"], rtol=1e-4
  )


@pytest.mark.slow
def test_registry_entries_match_the_public_functions():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(40, 6)).astype(np.float32) * 4
  samples = rng.normal(size=(3, 40, 6)).astype(np.float32)
  public = {
    "pmax": scores.pmax(logits),
    "entropy": scores.entropy(logits),
    "neg_log_pmax": scores.neg_log_pmax(logits),
    "neg_log_top3_mass": scores.neg_log_topk_mass(logits, 3),
    "margin": scores.margin(logits),
    "covariance_norm_probs": scores.covariance_norm(_softmax64(samples).astype(np.float32)),
    "covariance_norm_logits": scores.covariance_norm(samples),
    "human_entropy": scores.human_entropy(_softmax64(logits).astype(np.float32)),
  }
  computed = scores.compute(
    logits, samples=samples, human_probs=_softmax64(logits).astype(np.float32), topk=(1, 3)
  )
  assert list(computed) == list(public)  # registry order, one entry per score
  for name, value in public.items():
    np.testing.assert_allclose(computed[name], value, rtol=2e-5, atol=1e-7, err_msg=name)
  assert {s.name for s in scores.REGISTRY.values() if s.confident_when_high} == {"pmax", "margin"}


def test_sample_summary_is_the_on_device_part_and_jits():
  import jax

  rng = np.random.default_rng(4)
  samples = rng.normal(size=(4, 30, 5)).astype(np.float32)
  log_probs, values = jax.jit(scores.sample_summary)(samples)
  np.testing.assert_allclose(log_probs, scores.mean_log_probs(samples), rtol=1e-6, atol=1e-6)
  on_device = [s.name for s in scores.REGISTRY.values() if s.on_device]
  assert sorted(values) == sorted(on_device)  # jit returns dicts with sorted keys
  everything = scores.compute(log_probs, samples=samples)
  for name in on_device:
    np.testing.assert_allclose(values[name], everything[name], rtol=1e-5, atol=1e-7)
  _, plain = scores.sample_summary(samples[:1])
  assert "covariance_norm_probs" not in plain and "neg_log_pmax" in plain


def test_names_labels_and_headline():
  assert scores.for_event("neg_log_topk_mass", 1) == "neg_log_pmax"
  assert scores.for_event("neg_log_topk_mass", 5) == "neg_log_top5_mass"
  assert scores.for_event("entropy", 5) == "entropy"
  assert scores.lookup("neg_log_top5_mass") is scores.REGISTRY["neg_log_topk_mass"]
  assert scores.lookup("my_stored_score") is None
  assert scores.label("neg_log_top5_mass") == "−log top-5 mass"
  assert scores.label("pmax") == "pmax (Vanilla)"
  assert scores.label("my_stored_score") == "my_stored_score"
  assert scores.headline(["entropy", "pmax", "covariance_norm_probs"]) == "covariance_norm_probs"
  assert scores.headline(["entropy", "pmax"]) == "pmax"
  assert scores.headline(["my_score"]) == "my_score"
  assert scores.headline([]) is None


def test_compute_checks_its_inputs_once():
  with pytest.raises(ValueError, match="topk: expected at least 1, at most 4, got 5"):
    scores.compute(np.zeros((3, 4)), topk=(5,))
  with pytest.raises(ValueError, match="samples: expected a 3-D array"):
    scores.compute(np.zeros((3, 4)), samples=np.zeros((3, 4)))
  with pytest.raises(ValueError, match="human_probs: each row must sum to 1"):
    scores.compute(np.zeros((3, 4)), human_probs=np.zeros((3, 4)))


def test_log_probs_from_probs_keeps_underflowed_tails_apart():
  probs = np.array([[1.0, 1e-37, 0.0], [1.0, 2e-37, 0.0], [1.0, 0.0, 0.0]], np.float32)
  log_probs = scores.log_probs_from_probs(probs)
  assert log_probs.dtype == np.float32 and np.all(np.isfinite(log_probs))
  np.testing.assert_allclose(log_probs[:2, 1], np.log([1e-37, 2e-37]), rtol=1e-6)
  assert log_probs[2, 1] == -1000.0
  u = np.asarray(scores.neg_log_pmax(log_probs))
  assert u[1] > u[0] > u[2] >= 0  # three distinct scores where pmax is 1.0 for all three
  values = scores.from_predictions(mean_probs=probs).scores
  np.testing.assert_array_equal(values["neg_log_pmax"], u)


def test_order_twins_rank_examples_identically():
  logits = np.random.default_rng(5).normal(size=(300, 6)).astype(np.float32)
  for tied, tie_free in scores.RANKING_TWINS:
    assert scores.same_order_as(tied) == tie_free and scores.same_order_as(tie_free) == tied
    assert scores.is_tied_twin(tied) and not scores.is_tied_twin(tie_free)
    values = scores.compute(logits)
    sign = (
      1
      if scores.REGISTRY[tied].confident_when_high == scores.REGISTRY[tie_free].confident_when_high
      else -1
    )
    np.testing.assert_array_equal(
      np.argsort(sign * np.asarray(values[tied]), kind="stable"),
      np.argsort(np.asarray(values[tie_free]), kind="stable"),
    )
  assert scores.same_order_as("entropy") is None
  # Not one ranking in float32: saturated pmax ties (1.0) where -log pmax resolves.
  saturated = np.zeros((50, 6), np.float32)
  saturated[:, 0] = np.linspace(20, 30, 50)
  values = scores.compute(saturated)
  assert np.all(np.asarray(values["pmax"]) == 1.0)
  assert len(np.unique(np.asarray(values["neg_log_pmax"]))) == 50


def test_covariance_norm_of_huge_and_tiny_logits_is_scaled_not_nan():
  x = np.random.default_rng(6).normal(size=(4, 3, 5)).astype(np.float32)
  base = np.asarray(scores.covariance_norm(x))
  for factor in (1e-15, 1e15, 1e18):
    value = np.asarray(scores.covariance_norm(x * np.float32(factor)))
    np.testing.assert_allclose(value, base * np.float32(factor) ** 2, rtol=1e-4)
  with pytest.raises(ValueError, match="exceeds the float32 range"):
    scores.covariance_norm(x * np.float32(1e20))


def test_covariance_norm_below_the_float_range_is_an_error_not_a_silent_zero():
  x = np.random.default_rng(6).normal(size=(4, 3, 5)).astype(np.float32)
  tiny = x * np.float32(1e-30)  # norms ~1e-60: below float32's smallest normal, 1.2e-38
  with pytest.raises(ValueError, match=r"3 example\(s\) .* below the float32 range"):
    scores.covariance_norm(tiny)
  identical = np.repeat(tiny[:1], 4, axis=0)  # an exact 0, not an underflow
  np.testing.assert_array_equal(scores.covariance_norm(identical), np.zeros(3))
  if jax.config.jax_enable_x64:  # float64 samples hold the same spread
    base = np.asarray(scores.covariance_norm(x.astype(np.float64)))
    np.testing.assert_allclose(
      scores.covariance_norm(tiny.astype(np.float64)), base * 1e-60, rtol=1e-5
    )


def test_oracle_loss_is_the_true_class_cross_entropy_and_stays_an_oracle():
  logits = np.random.default_rng(7).normal(size=(50, 6)).astype(np.float32) * 3
  labels = np.arange(50) % 6
  expected = -np.log(_softmax64(logits)[np.arange(50), labels])
  np.testing.assert_allclose(scores.oracle_loss(logits, labels), expected, rtol=1e-5, atol=1e-6)
  assert "oracle_loss" not in scores.compute(logits)  # only where the labels are given
  with_labels = scores.compute(logits, labels=labels)
  np.testing.assert_allclose(with_labels["oracle_loss"], expected, rtol=1e-5, atol=1e-6)
  assert scores.label("oracle_loss").startswith("oracle")
  assert not scores.REGISTRY["oracle_loss"].on_device
  assert "oracle_loss" in scores.from_predictions(logits=logits[None], labels=labels).scores
  with pytest.raises(ValueError, match="labels: labels out of range"):
    scores.oracle_loss(logits, labels + 6)


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_top_k_scores_equal_the_sort_based_definition_with_ties(k):
  # margin and -log top-k mass find the top k by arg-max passes (k <= 16) or lax.top_k.
  rng = np.random.default_rng(k)
  logits = np.round(2 * rng.normal(size=(500, 40))).astype(np.float32)
  top = np.sort(logits, axis=-1)[:, ::-1][:, :k]
  shifted = np.exp(logits - top[:, :1])
  expected = -np.log(np.exp(top - top[:, :1]).sum(-1) / shifted.sum(-1))
  np.testing.assert_allclose(scores.neg_log_topk_mass(logits, k), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(scores.margin(logits), top[:, 0] - np.sort(logits)[:, -2])
