"""Calibration/test splits and the record of a cross-validation (paper §5.1)."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from top1_jax.core import validation

SCHEMES = ("halves", "kfold")

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
  """Split ``f`` tests on the examples with ``fold[f // per_rep] == f % per_rep``.

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
  """``n_folds`` random calibration/test splits of ``num_examples`` examples. ``scheme``
  "halves" (the paper's) is repeated 2-fold cross-validation (ceil(n_folds / 2) random
  halvings, each used both ways); "kfold" is k-fold."""
  if scheme not in SCHEMES:
    raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
  num_examples = validation.positive_int("num_examples", num_examples, minimum=2)
  # At most 127: the folds are int8.
  n_folds = validation.positive_int("n_folds", n_folds, minimum=2, maximum=min(num_examples, 127))
  seed = validation.seed("seed", seed)
  rng = np.random.default_rng(seed)
  if scheme == "kfold":
    fold = np.empty((1, num_examples), np.int8)
    fold[0, rng.permutation(num_examples)] = np.arange(num_examples) % n_folds
    return Splits(fold, n_folds, n_folds)
  num_reps = -(-n_folds // 2)
  fold = np.stack([_random_half(rng, num_examples) for _ in range(num_reps)])
  return Splits(fold, 2, n_folds)


def _random_half(rng: np.random.Generator, num_examples: int) -> np.ndarray:
  """Exactly N // 2 examples as int8 0/1, uniform: coin flips, a random surplus flipped
  back (cheaper than a permutation)."""
  bits = rng.integers(0, 2, num_examples, dtype=np.int8)
  surplus = int(bits.sum()) - num_examples // 2
  if surplus:
    value = 1 if surplus > 0 else 0
    candidates = np.flatnonzero(bits == value)
    bits[rng.choice(candidates, abs(surplus), replace=False)] = 1 - value
  return bits


UNDEFINABLE = ("auroc", "eor")
"""Metrics NaN on some splits (AUROC on a one-class test part, EOR at a base rate of 0
or 1); their means and stds use the splits where they are defined."""


class CrossValidation(NamedTuple):
  """Metrics over splits for each bin count.

  Attributes:
    n_bins: the bin counts, in order.
    per_fold: metric name -> [len(n_bins), n_folds] array (NaN where undefined).
    mean: metric name -> [len(n_bins)] mean over the splits where it is defined.
    std: metric name -> [len(n_bins)] sample std over those splits (0 for one).
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
    """The one place the statistics over splits are computed (None counts as undefined)."""
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
    """One flat dict per bin count: n_bins, <metric>, <metric>_std and, for
    ``UNDEFINABLE`` metrics, <metric>_num_splits; None where undefined."""
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
