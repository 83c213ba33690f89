"""Benchmark baselines: temperature scaling, histogram binning, multiclass metrics.

Every fast function is checked against a plain float64 NumPy loop written here,
temperature scaling against a known temperature and an independent solver, and
the comparison the paper makes (Top-1 binning vs the raw softmax) on synthetic
logits whose miscalibration is known.
"""

import jax
import numpy as np
import pytest
import scipy.optimize
import scipy.special
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from top1_jax.core import binning, events, metrics, scores
from top1_jax.evaluation import baselines
from top1_jax.io.examples import load_example

NUM_CLASSES = 10


def _sample(num, seed, scale=2.0, num_classes=NUM_CLASSES):
  """True logits z and labels drawn from softmax(z) (Gumbel-max: exact sampling)."""
  rng = np.random.default_rng(seed)
  z = (scale * rng.normal(size=(num, num_classes))).astype(np.float32)
  labels = np.argmax(z + rng.gumbel(size=z.shape), axis=-1)
  return z, labels


def _softmax64(logits):
  return scipy.special.softmax(np.asarray(logits, np.float64), axis=-1)


# --------------------------------------------------------------- plain NumPy references


def _loop_brier(probs, labels):
  total = 0.0
  for p, y in zip(np.asarray(probs, np.float64), labels, strict=True):
    total += sum((p[k] - (1.0 if k == y else 0.0)) ** 2 for k in range(len(p)))
  return total / len(labels)


def _loop_nll(probs, labels):
  return float(np.mean([-np.log(p[y]) for p, y in zip(probs, labels, strict=True)]))


def _loop_bin(value, n_bins):
  """Right-closed equal-width bin of one value in [0, 1], 0 in the first bin."""
  for b in range(n_bins):
    if value <= (b + 1) / n_bins:
      return b
  return n_bins - 1


def _loop_ece(confidence, correct, n_bins):
  """sum_b (n_b / N) |acc_b - conf_b|, one bin at a time."""
  confidence = np.asarray(confidence, np.float64)
  members = [[] for _ in range(n_bins)]
  for i, c in enumerate(confidence):
    members[_loop_bin(c, n_bins)].append(i)
  total = 0.0
  for idx in members:
    if idx:
      acc = np.mean([float(correct[i]) for i in idx])
      conf = np.mean([confidence[i] for i in idx])
      total += len(idx) / len(confidence) * abs(acc - conf)
  return total


def _loop_histogram_binning(probs_cal, labels_cal, probs_test, n_bins):
  num_classes = probs_cal.shape[1]
  value = np.zeros((num_classes, n_bins))
  for k in range(num_classes):
    for b in range(n_bins):
      inside = [i for i in range(len(labels_cal)) if _loop_bin(probs_cal[i, k], n_bins) == b]
      if inside:
        value[k, b] = np.mean([labels_cal[i] == k for i in inside])
      else:
        value[k, b] = (b + 0.5) / n_bins
  out = np.zeros_like(probs_test, np.float64)
  for i, row in enumerate(probs_test):
    q = np.array([value[k, _loop_bin(row[k], n_bins)] for k in range(num_classes)])
    out[i] = q / q.sum() if q.sum() > 0 else row
  return value, out


# ------------------------------------------------------------------ temperature scaling


@pytest.mark.parametrize("true_temperature", [0.5, 2.0, 3.0])
def test_fit_temperature_recovers_known_temperature(true_temperature):
  # Labels follow softmax(z); the model reports T_true * z, so softmax(model / T) is
  # calibrated exactly at T = T_true.
  z, labels = _sample(10000, seed=int(10 * true_temperature))
  model_logits = true_temperature * z
  fitted = float(baselines.fit_temperature(model_logits, labels))
  assert fitted == pytest.approx(true_temperature, rel=0.03)
  nll_fitted = baselines.multiclass_nll(
    baselines.apply_temperature(model_logits, fitted), labels, from_logits=True
  )
  nll_raw = baselines.multiclass_nll(model_logits, labels, from_logits=True)
  assert float(nll_fitted) < float(nll_raw) - 0.01


def test_fit_temperature_matches_float64_scipy_minimiser():
  z, labels = _sample(3000, seed=7)
  model_logits = (2.5 * z).astype(np.float32)
  logits64 = model_logits.astype(np.float64)

  def nll(log_temperature):
    scaled = logits64 / np.exp(log_temperature)
    return np.mean(
      scipy.special.logsumexp(scaled, axis=-1) - scaled[np.arange(len(labels)), labels]
    )

  reference = scipy.optimize.minimize_scalar(
    nll, bounds=(np.log(1e-3), np.log(1e3)), method="bounded", options={"xatol": 1e-10}
  )
  fitted = float(baselines.fit_temperature(model_logits, labels))
  assert fitted == pytest.approx(np.exp(reference.x), rel=1e-3)
  # A minimum: moving 1% either way costs likelihood.
  assert nll(np.log(fitted)) <= nll(np.log(fitted * 1.01))
  assert nll(np.log(fitted)) <= nll(np.log(fitted / 1.01))


def test_fit_temperature_separable_data_goes_to_bracket_end():
  # Every example correct with a margin: sharper is always better, so T -> min.
  labels = np.arange(40) % 4
  logits = 5.0 * np.eye(4, dtype=np.float32)[labels]
  fitted = float(baselines.fit_temperature(logits, labels, min_temperature=0.1))
  assert fitted == pytest.approx(0.1, rel=1e-4)
  # Every example wrong: flatter is always better, so T -> max.
  wrong = (labels + 1) % 4
  fitted = float(baselines.fit_temperature(logits, wrong, max_temperature=50.0))
  assert fitted == pytest.approx(50.0, rel=1e-4)


def _bisection_temperature(logits, labels, low=1e-5, high=1e5, steps=60):
  """The benchmark's method in float64: bisection on the sign of dNLL/d beta, in log T."""
  centred = np.asarray(logits, np.float64)
  centred = centred - centred.max(-1, keepdims=True)
  label_logit = centred[np.arange(len(labels)), labels]
  lo, hi = np.log(low), np.log(high)
  for _ in range(steps):
    mid = 0.5 * (lo + hi)
    probs = scipy.special.softmax(np.exp(-mid) * centred, axis=-1)
    slope = np.mean(np.sum(probs * centred, -1) - label_logit)
    lo, hi = (lo, mid) if slope < 0 else (mid, hi)
  return np.exp(0.5 * (lo + hi))


@pytest.mark.parametrize("name", ["lenet-5-cifar-10", "densenet-bc-100-cifar-100"])
def test_fit_temperature_matches_bisection_on_real_networks(name):
  # Real softmax outputs (log-probabilities with 1e-37 tails), on a calibration half.
  data = load_example(name)
  log_probs = scores.log_probs_from_probs(data.probs[:5000])
  labels = data.labels[:5000]
  fitted = float(baselines.fit_temperature(log_probs, labels))
  assert fitted == pytest.approx(_bisection_temperature(log_probs, labels), rel=1e-5)
  assert 1.2 < fitted < 2.5  # both networks are overconfident


def test_fit_temperature_far_from_one_and_in_a_bracket_away_from_one():
  z, labels = _sample(2000, seed=4, scale=1.0)
  for scale in (1e-3, 30.0, 1e4):
    fitted = float(baselines.fit_temperature(scale * z, labels))
    assert fitted == pytest.approx(_bisection_temperature(scale * z, labels), rel=1e-5)
  # The optimum (about 1) is below the bracket: its lower end.
  fitted = float(baselines.fit_temperature(z, labels, min_temperature=10.0, max_temperature=50.0))
  assert fitted == pytest.approx(10.0, rel=1e-5)


def test_fit_temperature_of_a_flat_nll_is_the_top_of_the_bracket():
  # Every example's logits equal: the NLL is log K whatever T.
  logits, labels = np.zeros((6, 3), np.float32), np.arange(6) % 3
  assert float(baselines.fit_temperature(logits, labels)) == pytest.approx(1e5, rel=1e-4)


def test_apply_temperature_divides_logits():
  logits = np.array([[1.0, -2.0, 4.0], [0.0, 3.0, 1.0]], np.float32)
  np.testing.assert_allclose(baselines.apply_temperature(logits, 2.0), logits / 2.0)
  stacked = np.stack([logits, 2 * logits])
  np.testing.assert_allclose(baselines.apply_temperature(stacked, 4.0), stacked / 4.0)


# ------------------------------------------------------------------ multiclass metrics


def test_multiclass_metrics_match_numpy_loop():
  z, labels = _sample(400, seed=3, scale=1.5)
  model_logits = 2.0 * z
  probs = _softmax64(model_logits)
  confidence = probs.max(-1)
  correct = probs.argmax(-1) == labels
  brier = _loop_brier(probs, labels)
  nll = _loop_nll(probs, labels)
  # The conversions the module documents: the benchmark code's Brier is this - 1,
  # a mean over all N x K entries is this / K.
  code_brier = np.mean(np.sum(probs**2, -1) - 2 * probs[np.arange(len(labels)), labels])
  entry_mean = np.mean((probs - np.eye(NUM_CLASSES)[labels]) ** 2)
  assert code_brier == pytest.approx(brier - 1)
  assert entry_mean == pytest.approx(brier / NUM_CLASSES)

  for pred, from_logits in ((model_logits, True), (probs.astype(np.float32), False)):
    for n_bins in (1, 10, 15):
      ece = _loop_ece(confidence, correct, n_bins)
      result = baselines.multiclass_metrics(pred, labels, from_logits=from_logits, n_bins=n_bins)
      assert all(isinstance(value, float) for value in result)
      assert result.brier == pytest.approx(brier, rel=1e-5)
      assert result.nll == pytest.approx(nll, rel=1e-5)
      assert result.ece == pytest.approx(ece, abs=1e-6)
      assert result.accuracy == pytest.approx(correct.mean())
      assert metrics.ece(confidence, correct, n_bins) == pytest.approx(ece, abs=1e-6)
      assert baselines.equal_width_ece is metrics.ece  # the one ECE of arrays
    # The single-metric functions agree with the combined one (default 15 bins).
    given = {"from_logits": from_logits}
    assert baselines.multiclass_brier(pred, labels, **given) == pytest.approx(brier, rel=1e-5)
    assert baselines.multiclass_nll(pred, labels, **given) == pytest.approx(nll, rel=1e-5)
    assert baselines.confidence_ece(pred, labels, **given) == pytest.approx(
      _loop_ece(confidence, correct, 15), abs=1e-6
    )


def test_equal_width_bins_edges_are_right_closed():
  # Values on interior edges go to the lower bin, 0 to the first, 1 to the last.
  confidence = np.array([0.0, 0.25, 0.2500001, 0.5, 0.75, 1.0], np.float32)
  correct = np.array([1, 0, 1, 1, 0, 1], bool)
  bins = baselines.equal_width_bins(confidence, correct, n_bins=4)
  np.testing.assert_array_equal(bins.counts, [2, 2, 1, 1])
  np.testing.assert_array_equal(bins.hits, [1, 2, 0, 1])
  expected = _loop_ece(confidence, correct, 4)
  assert float(bins.ece) == pytest.approx(expected, abs=1e-7)
  np.testing.assert_allclose(bins.edges, [0, 0.25, 0.5, 0.75, 1])


@pytest.mark.parametrize("n_bins", [1, 2, 3, 10, 15, 29, 100])
def test_equal_width_index_is_one_rule_on_the_host_and_the_device(n_bins):
  # The benchmark's np.digitize(right=True) on np.linspace's edges, cast to float32;
  # every edge, its float32 neighbours, 0 and 1, binned by NumPy and by jitted JAX.
  edges = np.linspace(0.0, 1.0, n_bins + 1)[1:-1].astype(np.float32)
  near = [np.nextafter(edges, -np.inf), edges, np.nextafter(edges, np.inf)]
  values = np.concatenate([*near, np.float32([0.0, 1.0])]).astype(np.float32)
  expected = np.digitize(values, edges, right=True)
  host = baselines.equal_width_index(values, n_bins)
  device = jax.jit(baselines.equal_width_index, static_argnums=1)(values, n_bins)
  assert isinstance(host, np.ndarray) and host.dtype == np.int32
  np.testing.assert_array_equal(host, expected)
  np.testing.assert_array_equal(np.asarray(device), expected)
  # Float64 host values are binned as the device bins them: rounded to float32 first.
  just_above = np.nextafter(edges.astype(np.float64), np.inf)
  on_device = jax.jit(baselines.equal_width_index, static_argnums=1)(just_above, n_bins)
  np.testing.assert_array_equal(baselines.equal_width_index(just_above, n_bins), on_device)


def test_multiclass_brier_is_top1_brier_of_pmax_plus_the_rest():
  z, labels = _sample(400, seed=11)
  probs = _softmax64(2.0 * z)
  top = probs.argmax(-1)
  correct = top == labels
  pmax = probs.max(-1)
  onehot = np.eye(NUM_CLASSES)[labels]
  rest = np.mean(np.sum(np.where(np.eye(NUM_CLASSES)[top] > 0, 0.0, (probs - onehot) ** 2), -1))
  multiclass = baselines.multiclass_brier(probs.astype(np.float32), labels)
  top1 = metrics.brier(pmax.astype(np.float32), correct)
  assert rest > 0.01
  assert multiclass == pytest.approx(top1 + rest, rel=1e-5)


def test_confidence_ece_is_binary_ece_of_pmax():
  z, labels = _sample(400, seed=5)
  logits = 3.0 * z
  pmax = scores.pmax(logits)
  correct = events.topk_correct(logits, labels)
  assert baselines.confidence_ece(logits, labels, from_logits=True) == pytest.approx(
    metrics.ece(pmax, correct), abs=1e-6
  )


def test_nll_from_extreme_logits_is_exact_and_zero_probability_is_finite():
  logits = np.array([[0.0, 200.0], [300.0, 0.0]], np.float32)
  labels = np.array([0, 0])
  # -log softmax = [200, 0]: the float32 softmax would underflow to 0 and give inf.
  assert baselines.multiclass_nll(logits, labels, from_logits=True) == pytest.approx(100.0)
  probs = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
  value = baselines.multiclass_nll(probs, labels)
  assert np.isfinite(value) and value == pytest.approx(-np.log(np.finfo(np.float32).tiny) / 2)


@settings(max_examples=25)
@given(
  hnp.arrays(np.float32, (16, 4), elements=st.floats(-20, 20, width=32)),
  hnp.arrays(np.int32, (16,), elements=st.integers(0, 3)),
)
def test_logits_and_their_softmax_give_the_same_metrics(logits, labels):
  probs = _softmax64(logits).astype(np.float32)
  # The predicted class is the argmax of what is given; near-ties in the logits can
  # round to exact ties in float32 probabilities (then both argmaxes are legitimate).
  assume(np.array_equal(np.argmax(logits, -1), np.argmax(probs, -1)))
  from_logits = baselines.multiclass_metrics(logits, labels, from_logits=True)
  from_probs = baselines.multiclass_metrics(probs, labels)
  assert 0.0 <= float(from_logits.brier) <= 2.0 + 1e-6
  assert 0.0 <= float(from_logits.ece) <= 1.0 + 1e-6
  assert float(from_logits.brier) == pytest.approx(float(from_probs.brier), abs=1e-5)
  assert float(from_logits.ece) == pytest.approx(float(from_probs.ece), abs=1e-5)
  # From probabilities only exact zeros are clipped; logits are never clipped.
  assert float(from_logits.nll) <= float(from_probs.nll) + 1e-3


# ---------------------------------------------------------------- histogram binning


def test_histogram_binning_matches_numpy_loop():
  # Few calibration points and 4 classes: many empty bins, to exercise the midpoints.
  z, labels = _sample(100, seed=21, scale=2.0, num_classes=4)
  probs = _softmax64(2.0 * z).astype(np.float32)
  cal, test = slice(0, 40), slice(40, None)
  fitted = baselines.fit_histogram_binning(probs[cal], labels[cal], n_bins=20)
  value, expected = _loop_histogram_binning(probs[cal], labels[cal], probs[test], 20)
  assert int(np.sum(np.asarray(fitted.counts) == 0)) > 10
  np.testing.assert_allclose(fitted.value, value, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(fitted.counts).sum(-1), 40)
  predicted = baselines.predict_histogram_binning(fitted, probs[test])
  np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.sum(predicted, -1), 1.0, rtol=1e-5)
  from_logits = baselines.predict_histogram_binning(fitted, 2.0 * z[test], from_logits=True)
  np.testing.assert_allclose(from_logits, expected, rtol=1e-4, atol=1e-5)


def test_histogram_binning_all_zero_row_keeps_input():
  fitted = baselines.HistogramBinning(
    value=np.zeros((3, 5), np.float32),
    counts=np.ones((3, 5), np.int32),
    hits=np.zeros((3, 5), np.int32),
  )
  probs = np.array([[0.2, 0.3, 0.5]], np.float32)
  np.testing.assert_allclose(baselines.predict_histogram_binning(fitted, probs), probs)


# ------------------------------------------------- the paper's comparison, on known data


def test_top1_binning_beats_raw_softmax_on_overconfident_logits():
  z, labels = _sample(20000, seed=1)
  model_logits = 3.0 * z  # three times too confident
  cal, test = slice(0, 10000), slice(10000, None)

  raw_ece = baselines.confidence_ece(model_logits[test], labels[test], from_logits=True)

  u = scores.neg_log_pmax(model_logits)
  correct = events.topk_correct(model_logits, labels)
  # 10 bins of 1000: the sampling noise of the binned ECE is ~0.01-0.02.
  bins = binning.fit(u[cal], correct[cal], n_bins=10)
  test_bins = binning.refit(bins, u[test], correct[test])
  top1_ece = metrics.binned_ece(bins, test_bins)
  # The same binned predictions under the benchmark's equal-width ECE.
  top1_equal_width = metrics.ece(binning.predict(bins, u[test]), correct[test])

  assert raw_ece > 0.15
  assert top1_ece < 0.05
  assert top1_equal_width < 0.05
  assert top1_ece < raw_ece / 5
  # Apples to apples: the binary Top-1 Brier of the binned P(correct) beats that of
  # the raw max softmax used as P(correct).
  top1_brier = metrics.brier(binning.predict(bins, u[test]), correct[test])
  raw_top1_brier = metrics.brier(scores.pmax(model_logits[test]), correct[test])
  assert top1_brier < raw_top1_brier - 0.05

  # The other benchmark recalibrations also repair it, as they should.
  temperature = baselines.fit_temperature(model_logits[cal], labels[cal])
  scaled = baselines.apply_temperature(model_logits[test], temperature)
  assert baselines.confidence_ece(scaled, labels[test], from_logits=True) < 0.04
  hist = baselines.fit_histogram_binning(model_logits[cal], labels[cal], from_logits=True)
  hist_probs = baselines.predict_histogram_binning(hist, model_logits[test], from_logits=True)
  assert baselines.confidence_ece(hist_probs, labels[test]) < raw_ece / 3


def test_calibrated_logits_have_small_confidence_ece():
  # Control for the test above: the metric is not large by construction.
  z, labels = _sample(10000, seed=2)
  assert baselines.confidence_ece(z, labels, from_logits=True) < 0.03
  assert float(baselines.fit_temperature(z, labels)) == pytest.approx(1.0, rel=0.03)


# ------------------------------------------------------------------------- validation


LOGITS = np.array([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], np.float32)
LABELS = np.array([0, 1])


@pytest.mark.parametrize(
  "call, message",
  [
    # Labels first (the order before predictions came first) is a one-line error.
    (lambda: baselines.multiclass_brier(LABELS, LOGITS), r"probs: expected a 2-D array"),
    (
      lambda: baselines.multiclass_nll(LOGITS, LABELS, from_logits="yes"),
      "from_logits: expected True or False, got 'yes'",
    ),
    # Logits given as probabilities fail the probability checks (the reverse of below).
    (
      lambda: baselines.multiclass_nll(LOGITS, LABELS),
      r"probs: probabilities must lie in \[0, 1\]",
    ),
    (
      lambda: baselines.confidence_ece(
        np.float32([[0.2, 0.8], [0.5, 0.5]]), LABELS, from_logits=True
      ),
      r"logits: these look like probabilities \(every row in \[0, 1\], summing to 1\); leave"
      " from_logits=False",
    ),
    (
      lambda: baselines.multiclass_brier(LOGITS[0], LABELS, from_logits=True),
      r"logits: expected a 2-D",
    ),
    (
      lambda: baselines.multiclass_nll(
        np.array([[np.nan, 0, 0], [0, 0, 0]]), LABELS, from_logits=True
      ),
      r"logits: 1 non-finite",
    ),
    (
      lambda: baselines.confidence_ece(LOGITS, np.array([0, 3]), from_logits=True),
      r"labels: labels out of range \[0, 3\): min 0, max 3",
    ),
    (
      lambda: baselines.multiclass_brier(np.array([[0.5, 0.4, 0.0], [0, 1, 0]]), LABELS),
      r"probs: each row must sum to 1, row 0 sums to 0.9",
    ),
    (
      lambda: baselines.multiclass_brier(np.array([[1.5, -0.5, 0], [0, 1, 0]]), LABELS),
      r"probs: probabilities must lie in \[0, 1\]",
    ),
    (lambda: baselines.multiclass_nll(LOGITS, LABELS[:1], from_logits=True), "length mismatch"),
    (
      lambda: baselines.multiclass_nll(LOGITS[:, :1], LABELS, from_logits=True),
      "at least 2 classes",
    ),
    (
      lambda: baselines.confidence_ece(LOGITS, LABELS, from_logits=True, n_bins=0),
      "n_bins: expected at least 1, at most 65536, got 0",
    ),
    (lambda: metrics.ece([0.5, 1.2], [1, 0]), r"confidence: probabilities"),
    (lambda: metrics.ece([0.5, 0.2], [1, 2]), "correct: expected bool or 0/1"),
    (lambda: baselines.equal_width_bins([0.5], [1], n_bins=1.5), "n_bins: expected an integer"),
    (
      lambda: baselines.fit_temperature(LOGITS, LABELS, min_temperature=2.0, max_temperature=1.0),
      "expected finite 0 < min < max",
    ),
    (lambda: baselines.fit_temperature(LOGITS, np.array([0.5, 1])), "labels: expected integer"),
    (lambda: baselines.fit_temperature(None, LABELS), "logits: expected an"),
    (
      lambda: baselines.apply_temperature(LOGITS, 0.0),
      r"temperature: expected a value in \[1e-05, 100000\], got 0",
    ),
    (
      lambda: baselines.apply_temperature(LOGITS, 1e-40),
      r"temperature: expected a value in \[1e-05, 100000\]",
    ),
    (lambda: baselines.predict_histogram_binning(None, LOGITS), "binning: expected"),
    (lambda: baselines.apply_temperature(LOGITS, np.nan), "temperature: 1 non-finite"),
    (lambda: baselines.apply_temperature(LOGITS, [1.0, 2.0]), "temperature: expected a 0-D"),
    (
      lambda: baselines.fit_histogram_binning(LOGITS, LABELS, from_logits=True, n_bins=0),
      "n_bins: expected at least 1",
    ),
    (
      lambda: baselines.predict_histogram_binning(
        baselines.fit_histogram_binning(LOGITS, LABELS, from_logits=True),
        LOGITS[:, :2],
        from_logits=True,
      ),
      r"logits: expected 3 classes like the fitted binning, got shape \(2, 2\)",
    ),
    (
      lambda: baselines.predict_histogram_binning(
        baselines.fit_histogram_binning(LOGITS, LABELS, from_logits=True),
        np.float32([[0.2, 0.3, 0.5]]),
        from_logits=True,
      ),
      r"logits: these look like probabilities",
    ),
  ],
)
def test_invalid_inputs_raise_value_error_naming_the_argument(call, message):
  with pytest.raises(ValueError, match=message):
    call()
