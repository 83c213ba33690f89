"""Label-free accuracy estimates: ATC's threshold, DoC, average confidence and the paper's
calibrated bins, under the evaluation protocol and through ``Calibrator.estimate_accuracy``."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import classifier_logits

from top1_jax import Calibrator
from top1_jax.core import binning
from top1_jax.core import scores as score_registry
from top1_jax.evaluation import accuracy_estimates, crossval, ood, protocol

NUM = 400
SCORES = ("neg_log_pmax", "entropy", "pmax")


def _inputs(logits, labels):
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float32)
  scores = {name: np.asarray(score_registry.compute_one(name, log_probs)) for name in SCORES}
  return protocol.Inputs(log_probs, labels, scores)


LOGITS, LABELS = classifier_logits(NUM, 10, seed=3)
CLEAN = _inputs(LOGITS, LABELS)
NOISE = np.random.default_rng(4).normal(size=LOGITS.shape)
SHIFTED = _inputs((LOGITS * 0.6 + 2 * NOISE).astype(np.float32), LABELS)
OOD = _inputs(np.random.default_rng(5).normal(size=(150, 10)).astype(np.float32), None)
SPLITS = crossval.make_splits(NUM, 4, seed=1)


@settings(max_examples=40, deadline=None)
@given(
  st.lists(st.sampled_from([0.1, 0.5, 0.5, 0.9, 1.0, 1.0, 1.0]), min_size=1, max_size=40),
  st.integers(0, 2**31 - 1),
)
def test_atc_gives_the_calibration_accuracy_back_even_with_ties(values, seed):
  confidence = np.asarray(values)
  correct = np.random.default_rng(seed).random(len(values)) < 0.6
  threshold = accuracy_estimates.atc_threshold(confidence, correct)
  assert 0 <= threshold.tie_weight <= 1
  assert np.mean(accuracy_estimates.above(threshold, confidence)) == pytest.approx(correct.mean())


def test_atc_threshold_without_ties_is_garg_et_als():
  # A plain loop: the largest t such that the scores strictly above it are as many as the hits.
  rng = np.random.default_rng(0)
  confidence, correct = rng.random(50), rng.random(50) < 0.7
  threshold = accuracy_estimates.atc_threshold(confidence, correct)
  hits = correct.sum()
  expected = max(t for t in confidence if (confidence > t).sum() == hits - 1)
  assert threshold == (expected, 1.0)
  target = rng.random(30)
  assert accuracy_estimates.above(threshold, target).mean() == pytest.approx(
    np.mean(target >= expected)
  )


def test_doc_and_atc_on_the_calibration_data_itself_are_its_accuracy():
  correct = CLEAN.log_probs.argmax(1) == LABELS
  confidence = np.exp(CLEAN.log_probs.max(1))
  ref = accuracy_estimates.reference(correct, confidence, {"entropy": CLEAN.scores["entropy"]})
  views = accuracy_estimates.Views(confidence, "entropy", CLEAN.scores["entropy"])
  for name in ("doc", "atc"):
    assert accuracy_estimates.predicted_accuracy(name, ref, views) == pytest.approx(correct.mean())
  average = accuracy_estimates.predicted_accuracy("average_confidence", ref, views)
  assert average == pytest.approx(confidence.mean())


def test_an_uncertainty_is_turned_round():
  assert accuracy_estimates.oriented("entropy", [1.0, 2.0]).tolist() == [-1.0, -2.0]
  assert accuracy_estimates.oriented("pmax", [0.5]).tolist() == [0.5]
  assert accuracy_estimates.oriented("a_stored_score", [3.0]).tolist() == [-3.0]


def test_estimate_under_the_protocol():
  found = accuracy_estimates.estimate(
    CLEAN, SPLITS, scores=("neg_log_pmax", "entropy"), shifted={"clean": CLEAN, "shifted": SHIFTED},
    ood={"noise": OOD}, n_bins=10,
  )  # fmt: skip
  keys = [(e.estimator, e.score, e.target) for e in found]
  assert keys[:3] == [("average_confidence", "pmax", t) for t in ("clean", "shifted", "noise")]
  assert len(keys) == len(set(keys)) == 3 * (2 + 2 * 2)
  by = {key: e for key, e in zip(keys, found, strict=True)}
  correct = CLEAN.log_probs.argmax(1) == LABELS
  shifted_correct = SHIFTED.log_probs.argmax(1) == LABELS
  for f in range(SPLITS.num_splits):
    test = SPLITS.test_mask(f)
    assert by["atc", "entropy", "shifted"].accuracy[f] == pytest.approx(
      shifted_correct[test].mean()
    )
    # DoC: the clean calibration accuracy minus the drop in average confidence.
    confidence = np.exp(CLEAN.log_probs.max(1))
    drop = confidence[~test].mean() - np.exp(SHIFTED.log_probs.max(1))[test].mean()
    doc = by["doc", "pmax", "shifted"].predicted[f]
    assert doc == pytest.approx(np.clip(correct[~test].mean() - drop, 0, 1), rel=1e-6)
  assert np.all(by["atc", "neg_log_pmax", "noise"].accuracy == 0)
  # On the OOD inputs the paper's estimate is ood.csv's mean P(correct) of the bins.
  (report,) = ood.ood_report(
    CLEAN, [OOD], SPLITS, scores=["neg_log_pmax"], estimators=["bins"], n_bins=10
  )
  calibrated = by["calibrated", "neg_log_pmax", "noise"].predicted
  np.testing.assert_allclose(calibrated, report.ood_prob.mean(1), rtol=1e-6)
  # The clean test parts: every estimator fitted on clean labels is near the truth (the
  # model's own confidence is over-confident).
  for (name, score, target), e in by.items():
    if target == "clean" and name != "average_confidence":
      assert abs(e.predicted.mean() - e.accuracy.mean()) < 0.1, (name, score)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"scores": ("margin",)}, "clean.scores: no score 'margin'"),
    ({"ood": {"x": _inputs(LOGITS[:, :5], None)}}, "ood['x'].log_probs: expected 10 classes"),
    ({"n_bins": 500}, "n_bins: expected at least 1, at most 200, got 500"),
  ],
)
def test_estimate_refusals_are_one_line(kwargs, message):
  with pytest.raises(ValueError) as info:
    accuracy_estimates.estimate(CLEAN, SPLITS, **{"scores": ("entropy",), **kwargs})
  assert str(info.value).startswith(message) and "\n" not in str(info.value)


# Calibrator.estimate_accuracy.

CAL = Calibrator(n_bins=10).fit(LOGITS[:300], LABELS[:300])
TARGET = (LOGITS[300:] * 0.6 + 2 * NOISE[300:]).astype(np.float32)


def test_calibrator_estimates_match_the_library():
  log_probs = np.asarray(jax.nn.log_softmax(LOGITS[:300]))
  correct = log_probs.argmax(1) == LABELS[:300]
  target = np.asarray(jax.nn.log_softmax(TARGET))
  for score in ("neg_log_pmax", "entropy"):
    threshold = accuracy_estimates.atc_threshold(
      accuracy_estimates.oriented(score, score_registry.compute_one(score, log_probs)), correct
    )
    u = accuracy_estimates.oriented(score, score_registry.compute_one(score, target))
    expected = accuracy_estimates.above(threshold, u).mean()
    assert CAL.estimate_accuracy(TARGET, "atc", score) == pytest.approx(expected)
  assert CAL.estimate_accuracy(TARGET) == CAL.estimate_accuracy(TARGET, "atc", "neg_log_pmax")
  p = CAL.predict_confidence(TARGET)
  assert CAL.estimate_accuracy(TARGET, "calibrated") == pytest.approx(p.mean(), rel=1e-6)
  pmax = np.exp(target.max(1))
  assert CAL.estimate_accuracy(TARGET, "average_confidence") == pytest.approx(pmax.mean())
  doc = correct.mean() - (np.exp(log_probs.max(1)).mean() - pmax.mean())
  assert CAL.estimate_accuracy(TARGET, "doc") == pytest.approx(doc)
  assert isinstance(CAL.bins_, binning.Bins)


@pytest.mark.parametrize(
  "args, message",
  [
    ((TARGET, "atc", "margin"), "score: expected one of neg_log_pmax, entropy (the scores whose"),
    ((TARGET, "platt"), "method: expected one of average_confidence, doc, calibrated, atc"),
    ((TARGET, "doc", "entropy"), "score: method 'doc' reads no score of choice"),
    ((TARGET[:, :5],), "x: expected 10 classes like the calibration data, got shape (100, 5)"),
  ],
)
def test_calibrator_estimate_refusals_are_one_line(args, message):
  with pytest.raises(ValueError) as info:
    CAL.estimate_accuracy(*args)
  assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_reference_survives_saving():
  loaded = Calibrator.from_dict(CAL.to_dict())
  for method in accuracy_estimates.ESTIMATORS:
    assert loaded.estimate_accuracy(TARGET, method) == CAL.estimate_accuracy(TARGET, method)
  older = {k: v for k, v in CAL.to_dict().items() if k != "reference"}
  with pytest.raises(ValueError, match="keeps no calibration reference"):
    Calibrator.from_dict(older).estimate_accuracy(TARGET)
