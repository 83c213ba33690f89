"""The smooth ECE (Błasiok & Nakkiran 2023): a calibration error without bins."""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax.core import validation

# A grid of _SMOOTH_GRID + 1 points over [0, 1], 8x finer than the smallest bandwidth.
_SMOOTH_GRID = 2**13
_SMOOTH_MIN_SIGMA = 1e-3  # relplot's floor on the bandwidth search
_SMOOTH_STEPS = 24  # bisection halvings: the final bracket is 6e-8 wide


def _grid_density(values: jax.Array, prob: jax.Array) -> jax.Array:
  """[G + 1] density of masses ``values`` at ``prob``, split linearly between grid points
  and divided by the trapezoid weight there, so the trapezoid rule integrates it back."""
  position = prob * _SMOOTH_GRID
  left = jnp.clip(jnp.floor(position).astype(jnp.int32), 0, _SMOOTH_GRID - 1)
  frac = position - left
  mass = jax.ops.segment_sum(
    jnp.concatenate([values * (1 - frac), values * frac]),
    jnp.concatenate([left, left + 1]),
    _SMOOTH_GRID + 1,
  )
  return mass / _trapezoid_weights()


def _trapezoid_weights() -> jax.Array:
  weights = jnp.full(_SMOOTH_GRID + 1, 1.0 / _SMOOTH_GRID)
  return weights.at[jnp.array([0, -1])].set(0.5 / _SMOOTH_GRID)


def _reflected_smooth(spectrum: jax.Array, sigma: jax.Array) -> jax.Array:
  """Densities convolved with the Gaussian reflected at 0 and 1: on the period-2 even
  extension, the Fourier factor exp(-2 pi^2 sigma^2 xi^2) at frequency xi = k / 2."""
  xi = jnp.arange(spectrum.shape[0]) / 2.0
  smoothed = jnp.fft.irfft(spectrum * jnp.exp(-2 * (jnp.pi * sigma * xi) ** 2), 2 * _SMOOTH_GRID)
  return smoothed[: _SMOOTH_GRID + 1]


@jax.jit
def _smooth_ece(prob, correct):
  density = _grid_density(correct.astype(prob.dtype) - prob, prob)
  even = jnp.concatenate([density, density[-2:0:-1]])  # period 2
  spectrum = jnp.fft.rfft(even)
  weights = _trapezoid_weights()

  def at_bandwidth(sigma):
    return jnp.sum(weights * jnp.abs(_reflected_smooth(spectrum, sigma))) / prob.shape[0]

  def halve(_, bracket):
    low, high = bracket
    mid = 0.5 * (low + high)
    below_fixed_point = at_bandwidth(mid) > mid
    return jnp.where(below_fixed_point, mid, low), jnp.where(below_fixed_point, high, mid)

  start = (jnp.float32(_SMOOTH_MIN_SIGMA), jnp.float32(1.0))
  _, sigma = jax.lax.fori_loop(0, _SMOOTH_STEPS, halve, start)
  return at_bandwidth(sigma)


def smooth_ece(prob: ArrayLike, correct: ArrayLike) -> float:
  """Smooth ECE (Błasiok & Nakkiran 2023) of [N] P(correct) predictions, no bins.
  smECE_sigma = integral over t in [0, 1] of |sum_i K_sigma(t, p_i) (correct_i - p_i)| / N,
  with K_sigma the Gaussian kernel reflected at 0 and 1, at the bandwidth where
  smECE_sigma = sigma (bisection on [1e-3, 1]), on a grid of 2^13 + 1 points."""
  prob, correct = validation.score_and_event("prob", prob, correct, probability=True)
  return float(_smooth_ece(prob.astype(jnp.float32), correct))
