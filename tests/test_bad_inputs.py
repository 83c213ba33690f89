"""Bad and degenerate input across the public API: a one-line ValueError naming the argument.

One table, one row per case (the reliability issue's list, and its neighbours). A case
passes when the call raises ``ValueError`` (not TypeError, AttributeError or a silent
NaN), its message names the argument, and the message is one line.
"""

import gzip

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from top1_jax import Calibrator
from top1_jax.core import binning, events, metrics, scores, validation
from top1_jax.estimators import temperature
from top1_jax.evaluation import baselines, crossval, selective
from top1_jax.io import examples, predictions

LOGITS = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
U = np.linspace(0.0, 1.0, 10)
OK = np.arange(10) % 2 == 0
BINS = binning.fit(U, OK, 2)
BINS_4 = binning.fit(U, OK, 4)
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
BOOL_LOGITS = LOGITS > 0
LABELS = np.arange(6) % 5


class _TensorThatRequiresGrad:
  """What torch's ``np.asarray(tensor)`` does for a tensor that requires grad."""

  def __array__(self, dtype=None, copy=None):
    raise RuntimeError(
      "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
    )


CASES = {
  # no samples: [0, N, K] (a reduce() of an empty iterable before)
  "Calibrator.fit of zero samples": (
    lambda: Calibrator(inputs="probs").fit(PROBS[None][:0], LABELS),
    "x: expected at least one sample",
  ),
  "mean_log_probs of zero samples": (
    lambda: scores.mean_log_probs(np.zeros((0, 3, 4), np.float32)),
    "samples: expected at least one sample",
  ),
  # labels that would wrap around int32 before the range check
  "label 2**32 + 3": (
    lambda: events.topk_correct(LOGITS[:2], [3, 2**32 + 3]),
    "labels: labels out of range",
  ),
  "uint64 label 2**63": (
    lambda: events.topk_correct(LOGITS[:2], np.array([3, 2**63], np.uint64)),
    "labels: labels out of range",
  ),
  "float label 1.5": (
    lambda: events.topk_correct(LOGITS[:2], [1.5, 2]),
    "labels: expected integer",
  ),
  "NaN label": (lambda: events.topk_correct(LOGITS[:2], [np.nan, 2]), "labels: expected integer"),
  "labels None": (lambda: events.topk_correct(LOGITS, None), "labels: expected an array, got None"),
  # splits and cross-validation settings
  "make_splits num_examples 2.5": (
    lambda: crossval.make_splits(2.5, 2),
    "num_examples: expected an integer",
  ),
  "make_splits num_examples 0": (
    lambda: crossval.make_splits(0, 2),
    "num_examples: expected at least 2",
  ),
  "make_splits seed -1": (
    lambda: crossval.make_splits(10, 2, seed=-1),
    "seed: expected at least 0",
  ),
  "cross_validate n_bins 2.5": (
    lambda: crossval.cross_validate(U, OK, 2.5, 2),
    "n_bins: expected an integer or a sequence",
  ),
  "cross_validate n_bins None": (
    lambda: crossval.cross_validate(U, OK, None, 2),
    "n_bins: expected an integer or a sequence",
  ),
  "cross_validate n_bins []": (
    lambda: crossval.cross_validate(U, OK, [], 2),
    "n_bins: expected at least one",
  ),
  "cross_validate seed 'a'": (
    lambda: crossval.cross_validate(U, OK, 2, 2, seed="a"),
    "seed: expected an integer",
  ),
  "cross_validate seed 1.5": (
    lambda: crossval.cross_validate(U, OK, 2, 2, seed=1.5),
    "seed: expected an integer",
  ),
  "cross_validate n_folds 1": (
    lambda: crossval.cross_validate(U, OK, 2, 1),
    "n_folds: expected at least 2",
  ),
  "cross_validate NaN score": (
    lambda: crossval.cross_validate(np.where(OK, np.nan, U), OK, 2, 2),
    "u: 5 non-finite",
  ),
  # bins and their bounds
  "predict None": (lambda: binning.predict(None, U), "bins: expected binning.Bins"),
  "refit None": (lambda: binning.refit(None, U, OK), "bins: expected binning.Bins"),
  "confidence_bounds None": (
    lambda: binning.confidence_bounds(None),
    "bins: expected binning.Bins",
  ),
  "hoeffding delta 'a'": (
    lambda: binning.hoeffding_halfwidth(5, "a"),
    "delta: expected a probability",
  ),
  "hoeffding count -1": (lambda: binning.hoeffding_halfwidth([-1]), "count: expected whole counts"),
  "clopper_pearson hits 2.5": (
    lambda: binning.clopper_pearson(2.5, 3),
    "hits: expected whole counts",
  ),
  "clopper_pearson count NaN": (
    lambda: binning.clopper_pearson(2, np.nan),
    "count: expected whole counts",
  ),
  "clopper_pearson hits > count": (
    lambda: binning.clopper_pearson(4, 3),
    "hits: expected 0 <= hits",
  ),
  "clopper_pearson count 2**41": (
    lambda: binning.clopper_pearson(1, 2**41),
    "count: expected whole counts",
  ),
  "fit n_bins > N": (lambda: binning.fit(U, OK, 11), "n_bins: expected at least 1, at most 10"),
  # bins a user built: edges out of order put scores in the wrong bins, silently
  "predict descending edges": (
    lambda: binning.predict(BINS_4._replace(edges=np.array([0.7, 0.5, 0.2])), U),
    "bins.edges: expected ascending edges (padded with +inf), got 0.5 at index 1 after 0.7",
  ),
  "predict NaN edge": (
    lambda: binning.predict(BINS_4._replace(edges=np.array([0.2, np.nan, 0.7])), U),
    "bins.edges: expected ascending edges",
  ),
  "refit descending edges": (
    lambda: binning.refit(BINS_4._replace(edges=np.array([0.7, 0.5, 0.2])), U, OK),
    "bins.edges: expected ascending edges",
  ),
  "predict prob of another length": (
    lambda: binning.predict(BINS_4._replace(prob=BINS.prob), U),
    "bins: expected [n_bins - 1] edges and [n_bins] counts, hits and prob, got shapes (3,) and"
    " (4,), (4,), (2,)",
  ),
  "guaranteed_coverage target 1": (
    lambda: selective.guaranteed_coverage(BINS, 1.0),
    "target_accuracy: expected an accuracy in [0, 1), got 1; no finite calibration set",
  ),
  "ece n_bins 10**9": (
    lambda: metrics.ece(U, OK, n_bins=10**9),
    "n_bins: expected at least 1, at most 65536, got 1000000000",
  ),
  "confidence_ece n_bins 10**9": (
    lambda: baselines.confidence_ece(LOGITS, LABELS, from_logits=True, n_bins=10**9),
    "n_bins: expected at least 1, at most 65536",
  ),
  "histogram binning n_bins 10**9": (
    lambda: baselines.fit_histogram_binning(LOGITS, LABELS, from_logits=True, n_bins=10**9),
    "n_bins: expected at least 1, at most 65536",
  ),
  "fit implementation": (
    lambda: binning.fit(U, OK, 2, implementation="gpu"),
    "implementation: expected",
  ),
  # bins and metrics given something else than bins
  "binned_ece None": (lambda: metrics.binned_ece(None, BINS), "train_bins: expected binning.Bins"),
  "binned_ece test None": (
    lambda: metrics.binned_ece(BINS, None),
    "test_bins: expected binning.Bins",
  ),
  # ece(train_bins, test_bins) was the bins-based ECE, now binned_ece: the old call says so
  "ece of bins": (
    lambda: metrics.ece(BINS, BINS),
    "confidence: got binning.Bins; for fitted bins call binned_ece(train, test)",
  ),
  "ece None": (lambda: metrics.ece(None, OK), "confidence: expected an array, got None"),
  "brier_decomposition None": (
    lambda: metrics.brier_decomposition(None, BINS),
    "train_bins: expected",
  ),
  "auroc one class": (lambda: metrics.auroc(U, np.ones(10, bool)), "correct: AUROC needs both"),
  # baselines
  "apply_temperature 1e-40": (
    lambda: baselines.apply_temperature(LOGITS, 1e-40),
    "temperature: expected a value in [1e-05, 100000]",
  ),
  "apply_temperature NaN": (
    lambda: baselines.apply_temperature(LOGITS, np.nan),
    "temperature: 1 non-finite",
  ),
  "histogram binning None": (
    lambda: baselines.predict_histogram_binning(None, LOGITS, from_logits=True),
    "binning: expected fit_histogram_binning",
  ),
  # scores
  "covariance of 1e20 logits": (
    lambda: scores.covariance_norm(
      np.random.default_rng(1).normal(size=(3, 4, 5)).astype(np.float32) * 1e20
    ),
    "samples: the covariance norm exceeds the float32 range",
  ),
  "one sample": (lambda: scores.covariance_norm(LOGITS[None]), "samples: need at least 2 samples"),
  # booleans where real numbers are expected (fit_temperature gave T = 99999.9)
  **{
    f"bool logits: {name}": (call, "logits: expected real numbers, got a bool array")
    for name, call in {
      "neg_log_pmax": lambda: scores.neg_log_pmax(BOOL_LOGITS),
      "margin": lambda: scores.margin(BOOL_LOGITS),
      "neg_log_topk_mass": lambda: scores.neg_log_topk_mass(BOOL_LOGITS, 2),
      "multiclass_nll": lambda: baselines.multiclass_nll(BOOL_LOGITS, LABELS, from_logits=True),
      "fit_temperature": lambda: temperature.fit_temperature(BOOL_LOGITS, LABELS),
    }.items()
  },
  "bool logits: Calibrator": (
    lambda: Calibrator(inputs="logits").fit(BOOL_LOGITS, LABELS),
    "x: expected real numbers, got a bool array",
  ),
  "bool samples: covariance_norm": (
    lambda: scores.covariance_norm(np.stack([BOOL_LOGITS, ~BOOL_LOGITS])),
    "samples: expected real numbers, got a bool array",
  ),
  # probabilities that are not probability vectors (Calibrator refused probs * 2 already)
  "from_predictions mean_probs * 3": (
    lambda: scores.from_predictions(mean_probs=PROBS * 3),
    "mean_probs: probabilities must lie in [0, 1]",
  ),
  "from_predictions mean_probs / 3": (
    lambda: scores.from_predictions(mean_probs=PROBS / 3),
    "mean_probs: each row must sum to 1, row 1 sums to 0.333333",
  ),
  "log_probs_from_probs zeros": (
    lambda: scores.log_probs_from_probs(np.zeros((3, 4))),
    "probs: each row must sum to 1, row 0 sums to 0",
  ),
  "log_probs_from_probs negative": (
    lambda: scores.log_probs_from_probs(np.array([[1.5, -0.5]])),
    "probs: probabilities must lie in [0, 1]",
  ),
  # probabilities where logits are expected run and give other numbers: refused, with the fix
  **{
    f"probs as logits: {name}": (
      call,
      f"{arg}: these look like probabilities (every row in [0, 1], summing to 1); {fix}",
    )
    for name, (call, arg, fix) in {
      "Calibrator.fit": (
        lambda: Calibrator(inputs="logits").fit(PROBS, LABELS),
        "x",
        'pass inputs="probs"',
      ),
      "Calibrator.fit [S, N, K]": (
        lambda: Calibrator(inputs="logits").fit(np.stack([PROBS, PROBS[::-1]]), LABELS),
        "x",
        'pass inputs="probs"',
      ),
      "Calibrator bfloat16": (  # rows summing to 1 within bfloat16's own epsilon
        lambda: Calibrator(inputs="logits").fit(PROBS.astype(ml_dtypes.bfloat16), LABELS),
        "x",
        'pass inputs="probs"',
      ),
      "Calibrator.predict_proba": (
        lambda: Calibrator(n_bins=2).fit(LOGITS, LABELS).predict_proba(PROBS),
        "x",
        'pass inputs="probs"',
      ),
      "from_predictions": (
        lambda: scores.from_predictions(logits=PROBS[None]),
        "logits",
        "pass mean_probs=probs, or logits=log(probs) for [S, N, K] samples",
      ),
      "from_predictions on the device": (
        lambda: scores.from_predictions(logits=jnp.asarray(PROBS[None])),
        "logits",
        "pass mean_probs=probs, or logits=log(probs) for [S, N, K] samples",
      ),
      "multiclass_nll": (
        lambda: baselines.multiclass_nll(PROBS, LABELS, from_logits=True),
        "logits",
        "leave from_logits=False",
      ),
    }.items()
  },
  # the reverse, logits where probabilities are expected, fails the probability checks
  "logits as probs: Calibrator": (
    lambda: Calibrator(inputs="probs").fit(LOGITS, LABELS),
    "x: probabilities must lie in [0, 1], got min",
  ),
  "logits as probs: from_predictions": (
    lambda: scores.from_predictions(mean_probs=LOGITS),
    "mean_probs: probabilities must lie in [0, 1]",
  ),
  "logits as probs: multiclass_brier": (
    lambda: baselines.multiclass_brier(LOGITS, LABELS),
    "probs: probabilities must lie in [0, 1]",
  ),
  "logits in [0, 1] as probs: multiclass_brier": (  # rows not summing to 1
    lambda: baselines.multiclass_brier(np.abs(LOGITS) / 10, LABELS),
    "probs: each row must sum to 1",
  ),
  # a torch tensor that requires grad
  "tensor that requires grad": (
    lambda: scores.neg_log_pmax(_TensorThatRequiresGrad()),
    "logits: cannot convert to an array (Can't call numpy() on Tensor that requires grad.",
  ),
  "tensor that requires grad: the hint": (
    lambda: Calibrator().fit(_TensorThatRequiresGrad(), LABELS),
    "; call .detach() on the tensor first",
  ),
  "one class": (lambda: scores.entropy(LOGITS[:, :1]), "logits: expected at least 2 classes"),
  "human probs not summing to 1": (
    lambda: scores.human_entropy(np.full((2, 3), 0.5)),
    "probs: each row must sum to 1",
  ),
  # predictions files and arrays
  "logits and disagreeing mean_probs": (
    lambda: predictions.Predictions(
      labels=np.zeros(6, int), logits=LOGITS[None], mean_probs=np.full((6, 5), 0.2, np.float32)
    ),
    "mean_probs: row",
  ),
  "[S, N, K] probs not summing to 1": (
    lambda: scores.compute(LOGITS, human_probs=np.full((6, 5), 0.5)),
    "human_probs: each row must sum to 1",
  ),
  # the example data's names
  "load_example unknown name": (
    lambda: examples.load_example("cifar10"),
    "name: expected one of 'densenet-bc-100-cifar-100', 'lenet-5-cifar-10', got 'cifar10'",
  ),
  "load_example name None": (lambda: examples.load_example(None), "name: expected one of"),
}


@pytest.mark.parametrize("call, message", CASES.values(), ids=CASES.keys())
def test_bad_input_gets_a_one_line_value_error(call, message):
  with pytest.raises(ValueError) as info:
    call()
  assert message in str(info.value)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize(
  "content, what",
  [(b"hello, not an archive", "text"), (gzip.compress(b"hello"), "gzip-compressed data")],
  ids=["text", "gzip"],
)
def test_a_file_that_is_not_an_npz_is_named_as_such(content, what, tmp_path):
  path = tmp_path / "preds.npz"
  path.write_bytes(content)
  with pytest.raises(ValueError) as info:
    predictions.load_predictions(path)
  assert str(info.value) == (
    f"{path}: not a readable .npz predictions file (it is {what}; expected an .npz archive of"
    " named arrays, as save_predictions writes)"
  )


@pytest.mark.parametrize(
  "content, what",
  [(b"0,1,2\n", "text"), (b"\x80\x04K\x01.", "a Python pickle"), (b"PK\x03\x04xx", "a zip")],
)
def test_an_array_file_that_is_not_npy_says_what_it_is_never_allow_pickle(content, what, tmp_path):
  # NumPy's own message had told users to pass allow_pickle=True (loading runs the
  # file's code); the error says what the file is and what is expected instead.
  np.save(tmp_path / "l.npy", LOGITS)
  (tmp_path / "y.txt").write_bytes(content)
  with pytest.raises(ValueError) as info:
    predictions.from_arrays(labels=tmp_path / "y.txt", logits=tmp_path / "l.npy")
  text = str(info.value)
  assert text.startswith(f"labels: {tmp_path / 'y.txt'}: not a readable ") and what in text
  assert "pickle=" not in text and "\n" not in text
  if what == "text":
    assert text.endswith(
      "(it is text; expected a .npy array of int [N] class labels, as np.save writes)"
    )


def test_from_arrays_names_the_file_whose_contents_are_wrong(tmp_path):
  np.save(tmp_path / "y.npy", LABELS)
  np.save(tmp_path / "y2d.npy", np.zeros((6, 2), int))
  np.save(tmp_path / "y5.npy", LABELS[:5])
  np.save(tmp_path / "l.npy", LOGITS)
  np.save(tmp_path / "l_nan.npy", np.where(LOGITS > 1, np.nan, LOGITS))
  cases = [
    ("y2d.npy", "l.npy", "labels: expected a 1-D array", "y2d.npy"),
    ("y.npy", "l_nan.npy", "logits: ", "l_nan.npy"),
    ("y5.npy", "l.npy", "logits: expected N=5", "l.npy"),
  ]
  for labels, logits, message, where in cases:
    with pytest.raises(ValueError) as info:
      predictions.from_arrays(labels=tmp_path / labels, logits=tmp_path / logits)
    text = str(info.value)
    assert text.startswith(message) and text.endswith(f"(in {tmp_path / where})"), text


def test_consistent_logits_and_mean_probs_are_accepted():
  z = np.exp(LOGITS - LOGITS.max(1, keepdims=True))
  probs = (z / z.sum(1, keepdims=True)).astype(np.float32)
  both = predictions.Predictions(labels=np.zeros(6, int), logits=LOGITS[None], mean_probs=probs)
  assert both.num_samples == 1


def test_probabilities_from_a_npy_given_as_logits_are_refused(tmp_path):
  # The command line's array path (--config.input_kind=logits) reads through from_arrays.
  np.save(tmp_path / "y.npy", LABELS)
  np.save(tmp_path / "p.npy", PROBS)
  np.save(tmp_path / "l.npy", LOGITS)
  with pytest.raises(ValueError) as info:
    predictions.from_arrays(labels=tmp_path / "y.npy", logits=tmp_path / "p.npy")
  assert str(info.value) == (
    "logits: these look like probabilities (every row in [0, 1], summing to 1);"
    f" pass them as probs (--config.input_kind=probs) (in {tmp_path / 'p.npy'})"
  )
  with pytest.raises(ValueError, match=r"^probs: probabilities must lie in \[0, 1\]"):
    predictions.from_arrays(labels=tmp_path / "y.npy", probs=tmp_path / "l.npy")
  assert predictions.from_arrays(labels=tmp_path / "y.npy", probs=tmp_path / "p.npy")
  assert predictions.from_arrays(labels=tmp_path / "y.npy", logits=tmp_path / "l.npy")


@pytest.mark.parametrize("on_device", [False, True], ids=["numpy", "jax"])
@pytest.mark.parametrize("num_rows", [6, 24000], ids=["small", "large"])
def test_logits_are_refused_only_when_every_row_looks_like_probabilities(on_device, num_rows):
  # Small arrays are checked from a host copy, large device ones by a compiled pass.
  probs = np.tile(PROBS, (num_rows // 6, 1))
  as_given = jnp.asarray if on_device else np.asarray
  assert validation.looks_like_probabilities(as_given(probs))
  for row in (0, num_rows - 1):  # one row of real logits anywhere: logits
    logits = probs.copy()
    logits[row] = LOGITS[0]
    assert not validation.looks_like_probabilities(as_given(logits))
  off = probs.copy()
  # A sum 5e-3 from 1: beyond float32's tolerance and the rounding of five values to three
  # decimals (2.5e-3), within bfloat16's epsilon.
  off[-1] *= 1.005
  assert not validation.looks_like_probabilities(as_given(off))
  assert validation.looks_like_probabilities(as_given(off), dtype=jnp.bfloat16)
  assert not validation.looks_like_probabilities(as_given(LOGITS))
  assert not validation.looks_like_probabilities(as_given(np.zeros((0, 5), np.float32)))


@pytest.mark.parametrize("num_classes", [2, 10, 100, 1000])
def test_probabilities_rounded_to_three_decimals_are_refused_as_logits(num_classes):
  # Rounded CIFAR-100 probabilities had passed as logits (a top-label Brier of 0.443
  # instead of 0.167): their rows sum to 1 only within 100 x 5e-4.
  rng = np.random.default_rng(num_classes)
  probs = rng.dirichlet(np.full(num_classes, 0.1), size=400)
  rounded = np.round(probs, 3).astype(np.float32)
  labels = rng.integers(0, num_classes, 400)
  far = np.abs(rounded.sum(1) - 1).max()
  with pytest.raises(ValueError) as info:
    Calibrator(n_bins=4, inputs="logits").fit(rounded, labels)
  text = str(info.value)
  assert text.startswith("x: these look like probabilities (every row in [0, 1], summing to 1")
  assert text.count("\n") == 0 and 'pass inputs="probs"' in text
  if far > validation.SUM_TOLERANCE:  # the fix includes the rescaling, said with the sums
    assert "within rounding" in text and "divide each by its sum first" in text
  rescaled = rounded / rounded.sum(1, keepdims=True)
  assert Calibrator(n_bins=4, inputs="probs").fit(rescaled, labels)
  # Real logits stay logits, however many classes.
  logits = np.log(probs + 1e-6).astype(np.float32)
  assert not validation.looks_like_probabilities(logits)


def test_real_logits_with_some_rows_in_the_unit_interval_are_accepted():
  # Logits that look like probabilities on some rows (one-hot, uniform 1/K) are logits.
  logits = LOGITS.copy()
  logits[0] = np.eye(5)[1]
  logits[1] = 0.2
  assert Calibrator(n_bins=2, inputs="logits").fit(logits, LABELS).num_classes_ == 5
  # Said to be logits, they are; the default ("auto") cannot tell, and says so in one line.
  with pytest.raises(ValueError, match='^x: 2 of 6 rows look like probabilities.*inputs="logits"$'):
    Calibrator(n_bins=2).fit(logits, LABELS)
  assert scores.from_predictions(logits=logits[None]).log_probs.shape == logits.shape
  assert np.isfinite(baselines.multiclass_nll(logits, LABELS, from_logits=True))


@pytest.mark.parametrize("correct", [np.ones(40, bool), np.zeros(40, bool), np.arange(40) > 0])
def test_degenerate_but_valid_events_never_give_nan(correct):
  u = np.random.default_rng(2).random(40)
  cv = crossval.cross_validate(u, correct, (2, 4), n_folds=6)
  for row in cv.rows():
    assert all(v is None or np.isfinite(v) for v in row.values()), row
  assert np.all(np.isfinite(np.asarray(binning.fit(u, correct, 4).prob)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("on_device", [False, True], ids=["numpy", "jax"])
def test_a_non_finite_value_anywhere_is_found(bad, on_device):
  import jax.numpy as jnp

  logits = np.random.default_rng(1).normal(size=(300, 70)).astype(np.float32)
  logits[211, 33] = bad
  array = jnp.asarray(logits) if on_device else logits
  with pytest.raises(
    ValueError, match=r"logits: 1 non-finite value\(s\) \(first at flat index 14803"
  ):
    scores.neg_log_pmax(array)


@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("size", [100, 2**19], ids=["small", "large"])
def test_a_checked_host_array_reaches_the_device_as_a_private_copy(shift, size):
  # XLA:CPU keeps a 64-byte aligned host buffer rather than copying it: the caller's
  # array must never be that buffer, whether or not it is aligned.
  raw = np.zeros(size + 32, np.float32)
  start = (-raw.ctypes.data % 64) // 4 + shift
  given = raw[start : start + size]
  assert (given.ctypes.data % 64 == 0) == (shift == 0)
  on_device = validation.float_array("u", given, 1)
  given[:] = 7.0
  np.testing.assert_array_equal(np.asarray(on_device), np.zeros(size, np.float32))


LOW_PRECISION = {
  "jnp.bfloat16": lambda x: jnp.asarray(x, jnp.bfloat16),
  "ml_dtypes.bfloat16": lambda x: np.asarray(x).astype(ml_dtypes.bfloat16),
  "np.float16": lambda x: np.asarray(x, np.float16),
  "jnp.float16": lambda x: jnp.asarray(x, jnp.float16),
}


@pytest.mark.parametrize("cast", LOW_PRECISION.values(), ids=LOW_PRECISION.keys())
def test_low_precision_inputs_give_the_float32_result(cast):
  # They were refused as "not real-valued" (bfloat16) or computed in float16; each call
  # must give what the same values give in float32.
  rng = np.random.default_rng(5)
  logits = cast(3 * rng.normal(size=(60, 5)))
  same = np.asarray(logits).astype(np.float32)  # the very values, in float32
  for score in (scores.neg_log_pmax, scores.entropy, scores.margin, scores.pmax):
    got = score(logits)
    assert got.dtype == np.float32, score
    np.testing.assert_array_equal(got, score(same))
  np.testing.assert_array_equal(
    scores.neg_log_topk_mass(logits, 2), scores.neg_log_topk_mass(same, 2)
  )
  samples = cast(rng.normal(size=(4, 60, 5)))
  np.testing.assert_array_equal(
    scores.covariance_norm(samples), scores.covariance_norm(np.asarray(samples).astype(np.float32))
  )
  p, correct = cast(rng.random(60)), rng.random(60) < 0.7
  p_same = np.asarray(p).astype(np.float32)
  for metric in (metrics.brier, metrics.nll, metrics.auroc):
    np.testing.assert_array_equal(metric(p, correct), metric(p_same, correct))
  labels = rng.integers(0, 5, 60)
  fitted = Calibrator(n_bins=3).fit(logits, labels)
  want = Calibrator(n_bins=3).fit(same, labels).predict_confidence(same)
  np.testing.assert_array_equal(fitted.predict_confidence(logits), want)


@pytest.mark.parametrize("cast", LOW_PRECISION.values(), ids=LOW_PRECISION.keys())
def test_low_precision_probabilities_are_accepted_with_their_own_rounding(cast):
  # A bfloat16 softmax row sums to 1 only within bfloat16's epsilon (2^-7), more than
  # the 1e-3 of float32 inputs.
  rng = np.random.default_rng(6)
  z = np.exp(3 * rng.normal(size=(60, 5)))
  probs = cast(z / z.sum(1, keepdims=True))
  labels = rng.integers(0, 5, 60)
  log_probs = np.log(np.asarray(probs).astype(np.float64)).astype(np.float32)
  got = Calibrator(inputs="probs", n_bins=3).fit(probs, labels).predict_confidence(probs)
  want = Calibrator(n_bins=3).fit(log_probs, labels).predict_confidence(log_probs)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(scores.log_probs_from_probs(probs), log_probs)
