"""Selective prediction: answer only where the bins guarantee an accuracy.

From fitted equal-count bins (``binning.fit`` on a calibration split),
``guaranteed_coverage`` keeps the largest set of most-confident bins whose pooled
accuracy has an exact lower confidence bound of at least a target, following
Geifman & El-Yaniv's selection with guaranteed risk (SGR, "Selective
classification for deep neural networks", NeurIPS 2017, Algorithm 1), with the
bins as the candidate thresholds. ``select`` applies the selection to new scores;
``risk_coverage`` gives the empirical risk-coverage curve of a score.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax import binning, metrics, validation

ORDERS = ("prob", "ascending", "descending")


class Selection(NamedTuple):
  """The bins kept by ``guaranteed_coverage`` (a pytree of jax arrays).

  Attributes:
    selected: [n_bins] bool, the bins whose examples are answered.
    edges: [n_bins - 1] float, the bins' edges (``Bins.edges``), for ``select``.
    coverage: [] float, the fraction of the calibration examples selected.
    threshold: [] float, the smallest predicted P(correct) among the selected
      bins (+inf when none is selected).
    accuracy: [] float, the pooled calibration accuracy of the selected bins
      (NaN when none is selected).
    guaranteed_accuracy: [] float, its one-sided Clopper–Pearson lower bound at
      level delta / num_tests (NaN when none is selected).
    num_tests: [] int32, the number of bounds the binary search may test.
  """

  selected: jax.Array
  edges: jax.Array
  coverage: jax.Array
  threshold: jax.Array
  accuracy: jax.Array
  guaranteed_accuracy: jax.Array
  num_tests: jax.Array


class RiskCoverage(NamedTuple):
  """The risk-coverage curve: [N] coverage n / N and [N] risk among the n most confident."""

  coverage: jax.Array
  risk: jax.Array


def _candidate_order(bins: binning.Bins, order: str) -> np.ndarray:
  """Indices of the non-empty bins, most confident first (ties: lower bin index first)."""
  nonempty = np.flatnonzero(np.asarray(bins.counts) > 0)
  if order == "prob":
    return nonempty[np.argsort(-np.asarray(bins.prob)[nonempty], kind="stable")]
  return nonempty if order == "ascending" else nonempty[::-1]


def _largest_passing_prefix(passes: np.ndarray) -> int:
  """SGR's binary search for the largest j in [0, m] with ``passes[j - 1]`` (j = 0 passes)."""
  low, high = 0, passes.shape[0] + 1  # low passes; high stands for "fails"
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if passes[mid - 1] else (low, mid)
  return low


def guaranteed_coverage(
  bins: binning.Bins,
  target_accuracy: float = 0.99,
  delta: float = 0.05,
  *,
  order: str = "ascending",
) -> Selection:
  """The largest set of most-confident bins whose accuracy is guaranteed >= a target.

  The m non-empty bins are ranked, most confident first (``order``); the
  candidates are the m prefixes of that ranking (the top j bins, j = 1..m). A
  prefix passes when the one-sided Clopper–Pearson lower bound of its pooled
  accuracy (pooled hits over pooled counts) is at least ``target_accuracy``. As in
  SGR, a binary search over j (assuming passes are monotone in j) tests at most
  k = ceil(log2(m + 1)) prefixes, and each bound is taken at level delta / k
  (Bonferroni over the tested thresholds), so with probability >= 1 - delta every
  tested bound holds together, the returned one included: the true accuracy of
  the selected region is >= ``guaranteed_accuracy`` >= the target. When no tested
  prefix passes the selection is empty.

  The guarantee assumes ``bins`` counts calibration examples drawn i.i.d. from
  the deployment distribution and a ranking that does not look at their hits.
  The default ranks by the score (bin 0, the lowest scores, first: U is an
  uncertainty); the edges are order statistics of the same data, which is
  harmless when accuracy does not increase with U (a prefix's pooled hits are
  then stochastically below a binomial at the region's accuracy). Ranking by
  ``"prob"``, the bins' own calibrated P(correct), picks the luckiest bins first
  and voids the bound where true accuracy is flat across bins (with 100 bins at
  a true 0.988 it "guarantees" 0.99 in every draw, tests/test_selective.py): use
  it only when ``bins.prob`` comes from other data than the counts and hits, e.g.
  ``binning.refit(bins, u_other, correct_other)._replace(prob=bins.prob)``.

  Args:
    bins: from ``binning.fit`` on the calibration split.
    target_accuracy: the accuracy to guarantee, in [0, 1].
    delta: total failure probability in (0, 0.5).
    order: "ascending" (low scores are confident, e.g. U = -log pmax),
      "descending" (high scores are confident, e.g. pmax) or "prob" (by
      ``bins.prob``, ties by bin index; see above).

  Returns:
    ``Selection``.
  """
  validation.instance("bins", bins, binning.Bins, "binning.Bins from binning.fit")
  validation.in_range("target_accuracy", float(target_accuracy), 0.0, 1.0)
  if not 0.0 < float(delta) < 0.5:
    raise ValueError(f"delta: expected a probability in (0, 0.5), got {delta!r}")
  if order not in ORDERS:
    raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
  ranked = _candidate_order(bins, order)
  if ranked.shape[0] == 0:
    raise ValueError("bins: no examples were counted")
  num_tests = math.ceil(math.log2(ranked.shape[0] + 1))
  pooled_counts = np.cumsum(np.asarray(bins.counts)[ranked])
  pooled_hits = np.cumsum(np.asarray(bins.hits)[ranked])
  # A two-sided interval at 2 delta' has the one-sided lower bound at delta'.
  lower, _ = binning.clopper_pearson(pooled_hits, pooled_counts, 2 * float(delta) / num_tests)
  lower = np.asarray(lower)
  size = _largest_passing_prefix(lower >= target_accuracy)
  selected = np.zeros(bins.n_bins, bool)
  selected[ranked[:size]] = True
  total = pooled_counts[-1]
  if size:
    threshold = np.min(np.asarray(bins.prob)[ranked[:size]])
    kept, hits, bound = pooled_counts[size - 1], pooled_hits[size - 1], lower[size - 1]
    accuracy = hits / kept
  else:
    threshold, kept, accuracy, bound = np.inf, 0, np.nan, np.nan
  return Selection(
    selected=jnp.asarray(selected),
    edges=bins.edges,
    coverage=jnp.float32(kept / total),
    threshold=jnp.float32(threshold),
    accuracy=jnp.float32(accuracy),
    guaranteed_accuracy=jnp.float32(bound),
    num_tests=jnp.int32(num_tests),
  )


@jax.jit
def _select(selected: jax.Array, edges: jax.Array, u: jax.Array) -> jax.Array:
  return selected[binning.assign(edges, u)]


def select(selection: Selection, u: ArrayLike) -> jax.Array:
  """Which new examples to answer: those whose score falls in a selected bin.

  Args:
    selection: from ``guaranteed_coverage``.
    u: [N] float scores of the same kind as the calibration scores.

  Returns:
    [N] bool.
  """
  validation.instance("selection", selection, Selection, "selective.Selection")
  u = validation.float_array("u", u, 1)
  return _select(selection.selected, selection.edges, u)


def risk_coverage(u: ArrayLike, correct: ArrayLike) -> RiskCoverage:
  """The empirical risk-coverage curve of an uncertainty score (low = confident).

  Entry n - 1 is the error rate among the n examples with the lowest ``u``; ties
  are averaged over every order of the tied examples (``metrics.selective_risk``),
  so ``mean(risk) == metrics.aurc(-u, correct)``.

  Args:
    u: [N] float uncertainty scores.
    correct: [N] bool.

  Returns:
    ``RiskCoverage`` of two [N] float arrays.
  """
  u, correct = validation.score_and_event("u", u, correct)
  num = u.shape[0]
  coverage = jnp.arange(1, num + 1, dtype=jnp.float32) / num
  return RiskCoverage(coverage, metrics.selective_risk(-u, correct))
