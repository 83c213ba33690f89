"""Recalibration with a few labels from shifted data: refits, and the bins updated from clean.

A model calibrated on clean data meets shifted data (``dataset_shift``), and a user can
label m of its examples. ``recalibrate`` asks what m buys: for every split of the
evaluation protocol (``protocol.evaluate``, given ``refit_on``), m labelled examples are
drawn from the shifted set's calibration part (``label_draws``: several draws per
split), each method is fitted on them, and the shifted test part is scored in the
clean calibration part's bins of U (so that every m is scored alike, m = 0 included):

* ``bins_refit``: the paper's bins refitted on the m examples alone, their count chosen
  by the bins' nested cross-validation (``bin_count``) on the m;
* ``bins_from_clean``: the clean bins updated (``update_bins``): each clean bin's
  probability is a prior worth s pseudo-counts, and the shifted examples that fall in
  the bin are added to it, ``(s p_b + h_b) / (s + n_b)``: the paper's one-pseudo-count
  prior at the clean accuracy, taken one level further. s is chosen per fit by the
  leave-one-out likelihood of the m examples (``choose_prior_strength``), or fixed;
* ``temperature`` and ``isotonic``: refitted on the m examples alone.

At m = 0 every method is its clean fit (the bins at ``n_bins``), the rows the shift
protocol gives today.
"""

import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike
from scipy import special  # a dependency of jax itself

from top1_jax.core import binning, validation
from top1_jax.core.splits import CrossValidation, Splits
from top1_jax.estimators import base
from top1_jax.evaluation import protocol

RECALIBRATIONS = ("bins_refit", "bins_from_clean", "temperature", "isotonic")
"""The methods ``recalibrate`` compares, in the tables' order."""

MIN_LABELS = 10
"""The fewest labelled examples a refit takes: the bins' count is chosen by nested
cross-validation on them (``bin_count.choose_n_bins``: 10 splits)."""

PRIOR_STRENGTHS = (*(2.0**e for e in range(-2, 11)), np.inf)
"""The grid of prior strengths s (pseudo-counts) ``choose_prior_strength`` searches:
1/4 to 1024, and infinity (the clean bins unchanged)."""


class Recalibrated(NamedTuple):
  """One method's metrics on one set after fitting on ``num_labels`` of its examples.

  Attributes:
    recalibration: a name of ``RECALIBRATIONS``.
    score: the score U it is fitted on or (temperature) binned by.
    test_set: the set's key.
    num_labels: m, the labelled examples of the set each fit saw (0: clean only).
    metrics: ``CrossValidation`` of ``METRICS`` over the splits and draws, at ``n_bins``.
  """

  recalibration: str
  score: str
  test_set: Hashable
  num_labels: int
  metrics: CrossValidation


# The clean-prior update of the bins.


def _loo_log_likelihood(prob, counts, hits, strength):
  """[..., G] log-likelihood of each example's outcome, predicted from the others."""
  prob, counts, hits = (np.asarray(x, np.float64)[..., None, :] for x in (prob, counts, hits))
  s = np.asarray(strength, np.float64)[:, None]
  finite = np.isfinite(s)
  s_ = np.where(finite, s, 0.0)
  # Left out: a correct example (hits - 1) or a wrong one; s = inf keeps the clean prob.
  denominator = np.maximum(s_ + counts - 1, 1e-300)
  if_correct = np.where(finite, (s_ * prob + hits - 1) / denominator, prob)
  if_wrong = np.where(finite, (s_ * prob + hits) / denominator, prob)
  tiny = 1e-12  # a clean prob of 0 or 1 (all wrong or all right) stays finite
  terms = hits * np.log(np.clip(if_correct, tiny, 1)) + (counts - hits) * np.log(
    np.clip(1 - if_wrong, tiny, 1)
  )
  return np.where(counts > 0, terms, 0.0).sum(-1)


def choose_prior_strength(
  prob: ArrayLike, counts: ArrayLike, hits: ArrayLike, grid: Sequence[float] = PRIOR_STRENGTHS
) -> np.ndarray:
  """The prior strength s of ``grid`` under which the new examples are likeliest, each
  predicted from the others (leave-one-out, in closed form per bin).

  Example i of bin b is predicted ``(s p_b + h_b - c_i) / (s + n_b - 1)``. Leave-one-out
  is nested cross-validation taken to its limit: no random split, exact and cheap. Ties
  (no new examples, or examples that favour no s) go to the stronger prior.

  Args:
    prob: [..., B] the clean bins' probabilities p_b (with the one-pseudo-count prior).
    counts, hits: [..., B] the new examples and the correct ones in each bin.
    grid: the candidate strengths (> 0, ``inf`` allowed).

  Returns:
    [...] float64, the chosen s.
  """
  grid = np.asarray(grid, np.float64)
  likelihood = _loo_log_likelihood(prob, counts, hits, grid)
  # argmax takes the first of equal maxima: over the grid reversed, the strongest prior.
  order = np.argsort(-grid, kind="stable")
  return grid[order][np.argmax(likelihood[..., order], axis=-1)]


def updated_prob(prob, counts, hits, strength) -> np.ndarray:
  """[..., B] ``(s p_b + h_b) / (s + n_b)`` (``p_b`` where s is infinite), float64."""
  prob, counts, hits = (np.asarray(x, np.float64) for x in (prob, counts, hits))
  s = np.asarray(strength, np.float64)[..., None]
  finite = np.isfinite(s)
  s_ = np.where(finite, s, 1.0)
  return np.where(finite, (s_ * prob + hits) / (s_ + counts), prob)


class BinUpdate(NamedTuple):
  """New labelled examples counted in clean bins, and the prior strength they came in with.

  Attributes:
    counts, hits: [B] int64, the new examples and the correct ones per bin.
    prior_strength: s, the pseudo-counts each clean probability is worth (``inf``: the
      clean bins unchanged).
  """

  counts: np.ndarray
  hits: np.ndarray
  prior_strength: float


def bin_update(
  bins: binning.Bins, evidence: base.Evidence, prior_strength: float | None = None
) -> BinUpdate:
  """The ``BinUpdate`` of new examples (``evidence.u`` [M], ``evidence.correct`` [M],
  checked by the caller) in clean ``bins``: s as given, or None (``choose_prior_strength``)."""
  counts, hits = bin_counts(bins, evidence.u, evidence.correct)
  strength = prior_strength
  if strength is None:
    strength = choose_prior_strength(np.asarray(bins.prob, np.float64), counts, hits)
  return BinUpdate(counts, hits, float(strength))


def applied(bins: binning.Bins, update: BinUpdate) -> binning.Bins:
  """The clean ``bins`` with each probability updated: edges, counts, hits and prior kept."""
  prob = np.asarray(bins.prob, np.float64)
  new = updated_prob(prob, update.counts, update.hits, update.prior_strength)
  return bins._replace(prob=new.astype(np.float32))


def update_bins(
  bins: binning.Bins, evidence: base.Evidence, prior_strength: float | None = None
) -> binning.Bins:
  """The clean bins with each bin's probability updated by new labelled examples
  (``bin_update``, then ``applied``): the ``update`` of ``bins_from_clean``.

  Args:
    bins: fitted on clean data (``binning.fit``); their probabilities are the prior.
    evidence: the new examples' scores ``u`` [M] and events ``correct`` [M].
    prior_strength: s, or None: chosen on these examples.
  """
  return applied(bins, bin_update(bins, evidence, prior_strength))


def update_interval(update: BinUpdate, bins: binning.Bins, evidence: base.Evidence, delta: float):
  """Each example's 1 - delta equal-tailed interval of its updated bin's probability: the
  Beta(s p_b + h_b, s (1 - p_b) + n_b - h_b) posterior of the clean prior (with s
  infinite, the clean bins' exact interval).

  Returns:
    (lower, upper), each [N] float32 in [0, 1].
  """
  index = np.asarray(binning.assign(np.asarray(bins.edges), np.asarray(evidence.u)))
  if not np.isfinite(update.prior_strength):
    lower, upper = binning.clopper_pearson(bins.hits, bins.counts, delta)
  else:
    prob = np.asarray(bins.prob, np.float64)  # the clean bins' (the prior's) probabilities
    s = update.prior_strength
    tiny = np.finfo(np.float64).tiny
    a = np.maximum(s * prob + update.hits, tiny)
    b = np.maximum(s * (1 - prob) + update.counts - update.hits, tiny)
    lower, upper = (special.betaincinv(a, b, q) for q in (delta / 2, 1 - delta / 2))
  return (np.asarray(x, np.float32)[index] for x in (lower, upper))


def bin_counts(bins: binning.Bins, u, correct) -> tuple[np.ndarray, np.ndarray]:
  """([B], [B]) int64: the examples of ``u`` in each of ``bins``, and the correct ones."""
  index = np.asarray(binning.assign(np.asarray(bins.edges), np.asarray(u)))
  n_bins = bins.counts.shape[-1]
  counts = np.bincount(index, minlength=n_bins)
  hits = np.bincount(index, np.asarray(correct, np.float64), n_bins).astype(np.int64)
  return counts, hits


# Drawing the labelled examples, and the protocol's calls.


def label_draws(
  splits: Splits, num_labels: int, num_draws: int, seed: int = 0
) -> tuple[Splits, np.ndarray]:
  """Each split once per draw, with ``num_labels`` examples drawn from its calibration part.

  Draw d of split f is split ``d * F + f`` of the returned splits (its test part is split
  f's). The draws are nested in m: the m examples are the first m of a permutation of
  the calibration part that depends on (seed, d, f) only. Where m is the whole part of
  every split, one draw is made (the others would repeat it).

  Args:
    splits: F calibration/test splits of N examples.
    num_labels: m, in [1, the smallest calibration part].
    num_draws: D >= 1.
    seed: the draws' NumPy seed.

  Returns:
    (``Splits`` of D * F splits, [D * F, N] bool: each split's m examples).
  """
  masks = [splits.test_mask(f) for f in range(splits.num_splits)]
  sizes = [int(np.count_nonzero(~test)) for test in masks]
  num_labels = validation.positive_int("num_labels", num_labels)
  (num_labels,) = checked_num_labels((num_labels,), min(sizes))
  num_draws = validation.positive_int("num_draws", num_draws)
  if num_labels == max(sizes):
    num_draws = 1
  rng = np.random.default_rng(validation.seed("seed", seed))
  folds, chosen = [], []
  for _ in range(num_draws):
    for test in masks:
      picked = np.zeros(test.shape, bool)
      picked[rng.permutation(np.flatnonzero(~test))[:num_labels]] = True
      folds.append(np.where(test, 0, 1).astype(np.int8))  # per_rep 1: fold 0 is the test part
      chosen.append(picked)
  return Splits(np.stack(folds), 1, len(folds)), np.stack(chosen)


def method(
  name: str, score: str, n_bins: int, num_labels: int, prior_strength: float | None = None
) -> protocol.Method:
  """The ``protocol.Method`` of a recalibration fitted on ``num_labels`` new examples
  (its clean fit at 0); temperature is fitted on the log-probabilities, binned by
  ``score``."""
  if name not in RECALIBRATIONS:
    raise ValueError(f"recalibration: expected one of {', '.join(RECALIBRATIONS)}, got {name!r}")
  estimator = {"bins_refit": "bins", "bins_from_clean": "bins"}.get(name, name)
  options = {"n_bins": n_bins} if estimator == "bins" else {}
  if name == "bins_refit" and num_labels:
    options = {"n_bins": "cv"}  # the count that fits m examples, chosen on them
  chosen = protocol.method(estimator, score, options)
  if name == "bins_from_clean" and num_labels:
    return chosen._replace(update=functools.partial(update_bins, prior_strength=prior_strength))
  return chosen


def recalibrate(
  clean: protocol.Inputs,
  sets: Mapping[Hashable, protocol.Inputs] | Sequence[protocol.Inputs],
  splits: Splits,
  *,
  scores: Sequence[str],
  log_probs_score: str,
  num_labels: Sequence[int] = (0, 25, 50, 100, 200, 500),
  num_draws: int = 2,
  seed: int = 0,
  n_bins: int = 20,
  prior_strength: float | None = None,
  k: int = 1,
) -> list[Recalibrated]:
  """Every recalibration of ``RECALIBRATIONS`` on every set, after m labelled examples.

  Args:
    clean: the N labelled clean examples (the clean fits, and the bins that score).
    sets: the same N examples shifted, labelled (include ``clean`` for its rows); each
      is refitted on m of its own examples per split and draw.
    splits: ``crossval.make_splits(N, ...)``.
    scores: the scores the bins and isotonic are fitted on (temperature once, binned
      by ``log_probs_score``).
    num_labels: the values of m, each 0 (the clean fits) or in [``MIN_LABELS``, the
      smallest calibration part].
    num_draws: draws of the m examples per split.
    seed: the draws' seed.
    n_bins: the bins that score every fit (and the clean bins' count).
    prior_strength: ``bins_from_clean``'s s, or None (chosen per fit).
    k: the event "the true label is among the k top classes".

  Returns:
    One ``Recalibrated`` per (m, method, set): m in order, then methods, then sets.
  """
  smallest = min(int(np.count_nonzero(~splits.test_mask(f))) for f in range(splits.num_splits))
  num_labels = checked_num_labels(num_labels, smallest)
  if prior_strength is not None and (
    isinstance(prior_strength, bool)
    or not isinstance(prior_strength, (int, float))
    or not prior_strength > 0
  ):
    raise ValueError(f"prior_strength: expected a number > 0 or None, got {prior_strength!r}")
  names = [("temperature", log_probs_score)]
  names += [(name, score) for score in scores for name in RECALIBRATIONS if name != "temperature"]
  out = []
  for m in num_labels:
    chosen = [method(name, score, n_bins, m, prior_strength) for name, score in names]
    # At m = 0 both bins are the clean bins: each distinct method is evaluated once.
    distinct = list(dict.fromkeys(_key(c) for c in chosen))
    methods_ = [chosen[[_key(c) for c in chosen].index(key)] for key in distinct]
    draws, refit_on = (splits, None) if not m else label_draws(splits, m, num_draws, seed)
    found = protocol.evaluate(
      clean, draws, methods_, test_sets=sets, n_bins=n_bins, k=k, refit_on=refit_on
    )
    per_set = len(found) // len(methods_)
    for (name, score), c in zip(names, chosen, strict=True):
      first = distinct.index(_key(c)) * per_set
      for result in found[first : first + per_set]:
        out.append(Recalibrated(name, score, result.test_set, m, result.metrics))
  return out


def checked_num_labels(num_labels, smallest: int) -> tuple[int, ...]:
  """``num_labels`` as a tuple of m, each 0 or in [10, ``smallest``] (a one-line
  ValueError naming the first that is not)."""
  if isinstance(num_labels, (str, bytes)) or not isinstance(num_labels, Sequence) or not num_labels:
    raise ValueError(f"num_labels: expected a non-empty sequence of integers, got {num_labels!r}")
  for m in num_labels:
    m = validation.positive_int("num_labels", m, minimum=0)
    if m > smallest:
      raise ValueError(
        f"num_labels: {m} labelled examples exceed the smallest calibration part "
        f"({smallest} examples); choose at most {smallest}"
      )
    if 0 < m < MIN_LABELS:
      raise ValueError(
        f"num_labels: expected 0 or at least {MIN_LABELS} labelled examples (the bins' "
        f"count is cross-validated on them), got {m}"
      )
  return tuple(int(m) for m in num_labels)


def _key(chosen: protocol.Method) -> tuple:
  return (chosen.estimator, chosen.score, tuple(chosen.options.items()), chosen.update is None)
