"""A corruption suite in the manner of CIFAR-10-C / MNIST-C, made on device, by seed.

Hendrycks & Dietterich (2019)'s five severities and CIFAR-10-C parameters, unscaled on
28x28 images. Outputs are clipped to [0, 1]; severity 0 is exactly the identity. For one key
the noise draws are shared across severities: a higher severity corrupts the same image more.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation
from top1_jax.engine import shifts

SEVERITIES = 5

PARAMETERS: dict[str, tuple[float, ...]] = {
  "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # x + c N(0, 1)
  "shot_noise": (500, 250, 100, 75, 50),  # Poisson(c x) / c
  "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),  # salt and pepper on a fraction c
  # x + x c N(0, 1): CIFAR-10-C's extra; multiplicative, so a 0 background stays clean
  "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),
  "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),  # sigma = c pixels, edges repeated
  "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # (x - mean) c + mean, per channel
  "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # V + c in HSV, V clipped to [0, 1]
  "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),  # down to c H x c W by area, nearest back up
}


def _gaussian_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  return x + c * jax.random.normal(key, x.shape, x.dtype)


# Poisson draws: exact (inversion) below this mean, a rounded normal above it.
POISSON_EXACT_BELOW = 30.0
_POISSON_STEPS = 80  # P(Poisson(30) > 80) < 1e-13


def poisson(key: jax.Array, lam: jax.Array) -> jax.Array:
  """Poisson draws of mean ``lam`` (float, >= 0): exact below ``POISSON_EXACT_BELOW``, above
  it ``round(N(lam, lam))`` clipped at 0. Faster on a CPU than ``jax.random.poisson``."""
  uniform_key, normal_key = jax.random.split(key)
  u = jax.random.uniform(uniform_key, lam.shape, lam.dtype)
  normal = jax.random.normal(normal_key, lam.shape, lam.dtype)
  # Materialized first: XLA would otherwise recompute the random bits in every step.
  u, normal, lam = jax.lax.optimization_barrier((u, normal, lam))
  small = jnp.minimum(lam, POISSON_EXACT_BELOW)
  term = jnp.exp(-small)
  cdf, count = term, jnp.zeros_like(lam)
  for k in range(1, _POISSON_STEPS + 1):
    count = count + (cdf < u)
    term = term * small / k
    cdf = cdf + term
  large = jnp.maximum(jnp.round(lam + jnp.sqrt(lam) * normal), 0.0)
  return jnp.where(lam < POISSON_EXACT_BELOW, count, large)


def _shot_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  return poisson(key, x * c) / c


def _impulse_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  u = jax.random.uniform(key, x.shape, x.dtype)  # per value (channel), as skimage's s&p
  # u < c/2: salt; c/2 <= u < c: pepper. A higher c keeps the lower one's hits.
  return jnp.where(u < c / 2, 1.0, jnp.where(u < c, 0.0, x)).astype(x.dtype)


def _speckle_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  return x + x * c * jax.random.normal(key, x.shape, x.dtype)


def _filter_axis(x: jax.Array, taps: np.ndarray, axis: int) -> jax.Array:
  """``x`` convolved with symmetric ``taps`` along ``axis``, edges repeated."""
  radius, size = len(taps) // 2, x.shape[axis]
  pad = [(0, 0)] * x.ndim
  pad[axis] = (radius, radius)
  padded = jnp.pad(x, pad, mode="edge")
  shifted = (jax.lax.slice_in_dim(padded, k, k + size, axis=axis) for k in range(len(taps)))
  return sum(float(w) * s for w, s in zip(taps, shifted, strict=True))


def _gaussian_blur(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  radius = int(4.0 * c + 0.5)  # scipy.ndimage's 1-D Gaussian (truncate = 4)
  taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / c) ** 2)
  taps = taps / taps.sum()
  return _filter_axis(_filter_axis(x, taps, 0), taps, 1)


def _contrast(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  means = jnp.mean(x, axis=(0, 1), keepdims=True)
  return (x - means) * c + means


def _brightness(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  value = jnp.max(x, axis=-1, keepdims=True)
  brighter = jnp.clip(value + c, 0.0, 1.0)
  # HSV with hue and saturation fixed: RGB scales with V = max; black (S = 0) turns grey.
  ratio = brighter / jnp.where(value > 0, value, 1.0)
  return jnp.where(value > 0, x * ratio, brighter)


def _box_down(size: int, coarse: int) -> np.ndarray:
  """[coarse, size]: each coarse pixel the overlap-weighted mean of the fine ones.
  (The reference's PIL BOX filter weighs whole source pixels by their centres.)"""
  edges = np.arange(coarse + 1) * size / coarse
  fine = np.arange(size)
  overlap = np.minimum(edges[1:, None], fine + 1) - np.maximum(edges[:-1, None], fine)
  weights = np.clip(overlap, 0.0, None)
  return weights / weights.sum(axis=1, keepdims=True)


def _nearest_up(coarse: int, size: int) -> np.ndarray:
  """[size, coarse]: each fine pixel copies the coarse pixel under its centre."""
  source = np.minimum(((np.arange(size) + 0.5) * coarse / size).astype(int), coarse - 1)
  return np.eye(coarse)[source]


def _pixelate(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  height, width = x.shape[:2]
  rows, cols = (
    jnp.asarray(_nearest_up(max(1, int(n * c)), n) @ _box_down(n, max(1, int(n * c))), x.dtype)
    for n in (height, width)
  )
  return jnp.einsum("ih,hwc,jw->ijc", rows, x, cols, precision=jax.lax.Precision.HIGHEST)


_PER_IMAGE: dict[str, Callable[[jax.Array, jax.Array, float], jax.Array]] = {
  "gaussian_noise": _gaussian_noise,
  "shot_noise": _shot_noise,
  "impulse_noise": _impulse_noise,
  "speckle_noise": _speckle_noise,
  "gaussian_blur": _gaussian_blur,
  "contrast": _contrast,
  "brightness": _brightness,
  "pixelate": _pixelate,
}


def names() -> tuple[str, ...]:
  """The corruptions' names, in ``PARAMETERS``' order."""
  return tuple(PARAMETERS)


# Their parameter sets a kernel's or a grid's size: one program per severity, not per name.
_SHAPING = ("gaussian_blur", "pixelate")


@functools.partial(jax.jit, static_argnames=("name", "static_c", "quantize"))
def _corrupt(images, key, first_index, c, name: str, static_c, quantize: bool) -> jax.Array:
  work = images.astype(shifts.compute_dtype(images.dtype))
  indices = first_index + jnp.arange(images.shape[0], dtype=jnp.uint32)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, indices)
  c = static_c if static_c is not None else c.astype(work.dtype)
  corrupted = jnp.clip(jax.vmap(functools.partial(_PER_IMAGE[name], c=c))(work, keys), 0.0, 1.0)
  if quantize:
    # The reference's np.uint8(255 x), a truncation, read back as k / 255: from a table,
    # as XLA may divide by 255 as a multiply by 1/255, a rounding away from k / 255.
    levels = np.arange(256, dtype=work.dtype) / np.asarray(255, work.dtype)
    corrupted = jnp.asarray(levels)[jnp.floor(corrupted * 255).astype(jnp.int32)]
  return corrupted.astype(images.dtype)


def corrupt(
  name: str,
  images,
  key: jax.Array,
  severity: int,
  first_index: int = 0,
  *,
  quantize: bool = False,
) -> jax.Array:
  """Corrupts every image ([B, H, W] or [B, H, W, C] in [0, 1]) by ``name`` at ``severity``.
  Image i uses ``fold_in(key, first_index + i)``, so chunks (each with its ``first_index``)
  equal the whole set. ``quantize``: 8 bits as CIFAR-10-C, ``floor(255 x) / 255``."""
  if name not in _PER_IMAGE:
    raise ValueError(f"name: expected one of {', '.join(names())}, got {name!r}")
  batch = shifts.check_images("images", images)
  validation.instance("key", key, jax.Array, "a JAX PRNG key such as jax.random.key(seed)")
  severity = validation.positive_int("severity", severity, minimum=0, maximum=SEVERITIES)
  first_index = validation.positive_int("first_index", first_index, minimum=0, maximum=2**32 - 1)
  if not isinstance(quantize, (bool, np.bool_)):
    raise ValueError(f"quantize: expected True or False, got {quantize!r}")
  if severity == 0:
    return batch.reshape(jnp.shape(images))
  c = PARAMETERS[name][severity - 1]
  static_c = c if name in _SHAPING else None
  corrupted = _corrupt(
    batch, key, jnp.uint32(first_index), jnp.float32(c), name, static_c, bool(quantize)
  )
  return corrupted.reshape(jnp.shape(images))


REGISTRY: dict[str, Callable[..., jax.Array]] = {
  name: functools.partial(corrupt, name) for name in PARAMETERS
}
