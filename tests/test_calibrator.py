"""Calibrator: fit / predict_proba / predict_interval / evaluate / save / load."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import reference
import synthetic

from top1_jax import Calibrator
from top1_jax.core import binning, metrics, scores
from top1_jax.io.examples import load_example


def _logits(num=2000, num_classes=10, seed=0):
  return synthetic.classifier_logits(num, num_classes, seed)


def _softmax(logits):
  z = np.asarray(logits, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def test_fit_returns_self_and_matches_the_bins_and_the_oracle():
  logits, labels = _logits()
  cal = Calibrator(score="neg_log_pmax", n_bins=20, k=1, inputs="logits")
  assert cal.fit(logits[:1000], labels[:1000]) is cal
  u = np.asarray(scores.neg_log_pmax(logits))
  correct = logits.argmax(1) == labels
  bins = binning.fit(u[:1000], correct[:1000], 20)
  p = cal.predict_confidence(logits[1000:])
  assert p.shape == (1000,) and p.dtype == np.float32
  np.testing.assert_array_equal(p, np.asarray(binning.predict(bins, u[1000:])))
  edges, _, _, prob, _ = reference.fit_bins(u[:1000], correct[:1000], 20)
  np.testing.assert_allclose(p, prob[reference.assign(edges, u[1000:])], rtol=1e-6)


def test_probs_inputs_are_logged_safely_and_agree_with_logits():
  logits, labels = _logits()
  probs = _softmax(logits)
  from_logits = Calibrator(n_bins=20).fit(logits[:1000], labels[:1000])
  from_probs = Calibrator(n_bins=20, inputs="probs").fit(probs[:1000], labels[:1000])
  np.testing.assert_array_equal(
    np.asarray(from_logits.bins_.counts), np.asarray(from_probs.bins_.counts)
  )
  np.testing.assert_array_equal(
    from_logits.predict_confidence(logits), from_probs.predict_confidence(probs)
  )


def test_probabilities_given_as_logits_are_refused_with_the_fix():
  # A real network's softmax outputs given as inputs="logits" ran and gave other numbers
  # (softmax(p) is not p), with no sign; now they are refused, and the fix works.
  probs, labels, _, _ = load_example("densenet-bc-100-cifar-100")
  cal, test = slice(0, 5000), slice(5000, None)
  message = (
    r"^x: these look like probabilities \(every row in \[0, 1\], summing to 1\);"
    r' pass inputs="probs" \(or "auto"\)$'
  )
  with pytest.raises(ValueError, match=message):
    Calibrator(score="entropy", inputs="logits").fit(probs[cal], labels[cal])
  right = Calibrator(score="entropy", inputs="probs").fit(probs[cal], labels[cal])
  # Shifted by 1 they pass the check and run as logits do: what was computed before.
  shifted = Calibrator(score="entropy", inputs="logits").fit(probs[cal] + 1, labels[cal])
  brier = right.evaluate(probs[test], labels[test])["brier"]
  assert abs(brier - shifted.evaluate(probs[test] + 1, labels[test])["brier"]) > 1e-3
  with pytest.raises(ValueError, match=message):  # fitted on logits: later calls read logits
    Calibrator(n_bins=20).fit(np.log(probs[cal] + 1e-30), labels[cal]).predict_confidence(
      probs[test]
    )
  # The reverse, logits given as probabilities, fails the probability checks.
  logits, labels = _logits(num=300)
  with pytest.raises(ValueError, match=r"^x: probabilities must lie in \[0, 1\], got min"):
    Calibrator(inputs="probs").fit(logits, labels)


def test_the_default_reads_probabilities_and_logits_alike():
  # scikit-learn and netcal users hold softmax outputs, JAX users logits: inputs="auto".
  probs, labels, _, _ = load_example("densenet-bc-100-cifar-100")
  cal, test = slice(0, 5000), slice(5000, None)
  auto = Calibrator(score="entropy").fit(probs[cal], labels[cal])
  given = Calibrator(score="entropy", inputs="probs").fit(probs[cal], labels[cal])
  assert (auto.inputs, auto.inputs_) == ("auto", "probs")
  np.testing.assert_array_equal(
    auto.predict_confidence(probs[test]), given.predict_confidence(probs[test])
  )
  logits, labels = _logits(num=600)
  assert Calibrator().fit(logits, labels).inputs_ == "logits"
  # What cannot be told apart is refused with the fix named.
  mixed = np.concatenate([_softmax(logits[:300]), logits[300:]])
  with pytest.raises(
    ValueError, match=r'^x: 300 of 600 rows look like probabilities .* inputs="probs" or'
  ):
    Calibrator().fit(mixed, labels)
  rounded = np.round(_softmax(logits), 3)
  with pytest.raises(ValueError, match=r"^x: every row lies in \[0, 1\] and sums to 1 only within"):
    Calibrator().fit(rounded, labels)
  with pytest.raises(ValueError, match="^x: one value per row"):
    Calibrator().fit(np.full((10, 1), 0.5), np.zeros(10, int))


def test_predict_proba_is_scikit_learns_two_columns():
  logits, labels = _logits()
  cal = Calibrator(n_bins=10).fit(logits[:1000], labels[:1000])
  p = cal.predict_confidence(logits[1000:])
  both = cal.predict_proba(logits[1000:])
  assert both.shape == (p.shape[0], 2) and list(cal.classes_) == [False, True]
  np.testing.assert_array_equal(both[:, 1], p)
  np.testing.assert_allclose(both.sum(1), 1.0, rtol=1e-6)
  correct = logits[1000:].argmax(1) == labels[1000:]
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  assert sklearn_metrics.brier_score_loss(correct, both[:, 1]) == pytest.approx(
    metrics.brier(p, correct), rel=1e-5
  )
  calibration = pytest.importorskip("sklearn.calibration")
  prob_true, prob_pred = calibration.calibration_curve(correct, both[:, 1], n_bins=5)
  assert prob_true.shape == prob_pred.shape
  # The library's metrics still take the [N, 2] an older predict_proba call site passes.
  with pytest.warns(DeprecationWarning, match=r"\[N, 2\] .*predict_confidence"):
    assert metrics.brier(both, correct) == metrics.brier(p, correct)


def test_underflowed_probabilities_stay_tie_free():
  # Saturated rows: pmax is 1.0 in float32 for all of them, the tails differ.
  tails = np.array([1e-37, 2e-37, 0.0, 5e-30, 1e-20], np.float32)
  probs = np.zeros((5, 3), np.float32)
  probs[:, 1] = tails
  probs[:, 0] = 1.0
  cal = Calibrator(n_bins=5, inputs="probs").fit(probs, np.zeros(5, int))
  u = cal.scores_of(probs)
  assert np.all(np.isfinite(u)) and len(np.unique(u)) == 5
  assert np.argsort(u).tolist() == [2, 0, 1, 3, 4]


def test_samples_and_sample_scores():
  logits, labels = _logits(num=600)
  rng = np.random.default_rng(1)
  samples = logits[None] + rng.normal(size=(4, *logits.shape)).astype(np.float32)
  cal = Calibrator(score="covariance_norm_probs", n_bins=10).fit(samples, labels)
  expected = scores.compute(scores.mean_log_probs(samples), samples=samples)
  np.testing.assert_allclose(cal.scores_of(samples), expected["covariance_norm_probs"], rtol=1e-6)
  with pytest.raises(ValueError, match=r"needs \[S, N, K\] samples with S >= 2"):
    cal.predict_confidence(logits)


def test_topk_and_callable_scores():
  logits, labels = _logits()
  cal = Calibrator(score="neg_log_topk_mass", k=3, n_bins=10).fit(logits, labels)
  np.testing.assert_allclose(cal.scores_of(logits), scores.neg_log_topk_mass(logits, 3), rtol=1e-6)
  assert cal.evaluate(logits, labels)["accuracy"] == np.mean(
    np.any(np.argsort(-logits, 1)[:, :3] == labels[:, None], 1)
  )
  custom = Calibrator(score=lambda x: -np.max(x, axis=-1), n_bins=10).fit(logits, labels)
  assert custom.predict_confidence(logits).shape == (2000,)
  with pytest.raises(ValueError, match="a callable score cannot be saved"):
    custom.save("never.json")


def test_predict_interval_is_the_bins_exact_interval():
  logits, labels = _logits()
  cal = Calibrator(n_bins=10).fit(logits[:1000], labels[:1000])
  lo, hi = cal.predict_interval(logits[1000:], delta=0.1)
  index = np.asarray(binning.assign(cal.bins_.edges, cal.scores_of(logits[1000:])))
  bin_lo, bin_hi = binning.clopper_pearson(cal.bins_.hits, cal.bins_.counts, 0.1)
  np.testing.assert_array_equal(lo, np.asarray(bin_lo)[index])
  np.testing.assert_array_equal(hi, np.asarray(bin_hi)[index])
  assert np.all(lo <= cal.predict_confidence(logits[1000:])) and np.all(hi >= lo)


def test_evaluate_matches_the_oracle_and_adds_up():
  logits, labels = _logits()
  cal = Calibrator(n_bins=20).fit(logits[:1000], labels[:1000])
  out = cal.evaluate(logits[1000:], labels[1000:])
  u = np.asarray(scores.neg_log_pmax(logits))
  correct = logits.argmax(1) == labels
  edges, _, _, prob, prior = reference.fit_bins(u[:1000], correct[:1000], 20)
  expected = reference.binned_scores(prob, prior, reference.assign(edges, u[1000:]), correct[1000:])
  for name, value in expected.items():
    np.testing.assert_allclose(out[name], value, rtol=2e-4, atol=1e-6, err_msg=name)
  assert out["brier"] == pytest.approx(
    out["brier_uncertainty"] - out["brier_resolution"] + out["brier_calibration"], abs=1e-6
  )
  assert out["num_examples"] == 1000 and out["num_effective_bins"] == 20


def test_evaluate_reports_undefined_metrics_as_none():
  logits, labels = _logits(num=400)
  labels = logits.argmax(1)  # every prediction correct
  out = Calibrator(n_bins=5).fit(logits, labels).evaluate(logits, labels)
  assert out["auroc"] is None and out["eor"] is None
  assert all(v is None or np.isfinite(v) for v in out.values())


def test_save_load_round_trip_is_exact(tmp_path):
  logits, labels = _logits()
  cal = Calibrator(score="entropy", n_bins=15, k=2).fit(logits[:1000], labels[:1000])
  path = tmp_path / "cal.json"
  cal.save(path)
  state = json.loads(path.read_text())
  assert state["format"] == "top1_jax.Calibrator" and state["version"] == 2
  assert state["method"] == "bins" and state["state"]["n_bins"] == 15
  loaded = Calibrator.load(str(path))
  for field in ("edges", "counts", "hits", "prob", "prior"):
    np.testing.assert_array_equal(getattr(loaded.bins_, field), getattr(cal.bins_, field))
  np.testing.assert_array_equal(loaded.predict_confidence(logits), cal.predict_confidence(logits))
  assert loaded.evaluate(logits[1000:], labels[1000:]) == cal.evaluate(logits[1000:], labels[1000:])
  assert (loaded.score, loaded.n_bins, loaded.k, loaded.inputs) == ("entropy", 15, 2, "logits")
  assert (loaded.n_bins_, loaded.num_classes_) == (15, 10)


def test_a_version_1_file_still_loads(tmp_path):
  # Written by top1_jax before "method" (version 1: the bins' fields at the top).
  version_1 = {**synthetic.version_1_calibrator(), "n_bins_requested": "cv"}
  path = tmp_path / "old.json"
  path.write_text(json.dumps(version_1))
  cal = Calibrator.load(path)
  assert (cal.method, cal.n_bins, cal.n_bins_, cal.num_classes_) == ("bins", "cv", 4, 10)
  assert cal.calibration_accuracy_ == pytest.approx(0.59)
  expected = (np.array([24, 20, 12, 3]) + np.float32(0.59)) / 26
  np.testing.assert_allclose(np.asarray(cal.bins_.prob), expected, rtol=1e-6)
  logits = np.zeros((4, 10), np.float32)
  logits[:, 0] = [10.0, 3.0, 1.66, 0.34]  # -log pmax ~ 0.0004, 0.37, 1.0, 2.0: one per bin
  u = cal.scores_of(logits)
  np.testing.assert_array_equal(
    cal.predict_confidence(logits), np.asarray(cal.bins_.prob)[[0, 1, 2, 3]]
  )
  assert u[0] < 0.25 and 0.25 < u[1] <= 0.5 and 0.5 < u[2] <= 1.5 and u[3] > 1.5
  lo, hi = cal.predict_interval(logits)
  assert np.all(lo < cal.predict_confidence(logits)) and np.all(hi > cal.predict_confidence(logits))
  # Saved again, it is a version-2 file with the same bins.
  cal.save(tmp_path / "new.json")
  again = json.loads((tmp_path / "new.json").read_text())
  assert again["version"] == 2 and again["state"]["counts"] == version_1["counts"]
  assert again["n_bins_requested"] == "cv"
  np.testing.assert_array_equal(
    Calibrator.load(tmp_path / "new.json").predict_confidence(logits),
    cal.predict_confidence(logits),
  )


def test_accepts_jax_and_array_like_inputs():
  class Tensor:  # what a CPU torch tensor offers
    def __init__(self, value):
      self.value = value

    def __array__(self, dtype=None, copy=None):
      return np.asarray(self.value, dtype)

  logits, labels = _logits(num=500)
  reference_p = Calibrator(n_bins=5).fit(logits, labels).predict_confidence(logits)
  for wrap in (jnp.asarray, Tensor):
    cal = Calibrator(n_bins=5).fit(wrap(logits), wrap(labels))
    np.testing.assert_array_equal(cal.predict_confidence(wrap(logits)), reference_p)


def _corrupt(tmp_path, text):
  path = tmp_path / "bad.json"
  path.write_text(text)
  return path


_XY = (np.eye(4)[[0, 1, 2, 3, 0, 1]] * 3, [0, 1, 2, 3, 1, 1])  # six examples, four classes


def _state():
  logits, labels = _logits(num=300)
  return Calibrator(n_bins=4).fit(logits, labels).to_dict()


def _bins_state(**changed):
  """A saved bins calibrator with fields of its state changed (None: removed)."""
  state = _state()
  bins = {**state["state"], **changed}
  return {**state, "state": {k: v for k, v in bins.items() if v is not None}}


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: Calibrator(score="nope").fit(*_XY), "score: expected a callable or one of pmax"),
    (lambda: Calibrator(score="human_entropy").fit(*_XY), "needs human_probs, which a Calibrator"),
    (lambda: Calibrator(score="oracle_loss").fit(*_XY), "needs labels, which a Calibrator"),
    (lambda: Calibrator(inputs="logprobs").fit(*_XY), "inputs: expected one of"),
    (lambda: Calibrator(n_bins=0).fit(*_XY), "n_bins: expected at least 1"),
    (lambda: Calibrator(k=1.5).fit(*_XY), "k: expected an integer"),
    (lambda: Calibrator(method="spline").fit(*_XY), "method: expected one of bins, isotonic"),
    (lambda: Calibrator(bandwidth=0.1).fit(*_XY), "bandwidth: not an option of estimator 'bins'"),
    (lambda: Calibrator(method="kde", n_bins="cv").fit(*_XY), "method 'kde' takes an integer"),
    (
      lambda: Calibrator(method="isotonic").fit(*_XY).predict_interval(_XY[0]),
      "method 'isotonic' gives no interval",
    ),
    (lambda: Calibrator().predict_confidence(np.zeros((3, 4))), "not fitted"),
    (lambda: Calibrator(n_bins=2).fit(np.full((3, 4), np.nan), [0, 1, 2]), "x: 12 non-finite"),
    (lambda: Calibrator(n_bins=2).fit(np.zeros((3, 4)), [0, 1]), "length mismatch"),
    (lambda: Calibrator(n_bins=2).fit(np.zeros((3, 4)), [0, 1, 4]), "labels out of range"),
    (
      lambda: Calibrator(n_bins=9).fit(np.zeros((3, 4)), [0, 1, 2]),
      "n_bins: expected at least 1, at most 3",
    ),
    (lambda: Calibrator(k=5).fit(np.zeros((3, 4)), [0, 1, 2]), "k: expected at least 1, at most 4"),
    (
      lambda: Calibrator(inputs="probs").fit(np.ones((3, 4)), [0, 1, 2]),
      "x: each row must sum to 1",
    ),
    (
      lambda: (
        Calibrator(n_bins=2).fit(np.zeros((3, 4)), [0, 1, 2]).predict_confidence(np.zeros((3, 5)))
      ),
      "expected 4 classes",
    ),
    (lambda: Calibrator().fit(np.zeros((3,)), [0, 1, 2]), "x: expected a 2-D or 3-D array"),
    (lambda: Calibrator.from_dict({"format": "other"}), "not a top1_jax calibrator"),
    (lambda: Calibrator.from_dict({**_state(), "version": 99}), "calibrator version 99"),
    (
      lambda: Calibrator.from_dict(_bins_state(counts=[1, 2])),
      "counts and hits must be 4 integers",
    ),
    (lambda: Calibrator.from_dict(_bins_state(hits=[9, 9, 9, 900])), "0 <= hits <= counts"),
    (lambda: Calibrator.from_dict(_bins_state(edges=[3.0, 1.0])), "strictly ascending"),
    (lambda: Calibrator.from_dict(_bins_state(prior=None)), "field 'prior' is missing"),
    (lambda: Calibrator.from_dict(_bins_state(prior=1.5)), "field 'prior' must lie in"),
    (lambda: Calibrator.from_dict({**_state(), "score": "nope"}), "bad calibrator field"),
    (lambda: Calibrator.from_dict({**_state(), "method": "nope"}), "bad calibrator field"),
    (
      lambda: Calibrator.from_dict({k: v for k, v in _state().items() if k != "state"}),
      "field 'state' is missing",
    ),
  ],
)
def test_bad_input_is_a_one_line_value_error(call, message):
  with pytest.raises(ValueError, match=message) as info:
    call()
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "\x1f\x8b gzip"])
def test_corrupt_or_foreign_files_are_refused(tmp_path, text):
  with pytest.raises(ValueError, match="not a top1_jax calibrator"):
    Calibrator.load(_corrupt(tmp_path, text))


def test_evaluate_without_labels_is_one_line():
  logits, labels = _logits(num=300)
  for method in ("bins", "temperature"):
    cal = Calibrator(method=method, n_bins=5).fit(logits, labels)
    with pytest.raises(ValueError, match="^labels: evaluate scores predictions against"):
      cal.evaluate(logits, None)
  with pytest.raises(ValueError, match="^labels: expected .* got None"):
    Calibrator().fit(logits, None)
