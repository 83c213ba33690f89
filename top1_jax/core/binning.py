"""Equal-count (quantile) bins of an uncertainty score and their Top-k accuracy (§3, §5.1).

Bins are right-closed, ``(e_i, e_{i+1}]``; tied edges merge, leaving +inf slots at the end.
A bin predicts ``(hits + p_A) / (count + 1)``, a pseudo-count at the calibration accuracy p_A.
Scores compare as in XLA: subnormals equal 0 (an edge at zero is stored as +0.0).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.core.accuracy_bounds import clopper_pearson, hoeffding_halfwidth

MAX_BINS = 2**20
"""The most bins taken."""


class Bins(NamedTuple):
  """Fitted bins (a pytree; every field has a static shape for a given n_bins).

  Attributes:
    edges: [n_bins - 1] float, ascending unique interior edges, padded with +inf.
    counts: [n_bins] int32, examples per bin.
    hits: [n_bins] int32, correct examples per bin.
    prob: [n_bins] float32, (hits + prior) / (counts + 1).
    prior: [] float32, float32(total hits) / float32(total count).
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


def _in_host_memory(x) -> bool:
  """Whether ``x`` is host data: NumPy or Python values, or a jax array on CPU devices."""
  if isinstance(x, jax.Array):  # a tracer too: it is not host data
    return not validation.is_traced(x) and all(d.platform == "cpu" for d in x.devices())
  return True


def _runs_on_cpu(x) -> bool:
  """Whether jitted work on ``x`` runs on the CPU (host data goes to the default backend)."""
  return _in_host_memory(x) and (isinstance(x, jax.Array) or jax.default_backend() == "cpu")


def checked_bins(bins, name: str = "bins") -> Bins:
  """``bins`` if ``fit`` or ``refit`` could have made it (values checked when concrete)."""
  validation.instance(name, bins, Bins, "binning.Bins from binning.fit")
  edges = bins.edges
  shape = (jnp.shape(edges)[0] + 1,) if jnp.ndim(edges) == 1 else None
  shapes = [jnp.shape(x) for x in (bins.counts, bins.hits, bins.prob)]
  if shape is None or any(s != shape for s in shapes):
    raise ValueError(
      f"{name}: expected [n_bins - 1] edges and [n_bins] counts, hits and prob, got shapes"
      f" {jnp.shape(edges)} and {', '.join(map(str, shapes))}"
    )
  if any(validation.is_traced(x) for x in bins):
    return bins
  validation.ascending_edges(f"{name}.edges", np.asarray(edges))
  validation.hits_within_counts(name, bins.hits, bins.counts)
  prob = np.asarray(bins.prob).reshape(-1)
  inside = (prob >= 0) & (prob <= 1)  # False for NaN
  if not np.all(inside):
    raise ValueError(
      f"{name}.prob: expected probabilities in [0, 1], got {prob[np.argmin(inside)]}"
    )
  return bins


def _check_scores(u: ArrayLike, correct: ArrayLike):
  # Host data is checked with NumPy: a device round trip would cost more than the check.
  return validation.score_and_event("u", u, correct, host=_in_host_memory(u))


_COMPARE_ALL_MAX_EDGES = 32


def assign(edges: ArrayLike, u: ArrayLike) -> jax.Array | np.ndarray:
  """The one bin rule: the [N] int32 count of ``edges`` strictly below each score.
  NumPy scores are binned by NumPy (to the same indices). Edges are trusted under ``jit``."""
  if not validation.is_traced(edges):
    validation.ascending_edges("edges", np.asarray(edges))
  if isinstance(u, np.ndarray) and not validation.is_traced(edges):
    edges, u = (validation.in_device_dtype(np.asarray(x)) for x in (edges, u))
    return np.searchsorted(edges, u, side="left").astype(np.int32)
  # Comparing with every edge is one fused pass, fastest for a few dozen edges.
  num_edges = jnp.shape(edges)[-1]
  method = "compare_all" if num_edges <= _COMPARE_ALL_MAX_EDGES else "scan_unrolled"
  return jnp.searchsorted(edges, u, side="left", method=method).astype(jnp.int32)


def calibrated_prob(hits, counts, prior):
  """The paper's prior, in one place: (hits + prior) / (counts + 1); arrays or Fractions."""
  if not any(validation.is_traced(x) for x in (hits, counts, prior)):
    validation.hits_within_counts("hits", hits, counts)
    if np.any((np.asarray(prior) < 0) | (np.asarray(prior) > 1)):
      raise ValueError(f"prior: expected an accuracy in [0, 1], got {prior!r:.80}")
  return (hits + prior) / (counts + 1)


def _count_by_outcome(edges: jax.Array, u: jax.Array, correct: jax.Array, num_skipped=0):
  """[n_bins, 2] int32: examples per (bin, correct), leaving out the first ``num_skipped``."""
  n_bins = edges.shape[0] + 1
  # One scatter for both statistics: slot 2 b + c counts bin b's examples with correct == c.
  slots = 2 * assign(edges, u) + correct.astype(jnp.int32)
  weight = (jnp.arange(u.shape[0]) >= num_skipped).astype(jnp.int32)
  return jax.ops.segment_sum(weight, slots, 2 * n_bins).reshape(n_bins, 2)


def _bins(edges: jax.Array, by_outcome: jax.Array) -> Bins:
  hits = by_outcome[:, 1]
  counts = by_outcome[:, 0] + hits
  # From the exact integer totals (a float32 mean is inexact beyond 2**24 examples).
  prior = jnp.sum(hits).astype(jnp.float32) / jnp.sum(counts).astype(jnp.float32)
  prob = calibrated_prob(hits, counts, prior)
  return Bins(edges, counts, hits, prob, prior, jnp.sum(counts > 0).astype(jnp.int32))


@jax.jit
def _count(edges, u, correct, num_skipped=0) -> Bins:
  return _bins(edges, _count_by_outcome(edges, u, correct, num_skipped))


_count_by_outcome_jit = jax.jit(_count_by_outcome)
_bins_jit = jax.jit(_bins)

# Host scores beyond this many are counted and predicted a chunk at a time, in cache.
_CHUNK = 2**20


def _chunks(num: int):
  """(slice, num_skipped) covering [0, num) in pieces of the one compiled shape, _CHUNK;
  the last ends at ``num``, skipping its overlap with the one before."""
  for start in range(0, num, _CHUNK):
    begin = min(start, num - _CHUNK)
    yield slice(begin, begin + _CHUNK), start - begin


# Host scores are padded in front to a power of two (at least this many), the padding
# left out of the counts: a program compiles once per size bucket.
_MIN_BUCKET = 256


def bucket_size(num: int) -> int:
  """The padded length of ``num`` host examples: the next power of two, at least 256."""
  return max(_MIN_BUCKET, 1 << max(num - 1, 0).bit_length())


def _pad_front(values: np.ndarray, size: int) -> np.ndarray:
  return np.concatenate([np.zeros(size - values.shape[0], values.dtype), values])


def _count_host(edges: np.ndarray, u: np.ndarray, correct: np.ndarray) -> Bins:
  num = u.shape[0]
  if num <= _CHUNK:
    size = bucket_size(num)  # at most _CHUNK, a power of two
    return _count(edges, _pad_front(u, size), _pad_front(correct, size), size - num)
  parts = [
    _count_by_outcome_jit(edges, u[piece], correct[piece], skipped)
    for piece, skipped in _chunks(num)
  ]
  return _bins_jit(edges, jnp.sum(jnp.stack(parts), axis=0))


def quantile_edge_ranks(num_points, n_bins: int) -> np.ndarray:
  """The one quantile rule: [..., n_bins - 1] int64 1-based ranks floor(i M / n) of the
  edges, for M = ``num_points`` >= n_bins (an int, or an int array [...] of folds)."""
  n_bins = validation.positive_int("n_bins", n_bins, maximum=MAX_BINS)
  points = np.asarray(num_points)
  if points.dtype.kind not in "iu" or (points.size and points.min() < n_bins):
    got = f"dtype {points.dtype}" if points.dtype.kind not in "iu" else int(points.min())
    raise ValueError(
      f"num_points: expected integers of at least n_bins = {n_bins} (a bin per point at"
      f" most), got {got}"
    )
  return _edge_ranks(points, n_bins)


def _edge_ranks(num_points, n_bins: int) -> np.ndarray:
  """``quantile_edge_ranks`` unchecked (a group of fewer than n_bins points included)."""
  i = np.arange(1, n_bins, dtype=np.int64)
  return (np.asarray(num_points, np.int64)[..., None] * i) // n_bins


def _zeros_as_positive_zero(raw_edges, xp):
  # -0.0 == 0.0, and XLA compares subnormals as zero (it flushes them): which of these
  # "equal" values a selection meets first is arbitrary, so every path stores +0.0.
  return xp.where(xp.abs(raw_edges) < xp.finfo(raw_edges.dtype).tiny, 0, raw_edges)


def _host_edges(u: np.ndarray, n_bins: int) -> np.ndarray:
  """``Bins.edges`` of host scores: the quantile order statistics, ties merged."""
  if n_bins > 2:  # NumPy's many-kth partition is slower than its sort
    return _edges_of_sorted(np.sort(u), np.array([u.shape[0]]), n_bins)[0]
  # At most one order statistic (no ties to merge): a quickselect.
  ranks = _edge_ranks(u.shape[0], n_bins) - 1
  return _zeros_as_positive_zero(np.partition(u, ranks)[ranks] if n_bins == 2 else u[:0], np)


def merged_ties(raw: np.ndarray) -> np.ndarray:
  """[G, E] ascending edges (each row) with each run of ties kept once, +inf padded."""
  first_of_run = np.ones(raw.shape, bool)
  first_of_run[:, 1:] = raw[:, 1:] != raw[:, :-1]
  edges = np.full(raw.shape, np.inf, raw.dtype)
  rows = np.broadcast_to(np.arange(raw.shape[0])[:, None], raw.shape)
  edges[rows[first_of_run], (np.cumsum(first_of_run, axis=1) - 1)[first_of_run]] = raw[first_of_run]
  return edges


@functools.partial(jax.jit, static_argnames=("n_bins",))
def _fit(u: jax.Array, correct: jax.Array, n_bins: int) -> Bins:
  ranks = _edge_ranks(u.shape[0], n_bins) - 1
  raw_edges = _zeros_as_positive_zero(jnp.sort(u)[ranks], jnp)
  edges = jnp.unique(raw_edges, size=n_bins - 1, fill_value=jnp.inf)
  return _count(edges, u, correct)


def _fits_on_host(u, correct, implementation: str | None) -> bool:
  if implementation not in (None, "host", "jit"):
    raise ValueError(f"implementation: expected None, 'host' or 'jit', got {implementation!r}")
  traced = validation.is_traced(u) or validation.is_traced(correct)
  if implementation == "host" and traced:
    raise ValueError("implementation: 'host' needs concrete arrays; under jit use None or 'jit'")
  if implementation is not None:
    return implementation == "host"
  return not traced and _runs_on_cpu(u)


def fit(
  u: ArrayLike, correct: ArrayLike, n_bins: int = 20, *, implementation: str | None = None
) -> Bins:
  """Fits 1 <= ``n_bins`` <= N equal-count bins of ``u: [N]`` and their accuracy.

  ``implementation``: where the edges are selected, with bit-identical results. None: by
  NumPy where the work would run on a CPU, else in one jitted program; "host" or "jit"
  forces one.
  """
  on_host = _fits_on_host(u, correct, implementation)
  u, correct = _check_scores(u, correct)
  n_bins = validation.positive_int("n_bins", n_bins, maximum=min(u.shape[0], MAX_BINS))
  if not on_host:
    return _fit(u, correct, n_bins)
  # The scores as the jitted path sees them, so both select the same order statistics.
  u = validation.in_device_dtype(np.asarray(u))
  return _count_host(_host_edges(u, n_bins), u, np.asarray(correct))


def _edges_of_sorted(ordered: np.ndarray, sizes: np.ndarray, n_bins: int) -> np.ndarray:
  """[G, n_bins - 1] edges of scores sorted by group, then value; ``sizes``: [G] per group."""
  num_groups = sizes.shape[0]
  if not ordered.size or n_bins == 1:
    return np.full((num_groups, n_bins - 1), np.inf, ordered.dtype)
  starts = np.cumsum(sizes) - sizes
  ranks = _edge_ranks(sizes, n_bins) - 1
  raw = ordered[np.clip(starts[:, None] + ranks, 0, ordered.shape[0] - 1)]
  raw = np.where((sizes >= n_bins)[:, None], _zeros_as_positive_zero(raw, np), np.inf)
  return merged_ties(raw)


@functools.partial(jax.jit, static_argnames=("num_groups",))
def _count_groups(edges, u, group, correct, num_skipped, num_groups: int) -> Bins:
  weight = (jnp.arange(u.shape[0]) >= num_skipped).astype(jnp.int32)
  n_bins = edges.shape[-1] + 1
  which = jax.vmap(assign)(edges[group], u)
  slots = 2 * (group * n_bins + which) + correct.astype(jnp.int32)
  by_outcome = jax.ops.segment_sum(weight, slots, 2 * n_bins * num_groups)
  return jax.vmap(_bins)(edges, by_outcome.reshape(num_groups, n_bins, 2))


def fit_groups(
  u: ArrayLike, group: ArrayLike, correct: ArrayLike, n_bins: int, num_groups: int
) -> Bins:
  """``fit`` of each group's examples (``group``: [N] int), from one sort: [G, ...] fields.
  Group g's bins equal ``fit(u[group == g], correct[group == g], n_bins)`` bit for bit;
  a group with fewer than ``n_bins`` examples gets no edges."""
  u, correct = validation.score_and_event("u", u, correct, host=True)
  num_groups = validation.positive_int("num_groups", num_groups)
  group = validation.labels_array("group", group, num_groups, host=True)
  validation.same_length(u=u, group=group)
  n_bins = validation.positive_int("n_bins", n_bins, maximum=MAX_BINS)
  u = validation.in_device_dtype(u)
  order = np.lexsort((u, group))  # by group, then by score
  edges = _edges_of_sorted(u[order], np.bincount(group, minlength=num_groups), n_bins)
  size = bucket_size(u.shape[0])
  padded = [_pad_front(np.asarray(x), size) for x in (u, group, correct)]
  return _count_groups(edges, *padded, size - u.shape[0], num_groups)


def _probability(bins: Bins, u: jax.Array) -> jax.Array:
  return bins.prob[assign(bins.edges, u)]


_predict = jax.jit(_probability)


@functools.partial(jax.jit, donate_argnums=0)
def _predict_into(out: jax.Array, begin, bins: Bins, u: jax.Array) -> jax.Array:
  return jax.lax.dynamic_update_slice(out, _probability(bins, u), (begin,))


def predict(bins: Bins, u: ArrayLike) -> jax.Array:
  """[N] calibrated P(correct) of new scores ``u: [N]``: the probability of each one's bin."""
  on_cpu = _runs_on_cpu(u)
  checked_bins(bins)
  u = validation.float_array("u", u, 1, host=_in_host_memory(u))
  if not on_cpu:
    return _predict(bins, u)
  if u.shape[0] <= _CHUNK:
    size = bucket_size(u.shape[0])
    return _predict(bins, _pad_front(np.asarray(u), size))[size - u.shape[0] :]
  out = jnp.empty(u.shape, bins.prob.dtype)
  for piece, _ in _chunks(u.shape[0]):  # the overlap is written twice, with the same values
    out = _predict_into(out, piece.start, bins, u[piece])
  return out


def refit(bins: Bins, u: ArrayLike, correct: ArrayLike) -> Bins:
  """Counts new data (e.g. the test split, for ECE) in the same edges."""
  checked_bins(bins)
  on_cpu = _runs_on_cpu(u)
  u, correct = _check_scores(u, correct)
  if on_cpu:
    return _count_host(bins.edges, np.asarray(u), np.asarray(correct))
  return _count(bins.edges, u, correct)


def confidence_bounds(
  bins: Bins, delta: float = 0.05, method: str = "clopper_pearson"
) -> tuple[jax.Array, jax.Array]:
  """Per-bin 1 - delta (lower, upper) accuracy interval, "clopper_pearson" or "hoeffding"."""
  validation.instance("bins", bins, Bins, "binning.Bins from binning.fit")
  if method == "clopper_pearson":
    return clopper_pearson(bins.hits, bins.counts, delta)
  if method == "hoeffding":
    width = hoeffding_halfwidth(bins.counts, delta)
    centre = jnp.where(bins.counts > 0, bins.hits / jnp.maximum(bins.counts, 1), 0.5)
    return jnp.clip(centre - width, 0.0, 1.0), jnp.clip(centre + width, 0.0, 1.0)
  raise ValueError(f"method: expected 'clopper_pearson' or 'hoeffding', got {method!r}")
