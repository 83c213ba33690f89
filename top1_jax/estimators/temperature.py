"""Temperature scaling (Guo et al. 2017): one scalar T > 0 for softmax(logits / T).

T minimises the multiclass NLL on a calibration split, as the benchmark of Ovadia, Snoek et
al. 2019 does. Why Newton: with beta = 1 / T the NLL is convex in beta, and its first two
derivatives (softmax mean and variance of the logits) come from one pass over the logits.
``ESTIMATOR`` predicts P(Top-k correct) as the Top-k mass of softmax(log_probs / T).
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import events, score_functions, scores, validation
from top1_jax.estimators import base
from top1_jax.kernels import row_blocks

MIN_TEMPERATURE = 1e-5
"""The benchmark's bracket (``find_scaling_temperature``'s temp_range), lower end."""
MAX_TEMPERATURE = 1e5
"""Its upper end; ``apply_temperature`` accepts T within [MIN_TEMPERATURE, MAX_TEMPERATURE]."""

# Safeguarded Newton iterations: the safeguard makes every two steps at least halve the
# step, so bisection's 25 steps over the widest bracket bound them.
_MAX_ITERATIONS = 64
# Convergence in log T: 8 float32 ulps, about the noise of the float32 sums of the slope.
_TOLERANCE = 1e-6
_SUBSAMPLE = 4096  # examples in the subsample whose fit starts the pooled fit
# How far (relative, in beta) a split's fit may lie from the expansion point for
# fit_splits to take it from the cumulants' Taylor series (docs/performance.md).
_TAYLOR_REACH = 0.02
_TAYLOR_STEPS = 8
# Below this many logits (N x K), fit_splits takes the exact route directly.
_CUMULANTS_FROM = 1 << 22


def _slope_and_curvature(logits, row_max, label_logit, example_weights, log_temperature):
  """d NLL / d log T and d^2 NLL / d log T^2, from one pass over the logits."""
  beta = jnp.exp(-log_temperature)

  def moments(block, block_max):
    # Centred in cache: z <= 0 with a 0 in each row, so exp(beta * z) <= 1 and its row
    # sum >= 1: neither overflows nor underflows to a zero total.
    z = block - block_max[:, None]
    weights = jnp.exp(beta * z)
    total = jnp.sum(weights, axis=-1)
    return jnp.sum(weights * z, axis=-1) / total, jnp.sum(weights * z**2, axis=-1) / total

  mean, second = row_blocks.map_row_blocks(moments, (logits, row_max))
  total_weight = jnp.sum(example_weights)
  # d NLL / d beta, non-decreasing in beta; then the softmax variance.
  slope_beta = jnp.sum(example_weights * (mean - label_logit)) / total_weight
  variance = jnp.maximum(second - mean**2, 0.0)
  curvature_beta = jnp.sum(example_weights * variance) / total_weight
  # The chain rule through beta = exp(-log T).
  return -beta * slope_beta, beta * slope_beta + beta**2 * curvature_beta, slope_beta


def _newton(logits, row_max, label_logit, weights, log_min, log_max, log_start):
  """log T minimising the weighted NLL of the logits, in [log_min, log_max]."""

  def step(state):
    iteration, log_t, low, high, last_step, step_before, _ = state
    slope, curvature, slope_beta = _slope_and_curvature(
      logits, row_max, label_logit, weights, log_t
    )
    # The slope in beta changes sign at most once (convexity): where it is < 0 the NLL
    # still falls as T shrinks, so the optimum is below. A zero slope (the NLL flat in
    # T) counts as "above", so a T-independent NLL returns the top of the bracket.
    below = slope_beta < 0
    low, high = jnp.where(below, low, log_t), jnp.where(below, log_t, high)
    newton_step = -slope / jnp.where(curvature > 0, curvature, 1.0)
    newton = log_t + newton_step
    # Newton where it stays inside the bracket and at least halves the step before
    # last (Numerical Recipes' rtsafe), else bisection.
    use_newton = (curvature > 0) & (newton > low) & (newton < high)
    use_newton &= jnp.abs(newton_step) <= 0.5 * jnp.abs(step_before)
    # At the optimum already: stay (a step below log T's float32 spacing leaves
    # newton == log_t, which the bracket test would turn into a bisection far away).
    converged = (curvature > 0) & (jnp.abs(newton_step) < _TOLERANCE)
    following = jnp.where(use_newton, newton, 0.5 * (low + high))
    following = jnp.where(converged, log_t, following)
    done = converged | (jnp.abs(following - log_t) < _TOLERANCE) | (high - low < _TOLERANCE)
    return iteration + 1, following, low, high, following - log_t, last_step, done

  not_done = lambda state: (state[0] < _MAX_ITERATIONS) & ~state[-1]
  start = jnp.clip(log_start, log_min, log_max)
  width = log_max - log_min
  state = (0, start, log_min, log_max, width, width, jnp.zeros((), bool))
  _, log_t, low, high, *_ = jax.lax.while_loop(not_done, step, state)
  return jnp.clip(log_t, low, high)


def _example_cumulants(logits, row_max, beta, *, twice: bool = True):
  """Per example, the Taylor coefficients of log sum_k exp(b z_k) in b (z the centred
  logits): five [N] arrays at beta and at 2 beta (None without ``twice``), the log sum and
  the first four cumulants of z under softmax(b z), in one pass. From raw moments: the
  cancellation costs the third and fourth cumulants digits their small terms do not show."""

  def cumulants(block, block_max):
    z = block - block_max[:, None]
    z2 = z * z
    weights = jnp.exp(beta * z)
    out = []
    for w in (weights, weights * weights) if twice else (weights,):
      total = jnp.sum(w, axis=-1)
      wz, wz2 = w * z, w * z2
      m1, m2, m3, m4 = (jnp.sum(v, axis=-1) / total for v in (wz, wz2, wz2 * z, wz2 * z2))
      k2 = m2 - m1**2
      k3 = m3 - 3 * m1 * m2 + 2 * m1**3
      k4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4 - 3 * k2**2
      out += [jnp.log(total), m1, jnp.maximum(k2, 0.0), k3, k4]
    return tuple(out)

  values = row_blocks.map_row_blocks(cumulants, (logits, row_max))
  return values[:5], values[5:] if twice else None  # [N] arrays: no [5, N] copy


def _taylor(coefficients, step):
  """log sum_k exp(b z_k) at (expansion point + step), to fourth order; broadcasts."""
  value, first, second, third, fourth = coefficients
  return value + step * (first + step * (second / 2 + step * (third / 6 + step * fourth / 24)))


def _split_starts(cumulants, label_logit, weights, log_pooled, log_min, log_max):
  """Each row's (split's) log T to second order from the per-example cumulants at the pooled T.

  A split's slope in beta at beta0 + d is a + b d + c d^2 / 2, with a, b and c its weighted
  means of each example's softmax mean of the logits (minus its label's), variance and third
  cumulant at beta0; the root of that quadratic starts its Newton (a poor guess far from the
  pool costs passes, never a wrong answer).
  """
  beta = jnp.exp(-log_pooled)
  _, mean, variance, third, _ = cumulants
  terms = jnp.stack([mean - label_logit, variance, third], axis=-1)
  a, b, c = (weights @ terms / jnp.sum(weights, axis=-1, keepdims=True)).T
  first = -a / jnp.where(b > 0, b, 1.0)
  step = -a / jnp.where(b + 0.5 * c * first > 0, b + 0.5 * c * first, 1.0)
  beta_split = beta + jnp.where(jnp.abs(first) < 0.5 * beta, step, 0.0)
  log_start = -jnp.log(jnp.where(beta_split > 0, beta_split, beta))
  return jnp.clip(jnp.where(jnp.isfinite(log_start), log_start, log_pooled), log_min, log_max)


def _prepared(logits, labels, log_bounds):
  """Each row's max, its label's centred logit, the bounds in the logits' dtype (every pass
  centres its block in cache: no centred [N, K] copy)."""
  row_max = jnp.max(logits, axis=-1)
  label_logit = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0] - row_max
  return row_max, label_logit, tuple(v.astype(logits.dtype) for v in log_bounds)


def _pooled(weights, dtype):
  """The [F, N] weights' sum over rows, as one loop over [N] (a sum over axis 0 would
  first convert a bool mask into an [F, N] float array)."""
  return functools.reduce(jnp.add, [row.astype(dtype) for row in weights])


def _subsample_fit(logits, row_max, label_logit, weights, log_min, log_max):
  """log T of the pooled weights of the rows of ``weights`` [F, N], on every stride-th
  example (all of them below 4 x ``_SUBSAMPLE``), by Newton from T = 1."""
  pooled_weights = _pooled(weights, logits.dtype)
  stride = max(1, logits.shape[0] // _SUBSAMPLE) if logits.shape[0] >= 4 * _SUBSAMPLE else 1
  return _newton(
    logits[::stride], row_max[::stride], label_logit[::stride], pooled_weights[::stride],
    log_min, log_max, jnp.zeros_like(log_min),
  )  # fmt: skip


@jax.jit
def _fit_temperature(logits, labels, weights, log_min, log_max, log_start):
  """T of each row of ``weights`` [F, N]: [F] temperatures."""
  weights = weights.astype(logits.dtype)
  row_max, label_logit, (log_min, log_max, log_start) = _prepared(
    logits, labels, (log_min, log_max, log_start)
  )
  if weights.shape[0] == 1:
    log_t = _newton(logits, row_max, label_logit, weights[0], log_min, log_max, log_start)
    return jnp.exp(log_t)[None]
  # Several splits: a fit of their pooled weights, then each split's from _split_starts.
  pooled_weights = jnp.sum(weights, 0)
  if logits.shape[0] >= 4 * _SUBSAMPLE:
    log_start = _subsample_fit(logits, row_max, label_logit, weights, log_min, log_max)
  pooled = _newton(logits, row_max, label_logit, pooled_weights, log_min, log_max, log_start)
  cumulants, _ = _example_cumulants(logits, row_max, jnp.exp(-pooled), twice=False)
  starts = _split_starts(cumulants, label_logit, weights, pooled, log_min, log_max)

  def fit_row(_, row):
    row_weights, row_start = row
    return None, _newton(logits, row_max, label_logit, row_weights, log_min, log_max, row_start)

  _, log_t = jax.lax.scan(fit_row, None, (weights, starts))
  return jnp.exp(log_t)


@jax.jit
def _softmax_terms_at(logits, labels, temperature):
  """[N] multiclass Brier and pmax of softmax(logits / T), one T: one program for every T."""
  terms = functools.partial(events.block_softmax_terms, temperature=temperature)
  return row_blocks.map_row_blocks(terms, (logits, jnp.max(logits, axis=-1), labels))


@jax.jit
def _fit_splits_by_cumulants(logits, labels, weights, log_min, log_max, log_expansion):
  """``fit_splits`` from one pass of per-example cumulants at one beta0.

  beta0 = 1 / T of the pooled weights' fit on a subsample (``log_expansion`` overrides it
  where finite). Each row's NLL slope in beta is a cubic in the step d from beta0; Newton on
  it gives the row's beta. Returns the [F] T, the [F] steps d and betas, whether each split
  lay within ``_TAYLOR_REACH`` of beta0 with finite terms, the pooled fit's log T, and the
  expansion (five [N] cumulants at beta0 and at 2 beta0, the labels' centred logits [N]).
  """
  row_max, label_logit, (log_min, log_max) = _prepared(logits, labels, (log_min, log_max))
  start = _subsample_fit(logits, row_max, label_logit, weights, log_min, log_max)
  beta = jnp.exp(-jnp.where(jnp.isfinite(log_expansion), log_expansion, start))
  at_beta, at_twice = _example_cumulants(logits, row_max, beta)
  terms = jnp.stack([at_beta[1] - label_logit, *at_beta[2:]], axis=-1)  # [N, 4]

  def means(row):  # a row of weights' means of the terms, one [N] float row at a time
    row = row.astype(terms.dtype)
    return jnp.matmul(row, terms, precision=jax.lax.Precision.HIGHEST) / jnp.sum(row)

  pooled = means(_pooled(weights, terms.dtype))
  a, b, c, d = jnp.concatenate([jax.lax.map(means, weights), pooled[None]]).T

  def newton_step(step):
    slope = a + step * (b + step * (c / 2 + step * d / 6))
    curvature = b + step * (c + step * d / 2)
    return slope / jnp.where(curvature > 0, curvature, jnp.nan)

  step = jax.lax.fori_loop(0, _TAYLOR_STEPS, lambda _, x: x - newton_step(x), jnp.zeros_like(a))
  within = (jnp.abs(step) <= _TAYLOR_REACH * beta) & (
    jnp.abs(newton_step(step)) < _TOLERANCE * beta
  )
  row_beta = jnp.clip(beta + step, jnp.exp(-log_max), jnp.exp(-log_min))
  within &= row_beta == beta + step  # a fit at the bracket's end: the exact route
  expansion, at = (at_beta, at_twice, label_logit), (step[:-1], row_beta[:-1])
  finite = lambda f: jnp.isfinite(jnp.stack(_expanded_terms(*expansion, *at, f))).all()
  within = within[:-1] & jax.lax.map(finite, jnp.arange(weights.shape[0]))
  return 1 / at[1], at, within, -jnp.log(row_beta[-1]), expansion


@jax.jit
def _expanded_terms(at_beta, at_twice, label_logit, steps, betas, f):
  """Each example's multiclass Brier and pmax at split f's beta = beta0 + ``steps[f]``
  (``betas[f]``), from the cumulants at beta0 and 2 beta0: fourth-order Taylor series of
  its log sum exp."""
  step, beta = steps[f], betas[f]
  log_total = _taylor(at_beta, step)
  log_total_twice = _taylor(at_twice, 2 * step)
  label_prob = jnp.exp(beta * label_logit - log_total)
  # sum_k p_k^2 - 2 p_label + 1; clipped: rounding can take a tiny Brier below 0.
  brier = jnp.maximum(jnp.exp(log_total_twice - 2 * log_total) - 2 * label_prob + 1, 0.0)
  return brier, jnp.exp(-log_total)


def _checked(logits, labels, weights, ndim):
  """The logits, labels and weights (as [F, N] rows; None: one row of ones), checked."""
  logits = score_functions.checked_logits(logits)
  validation.check_nonempty("logits", logits)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  if weights is None:
    return logits, labels, np.ones((1, logits.shape[0]), bool)
  # Checked on the host (a device array stays where it is); a bool mask stays bool.
  on_host = not isinstance(weights, jax.Array)
  is_mask = getattr(weights, "dtype", None) == np.bool_
  read = validation.as_array if is_mask else validation.float_array
  weights = read("weights", weights, ndim, host=on_host)
  if weights.shape[-1] != logits.shape[0]:
    raise ValueError(
      f"weights: expected {logits.shape[0]} weights per row (one per example), got shape"
      f" {weights.shape}"
    )
  if not validation.is_traced(weights):
    host = np.asarray(weights)
    if not (np.all(host >= 0) and np.all(np.sum(host, axis=-1) > 0)):
      raise ValueError("weights: expected weights >= 0 with a positive sum (in every row)")
  if weights.dtype != np.bool_:
    weights = weights.astype(logits.dtype)
  return logits, labels, weights.reshape(-1, logits.shape[0])


def softmax_terms(logits: ArrayLike, labels: ArrayLike, temperatures: ArrayLike):
  """([F, N] sum_k (p_k - y_k)^2, [F, N] max_k p_k) of softmax(logits / T) for each of the
  [F] ``temperatures`` T > 0, of [N, K] float ``logits`` (K >= 2) and [N] int ``labels`` in
  [0, K): one pass over the logits per T."""
  logits, labels, _ = _checked(logits, labels, None, 2)
  temperatures = validation.float_array("temperatures", temperatures, 1).astype(logits.dtype)
  if not validation.is_traced(temperatures):
    for t in np.asarray(temperatures):
      validation.in_range("temperatures", float(t), MIN_TEMPERATURE, MAX_TEMPERATURE)
  per_t = [_softmax_terms_at(logits, labels, t) for t in temperatures]
  return tuple(jnp.stack(terms) for terms in zip(*per_t, strict=True))


class SplitFits(NamedTuple):
  """``fit_splits``'s result: per split, T and each example's softmax terms under it."""

  temperature: jax.Array  # [F]
  # terms(f): [N] sum_k (p_k - y_k)^2 and [N] max_k p_k under softmax(logits / T_f), made
  # when asked for, one split at a time: never [F, N].
  terms: Callable[[int], tuple[jax.Array, jax.Array]]


def fit_splits(logits: ArrayLike, labels: ArrayLike, weights: ArrayLike) -> SplitFits:
  """T fitted on each row of ``weights`` (a split's calibration part), and every
  example's multiclass Brier and pmax under each split's softmax(logits / T), split by split.

  From per-example cumulants of the logits (a fourth-order Taylor series in 1/T) where every
  split lies near the expansion point, else by the exact route (``fit_temperature``, then a
  pass per split); the routes agree to float32 rounding (docs/api.md).

  ``logits`` [N, K] float (N >= 1, K >= 2), ``labels`` [N] int in [0, K), ``weights``
  [F, N] >= 0, each row with a positive sum (a bool mask works).
  """
  logits, labels, weights = _checked(logits, labels, weights, ndim=2)
  log_bounds = (np.float32(np.log(MIN_TEMPERATURE)), np.float32(np.log(MAX_TEMPERATURE)))
  expansion = np.float32(np.nan)  # first from the subsample's fit, then the pool's
  for _ in range(2 if logits.size >= _CUMULANTS_FROM else 0):
    fitted, at, within, expansion, cumulants = _fit_splits_by_cumulants(
      logits, labels, weights, *log_bounds, expansion
    )
    if bool(np.all(np.asarray(within))):
      return SplitFits(fitted, functools.partial(_expanded_terms, *cumulants, *at))
  fitted = _fit_temperature(logits, labels, weights, *log_bounds, np.float32(0.0))
  return SplitFits(fitted, lambda f: _softmax_terms_at(logits, labels, fitted[f]))


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

  Minimises the multiclass NLL over log T in [log min_temperature, log max_temperature]
  (the benchmark's bracket by default) by Newton's method safeguarded by bisection. Where
  the NLL keeps falling to an end of the bracket that end is returned; where it does not
  depend on T (equal logits), ``max_temperature``.

  Args:
    logits: [N, K] float, calibration-split logits (N >= 1, K >= 2); labels: [N] int in [0, K).
    min_temperature: the bracket's low end, 0 < min_temperature < max_temperature.
    max_temperature: the bracket's high end.
    weights: optional [N] example weights >= 0 (e.g. a split's calibration mask): the
      NLL is their weighted mean. Or [F, N], one row per split: F temperatures.
    initial_temperature: where Newton starts; the result does not depend on it beyond
      the tolerance of 1e-6 in log T.

  Returns:
    [] float, T > 0 (or [F] with [F, N] weights). Apply it with ``apply_temperature``.
  """
  low, high = float(min_temperature), float(max_temperature)
  if not (np.isfinite(low) and np.isfinite(high) and 0.0 < low < high):
    raise ValueError(
      "min_temperature, max_temperature: expected finite 0 < min < max,"
      f" got {min_temperature!r}, {max_temperature!r}"
    )
  logits, labels, rows = _checked(logits, labels, weights, (1, 2))
  start = float(initial_temperature)
  if not (np.isfinite(start) and start > 0):
    raise ValueError(f"initial_temperature: expected a finite T > 0, got {initial_temperature!r}")
  fitted = _fit_temperature(
    logits, labels, rows, *(np.float32(np.log(v)) for v in (low, high, start))
  )
  return fitted if np.ndim(weights) == 2 else fitted[0]


_apply_temperature = jax.jit(lambda logits, temperature: logits / temperature)


def apply_temperature(logits: ArrayLike, temperature: ArrayLike) -> jax.Array:
  """Temperature-scaled logits ``logits / T`` of [N, K] or [S, N, K] float ``logits`` and []
  float T > 0 (from ``fit_temperature``): logits, to stay in log space (the ranking, hence
  Top-1 binning, is unchanged by T; ``jax.nn.softmax`` gives the probabilities)."""
  logits = validation.float_array("logits", logits, (2, 3))
  temperature = validation.float_array("temperature", temperature, 0)
  # Within fit_temperature's range: beyond it logits / T overflows.
  if not validation.is_traced(temperature):
    validation.in_range("temperature", float(temperature), MIN_TEMPERATURE, MAX_TEMPERATURE)
  return _apply_temperature(logits, temperature)


def _fit_evidence(evidence: base.Evidence) -> jax.Array:
  if evidence.labels is None:
    raise ValueError("labels: temperature scaling is fitted on the true labels, got None")
  return fit_temperature(evidence.log_probs, evidence.labels)


def _predict_evidence(temperature: jax.Array, evidence: base.Evidence) -> np.ndarray:
  scaled = apply_temperature(evidence.log_probs, temperature)
  neg_log_mass = scores.compute_one(scores.topk_name(evidence.k), scaled)
  return np.exp(-np.asarray(neg_log_mass))  # on the host: no program for one exp


def _from_dict(d, source: str) -> jax.Array:
  t = base.read_number(d, "temperature", source, MIN_TEMPERATURE, MAX_TEMPERATURE)
  return jax.device_put(np.float32(t))


def _fit_splits_evidence(evidence: base.Evidence, calibration: np.ndarray) -> base.SplitFit | None:
  """``fit_splits`` as the protocol's fast path: the Top-1 event only (it gives pmax)."""
  if evidence.k != 1 or evidence.labels is None:
    return None
  fits = fit_splits(evidence.log_probs, evidence.labels, calibration)

  def split(f):
    brier, pmax = fits.terms(f)
    return pmax, {"multiclass_brier": brier}

  return base.SplitFit(split, {"temperature": fits.temperature})


ESTIMATOR = base.Estimator(
  name="temperature",
  needs="log_probs",
  fit=_fit_evidence,
  predict=_predict_evidence,
  to_dict=lambda temperature: {"temperature": float(temperature)},
  from_dict=_from_dict,
  fit_splits=_fit_splits_evidence,
)
"""One T for softmax(logits / T) by multiclass NLL; P(correct) is the scaled Top-k mass."""
