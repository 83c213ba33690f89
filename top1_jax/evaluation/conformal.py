"""Split conformal prediction on a model's ranking: the maths every set method shares, and
the metrics of its sets (``set_metrics``).

A set method (``evaluation.sets``) gives each input a score S_r of the label at each rank
r = 1..K of the model's ranking (ties towards the lower class index, as
``events.topk_correct``), non-decreasing in r. The threshold at level alpha is the
ceil((n + 1)(1 - alpha))-th smallest calibration score (+inf when that rank exceeds n); the
set of x is its Top-L for L = ``sizes``. For exchangeable data P(label in set) >= 1 - alpha.

Rounding can make S_r non-monotone, so a calibration score is the running max of S up to
the label's rank (``at_rank``) and a set ends before the first S_r above the threshold
(``sizes``): a label is in its set exactly when its score is at most the threshold.
"""

import functools
import math
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.kernels import top_entries

STRATA = ((0, 1), (2, 3), (4, 6), (7, 10), (11, 100), (101, None))
"""Set-size (and difficulty) strata of the RAPS paper's adaptivity tables; the last is open."""
STRATUM_NAMES = tuple(f"{lo}_{hi if hi is not None else 'up'}" for lo, hi in STRATA)


class Ranked(NamedTuple):
  """Inputs to rank, and how many classes rank ahead of each label.

  Attributes:
    rows: [B, K] logits, each row decreasing, padded with zeros to ``bucket(num)`` rows
      (``presorted``); or the caller's [N, K] host logits, sorted as ``sorted_rows`` gathers.
    rank: [N] int32, how many classes rank ahead of each label, or None without labels.
    num: N.
    presorted: whether ``rows`` is the sorted copy.
  """

  rows: Any
  rank: np.ndarray | None
  num: int
  presorted: bool


SORTED_COPY_BYTES = 1 << 28
"""Logits of up to this many bytes are sorted once into a copy that every split and method
gathers from; larger ones are sorted a block at a time as gathered."""

_MAX_DOUBLING = 4096


def bucket(num: int) -> int:
  """The rows a batch of ``num`` is padded to, so that a jitted program compiles once per
  bucket: the next power of two (at least 64) up to 4096, then the next multiple of 4096."""
  if num <= _MAX_DOUBLING:
    return max(64, 1 << max(num - 1, 0).bit_length())
  return -(-num // _MAX_DOUBLING) * _MAX_DOUBLING


def pad_rows(values, size: int, index: np.ndarray | None = None):
  """``values`` (NumPy or jax), or its rows ``index``, with zero rows appended up to ``size``
  rows."""
  if not isinstance(values, np.ndarray):
    values = values if index is None else values[index]
    return jnp.pad(values, [(0, size - values.shape[0])] + [(0, 0)] * (values.ndim - 1))
  out = np.zeros((size, *values.shape[1:]), values.dtype)
  if index is None:
    out[: values.shape[0]] = values
  else:
    # mode "clip" (the rows are in range): "raise" buffers the whole output, a second copy.
    np.take(values, index, axis=0, out=out[: index.shape[0]], mode="clip")
  return out


def uniform_draws(key: jax.Array, num: int, randomized: bool = True) -> np.ndarray:
  """[num] float32 u ~ U[0, 1) from ``key`` (zeros when not ``randomized``)."""
  if not randomized:
    return np.zeros(num, np.float32)
  return np.asarray(jax.random.uniform(key, (num,)), np.float32)


def ceil_times(num: int, fraction: float) -> int:
  """ceil(num * fraction), exact for the decimal ``fraction`` as written (0.1 is 1/10)."""
  return math.ceil(num * Fraction(str(float(fraction))))


def tuning_mask(key: jax.Array, num: int, fraction: float) -> np.ndarray:
  """[num] bool: a uniformly random subset of ceil(fraction * num) examples."""
  mask = np.zeros(num, bool)
  mask[np.asarray(jax.random.permutation(key, num))[: ceil_times(num, fraction)]] = True
  return mask


def quantile_rank(num: int, alpha: float) -> int:
  """ceil((num + 1)(1 - alpha)): which of ``num`` ascending scores is the threshold."""
  return ceil_times(num + 1, 1 - Fraction(str(float(alpha))))


def threshold(scores: np.ndarray, alpha: float) -> float:
  """q(alpha): the ``quantile_rank``-th smallest of ascending ``scores``, or +inf when that
  rank exceeds n (every set is full)."""
  rank = quantile_rank(scores.shape[0], alpha)
  return float(scores[rank - 1]) if rank <= scores.shape[0] else math.inf


_sort_descending = jax.jit(functools.partial(jnp.sort, axis=-1, descending=True))
_label_rank = jax.jit(top_entries.label_rank)


def sort_rows(block, *, on_host=None):
  """Host [B, K] rows (our copy), each in decreasing order: sorted in place by NumPy when
  ``on_host`` (None: on a CPU backend, where XLA's sort is slower), else on the device."""
  if on_host or (on_host is None and jax.default_backend() == "cpu"):
    np.negative(block, out=block)  # exact: ascending of -x is descending of x
    block.sort(axis=-1)
    return np.negative(block, out=block)
  return _sort_descending(block)


def ranked(logits: np.ndarray, labels: np.ndarray | None = None) -> Ranked:
  """``Ranked`` of unchecked host [N, K] logits (and [N] labels)."""
  num = logits.shape[0]
  rank = None
  if labels is not None:  # a bucket's rows at a time: the program copies its input
    step, ranks = min(bucket(num), _MAX_DOUBLING), []
    for i in range(0, num, step):
      block = (pad_rows(logits[i : i + step], step), pad_rows(labels[i : i + step], step))
      ranks.append(np.asarray(_label_rank(*block)))
    rank = np.concatenate(ranks)[:num].astype(np.int32)
  if logits.nbytes > SORTED_COPY_BYTES:
    return Ranked(logits, rank, num, False)
  return Ranked(sort_rows(pad_rows(logits, bucket(num))), rank, num, True)


def sorted_rows(data: Ranked, size: int, index: np.ndarray | None = None):
  """[size, K]: the rows ``index`` of ``data`` (all when None), each in decreasing order,
  with zero rows appended up to ``size``."""
  if data.presorted:
    whole = index is None and size == data.rows.shape[0]
    return data.rows if whole else pad_rows(data.rows, size, index)
  return sort_rows(pad_rows(data.rows, size, index))


_BLOCK = 32


def cumulative_sum(values: jax.Array) -> jax.Array:
  """[N, K] running sums along the last axis: within blocks of 32 by a triangular matmul, then
  the blocks' offsets (faster than XLA's cumsum on the CPU; ``at_rank`` tolerates its
  rounding)."""
  num, num_classes = values.shape
  padded = jnp.pad(values, ((0, 0), (0, -num_classes % _BLOCK))).reshape(num, -1, _BLOCK)
  triangle = jnp.triu(jnp.ones((_BLOCK, _BLOCK), values.dtype))
  within = jnp.einsum("nbi,ij->nbj", padded, triangle, precision=jax.lax.Precision.HIGHEST)
  offsets = jnp.cumsum(within[:, :, -1], axis=-1) - within[:, :, -1]
  return (within + offsets[:, :, None]).reshape(num, -1)[:, :num_classes]


def interpolated(cumulative: jax.Array, u: jax.Array) -> jax.Array:
  """(1 - u) A_(r-1) + u A_r for A_1..A_K = ``cumulative`` [N, K] (A_0 = 0)."""
  previous = jnp.pad(cumulative[:, :-1], ((0, 0), (1, 0)))
  return (1 - u)[:, None] * previous + u[:, None] * cumulative


@jax.jit
def at_rank(scores: jax.Array, rank: jax.Array) -> jax.Array:
  """[N] each example's score at its label's rank (the running max of S up to it)."""
  up_to = jnp.arange(scores.shape[-1]) <= rank[:, None]
  return jnp.max(jnp.where(up_to, scores, -jnp.inf), axis=-1)


@jax.jit
def sizes(scores: jax.Array, thresholds: jax.Array) -> jax.Array:
  """[A, N] int32: the ranks before the first S_r above each of the [A] thresholds."""
  num_classes = scores.shape[-1]
  position = jnp.arange(num_classes, dtype=jnp.float32)  # float min: XLA:CPU vectorises it
  size = lambda q: jnp.min(jnp.where(scores > q, position, num_classes), axis=-1).astype(jnp.int32)
  return jax.vmap(size)(thresholds)


@jax.jit
def prefix_mask(logits: jax.Array, sorted_logits: jax.Array, lengths: jax.Array) -> jax.Array:
  """[N, K] bool: each row's Top-``lengths`` labels, ties towards the lower class index."""
  last = jnp.take_along_axis(sorted_logits, jnp.maximum(lengths - 1, 0)[:, None], axis=-1)
  last = jnp.where(lengths[:, None] > 0, last, jnp.inf)
  above, tied = logits > last, logits == last
  needed = lengths - top_entries.count(above).astype(jnp.int32)
  partly = jnp.any(top_entries.count(tied).astype(jnp.int32) > needed)

  def first_tied():
    return above | (tied & (jnp.cumsum(tied, axis=-1, dtype=jnp.int32) <= needed[:, None]))

  return jax.lax.cond(partly, first_tied, lambda: above | tied)


def set_metrics(sizes: np.ndarray, rank: np.ndarray, alpha: float) -> dict[str, float]:
  """One test part's metrics from its [N] set sizes and [N] label ranks (0 = top): coverage,
  mean and median size, the empty fraction; per ``STRATA`` of set size the fraction and
  coverage, of difficulty (rank + 1) the mean size and coverage (NaN where empty); and
  ``sscv``, the largest |coverage - (1 - alpha)| over the non-empty size strata."""
  covered = rank < sizes
  out = {
    "coverage": covered.mean(),
    "mean_size": sizes.mean(),
    "median_size": float(np.median(sizes)),
    "empty_fraction": np.mean(sizes == 0),
  }
  mean = lambda values, where: values[where].mean() if where.any() else math.nan
  for name, (low, high) in zip(STRATUM_NAMES, STRATA, strict=True):
    high = math.inf if high is None else high
    by_size, by_difficulty = ((x >= low) & (x <= high) for x in (sizes, rank + 1))
    out[f"fraction_size_{name}"] = by_size.mean()
    out[f"coverage_size_{name}"] = mean(covered, by_size)
    out[f"size_difficulty_{name}"] = mean(sizes, by_difficulty)
    out[f"coverage_difficulty_{name}"] = mean(covered, by_difficulty)
  out["sscv"] = np.nanmax([abs(out[f"coverage_size_{n}"] - (1 - alpha)) for n in STRATUM_NAMES])
  return {name: float(value) for name, value in out.items()}


def summary(per_split: list[dict[str, float]]) -> dict[str, float | None]:
  """``set_metrics`` over splits: each one's mean over the splits that define it (None
  where none does), and the sample standard deviation of coverage, mean_size and sscv
  (``coverage_std``, ...; 0 for one split)."""
  out: dict[str, float | None] = {}
  for name in per_split[0]:
    values = np.array([metrics[name] for metrics in per_split])
    values = values[~np.isnan(values)]
    out[name] = float(values.mean()) if values.size else None
    if name in ("coverage", "mean_size", "sscv"):
      out[f"{name}_std"] = float(values.std(ddof=1)) if values.size > 1 else 0.0
  return out
