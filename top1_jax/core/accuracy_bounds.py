"""Confidence intervals for a bin's accuracy from its example counts (paper eq. 3)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import validation


def hoeffding_halfwidth(count: ArrayLike, delta: float = 0.05) -> jax.Array:
  """Half-width sqrt(log(2/delta) / (2 count)) of the Hoeffding interval (paper eq. 3).
  With probability >= 1 - delta it holds |p_true - p_empirical|; a ``count`` of 0
  gives +inf."""
  delta = validation.probability("delta", delta)
  count = _counts("count", count)
  return jnp.sqrt(jnp.log(2.0 / delta) / (2.0 * count.astype(jnp.float32)))


def _counts(name: str, value: ArrayLike) -> jax.Array:
  """Whole, non-negative example counts (0-, 1- or 2-D), within int32."""
  arr = validation.as_array(name, value, (0, 1, 2), host=True)
  if not validation.is_traced(arr) and arr.size:
    whole = np.isfinite(arr) & (arr == np.round(arr)) if arr.dtype.kind == "f" else True
    if not np.all(whole) or arr.min() < 0 or arr.max() > np.iinfo(np.int32).max:
      raise ValueError(f"{name}: expected whole counts in [0, 2**31), got {value!r}")
  return arr.astype(np.int32)  # a NumPy array unless traced


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
  """Exact (Clopper–Pearson) two-sided 1 - delta (lower, upper) interval of an accuracy.
  ``hits`` and ``count`` broadcast together; a ``count`` of 0 gives [0, 1]."""
  delta = validation.probability("delta", delta)
  hits = _counts("hits", hits)
  count = _counts("count", count)
  if validation.is_traced(hits) or validation.is_traced(count):
    return _clopper_pearson(hits, count, jnp.float32(delta))
  validation.hits_within_counts("hits", hits, count)
  # Concrete counts: SciPy's float64 Beta quantiles on the host; the jitted bisection
  # is slow to compile (docs/performance.md).
  from scipy import special as scipy_special  # here: a slow import (~0.2 s) few runs need

  hits, count = np.broadcast_arrays(hits.astype(np.float64), count.astype(np.float64))
  with np.errstate(invalid="ignore", divide="ignore"):  # the edge cases are fixed up below
    a, b = hits, count - hits + 1
    lower = scipy_special.betaincinv(a, b, delta / 2)
    # SciPy gives NaN where the quantile is far below 1e-150 (delta = 1e-300): there
    # I_x(a, b) = x^a / (a B(a, b)) to relative order x, solved for x.
    tiny = np.exp((np.log(delta / 2) + np.log(a) + scipy_special.betaln(a, b)) / a)
    lower = np.where(np.isnan(lower), tiny, lower)
    upper = scipy_special.betaincinv(hits + 1, count - hits, 1 - delta / 2)
  lower = np.where((hits == 0) | (count == 0), 0.0, lower).astype(np.float32)
  upper = np.where(hits == count, 1.0, upper).astype(np.float32)
  return jax.device_put(lower), jax.device_put(upper)
