"""The scalar uncertainty scores U(x) a user calls, each checking its input: ``logits:
[N, K]`` (or ``samples: [S, N, K]``) -> ``[N]``, computed in log space by ``log_space``.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import log_space, validation
from top1_jax.kernels import covariance


def checked_logits(logits: ArrayLike) -> jax.Array:
  """[N, K] finite float logits with K >= 2, the input of every log-space score."""
  arr = validation.float_array("logits", logits, 2)
  if arr.shape[-1] < 2:
    raise ValueError(f"logits: expected at least 2 classes, got shape {arr.shape}")
  return arr


def neg_log_pmax(logits: ArrayLike) -> jax.Array:
  """-log max_k softmax(l)_k = log1p(sum_{j != argmax} exp(l_j - l_max)), >= 0.
  Distinct for logits [20, 0, ...] and [26, 0, ...] in float32, where pmax ties."""
  return log_space.neg_log_pmax(checked_logits(logits))


def pmax(logits: ArrayLike) -> jax.Array:
  """Max softmax probability ("Vanilla", Hendrycks & Gimpel), in (0, 1]; saturates at 1.0
  in float32 where ``neg_log_pmax`` still ranks the examples (docs/numerics.md)."""
  return jnp.exp(-neg_log_pmax(logits))


def entropy(logits: ArrayLike) -> jax.Array:
  """Entropy of softmax(logits) in nats, in [0, log K], accurate when it saturates."""
  return log_space.entropy(checked_logits(logits))


def neg_log_topk_mass(logits: ArrayLike, k: int = 5) -> jax.Array:
  """-log of the softmax mass of the k <= K largest logits (k = 1: ``neg_log_pmax``)."""
  arr = checked_logits(logits)
  k = validation.positive_int("k", k, maximum=arr.shape[-1])
  return log_space.neg_log_topk_mass(arr, k)


def margin(logits: ArrayLike) -> jax.Array:
  """Gap l_(1) - l_(2) = log(p_(1) / p_(2)) >= 0 between the two largest logits (a confidence)."""
  return log_space.margin(checked_logits(logits))


def covariance_norm(samples: ArrayLike) -> jax.Array:
  """``||Cov_s(v_s)||_2`` of each example's S >= 2 vectors ([S, N, K] samples or ensemble
  members, as given), unbiased as ``np.cov``; 0 exactly where the samples are identical.

  Raises:
    ValueError: a norm outside the dtype's normal range, which would read as inf or 0
      (a spread beyond ~1e19 or below ~1e-19 in float32).
  """
  arr = validation.as_array("samples", samples, 3)
  if arr.dtype.kind != "f" or arr.dtype.itemsize < 4:
    # Integers, bfloat16 and float16 (computed in float32), booleans (refused).
    arr = validation.float_array("samples", arr, 3)
  if arr.shape[0] < 2:
    raise ValueError(
      f"samples: need at least 2 samples on axis 0 for a covariance, got shape {arr.shape}"
    )
  norm = covariance.covariance_norm(arr)
  if validation.is_traced(norm):
    return norm
  finite, zero = jax.device_get((jnp.all(jnp.isfinite(norm)), jnp.any(norm == 0)))
  dtype = jnp.dtype(norm.dtype).name
  if not finite:
    # Non-finite samples give NaN norms, so the samples are only checked here: name the
    # first bad value, or else the norm itself left the float range.
    validation.check_finite("samples", arr)
    raise ValueError(
      f"samples: the covariance norm exceeds the {dtype} range (spread beyond ~1e19 in"
      " float32); rescale the samples"
    )
  if zero:
    # 0 is exact for identical samples; anywhere else the norm underflowed.
    spread = jnp.any(jnp.max(arr, axis=0) != jnp.min(arr, axis=0), axis=-1)
    underflowed = np.flatnonzero(np.asarray((norm == 0) & spread))
    if underflowed.size:
      raise ValueError(
        f"samples: the covariance norm of {underflowed.size} example(s) (first: index"
        f" {underflowed[0]}) is below the {dtype} range (smallest normal"
        f" {jnp.finfo(norm.dtype).tiny:.2g}; spread below ~1e-19 in float32) and would"
        " read as 0; rescale the samples, or pass float64 ones with jax_enable_x64"
      )
  return norm


def oracle_loss(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
  """The true class's cross-entropy logsumexp(l) - l_label, the paper's "Loss" row: a
  reference, not a method (it needs ``labels: [N]``; docs/estimators.md)."""
  logits = checked_logits(logits)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  return log_space.oracle_loss(logits, labels)


def human_entropy(probs: ArrayLike) -> jax.Array:
  """Entropy of [N, K] per-example label distributions (e.g. CIFAR-10H), 0 log 0 = 0.
  Many exact ties: unanimous annotators give 0."""
  checked = validation.probability_array("probs", probs, 2, sums_to_one=True)
  return log_space.human_entropy(checked)


def log_probs_from_probs(probs: ArrayLike, *, name: str = "probs") -> np.ndarray:
  """Float32 NumPy log-probabilities of probability rows [K], [N, K] or [S, N, K], usable as
  logits; taken in float64, so tiny tails keep distinct values (0: ``log_space.LOG_ZERO``).
  ``name`` names ``probs`` in error messages."""
  checked = validation.probability_array(name, probs, (1, 2, 3), sums_to_one=True, host=True)
  return log_space.log_probs_from_probs(checked)


INPUTS = ("auto", "logits", "probs")
"""What a classifier's outputs may be given as: ``as_log_probs``' ``inputs``."""


def input_kind(name: str, values: np.ndarray, dtype=None) -> str:
  """ "probs" or "logits": what an array of classifier outputs [..., K] holds: probabilities
  when every row lies in [0, 1] and sums to 1 within float error, logits when no row does;
  a ValueError where it cannot be told."""
  num_classes = values.shape[-1]
  if num_classes < 2:
    raise ValueError(
      f"{name}: one value per row (shape {values.shape}) is neither probabilities nor logits"
      " of several classes; pass [N, K] outputs with K >= 2"
    )
  rows = np.asarray(values, np.float32).reshape(-1, num_classes)
  dtype = values.dtype if dtype is None else dtype
  in_unit = (rows.min(axis=1) >= 0.0) & (rows.max(axis=1) <= 1.0)
  off = np.abs(rows.sum(axis=1, dtype=np.float64) - 1.0)
  probable = in_unit & (off <= validation.sum_tolerance(dtype))
  if probable.all():
    return "probs"
  if (in_unit & (off <= validation.rounding_tolerance(dtype, num_classes))).all():
    raise ValueError(
      f"{name}: every row lies in [0, 1] and sums to 1 only within rounding (off by up to"
      f" {off.max():.3g}): probabilities saved with few digits? Divide each row by its sum"
      ' (or pass inputs="logits" if they are logits)'
    )
  if probable.any():
    raise ValueError(
      f"{name}: {int(probable.sum())} of {probable.size} rows look like probabilities (in [0, 1],"
      ' summing to 1) and the others do not; say which they are: inputs="probs" or'
      ' inputs="logits"'
    )
  return "logits"


def as_log_probs(x: ArrayLike, inputs: str = "auto", *, name: str = "x", ndim=(2, 3)):
  """A classifier's outputs as a checked float32 NumPy array of logits or log-probabilities.

  Args:
    x: [N, K] (or [S, N, K] samples) outputs, K >= 2; anything with ``__array__``.
    inputs: "logits" (refused when every row looks like probabilities), "probs"
      (``log_probs_from_probs``) or "auto" (``input_kind`` decides).
    name: the argument's name in error messages.
  """
  if inputs not in INPUTS:
    raise ValueError(f"inputs: expected one of {', '.join(INPUTS)}, got {inputs!r}")
  if inputs != "probs":
    arr = validation.float_array(name, x, ndim, host=True)
  if inputs == "auto":
    inputs = input_kind(name, arr, getattr(x, "dtype", None))
  if inputs == "probs":
    # Checked once, in x's own dtype (a bfloat16 row's sum gets bfloat16's tolerance).
    arr = log_probs_from_probs(validation.as_array(name, x, ndim, host=True), name=name)
  if arr.shape[-1] < 2:
    raise ValueError(f"{name}: expected at least 2 classes on the last axis, got shape {arr.shape}")
  if inputs == "logits":  # probabilities run as logits give other numbers, silently
    validation.refuse_probabilities(name, arr, 'pass inputs="probs" (or "auto")', given=x)
  return np.asarray(arr, np.float32)


def mean_log_probs(samples: ArrayLike) -> jax.Array:
  """[N, K] log of the mean softmax of [S, N, K] logits: logsumexp_s(log_softmax) - log S."""
  samples = validation.float_array("samples", samples, 3)
  validation.check_samples("samples", samples)
  return log_space.mean_log_probs(samples)
