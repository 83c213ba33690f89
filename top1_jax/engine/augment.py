"""Data augmentation on device, inside the jitted training step, by key.

Transform t (its index in ``AUGMENTATIONS``) draws image i's randomness from
``fold_in(fold_in(key, t), i)``: the same for a key on any backend and batch order.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

NONE = "none"  # the name that asks for no augmentation


def random_crop(key: jax.Array, image: jax.Array, padding: int) -> jax.Array:
  """One image [H, W, C] zero-padded by ``padding`` and cropped back at a random offset."""
  height, width = image.shape[0], image.shape[1]
  padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  offsets = jax.random.randint(key, (2,), 0, 2 * padding + 1)
  return jax.lax.dynamic_slice(padded, (offsets[0], offsets[1], 0), (height, width, image.shape[2]))


def random_flip(key: jax.Array, image: jax.Array, padding: int) -> jax.Array:
  """One image [H, W, C] flipped left-right with probability 1/2."""
  del padding
  return jnp.where(jax.random.bernoulli(key), image[:, ::-1], image)


AUGMENTATIONS: dict[str, Callable[[jax.Array, jax.Array, int], jax.Array]] = {
  "crop": random_crop,
  "flip": random_flip,
}
"""Every augmentation by name, applied in this order."""


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """The transforms of a training run (hashable: a static field of ``TrainState``)."""

  names: tuple[str, ...] = ()
  crop_padding: int = 0

  def __bool__(self) -> bool:
    return bool(self.names)

  def __call__(self, key: jax.Array, images: jax.Array) -> jax.Array:
    """Augments a batch [B, H, W] or [B, H, W, C] (jittable)."""
    grayscale = images.ndim == 3
    batch = images[..., None] if grayscale else images
    per_image = jnp.arange(batch.shape[0])
    for index, (name, transform) in enumerate(AUGMENTATIONS.items()):
      if name not in self.names:
        continue
      transform_key = jax.random.fold_in(key, index)
      keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(transform_key, per_image)
      batch = jax.vmap(transform, in_axes=(0, 0, None))(keys, batch, self.crop_padding)
    return batch[..., 0] if grayscale else batch


NO_AUGMENTATION = Augmentation()


def make(names, crop_padding: int = 0) -> Augmentation:
  """An ``Augmentation`` from names (``("crop", "flip")``; ``()`` or ``("none",)``: none)."""
  names = (names,) if isinstance(names, str) else tuple(names)
  if names == (NONE,):
    names = ()
  if any(name not in AUGMENTATIONS for name in names):
    raise ValueError(
      f"augment: expected {NONE!r} or names among {', '.join(AUGMENTATIONS)}, got {names}"
    )
  is_int = isinstance(crop_padding, int) and not isinstance(crop_padding, bool)
  if not is_int or crop_padding < ("crop" in names):
    need = ">= 1 with crop" if "crop" in names else ">= 0"
    raise ValueError(f"crop_padding: expected an integer {need}, got {crop_padding!r}")
  ordered = tuple(name for name in AUGMENTATIONS if name in names)
  return Augmentation(ordered, crop_padding if "crop" in names else 0)
