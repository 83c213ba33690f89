"""The bin count chosen by nested cross-validation inside the calibration data."""

from collections.abc import Sequence

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, splits, validation
from top1_jax.estimators import bins_crossval

DEFAULT_GRID = (5, 10, 15, 20, 30, 50, 100)
"""The bin counts tried when no grid is given (clipped to the calibration size)."""


def _grid(grid: Sequence[int] | None, cap: int) -> tuple[int, ...]:
  if grid is None:
    return tuple(sorted({min(n, cap) for n in DEFAULT_GRID}))
  if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
    raise ValueError(f"grid: expected a sequence of bin counts, got {grid!r}")
  grid = tuple(grid)
  if not grid:
    raise ValueError("grid: expected at least one bin count, got none")
  for n in grid:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
      raise ValueError(f"grid: expected integer bin counts, got {n!r}")
    if not 1 <= n <= cap:
      raise ValueError(
        f"grid: each bin count must lie in [1, {cap}] (the smallest nested calibration part),"
        f" got {int(n)}"
      )
  return tuple(sorted({int(n) for n in grid}))


def choose_n_bins(
  u: ArrayLike,
  correct: ArrayLike,
  grid: Sequence[int] | None = None,
  n_folds: int = 10,
  seed: int = 0,
) -> tuple[int, splits.CrossValidation]:
  """The bin count of ``grid`` with the lowest held-out NLL on the calibration data.

  Returns (the count, the ``CrossValidation`` of the whole grid, ascending) for [M] ``u``
  and ``correct``. ``grid``: counts in [1, M // 2], or None: ``DEFAULT_GRID`` clipped.
  ``n_folds``: nested splits (random halves, each used both ways), at most M.
  """
  u, correct = validation.score_and_event("u", u, correct, host=True)
  num = int(u.shape[0])
  n_folds = validation.positive_int("n_folds", n_folds, minimum=2)
  seed = validation.seed("seed", seed)
  if num < max(n_folds, 2):
    raise ValueError(
      f"u: choosing n_bins by cross-validation needs at least n_folds={n_folds} examples, got {num}"
    )
  grid = _grid(grid, num // 2)
  nested = splits.make_splits(num, n_folds, seed, "halves")
  cv = bins_crossval.cross_validate(u, correct, grid, nested)
  nll = np.asarray(cv.mean["nll"], np.float64)
  # argmin takes the first of equal minima: the grid is ascending, so fewer bins win.
  return int(cv.n_bins[int(np.argmin(nll))]), cv


def fit_cv(
  u: ArrayLike,
  correct: ArrayLike,
  grid: Sequence[int] | None = None,
  n_folds: int = 10,
  seed: int = 0,
) -> tuple[binning.Bins, int]:
  """(``binning.fit`` on all of (u, correct) with the count ``choose_n_bins`` picks, it)."""
  n_bins, _ = choose_n_bins(u, correct, grid, n_folds, seed)
  return binning.fit(u, correct, n_bins), n_bins
