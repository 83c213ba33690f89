"""Temperature scaling (Guo et al. 2017): one scalar T > 0 for softmax(logits / T).

T is fitted on a calibration split by minimising the multiclass NLL, as the
benchmark of Ovadia, Snoek et al. 2019 does (``baselines`` re-exports both
functions with the benchmark's other methods).

Why Newton: with beta = 1 / T the NLL ``mean_n [logsumexp(beta l_n) - beta l_n,y_n]``
is convex in beta, its first derivative is the mean over examples of the softmax
mean of the logits minus the label's logit, and its second the mean softmax
variance of the logits. Both come from one pass over the [N, K] logits, so a
safeguarded Newton iteration on log T reaches the optimum in a handful of passes
where bisection needs 48 (at ImageNet size each pass is 5e7 exponentials).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax import rowblocks, validation

MIN_TEMPERATURE = 1e-5
"""The benchmark's bracket (``find_scaling_temperature``'s temp_range), lower end."""
MAX_TEMPERATURE = 1e5
"""Its upper end; ``apply_temperature`` accepts T within [MIN_TEMPERATURE, MAX_TEMPERATURE]."""

# Iterations of the safeguarded Newton method: bisection alone shrinks the widest
# bracket (23 in log T) below the tolerance in 25 steps, and the safeguard makes every
# two steps at least halve the step; Newton steps converge faster (4 on CIFAR).
_MAX_ITERATIONS = 64
# Convergence in log T (relative in T): 8 float32 ulps, about the noise of the float32
# sums that give the slope, so the result is as exact as that slope's sign allows.
_TOLERANCE = 1e-6
# Examples in the subsample whose fit starts the pooled fit of several splits.
_SUBSAMPLE = 4096


def _slope_and_curvature(centred, label_logit, example_weights, log_temperature):
  """d NLL / d log T and d^2 NLL / d log T^2, from one pass over the logits."""
  beta = jnp.exp(-log_temperature)

  def moments(block):
    # centred <= 0 with a 0 in each row: exp(beta * centred) <= 1 and its row sum >= 1,
    # so neither overflows nor underflows to a zero total.
    weights = jnp.exp(beta * block)
    total = jnp.sum(weights, axis=-1)
    return (
      jnp.sum(weights * block, axis=-1) / total,
      jnp.sum(weights * block**2, axis=-1) / total,
    )

  # The softmax mean and second moment of each example's logits, by cache-sized blocks.
  rows = rowblocks.block_rows(centred.shape[-1])
  mean, second = rowblocks.map_row_blocks(moments, (centred,), rows)
  total_weight = jnp.sum(example_weights)
  # d NLL / d beta, non-decreasing in beta; then the softmax variance.
  slope_beta = jnp.sum(example_weights * (mean - label_logit)) / total_weight
  variance = jnp.maximum(second - mean**2, 0.0)
  curvature_beta = jnp.sum(example_weights * variance) / total_weight
  # The chain rule through beta = exp(-log T).
  return -beta * slope_beta, beta * slope_beta + beta**2 * curvature_beta, slope_beta


def _newton(centred, label_logit, weights, log_min, log_max, log_start):
  """log T minimising the weighted NLL of the centred logits, in [log_min, log_max]."""

  def step(state):
    iteration, log_t, low, high, last_step, step_before, _ = state
    slope, curvature, slope_beta = _slope_and_curvature(centred, label_logit, weights, log_t)
    # The slope in beta changes sign at most once (convexity): where it is < 0 the NLL
    # still falls as T shrinks, so the optimum is below. A zero slope (the NLL flat in
    # T) counts as "above", so a T-independent NLL returns the top of the bracket.
    below = slope_beta < 0
    low, high = jnp.where(below, low, log_t), jnp.where(below, log_t, high)
    newton_step = -slope / jnp.where(curvature > 0, curvature, 1.0)
    newton = log_t + newton_step
    # Newton where it stays inside the bracket and at least halves the step before
    # last (Numerical Recipes' rtsafe), else bisection: never slower than bisection,
    # e.g. where the NLL flattens out towards an end of the bracket.
    use_newton = (curvature > 0) & (newton > low) & (newton < high)
    use_newton &= jnp.abs(newton_step) <= 0.5 * jnp.abs(step_before)
    # At the optimum already: stay. (A step below log T's float32 spacing leaves
    # newton == log_t, which the bracket test above would turn into a bisection
    # far away: seen when a split started at its optimum.)
    converged = (curvature > 0) & (jnp.abs(newton_step) < _TOLERANCE)
    following = jnp.where(use_newton, newton, 0.5 * (low + high))
    following = jnp.where(converged, log_t, following)
    done = converged | (jnp.abs(following - log_t) < _TOLERANCE) | (high - low < _TOLERANCE)
    return iteration + 1, following, low, high, following - log_t, last_step, done

  def not_done(state):
    iteration, *_, done = state
    return (iteration < _MAX_ITERATIONS) & ~done

  start = jnp.clip(log_start, log_min, log_max)
  width = log_max - log_min
  state = (0, start, log_min, log_max, width, width, jnp.zeros((), bool))
  _, log_t, low, high, *_ = jax.lax.while_loop(not_done, step, state)
  return jnp.clip(log_t, low, high)


def _split_starts(centred, label_logit, weights, log_pooled, log_min, log_max):
  """Each row's (split's) log T to second order from one pass at the pooled T.

  A split's slope in beta is its weighted mean of per-example terms that do not
  depend on the split: at beta0 + d it is a + b d + c d^2 / 2, where a, b and c
  are the weighted means of each example's softmax mean of the logits (minus
  its label's), variance and third central moment at beta0. One pass gives all
  three for every split, and the root of that quadratic starts each split's
  Newton within ~1e-6 of its optimum when the splits' T are within a few per cent
  of each other (one or two exact passes then confirm it); a split far from the
  pool starts from a worse guess, never a wrong answer.
  """
  beta = jnp.exp(-log_pooled)

  def cumulants(block):
    weights_k = jnp.exp(beta * block)
    total = jnp.sum(weights_k, axis=-1, keepdims=True)
    mean = jnp.sum(weights_k * block, axis=-1, keepdims=True) / total
    deviation = block - mean  # central moments: no cancellation between raw ones
    variance = jnp.sum(weights_k * deviation**2, axis=-1) / total[:, 0]
    third = jnp.sum(weights_k * deviation**3, axis=-1) / total[:, 0]
    return mean[:, 0], variance, third

  rows = rowblocks.block_rows(centred.shape[-1])
  mean, variance, third = rowblocks.map_row_blocks(cumulants, (centred,), rows)
  terms = jnp.stack([mean - label_logit, variance, third], axis=-1)
  a, b, c = (weights @ terms / jnp.sum(weights, axis=-1, keepdims=True)).T
  first = -a / jnp.where(b > 0, b, 1.0)
  step = -a / jnp.where(b + 0.5 * c * first > 0, b + 0.5 * c * first, 1.0)
  beta_split = beta + jnp.where(jnp.abs(first) < 0.5 * beta, step, 0.0)
  log_start = -jnp.log(jnp.where(beta_split > 0, beta_split, beta))
  return jnp.clip(jnp.where(jnp.isfinite(log_start), log_start, log_pooled), log_min, log_max)


@jax.jit
def _fit_temperature(logits, labels, weights, log_min, log_max, log_start):
  """T of each row of ``weights`` [F, N]: [F] temperatures."""
  # Shift-invariant, and smaller magnitudes keep the float32 sums tight. Centred once
  # for all rows of weights (splits), which then share this [N, K] array.
  centred = logits - jnp.max(logits, axis=-1, keepdims=True)
  label_logit = jnp.take_along_axis(centred, labels[:, None], axis=-1)[:, 0]
  dtype = centred.dtype
  log_min, log_max, log_start = (v.astype(dtype) for v in (log_min, log_max, log_start))
  if weights.shape[0] == 1:
    return jnp.exp(_newton(centred, label_logit, weights[0], log_min, log_max, log_start))[None]
  # Several splits: one fit of their pooled weights, then each split's Newton from its
  # second-order guess (_split_starts), usually one or two passes each instead of ~4.
  pooled_weights = jnp.sum(weights, 0)
  stride = centred.shape[0] // _SUBSAMPLE
  if stride >= 4:
    # The pooled fit starts from that of every stride-th example: T within a few per
    # cent for a few per cent of the passes, so ~3 full passes instead of ~7 from T = 1.
    log_start = _newton(
      centred[::stride], label_logit[::stride], pooled_weights[::stride],
      log_min, log_max, log_start,
    )  # fmt: skip
  pooled = _newton(centred, label_logit, pooled_weights, log_min, log_max, log_start)
  starts = _split_starts(centred, label_logit, weights, pooled, log_min, log_max)

  def fit_row(_, row):
    row_weights, row_start = row
    return None, _newton(centred, label_logit, row_weights, log_min, log_max, row_start)

  _, log_t = jax.lax.scan(fit_row, None, (weights, starts))
  return jnp.exp(log_t)


def fit_temperature(
  logits: ArrayLike,
  labels: ArrayLike,
  *,
  min_temperature: float = MIN_TEMPERATURE,
  max_temperature: float = MAX_TEMPERATURE,
  weights: ArrayLike | None = None,
  initial_temperature: float = 1.0,
) -> jax.Array:
  """Maximum-likelihood temperature T of softmax(logits / T) on a calibration split.

  Minimises the multiclass NLL ``mean_n [logsumexp(l_n / T) - l_n,y_n / T]`` over
  ``log T`` in ``[log min_temperature, log max_temperature]`` (the benchmark's
  bracket, 1e-5 to 1e5, by default).

  Solver: Newton's method on log T with exact first and second derivatives (one
  pass over the logits per iteration, under ``jit``), safeguarded by a bracket:
  the NLL is convex in beta = 1/T, so its slope changes sign at most once, each
  iteration narrows the bracket on that sign, and a Newton step that would leave
  the bracket (or meets a non-positive curvature) is replaced by bisection. So it
  finds the same global minimum in the bracket as the benchmark's own bisection
  of the gradient (``scipy.optimize.bisect``), in a few passes instead of ~48.

  Edge cases: when the NLL keeps falling to the end of the bracket (e.g. every
  calibration example is classified correctly, so sharper is always better) the
  end is returned; when it does not depend on T at all (all logits of each
  example equal) ``max_temperature`` is returned.

  Args:
    logits: [N, K] float, calibration-split logits (N >= 1, K >= 2).
    labels: [N] int in [0, K).
    min_temperature, max_temperature: the bracket, 0 < min < max.
    weights: optional [N] example weights >= 0 (e.g. a split's calibration
      mask): the NLL is their weighted mean. Or [F, N], one row per split: the
      F temperatures come from one compiled program over the one [N, K] array
      (no copy of any split's rows): one fit of the pooled weights, then each
      split's Newton from a second-order guess made in one shared pass.
    initial_temperature: where Newton starts (e.g. another split's T, close
      to this one's: fewer passes); the result does not depend on it beyond the
      tolerance of 1e-6 in log T.

  Returns:
    [] float, T > 0 (or [F] with [F, N] weights). Apply it with ``apply_temperature``.
  """
  if logits is None:
    raise ValueError("logits: expected an [N, K] array, got None")
  logits = validation.float_array("logits", logits, 2)
  if logits.shape[-1] < 2:
    raise ValueError(f"logits: expected at least 2 classes, got shape {logits.shape}")
  validation.check_nonempty("logits", logits)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  low, high = float(min_temperature), float(max_temperature)
  if not (np.isfinite(low) and np.isfinite(high) and 0.0 < low < high):
    raise ValueError(
      "min_temperature, max_temperature: expected finite 0 < min < max,"
      f" got {min_temperature!r}, {max_temperature!r}"
    )
  if weights is None:
    weights = jnp.ones(logits.shape[0], logits.dtype)
  else:
    weights = validation.float_array("weights", weights, (1, 2))
    if weights.shape[-1] != logits.shape[0]:
      raise ValueError(
        f"weights: expected {logits.shape[0]} weights per row (one per example), got shape"
        f" {weights.shape}"
      )
    if not validation.is_traced(weights) and not bool(
      jnp.all(weights >= 0) & jnp.all(jnp.sum(weights, axis=-1) > 0)
    ):
      raise ValueError("weights: expected weights >= 0 with a positive sum (in every row)")
  start = float(initial_temperature)
  if not (np.isfinite(start) and start > 0):
    raise ValueError(f"initial_temperature: expected a finite T > 0, got {initial_temperature!r}")
  rows = weights.astype(logits.dtype).reshape(-1, logits.shape[0])
  fitted = _fit_temperature(
    logits, labels, rows, *(jnp.float32(np.log(v)) for v in (low, high, start))
  )
  return fitted if weights.ndim == 2 else fitted[0]


@jax.jit
def _apply_temperature(logits, temperature):
  return logits / temperature


def apply_temperature(logits: ArrayLike, temperature: ArrayLike) -> jax.Array:
  """Temperature-scaled logits ``logits / T``.

  Returns logits, not probabilities, so downstream code stays in log space:
  pass them as ``logits=`` to the metrics in ``baselines``, to
  ``scores.neg_log_pmax`` (the ranking, hence Top-1 binning, is unchanged by T),
  or take ``jax.nn.softmax`` for the calibrated probabilities.

  Args:
    logits: [N, K] or [S, N, K] float.
    temperature: [] float, T > 0 (from ``fit_temperature``).

  Returns:
    float array shaped like ``logits``.
  """
  logits = validation.float_array("logits", logits, (2, 3))
  temperature = validation.float_array("temperature", temperature, 0)
  # Within fit_temperature's range: beyond it logits / T overflows (T = 1e-40 gave inf).
  if not validation.is_traced(temperature):
    validation.in_range("temperature", float(temperature), MIN_TEMPERATURE, MAX_TEMPERATURE)
  return _apply_temperature(logits, temperature)
