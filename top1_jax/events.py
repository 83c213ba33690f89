"""Events whose probability we predict: "the Top-k prediction is correct"."""

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax import validation


@functools.partial(jax.jit, static_argnames=("k",))
def _topk_correct(logits: jax.Array, labels: jax.Array, k: int) -> jax.Array:
  if k == 1:
    return jnp.argmax(logits, axis=-1) == labels
  # The label's rank in one pass (no sort): the classes ahead of it are the larger
  # ones and, at a tie, the lower indices (lax.top_k's and argmax's rule).
  own = jnp.take_along_axis(logits, labels[:, None], axis=-1)
  lower = jnp.arange(logits.shape[-1]) < labels[:, None]
  ahead = (logits > own) | ((logits == own) & lower)
  return jnp.sum(ahead, axis=-1) < k


def topk_correct(logits: ArrayLike, labels: ArrayLike, k: int = 1) -> jax.Array:
  """Whether the true label is among the k largest scores.

  Ties are broken towards the lower class index (``argmax`` / ``lax.top_k``), the
  same rule the scores use for the top class.

  Args:
    logits: [N, K] float, logits or probabilities (only the order matters).
    labels: [N] int in [0, K).
    k: 1 <= k <= K.

  Returns:
    [N] bool.
  """
  logits = validation.float_array("logits", logits, 2)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  k = validation.positive_int("k", k, maximum=logits.shape[-1])
  return _topk_correct(logits, labels, k)
