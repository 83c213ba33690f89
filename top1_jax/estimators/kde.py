"""Kernel estimate of P(correct | U): the bins' rule with a Gaussian window on ranks.

    p(u) = (sum_i w_i(u) correct_i + p_A) / (sum_i w_i(u) + 1),
    w_i(u) = exp(-(r(u) - r_i)^2 / (2 h^2)),

with r the empirical CDF of U on the calibration split (ties share their mid-rank), so h is
a fraction of the calibration points, as a bin's width is. Points are counted into
``NUM_CELLS`` rank cells, smoothed by FFT, and the estimate tabulated at up to ``NUM_CELLS``
knots that ``predict`` interpolates. ``fit`` runs on the host.
"""

import math
import statistics
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, validation
from top1_jax.estimators import base, table

NUM_CELLS = 4096  # equal-width rank cells: at N = 1e6 about 244 points each
BANDWIDTHS = tuple(float(h) for h in np.geomspace(1 / NUM_CELLS, 0.5, 40))
"""The bandwidths (Gaussian standard deviations, in rank units) ``fit`` chooses from."""


class KernelModel(NamedTuple):
  """A fitted kernel estimate (a pytree of jax arrays).

  Attributes:
    knots: [K] float32, ascending distinct calibration scores, padded (``table.pad``).
    prob: [K] float32, P(correct) at the knots.
    effective_count: [K] float32, (sum w + 1)^2 / (sum w^2 + 1): the independent events
      the estimate is worth, the prior counting as one.
    prior: [] float32, the calibration accuracy p_A.
    bandwidth: [] float32, h in rank units.
  """

  knots: jax.Array
  prob: jax.Array
  effective_count: jax.Array
  prior: jax.Array
  bandwidth: jax.Array


class _Cells(NamedTuple):
  """Calibration data counted into rank cells, and the rank of each tie group."""

  counts: np.ndarray  # [G] float64
  hits: np.ndarray  # [G] float64
  sorted_u: np.ndarray  # [N]
  group_start: np.ndarray  # [T] first sorted position of each distinct score
  group_rank: np.ndarray  # [T] mid-rank of each distinct score, in (0, 1]
  prior: np.float32


def _cells(u: np.ndarray, correct: np.ndarray) -> _Cells:
  num = u.shape[0]
  order = np.argsort(u)
  sorted_u = u[order]
  group_start = np.flatnonzero(np.concatenate([[True], sorted_u[1:] != sorted_u[:-1]]))
  group_size = np.diff(np.append(group_start, num))
  group_hits = np.add.reduceat(correct[order].astype(np.int64), group_start)
  group_rank = (group_start + 0.5 * group_size) / num
  cell = np.minimum((group_rank * NUM_CELLS).astype(np.int64), NUM_CELLS - 1)
  counts = np.bincount(cell, group_size, NUM_CELLS)
  hits = np.bincount(cell, group_hits, NUM_CELLS)
  prior = np.float32(group_hits.sum()) / np.float32(num)  # as binning computes it
  return _Cells(counts, hits, sorted_u, group_start, group_rank, prior)


def _window_sums(values: np.ndarray, bandwidths: np.ndarray, power: int = 1) -> np.ndarray:
  """[H, V, G]: sum over cells of K(distance)^power * values [V, G] at every cell centre,
  for each of ``bandwidths`` [H], by FFT."""
  size = 2 * NUM_CELLS  # zero padding: a linear, not circular, convolution
  lag = np.fft.fftfreq(size, 1.0 / size) / NUM_CELLS  # signed cell distances in rank units
  window = np.exp(-0.5 * power * (lag / bandwidths[:, None]) ** 2)
  spectrum = np.fft.rfft(values, size)[None] * np.fft.rfft(window)[:, None]
  return np.fft.irfft(spectrum, size)[..., :NUM_CELLS]


def _loo_nll(cells: _Cells, bandwidths: np.ndarray) -> np.ndarray:
  sums = _window_sums(np.stack([cells.hits, cells.counts]), bandwidths)
  hit_sum, weight_sum = sums[:, 0], sums[:, 1]  # [H, G]
  # Leaving a point out removes its own weight 1 (and its hit) at its cell.
  denominator = np.maximum(weight_sum, 1.0)
  p_hit = np.clip((hit_sum - 1 + cells.prior) / denominator, np.finfo(np.float64).tiny, 1.0)
  p_miss = np.clip((hit_sum + cells.prior) / denominator, 0.0, 1.0 - 2**-53)
  misses = cells.counts - cells.hits
  loss = np.where(cells.hits > 0, -cells.hits * np.log(p_hit), 0.0)
  loss += np.where(misses > 0, -misses * np.log1p(-p_miss), 0.0)
  return loss.sum(axis=1) / cells.counts.sum()


def leave_one_out_nll(u: ArrayLike, correct: ArrayLike, bandwidths=BANDWIDTHS) -> np.ndarray:
  """[H] leave-one-out binary NLL (nats per example) of the cell-level estimate at each of
  ``bandwidths`` [H]: the criterion ``fit`` minimises."""
  u, correct = base.host_scores("kde.fit", u, correct)
  grid = validation.float_array("bandwidths", bandwidths, 1, host=True).astype(np.float64)
  if grid.shape[0] == 0 or not np.all(grid > 0):
    raise ValueError(f"bandwidths: expected one or more positive values, got {bandwidths!r}")
  return _loo_nll(_cells(u, correct), grid)


def _table(cells: _Cells, bandwidth: float):
  """Knots at NUM_CELLS evenly spaced calibration scores, first and last included."""
  num = cells.sorted_u.shape[0]
  centre = (np.arange(NUM_CELLS) + 0.5) / NUM_CELLS
  position = np.round(np.linspace(0, num - 1, min(num, NUM_CELLS))).astype(np.int64)
  group = np.searchsorted(cells.group_start, position, side="right") - 1
  group = np.unique(group)  # tied scores are one knot, at their mid-rank
  knots, rank = cells.sorted_u[cells.group_start[group]], cells.group_rank[group]
  bandwidth = np.array([bandwidth])
  hit_sum, weight_sum = _window_sums(np.stack([cells.hits, cells.counts]), bandwidth)[0]
  square_sum = _window_sums(cells.counts[None], bandwidth, power=2)[0, 0]
  hit_sum, weight_sum, square_sum = (
    np.maximum(np.interp(rank, centre, s), 0.0) for s in (hit_sum, weight_sum, square_sum)
  )
  hit_sum = np.minimum(hit_sum, weight_sum)
  prob = binning.calibrated_prob(hit_sum, weight_sum, np.float64(cells.prior))
  effective = (weight_sum + 1) ** 2 / (square_sum + 1)
  return table.pad(knots, prob, effective)


def _checked_bandwidth(bandwidth) -> float | None:
  if bandwidth is None:
    return None
  try:
    number = float(bandwidth)
  except (TypeError, ValueError):
    number = float("nan")
  if isinstance(bandwidth, bool) or not (np.isfinite(number) and number > 0):
    raise ValueError(f"bandwidth: expected a positive number or None, got {bandwidth!r}")
  return number


def fit(u: ArrayLike, correct: ArrayLike, bandwidth: float | None = None) -> KernelModel:
  """Fits the kernel estimate of P(correct | U) on [N] scores ``u`` and events ``correct``.

  Args:
    bandwidth: the window's standard deviation in rank units (e.g. 0.02), or None: the
      value of ``BANDWIDTHS`` with the smallest leave-one-out NLL (the first on ties).
  """
  bandwidth = _checked_bandwidth(bandwidth)
  u, correct = base.host_scores("kde.fit", u, correct)
  cells = _cells(u, correct)
  if bandwidth is None:
    grid = np.asarray(BANDWIDTHS)
    bandwidth = float(grid[np.argmin(_loo_nll(cells, grid))])
  return _on_device(*_table(cells, bandwidth), cells.prior, bandwidth)


def _on_device(*fields) -> KernelModel:
  # Host values moved as they are: jnp conversions would compile a small program each.
  return KernelModel(*jax.device_put([np.asarray(x, np.float32) for x in fields]))


def predict(model: KernelModel, u: ArrayLike) -> jax.Array:
  """[N] float32 P(correct) of scores ``u``: linear between knots."""
  validation.instance("model", model, KernelModel, "kde.KernelModel from kde.fit")
  return table.interpolate(validation.float_array("u", u, 1), model.knots, model.prob)


@jax.jit
def _interval(model: KernelModel, u: jax.Array, z: jax.Array):
  p = table.interpolate(u, model.knots, model.prob)
  n = table.interpolate(u, model.knots, model.effective_count)
  shrink = 1 + z**2 / n
  centre = (p + z**2 / (2 * n)) / shrink
  half = z / shrink * jnp.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
  # Wilson's interval holds p, but rounding can leave it just out.
  lower, upper = jnp.minimum(centre - half, p), jnp.maximum(centre + half, p)
  return jnp.clip(lower, 0.0, 1.0), jnp.clip(upper, 0.0, 1.0)


def predict_interval(
  model: KernelModel, u: ArrayLike, delta: float = 0.05
) -> tuple[jax.Array, jax.Array]:
  """(lower, upper), each [N] float32: Wilson's pointwise 1 - delta band for P(correct | u),
  with ``effective_count`` as n (the smoothing bias is not included)."""
  validation.instance("model", model, KernelModel, "kde.KernelModel from kde.fit")
  u = validation.float_array("u", u, 1)
  delta = validation.probability("delta", delta)
  # From the lower tail: 1 - delta / 2 rounds to 1 below delta = 1e-16.
  half = max(delta / 2, math.ulp(0.0))
  z = np.float32(-statistics.NormalDist().inv_cdf(half))  # on the host: no program
  return _interval(model, u, z)


to_dict = table.to_json  # the fitted model as JSON values (``from_dict`` reads it back exactly)


def from_dict(d, source: str) -> KernelModel:
  """A ``KernelModel`` from ``to_dict``'s values, each checked."""
  knots, prob, effective = table.read_knots(d, source, "prob", "effective_count")
  if np.any((prob < 0) | (prob > 1)):
    raise ValueError(f"{source}: field 'prob' must lie in [0, 1]")
  if np.any(effective <= 0):
    raise ValueError(f"{source}: field 'effective_count' must be positive")
  prior = base.read_number(d, "prior", source, 0.0, 1.0)
  bandwidth = base.read_number(d, "bandwidth", source, 0.0, np.inf)
  if bandwidth == 0:
    raise ValueError(f"{source}: field 'bandwidth' must be positive, got 0")
  return _on_device(knots, prob, effective, prior, bandwidth)


def _fit_evidence(evidence: base.Evidence, *, bandwidth: float | None = None) -> KernelModel:
  return fit(evidence.u, evidence.correct, bandwidth)


ESTIMATOR = base.Estimator(
  name="kde",
  needs="scores",
  fit=_fit_evidence,
  predict=lambda model, evidence: predict(model, evidence.u),
  to_dict=to_dict,
  from_dict=from_dict,
  options=("bandwidth",),
  option_checks={"bandwidth": _checked_bandwidth},
  predict_interval=lambda model, evidence, delta: predict_interval(model, evidence.u, delta),
)
