"""Out-of-distribution images shaped like a model's inputs, made on device, by seed.

Inputs the model never saw, for the in- vs out-of-distribution comparison of the shift
protocol (Ovadia et al. 2019): each function returns ``[num, H, W, C]`` float32 in
[0, 1], the shape of the dataset the model was trained on (Fashion-MNIST
``(28, 28, 1)``, CIFAR ``(32, 32, 3)``).

* ``resize(images, shape)``: a real image set of another size (scikit-learn's 8x8
  digits, loaded by ``top1_jax.io.ood_sets``) brought to ``shape``: ``jax.image.resize``
  with the ``"linear"`` (bilinear, triangle) kernel, whose weights are non-negative and
  sum to one, so values stay in [0, 1] and a constant image stays constant (cubic
  kernels overshoot); a grey image is replicated to ``C`` channels.
* ``uniform_noise(key, num, shape)``: i.i.d. uniform [0, 1) pixels. Image ``i`` uses
  ``jax.random.fold_in(key, first_index + i)``, as ``engine.corruptions`` does, so an
  image does not depend on ``num`` or on how a set is cut in chunks.

The file side (which sets exist, reading the digits) is ``top1_jax.io.ood_sets``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation
from top1_jax.engine import shifts

RESIZE_METHOD = "linear"
"""``jax.image.resize``'s kernel for ``resize``: convex weights keep [0, 1] and constants."""


def check_shape(shape) -> tuple[int, int, int]:
  """``shape`` as ``(H, W, C)`` of positive Python ints.

  Raises:
    ValueError: not a sequence of three positive integers.
  """
  try:
    dims = tuple(shape)
  except TypeError:
    dims = None
  if (
    dims is None
    or len(dims) != 3
    or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims)
    or min(dims) < 1
  ):
    raise ValueError(f"shape: expected (height, width, channels) of positive ints, got {shape!r}")
  return tuple(int(d) for d in dims)


@functools.partial(jax.jit, static_argnames=("shape",))
def _resize(images: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
  height, width, channels = shape
  images = images.astype(jnp.float32)
  resized = jax.image.resize(
    images, (images.shape[0], height, width, images.shape[3]), method=RESIZE_METHOD
  )
  if images.shape[3] != channels:
    resized = jnp.broadcast_to(resized, resized.shape[:3] + (channels,))
  # The weights sum to one up to rounding: keep the result in [0, 1] exactly.
  return jnp.clip(resized, 0.0, 1.0)


def resize(images, shape) -> jax.Array:
  """Images brought to ``shape`` by bilinear interpolation, grey replicated to channels.

  Args:
    images: ``[N, h, w]`` or ``[N, h, w, c]`` float in [0, 1] (not checked, that would
      wait for the device); ``c`` is 1 or ``shape``'s ``C``.
    shape: ``(H, W, C)``, positive ints.

  Returns:
    ``[N, H, W, C]`` float32 in [0, 1].

  Raises:
    ValueError: images not float of rank 3 or 4, a bad shape, or channels that are
      neither 1 nor ``C``.
  """
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
  """``num`` images of i.i.d. uniform [0, 1) pixels, image ``i`` keyed by
  ``fold_in(key, first_index + i)``.

  Args:
    key: a ``jax.random`` key (new-style ``jax.random.key`` or a raw ``PRNGKey``).
    num: how many images, a positive int.
    shape: ``(H, W, C)``, positive ints.
    first_index: the index of the first image (a chunk's offset in a larger set), >= 0.

  Returns:
    ``[num, H, W, C]`` float32 in [0, 1).

  Raises:
    ValueError: a bad key, ``num``, ``shape`` or ``first_index``.
  """
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  is_key = jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()
  if not (is_key or (key.dtype == jnp.uint32 and key.shape == (2,))):
    raise ValueError(
      f"key: expected a jax.random key, got dtype {key.dtype} shape {tuple(key.shape)}"
    )
  num = validation.positive_int("num", num)
  first_index = validation.positive_int("first_index", first_index, minimum=0, maximum=2**32 - 1)
  return _uniform_noise(key, jnp.uint32(first_index), num, check_shape(shape))
