"""The estimator protocol and registry: every entry fits, predicts, saves and loads the
same way, through Calibrator and cross-validation alike."""

import json

import jax
import numpy as np
import pytest
import synthetic

from top1_jax import Calibrator, load_example, metrics
from top1_jax.core import binning, scores
from top1_jax.estimators import base, isotonic, kde, registry, table, temperature
from top1_jax.evaluation import crossval

METHODS = tuple(name for name in registry.names() if name != "raw")
"""The calibrators: every entry but "raw", the model's own probability (nothing fitted)."""


def _logits(num=3000, num_classes=10, seed=0):
  return synthetic.classifier_logits(num, num_classes, seed)


def _evidence(logits, labels, k=1):
  log_probs = jax.nn.log_softmax(logits)
  correct = np.asarray(np.argsort(-logits, 1)[:, :k] == labels[:, None]).any(1)
  u = np.asarray(scores.neg_log_pmax(logits))
  return base.Evidence(u, correct, log_probs, k, labels)


def test_the_registry_lists_every_estimator_once_in_order():
  assert registry.names() == ("bins", "isotonic", "kde", "toplabel", "temperature", "raw")
  assert registry.names(scores_only=True) == ("bins", "isotonic", "kde")
  assert all(registry.lookup(name).name == name for name in registry.names())
  with pytest.raises(ValueError, match="^estimator: expected one of bins, isotonic, kde") as info:
    registry.lookup("spline")
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("k", [1, 3])
def test_every_estimator_fits_predicts_and_round_trips(name, k):
  entry = registry.lookup(name)
  logits, labels = _logits()
  fit, new = _evidence(logits[:2000], labels[:2000], k), _evidence(logits[2000:], labels[2000:], k)
  state = entry.fit(fit)
  p = np.asarray(entry.predict(state, new._replace(correct=None, labels=None)))
  assert p.shape == (1000,) and np.all((p >= 0) & (p <= 1))
  saved = json.loads(json.dumps(entry.to_dict(state), allow_nan=False))  # strict JSON
  loaded = entry.from_dict(saved, "saved.json")
  np.testing.assert_array_equal(np.asarray(entry.predict(loaded, new)), p)
  # Calibrated: the mean prediction is near the held-out accuracy of the event.
  assert abs(p.mean() - new.correct.mean()) < 0.05


@pytest.mark.parametrize("name", METHODS)
def test_a_bad_saved_state_is_a_one_line_error_naming_the_file(name):
  entry = registry.lookup(name)
  logits, labels = _logits(num=600)
  saved = entry.to_dict(entry.fit(_evidence(logits, labels)))
  field = next(iter(saved))
  for broken in ({k: v for k, v in saved.items() if k != field}, {**saved, field: "x"}):
    with pytest.raises(ValueError, match="^saved.json") as info:
      entry.from_dict(broken, "saved.json")
    assert "\n" not in str(info.value)


def test_unknown_options_and_missing_inputs_are_refused():
  entry = registry.lookup("kde")
  with pytest.raises(ValueError, match=r"^increasing: not an option of estimator 'kde' \(it"):
    entry.check_options({"increasing": True})
  assert entry.check_options({"bandwidth": 0.1}) == {"bandwidth": 0.1}
  u = np.linspace(0, 1, 50)
  with pytest.raises(ValueError, match="^estimator: 'toplabel' needs the model's log-prob"):
    registry.lookup("toplabel").check_evidence(base.Evidence(u, u > 0.5))
  for name in ("toplabel", "temperature"):
    with pytest.raises(ValueError, match=f"^estimator: '{name}' needs the model's log-prob"):
      crossval.cross_validate(u, u > 0.5, (5,), 2, estimator=name)
  with pytest.raises(ValueError, match="^prior: not an option of estimator 'kde'"):
    crossval.cross_validate(u, u > 0.5, (5,), 2, estimator="kde", prior=False)


def test_isotonic_and_kde_share_one_interpolation():
  rng = np.random.default_rng(4)
  u = rng.random(500)
  correct = rng.random(500) < 1 - u
  new = np.linspace(-0.5, 1.5, 101).astype(np.float32)
  for model, predict in (
    (isotonic.fit(u, correct), isotonic.predict),
    (kde.fit(u, correct), kde.predict),
  ):
    np.testing.assert_array_equal(
      predict(model, new), table.interpolate(new, model.knots, model.prob)
    )


def test_cross_validation_options_reach_the_estimator():
  rng = np.random.default_rng(5)
  u = rng.random(1200)
  correct = rng.random(1200) < 1 - u
  splits = crossval.make_splits(1200, 4)
  cv = crossval.cross_validate(u, correct, (10,), splits=splits, estimator="kde", bandwidth=0.05)
  test = splits.test_mask(0)
  p = kde.predict(kde.fit(u[~test], correct[~test], 0.05), u[test])
  np.testing.assert_allclose(cv.per_fold["brier"][0, 0], metrics.brier(p, correct[test]), 1e-6)


def test_a_toy_estimator_registered_is_found_everywhere(monkeypatch, tmp_path):
  # A constant P(correct): the calibration accuracy. One entry, nothing else changed.
  toy = base.Estimator(
    name="constant",
    needs="scores",
    fit=lambda evidence, shrink=0.0: np.float32((1 - shrink) * np.mean(evidence.correct)),
    predict=lambda state, evidence: np.full(evidence.u.shape, state, np.float32),
    to_dict=lambda state: {"value": float(state)},
    from_dict=lambda d, source: np.float32(base.read_number(d, "value", source, 0.0, 1.0)),
    options=("shrink",),
  )
  monkeypatch.setitem(registry.REGISTRY, "constant", toy)
  logits, labels = _logits()
  cal = Calibrator(method="constant", shrink=0.5).fit(logits[:2000], labels[:2000])
  accuracy = np.mean(logits[:2000].argmax(1) == labels[:2000])
  np.testing.assert_allclose(cal.predict_confidence(logits[2000:]), 0.5 * accuracy, rtol=1e-6)
  cal.save(tmp_path / "toy.json")
  loaded = Calibrator.load(tmp_path / "toy.json")
  assert loaded.get_params()["shrink"] == 0.5
  np.testing.assert_array_equal(loaded.predict_confidence(logits), cal.predict_confidence(logits))
  out = cal.evaluate(logits[2000:], labels[2000:])
  assert out["auroc"] == 0.5 and out["num_effective_bins"] == 1
  u, correct = np.asarray(scores.neg_log_pmax(logits)), logits.argmax(1) == labels
  cv = crossval.cross_validate(u, correct, (5, 10), 4, estimator="constant")
  np.testing.assert_allclose(cv.per_fold["auroc"], 0.5)
  assert "constant" in registry.names(scores_only=True)


def test_calibrator_follows_scikit_learn_conventions():
  cal = Calibrator(method="kde", n_bins=15, bandwidth=0.05)
  params = cal.get_params()
  assert params == {
    "method": "kde",
    "score": "neg_log_pmax",
    "n_bins": 15,
    "k": 1,
    "inputs": "auto",
    "bandwidth": 0.05,
  }
  assert Calibrator(score=12345).get_params()["score"] == 12345  # stored unchecked
  assert cal.set_params(k=2, bandwidth=0.1) is cal and (cal.k, cal.options["bandwidth"]) == (2, 0.1)
  assert not any(name.endswith("_") for name in vars(cal))  # nothing fitted yet
  sklearn_base = pytest.importorskip("sklearn.base")
  logits, labels = _logits()
  fitted = Calibrator(method="isotonic", increasing=False).fit(logits, labels)
  copy = sklearn_base.clone(fitted)
  assert copy.get_params() == fitted.get_params() and not hasattr(copy, "state_")
  np.testing.assert_array_equal(
    copy.fit(logits, labels).predict_confidence(logits), fitted.predict_confidence(logits)
  )


def test_isotonic_takes_the_score_direction():
  logits, labels = _logits()
  confidence = Calibrator(method="isotonic", score="pmax").fit(logits, labels)
  u = np.asarray(scores.pmax(logits))
  model = isotonic.fit(u, logits.argmax(1) == labels, increasing=True)
  np.testing.assert_array_equal(confidence.predict_confidence(logits), isotonic.predict(model, u))


def test_intervals_of_bins_and_kde_and_temperature_probabilities():
  logits, labels = _logits()
  cal = Calibrator(method="kde").fit(logits[:2000], labels[:2000])
  lo, hi = cal.predict_interval(logits[2000:], delta=0.1)
  u = cal.scores_of(logits[2000:])
  expected = kde.predict_interval(cal.state_, u, 0.1)
  np.testing.assert_array_equal(lo, expected[0])
  np.testing.assert_array_equal(hi, expected[1])
  scaled = Calibrator(method="temperature", k=2).fit(logits[:2000], labels[:2000])
  t = float(temperature.fit_temperature(logits[:2000], labels[:2000]))
  probs = np.asarray(jax.nn.softmax(logits[2000:] / t), np.float64)
  top2 = np.sort(probs, 1)[:, -2:].sum(1)
  np.testing.assert_allclose(scaled.predict_confidence(logits[2000:]), top2, rtol=1e-5)
  assert scaled.bins_ is None and scaled.n_bins_ == 20
  with pytest.raises(ValueError, match="^predict_interval: method 'temperature' gives no interval"):
    scaled.predict_interval(logits)


@pytest.fixture(scope="module", params=["densenet-bc-100-cifar-100", "lenet-5-cifar-10"])
def real_halves(request):
  probs, labels = load_example(request.param)[:2]
  cal, test = np.split(np.random.default_rng(0).permutation(len(labels)), 2)
  return request.param, probs[cal], labels[cal], probs[test], labels[test]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_beats_raw_max_softmax_on_real_networks(method, real_halves):
  # Both networks' max-softmax is miscalibrated on CIFAR (DenseNet over-confident by an
  # ECE of 14 %, LeNet by 4 %): each method, fitted on one half, has a lower held-out
  # Brier than the raw max-softmax. The margins measured: DenseNet 0.033-0.036, LeNet
  # 0.007-0.013 (toplabel's the smallest); only a lower Brier is asserted. But not
  # toplabel on DenseNet: with the reference's 50 points per bin, a half's 5,000 examples
  # over 100 classes give about half the classes one bin (their accuracy) and leave the
  # others at their raw pmax, 0.167 against the raw 0.157 (test_toplabel).
  name, probs, labels, probs_test, labels_test = real_halves
  cal = Calibrator(method=method, inputs="probs").fit(probs, labels)
  correct = probs_test.argmax(1) == labels_test
  calibrated = float(metrics.brier(cal.predict_confidence(probs_test), correct))
  raw = float(metrics.brier(probs_test.max(1), correct))
  worse_by = 0.02 if (name, method) == ("densenet-bc-100-cifar-100", "toplabel") else 0.0
  assert calibrated < raw + worse_by, (name, calibrated, raw)
  report = cal.evaluate(probs_test, labels_test)
  assert report["brier"] == pytest.approx(calibrated, abs=1e-6)
  assert report["auroc"] > 0.5  # better than chance at ranking (0.73-0.87 measured)


def test_evaluate_of_other_methods_adds_up_on_their_prediction_bins():
  logits, labels = _logits()
  cal = Calibrator(method="isotonic", n_bins=10).fit(logits[:2000], labels[:2000])
  out = cal.evaluate(logits[2000:], labels[2000:])
  p = cal.predict_confidence(logits[2000:])
  correct = logits[2000:].argmax(1) == labels[2000:]
  assert out["brier"] == pytest.approx(float(metrics.brier(p, correct)), abs=1e-7)
  groups = binning.fit(p, correct, 10)
  index = np.asarray(binning.assign(groups.edges, p))
  count = np.bincount(index, minlength=10)
  used = count > 0
  gap = np.abs(np.bincount(index, correct, 10) - np.bincount(index, p, 10))[used]
  assert out["ece"] == pytest.approx(gap.sum() / count.sum(), abs=1e-6)
  # AUROC, as every table's, of the per-bin predictions (the bins' mean): a bin's examples tie.
  means = np.bincount(index, p, 10) / np.maximum(count, 1)
  per_bin = metrics.auroc_from_counts(means, count, np.bincount(index, correct, 10))
  assert out["auroc"] == pytest.approx(float(per_bin), abs=1e-6)
  # Brier's decomposition over those bins adds up to the binned Brier, within the spread.
  binned = out["brier_uncertainty"] - out["brier_resolution"] + out["brier_calibration"]
  assert binned == pytest.approx(out["brier"], abs=2e-3)


def test_raw_is_the_models_own_top_k_mass():
  logits, labels = _logits(num=600)
  for k in (1, 3):
    evidence = _evidence(logits, labels, k)
    entry = registry.lookup("raw")
    p = np.asarray(entry.predict(entry.fit(evidence), evidence))
    mass = np.sort(np.asarray(jax.nn.softmax(logits)), axis=1)[:, ::-1][:, :k].sum(1)
    np.testing.assert_allclose(p, mass, rtol=1e-5)
  cal = Calibrator(method="raw").fit(logits, labels)
  np.testing.assert_allclose(
    cal.predict_confidence(logits), np.asarray(jax.nn.softmax(logits)).max(1), rtol=1e-5
  )
