"""Equal-count (quantile) bins of an uncertainty score and their Top-k accuracy.

A fitted ``Bins`` maps a score value to a bin and each bin to a calibrated
probability that the prediction is correct (paper §3, §5.1):

* Interior edges are quantiles of the calibration scores: with M calibration
  points sorted ascending, edge i (i = 1..n-1) is the score of the
  ``floor(i M / n)``-th point, so each bin holds M/n points up to rounding.
* Bins are right-closed: a score u falls in bin ``#{edges < u}``, i.e. bin i is
  ``(e_i, e_{i+1}]``; scores beyond the calibration range go to the end bins.
* Ties in the score make equal edges. Equal edges are merged, so no bin is empty
  by construction; the unused slots at the end (edges = +inf) hold no data and
  ``num_effective_bins`` counts the bins that received calibration points.
* Probabilities carry a one-pseudo-count prior at the calibration accuracy
  p_A: ``p = (hits + p_A) / (count + 1)``, so an empty bin predicts p_A and no
  bin predicts exactly 0 or 1.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax import validation


class Bins(NamedTuple):
  """Fitted bins (a pytree; every field has a static shape for a given n_bins).

  Attributes:
    edges: [n_bins - 1] float, ascending unique interior edges, padded with +inf.
    counts: [n_bins] int32, examples per bin.
    hits: [n_bins] int32, correct examples per bin.
    prob: [n_bins] float, (hits + prior) / (counts + 1).
    prior: [] float, the accuracy of the data the bins were counted on.
    num_effective_bins: [] int32, bins with at least one example.
  """

  edges: jax.Array
  counts: jax.Array
  hits: jax.Array
  prob: jax.Array
  prior: jax.Array
  num_effective_bins: jax.Array

  @property
  def n_bins(self) -> int:
    return self.counts.shape[-1]

  @property
  def accuracy(self) -> jax.Array:
    """[n_bins] empirical accuracy hits / counts without the prior (NaN if empty)."""
    return self.hits / self.counts


def _check_scores(u: ArrayLike, correct: ArrayLike) -> tuple[jax.Array, jax.Array]:
  return validation.score_and_event("u", u, correct)


def assign(edges: ArrayLike, u: ArrayLike) -> jax.Array:
  """The bin of each score: how many edges lie strictly below it (right-closed bins).

  The one bin-assignment rule: ``predict``, ``refit``, the mislabelled finder and
  the launchers use it. Unchecked (works under ``jit``).

  Args:
    edges: [n_bins - 1] ascending interior edges (``Bins.edges``).
    u: [N] scores.

  Returns:
    [N] int32 in [0, n_bins).
  """
  return jnp.searchsorted(edges, u, side="left").astype(jnp.int32)


def calibrated_prob(hits, counts, prior):
  """The bins' probability with a one-pseudo-count prior: (hits + prior) / (counts + 1).

  The one place the paper's prior is written. Works on arrays of any shape
  (broadcasting) and on exact ``fractions.Fraction`` values alike.
  """
  return (hits + prior) / (counts + 1)


def _count(edges: jax.Array, u: jax.Array, correct: jax.Array, prior=None) -> Bins:
  n_bins = edges.shape[0] + 1
  index = assign(edges, u)
  counts = jax.ops.segment_sum(jnp.ones_like(index), index, n_bins)
  hits = jax.ops.segment_sum(correct.astype(jnp.int32), index, n_bins)
  if prior is None:
    prior = jnp.mean(correct.astype(jnp.float32))
  prob = calibrated_prob(hits, counts, prior)
  return Bins(edges, counts, hits, prob, prior, jnp.sum(counts > 0).astype(jnp.int32))


def quantile_edge_ranks(num_points, n_bins: int) -> np.ndarray:
  """1-based ranks of the calibration points whose scores are the interior edges.

  The one quantile rule (paper §5.1). NumPy int64, so ``M * i`` cannot overflow
  for any realistic M; a static shape, so it serves jitted code too.

  Args:
    num_points: M, int or int array [...] (vectorises over folds).
    n_bins: number of bins n.

  Returns:
    [..., n_bins - 1] int64: floor(i M / n) for i = 1..n-1.
  """
  i = np.arange(1, n_bins, dtype=np.int64)
  return (np.asarray(num_points, np.int64)[..., None] * i) // n_bins


@functools.partial(jax.jit, static_argnames=("n_bins",))
def _fit(u: jax.Array, correct: jax.Array, n_bins: int) -> Bins:
  sorted_u = jnp.sort(u)
  ranks = quantile_edge_ranks(u.shape[0], n_bins)
  raw_edges = sorted_u[ranks - 1]
  edges = jnp.unique(raw_edges, size=n_bins - 1, fill_value=jnp.inf)
  return _count(edges, u, correct)


def fit(u: ArrayLike, correct: ArrayLike, n_bins: int = 20) -> Bins:
  """Fits equal-count bins of ``u`` and their accuracy on a calibration split.

  Args:
    u: [N] float scores.
    correct: [N] bool, whether each prediction is correct (see ``events``).
    n_bins: 1 <= n_bins <= N.

  Returns:
    ``Bins`` with probabilities regularised towards the calibration accuracy.
  """
  u, correct = _check_scores(u, correct)
  n_bins = validation.positive_int("n_bins", n_bins, maximum=u.shape[0])
  return _fit(u, correct, n_bins)


@jax.jit
def _predict(bins: Bins, u: jax.Array) -> jax.Array:
  return bins.prob[assign(bins.edges, u)]


def predict(bins: Bins, u: ArrayLike) -> jax.Array:
  """Calibrated P(correct) for new scores: the probability of each score's bin.

  Args:
    bins: from ``fit``.
    u: [N] float scores of the same kind as the calibration scores.

  Returns:
    [N] float in (0, 1).
  """
  return _predict(bins, validation.float_array("u", u, 1))


@jax.jit
def _refit(bins: Bins, u: jax.Array, correct: jax.Array) -> Bins:
  return _count(bins.edges, u, correct)


def refit(bins: Bins, u: ArrayLike, correct: ArrayLike) -> Bins:
  """Counts new data in the same bins (e.g. the test split for ECE).

  Args:
    bins: fitted bins whose edges are kept.
    u: [N] float scores.
    correct: [N] bool.

  Returns:
    ``Bins`` with the same edges and counts, hits and prior from the new data.
  """
  u, correct = _check_scores(u, correct)
  return _refit(bins, u, correct)


def hoeffding_halfwidth(count: ArrayLike, delta: float = 0.05) -> jax.Array:
  """Half-width of the Hoeffding interval for a bin's accuracy (paper eq. 3).

  With probability >= 1 - delta, |p_true - p_empirical| <= sqrt(log(2/delta) / (2 count)).

  Args:
    count: int array, examples per bin (0 gives +inf).
    delta: failure probability in (0, 1).

  Returns:
    float array shaped like ``count``.
  """
  if not 0.0 < float(delta) < 1.0:
    raise ValueError(f"delta: expected a probability in (0, 1), got {delta}")
  count = jnp.asarray(count, jnp.float32)
  return jnp.sqrt(jnp.log(2.0 / delta) / (2.0 * count))


def _beta_quantile(q: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
  """Inverse regularised incomplete beta by bisection (monotone, 60 halvings)."""

  def halve(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    below = jax.scipy.special.betainc(a, b, mid) < q
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

  lo, hi = jax.lax.fori_loop(0, 60, halve, (jnp.zeros_like(q), jnp.ones_like(q)))
  return 0.5 * (lo + hi)


@jax.jit
def _clopper_pearson(hits: jax.Array, count: jax.Array, delta: jax.Array):
  hits = hits.astype(jnp.float32)
  count = count.astype(jnp.float32)
  shape = jnp.broadcast_shapes(hits.shape, count.shape)
  half = jnp.full(shape, delta / 2)
  # Beta parameters must be positive; the edge cases are fixed up below.
  lower = _beta_quantile(half, jnp.maximum(hits, 1.0), jnp.maximum(count - hits + 1, 1.0))
  upper = _beta_quantile(1 - half, jnp.maximum(hits + 1, 1.0), jnp.maximum(count - hits, 1.0))
  lower = jnp.where(hits == 0, 0.0, lower)
  upper = jnp.where(hits == count, 1.0, upper)
  empty = count == 0
  return jnp.where(empty, 0.0, lower), jnp.where(empty, 1.0, upper)


def clopper_pearson(
  hits: ArrayLike, count: ArrayLike, delta: float = 0.05
) -> tuple[jax.Array, jax.Array]:
  """Exact (Clopper–Pearson) two-sided 1 - delta interval for a bin's accuracy.

  Args:
    hits: int array, correct examples per bin.
    count: int array (broadcastable with hits), examples per bin; 0 gives [0, 1].
    delta: failure probability in (0, 1).

  Returns:
    (lower, upper) float arrays.
  """
  if not 0.0 < float(delta) < 1.0:
    raise ValueError(f"delta: expected a probability in (0, 1), got {delta}")
  hits = validation.as_array("hits", hits, (0, 1, 2))
  count = validation.as_array("count", count, (0, 1, 2))
  if not validation.is_traced(hits) and not validation.is_traced(count):
    if bool(jnp.any(hits < 0)) or bool(jnp.any(hits > count)):
      raise ValueError("hits: expected 0 <= hits <= count in every bin")
  return _clopper_pearson(hits, count, jnp.float32(delta))


def confidence_bounds(
  bins: Bins, delta: float = 0.05, method: str = "clopper_pearson"
) -> tuple[jax.Array, jax.Array]:
  """Per-bin 1 - delta interval for the true accuracy, around hits / counts.

  Args:
    bins: fitted (or refitted) bins.
    delta: failure probability in (0, 1).
    method: "clopper_pearson" (exact) or "hoeffding" (paper eq. 3).

  Returns:
    (lower, upper), each [n_bins] float in [0, 1]; empty bins give [0, 1].
  """
  if method == "clopper_pearson":
    return clopper_pearson(bins.hits, bins.counts, delta)
  if method == "hoeffding":
    width = hoeffding_halfwidth(bins.counts, delta)
    centre = jnp.where(bins.counts > 0, bins.hits / jnp.maximum(bins.counts, 1), 0.5)
    return jnp.clip(centre - width, 0.0, 1.0), jnp.clip(centre + width, 0.0, 1.0)
  raise ValueError(f"method: expected 'clopper_pearson' or 'hoeffding', got {method!r}")
