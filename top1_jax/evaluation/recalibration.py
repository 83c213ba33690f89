"""Recalibration with a few labels from shifted data: refits, and the bins updated from clean.

``recalibrate`` fits each method on m labelled examples of a shifted set's calibration part
and scores its test part in the clean bins of U. ``bins_from_clean`` updates each clean bin,
a prior worth s pseudo-counts: ``(s p_b + h_b) / (s + n_b)``.
"""

import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, validation
from top1_jax.core.splits import CrossValidation, Splits
from top1_jax.estimators import base
from top1_jax.evaluation import protocol

RECALIBRATIONS = ("bins_refit", "bins_from_clean", "temperature", "isotonic")
"""The methods ``recalibrate`` compares, in the tables' order."""

MIN_LABELS = 10
"""The fewest labelled examples a refit takes (the bins' count is cross-validated on them)."""

PRIOR_STRENGTHS = (*(2.0**e for e in range(-2, 11)), np.inf)
"""The grid of prior strengths s (pseudo-counts) ``choose_prior_strength`` searches:
1/4 to 1024, and infinity (the clean bins unchanged)."""


class Recalibrated(NamedTuple):
  """One method's ``CrossValidation`` of ``METRICS`` (over the splits and draws, at
  ``n_bins``) on one set, each fit having seen ``num_labels`` of its examples (0: clean only)."""

  recalibration: str
  score: str
  test_set: Hashable
  num_labels: int
  metrics: CrossValidation


def choose_prior_strength(
  prob: ArrayLike, counts: ArrayLike, hits: ArrayLike, grid: Sequence[float] = PRIOR_STRENGTHS
) -> np.ndarray:
  """[...] float64: the prior strength s of ``grid`` under which the new examples are
  likeliest, each predicted from the others (leave-one-out, in closed form per bin).

  ``prob`` [..., B] are the clean bins' probabilities; ``counts``, ``hits`` [..., B] the new
  examples and correct ones per bin. Ties go to the stronger prior.
  """
  grid = np.asarray(grid, np.float64)
  prob, counts, hits = (np.asarray(x, np.float64)[..., None, :] for x in (prob, counts, hits))
  finite = np.isfinite(grid)[:, None]
  s_ = np.where(finite, grid[:, None], 0.0)
  # Left out: a correct example (hits - 1) or a wrong one; s = inf keeps the clean prob.
  denominator = np.maximum(s_ + counts - 1, 1e-300)
  if_correct = np.where(finite, (s_ * prob + hits - 1) / denominator, prob)
  if_wrong = np.where(finite, (s_ * prob + hits) / denominator, prob)
  tiny = 1e-12  # a clean prob of 0 or 1 (all wrong or all right) stays finite
  log_right, log_wrong = (np.log(np.clip(x, tiny, 1)) for x in (if_correct, 1 - if_wrong))
  terms = hits * log_right + (counts - hits) * log_wrong
  likelihood = np.where(counts > 0, terms, 0.0).sum(-1)  # [..., G]
  # argmax takes the first of equal maxima: over the grid reversed, the strongest prior.
  order = np.argsort(-grid, kind="stable")
  return grid[order][np.argmax(likelihood[..., order], axis=-1)]


class BinUpdate(NamedTuple):
  """New labelled examples counted in clean bins ([B] int64 ``counts`` and ``hits``), and the
  prior strength s they came in with (``inf``: the clean bins unchanged)."""

  counts: np.ndarray
  hits: np.ndarray
  prior_strength: float


def bin_update(
  bins: binning.Bins, evidence: base.Evidence, prior_strength: float | None = None
) -> BinUpdate:
  """The ``BinUpdate`` of new examples in clean ``bins`` (``prior_strength`` None: chosen)."""
  index = np.asarray(binning.assign(np.asarray(bins.edges), np.asarray(evidence.u)))
  n_bins = bins.counts.shape[-1]
  counts = np.bincount(index, minlength=n_bins)
  hits = np.bincount(index, np.asarray(evidence.correct, np.float64), n_bins).astype(np.int64)
  if prior_strength is None:
    prior_strength = choose_prior_strength(np.asarray(bins.prob, np.float64), counts, hits)
  return BinUpdate(counts, hits, float(prior_strength))


def applied(bins: binning.Bins, update: BinUpdate) -> binning.Bins:
  """The clean ``bins``, each probability ``(s p_b + h_b) / (s + n_b)`` (``p_b`` for s = inf)."""
  prob, counts, hits = (np.asarray(x, np.float64) for x in (bins.prob, update.counts, update.hits))
  s = np.asarray(update.prior_strength, np.float64)[..., None]
  finite = np.isfinite(s)
  s_ = np.where(finite, s, 1.0)
  new = np.where(finite, (s_ * prob + hits) / (s_ + counts), prob)
  return bins._replace(prob=new.astype(np.float32))


def update_bins(
  bins: binning.Bins, evidence: base.Evidence, prior_strength: float | None = None
) -> binning.Bins:
  """The clean bins updated by new labelled examples (``bins_from_clean``'s ``update``),
  with prior strength ``prior_strength`` (None: chosen on them)."""
  return applied(bins, bin_update(bins, evidence, prior_strength))


def update_interval(update: BinUpdate, bins: binning.Bins, evidence: base.Evidence, delta: float):
  """(lower, upper) [N] float32: each example's 1 - delta equal-tailed interval of its
  updated bin's probability, the Beta(s p_b + h_b, s (1 - p_b) + n_b - h_b) posterior
  (s infinite: the clean bins' exact interval)."""
  index = np.asarray(binning.assign(np.asarray(bins.edges), np.asarray(evidence.u)))
  if not np.isfinite(update.prior_strength):
    lower, upper = binning.clopper_pearson(bins.hits, bins.counts, delta)
  else:
    from scipy import special  # a slow import few runs need

    prob = np.asarray(bins.prob, np.float64)  # the clean bins' (the prior's) probabilities
    s = update.prior_strength
    tiny = np.finfo(np.float64).tiny
    a = np.maximum(s * prob + update.hits, tiny)
    b = np.maximum(s * (1 - prob) + update.counts - update.hits, tiny)
    lower, upper = (special.betaincinv(a, b, q) for q in (delta / 2, 1 - delta / 2))
  return (np.asarray(x, np.float32)[index] for x in (lower, upper))


def label_draws(
  splits: Splits, num_labels: int, num_draws: int, seed: int = 0
) -> tuple[Splits, np.ndarray]:
  """Each split once per draw, with ``num_labels`` examples drawn from its calibration part.

  Returns (``Splits`` of D * F splits, [D * F, N] bool: each split's m examples); draw d of
  split f is split ``d * F + f``. The draws are nested in m; where m is every split's whole
  part, D is 1.
  """
  protocol.check_splits(splits)
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
  """The ``protocol.Method`` of recalibration ``name`` fitted on ``num_labels`` new examples."""
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
    sets: the same N examples as ``clean``, shifted and labelled (include ``clean`` for
      its rows).
    scores: the scores the bins and isotonic are fitted on (temperature is binned by
      ``log_probs_score``).
    num_labels: the values of m, each 0 (the clean fits) or in [``MIN_LABELS``, the
      smallest calibration part]; ``num_draws`` draws of them per split.
    n_bins: the bins that score every fit (and the clean bins' count).
    prior_strength: ``bins_from_clean``'s s, or None (chosen per fit).

  Returns:
    One ``Recalibrated`` per (m, method, set), in that order.
  """
  protocol.check_splits(splits)
  smallest = min(int(np.count_nonzero(~splits.test_mask(f))) for f in range(splits.num_splits))
  num_labels = checked_num_labels(num_labels, smallest)
  number = isinstance(prior_strength, (int, float)) and not isinstance(prior_strength, bool)
  if prior_strength is not None and not (number and prior_strength > 0):
    raise ValueError(f"prior_strength: expected a number > 0 or None, got {prior_strength!r}")
  names = [("temperature", log_probs_score)]
  names += [(name, score) for score in scores for name in RECALIBRATIONS if name != "temperature"]
  out = []
  for m in num_labels:
    chosen = [method(name, score, n_bins, m, prior_strength) for name, score in names]
    # At m = 0 both bins are the clean bins: each distinct method is evaluated once.
    keys = [(c.estimator, c.score, tuple(c.options.items()), c.update is None) for c in chosen]
    distinct = list(dict.fromkeys(keys))
    methods_ = [chosen[keys.index(key)] for key in distinct]
    draws, refit_on = (splits, None) if not m else label_draws(splits, m, num_draws, seed)
    found = protocol.evaluate(
      clean, draws, methods_, test_sets=sets, n_bins=n_bins, k=k, refit_on=refit_on
    )
    per_set = len(found) // len(methods_)
    for (name, score), key in zip(names, keys, strict=True):
      first = distinct.index(key) * per_set
      for result in found[first : first + per_set]:
        out.append(Recalibrated(name, score, result.test_set, m, result.metrics))
  return out


def checked_num_labels(num_labels, smallest: int) -> tuple[int, ...]:
  """``num_labels`` as a tuple of m, each 0 or in [``MIN_LABELS``, ``smallest``]."""
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
