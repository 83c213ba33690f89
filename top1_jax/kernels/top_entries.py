"""Each row's top entries and a label's rank, by max and count passes: no sort, no arg-max.

On the CPU, XLA reduces a float max or sum much faster than an arg-max or an integer
count, and ``lax.top_k`` sorts. Ties go to the lower class, as ``argmax``'s and ``top_k``'s.
"""

import jax
import jax.numpy as jnp

TOP_K_BY_PASSES = 16
"""Up to this k, ``kth_largest`` takes k max passes; beyond, ``lax.top_k`` (it sorts)."""


def count(mask: jax.Array) -> jax.Array:
  """Trues per row of ``mask`` [..., K], as float32 (exact up to 2^24 classes), x64 or not."""
  return jnp.sum(jnp.where(mask, jnp.float32(1), jnp.float32(0)), axis=-1)


def shifted(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``z = l - max(l)`` and the tail ``sum_{j != top} exp(z_j)``, found without an arg-max
  (the top's ties beyond the first add 1 each)."""
  z = logits - jnp.max(logits, axis=-1, keepdims=True)
  tail = jnp.sum(jnp.where(z < 0, jnp.exp(z), 0.0), axis=-1) + (count(z == 0) - 1)
  return z, tail


def kth_largest(z: jax.Array, k: int) -> jax.Array:
  """Each row's k-th largest entry, repeats counted ([0, 0, -1]: 0 is the 2nd), of
  z <= 0 with a 0 in each row (``shifted``'s)."""
  if k > TOP_K_BY_PASSES:
    return jax.lax.top_k(z, k)[0][:, -1]
  value = jnp.zeros(z.shape[:-1], z.dtype)
  for _ in range(k - 1):
    below = jnp.max(jnp.where(z < value[:, None], z, -jnp.inf), axis=-1)
    value = jnp.where(count(z >= value[:, None]) >= k, value, below)
  return value


def top_class(logits: jax.Array) -> jax.Array:
  """[N] int32, each row's arg-max (the first of tied tops), as a float min of indices."""
  classes = jnp.arange(logits.shape[-1], dtype=jnp.float32)
  is_top = logits == jnp.max(logits, axis=-1, keepdims=True)
  return jnp.min(jnp.where(is_top, classes, float(logits.shape[-1])), axis=-1).astype(jnp.int32)


def label_rank(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[N] float: how many classes rank ahead of each label (ties: lower indices ahead),
  so ``rank < k`` is the label being among ``lax.top_k``'s k."""
  own = jnp.take_along_axis(logits, labels[:, None], axis=-1)
  lower = jnp.arange(logits.shape[-1]) < labels[:, None]
  return count((logits > own) | ((logits == own) & lower))
