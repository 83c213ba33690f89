"""Top-label histogram binning against a port of Gupta & Ramdas's reference code
(``reference.TopLabelHistogramBinning``), on synthetic scores with ties and on real
CIFAR predictions; the fallback of a class with too few points; ``fit_splits``."""

import jax
import numpy as np
import pytest
import reference

from top1_jax import load_example
from top1_jax.core import binning, metrics
from top1_jax.estimators import toplabel
from top1_jax.evaluation import crossval

# P(correct | confidence c, predicted class): calibrated, overconfident, underconfident.
CURVES = (lambda c: c, lambda c: c**3, lambda c: np.sqrt(c))


def _draw(rng, num, class_weights=(0.4, 0.4, 0.2)):
  confidence = rng.uniform(0.2, 1.0, num).astype(np.float32)
  predicted = rng.choice(len(class_weights), num, p=class_weights)
  truth = np.choose(predicted, [curve(confidence) for curve in CURVES])
  return confidence, predicted, rng.random(num) < truth


def _as_probs(confidence, predicted, num_classes):
  """[N, K] rows whose max is ``confidence`` at ``predicted`` (the port reads a matrix)."""
  probs = np.zeros((confidence.shape[0], num_classes))
  probs[np.arange(confidence.shape[0]), predicted] = confidence
  return probs


def _labels(predicted, correct, num_classes):
  return np.where(correct, predicted, (predicted + 1) % num_classes)


def _port(confidence, predicted, correct, num_classes, **options):
  probs = _as_probs(confidence, predicted, num_classes)
  fitted = reference.TopLabelHistogramBinning(**{"delta": 0.0, **options})
  return fitted.fit(probs, _labels(predicted, correct, num_classes))


@pytest.mark.parametrize("prior", [False, True])
def test_matches_the_reference_port_with_ties_and_a_class_too_small(prior):
  rng = np.random.default_rng(0)
  confidence, predicted, correct = _draw(rng, 3000, (0.5, 0.45, 0.05))
  confidence = np.round(confidence, 2)  # ties inside bins and at their edges
  predicted[predicted == 2] = np.where(rng.random(np.sum(predicted == 2)) < 0.8, 2, 3)
  predicted[:4] = 4  # class 4: 4 points, fewer than one bin's 7; class 5 never predicted
  model = toplabel.fit(confidence, predicted, correct, points_per_bin=7, prior=prior, num_classes=6)
  sizes = np.bincount(predicted, minlength=6)
  np.testing.assert_array_equal(model.num_bins, sizes // 7)
  assert np.asarray(model.own).tolist() == [True, True, True, True, False, False]
  port = _port(confidence, predicted, correct, 6, points_per_bin=7, prior=prior)
  for c in range(4):  # the edges: np.array_split's groups, tied edges merged
    want = np.unique(port.per_class[c].upper_edges[:-1])
    have = np.asarray(model.per_class.edges[c])
    np.testing.assert_array_equal(have[np.isfinite(have)], want.astype(np.float32))
  test_confidence = np.round(rng.uniform(0.1, 1.0, 2000), 2).astype(np.float32)  # edges too
  test_predicted = rng.choice(5, 2000, p=(0.3, 0.3, 0.2, 0.1, 0.1))
  p = np.asarray(toplabel.predict(model, test_confidence, test_predicted))
  want = port.predict(_as_probs(test_confidence, test_predicted, 6))
  np.testing.assert_allclose(p, want, rtol=1e-6, atol=0)  # float32 vs float64 means
  # Class 4 is left uncalibrated: its confidence comes back unchanged.
  np.testing.assert_array_equal(p[test_predicted == 4], test_confidence[test_predicted == 4])


@pytest.fixture(scope="module")
def cifar100():
  data = load_example("densenet-bc-100-cifar-100")
  return data.probs, data.labels, crossval.make_splits(data.labels.shape[0], 10, seed=0)


def test_matches_the_reference_on_cifar100_halves(cifar100):
  probs, labels, splits = cifar100
  pmax, predicted = probs.max(1), probs.argmax(1)
  correct = predicted == labels
  tests = np.stack([np.asarray(splits.test_mask(f)) for f in range(splits.num_splits)])
  model = toplabel.fit_splits(pmax, predicted, correct, ~tests, num_classes=100)
  own = np.asarray(model.own).sum(1)
  # A half's 5,000 examples over 100 classes: about half are predicted 50 times or more,
  # each getting one bin (n_c < 100); the others keep their raw pmax.
  assert own.tolist() == [56, 47, 52, 49, 52, 44, 52, 53, 48, 48]
  assert np.asarray(model.num_bins).max() == 1
  every = np.asarray(toplabel.predict(model, pmax, predicted))  # [10, N]
  for f in (0, 1):  # the reference as shipped: its noise (1e-10) and all
    cal, test = ~tests[f], tests[f]
    port = reference.TopLabelHistogramBinning(50, 1e-10, seed=f).fit(probs[cal], labels[cal])
    want = port.predict(probs[test])
    np.testing.assert_allclose(every[f][test], want, rtol=0, atol=1e-6)
  # No longer the pooled bins: the Top-1 bins of pmax differ where a class has its own.
  pooled = binning.fit(pmax[~tests[0]], correct[~tests[0]], 20)
  held_out = [every[0][tests[0]], np.asarray(binning.predict(pooled, pmax[tests[0]]))]
  briers = [float(metrics.brier(p, correct[tests[0]])) for p in held_out]
  assert abs(briers[0] - briers[1]) > 1e-3


def test_several_bins_per_class_match_the_reference_on_cifar10():
  data = load_example("lenet-5-cifar-10")  # ~250 points per class and half: 4-7 bins each
  probs, labels = data.probs, data.labels
  test = np.asarray(crossval.make_splits(labels.shape[0], 10, seed=0).test_mask(0))
  pmax, predicted = probs.max(1), probs.argmax(1)
  model = toplabel.fit(pmax[~test], predicted[~test], (predicted == labels)[~test])
  assert np.asarray(model.num_bins).min() >= 2
  port = reference.TopLabelHistogramBinning(50, 0.0).fit(probs[~test], labels[~test])
  p = np.asarray(toplabel.predict(model, pmax[test], predicted[test]))
  np.testing.assert_allclose(p, port.predict(probs[test]), rtol=2e-7, atol=0)


def test_an_empty_top_bin_predicts_one_half_as_the_reference():
  # Class 0's top scores tie with its last edge: nothing is above it, a test score is.
  confidence = np.array([0.1, 0.2, 0.3, 0.9, 0.9, 0.9], np.float32)
  correct = np.array([0, 1, 0, 1, 1, 1], bool)
  model = toplabel.fit(confidence, np.zeros(6, int), correct, points_per_bin=2)
  assert int(model.num_bins[0]) == 3 and int(model.per_class.num_effective_bins[0]) == 2
  p = np.asarray(toplabel.predict(model, [0.15, 0.9, 0.95], [0, 0, 0]))
  port = _port(confidence, np.zeros(6, int), correct, 2, points_per_bin=2)
  want = port.predict(_as_probs(np.array([0.15, 0.9, 0.95], np.float32), np.zeros(3, int), 2))
  np.testing.assert_allclose(p, want, atol=1e-7)
  np.testing.assert_allclose(p, [0.5, 0.75, 0.5], rtol=1e-7)  # 0.9 x 3 in the middle bin


def test_a_class_without_bins_gets_its_confidence_or_the_value_given():
  rng = np.random.default_rng(1)
  confidence, predicted, correct = _draw(rng, 400, (0.9, 0.1))
  model = toplabel.fit(np.log(confidence), predicted, correct, points_per_bin=60)
  assert np.asarray(model.own).tolist() == [True, False]  # ~40 < 60 predictions of class 1
  log_test = np.log(np.array([0.5, 0.7, 0.9], np.float32))
  given = toplabel.predict(model, log_test, [0, 1, 1], uncalibrated=[0.1, 0.2, 0.3])
  np.testing.assert_allclose(np.asarray(given)[1:], [0.2, 0.3])
  # Without ``uncalibrated`` the confidence itself comes back, so it must be a probability.
  with pytest.raises(ValueError, match=r"^confidence: a class without bins .* min -0.35") as info:
    toplabel.predict(model, log_test, [0, 1, 1])
  assert "\n" not in str(info.value)
  assert toplabel.predict(model, log_test, [0, 0, 0]).shape == (3,)  # only class 0 used


def test_fit_splits_is_fit_on_each_calibration_part_bit_for_bit():
  rng = np.random.default_rng(5)
  confidence, predicted, correct = _draw(rng, 3000, (0.5, 0.4, 0.1))
  confidence = np.round(confidence, 2)  # ties inside and across the splits' edges
  calibration = rng.random((3, 3000)) < np.array([[0.5], [0.3], [0.9]])
  for prior in (False, True):
    options = {"num_classes": 4, "points_per_bin": 40, "prior": prior}
    model = toplabel.fit_splits(confidence, predicted, correct, calibration, **options)
    assert model.num_bins.shape == (3, 4) and model.num_classes == 4
    every = np.asarray(toplabel.predict(model, confidence, predicted))
    assert every.shape == (3, 3000)
    for f, cal in enumerate(calibration):
      alone = toplabel.fit(confidence[cal], predicted[cal], correct[cal], **options)
      width = alone.per_class.edges.shape[-1]  # fit_splits pads to its widest split
      split = jax.tree.map(lambda field, f=f: field[f], model)
      np.testing.assert_array_equal(split.num_bins, alone.num_bins)
      for name in binning.Bins._fields:
        have, want = (np.asarray(getattr(m.per_class, name)) for m in (split, alone))
        if name == "edges":
          assert np.all(np.isinf(have[:, width:]))
          have = have[:, :width]
        elif have.ndim == 2:
          have = have[:, : want.shape[1]]
        np.testing.assert_array_equal(have, want, err_msg=name)
      np.testing.assert_array_equal(every[f], toplabel.predict(alone, confidence, predicted))
  assert not np.asarray(model.own)[:, 3].any()  # class 3 is never predicted


def test_every_splits_prediction_holds_one_splits_temporaries():
  # One split at a time: XLA's per-example temporaries are [N], not [F, N] (vmapped over
  # 10 splits of 3M examples they took 1.4 GB). Bins wide enough for the search path.
  rng = np.random.default_rng(0)
  confidence, predicted, correct = _draw(rng, 1 << 14, (0.5, 0.5))

  def temporaries(num_splits):
    calibration = rng.random((num_splits, confidence.shape[0])) < 0.5
    model = toplabel.fit_splits(confidence, predicted, correct, calibration, points_per_bin=20)
    assert model.per_class.edges.shape[-1] > 32
    program = jax.jit(toplabel.predict).lower(model, confidence, predicted).compile()
    return program.memory_analysis().temp_size_in_bytes

  assert temporaries(16) < 2 * temporaries(1) + 4 * confidence.shape[0]


def test_beats_pooled_binning_when_calibration_differs_by_class():
  rng = np.random.default_rng(2)
  confidence, predicted, correct = _draw(rng, 20000)
  model = toplabel.fit(confidence, predicted, correct)
  pooled = binning.fit(confidence, correct, 15)
  test_confidence, test_predicted, test_correct = _draw(rng, 20000)
  top_label = metrics.brier(toplabel.predict(model, test_confidence, test_predicted), test_correct)
  single = metrics.brier(binning.predict(pooled, test_confidence), test_correct)
  assert float(top_label) < float(single) - 0.005


def test_the_number_of_classes_defaults_to_the_largest_class_plus_one():
  confidence, predicted, correct = _draw(np.random.default_rng(3), 600)
  model = toplabel.fit(confidence, predicted, correct)
  assert model.num_classes == 3 and np.asarray(model.own).all()


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda m: toplabel.predict(m, [0.5], [3]), "predicted_class: labels out of range"),
    (lambda m: toplabel.predict(m, [0.5, 0.2], [1]), "length mismatch"),
    (lambda m: toplabel.predict("m", [0.5], [1]), "model: expected toplabel.TopLabelBins"),
    (
      lambda m: toplabel.predict(m, [0.5], [1], uncalibrated=[1.5]),
      "uncalibrated: probabilities must lie in",
    ),
    (lambda m: toplabel.fit([0.5, 0.6], [0, 1.5], [1, 0]), "predicted_class: expected integer"),
    (lambda m: toplabel.fit([0.5], [0], [1], num_classes=0), "num_classes: expected at least 1"),
    (
      lambda m: toplabel.fit([0.5], [0], [1], points_per_bin=0),
      "points_per_bin: expected at least 1",
    ),
    (lambda m: toplabel.fit([0.5], [0], [1], prior="yes"), "prior: expected a bool"),
    (
      lambda m: toplabel.fit_splits([0.5, 0.6], [0, 1], [1, 0], [[True]], num_classes=2),
      r"calibration: expected \[F, 2\] \(one row per split\), got shape \(1, 1\)",
    ),
  ],
)
def test_bad_input_gets_a_one_line_value_error(call, message):
  model = toplabel.fit(*_draw(np.random.default_rng(4), 300), points_per_bin=20)
  with pytest.raises(ValueError, match=message) as info:
    call(model)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize(
  "options, message",
  [
    ({"points_per_bin": 0}, "^points_per_bin: expected at least 1, got 0"),
    ({"points_per_bin": 2.5}, "^points_per_bin: expected an integer, got 2.5"),
    ({"prior": "yes"}, "^prior: expected a bool, got 'yes'"),
  ],
)
def test_options_are_checked_as_fit_checks_them(options, message):
  # A saved calibrator with points_per_bin 0 had loaded (its options are checked here).
  with pytest.raises(ValueError, match=message):
    toplabel.ESTIMATOR.check_options(options)
  assert toplabel.ESTIMATOR.check_options({"points_per_bin": 7, "prior": True})
