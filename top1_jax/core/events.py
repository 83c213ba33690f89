"""Events whose probability we predict: "the Top-k prediction is correct"."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.kernels import row_blocks, top_entries


@jax.jit
def block_softmax_terms(logits, row_max, labels, temperature=None):
  """Each row's multiclass Brier and pmax of softmax(logits / T) (None: T = 1), unchecked;
  ``row_max``: [rows] max(logits) of each row."""
  shifted = logits - row_max[:, None]
  weights = jnp.exp(shifted if temperature is None else shifted / temperature)  # top's is 1
  total = jnp.sum(weights, axis=-1)
  probs = weights / total[:, None]
  # (p_k - y_k)^2 with y one-hot, without materialising the one-hot array.
  is_label = jnp.arange(logits.shape[-1]) == labels[:, None]
  return jnp.sum(jnp.where(is_label, probs - 1, probs) ** 2, axis=-1), 1 / total


@jax.jit
def _label_rank(logits: jax.Array, labels: jax.Array) -> jax.Array:
  rank = row_blocks.map_row_blocks(lambda *b: (top_entries.label_rank(*b),), (logits, labels))[0]
  return rank.astype(jnp.int32)


def _checked(logits: ArrayLike, labels: ArrayLike) -> tuple[jax.Array, jax.Array]:
  logits = validation.float_array("logits", logits, 2)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  return logits, labels


@jax.jit
def _topk_correct(logits: jax.Array, labels: jax.Array, k: jax.Array) -> jax.Array:
  return _label_rank(logits, labels) < k  # k traced: one program for every k


def topk_correct(logits: ArrayLike, labels: ArrayLike, k: int = 1) -> jax.Array:
  """[N] bool: whether the true label is among the k <= K largest of ``logits: [N, K]``.
  Only the order matters (logits or probabilities). Ties go to the lower class index,
  as ``argmax`` and the scores break them."""
  logits, labels = _checked(logits, labels)
  k = validation.positive_int("k", k, maximum=logits.shape[-1])
  return _topk_correct(logits, labels, k)


def label_rank(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
  """[N] int: how many classes rank ahead of each label; ``topk_correct`` is rank < k.
  One pass serves every k of a sweep."""
  logits, labels = _checked(logits, labels)
  return _label_rank(logits, labels)


class LabelTerms(NamedTuple):
  """What the labels say of each example's prediction.

  Attributes:
    rank: [N] int32, ``label_rank``: the Top-k event is ``rank < k``.
    top_class: [N] int32, the Top-1 prediction (the first of tied tops).
    multiclass_brier: [N] float, sum_k (p_k - y_k)^2 of softmax(logits).
    pmax: [N] float, max_k p_k of softmax(logits).
  """

  rank: jax.Array
  top_class: jax.Array
  multiclass_brier: jax.Array
  pmax: jax.Array


def block_label_terms(logits: jax.Array, labels: jax.Array) -> LabelTerms:
  """``LabelTerms`` of a block of rows, unchecked, for the body of a larger blocked pass."""
  row_max = jnp.max(logits, axis=-1)
  brier, pmax = block_softmax_terms(logits, row_max, labels)
  rank = top_entries.label_rank(logits, labels).astype(jnp.int32)
  return LabelTerms(rank, top_entries.top_class(logits), brier, pmax)


@jax.jit
def _label_terms(logits: jax.Array, labels: jax.Array) -> LabelTerms:
  terms = row_blocks.map_row_blocks(lambda *b: tuple(block_label_terms(*b)), (logits, labels))
  return LabelTerms(*terms)


def label_terms(logits: ArrayLike, labels: ArrayLike) -> LabelTerms:
  """Each example's ``LabelTerms`` of [N, K] logits (or log-probabilities), in one pass."""
  logits, labels = _checked(logits, labels)
  return _label_terms(logits, labels)
