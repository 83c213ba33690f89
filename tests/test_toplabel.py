"""Top-label binning: per-class bins are ``binning.fit`` on the class, the pooled
fallback, predictions, and a held-out win where calibration differs by class."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from top1_jax.core import binning, metrics
from top1_jax.estimators import toplabel

# P(correct | confidence c, predicted class): calibrated, overconfident, underconfident.
CURVES = (lambda c: c, lambda c: c**3, lambda c: np.sqrt(c))


def _draw(rng, num, class_weights=(0.4, 0.4, 0.2)):
  confidence = rng.uniform(0.2, 1.0, num).astype(np.float32)
  predicted = rng.choice(len(class_weights), num, p=class_weights)
  truth = np.choose(predicted, [curve(confidence) for curve in CURVES])
  return confidence, predicted, rng.random(num) < truth


def _assert_same_bins(actual, expected):
  for name, a, e in zip(binning.Bins._fields, actual, expected, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e), err_msg=name)


def _class(model, k):
  return binning.Bins(*(field[k] for field in model.per_class))


def test_per_class_bins_are_binning_fit_on_the_class():
  confidence, predicted, correct = _draw(np.random.default_rng(0), 3000, (0.5, 0.45, 0.05))
  model = toplabel.fit(confidence, predicted, correct, 10, num_classes=4, min_per_bin=20)
  # Class 2 has ~150 < 20 * 10 examples and class 3 none: both use the pooled bins.
  np.testing.assert_array_equal(model.own, [True, True, False, False])
  _assert_same_bins(model.pooled, binning.fit(confidence, correct, 10))
  for k in range(4):
    members = predicted == k
    expected = binning.fit(confidence[members], correct[members], 10) if k < 2 else model.pooled
    _assert_same_bins(_class(model, k), expected)


def test_predictions_are_each_class_bins_probabilities():
  rng = np.random.default_rng(1)
  model = toplabel.fit(*_draw(rng, 4000), n_bins=15)
  confidence, predicted, _ = _draw(rng, 2000)
  p = np.asarray(toplabel.predict(model, confidence, predicted))
  assert p.shape == (2000,) and np.all(np.isfinite(p)) and np.all((p > 0) & (p < 1))
  for k in range(3):
    members = predicted == k
    expected = binning.predict(_class(model, k), confidence[members])
    np.testing.assert_array_equal(p[members], expected)


def test_beats_pooled_binning_when_calibration_differs_by_class():
  rng = np.random.default_rng(2)
  confidence, predicted, correct = _draw(rng, 20000)
  model = toplabel.fit(confidence, predicted, correct, 15)
  pooled = binning.fit(confidence, correct, 15)
  test_confidence, test_predicted, test_correct = _draw(rng, 20000)
  top_label = metrics.brier(toplabel.predict(model, test_confidence, test_predicted), test_correct)
  single = metrics.brier(binning.predict(pooled, test_confidence), test_correct)
  assert float(top_label) < float(single) - 0.005


def test_the_number_of_classes_defaults_to_the_largest_class_plus_one():
  confidence, predicted, correct = _draw(np.random.default_rng(3), 600)
  model = toplabel.fit(confidence, predicted, correct, 5)
  assert model.num_classes == 3 and bool(jnp.all(model.own))


def test_fit_splits_is_fit_on_each_calibration_part_bit_for_bit():
  rng = np.random.default_rng(5)
  confidence, predicted, correct = _draw(rng, 3000, (0.5, 0.4, 0.1))
  confidence = np.round(confidence, 2)  # ties inside and across the splits' edges
  calibration = rng.random((4, 3000)) < np.array([[0.5], [0.5], [0.3], [0.9]])
  model = toplabel.fit_splits(
    confidence, predicted, correct, calibration, 10, num_classes=4, min_per_bin=20
  )
  assert model.own.shape == (4, 4) and model.num_classes == 4
  every = np.asarray(toplabel.predict(model, confidence, predicted))
  assert every.shape == (4, 3000)
  for f, cal in enumerate(calibration):
    alone = toplabel.fit(
      confidence[cal], predicted[cal], correct[cal], 10, num_classes=4, min_per_bin=20
    )
    split = jax.tree.map(lambda field, f=f: field[f], model)
    for actual, expected in zip(jax.tree.leaves(split), jax.tree.leaves(alone), strict=True):
      np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
    np.testing.assert_array_equal(every[f], toplabel.predict(alone, confidence, predicted))
  # Class 2 gets its own bins in the 90 % split only; class 3 never has examples.
  np.testing.assert_array_equal(np.asarray(model.own)[:, 2], [False, False, False, True])
  assert not np.asarray(model.own)[:, 3].any()


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda m: toplabel.predict(m, [0.5], [3]), "predicted_class: labels out of range"),
    (lambda m: toplabel.predict(m, [0.5, 0.2], [1]), "length mismatch"),
    (lambda m: toplabel.predict("m", [0.5], [1]), "model: expected toplabel.TopLabelBins"),
    (lambda m: toplabel.fit([0.5, 0.6], [0, 1.5], [1, 0]), "predicted_class: expected integer"),
    (lambda m: toplabel.fit([0.5, 0.6], [0, 1], [1, 0], 3), "n_bins: expected at least 1"),
    (lambda m: toplabel.fit([0.5], [0], [1], num_classes=0), "num_classes: expected at least 1"),
    (lambda m: toplabel.fit([0.5], [0], [1], 1, min_per_bin=0), "min_per_bin: expected at least 1"),
    (
      lambda m: toplabel.fit_splits([0.5, 0.6], [0, 1], [1, 0], [[True]], 1, num_classes=2),
      r"calibration: expected \[F, 2\] \(one row per split\), got shape \(1, 1\)",
    ),
    (
      lambda m: toplabel.fit_splits([0.5, 0.6], [0, 1], [1, 0], [[1, 0]], 2, num_classes=2),
      "n_bins: expected at least 1, at most 1, got 2",
    ),
  ],
)
def test_bad_input_gets_a_one_line_value_error(call, message):
  model = toplabel.fit(*_draw(np.random.default_rng(4), 300), n_bins=3)
  with pytest.raises(ValueError, match=message) as info:
    call(model)
  assert "\n" not in str(info.value)
