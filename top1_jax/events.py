"""Events whose probability we predict: "the Top-k prediction is correct"."""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax import order, rowblocks, validation


@jax.jit
def _label_rank(logits: jax.Array, labels: jax.Array) -> jax.Array:
  # By cache-sized blocks: its compare-and-count pass reads each block once from cache.
  rows = rowblocks.block_rows(logits.shape[-1])
  return rowblocks.map_row_blocks(lambda *b: (order.label_rank(*b),), (logits, labels), rows)[0]


@jax.jit
def _label_rank_int(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return _label_rank(logits, labels).astype(jnp.int32)


@jax.jit
def _topk_correct(logits: jax.Array, labels: jax.Array, k: jax.Array) -> jax.Array:
  return _label_rank(logits, labels) < k  # k traced: one program for every k


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


def label_rank(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
  """[N] int: how many classes rank ahead of each label (``topk_correct`` is rank < k).

  One pass for every k: ``label_rank(l, y) < k`` for each k of a sweep.

  Args:
    logits: [N, K] float, logits or probabilities (only the order matters).
    labels: [N] int in [0, K).
  """
  logits = validation.float_array("logits", logits, 2)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  return _label_rank_int(logits, labels)
