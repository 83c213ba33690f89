"""Scalar uncertainty scores U(x) from logits or samples.

Every score is computed from logits in log space. A float32 softmax saturates at
exactly 1.0 once the top logit leads by ~17, and even ``logsumexp(l) - max(l)``
rounds ``20 + log1p(1e-8)`` to 20; both create ties that collapse quantile bins.
So each score is written in terms of ``s = sum_{j != argmax} exp(l_j - l_max)``
(and similar tail sums), which keeps full relative precision when it is tiny.

Direction: ``pmax`` and ``margin`` are confidences (larger = more likely correct),
the others are uncertainties (larger = less likely correct). Binning does not
care; only ``metrics.auroc`` on a raw score does.

All functions take a batch: ``logits: [N, K]`` (or ``samples: [S, N, K]``) and
return ``[N]``.
"""

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax import validation


def _logits(logits: ArrayLike) -> jax.Array:
  arr = validation.float_array("logits", logits, 2)
  if arr.shape[-1] < 2:
    raise ValueError(f"logits: expected at least 2 classes, got shape {arr.shape}")
  return arr


def _shifted(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Returns ``z = l - max(l)`` and the mask of the (first) argmax entry."""
  top = jnp.argmax(logits, axis=-1)
  z = logits - jnp.take_along_axis(logits, top[:, None], axis=-1)
  is_top = jnp.arange(logits.shape[-1]) == top[:, None]
  return z, is_top


@jax.jit
def _neg_log_pmax(logits: jax.Array) -> jax.Array:
  z, is_top = _shifted(logits)
  tail = jnp.sum(jnp.where(is_top, 0.0, jnp.exp(z)), axis=-1)
  return jnp.log1p(tail)


def neg_log_pmax(logits: ArrayLike) -> jax.Array:
  """-log max_k softmax(l)_k = log1p(sum_{j != argmax} exp(l_j - l_max)).

  Args:
    logits: [N, K] float.

  Returns:
    [N] float, >= 0; distinct for logits [20, 0, ...] and [26, 0, ...] in float32.
  """
  return _neg_log_pmax(_logits(logits))


def pmax(logits: ArrayLike) -> jax.Array:
  """Max softmax probability ("Vanilla", Hendrycks & Gimpel).

  Saturates at 1.0 in float32 for confident examples; bin ``neg_log_pmax`` (the
  same ordering without the ties) when that matters.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float in (0, 1].
  """
  return jnp.exp(-neg_log_pmax(logits))


@jax.jit
def _entropy(logits: jax.Array) -> jax.Array:
  # H = log Z - sum_j p_j z_j with z = l - l_max, Z = 1 + tail. The top entry has
  # z = 0, so both terms are small sums over the tail: no cancellation near 0.
  z, is_top = _shifted(logits)
  ez = jnp.where(is_top, 0.0, jnp.exp(z))
  tail = jnp.sum(ez, axis=-1)
  weighted = jnp.sum(jnp.where(is_top, 0.0, ez * z), axis=-1)
  return jnp.log1p(tail) - weighted / (1.0 + tail)


def entropy(logits: ArrayLike) -> jax.Array:
  """Entropy of softmax(logits) in nats, accurate when the softmax saturates.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float in [0, log K].
  """
  return _entropy(_logits(logits))


@functools.partial(jax.jit, static_argnames=("k",))
def _neg_log_topk_mass(logits: jax.Array, k: int) -> jax.Array:
  top_values, top_index = jax.lax.top_k(logits, k)
  z_top = top_values - top_values[:, :1]
  in_top = (
    jnp.zeros(logits.shape, bool).at[jnp.arange(logits.shape[0])[:, None], top_index].set(True)
  )
  rest = jnp.sum(jnp.where(in_top, 0.0, jnp.exp(logits - top_values[:, :1])), axis=-1)
  top_mass = jnp.sum(jnp.exp(z_top), axis=-1)  # >= 1: the top entry is exp(0)
  return jnp.log1p(rest / top_mass)


def neg_log_topk_mass(logits: ArrayLike, k: int = 5) -> jax.Array:
  """-log of the softmax mass of the k largest logits (the Top-k analogue of -log pmax).

  Args:
    logits: [N, K] float.
    k: how many top classes, 1 <= k <= K; k = 1 equals ``neg_log_pmax``.

  Returns:
    [N] float, >= 0.
  """
  arr = _logits(logits)
  k = validation.positive_int("k", k, maximum=arr.shape[-1])
  return _neg_log_topk_mass(arr, k)


@jax.jit
def _margin(logits: jax.Array) -> jax.Array:
  top2, _ = jax.lax.top_k(logits, 2)
  return top2[:, 0] - top2[:, 1]


def margin(logits: ArrayLike) -> jax.Array:
  """Gap between the two largest logits, l_(1) - l_(2) (a confidence).

  This is log(p_(1) / p_(2)): the probability ratio of the top two classes, which
  unlike the probability difference does not saturate.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float, >= 0.
  """
  return _margin(_logits(logits))


@jax.jit
def _covariance_norm(samples: jax.Array) -> jax.Array:
  num_samples, _, num_classes = samples.shape
  # Example-major [N, S, K] makes both the centring and the Gram a batched matmul
  # pattern XLA handles well (2.4x faster on CPU than reducing over the leading S).
  # Centre explicitly, before any product: the spread of tiny dropout rates can be
  # 1e-4 of the logits' mean, and centring the Gram afterwards would cancel it away.
  per_example = jnp.transpose(samples, (1, 0, 2))
  centred = per_example - jnp.mean(per_example, axis=1, keepdims=True)
  if num_samples < num_classes:
    # Cov = X^T X / (S-1) with X = centred [S, K] has the same nonzero spectrum
    # as the S x S Gram matrix X X^T / (S-1): O(S^2 K) per example, not O(K^3).
    gram = centred @ jnp.swapaxes(centred, 1, 2)
  else:
    gram = jnp.swapaxes(centred, 1, 2) @ centred
  gram = gram / (num_samples - 1)
  if jax.default_backend() == "cpu":
    # jaxlib's CPU LAPACK kernel splits a *batched* eigh over the intra-op thread
    # pool and blocks a pool thread while it waits; two such calls at once (two
    # scores, or async dispatch overlapping two calls) deadlocked a 2-core CPU.
    # One matrix per call runs inline, and is as fast here (measured 0.64 s for
    # 10k 32x32 matrices either way).
    top = jax.lax.map(lambda matrix: jnp.linalg.eigvalsh(matrix)[-1], gram)
  else:
    top = jnp.linalg.eigvalsh(gram)[:, -1]
  return jnp.maximum(top, 0.0)


def covariance_norm(samples: ArrayLike) -> jax.Array:
  """Matrix 2-norm of the sample covariance of each example's S vectors.

  ``||Cov_s(v_s)||_2`` with the unbiased (S-1) normalisation, as ``np.cov``. A pure
  function of the vectors as given: pass logits, probabilities or log-probabilities.
  Computed through the S x S Gram matrix of the centred samples when S < K.

  Args:
    samples: [S, N, K] float, S >= 2 MC-dropout samples or ensemble members.

  Returns:
    [N] float, >= 0 (larger = the samples disagree more).
  """
  arr = validation.float_array("samples", samples, 3)
  if arr.shape[0] < 2:
    raise ValueError(
      f"samples: need at least 2 samples on axis 0 for a covariance, got shape {arr.shape}"
    )
  return _covariance_norm(arr)


@jax.jit
def _human_entropy(probs: jax.Array) -> jax.Array:
  return -jnp.sum(
    jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0),
    axis=-1,
  )


def human_entropy(probs: ArrayLike) -> jax.Array:
  """Entropy of per-example label distributions (e.g. CIFAR-10H), 0 log 0 = 0.

  Args:
    probs: [N, K] float, rows in [0, 1] summing to 1.

  Returns:
    [N] float in [0, log K]; many exact ties (unanimous annotators give 0).
  """
  return _human_entropy(validation.probability_array("probs", probs, 2, sums_to_one=True))


SCORES = {
  "pmax": pmax,
  "neg_log_pmax": neg_log_pmax,
  "entropy": entropy,
  "margin": margin,
  "neg_log_topk_mass": neg_log_topk_mass,
}
"""Scores of a single [N, K] logits array, by name (``neg_log_topk_mass`` takes k)."""
