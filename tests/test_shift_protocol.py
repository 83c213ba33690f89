"""The evaluation protocol under shift: calibrate on clean data, test on shifted sets."""

import jax
import numpy as np
import pytest
from synthetic import classifier_logits

from top1_jax.core import binning, metrics
from top1_jax.core import scores as score_registry
from top1_jax.estimators import temperature
from top1_jax.evaluation import comparison, crossval, ood, protocol

NUM, N_BINS = 400, (5, 12)
SCORES = ("entropy", "pmax")


def _inputs(logits, labels):
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float32)
  computed = {name: np.asarray(score_registry.compute_one(name, log_probs)) for name in SCORES}
  return protocol.Inputs(log_probs, labels, {**computed, "neg_log_pmax": -log_probs.max(1)})


def _shifted(logits, labels, level, seed):
  """The same examples, less confident and noisier: a shifted set."""
  noise = np.random.default_rng(seed).normal(size=logits.shape)
  return _inputs((logits * (1 - 0.4 * level) + 2 * level * noise).astype(np.float32), labels)


LOGITS, LABELS = classifier_logits(NUM, 10, seed=3)
CLEAN = _inputs(LOGITS, LABELS)
NOISY = _shifted(LOGITS, LABELS, 1.0, seed=4)
SPLITS = crossval.make_splits(NUM, 4, seed=1)
CORRECT = CLEAN.log_probs.argmax(1) == LABELS


def _one_split():
  """The first split of ``SPLITS`` alone: every example is in its test or its calibration part."""
  return crossval.Splits(SPLITS.fold, SPLITS.per_rep, 1)


def _assert_same(a: crossval.CrossValidation, b: crossval.CrossValidation, exact: bool):
  assert a.n_bins == b.n_bins
  for name in crossval.METRICS:
    if exact:
      np.testing.assert_array_equal(a.per_fold[name], b.per_fold[name], err_msg=name)
    else:
      np.testing.assert_allclose(a.per_fold[name], b.per_fold[name], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("estimator", crossval.ESTIMATORS)
def test_unshifted_rows_equal_cross_validate(estimator):
  # The generic fit/predict loop is one code path: exact; the bins' one-sort fast path
  # agrees within float32 rounding.
  results = protocol.evaluate_shifts(
    CLEAN, [CLEAN], SPLITS, scores=SCORES, estimators=[estimator], n_bins=N_BINS
  )
  assert [(r.score, r.estimator, r.test_set) for r in results] == [
    (score, estimator, 0) for score in SCORES
  ]
  for result in results:
    increasing = score_registry.lookup(result.score).confident_when_high
    expected = crossval.cross_validate(
      CLEAN.scores[result.score], CORRECT, N_BINS, splits=SPLITS, estimator=estimator,
      increasing=increasing,
    )  # fmt: skip
    _assert_same(result.metrics, expected, exact=estimator != "bins")
    if estimator != "bins":  # the tables' rows too, means and stds over splits included
      assert result.metrics.rows() == expected.rows()
    for row, expected_row in zip(result.metrics.rows(), expected.rows(), strict=True):
      assert row == pytest.approx(expected_row, rel=2e-6, abs=1e-7)


def test_clean_rows_unchanged_beside_shifted_sets():
  # Predicting every set's test part in one call changes none of the clean set's numbers.
  estimators = ["bins", "isotonic", "raw", "temperature"]
  kwargs = dict(scores=SCORES, estimators=estimators, n_bins=N_BINS, log_probs_score="entropy")
  alone = protocol.evaluate_shifts(CLEAN, {"clean": CLEAN}, SPLITS, **kwargs)
  together = protocol.evaluate_shifts(CLEAN, {"noisy": NOISY, "clean": CLEAN}, SPLITS, **kwargs)
  clean_rows = [r for r in together if r.test_set == "clean"]
  assert len(clean_rows) == len(alone) == 2 * 2 + 2
  for a, b in zip(alone, clean_rows, strict=True):
    assert (a.score, a.estimator) == (b.score, b.estimator)
    _assert_same(a.metrics, b.metrics, exact=False)
  noisy = {(r.score, r.estimator): r.metrics.mean for r in together if r.test_set == "noisy"}
  for a in alone:  # shift lowers the accuracy and raises every method's Brier score
    assert noisy[a.score, a.estimator]["accuracy"][0] < a.metrics.mean["accuracy"][0] - 0.1
    assert noisy[a.score, a.estimator]["brier"][0] > a.metrics.mean["brier"][0]


def _with(inputs: protocol.Inputs, where: np.ndarray, other: protocol.Inputs) -> protocol.Inputs:
  """``inputs`` with ``other``'s log-probabilities, labels and scores at ``where``."""
  pick = lambda a, b: np.where(where.reshape(-1, *[1] * (np.ndim(a) - 1)), b, a)  # noqa: E731
  scores = {name: pick(u, other.scores[name]) for name, u in inputs.scores.items()}
  return protocol.Inputs(pick(inputs.log_probs, other.log_probs), inputs.labels, scores)


def test_fitted_on_the_clean_calibration_part_only():
  splits = _one_split()
  test = splits.test_mask(0)
  kwargs = dict(
    scores=SCORES, estimators=["bins", "isotonic", "raw", "temperature", "toplabel"],
    n_bins=N_BINS, log_probs_score="entropy", options={"toplabel": {"points_per_bin": 20}},
  )  # fmt: skip
  base = protocol.evaluate_shifts(CLEAN, [NOISY], splits, **kwargs)

  def changed(clean, shifted):
    return [
      not np.array_equal(a.metrics.per_fold["brier"], b.metrics.per_fold["brier"])
      for a, b in zip(
        base, protocol.evaluate_shifts(clean, [shifted], splits, **kwargs), strict=True
      )
    ]

  # Neither the shifted set's calibration part nor the clean set's test part is used.
  assert not any(changed(_with(CLEAN, test, NOISY), _with(NOISY, ~test, CLEAN)))
  # The shifted set's test part is what is scored, by every method.
  assert all(changed(CLEAN, _with(NOISY, test, CLEAN)))
  # The clean calibration part is what every fitted method is fitted on ("raw" fits nothing).
  refitted = changed(_with(CLEAN, ~test, NOISY), NOISY)
  assert refitted == [r.estimator != "raw" for r in base]


def test_raw_is_the_top1_brier_of_pmax():
  results = protocol.evaluate_shifts(
    CLEAN, {"clean": CLEAN, "noisy": NOISY}, SPLITS, scores=(), estimators=["raw"],
    n_bins=N_BINS, log_probs_score="neg_log_pmax",
  )  # fmt: skip
  for result, inputs in zip(results, (CLEAN, NOISY), strict=True):
    assert result.score == "neg_log_pmax"
    pmax = np.exp(inputs.log_probs.max(1))
    correct = inputs.log_probs.argmax(1) == LABELS
    per_split = [
      metrics.brier(pmax[SPLITS.test_mask(f)], correct[SPLITS.test_mask(f)]) for f in range(4)
    ]
    np.testing.assert_allclose(result.metrics.per_fold["brier"][0], per_split, rtol=1e-6)
    # The main job's Table-1 column of the same splits: the mean of the same numbers.
    rows = comparison.baseline_rows(inputs.log_probs, LABELS, SPLITS, single_model=False)
    assert result.metrics.mean["brier"][0] == pytest.approx(rows[0]["raw_top1_brier"], rel=1e-6)


def test_temperature_is_fitted_on_clean_and_applied_to_shifted():
  (result,) = protocol.evaluate_shifts(
    CLEAN, [NOISY], SPLITS, scores=(), estimators=["temperature"], n_bins=N_BINS,
    log_probs_score="neg_log_pmax",
  )  # fmt: skip
  correct = NOISY.log_probs.argmax(1) == LABELS
  expected, if_fitted_on_shifted = [], []
  for f in range(SPLITS.num_splits):
    test = SPLITS.test_mask(f)
    for source, out in ((CLEAN, expected), (NOISY, if_fitted_on_shifted)):
      t = temperature.fit_temperature(source.log_probs[~test], LABELS[~test])
      scaled = temperature.apply_temperature(NOISY.log_probs[test], t)
      out.append(metrics.brier(np.asarray(jax.nn.softmax(scaled)).max(1), correct[test]))
  np.testing.assert_allclose(result.metrics.per_fold["brier"][0], expected, rtol=2e-6)
  assert not np.allclose(result.metrics.per_fold["brier"][0], if_fitted_on_shifted, rtol=2e-6)


def _ood(num: int, scale: float, seed: int) -> protocol.Inputs:
  logits = scale * np.random.default_rng(seed).normal(size=(num, 10)).astype(np.float32)
  return _inputs(logits, None)


def test_ood_report():
  outside = {"noise": _ood(150, 1.0, 5), "sharp": _ood(150, 6.0, 6)}
  results = ood.ood_report(
    CLEAN, outside, SPLITS, scores=SCORES, estimators=["bins", "raw"], log_probs_score="entropy",
    n_bins=10,
  )  # fmt: skip
  assert [(r.score, r.estimator, r.ood) for r in results] == [
    ("entropy", "bins", "noise"), ("entropy", "bins", "sharp"),
    ("pmax", "bins", "noise"), ("pmax", "bins", "sharp"),
    ("entropy", "raw", "noise"), ("entropy", "raw", "sharp"),
  ]  # fmt: skip
  test_sizes = [SPLITS.test_mask(f).sum() for f in range(4)]
  for r in results:
    u_in, u_out = CLEAN.scores[r.score], outside[r.ood].scores[r.score]
    sign = -1.0 if r.score == "pmax" else 1.0  # pmax is a confidence: low means out
    is_out = np.r_[np.zeros(NUM, bool), np.ones(len(u_out), bool)]
    assert r.auroc == pytest.approx(metrics.auroc(sign * np.r_[u_in, u_out], is_out))
    assert r.ood_prob.shape == (4, len(u_out)) and r.clean_prob.shape == (sum(test_sizes),)
    assert r.auroc_prob.shape == (4,) and np.all((r.auroc_prob >= 0) & (r.auroc_prob <= 1))
    assert r.ood_summary == ood.probability_summary(r.ood_prob)
    assert r.clean_summary == ood.probability_summary(r.clean_prob)
  # Each split's bins, fitted on its clean calibration part, give the OOD inputs' P(correct).
  bins_noise = results[0]
  for f in range(4):
    cal = ~SPLITS.test_mask(f)
    bins = binning.fit(CLEAN.scores["entropy"][cal], CORRECT[cal], 10)
    expected = binning.predict(bins, outside["noise"].scores["entropy"])
    np.testing.assert_allclose(bins_noise.ood_prob[f], expected, rtol=1e-6)
  np.testing.assert_allclose(
    results[4].ood_prob, np.exp(outside["noise"].log_probs.max(1))[None].repeat(4, 0), rtol=1e-6
  )


def test_ood_auroc_of_perfect_separation_is_one():
  far = _inputs(LOGITS[:150], None)
  top = CLEAN.scores["entropy"].max()
  far = far._replace(scores={"entropy": top + 1 + np.arange(150, dtype=np.float32)})
  (result,) = ood.ood_report(CLEAN, [far], SPLITS, scores=["entropy"], estimators=["bins"])
  assert result.auroc == 1.0 and result.ood == 0


def test_probability_summary():
  summary = ood.probability_summary([0.0, 0.25, 0.5, 0.75, 1.0])
  assert tuple(summary) == ood.SUMMARY
  assert summary["mean"] == 0.5 and summary["quantile_0.5"] == 0.5
  assert summary["quantile_0.1"] == pytest.approx(0.1) and summary["quantile_0.9"] == 0.9
  assert summary["fraction_at_least_0.5"] == 0.6 and summary["fraction_at_least_0.9"] == 0.2


def _call(**changes):
  kwargs = dict(
    clean=CLEAN, shifted=[NOISY], splits=SPLITS, scores=SCORES, estimators=["bins", "raw"],
    n_bins=N_BINS, log_probs_score="entropy",
  )  # fmt: skip
  return lambda: protocol.evaluate_shifts(**{**kwargs, **changes})


_SHORT = protocol.Inputs(
  NOISY.log_probs[:-1], LABELS[:-1], {k: v[:-1] for k, v in NOISY.scores.items()}
)


@pytest.mark.parametrize(
  "call, message",
  [
    (_call(shifted=[_SHORT]), r"test_sets\[0\].log_probs: expected clean's 400 examples, got 399"),
    (
      _call(shifted={"x": NOISY._replace(labels=None)}),
      r"test_sets\['x'\].labels: expected \[400\]",
    ),
    (_call(estimators=["bins", "nope"]), "estimator: expected one of bins, .*, got 'nope'"),
    (_call(scores=["entropy", "nope"]), r"clean.scores: no score 'nope' \(it has: entropy"),
    (_call(log_probs_score=None), "log_probs_score: 'raw' needs a score to bin by, got None"),
    (_call(options={"kde": {}}), "options: expected a mapping .* got 'kde', not among"),
    (_call(options={"bins": {"nope": 1}}), "nope: not an option of estimator 'bins'"),
    (_call(splits=crossval.make_splits(300, 2)), "splits: made for 300 examples, clean has 400"),
    (_call(shifted=[]), "test_sets: expected a mapping or sequence of protocol.Inputs"),
    (_call(shifted=NOISY), "test_sets: expected a mapping or sequence of protocol.Inputs"),
    (_call(clean=(1, 2, 3)), "clean: expected protocol.Inputs"),
    (_call(k=11), "k: expected at least 1, at most 10, got 11"),
    (_call(n_bins=(5, 1000)), "n_bins: expected at least 1, at most"),
    (
      _call(shifted=[NOISY._replace(log_probs=np.exp(NOISY.log_probs))]),
      r"test_sets\[0\].log_probs: these look like probabilities",
    ),
    (
      _call(shifted=[NOISY._replace(scores={**NOISY.scores, "entropy": NOISY.scores["pmax"][:9]})]),
      r"length mismatch: test_sets\[0\].log_probs has 400, .*entropy'\] has 9",
    ),
  ],
)
def test_bad_inputs_are_one_line_value_errors(call, message):
  with pytest.raises(ValueError, match=message) as error:
    call()
  assert "\n" not in str(error.value)


def test_ood_bad_inputs():
  with pytest.raises(ValueError, match=r"ood\[0\].scores: no score 'pmax'") as error:
    far = protocol.Inputs(CLEAN.log_probs[:5], None, {"entropy": CLEAN.scores["entropy"][:5]})
    ood.ood_report(CLEAN, [far], SPLITS, scores=SCORES, estimators=["bins"])
  assert "\n" not in str(error.value)
  with pytest.raises(ValueError, match="n_bins: expected at least 1, at most 200, got 500"):
    ood.ood_report(CLEAN, [CLEAN], SPLITS, scores=SCORES, estimators=["bins"], n_bins=500)


def test_scoring_many_sets_never_stacks_their_log_probabilities():
  # The loop gathers each split's test rows set by set: the peak is about one [S * T, K]
  # target (T: a test part), not every set's [S, N, K] stacked first (2.2x it, was).
  import tracemalloc

  num, num_classes, num_sets = 2000, 100, 16
  logits, labels = classifier_logits(num, num_classes, seed=5)
  sets = [_shifted(logits, labels, level, seed=level) for level in range(num_sets)]
  clean = _shifted(logits, labels, 0, seed=0)
  chosen = protocol.methods(["temperature"], [], log_probs_score="pmax")
  splits = crossval.make_splits(num, 2)
  tracemalloc.start()
  try:
    protocol.evaluate(clean, splits, chosen, test_sets=sets, n_bins=(5,))
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 2 * num_sets * num * num_classes * 4
