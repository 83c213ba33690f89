"""Bad and degenerate input across the public API: a one-line ValueError naming the argument.

One table, one row per case (the reliability issue's list, and its neighbours). A case
passes when the call raises ``ValueError`` (not TypeError, AttributeError or a silent
NaN), its message names the argument, and the message is one line.
"""

import gzip

import numpy as np
import pytest

from top1_jax.core import binning, events, metrics, scores, validation
from top1_jax.evaluation import baselines, crossval
from top1_jax.io import examples, predictions

LOGITS = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
U = np.linspace(0.0, 1.0, 10)
OK = np.arange(10) % 2 == 0
BINS = binning.fit(U, OK, 2)

CASES = {
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
  "fit implementation": (
    lambda: binning.fit(U, OK, 2, implementation="gpu"),
    "implementation: expected",
  ),
  # bins and metrics given something else than bins
  "ece None": (lambda: metrics.ece(None, BINS), "train_bins: expected binning.Bins"),
  "ece test None": (lambda: metrics.ece(BINS, None), "test_bins: expected binning.Bins"),
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
    lambda: baselines.predict_histogram_binning(None, logits=LOGITS),
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
  "content", [b"hello, not an archive", gzip.compress(b"hello")], ids=["text", "gzip"]
)
def test_a_file_that_is_not_an_npz_is_named_as_such(content, tmp_path):
  path = tmp_path / "preds.npz"
  path.write_bytes(content)
  with pytest.raises(
    ValueError, match="not an .npz archive: neither a zip file nor a NumPy array file"
  ):
    predictions.load_predictions(path)


def test_consistent_logits_and_mean_probs_are_accepted():
  z = np.exp(LOGITS - LOGITS.max(1, keepdims=True))
  probs = (z / z.sum(1, keepdims=True)).astype(np.float32)
  both = predictions.Predictions(labels=np.zeros(6, int), logits=LOGITS[None], mean_probs=probs)
  assert both.num_samples == 1


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
