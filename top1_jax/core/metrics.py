"""Scores of P(correct) predictions: Brier, NLL, ECE, EOR, AUROC and decompositions (§4).

Public metrics take predictions, then ``correct: [N]``, and return a float; the
``*_from_counts`` ones take per-bin counts and hits, for ``jit``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, equal_width, validation
from top1_jax.core.binning import Bins
from top1_jax.core.smooth_ece import smooth_ece as smooth_ece  # a metric, found here

# Clip so a saturated 1.0 costs ~15.9 nats, not inf; 1 - 2^-23 is exact in float32.
_PROB_EPS = 2.0**-23


class Decomposition(NamedTuple):
  """uncertainty - resolution + calibration == total (>= 0): floats, or [...] arrays from
  the ``*_from_counts`` functions."""

  uncertainty: float | jax.Array
  resolution: float | jax.Array
  calibration: float | jax.Array
  total: float | jax.Array


def _xlogy_binary(a: jax.Array, p: jax.Array) -> jax.Array:
  """-(a log p + (1-a) log(1-p)) with 0 log 0 = 0 and p clipped away from 0, 1."""
  p = jnp.clip(p, _PROB_EPS, 1.0 - _PROB_EPS)
  return -(jax.scipy.special.xlogy(a, p) + jax.scipy.special.xlog1py(1.0 - a, -p))


def _binary_entropy(a: jax.Array) -> jax.Array:
  a = jnp.clip(a, 0.0, 1.0)  # an accuracy that rounded just above 1 would give nan
  # 0 - x, not -x: an accuracy of 0 or 1 has entropy +0, not -0.
  return 0.0 - (jax.scipy.special.xlogy(a, a) + jax.scipy.special.xlog1py(1.0 - a, -a))


def _kl_binary(a: jax.Array, p: jax.Array) -> jax.Array:
  return _xlogy_binary(a, p) - _binary_entropy(a)


def brier_terms(p: jax.Array, correct: jax.Array) -> jax.Array:
  """Each example's (p - correct)^2, whose mean is ``brier``: unchecked, for jitted code."""
  return (p - correct) ** 2


def nll_terms(p: jax.Array, correct: jax.Array) -> jax.Array:
  """Each example's clipped binary NLL, whose mean is ``nll``: unchecked, for jitted code."""
  return _xlogy_binary(correct.astype(p.dtype), p)


_brier = jax.jit(lambda p, correct: jnp.mean(brier_terms(p, correct)))
_nll = jax.jit(lambda p, correct: jnp.mean(nll_terms(p, correct)))


def brier(p: ArrayLike, correct: ArrayLike) -> float:
  """Binary Brier score mean((p - correct)^2) of ``p: [N]`` in [0, 1]; smaller is better."""
  return float(_brier(*validation.score_and_event("p", p, correct, probability=True)))


def nll(p: ArrayLike, correct: ArrayLike) -> float:
  """Binary negative log-likelihood (nats) of ``p: [N]``, clipped to [2^-23, 1 - 2^-23]."""
  return float(_nll(*validation.score_and_event("p", p, correct, probability=True)))


@jax.jit
def _auroc(score, correct):
  num = score.shape[0]
  order = jnp.argsort(score)
  sorted_score = score[order]
  # Mid-rank of each tie group (1-based): ties count one half.
  first = jnp.searchsorted(sorted_score, sorted_score, side="left")
  last = jnp.searchsorted(sorted_score, sorted_score, side="right")
  mid_rank = 0.5 * (first + last + 1)
  positive = correct[order].astype(jnp.float32)
  num_pos = jnp.sum(positive)
  num_neg = num - num_pos
  rank_sum = jnp.sum(mid_rank * positive)
  return (rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg)


def auroc(score: ArrayLike, correct: ArrayLike) -> float:
  """P(score of a random correct example > a random incorrect one's), ties one half.
  Larger must mean "more likely correct" (negate an uncertainty); both classes needed."""
  score = validation.float_array("score", score, 1)
  correct = validation.bool_array("correct", correct)
  num = validation.same_length(score=score, correct=correct)
  if not validation.is_traced(correct):
    num_pos = int(jnp.sum(correct))
    if num_pos in (0, num):
      raise ValueError(
        f"correct: AUROC needs both correct and incorrect examples, got {num_pos} of {num} correct"
      )
  return float(_auroc(score, correct))


def auroc_from_counts(prob: jax.Array, counts: jax.Array, hits: jax.Array) -> jax.Array:
  """AUROC of a binned predictor, [..., B] bins scored by ``prob`` (NaN for one class)."""
  pos = hits.astype(jnp.float32)
  neg = (counts - hits).astype(jnp.float32)
  diff = prob[..., :, None] - prob[..., None, :]
  wins = jnp.where(diff > 0, 1.0, jnp.where(diff == 0, 0.5, 0.0))
  pairs = jnp.einsum("...i,...ij,...j->...", pos, wins, neg)
  return pairs / (jnp.sum(pos, -1) * jnp.sum(neg, -1))


def eor_from_probs(prob: jax.Array, weight: jax.Array, base_rate: jax.Array) -> jax.Array:
  """Array form of ``eor`` without input checks; batch axes lead, bins last."""
  logit_gap = jnp.abs(jax.scipy.special.logit(prob) - jax.scipy.special.logit(base_rate)[..., None])
  total = jnp.sum(weight, axis=-1)
  # exp(|logit p - logit a|) = max(O(p)/O(a), O(a)/O(p)); zero weight never costs inf.
  return jnp.sum(jnp.where(weight > 0, weight * jnp.exp(logit_gap), 0.0), axis=-1) / total


def eor(prob: ArrayLike, weight: ArrayLike, base_rate: ArrayLike) -> float:
  """Expected odds ratio sum_i w_i max(O(p_i)/O(a), O(a)/O(p_i)) >= 1, O(p) = p/(1-p).
  ``prob``: [B] in (0, 1); ``weight``: [B] >= 0 (e.g. counts), normalised; ``base_rate``
  a, e.g. the accuracy."""
  prob = validation.probability_array("prob", prob, 1)
  weight = validation.float_array("weight", weight, 1)
  validation.same_length(prob=prob, weight=weight)
  base_rate = validation.probability_array("base_rate", base_rate, 0)
  # Concrete [B] arrays are checked on the host: eager jnp ops compile a program each.
  if not validation.is_traced(weight):
    host_weight = np.asarray(weight)
    if np.any(host_weight < 0) or not np.sum(host_weight) > 0:
      raise ValueError("weight: expected non-negative weights with a positive sum")
  if not validation.is_traced(prob):
    used = np.asarray(prob)[np.asarray(weight) > 0]
    if np.any((used <= 0) | (used >= 1)):
      raise ValueError("prob: the odds ratio needs probabilities strictly inside (0, 1)")
    if not 0.0 < float(base_rate) < 1.0:
      raise ValueError(
        f"base_rate: expected a value strictly inside (0, 1), got {float(base_rate)}"
      )
  return float(_eor_from_probs(prob, weight, base_rate))


def _test_terms(counts, hits):
  counts = counts.astype(jnp.float32)
  total = jnp.sum(counts, axis=-1, keepdims=True)
  weight = counts / total
  # Clipped: float32 division on a GPU is not always correctly rounded (1 + 2^-23).
  acc_bin = jnp.clip(jnp.where(counts > 0, hits / jnp.maximum(counts, 1.0), 0.0), 0.0, 1.0)
  # The weighted sum of accuracies of 1 rounds to 1 + 2^-23 (a negative a(1 - a)).
  acc = jnp.clip(jnp.sum(weight * acc_bin, axis=-1, keepdims=True), 0.0, 1.0)
  return weight, acc_bin, acc


def _decomposition(uncertainty, resolution, calibration) -> Decomposition:
  # A Brier or NLL is never negative: rounding of a zero total stops at 0.
  total = jnp.maximum(uncertainty - resolution + calibration, 0.0)
  return Decomposition(uncertainty, resolution, calibration, total)


def brier_from_counts(prob: jax.Array, counts: jax.Array, hits: jax.Array) -> Decomposition:
  """Brier decomposition of per-bin predictions ``prob`` on a split's [..., B] counts, hits."""
  weight, acc_bin, acc = _test_terms(counts, hits)
  uncertainty = (acc * (1 - acc))[..., 0]
  resolution = jnp.sum(weight * (acc_bin - acc) ** 2, axis=-1)
  calibration = jnp.sum(weight * (prob - acc_bin) ** 2, axis=-1)
  return _decomposition(uncertainty, resolution, calibration)


def nll_from_counts(prob: jax.Array, counts: jax.Array, hits: jax.Array) -> Decomposition:
  """NLL decomposition (nats), same arguments as ``brier_from_counts``."""
  weight, acc_bin, acc = _test_terms(counts, hits)
  uncertainty = _binary_entropy(acc)[..., 0]
  resolution = jnp.sum(weight * _kl_binary(acc_bin, acc), axis=-1)
  calibration = jnp.sum(weight * _kl_binary(acc_bin, prob), axis=-1)
  return _decomposition(uncertainty, resolution, calibration)


def ece_from_counts(prob: jax.Array, counts: jax.Array, hits: jax.Array) -> jax.Array:
  """sum_i w_i |a_i - p_i| with test weights and accuracies; same arguments as above."""
  weight, acc_bin, _ = _test_terms(counts, hits)
  return jnp.sum(weight * jnp.abs(acc_bin - prob), axis=-1)


def split_metrics(
  prob, prior, cal_counts, test_counts, test_hits, brier=None, nll=None
) -> dict[str, jax.Array]:
  """``splits.METRICS`` -> [...] float32, of one prediction per bin on test counts;
  unchecked. ``prob``: [..., B] (empty bins: anything finite); ``prior``: [...] calibration
  accuracy (EOR's base rate); counts and hits: [..., B]. ``brier`` and ``nll``: [...] means
  of per-example predictions, or None for the binned predictor's own. EOR and AUROC are
  NaN where undefined."""
  out = {"accuracy": jnp.sum(test_hits, -1) / jnp.sum(test_counts, -1)}
  for name, of_counts, mean in (("brier", brier_from_counts, brier), ("nll", nll_from_counts, nll)):
    terms = of_counts(prob, test_counts, test_hits)
    out[name] = terms.total if mean is None else mean
    out.update({f"{name}_{term}": getattr(terms, term) for term in Decomposition._fields[:3]})
  return out | {
    "ece": ece_from_counts(prob, test_counts, test_hits),
    "eor": jnp.where((prior > 0) & (prior < 1), eor_from_probs(prob, test_counts, prior), jnp.nan),
    "auroc": jnp.where(
      (jnp.sum(test_hits, -1) > 0) & (jnp.sum(test_counts - test_hits, -1) > 0),
      auroc_from_counts(prob, test_counts, test_hits),
      jnp.nan,
    ),
    "num_effective_bins": jnp.sum(cal_counts > 0, -1).astype(jnp.float32),
  }


# Jitted once for concrete bins: run eagerly, each jnp op compiled a program of its own.
_ece_of_counts = jax.jit(ece_from_counts)
_brier_of_counts = jax.jit(brier_from_counts)
_nll_of_counts = jax.jit(nll_from_counts)
_eor_from_probs = jax.jit(eor_from_probs)


def _of_bin_pair(of_counts, train_bins: Bins, test_bins: Bins):
  """``of_counts`` of ``train_bins``' predictions on the test bins' counts, both checked."""
  binning.checked_bins(train_bins, "train_bins")
  binning.checked_bins(test_bins, "test_bins")
  if train_bins.n_bins != test_bins.n_bins:
    raise ValueError(
      f"test_bins: expected {train_bins.n_bins} bins like train_bins, got {test_bins.n_bins}"
    )
  if not validation.is_traced(test_bins.counts) and not np.sum(np.asarray(test_bins.counts)) > 0:
    raise ValueError("test_bins: no examples were counted")
  return of_counts(train_bins.prob, test_bins.counts, test_bins.hits)


def ece(
  confidence: ArrayLike, correct: ArrayLike, n_bins: int = equal_width.DEFAULT_ECE_BINS
) -> float:
  """ECE ``sum_b (n_b / N) |acc_b - conf_b|`` of P(correct) predictions in ``n_bins``
  equal-width bins of [0, 1] (Guo et al. 2017; the benchmark's)."""
  if isinstance(confidence, Bins):  # the bins-based ECE was named ece before binned_ece
    raise ValueError("confidence: got binning.Bins; for fitted bins call binned_ece(train, test)")
  return float(equal_width.equal_width_bins(confidence, correct, n_bins).ece)


def binned_ece(train_bins: Bins, test_bins: Bins) -> float:
  """ECE sum_i w_i^test |p_i^test - p_i^train| (paper eq. CE) of fitted bins on test bins,
  e.g. ``binning.refit(train_bins, u, c)``."""
  return float(_of_bin_pair(_ece_of_counts, train_bins, test_bins))


def brier_decomposition(train_bins: Bins, test_bins: Bins) -> Decomposition:
  """Brier score of ``train_bins``' predictions on the test bins, decomposed (§4)."""
  return Decomposition(*map(float, _of_bin_pair(_brier_of_counts, train_bins, test_bins)))


def nll_decomposition(train_bins: Bins, test_bins: Bins) -> Decomposition:
  """NLL of ``train_bins``' predictions on the test bins, decomposed (§4)."""
  return Decomposition(*map(float, _of_bin_pair(_nll_of_counts, train_bins, test_bins)))


@jax.jit
def _selective_risk(confidence, correct):
  order = jnp.argsort(-confidence)
  key = -confidence[order]
  wrong_before = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(~correct[order])])
  first = jnp.searchsorted(key, key, side="left")
  last = jnp.searchsorted(key, key, side="right")
  # A tie group [first, last) contributes its mean error per example taken.
  group_wrong = (wrong_before[last] - wrong_before[first]).astype(jnp.float32)
  taken = jnp.arange(1, key.shape[0] + 1) - first
  expected_wrong = wrong_before[first] + taken * group_wrong / (last - first)
  return expected_wrong / jnp.arange(1, key.shape[0] + 1)


def selective_risk(confidence: ArrayLike, correct: ArrayLike) -> jax.Array:
  """[N] error rates among the n most confident examples, n = 1..N (coverage n / N).
  Ties in ``confidence`` are averaged over every order, so the input order does not count."""
  confidence, correct = validation.score_and_event("confidence", confidence, correct)
  return _selective_risk(confidence, correct)


def aurc(confidence: ArrayLike, correct: ArrayLike) -> float:
  """Area under the risk-coverage curve: the mean of ``selective_risk``; smaller is better."""
  return float(jnp.mean(selective_risk(confidence, correct)))


def bins_phrase(requested: int, effective: float | None = None, binning: str = "") -> str:
  """How many bins: "15 equal-mass bins", or "15 equal-mass bins requested, 12 after ties"
  where ``effective`` (bins holding examples, or a mean) is below ``requested``."""
  kind = f"{binning} " if binning else ""
  if effective is None or float(effective) >= requested:
    return f"{requested} {kind}bins"
  return f"{requested} {kind}bins requested, {float(effective):.3g} after ties"


BINNED_AUROC_NAME = "AUROC (binned predictions)"
"""The AUROC of a binned predictor's per-example predictions, not of the raw score."""


def ece_name(
  n_bins: int | str,
  binning: str,
  effective: float | None = None,
  *,
  calibration: bool = False,
  percent: bool = False,
) -> str:
  """The one name of an ECE wherever shown, e.g. "ECE (15 equal-width bins)". ``n_bins``
  may be a word ("N"); ``effective`` as in ``bins_phrase``; ``calibration``: fitted on a
  calibration split; ``percent``: "ECE %"."""
  kind = f"{binning} calibration-split" if calibration else binning
  bins = (
    f"{n_bins} {kind} bins" if isinstance(n_bins, str) else bins_phrase(n_bins, effective, kind)
  )
  return f"ECE{' %' if percent else ''} ({bins})"
