"""Equal-width bins of a P(correct) prediction in [0, 1], and their ECE (the benchmark's).
Bins are right-closed, ``((b-1)/B, b/B]``, with 0 in the first bin (Guo et al.'s ``I_m``).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.core.binning import Bins

DEFAULT_ECE_BINS = 15
"""The benchmark's (and Guo et al.'s) number of equal-width ECE bins."""

MAX_EQUAL_WIDTH_BINS = 2**16
"""The most equal-width bins taken: finer ones would only be empty."""


def checked_n_bins(n_bins, name: str = "n_bins") -> int:
  """A number of equal-width bins: an integer in [1, ``MAX_EQUAL_WIDTH_BINS``]."""
  return validation.positive_int(name, n_bins, maximum=MAX_EQUAL_WIDTH_BINS)


class EqualWidthBins(NamedTuple):
  """Per-bin sufficient statistics of P(correct) predictions in equal-width bins.

  Attributes:
    counts: [B] int32, predictions per bin.
    hits: [B] int32, correct ones per bin.
    confidence_sum: [B] float, sum of the predictions in each bin.
  """

  counts: jax.Array
  hits: jax.Array
  confidence_sum: jax.Array

  n_bins = Bins.n_bins
  accuracy = Bins.accuracy  # NaN for an empty bin

  @property
  def edges(self) -> jax.Array:
    """[B + 1] float, 0, 1/B, ..., 1."""
    return jnp.linspace(0.0, 1.0, self.n_bins + 1)

  @property
  def mean_confidence(self) -> jax.Array:
    """[B] mean prediction per bin (NaN for an empty bin)."""
    return self.confidence_sum / self.counts

  @property
  def ece(self) -> jax.Array:
    """[] sum_b (n_b / N) |acc_b - conf_b| = sum_b |hits_b - confidence_sum_b| / N."""
    return _ece(self.hits, self.confidence_sum, self.counts)


@jax.jit
def _ece(hits, confidence_sum, counts):
  return jnp.sum(jnp.abs(hits - confidence_sum)) / jnp.sum(counts)


def equal_width_edges(n_bins: int, dtype) -> np.ndarray:
  """The B - 1 interior edges b / B, each rounded once to ``dtype`` so that the host and
  the device bin alike."""
  return (np.arange(1, n_bins) / n_bins).astype(dtype)


def equal_width_index(values: jax.Array | np.ndarray, n_bins: int) -> jax.Array | np.ndarray:
  """Right-closed int32 equal-width bin of each value in [0, 1]: #{interior edges < value}.
  Any shape, traceable; a NumPy array is binned by NumPy to the same indices."""
  on_host = isinstance(values, np.ndarray)
  if on_host:
    values = validation.in_device_dtype(values)
  edges = equal_width_edges(n_bins, values.dtype)
  return (np if on_host else jnp).searchsorted(edges, values, side="left").astype(np.int32)


@functools.partial(jax.jit, static_argnames=("n_bins",))
def count_equal_width(confidence: jax.Array, correct: jax.Array, n_bins: int) -> EqualWidthBins:
  """``equal_width_bins`` of checked arrays; traceable."""
  index = equal_width_index(confidence, n_bins)
  counts = jax.ops.segment_sum(jnp.ones_like(index), index, n_bins)
  hits = jax.ops.segment_sum(correct.astype(jnp.int32), index, n_bins)
  confidence_sum = jax.ops.segment_sum(confidence, index, n_bins)
  return EqualWidthBins(counts, hits, confidence_sum)


def equal_width_bins(
  confidence: ArrayLike, correct: ArrayLike, n_bins: int = DEFAULT_ECE_BINS
) -> EqualWidthBins:
  """Counts [N] P(correct) predictions in ``n_bins`` equal-width bins (reliability diagram).
  ``n_bins``: 1 <= B <= ``MAX_EQUAL_WIDTH_BINS``."""
  confidence, correct = validation.score_and_event(
    "confidence", confidence, correct, probability=True
  )
  return count_equal_width(confidence, correct, checked_n_bins(n_bins))
