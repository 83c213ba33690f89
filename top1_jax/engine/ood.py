"""Out-of-distribution images shaped like a model's inputs, made on device, by seed.

For the shift protocol's in- vs out-of-distribution comparison (Ovadia et al. 2019):
[num, H, W, C] float32 in [0, 1]. Reading the sets' files is ``top1_jax.io.ood_sets``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation
from top1_jax.engine import shifts


def check_shape(shape) -> tuple[int, int, int]:
  """``shape`` as ``(H, W, C)`` of positive Python ints."""
  try:
    dims = tuple(shape)
  except TypeError:
    dims = ()
  ints = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims)
  if len(dims) != 3 or not ints or min(dims) < 1:
    raise ValueError(f"shape: expected (height, width, channels) of positive ints, got {shape!r}")
  return tuple(int(d) for d in dims)


@functools.partial(jax.jit, static_argnames=("shape",))
def _resize(images: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
  height, width, channels = shape
  images = images.astype(jnp.float32)
  # Bilinear: convex weights keep [0, 1] and constant images (cubic kernels overshoot).
  resized_shape = (images.shape[0], height, width, images.shape[3])
  resized = jax.image.resize(images, resized_shape, method="linear")
  if images.shape[3] != channels:
    resized = jnp.broadcast_to(resized, resized.shape[:3] + (channels,))
  # The weights sum to one up to rounding: keep the result in [0, 1] exactly.
  return jnp.clip(resized, 0.0, 1.0)


def resize(images, shape) -> jax.Array:
  """Images [N, h, w(, c)] brought to ``shape`` (H, W, C) bilinearly, grey replicated to C."""
  images = shifts.check_images("images", images)
  shape = check_shape(shape)
  if images.shape[3] not in (1, shape[2]):
    raise ValueError(
      f"images: expected 1 or {shape[2]} channels (shape's C), got shape {images.shape}"
    )
  return _resize(images, shape)


@functools.partial(jax.jit, static_argnames=("num", "shape"))
def _uniform_noise(
  key: jax.Array, first_index: jax.Array, num: int, shape: tuple[int, int, int]
) -> jax.Array:
  def one(index):
    return jax.random.uniform(jax.random.fold_in(key, index), shape, jnp.float32)

  return jax.vmap(one)(first_index + jnp.arange(num, dtype=jnp.uint32))


def uniform_noise(key: jax.Array, num: int, shape, first_index: int = 0) -> jax.Array:
  """``num`` images of i.i.d. uniform [0, 1) pixels of ``shape`` (H, W, C).
  Image i is keyed by ``fold_in(key, first_index + i)``: independent of how a set is cut."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  is_key = jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()
  if not (is_key or (key.dtype == jnp.uint32 and key.shape == (2,))):
    raise ValueError(
      f"key: expected a jax.random key, got dtype {key.dtype} shape {tuple(key.shape)}"
    )
  num = validation.positive_int("num", num)
  first_index = validation.positive_int("first_index", first_index, minimum=0, maximum=2**32 - 1)
  return _uniform_noise(key, jnp.uint32(first_index), num, check_shape(shape))
