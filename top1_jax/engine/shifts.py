"""Geometric shifts of an image batch: two rotations and two translations.

Images are [B, H, W] or [B, H, W, C] floats in [0, 1]; each shift keeps the shape and dtype,
compiles once for all angles or shifts, and is exactly the identity at 0. Rotations turn
counter-clockwise, as ``np.rot90``.
"""

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation

# Ovadia et al.'s grids of rotations and of translations for ``roll``, with the clean 0.
ROTATION_DEGREES = tuple(range(0, 181, 15))
ROLL_PIXELS = tuple(range(0, 27, 2))


def check_images(name: str, images) -> jax.Array:
  """``images`` as a [B, H, W, C] float array; values are not checked (no device wait)."""
  images = jnp.asarray(images)
  if not validation.is_floating(images.dtype):
    raise ValueError(f"{name}: expected float images in [0, 1], got dtype {images.dtype}")
  if images.ndim not in (3, 4):
    raise ValueError(f"{name}: expected shape [B, H, W] or [B, H, W, C], got {images.shape}")
  if images.ndim == 3:
    images = images[..., None]
  if min(images.shape[1:]) < 1:
    raise ValueError(f"{name}: expected images of at least 1 pixel, got shape {images.shape}")
  return images


def compute_dtype(dtype) -> jnp.dtype:
  """float32 for low-precision images (bfloat16, float16), else their own dtype."""
  return jnp.promote_types(dtype, jnp.float32)


def _cos_sin(degrees: float) -> tuple[float, float]:
  radians = math.radians(degrees)
  # Snap float64 rounding (cos 90° = 6e-17) so right angles are exact permutations.
  cos, sin = (math.cos(radians), math.sin(radians))
  return tuple(float(round(v) if abs(v - round(v)) < 1e-12 else v) for v in (cos, sin))


def _rotate_one(image: jax.Array, cos: float, sin: float) -> jax.Array:
  height, width = image.shape[:2]
  centre_row, centre_col = (height - 1) / 2, (width - 1) / 2
  rows, cols = jnp.meshgrid(
    jnp.arange(height, dtype=image.dtype), jnp.arange(width, dtype=image.dtype), indexing="ij"
  )
  y, x = rows - centre_row, cols - centre_col
  # Output pixel (y, x) reads the input at the point rotated back by the angle.
  source = (centre_row + cos * y + sin * x, centre_col - sin * y + cos * x)
  sample = functools.partial(
    jax.scipy.ndimage.map_coordinates, coordinates=source, order=1, mode="constant", cval=0.0
  )
  return jax.vmap(sample, in_axes=2, out_axes=2)(image)


@jax.jit
def _rotate(images: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  work = images.astype(compute_dtype(images.dtype))
  rotated = jax.vmap(_rotate_one, in_axes=(0, None, None))(work, cos, sin)
  return jnp.clip(rotated, 0.0, 1.0).astype(images.dtype)


def _checked_degrees(degrees) -> float:
  try:
    degrees = float(degrees)
  except (TypeError, ValueError):
    raise ValueError(f"degrees: expected a number, got {degrees!r}") from None
  if not math.isfinite(degrees):
    raise ValueError(f"degrees: expected a finite angle, got {degrees}")
  return degrees


def _checked_pixels(pixels) -> int:
  if isinstance(pixels, bool) or not isinstance(pixels, (int, np.integer)):
    raise ValueError(f"pixels: expected an integer shift, got {pixels!r}")
  return int(pixels)


def rotate(images, degrees: float) -> jax.Array:
  """Rotates every image by ``degrees`` about its centre, bilinear, 0 outside (ours)."""
  batch = check_images("images", images)
  degrees = _checked_degrees(degrees)
  dtype = compute_dtype(batch.dtype)
  cos, sin = (jnp.asarray(v, dtype) for v in _cos_sin(degrees))  # one program for every angle
  return _rotate(batch, cos, sin).reshape(jnp.shape(images))


@functools.cache
def _spline_prefilter(size: int) -> np.ndarray:
  """[size, size] float64: samples -> cubic B-spline coefficients, mirrored as SciPy's.
  The inverse of the system SciPy's recursive filter solves: a matmul on device."""
  if size == 1:
    return np.ones((1, 1))
  system = (np.diag(np.full(size, 4.0)) + np.diag(np.ones(size - 1), 1)) / 6
  system += np.diag(np.ones(size - 1), -1) / 6
  system[0, 1] = system[-1, -2] = 2 / 6
  return np.linalg.inv(system)


def _cubic_taps(below: jax.Array, fraction: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  """The [..., 4] coefficient indices and B-spline weights of ``below + fraction``."""
  t, u = fraction, 1 - fraction
  weights = jnp.stack(
    [u**3 / 6, 2 / 3 + 0.5 * t * t * (t - 2), 2 / 3 + 0.5 * u * u * (u - 2), t**3 / 6], axis=-1
  )
  indices = below[..., None] + jnp.arange(-1, 3, dtype=jnp.int32)
  if size == 1:
    return jnp.zeros_like(indices), weights
  period = 2 * size - 2
  indices = jnp.mod(indices, period)
  return jnp.where(indices >= size, period - indices, indices), weights


@jax.jit
def _rotate_cubic(
  images: jax.Array, below: jax.Array, fraction: jax.Array, inside: jax.Array
) -> jax.Array:
  work = images.astype(compute_dtype(images.dtype))
  _, height, width, channels = work.shape
  highest = jax.lax.Precision.HIGHEST  # GPUs would multiply float32 in TF32
  along_rows, along_cols = (jnp.asarray(_spline_prefilter(n), work.dtype) for n in (height, width))
  coefficients = jnp.einsum("ih,bhwc,jw->bijc", along_rows, work, along_cols, precision=highest)
  row_indices, row_weights = _cubic_taps(below[0], fraction[0].astype(work.dtype), height)
  col_indices, col_weights = _cubic_taps(below[1], fraction[1].astype(work.dtype), width)
  flat = coefficients.reshape(-1, height * width, channels)
  rotated = jnp.zeros_like(flat)
  for a in range(4):  # 16 taps, each a gather of the batch: no [B, H, W, 16, C] array
    for b in range(4):
      taps = jnp.take(flat, (row_indices[..., a] * width + col_indices[..., b]).ravel(), axis=1)
      weight = (row_weights[..., a] * col_weights[..., b]).ravel()
      rotated = rotated + taps * weight[None, :, None]
  rotated = jnp.where(inside.ravel()[None, :, None], rotated, 0.0)
  return rotated.reshape(work.shape).astype(images.dtype)


def _cubic_sources(degrees: float, height: int, width: int) -> tuple[np.ndarray, ...]:
  """Where each cropped output pixel reads the input, in float64 as SciPy: [2, H, W] whole
  part and fraction of (row, col), and [H, W] whether it lies inside the image (the crop is
  half a pixel off centre where the canvas is odd and the image even, as Ovadia et al.'s)."""
  cos, sin = _cos_sin(degrees)
  matrix = np.array([[cos, sin], [-sin, cos]])  # output (row, col) -> input (row, col)
  shape = np.array([height, width])
  corners = matrix @ np.array([[0, 0, height, height], [0, width, 0, width]])
  canvas = (np.ptp(corners, axis=1) + 0.5).astype(int)
  first = canvas // 2 - shape // 2
  offset = (shape - 1) / 2 + matrix @ (first - (canvas - 1) / 2)
  pixels = np.stack(np.meshgrid(np.arange(height), np.arange(width), indexing="ij"))
  sources = np.einsum("ij,jhw->ihw", matrix, pixels) + offset[:, None, None]
  # mode="constant": a source outside [0, H - 1] x [0, W - 1] is 0, with no tolerance.
  inside = np.all((sources >= 0) & (sources <= (shape - 1)[:, None, None]), axis=0)
  below = np.floor(sources)
  return below.astype(np.int32), sources - below, inside


def rotate_cubic(images, degrees: float) -> jax.Array:
  """Rotates every image as Ovadia et al. (2019): ``scipy.ndimage.rotate``, then a centre crop.
  ``scipy.ndimage.rotate(images, degrees, axes=(1, 2), reshape=True)`` on device, to
  float32 rounding. Not clipped: the spline overshoots [0, 1] near edges, as theirs does."""
  batch = check_images("images", images)
  degrees = _checked_degrees(degrees)
  if degrees % 360 == 0:
    return jnp.asarray(images)  # SciPy's result too, to the last bit
  # Host coordinates as arguments: one program for every angle, decided in float64 as SciPy.
  rotated = _rotate_cubic(batch, *_cubic_sources(degrees, *batch.shape[1:3]))
  return rotated.reshape(jnp.shape(images))


@jax.jit
def _translate(images: jax.Array, pixels: jax.Array) -> jax.Array:
  width = images.shape[2]  # ``translate`` clips |pixels| to it: beyond, all is background
  padded = jnp.pad(images, ((0, 0), (0, 0), (width, width), (0, 0)))
  # out[j] = padded[j - pixels + width], a traced start: one program for every shift.
  return jax.lax.dynamic_slice_in_dim(padded, width - pixels, width, axis=2)


def translate(images, pixels: int) -> jax.Array:
  """Shifts every image ``pixels`` columns along x (right if positive), filling with 0 (ours)."""
  batch = check_images("images", images)
  pixels = max(-batch.shape[2], min(batch.shape[2], _checked_pixels(pixels)))  # fits int32
  return _translate(batch, jnp.int32(pixels)).reshape(jnp.shape(images))


@jax.jit
def _roll(images: jax.Array, pixels: jax.Array) -> jax.Array:
  return jnp.roll(images, pixels, axis=2)  # a traced shift: one program for every shift


def roll(images, pixels: int) -> jax.Array:
  """``np.roll(images, pixels, axis=2)``: a shift along x with wrap-around, as Ovadia et al."""
  batch = check_images("images", images)
  pixels = _checked_pixels(pixels) % batch.shape[2]  # fits int32
  return _roll(batch, jnp.int32(pixels)).reshape(jnp.shape(images))


GEOMETRIC: dict[str, Callable[..., jax.Array]] = {
  shift.__name__: shift for shift in (rotate, translate, rotate_cubic, roll)
}
"""Every geometric shift by name: ``GEOMETRIC[name](images, degrees or pixels)``."""
