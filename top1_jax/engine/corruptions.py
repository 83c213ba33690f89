"""A corruption suite in the manner of CIFAR-10-C / MNIST-C, made on device, by seed.

After Hendrycks & Dietterich (2019), "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations": each corruption has five severities, whose parameters
below are those of their CIFAR-10-C reference code (``make_cifar_c.py``), chosen for
32x32 CIFAR images; on 28x28 Fashion-MNIST the same numbers are used unscaled.

==============  ==================================  ================================  ======
name            what (x in [0, 1], per image)       severities 1-5                    key
==============  ==================================  ================================  ======
gaussian_noise  x + c·N(0, 1)                       c = .04, .06, .08, .09, .10       yes
shot_noise      Poisson(c·x) / c                    c = 500, 250, 100, 75, 50         yes
impulse_noise   salt-and-pepper on a fraction c     c = .01, .02, .03, .05, .07       yes
                of the values (half 1, half 0)
speckle_noise   x + x·c·N(0, 1)                     c = .06, .10, .12, .16, .20       yes
gaussian_blur   Gaussian filter, σ = c pixels,      c = .4, .6, .7, .8, 1             no
                radius ⌊4σ + ½⌋, edges repeated
contrast        (x − mean) · c + mean, per channel  c = .75, .5, .4, .3, .15          no
brightness      V + c in HSV, V clipped to [0, 1]   c = .05, .1, .15, .2, .3          no
pixelate        box down to ⌊c·H⌋ x ⌊c·W⌋, back up  c = .95, .9, .85, .75, .65        no
==============  ==================================  ================================  ======

Every output is clipped to [0, 1]; severity 0 is exactly the identity. Where this
departs from the reference:

* speckle_noise is the eighth, one of CIFAR-10-C's extra corruptions: one line of the
  reference, defined for any number of channels, and unlike the other noises it is
  multiplicative, so the background (0 in Fashion-MNIST) stays clean: a shift the
  additive noises cannot make. (saturate means nothing on grey images; zoom blur,
  elastic, fog and defocus need resampling or kernels the reference takes from
  scipy / OpenCV with less simple definitions.)
* brightness: HSV keeps hue and saturation, so adding c to V = max over channels
  scales every channel by V'/V (a black pixel becomes grey V'); computed so, without
  the HSV round trip. On grey images it is x + c, clipped.
* pixelate: the reference resizes with PIL's BOX filter, which weighs whole source
  pixels by their centres; here downsampling averages by exact overlap (area) and
  upsampling takes the nearest coarse pixel.
* shot_noise draws Poisson counts exactly below a mean of ``POISSON_EXACT_BELOW`` (30)
  and by a rounded normal above it (``poisson``), faster on a CPU than
  ``jax.random.poisson``; the reference's NumPy draws are exact.
* impulse_noise, as skimage's ``random_noise(mode="s&p")``, hits each value
  (channel) independently.
* 8 bits: the reference stores every corrupted image as ``np.uint8(255 * x)``, which
  truncates (never rounds): each value drops to the multiple of 1/255 at or below it,
  up to 1/255 darker. Here the result stays float unless ``quantize=True``, which
  truncates the same way (``floor(255 x) / 255``, after the clip).

Randomness: image ``i`` of a batch uses ``jax.random.fold_in(key, first_index + i)``,
so a result does not depend on the batch size or how a data set is cut in chunks
(pass each chunk's ``first_index``). For the same key the noise draws are shared
across severities, so a higher severity of gaussian, speckle or impulse noise
corrupts the same image more.

Public API: ``corrupt(name, images, key, severity, first_index=0, quantize=False)`` and
``REGISTRY[name](images, key, severity, first_index=0, quantize=False)``; ``names()``;
``PARAMETERS``; ``poisson(key, lam)``.
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
  "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
  "shot_noise": (500, 250, 100, 75, 50),
  "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
  "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),
  "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
  "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
  "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
  "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
}


def _gaussian_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  return x + c * jax.random.normal(key, x.shape, x.dtype)


# Poisson draws: exact (inversion) below this mean, a rounded normal above it.
POISSON_EXACT_BELOW = 30.0
_POISSON_STEPS = 80  # P(Poisson(30) > 80) < 1e-13


def poisson(key: jax.Array, lam: jax.Array) -> jax.Array:
  """Poisson draws of mean ``lam`` (any shape, float, >= 0), as floats of ``lam``'s dtype.

  Below ``POISSON_EXACT_BELOW`` by inversion of the CDF with one uniform, unrolled into
  one fused elementwise program over materialized draws; above it ``round(N(lam, lam))``,
  clipped at 0 (the skewness left out is 1/sqrt(lam) < 0.19). Faster on a CPU than
  ``jax.random.poisson``'s rejection loops (benchmarks/bench_corruptions.py).
  """
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
  u = jax.random.uniform(key, x.shape, x.dtype)
  # u < c/2: salt; c/2 <= u < c: pepper. A higher c keeps the lower one's hits.
  return jnp.where(u < c / 2, 1.0, jnp.where(u < c, 0.0, x)).astype(x.dtype)


def _speckle_noise(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  return x + x * c * jax.random.normal(key, x.shape, x.dtype)


def _gaussian_kernel(sigma: float) -> np.ndarray:
  """scipy.ndimage's 1-D Gaussian (truncate = 4): ``[2r + 1]`` weights summing to 1."""
  radius = int(4.0 * sigma + 0.5)
  taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
  return taps / taps.sum()


def _filter_axis(x: jax.Array, taps: np.ndarray, axis: int) -> jax.Array:
  """``x`` convolved with symmetric ``taps`` along ``axis``, edges repeated (mode nearest)."""
  radius, size = len(taps) // 2, x.shape[axis]
  pad = [(0, 0)] * x.ndim
  pad[axis] = (radius, radius)
  padded = jnp.pad(x, pad, mode="edge")
  shifted = (jax.lax.slice_in_dim(padded, k, k + size, axis=axis) for k in range(len(taps)))
  return sum(float(w) * s for w, s in zip(taps, shifted, strict=True))


def _gaussian_blur(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  taps = _gaussian_kernel(c)
  return _filter_axis(_filter_axis(x, taps, 0), taps, 1)


def _contrast(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  means = jnp.mean(x, axis=(0, 1), keepdims=True)
  return (x - means) * c + means


def _brightness(x: jax.Array, key: jax.Array, c: float) -> jax.Array:
  del key
  value = jnp.max(x, axis=-1, keepdims=True)
  brighter = jnp.clip(value + c, 0.0, 1.0)
  # HSV with hue and saturation fixed: RGB scales with V; black (S = 0) turns grey.
  ratio = brighter / jnp.where(value > 0, value, 1.0)
  return jnp.where(value > 0, x * ratio, brighter)


def _box_down(size: int, coarse: int) -> np.ndarray:
  """``[coarse, size]``: each coarse pixel the overlap-weighted mean of the fine ones."""
  edges = np.arange(coarse + 1) * size / coarse
  fine = np.arange(size)
  overlap = np.minimum(edges[1:, None], fine + 1) - np.maximum(edges[:-1, None], fine)
  weights = np.clip(overlap, 0.0, None)
  return weights / weights.sum(axis=1, keepdims=True)


def _nearest_up(coarse: int, size: int) -> np.ndarray:
  """``[size, coarse]``: each fine pixel copies the coarse pixel under its centre."""
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
  """The corruptions' names, in the table's order."""
  return tuple(PARAMETERS)


# Their parameter sets a kernel's or a grid's size, so one program per severity; the
# others take it as an argument: one program per corruption for all five severities.
_SHAPING = ("gaussian_blur", "pixelate")


@functools.partial(jax.jit, static_argnames=("name", "static_c", "quantize"))
def _corrupt(
  images: jax.Array,
  key: jax.Array,
  first_index: jax.Array,
  c,
  name: str,
  static_c,
  quantize: bool,
) -> jax.Array:
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
  """Corrupts every image by ``name`` at ``severity`` (one program per name, and per
  severity for gaussian_blur and pixelate, whose parameter sets a size).

  Args:
    name: one of ``names()``.
    images: ``[B, H, W]`` or ``[B, H, W, C]`` float in [0, 1].
    key: a JAX PRNG key (``jax.random.key(seed)``); unused by the deterministic ones.
    severity: 0 (the identity) to 5.
    first_index: the index of ``images[0]`` in the whole data set, so that chunks of a
      data set corrupted apart equal the data set corrupted at once.
    quantize: store as CIFAR-10-C does, 8 bits by truncation: ``floor(255 x) / 255``
      of the clipped result, up to 1/255 below it (severity 0 stays the identity).

  Returns:
    ``images``' shape and dtype, clipped to [0, 1] (multiples of 1/255 if ``quantize``).
  """
  if name not in _PER_IMAGE:
    raise ValueError(f"name: expected one of {', '.join(names())}, got {name!r}")
  batch = shifts.check_images("images", images)
  if not isinstance(key, jax.Array):
    raise ValueError(
      f"key: expected a JAX PRNG key such as jax.random.key(seed), got {type(key).__name__}"
    )
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
