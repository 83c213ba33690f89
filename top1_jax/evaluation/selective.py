"""Selective prediction: answer only where the bins guarantee an accuracy.

``guaranteed_coverage`` is Geifman & El-Yaniv's selection with guaranteed risk (SGR,
NeurIPS 2017, Algorithm 1) with fitted equal-count bins as the candidate thresholds.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, metrics, validation
from top1_jax.evaluation import crossval, protocol

SELECTION_ORDERS = ("prob", "ascending", "descending")


class Selection(NamedTuple):
  """The bins kept by ``guaranteed_coverage`` (a pytree of jax arrays).

  Attributes:
    selected: [n_bins] bool, the bins whose examples are answered.
    edges: [n_bins - 1] float, the bins' edges, for ``select``.
    coverage: [] float, the fraction of the calibration examples selected.
    threshold: [] float, the smallest P(correct) of the selected bins (+inf if none).
    accuracy: [] float, their pooled calibration accuracy (NaN if none).
    guaranteed_accuracy: [] float, its one-sided Clopper–Pearson lower bound at
      level delta / num_tests (NaN if none).
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


def _check_target(name: str, target) -> float:
  # A lower confidence bound from finite counts is below 1: 1 could pass by rounding only.
  try:
    target = float(target)
  except (TypeError, ValueError):
    raise ValueError(f"{name}: expected an accuracy in [0, 1), got {target!r}") from None
  if not 0.0 <= target < 1.0:
    raise ValueError(
      f"{name}: expected an accuracy in [0, 1), got {target:g}; no finite calibration"
      " set can guarantee 1 (its lower confidence bound is below 1)"
    )
  return target


def _check_delta_and_order(delta, order: str) -> None:
  if not 0.0 < float(delta) < 0.5:
    raise ValueError(f"delta: expected a probability in (0, 0.5), got {delta!r}")
  if order not in SELECTION_ORDERS:
    raise ValueError(f"order: expected one of {SELECTION_ORDERS}, got {order!r}")


def guaranteed_coverage(
  bins: binning.Bins,
  target_accuracy: float = 0.99,
  delta: float = 0.05,
  *,
  order: str = "ascending",
) -> Selection:
  """The largest set of most-confident bins whose accuracy is guaranteed >= a target.

  The candidates are the prefixes of the m non-empty bins ranked by ``order``; a binary
  search tests at most k = ceil(log2(m + 1)) of them, each by a one-sided Clopper–Pearson
  bound of its pooled accuracy at level delta / k (Bonferroni), so with probability
  >= 1 - delta the selection's true accuracy is >= ``guaranteed_accuracy`` >= the target.

  The guarantee assumes i.i.d. calibration examples and a ranking that does not look at
  their hits. ``"prob"`` ranks by ``bins.prob``, fitted on those same hits: it picks the
  luckiest bins and voids the bound unless ``bins.prob`` comes from other data, e.g.
  ``binning.refit(bins, u_other, correct_other)._replace(prob=bins.prob)``.

  Args:
    bins: from ``binning.fit`` on the calibration split.
    target_accuracy: in [0, 1) (no finite calibration set can guarantee 1).
    delta: total failure probability in (0, 0.5).
    order: "ascending" (low scores are confident, e.g. -log pmax), "descending" or "prob".
  """
  binning.checked_bins(bins)
  target_accuracy = _check_target("target_accuracy", target_accuracy)
  _check_delta_and_order(delta, order)
  # The non-empty bins, most confident first (ties: lower bin index first).
  ranked = np.flatnonzero(np.asarray(bins.counts) > 0)
  if order == "prob":
    ranked = ranked[np.argsort(-np.asarray(bins.prob)[ranked], kind="stable")]
  elif order == "descending":
    ranked = ranked[::-1]
  if ranked.shape[0] == 0:
    raise ValueError("bins: no examples were counted")
  num_tests = math.ceil(math.log2(ranked.shape[0] + 1))
  pooled_counts, pooled_hits = (np.cumsum(np.asarray(x)[ranked]) for x in (bins.counts, bins.hits))
  # A two-sided interval at 2 delta' has the one-sided lower bound at delta'.
  lower, _ = binning.clopper_pearson(pooled_hits, pooled_counts, 2 * float(delta) / num_tests)
  lower = np.asarray(lower)
  passes = lower >= target_accuracy
  size, high = 0, passes.shape[0] + 1  # SGR's binary search: size passes, high fails
  while high - size > 1:
    mid = (size + high) // 2
    size, high = (mid, high) if passes[mid - 1] else (size, mid)
  selected = np.zeros(bins.n_bins, bool)
  selected[ranked[:size]] = True
  total = pooled_counts[-1]
  threshold, kept, accuracy, bound = np.inf, 0, np.nan, np.nan
  if size:
    threshold, bound = np.min(np.asarray(bins.prob)[ranked[:size]]), lower[size - 1]
    kept, accuracy = pooled_counts[size - 1], pooled_hits[size - 1] / pooled_counts[size - 1]
  # Host values moved as they are: jnp.float32(x) would compile a conversion program.
  floats = [jax.device_put(np.float32(x)) for x in (kept / total, threshold, accuracy, bound)]
  num_tests = jax.device_put(np.int32(num_tests))
  return Selection(jax.device_put(selected), bins.edges, *floats, num_tests)


@jax.jit
def _select(selected: jax.Array, edges: jax.Array, u: jax.Array) -> jax.Array:
  return selected[binning.assign(edges, u)]


def select(selection: Selection, u: ArrayLike) -> jax.Array:
  """[N] bool: which new examples (scores ``u`` [N]) to answer, those in a selected bin."""
  validation.instance("selection", selection, Selection, "selective.Selection")
  u = validation.float_array("u", u, 1)
  return _select(selection.selected, selection.edges, u)


def _means(per_split: list[dict]) -> dict:
  """Means over splits, each over the splits where it is defined (None if none is)."""
  out = {}
  for key in per_split[0]:
    values = [p[key] for p in per_split if p[key] is not None]
    out[key] = float(np.mean(values)) if values else None
  empty = sum(p["guaranteed_accuracy"] is None for p in per_split)
  return out | {"num_splits": len(per_split), "num_empty": empty}


def validate_over_splits(
  u: ArrayLike,
  correct: ArrayLike,
  splits: crossval.Splits,
  n_bins: int,
  targets: Sequence[float] = (0.9, 0.95, 0.99),
  delta: float = 0.05,
  *,
  order: str = "ascending",
) -> list[dict]:
  """``guaranteed_coverage`` fitted on each calibration part and tested on the rest.

  Args:
    u: [N] float scores (``correct``: [N] bool events).
    n_bins: bins per calibration part, at most its size.
    targets: accuracies to guarantee, each in [0, 1).
    delta: failure probability of each guarantee, in (0, 0.5).
    order: as in ``guaranteed_coverage``.

  Returns:
    One dict per target: the means over splits of ``guaranteed_accuracy``,
    ``calibration_coverage``, ``test_coverage`` and ``test_accuracy`` (over the splits
    that selected something; None if none did), ``num_empty`` (splits that selected
    nothing), ``num_below_target``, the arguments, and ``per_split``.
  """
  u, correct = validation.score_and_event("u", u, correct, host=True)
  protocol.check_splits(splits, u.shape[0], "u")
  for target in targets:
    _check_target("targets", target)
  _check_delta_and_order(delta, order)
  per_target = [[] for _ in targets]
  for split in range(splits.num_splits):
    test = np.asarray(splits.test_mask(split), bool)
    bins = binning.fit(u[~test], correct[~test], n_bins)
    # The test part's bins once per split; each target only picks some of them.
    which = np.asarray(binning.assign(bins.edges, u[test]))
    for outcomes, target in zip(per_target, targets, strict=True):
      selection = guaranteed_coverage(bins, target, delta, order=order)
      chosen = np.asarray(selection.selected)[which]
      bound, kept = float(selection.guaranteed_accuracy), int(chosen.sum())
      outcomes.append(
        {
          "guaranteed_accuracy": bound if np.isfinite(bound) else None,
          "calibration_coverage": float(selection.coverage),
          "test_coverage": kept / chosen.shape[0],
          "test_accuracy": float(correct[test][chosen].mean()) if kept else None,
        }
      )
  return [
    {
      "order": order,
      **_means(per_split),
      "target_accuracy": target,
      "delta": delta,
      "n_bins": n_bins,
      "num_below_target": sum(
        p["test_accuracy"] is not None and p["test_accuracy"] < target for p in per_split
      ),
      "per_split": per_split,
    }
    for target, per_split in zip(targets, per_target, strict=True)
  ]


def risk_coverage(u: ArrayLike, correct: ArrayLike) -> RiskCoverage:
  """The empirical risk-coverage curve of an uncertainty score ``u`` [N] (low = confident).

  Entry n - 1 is the error rate among the n examples with the lowest ``u``, ties averaged
  over every order of the tied examples, so ``mean(risk) == metrics.aurc(-u, correct)``.
  """
  return _risk_coverage(*validation.score_and_event("u", u, correct))


@jax.jit  # one program, where the eager negation, range and division compiled one each
def _risk_coverage(u: jax.Array, correct: jax.Array) -> RiskCoverage:
  coverage = jnp.arange(1, u.shape[0] + 1, dtype=jnp.float32) / u.shape[0]
  return RiskCoverage(coverage, metrics.selective_risk(-u, correct))
