"""Cross-validation of the equal-count bins, every split and bin count from one sort (§5.1).

In sorted order every bin is a contiguous range of positions, so its counts and hits are
differences of cumulative counts; the edges are found by batched binary searches in NumPy.
"""

from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from top1_jax.core import binning, metrics
from top1_jax.core.splits import CrossValidation, Splits
from top1_jax.kernels import compile_policy


def cross_validate(
  u: np.ndarray, correct: np.ndarray, n_bins: Sequence[int], splits: Splits
) -> CrossValidation:
  """The bins' cross-validation (the fast path of ``evaluation.protocol``) of checked host
  [N] ``u`` and ``correct``, each of ``n_bins`` in [1, the smallest calibration part]."""
  order = np.argsort(u)  # the one sort
  sorted_u = u[order]
  sorted_correct = correct[order]
  hits_before = np.concatenate([[0], np.cumsum(sorted_correct, dtype=np.int64)])
  ss = _sorted_splits(splits, order, sorted_correct)
  counts = _bin_ranges(sorted_u, hits_before, ss, n_bins)
  return CrossValidation.from_per_fold(n_bins, _metrics_from_counts(*counts))


class _SortedSplits(NamedTuple):
  """Every split's test positions in sorted order, split f's offset by ``f * (N + 1)``, so
  one ``searchsorted`` counts the test points of every split below any position."""

  keys: np.ndarray  # test position + f * (N + 1), ascending
  hit_keys: np.ndarray  # the keys of the correct test examples
  size: np.ndarray  # [F] test examples per split


def _gather_folds(fold: np.ndarray, order: np.ndarray) -> np.ndarray:
  """fold[:, order] as [R, N] uint8, packing the R rows into one word per example first:
  one random gather instead of R."""
  num_reps = fold.shape[0]
  bits = max(1, int(fold.max()).bit_length())
  if num_reps * bits > 64:
    return fold[:, order].astype(np.uint8)
  word = np.uint8 if num_reps * bits <= 8 else np.uint16 if num_reps * bits <= 16 else np.uint64
  shifts = (np.arange(num_reps) * bits).astype(word)
  packed = np.zeros(fold.shape[1], word)
  for rep in range(num_reps):  # R cheap sequential passes
    packed |= fold[rep].astype(word) << shifts[rep]
  packed = packed[order]
  mask = word((1 << bits) - 1)
  return ((packed[None, :] >> shifts[:, None]) & mask).astype(np.uint8)


def _group_by_fold(fold: np.ndarray, per_rep: int) -> tuple[np.ndarray, np.ndarray]:
  """Positions grouped by fold id (ascending within each fold), and the fold sizes."""
  if per_rep == 2:  # two boolean scans beat a stable sort
    is_one = fold.view(bool)
    ones = np.flatnonzero(is_one)
    sizes = np.array([fold.shape[0] - ones.shape[0], ones.shape[0]])
    return np.concatenate([np.flatnonzero(~is_one), ones]), sizes
  return np.argsort(fold, kind="stable"), np.bincount(fold, minlength=per_rep)


def _sorted_splits(splits: Splits, order: np.ndarray, sorted_correct: np.ndarray) -> _SortedSplits:
  num = order.shape[0]
  num_reps, per_rep = splits.fold.shape[0], splits.per_rep
  fold_sorted = _gather_folds(splits.fold, order)
  dtype = np.int32 if num_reps * per_rep * (num + 1) < 2**31 else np.int64
  keys = np.empty(num_reps * num, dtype)
  test_correct = np.empty(num_reps * num, bool)
  sizes = np.zeros((num_reps, per_rep), np.int64)
  for rep in range(num_reps):  # each pass is O(N) and covers all folds of a repetition
    row = slice(rep * num, (rep + 1) * num)
    grouped, sizes[rep] = _group_by_fold(fold_sorted[rep], per_rep)
    grouped = grouped.astype(dtype, copy=False)
    offset = (rep * per_rep + np.arange(per_rep)) * (num + 1)
    test_correct[row] = sorted_correct[grouped]
    keys[row] = grouped + np.repeat(offset.astype(dtype), sizes[rep])
  return _SortedSplits(keys, keys[test_correct], sizes.reshape(-1)[: splits.num_splits])


def _bin_ranges(
  sorted_u: np.ndarray, hits_before: np.ndarray, ss: _SortedSplits, n_bins: Sequence[int]
):
  """Calibration and test counts and hits, each [B, F, max(n_bins)] int64."""
  num = sorted_u.shape[0]
  num_splits = ss.size.shape[0]
  offset = np.arange(num_splits, dtype=np.int64)[:, None] * (num + 1)  # [F, 1]
  count_below = lambda keys, query: np.searchsorted(keys, query.astype(keys.dtype))
  start = count_below(ss.keys, offset)  # [F, 1]: where each split begins
  cal_size = num - ss.size  # [F]
  bounds = np.full((len(n_bins), num_splits, max(n_bins) + 1), num, np.int64)
  bounds[:, :, 0] = 0
  for b, n in enumerate(n_bins):  # a handful of bin counts; all splits at once
    ranks = binning.quantile_edge_ranks(cal_size, n)  # [F, n-1], 1-based
    position = _rank_position(ranks, lambda p: count_below(ss.keys, p + offset) - start, num)
    # The edge is that point's score; the bin ends after its whole tie group.
    bounds[b, :, 1:n] = np.searchsorted(sorted_u, sorted_u[position], side="right")
  tests_below = count_below(ss.keys, bounds + offset) - start
  test_hits_below = count_below(ss.hit_keys, bounds + offset) - count_below(ss.hit_keys, offset)
  cal_below = bounds - tests_below
  cal_hits_below = hits_before[bounds] - test_hits_below
  diff = lambda x: np.diff(x, axis=-1)
  return diff(cal_below), diff(cal_hits_below), diff(tests_below), diff(test_hits_below)


def _rank_position(ranks: np.ndarray, tests_below, num: int) -> np.ndarray:
  """Sorted position of each split's rank-th calibration point: the smallest p where
  p + 1 - tests_below(p + 1) reaches the rank, by batched bisection (no O(N) pass)."""
  lo = ranks - 1  # at least rank - 1 positions precede the rank-th point
  hi = np.full_like(ranks, num - 1)
  while np.any(lo < hi):
    mid = (lo + hi) // 2
    enough = mid + 1 - tests_below(mid + 1) >= ranks
    hi = np.where(enough, mid, hi)
    lo = np.where(enough, lo, mid + 1)
  return lo


@compile_policy.jit_small
def _metrics_from_counts(cal_counts, cal_hits, test_counts, test_hits):
  cal_counts, cal_hits = cal_counts.astype(jnp.float32), cal_hits.astype(jnp.float32)
  prior = jnp.sum(cal_hits, -1) / jnp.sum(cal_counts, -1)  # [B, F]
  prob = binning.calibrated_prob(cal_hits, cal_counts, prior[..., None])
  test_counts, test_hits = test_counts.astype(jnp.float32), test_hits.astype(jnp.float32)
  return metrics.split_metrics(prob, prior, cal_counts, test_counts, test_hits)
