"""Recalibration with m labelled shifted examples: the protocol's ``refit_on``, the draws,
the clean-prior update of the bins and its prior strength, and ``Calibrator.update``."""

import json

import jax
import numpy as np
import pytest
from synthetic import classifier_logits

from top1_jax import Calibrator
from top1_jax.core import binning
from top1_jax.estimators import base
from top1_jax.evaluation import crossval, protocol, recalibration

NUM = 400
SCORES = ("neg_log_pmax",)


def _inputs(logits, labels):
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float32)
  return protocol.Inputs(log_probs, labels, {"neg_log_pmax": -log_probs.max(1)})


LOGITS, LABELS = classifier_logits(NUM, 10, seed=3)
CLEAN = _inputs(LOGITS, LABELS)
NOISE = np.random.default_rng(4).normal(size=LOGITS.shape)
SHIFTED = _inputs((LOGITS * 0.6 + 2 * NOISE).astype(np.float32), LABELS)
SPLITS = crossval.make_splits(NUM, 4, seed=1)


def _rows(results):
  return {(r.score, r.estimator, r.test_set): r.metrics for r in results}


# The protocol's refit_on.


def test_refit_on_the_clean_calibration_parts_gives_the_clean_rows():
  # Refitted on the set's own calibration part, each split fits what the clean fit does.
  chosen = protocol.methods(["bins", "isotonic"], SCORES, bin_count=10)
  clean = protocol.evaluate(CLEAN, SPLITS, chosen, test_sets=[CLEAN], n_bins=10)
  whole = np.stack([~SPLITS.test_mask(f) for f in range(SPLITS.num_splits)])
  refit = protocol.evaluate(CLEAN, SPLITS, chosen, test_sets=[CLEAN], n_bins=10, refit_on=whole)
  for key, metrics in _rows(clean).items():
    for name in crossval.METRICS:
      np.testing.assert_array_equal(_rows(refit)[key].per_fold[name], metrics.per_fold[name])


def test_refit_on_fits_each_set_on_its_own_examples():
  # A plain loop: fit the bins on the set's labelled examples, score in the clean bins.
  chosen = [protocol.method("bins", "neg_log_pmax", {"n_bins": 5})]
  draws, masks = recalibration.label_draws(SPLITS, 60, 1, seed=0)
  (result,) = protocol.evaluate(
    CLEAN, draws, chosen, test_sets=[SHIFTED], n_bins=10, refit_on=masks
  )
  u, u_clean = SHIFTED.scores["neg_log_pmax"], CLEAN.scores["neg_log_pmax"]
  correct = SHIFTED.log_probs.argmax(1) == LABELS
  for f in range(draws.num_splits):
    test = draws.test_mask(f)
    bins = binning.fit(u[masks[f]], correct[masks[f]], 5)
    p = np.asarray(binning.predict(bins, u[test]), np.float64)
    scoring = binning.fit(u_clean[~test], (CLEAN.log_probs.argmax(1) == LABELS)[~test], 10)
    held = protocol.counted_in([scoring], u[test][None], correct[test][None])
    expected = protocol.split_metrics([protocol.binned_predictions(held, p)])
    for name in ("ece", "brier", "nll", "auroc"):
      np.testing.assert_allclose(result.metrics.per_fold[name][0, f], expected[name][0, 0, 0])


def test_an_update_with_an_infinite_prior_keeps_the_clean_bins():
  clean_bins = protocol.method("bins", "neg_log_pmax", {"n_bins": 10})
  kept = clean_bins._replace(
    update=lambda state, evidence: recalibration.update_bins(state, evidence, np.inf)
  )
  draws, masks = recalibration.label_draws(SPLITS, 50, 2, seed=0)
  (expected,) = protocol.evaluate(CLEAN, draws, [clean_bins], test_sets=[SHIFTED], n_bins=10)
  (updated,) = protocol.evaluate(
    CLEAN, draws, [kept], test_sets=[SHIFTED], n_bins=10, refit_on=masks
  )
  for name in crossval.METRICS:
    np.testing.assert_array_equal(updated.metrics.per_fold[name], expected.metrics.per_fold[name])


@pytest.mark.parametrize(
  "refit_on, message",
  [
    (np.ones((4, NUM), bool), "refit_on: split 0 needs examples to fit on, all within its"),
    (np.ones((3, NUM), bool), "refit_on: expected a [4, 400] bool mask, got bool (3, 400)"),
    (np.zeros((4, NUM), bool), "refit_on: split 0 needs examples to fit on"),
  ],
)
def test_refit_on_refusals_are_one_line(refit_on, message):
  chosen = [protocol.method("bins", "neg_log_pmax", {"n_bins": 5})]
  with pytest.raises(ValueError) as info:
    protocol.evaluate(CLEAN, SPLITS, chosen, test_sets=[SHIFTED], n_bins=5, refit_on=refit_on)
  assert str(info.value).startswith(message) and "\n" not in str(info.value)


# The draws.


def test_label_draws_are_nested_within_each_calibration_part():
  small, small_masks = recalibration.label_draws(SPLITS, 20, 3, seed=7)
  large, large_masks = recalibration.label_draws(SPLITS, 100, 3, seed=7)
  assert small.num_splits == large.num_splits == 3 * SPLITS.num_splits
  for f in range(small.num_splits):
    test = SPLITS.test_mask(f % SPLITS.num_splits)
    np.testing.assert_array_equal(small.test_mask(f), test)
    assert small_masks[f].sum() == 20 and not (small_masks[f] & test).any()
    assert not (small_masks[f] & ~large_masks[f]).any()  # the first 20 of the same draw
  assert not np.array_equal(small_masks[0], small_masks[SPLITS.num_splits])  # draws differ


def test_label_draws_of_a_whole_calibration_part_draw_once():
  whole = int((~SPLITS.test_mask(0)).sum())
  draws, masks = recalibration.label_draws(SPLITS, whole, 5)
  assert draws.num_splits == SPLITS.num_splits and masks.sum(1).tolist() == [whole] * 4


def test_label_draws_and_recalibrate_refuse_what_is_not_splits():
  message = "splits: expected crossval.Splits from make_splits, got ndarray"
  with pytest.raises(ValueError, match=message):
    recalibration.label_draws(SPLITS.fold, 20, 1)
  with pytest.raises(ValueError, match=message):
    recalibration.recalibrate(CLEAN, [SHIFTED], SPLITS.fold, scores=SCORES, log_probs_score="x")


@pytest.mark.parametrize(
  "num_labels, message",
  [
    ((0, 201), "num_labels: 201 labelled examples exceed the smallest calibration part (200"),
    ((5,), "num_labels: expected 0 or at least 10 labelled examples"),
    ((-1,), "num_labels: expected at least 0, got -1"),
    (25, "num_labels: expected a non-empty sequence of integers, got 25"),
  ],
)
def test_recalibrate_refusals_are_one_line(num_labels, message):
  with pytest.raises(ValueError) as info:
    recalibration.recalibrate(
      CLEAN, [SHIFTED], SPLITS, scores=SCORES, log_probs_score="neg_log_pmax",
      num_labels=num_labels,
    )  # fmt: skip
  assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_recalibrate_gives_the_clean_rows_at_zero_and_better_bins_with_labels():
  found = recalibration.recalibrate(
    CLEAN, {"clean": CLEAN, "shifted": SHIFTED}, SPLITS, scores=SCORES,
    log_probs_score="neg_log_pmax", num_labels=(0, 150), num_draws=2, n_bins=10,
  )  # fmt: skip
  by = {(r.recalibration, r.test_set, r.num_labels): r.metrics for r in found}
  assert {k[0] for k in by} == set(recalibration.RECALIBRATIONS)
  # m = 0: the clean fits, as the shift protocol gives them today.
  today = protocol.evaluate_shifts(
    CLEAN, {"clean": CLEAN, "shifted": SHIFTED}, SPLITS, scores=SCORES,
    estimators=["temperature", "bins", "isotonic"], n_bins=10, log_probs_score="neg_log_pmax",
  )  # fmt: skip
  names = {"temperature": ("temperature",), "bins": ("bins_refit", "bins_from_clean")}
  for r in today:
    for name in names.get(r.estimator, (r.estimator,)):
      assert by[name, r.test_set, 0].rows() == r.metrics.rows()
  assert by["bins_refit", "shifted", 150].per_fold["ece"].shape == (1, 8)  # 4 splits x 2 draws
  for name in ("bins_refit", "bins_from_clean", "isotonic"):
    assert by[name, "shifted", 150].mean["ece"] < by[name, "shifted", 0].mean["ece"], name


# The clean-prior update of the bins.


def _loo_oracle(prob, counts, hits, strength):
  """Each example left out in turn, its outcome's log-probability under the others' update."""
  total = 0.0
  for p, n, h in zip(prob, counts, hits, strict=True):
    outcomes = [1] * int(h) + [0] * int(n - h)
    for i, c in enumerate(outcomes):
      rest = outcomes[:i] + outcomes[i + 1 :]
      q = p if np.isinf(strength) else (strength * p + sum(rest)) / (strength + len(rest))
      total += np.log(max(q if c else 1 - q, 1e-12))
  return total


@pytest.mark.parametrize("seed", range(4))
def test_the_prior_strength_maximises_the_leave_one_out_likelihood(seed):
  rng = np.random.default_rng(seed)
  prob = rng.uniform(0.05, 0.95, 6)
  counts = rng.integers(0, 9, 6)
  hits = rng.binomial(counts, rng.uniform(0, 1, 6))
  chosen = recalibration.choose_prior_strength(prob, counts, hits)
  likelihoods = {s: _loo_oracle(prob, counts, hits, s) for s in recalibration.PRIOR_STRENGTHS}
  assert likelihoods[float(chosen)] == pytest.approx(max(likelihoods.values()), rel=1e-9)


def test_the_prior_strength_follows_the_new_data():
  rng = np.random.default_rng(0)
  prob = np.linspace(0.1, 0.9, 10)
  counts = np.full(10, 40)
  agreeing = rng.binomial(counts, prob)  # drawn from the clean probabilities
  contrary = rng.binomial(counts, 1 - prob)  # the shift turned them round
  assert recalibration.choose_prior_strength(prob, counts, agreeing) >= 64
  assert recalibration.choose_prior_strength(prob, counts, contrary) <= 2
  # No new examples: the clean bins are kept.
  assert recalibration.choose_prior_strength(prob, 0 * counts, 0 * counts) == np.inf


def test_update_bins_adds_the_new_hits_to_the_clean_prior():
  u = np.linspace(0, 1, 200)
  bins = binning.fit(u, u < 0.7, 4)
  new = base.Evidence(np.array([0.1, 0.2, 0.9, 0.95]), np.array([True, False, True, True]))
  updated = recalibration.update_bins(bins, new, prior_strength=3.0)
  p = np.asarray(bins.prob, np.float64)
  expected = [(3 * p[0] + 1) / 5, p[1], p[2], (3 * p[3] + 2) / 5]
  np.testing.assert_allclose(np.asarray(updated.prob), expected, rtol=1e-6)
  for field in ("edges", "counts", "hits", "prior"):
    np.testing.assert_array_equal(getattr(updated, field), getattr(bins, field))


def test_the_updated_interval_is_the_beta_posteriors():
  u = np.linspace(0, 1, 200)
  bins = binning.fit(u, u < 0.7, 4)
  new = base.Evidence(np.linspace(0, 1, 40), np.arange(40) % 3 > 0)
  update = recalibration.bin_update(bins, new, prior_strength=5.0)
  lower, upper = recalibration.update_interval(update, bins, new, 0.1)
  p = np.asarray(recalibration.applied(bins, update).prob)[binning.assign(bins.edges, new.u)]
  assert np.all((lower <= p) & (p <= upper)) and np.all(upper - lower > 0.05)
  infinite = update._replace(prior_strength=np.inf)
  lower, upper = recalibration.update_interval(infinite, bins, new, 0.1)
  exact = binning.clopper_pearson(bins.hits, bins.counts, 0.1)
  index = binning.assign(bins.edges, new.u)
  np.testing.assert_allclose(lower, np.asarray(exact[0])[index], rtol=1e-6)


# Calibrator.update.


def _shifted_logits(logits):
  return (logits * 0.6 + 2 * NOISE[: len(logits)]).astype(np.float32)


def test_calibrator_update_of_the_bins_is_the_clean_prior_update():
  cal = Calibrator(n_bins=10).fit(LOGITS[:200], LABELS[:200])
  clean_bins = cal.bins_
  x, y = _shifted_logits(LOGITS[200:260]), LABELS[200:260]
  assert cal.update(x, y) is cal
  u = -np.asarray(jax.nn.log_softmax(x)).max(1)
  expected = recalibration.update_bins(clean_bins, base.Evidence(u, x.argmax(1) == y))
  np.testing.assert_array_equal(cal.bins_.prob, expected.prob)
  assert cal.update_.counts.sum() == 60 and cal.clean_bins_ is clean_bins
  # A second update starts from the clean bins again.
  cal.update(x[:30], y[:30], prior_strength=2.0)
  again = recalibration.update_bins(clean_bins, base.Evidence(u[:30], (x.argmax(1) == y)[:30]), 2.0)
  np.testing.assert_array_equal(cal.bins_.prob, again.prob)
  lower, upper = cal.predict_interval(x)
  p = cal.predict_confidence(x)
  assert np.all((lower <= p + 1e-6) & (p <= upper + 1e-6))
  # Saved and loaded, the update is kept; fitted again, it is forgotten.
  loaded = Calibrator.from_dict(json.loads(json.dumps(cal.to_dict())))
  np.testing.assert_array_equal(loaded.predict_confidence(x), p)
  assert loaded.update_.prior_strength == 2.0
  cal.fit(LOGITS[:200], LABELS[:200])
  assert not hasattr(cal, "update_")
  np.testing.assert_array_equal(cal.bins_.prob, clean_bins.prob)


@pytest.mark.parametrize("method", ["isotonic", "temperature"])
def test_calibrator_update_of_another_method_refits_it(method):
  x, y = _shifted_logits(LOGITS[200:300]), LABELS[200:300]
  cal = Calibrator(method=method).fit(LOGITS[:200], LABELS[:200]).update(x, y)
  fresh = Calibrator(method=method).fit(x, y)
  np.testing.assert_array_equal(cal.predict_confidence(LOGITS), fresh.predict_confidence(LOGITS))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"labels": LABELS[:10], "x": LOGITS[:10, :5]}, "x: expected 10 classes like the calibration"),
    ({"prior_strength": 0}, "prior_strength: expected a number > 0 or None, got 0"),
    ({"labels": LABELS[:9]}, "length mismatch: logits has 10, labels has 9"),
  ],
)
def test_calibrator_update_refusals_are_one_line(kwargs, message):
  cal = Calibrator().fit(LOGITS[:200], LABELS[:200])
  args = {"x": LOGITS[:10], "labels": LABELS[:10], **kwargs}
  with pytest.raises(ValueError) as info:
    cal.update(**args)
  assert str(info.value).startswith(message) and "\n" not in str(info.value)
  assert not hasattr(cal, "update_")


def test_a_saved_update_is_checked_when_read():
  cal = Calibrator(n_bins=4).fit(LOGITS[:200], LABELS[:200])
  cal.update(_shifted_logits(LOGITS[200:260]), LABELS[200:260])
  saved = cal.to_dict()
  saved["update"]["hits"] = [9, 0, 0, 0] if saved["update"]["counts"][0] < 9 else [99, 0, 0, 0]
  with pytest.raises(ValueError, match="the update needs 0 <= hits <= counts"):
    Calibrator.from_dict(saved, "cal.json")
