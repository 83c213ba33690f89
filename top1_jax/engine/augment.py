"""Data augmentation on device, inside the jitted training step, by key.

An ``Augmentation`` names the transforms to apply, in ``AUGMENTATIONS``' order,
and is called as ``augmentation(key, images)`` on a [B, H, W] or [B, H, W, C]
batch: image i draws from ``fold_in(fold_in(key, t), i)`` for the transform t
(its index in ``AUGMENTATIONS``), so a batch is augmented the same way for the
same key on any backend and batch order. ``train.train_step`` applies the
state's augmentation to every training batch with a key split from the step's
key; evaluation and prediction never augment.

* ``"crop"``: random crop with zero padding (Krizhevsky et al. 2012, He et al.
  2016 on CIFAR with 4 pixels): the image is padded by ``crop_padding`` zeros on
  every side and an H x W window is taken at a uniform offset in
  [0, 2 * crop_padding] along each axis.
* ``"flip"``: horizontal flip (of the W axis) with probability 1/2.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = [
  "AUGMENTATIONS",
  "NONE",
  "NO_AUGMENTATION",
  "Augmentation",
  "random_crop",
  "random_flip",
  "make",
]

NONE = "none"
"""The name that asks for no augmentation (``make(("none",))``)."""


def random_crop(key: jax.Array, image: jax.Array, padding: int) -> jax.Array:
  """One image [H, W, C] zero-padded by ``padding`` and cropped back to [H, W, C] at a
  uniform random offset (the same for all channels)."""
  height, width = image.shape[0], image.shape[1]
  padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  offsets = jax.random.randint(key, (2,), 0, 2 * padding + 1)
  return jax.lax.dynamic_slice(padded, (offsets[0], offsets[1], 0), (height, width, image.shape[2]))


def random_flip(key: jax.Array, image: jax.Array, padding: int) -> jax.Array:
  """One image [H, W, C] flipped left-right with probability 1/2 (``padding`` unused)."""
  del padding
  return jnp.where(jax.random.bernoulli(key), image[:, ::-1], image)


AUGMENTATIONS: dict[str, Callable[[jax.Array, jax.Array, int], jax.Array]] = {
  "crop": random_crop,
  "flip": random_flip,
}
"""Every augmentation by name: ``fn(key, image [H, W, C], crop_padding) -> image``,
applied in this order."""


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """The transforms of a training run (hashable: a static field of ``TrainState``).

  Attributes:
    names: transforms from ``AUGMENTATIONS``, applied in that registry's order.
    crop_padding: zero pixels added on each side before ``"crop"``.
  """

  names: tuple[str, ...] = ()
  crop_padding: int = 0

  def __bool__(self) -> bool:
    return bool(self.names)

  def __call__(self, key: jax.Array, images: jax.Array) -> jax.Array:
    """Augments a batch (jittable; vmapped over the images).

    Args:
      key: PRNG key of this batch.
      images: [B, H, W] or [B, H, W, C] float.

    Returns:
      The augmented batch, same shape and dtype.
    """
    grayscale = images.ndim == 3
    batch = images[..., None] if grayscale else images
    per_image = jnp.arange(batch.shape[0])
    for index, (name, transform) in enumerate(AUGMENTATIONS.items()):
      if name not in self.names:
        continue
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        jax.random.fold_in(key, index), per_image
      )
      batch = jax.vmap(transform, in_axes=(0, 0, None))(keys, batch, self.crop_padding)
    return batch[..., 0] if grayscale else batch


NO_AUGMENTATION = Augmentation()
"""No augmentation: the batch as it is."""


def make(names, crop_padding: int = 0) -> Augmentation:
  """An ``Augmentation`` from names (``("crop", "flip")``; ``()`` or ``("none",)``: none).

  Args:
    names: a sequence of names from ``AUGMENTATIONS``, or ``"none"`` alone.
    crop_padding: pixels of zero padding for ``"crop"``, >= 1 when it is asked for.

  Raises:
    ValueError: an unknown name, ``"none"`` beside others, or a crop without padding.
  """
  names = (names,) if isinstance(names, str) else tuple(names)
  if names == (NONE,):
    names = ()
  unknown = [name for name in names if name not in AUGMENTATIONS]
  if unknown:
    raise ValueError(
      f"augment: expected {NONE!r} or names among {', '.join(AUGMENTATIONS)}, got {names}"
    )
  is_int = isinstance(crop_padding, int) and not isinstance(crop_padding, bool)
  if not is_int or crop_padding < ("crop" in names):
    need = ">= 1 with crop" if "crop" in names else ">= 0"
    raise ValueError(f"crop_padding: expected an integer {need}, got {crop_padding!r}")
  ordered = tuple(name for name in AUGMENTATIONS if name in names)
  return Augmentation(ordered, crop_padding if "crop" in names else 0)
