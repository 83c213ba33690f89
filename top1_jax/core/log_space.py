"""The scores' arithmetic in log space: unchecked, jittable array functions.

A float32 softmax saturates at 1.0 once the top logit leads by ~17, so each score is
written in tail sums such as ``sum_{j != argmax} exp(l_j - l_max)``, which keep full
relative precision when tiny. The checked versions: ``score_functions``.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.kernels import covariance, row_blocks, top_entries


def _by_row_blocks(fn, arrays: int = 1):
  """``fn`` of ``arrays`` row-aligned arrays (then static arguments), rows independent, by
  cache-sized row blocks: whole, XLA on the CPU writes each [N, K] temporary out."""

  @functools.wraps(fn)
  def blocked(*args, **static):
    step = lambda *block: (fn(*block, *args[arrays:], **static),)
    return row_blocks.map_row_blocks(step, args[:arrays])[0]

  return blocked


@jax.jit
@_by_row_blocks
def neg_log_pmax(logits: jax.Array) -> jax.Array:
  """[N, K] logits -> [N] -log max_k softmax(l)_k = log1p(sum_{j != argmax} exp(l_j - l_max))."""
  _, tail = top_entries.shifted(logits)
  return jnp.log1p(tail)


def pmax(log_probs: jax.Array) -> jax.Array:
  """[N, K] logits -> [N] max softmax probability, exp(-neg_log_pmax)."""
  return jnp.exp(-neg_log_pmax(log_probs))


@jax.jit
@_by_row_blocks
def entropy(logits: jax.Array) -> jax.Array:
  """[N, K] logits -> [N] entropy of their softmax in nats."""
  # H = log Z - sum_j p_j z_j with z = l - l_max, Z = 1 + tail. The top entry has
  # z = 0, so both terms are small sums over the tail: no cancellation near 0.
  z, tail = top_entries.shifted(logits)
  weighted = jnp.sum(jnp.exp(z) * z, axis=-1)  # the top entries add 0
  return jnp.log1p(tail) - weighted / (1.0 + tail)


@functools.partial(jax.jit, static_argnames=("k",))
@_by_row_blocks
def neg_log_topk_mass(logits: jax.Array, k: int) -> jax.Array:
  """[N, K] logits -> [N] -log of the softmax mass of the k largest logits."""
  # With t the k-th largest, the top k are the entries above t and enough of t's
  # ties; the rest are those below t and t's other ties.
  z = logits - jnp.max(logits, axis=-1, keepdims=True)
  threshold = top_entries.kth_largest(z, k)[:, None]
  ez, at_threshold = jnp.exp(z), jnp.exp(threshold[:, 0])
  above = z > threshold
  top_mass = (
    jnp.sum(jnp.where(above, ez, 0.0), axis=-1) + (k - top_entries.count(above)) * at_threshold
  )
  rest = jnp.sum(jnp.where(z < threshold, ez, 0.0), axis=-1)
  rest += (top_entries.count(z >= threshold) - k) * at_threshold
  return jnp.log1p(rest / top_mass)  # top_mass >= 1: the top entry is exp(0)


@jax.jit
@_by_row_blocks
def margin(logits: jax.Array) -> jax.Array:
  """[N, K] logits -> [N] gap l_(1) - l_(2) between the two largest (0 for a tie at the top)."""
  z = logits - jnp.max(logits, axis=-1, keepdims=True)
  second = jnp.max(jnp.where(z < 0, z, -jnp.inf), axis=-1)
  return jnp.where(top_entries.count(z == 0) >= 2, 0.0, -second)


def covariance_norm_probs(samples: jax.Array) -> jax.Array:
  """[S, N, K] logits -> [N] covariance 2-norm of each example's S probability vectors."""
  return covariance.covariance_norm(jnp.exp(jax.nn.log_softmax(samples, axis=-1)))


@jax.jit
@functools.partial(_by_row_blocks, arrays=2)
def oracle_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[N, K] logits, [N] labels -> [N] the true class's cross-entropy."""
  true_class = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  return jax.nn.logsumexp(logits, axis=-1) - true_class


@jax.jit
def human_entropy(probs: jax.Array) -> jax.Array:
  """[N, K] label frequencies -> [N] their entropy in nats, 0 log 0 = 0."""
  logs = jnp.log(jnp.where(probs > 0, probs, 1.0))
  return -jnp.sum(jnp.where(probs > 0, probs * logs, 0.0), axis=-1)


# log(0): far below any float32 log-probability (the smallest subnormal's is -103).
LOG_ZERO = -1000.0


def log_probs_from_probs(probs: ArrayLike) -> np.ndarray:
  """Float32 log of probabilities [..., K], taken in float64 (``LOG_ZERO`` for 0); unchecked."""
  with np.errstate(divide="ignore"):
    log_probs = np.log(np.asarray(probs, np.float64))
  return np.maximum(log_probs, LOG_ZERO).astype(np.float32)


UNROLLED_SAMPLES = 128
"""Up to this many samples, ``mean_log_probs`` sums them as separate terms on a CPU."""


@jax.jit
def mean_log_probs(samples: jax.Array) -> jax.Array:
  """[S, N, K] logits -> [N, K] log of the sample-mean softmax, logsumexp_s - log S."""
  log_probs = jax.nn.log_softmax(samples, axis=-1)
  num_samples = samples.shape[0]
  if num_samples > UNROLLED_SAMPLES or jax.default_backend() != "cpu":
    return jax.nn.logsumexp(log_probs, axis=0) - math.log(num_samples)
  # On a CPU, logsumexp over the samples as S element-wise terms that XLA fuses into one
  # pass: its reduction over the leading axis is slower there (docs/performance.md).
  per_sample = [log_probs[s] for s in range(num_samples)]
  top = functools.reduce(jnp.maximum, per_sample)
  total = functools.reduce(jnp.add, [jnp.exp(term - top) for term in per_sample])
  return top + jnp.log(total) - math.log(num_samples)
