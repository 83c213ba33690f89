"""Cross-validated scoring of binned Top-k predictions (paper §5.1).

For each split, bins are fitted on the calibration part and the held-out part is
scored. Every split and every bin count is computed together from **one** sort
of the scores:

* With the N examples in sorted order, a split is the set of sorted positions of
  its test examples; the calibration points are the rest. All splits' test
  positions go into one flat sorted array (split f offset by f (N + 1)), so
  "test points of split f below position p" is one binary search.
* The quantile edges are the scores of the calibration points of rank
  floor(i M / n); each such point's position is found by bisection on
  p + 1 - (test points up to p), a batched binary search per halving.
* An edge's tie group ends at a known position, so every bin of every split and
  bin count is a contiguous range of sorted positions, and its calibration and
  test counts and hits are differences of cumulative counts at the range ends.

So the O(N) work is one argsort plus O(N) index bookkeeping per repetition of
the splits (one for k-fold, n_folds / 2 for halves), and the per-bin work is a
few thousand binary searches; the metrics are then computed by one jitted
function over arrays [bin counts, splits, bins]. Sorting and the index work run
in NumPy: XLA's CPU sort is much slower than NumPy's (docs/performance.md), and
these steps are integer bookkeeping with no maths to accelerate.
"""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, metrics, validation
from top1_jax.estimators import isotonic, kde
from top1_jax.kernels import compile_policy

SCHEMES = ("halves", "kfold")

ESTIMATORS = ("bins", "isotonic", "kde")
"""Estimators of P(correct | U) that ``cross_validate`` can score."""

METRICS = (
  "accuracy",
  "brier",
  "brier_uncertainty",
  "brier_resolution",
  "brier_calibration",
  "nll",
  "nll_uncertainty",
  "nll_resolution",
  "nll_calibration",
  "ece",
  "eor",
  "auroc",
  "num_effective_bins",
)
"""Every metric that ``cross_validate`` reports, for each bin count."""


class Splits(NamedTuple):
  """Test folds of each split, as a fold id per example and repetition.

  Split ``f`` tests on the examples with ``fold[f // per_rep] == f % per_rep``
  and calibrates on the others.

  Attributes:
    fold: [R, N] int8, the fold of each example in each repetition.
    per_rep: folds per repetition (2 for halves, k for k-fold).
    num_splits: how many splits are used (<= R * per_rep).
  """

  fold: np.ndarray
  per_rep: int
  num_splits: int

  def test_mask(self, split: int) -> np.ndarray:
    """[N] bool, the test examples of one split."""
    return self.fold[split // self.per_rep] == split % self.per_rep


def make_splits(num_examples: int, n_folds: int, seed: int = 0, scheme: str = "halves") -> Splits:
  """Random calibration/test splits of ``num_examples`` examples.

  Args:
    num_examples: N.
    n_folds: number of splits.
    seed: NumPy seed.
    scheme: "halves": calibrate on a uniformly random half, test on the other
      half (the paper's protocol), n_folds times, as repeated 2-fold
      cross-validation (ceil(n_folds / 2) random halvings, each used both ways;
      5x2 CV for n_folds = 10). "kfold": k-fold, calibrate on n_folds - 1 folds,
      test on the remaining one.

  Returns:
    ``Splits``.
  """
  if scheme not in SCHEMES:
    raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
  num_examples = validation.positive_int("num_examples", num_examples, minimum=2)
  n_folds = validation.positive_int("n_folds", n_folds, minimum=2, maximum=num_examples)
  seed = validation.seed("seed", seed)
  if n_folds > 127:
    raise ValueError(f"n_folds: expected at most 127, got {n_folds}")
  rng = np.random.default_rng(seed)
  if scheme == "kfold":
    fold = np.empty((1, num_examples), np.int8)
    fold[0, rng.permutation(num_examples)] = np.arange(num_examples) % n_folds
    return Splits(fold, n_folds, n_folds)
  num_reps = -(-n_folds // 2)
  fold = np.stack([_random_half(rng, num_examples) for _ in range(num_reps)])
  return Splits(fold, 2, n_folds)


def _random_half(rng: np.random.Generator, num_examples: int) -> np.ndarray:
  """A uniformly random subset of exactly N // 2 examples, as int8 0/1.

  Fair coin flips, then a uniformly random choice of the surplus members flipped
  back: exchangeable and of fixed size, hence uniform over subsets. (Avoids a
  full permutation, which costs more than the rest of cross-validation.)
  """
  bits = rng.integers(0, 2, num_examples, dtype=np.int8)
  surplus = int(bits.sum()) - num_examples // 2
  if surplus:
    value = 1 if surplus > 0 else 0
    candidates = np.flatnonzero(bits == value)
    bits[rng.choice(candidates, abs(surplus), replace=False)] = 1 - value
  return bits


UNDEFINABLE = ("auroc", "eor")
"""Metrics undefined on some splits: AUROC when the test part holds one class only,
EOR when the calibration accuracy (the base rate) is 0 or 1. They are NaN in
``per_fold`` there, and means and stds use the splits where they are defined."""


class CrossValidation(NamedTuple):
  """Metrics over splits for each bin count.

  Attributes:
    n_bins: the bin counts, in order.
    per_fold: metric name -> [len(n_bins), n_folds] array (NaN where undefined).
    mean: metric name -> [len(n_bins)] mean over the splits where it is defined
      (NaN when it is defined on none).
    std: metric name -> [len(n_bins)] sample standard deviation over those splits
      (0 for one split).
    num_defined: metric name -> [len(n_bins)] int, the splits it is defined on.
  """

  n_bins: tuple[int, ...]
  per_fold: dict[str, np.ndarray]
  mean: dict[str, np.ndarray]
  std: dict[str, np.ndarray]
  num_defined: dict[str, np.ndarray]

  @classmethod
  def from_per_fold(
    cls, n_bins: Sequence[int], per_fold: dict[str, np.ndarray]
  ) -> "CrossValidation":
    """Mean and sample std over the splits axis, over the splits where each value is defined.

    The one place the statistics over splits are computed (None in JSON-read
    ``per_fold`` lists counts as undefined).
    """
    per_fold = {name: np.asarray(value, np.float64) for name, value in per_fold.items()}
    mean, std, num_defined = {}, {}, {}
    for name, value in per_fold.items():
      defined = np.isfinite(value)
      count = defined.sum(axis=1)
      total = np.where(defined, value, 0.0).sum(axis=1)
      with np.errstate(invalid="ignore", divide="ignore"):
        mean[name] = np.where(count > 0, total / count, np.nan)
        squares = np.where(defined, (value - mean[name][:, None]) ** 2, 0.0).sum(axis=1)
        std[name] = np.where(count > 1, np.sqrt(squares / (count - 1)), 0.0)
      std[name] = np.where(count > 0, std[name], np.nan)
      num_defined[name] = count
    return cls(tuple(n_bins), per_fold, mean, std, num_defined)

  def rows(self) -> list[dict[str, float | int | None]]:
    """One flat dict per bin count: n_bins, <metric>, <metric>_std, and for the
    metrics that can be undefined <metric>_num_splits; None where undefined."""
    out = []
    for i, n in enumerate(self.n_bins):
      row: dict[str, float | int | None] = {"n_bins": n}
      for name in METRICS:
        defined = int(self.num_defined[name][i]) > 0
        row[name] = float(self.mean[name][i]) if defined else None
        row[f"{name}_std"] = float(self.std[name][i]) if defined else None
        if name in UNDEFINABLE:
          row[f"{name}_num_splits"] = int(self.num_defined[name][i])
      out.append(row)
    return out

  def per_fold_lists(self) -> dict[str, list]:
    """``per_fold`` as nested lists with None where undefined (strict JSON)."""
    return {
      name: [[float(v) if np.isfinite(v) else None for v in row] for row in value]
      for name, value in self.per_fold.items()
    }


class _SortedSplits(NamedTuple):
  """Every split's test positions in sorted order, flattened into one array.

  Split f's positions are offset by ``f * (N + 1)``, so the flat array is sorted
  and one ``searchsorted`` answers "how many test points of split f lie below
  position p" for all splits and positions at once.
  """

  keys: np.ndarray  # test position + f * (N + 1), ascending
  hit_keys: np.ndarray  # the keys of the correct test examples
  size: np.ndarray  # [F] test examples per split


def _gather_folds(fold: np.ndarray, order: np.ndarray) -> np.ndarray:
  """fold[:, order] as [R, N] uint8, gathering one packed word per example.

  A random gather costs ~5 ns per element here, and halves have R = n_folds / 2
  rows of one bit each: packing them into a single word makes it one gather.
  """
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
    return np.concatenate([np.flatnonzero(~is_one), ones]), np.array(
      [fold.shape[0] - ones.shape[0], ones.shape[0]]
    )
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
  """Calibration and test counts/hits of every (bin count, split, bin).

  Returns:
    cal_counts, cal_hits, test_counts, test_hits: [B, F, max(n_bins)] int64.
  """
  num = sorted_u.shape[0]
  num_splits = ss.size.shape[0]
  offset = np.arange(num_splits, dtype=np.int64)[:, None] * (num + 1)  # [F, 1]
  count_below = lambda keys, query: np.searchsorted(keys, query.astype(keys.dtype))  # noqa: E731
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
  diff = lambda x: np.diff(x, axis=-1)  # noqa: E731
  return diff(cal_below), diff(cal_hits_below), diff(tests_below), diff(test_hits_below)


def _rank_position(ranks: np.ndarray, tests_below, num: int) -> np.ndarray:
  """Sorted position of each split's rank-th calibration point, by bisection.

  The calibration points in positions [0, p] number p + 1 - tests_below(p + 1),
  which is non-decreasing in p; find the smallest p where it reaches the rank.
  Each of the ~log2(N) halvings is one batched binary search: no O(N) pass.
  """
  lo = ranks - 1  # at least rank - 1 positions precede the rank-th point
  hi = np.full_like(ranks, num - 1)
  while np.any(lo < hi):
    mid = (lo + hi) // 2
    enough = mid + 1 - tests_below(mid + 1) >= ranks
    hi = np.where(enough, mid, hi)
    lo = np.where(enough, lo, mid + 1)
  return lo


def _binned_metrics(prob, prior, cal_counts, test_counts, test_hits) -> dict[str, jax.Array]:
  """ECE, EOR, AUROC and the bins in use, from each bin's prediction and test counts.

  EOR and AUROC are undefined (NaN) where the base rate is 0 or 1, or the test part
  holds one class; ``CrossValidation`` leaves those splits out of the means.
  """
  return {
    "ece": metrics.ece_from_counts(prob, test_counts, test_hits),
    "eor": jnp.where(
      (prior > 0) & (prior < 1), metrics.eor_from_probs(prob, test_counts, prior), jnp.nan
    ),
    "auroc": jnp.where(
      (jnp.sum(test_hits, -1) > 0) & (jnp.sum(test_counts - test_hits, -1) > 0),
      metrics.auroc_from_counts(prob, test_counts, test_hits),
      jnp.nan,
    ),
    "num_effective_bins": jnp.sum(cal_counts > 0, -1).astype(jnp.float32),
  }


@compile_policy.jit_small
def _metrics_from_counts(cal_counts, cal_hits, test_counts, test_hits):
  cal_counts = cal_counts.astype(jnp.float32)
  cal_hits = cal_hits.astype(jnp.float32)
  prior = jnp.sum(cal_hits, -1) / jnp.sum(cal_counts, -1)  # [B, F]
  prob = binning.calibrated_prob(cal_hits, cal_counts, prior[..., None])
  test_counts = test_counts.astype(jnp.float32)
  test_hits = test_hits.astype(jnp.float32)
  brier = metrics.brier_from_counts(prob, test_counts, test_hits)
  nll = metrics.nll_from_counts(prob, test_counts, test_hits)
  return {
    "accuracy": jnp.sum(test_hits, -1) / jnp.sum(test_counts, -1),
    "brier": brier.total,
    "brier_uncertainty": brier.uncertainty,
    "brier_resolution": brier.resolution,
    "brier_calibration": brier.calibration,
    "nll": nll.total,
    "nll_uncertainty": nll.uncertainty,
    "nll_resolution": nll.resolution,
    "nll_calibration": nll.calibration,
    **_binned_metrics(prob, prior, cal_counts, test_counts, test_hits),
  }


def _bin_counts(n_bins) -> tuple:
  """One bin count or a sequence of them, as a tuple (values are checked later)."""
  if isinstance(n_bins, (int, np.integer)) and not isinstance(n_bins, bool):
    return (n_bins,)
  if isinstance(n_bins, (str, bytes)) or not hasattr(n_bins, "__iter__"):
    raise ValueError(f"n_bins: expected an integer or a sequence of integers, got {n_bins!r}")
  n_bins = tuple(n_bins)
  if not n_bins:
    raise ValueError("n_bins: expected at least one bin count, got none")
  return n_bins


def cross_validate(
  u: ArrayLike,
  correct: ArrayLike,
  n_bins: int | Sequence[int] = (10, 20, 100),
  n_folds: int = 10,
  seed: int = 0,
  scheme: str = "halves",
  splits: Splits | None = None,
  estimator: str = "bins",
  increasing: bool = False,
) -> CrossValidation:
  """Cross-validated Brier, NLL, ECE, EOR, AUROC and decompositions per bin count.

  Each split fits equal-count bins on its calibration part (probabilities with the
  one-pseudo-count prior at the calibration accuracy) and scores the held-out
  part: Brier and NLL with their decompositions, ECE against the test accuracy
  per bin, EOR of the predicted bin probabilities (test weights, base rate the
  calibration accuracy), and AUROC of the predictions (ties within a bin count
  one half). All splits and bin counts are computed together from one sort.

  Args:
    u: [N] float scores.
    correct: [N] bool events.
    n_bins: one bin count or several; each at least 1 and at most the smallest
      calibration split.
    n_folds: number of splits (>= 2).
    seed: seed of the random splits.
    scheme: "halves" (paper: calibrate on half, test on the other half) or
      "kfold"; see ``make_splits``.
    splits: explicit splits (overrides n_folds, seed and scheme), e.g. to score
      several uncertainty measures on the same splits.
    estimator: "bins" (default, the above), "isotonic" (``isotonic.fit``) or "kde"
      (``kde.fit``, its bandwidth chosen on each calibration part). These two are
      fitted and predicted split by split. Brier and NLL are the per-example means
      of their test predictions. ECE, EOR, AUROC and the decompositions' terms use
      the calibration part's equal-count bins of U (for each bin count), the test
      counts and hits per bin and, as each bin's prediction, the estimator's mean
      test prediction there; for the bins, whose predictions are constant in a bin,
      these are the definitions above, so the rows compare. Brier and NLL do not
      depend on the bin count, and their decomposition terms need not add up to
      them (the difference is the spread of predictions within a bin).
    increasing: for "isotonic": P(correct) grows with ``u`` (a confidence such
      as pmax); the default is an uncertainty, P(correct) non-increasing in ``u``.

  Returns:
    ``CrossValidation`` with per-split values, mean and std of ``METRICS``.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {estimator!r}")
  # Everything before the metrics runs in NumPy on the host (see the module doc).
  u_host = validation.float_array("u", u, 1, host=True)
  correct_host = validation.bool_array("correct", correct, host=True)
  num = validation.same_length(u=u_host, correct=correct_host)
  if num < 2:
    raise ValueError(f"u: cross-validation needs at least 2 examples, got {num}")
  n_bins = _bin_counts(n_bins)
  if splits is None:
    splits = make_splits(num, n_folds, seed, scheme)
  elif splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, u has {num}")
  if estimator != "bins":
    return _cross_validate_estimator(u_host, correct_host, n_bins, splits, estimator, increasing)

  order = np.argsort(u_host)  # the one sort
  sorted_u = u_host[order]
  sorted_correct = correct_host[order]
  hits_before = np.concatenate([[0], np.cumsum(sorted_correct, dtype=np.int64)])
  ss = _sorted_splits(splits, order, sorted_correct)
  smallest_cal = int(num - ss.size.max())
  if int(ss.size.min()) < 1:
    raise ValueError("splits: a split has no test examples")
  n_bins = tuple(validation.positive_int("n_bins", n, maximum=smallest_cal) for n in n_bins)
  counts = _bin_ranges(sorted_u, hits_before, ss, n_bins)
  return CrossValidation.from_per_fold(n_bins, _metrics_from_counts(*counts))


def _fit_predict(estimator: str, u_cal, correct_cal, u_test, increasing: bool) -> np.ndarray:
  if estimator == "isotonic":
    model = isotonic.fit(u_cal, correct_cal, increasing=increasing)
    return np.asarray(isotonic.predict(model, u_test), np.float64)
  return np.asarray(kde.predict(kde.fit(u_cal, correct_cal), u_test), np.float64)


def _estimator_counts(u, correct, splits: Splits, n_bins: tuple, estimator: str, increasing):
  """Split by split: fit, predict, and sum the test data in each calibration bin.

  Returns:
    cal_counts, test_counts, test_hits, prediction_sums: [B, F, max(n_bins)];
    prior (the calibration accuracy), brier, nll: [F].
  """
  width = max(n_bins)
  binned = np.zeros((4, len(n_bins), splits.num_splits, width), np.float32)
  per_split = np.zeros((3, splits.num_splits), np.float32)
  for split in range(splits.num_splits):
    test = splits.test_mask(split)
    u_cal, correct_cal, u_test, correct_test = u[~test], correct[~test], u[test], correct[test]
    p = _fit_predict(estimator, u_cal, correct_cal, u_test, increasing)
    for b, n in enumerate(n_bins):
      bins = binning.fit(u_cal, correct_cal, n)
      index = np.asarray(binning.assign(bins.edges, u_test))
      binned[0, b, split, :n] = bins.counts
      binned[1, b, split] = np.bincount(index, minlength=width)
      binned[2, b, split] = np.bincount(index, correct_test, width)
      binned[3, b, split] = np.bincount(index, p, width)
    per_split[:, split] = bins.prior, metrics.brier(p, correct_test), metrics.nll(p, correct_test)
  return (*binned, *per_split)


@compile_policy.jit_small
def _estimator_metrics(cal_counts, test_counts, test_hits, prediction_sums, prior, brier, nll):
  prior = jnp.broadcast_to(prior, test_counts.shape[:-1])  # [B, F]
  prob = jnp.where(
    test_counts > 0, prediction_sums / jnp.maximum(test_counts, 1.0), prior[..., None]
  )
  brier_bins = metrics.brier_from_counts(prob, test_counts, test_hits)
  nll_bins = metrics.nll_from_counts(prob, test_counts, test_hits)
  return {
    "accuracy": jnp.sum(test_hits, -1) / jnp.sum(test_counts, -1),
    "brier": jnp.broadcast_to(brier, prior.shape),
    "brier_uncertainty": brier_bins.uncertainty,
    "brier_resolution": brier_bins.resolution,
    "brier_calibration": brier_bins.calibration,
    "nll": jnp.broadcast_to(nll, prior.shape),
    "nll_uncertainty": nll_bins.uncertainty,
    "nll_resolution": nll_bins.resolution,
    "nll_calibration": nll_bins.calibration,
    **_binned_metrics(prob, prior, cal_counts, test_counts, test_hits),
  }


def _cross_validate_estimator(u, correct, n_bins: tuple, splits: Splits, estimator, increasing):
  """``cross_validate`` for an estimator other than the bins (see its docstring)."""
  test_sizes = np.array([splits.test_mask(f).sum() for f in range(splits.num_splits)])
  if int(test_sizes.min()) < 1:
    raise ValueError("splits: a split has no test examples")
  smallest_cal = int(u.shape[0] - test_sizes.max())
  n_bins = tuple(validation.positive_int("n_bins", n, maximum=smallest_cal) for n in n_bins)
  counts = _estimator_counts(u, correct, splits, n_bins, estimator, increasing)
  return CrossValidation.from_per_fold(n_bins, _estimator_metrics(*counts))
