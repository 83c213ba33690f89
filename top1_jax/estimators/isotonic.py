"""Isotonic estimate of P(correct | U): pool-adjacent-violators with the bins' prior.

The monotone fit (non-increasing in U by default) cuts the points into blocks, each
predicting ``(hits + p_A) / (count + 1)``; ``prior=False`` is scikit-learn's
``IsotonicRegression(out_of_bounds="clip")``. ``fit`` runs on the host.
"""

import functools
from typing import NamedTuple

import jax
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, validation
from top1_jax.estimators import base, table


class IsotonicModel(NamedTuple):
  """A fitted isotonic estimate (a pytree of jax arrays).

  Attributes:
    knots: [K] float32, the first and last distinct calibration score of each block,
      ascending, padded (``table.pad``).
    prob: [K] float32, P(correct) at the knots.
    counts: [B] int32, calibration examples per block, in ascending U.
    hits: [B] int32, correct examples per block.
    prior: [] float32, the calibration accuracy p_A.
  """

  knots: jax.Array
  prob: jax.Array
  counts: jax.Array
  hits: jax.Array
  prior: jax.Array

  @property
  def num_blocks(self) -> int:
    return self.counts.shape[0]


def _hull_corners(count_below: np.ndarray, hits_below: np.ndarray, sign: int):
  """The corners of the concave (sign 1) or convex (sign -1) hull of the cumulative diagram,
  whose slope is the isotonic fit. Each pass deletes every point that is not a strict
  corner between its current neighbours (docs/performance.md)."""
  x, y = count_below, hits_below
  while x.shape[0] > 2:
    dx, dy = np.diff(x), np.diff(y)
    # Slope in > slope out, cross-multiplied: exact on whole counts.
    strict = sign * (dy[:-1] * dx[1:] - dy[1:] * dx[:-1]) > 0
    if strict.all():
      break
    keep = np.concatenate([[True], strict, [True]])
    x, y = x[keep], y[keep]
  return x, y


def _repool(counts, hits, first, last, prior, sign):
  """Pools runs of neighbouring blocks whose prior-smoothed values are out of order."""
  while counts.shape[0] > 1:
    prob = binning.calibrated_prob(hits, counts, prior)
    wrong_way = sign * (prob[1:] - prob[:-1]) > 0
    if not wrong_way.any():
      break
    starts = np.flatnonzero(np.concatenate([[True], ~wrong_way]))
    ends = np.concatenate([starts[1:], [counts.shape[0]]]) - 1
    counts = np.add.reduceat(counts, starts)
    hits = np.add.reduceat(hits, starts)
    first, last = first[starts], last[ends]
  return counts, hits, first, last


def _knot_table(first, last, values):
  """Knots at each block's first and last distinct score, padded to a power of two."""
  knots = np.stack([first, last], axis=1).reshape(-1)
  prob = np.repeat(values, 2)
  distinct = np.concatenate([[True], knots[1:] != knots[:-1]])
  return table.pad(knots[distinct], prob[distinct])


def fit(
  u: ArrayLike, correct: ArrayLike, *, increasing: bool = False, prior: bool = True
) -> IsotonicModel:
  """Fits a monotone P(correct | U) on [N] scores ``u`` and events ``correct``.

  Args:
    increasing: False for an uncertainty, True for a confidence.
    prior: True gives each block ``(hits + p_A) / (count + 1)``, strictly inside (0, 1)
      unless 0 or 1 = p_A; False the plain block accuracies.
  """
  u, correct = base.host_scores("isotonic.fit", u, correct)
  increasing = base.checked_bool("increasing", increasing)
  prior = base.checked_bool("prior", prior)
  order = np.argsort(u)
  sorted_u = u[order]
  # Tie groups are pooled: the diagram has one point per distinct score.
  group_end = np.append(np.flatnonzero(sorted_u[1:] != sorted_u[:-1]) + 1, u.shape[0])
  count_below = np.concatenate([[0], group_end]).astype(np.int64)
  hits_below = np.concatenate([[0], np.cumsum(correct[order], dtype=np.int64)])[count_below]
  sign = -1 if increasing else 1
  corner_count, corner_hits = _hull_corners(count_below, hits_below, sign)
  counts, hits = np.diff(corner_count), np.diff(corner_hits)
  first, last = sorted_u[corner_count[:-1]], sorted_u[corner_count[1:] - 1]
  p_a = np.float32(hits.sum()) / np.float32(counts.sum())  # as binning computes it
  if prior:
    counts, hits, first, last = _repool(counts, hits, first, last, np.float64(p_a), sign)
    values = binning.calibrated_prob(hits, counts, np.float64(p_a))
  else:
    values = hits / counts
  return _on_device(*_knot_table(first, last, values), counts, hits, p_a)


def _on_device(knots, prob, counts, hits, prior) -> IsotonicModel:
  """The model of host values, in its dtypes, moved as they are: jnp conversions would
  compile a small program each."""
  fields = (validation.in_device_dtype(knots), prob.astype(np.float32))
  fields += (counts.astype(np.int32), hits.astype(np.int32), np.float32(prior))
  return IsotonicModel(*jax.device_put(fields))


def predict(model: IsotonicModel, u: ArrayLike) -> jax.Array:
  """[N] float32 P(correct) of scores ``u``: linear between block ends, clipped beyond."""
  validation.instance("model", model, IsotonicModel, "isotonic.IsotonicModel from isotonic.fit")
  u = validation.float_array("u", u, 1)
  return table.interpolate(u, model.knots, model.prob)


to_dict = table.to_json  # the fitted model as JSON values (``from_dict`` reads it back exactly)


def from_dict(d, source: str) -> IsotonicModel:
  """An ``IsotonicModel`` from ``to_dict``'s values, each checked."""
  knots, prob = table.read_knots(d, source, "prob")
  counts = base.read_array(d, "counts", source, "i")
  hits = base.read_array(d, "hits", source, "i")
  if np.any((prob < 0) | (prob > 1)):
    raise ValueError(f"{source}: field 'prob' must lie in [0, 1]")
  steps = np.diff(prob)
  if np.any(steps > 0) and np.any(steps < 0):  # pool-adjacent-violators makes it monotone
    raise ValueError(f"{source}: field 'prob' must be monotone in the knots, as fit makes it")
  if counts.shape != hits.shape or np.any(hits < 0) or np.any(hits > counts):
    raise ValueError(f"{source}: counts and hits must be as many integers, 0 <= hits <= counts")
  if counts.size == 0 or np.any(counts < 1):
    raise ValueError(f"{source}: field 'counts' must count one or more examples per block")
  return _on_device(knots, prob, counts, hits, base.read_accuracy(d, source, counts, hits))


def _fit_evidence(evidence: base.Evidence, *, increasing: bool = False, prior: bool = True):
  return fit(evidence.u, evidence.correct, increasing=increasing, prior=prior)


ESTIMATOR = base.Estimator(
  name="isotonic",
  needs="scores",
  fit=_fit_evidence,
  predict=lambda model, evidence: predict(model, evidence.u),
  to_dict=to_dict,
  from_dict=from_dict,
  options=("increasing", "prior"),
  option_checks={n: functools.partial(base.checked_bool, n) for n in ("increasing", "prior")},
)
