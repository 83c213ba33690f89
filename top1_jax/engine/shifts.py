"""Ovadia et al.'s (2019) geometric shifts of an image batch: rotation and translation.

Images are ``[B, H, W]`` or ``[B, H, W, C]`` floats in [0, 1] (Fashion-MNIST
``[B, 28, 28, 1]``, CIFAR ``[B, 32, 32, 3]``); each function returns the same shape
and dtype, computed on device, and is exactly the identity at 0.

* ``rotate(images, degrees)``: counter-clockwise (as ``np.rot90``) about the image
  centre ``((H - 1) / 2, (W - 1) / 2)``, bilinear, pixels from outside the image = 0.
  cos and sin are taken in float64 on the host and snapped at multiples of 90°, so
  0°, 90° (square images), 180° and 270° land on grid points: they equal
  ``np.rot90`` exactly.
* ``translate(images, pixels)``: along x (the width axis), right for ``pixels > 0``,
  the vacated columns filled with the background 0 (``np.roll`` with zero fill).

The grids of the Ovadia et al. benchmark are ``ROTATION_DEGREES`` (0-180° in 15°
steps) and ``TRANSLATION_PIXELS`` (0-14 px). The corruption suite (noises, blurs,
contrast, ...) is ``engine.corruptions``.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation

ROTATION_DEGREES = tuple(range(0, 181, 15))
TRANSLATION_PIXELS = tuple(range(0, 15))


def check_images(name: str, images) -> jax.Array:
  """``images`` as a ``[B, H, W, C]`` float array (a channel axis added to ``[B, H, W]``).

  Values are not checked (that would wait for the device): the functions expect [0, 1].

  Raises:
    ValueError: not an array of floats of rank 3 or 4, or an empty image.
  """
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
  cos, sin = (
    round(v) if abs(v - round(v)) < 1e-12 else v for v in (math.cos(radians), math.sin(radians))
  )
  return float(cos), float(sin)


def _rotate_one(image: jax.Array, cos: float, sin: float) -> jax.Array:
  """One ``[H, W, C]`` image rotated by the angle of (cos, sin), bilinear, zero outside."""
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
  return jax.vmap(lambda channel: sample(channel), in_axes=2, out_axes=2)(image)


@jax.jit
def _rotate(images: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  work = images.astype(compute_dtype(images.dtype))
  rotated = jax.vmap(_rotate_one, in_axes=(0, None, None))(work, cos, sin)
  return jnp.clip(rotated, 0.0, 1.0).astype(images.dtype)


def rotate(images, degrees: float) -> jax.Array:
  """Rotates every image by ``degrees`` counter-clockwise about its centre.

  Args:
    images: ``[B, H, W]`` or ``[B, H, W, C]`` float in [0, 1].
    degrees: the angle, any finite number (Ovadia et al.: ``ROTATION_DEGREES``).

  Returns:
    ``images``' shape and dtype, bilinear, 0 where the source falls outside the image.
  """
  batch = check_images("images", images)
  try:
    degrees = float(degrees)
  except (TypeError, ValueError):
    raise ValueError(f"degrees: expected a number, got {degrees!r}") from None
  if not math.isfinite(degrees):
    raise ValueError(f"degrees: expected a finite angle, got {degrees}")
  dtype = compute_dtype(batch.dtype)
  cos, sin = (jnp.asarray(v, dtype) for v in _cos_sin(degrees))  # one program for every angle
  return _rotate(batch, cos, sin).reshape(jnp.shape(images))


@jax.jit
def _translate(images: jax.Array, pixels: jax.Array) -> jax.Array:
  width = images.shape[2]
  pixels = jnp.clip(pixels, -width, width)  # beyond the width every column is background
  padded = jnp.pad(images, ((0, 0), (0, 0), (width, width), (0, 0)))
  # out[j] = images[j - pixels], found at padded[j - pixels + width]: one program for
  # every shift (the start is traced, the width static).
  return jax.lax.dynamic_slice_in_dim(padded, width - pixels, width, axis=2)


def translate(images, pixels: int) -> jax.Array:
  """Shifts every image ``pixels`` columns along x, filling with the background 0.

  Args:
    images: ``[B, H, W]`` or ``[B, H, W, C]`` float in [0, 1].
    pixels: an integer: right if positive, left if negative; ``|pixels| >= W`` gives
      a blank image (Ovadia et al.: ``TRANSLATION_PIXELS``, 0-14).

  Returns:
    ``images``' shape and dtype: ``out[:, :, j] = images[:, :, j - pixels]`` where that
    column exists, else 0.
  """
  batch = check_images("images", images)
  if isinstance(pixels, bool) or not isinstance(pixels, (int, np.integer)):
    raise ValueError(f"pixels: expected an integer shift, got {pixels!r}")
  pixels = max(-batch.shape[2], min(batch.shape[2], int(pixels)))  # fits int32
  return _translate(batch, jnp.int32(pixels)).reshape(jnp.shape(images))
