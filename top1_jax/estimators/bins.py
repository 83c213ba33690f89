"""The paper's estimator as a registry entry: equal-count bins of U (``core.binning``)."""

from collections.abc import Mapping

import jax
import numpy as np

from top1_jax.core import binning
from top1_jax.estimators import base, bin_count, bins_crossval


def fit(evidence: base.Evidence, *, n_bins: int | str = 20) -> binning.Bins:
  """Equal-count bins of ``evidence.u``.

  Args:
    n_bins: the bin count, in [1, N], or ``"cv"``: the count of ``bin_count.DEFAULT_GRID``
      with the lowest held-out NLL in nested cross-validation on this data (seed 0).
  """
  if isinstance(n_bins, str):
    if n_bins != "cv":
      raise ValueError(f'n_bins: expected an integer or "cv", got {n_bins!r}')
    return bin_count.fit_cv(evidence.u, evidence.correct)[0]
  return binning.fit(evidence.u, evidence.correct, n_bins)  # which checks n_bins


def predict_interval(bins: binning.Bins, evidence: base.Evidence, delta: float = 0.05):
  """(lower, upper), each [N] float32: the exact (Clopper–Pearson) 1 - delta interval of
  each example's bin accuracy."""
  lower, upper = binning.clopper_pearson(bins.hits, bins.counts, delta)
  index = np.asarray(binning.assign(bins.edges, evidence.u))
  return np.asarray(lower)[index], np.asarray(upper)[index]


def to_dict(bins: binning.Bins) -> dict:
  """The bins as JSON values (only the finite edges)."""
  edges = np.asarray(bins.edges, np.float64)
  return {
    "n_bins": int(bins.counts.shape[-1]),
    "edges": edges[np.isfinite(edges)].tolist(),
    "counts": np.asarray(bins.counts).tolist(),
    "hits": np.asarray(bins.hits).tolist(),
    "prior": float(bins.prior),
    "prob": np.asarray(bins.prob, np.float64).tolist(),
  }


def from_dict(d: Mapping, source: str) -> binning.Bins:
  """``Bins`` from ``to_dict``'s values, each checked (``host_from_dict``), on the device."""
  return binning.Bins(*jax.device_put(tuple(host_from_dict(d, source))))


def host_from_dict(d: Mapping, source: str) -> binning.Bins:
  """``from_dict``'s ``Bins`` as host arrays, e.g. to stack several first. The table must be
  one ``binning.fit`` makes; the probabilities are recomputed, never read."""
  n = base.read_int(d, "n_bins", source, maximum=binning.MAX_BINS)
  edges, counts, hits = base.read_bin_table(d, source, n)
  total = int(np.sum(counts))
  if total < n:
    raise ValueError(
      f"{source}: field 'n_bins' is {n}, more than the {total} calibration examples the"
      " saved counts add up to (fit makes at most one bin per example)"
    )
  problem = base.counts_problem(counts, edges.shape[0], binning.quantile_edge_ranks(total, n))
  if problem is not None:
    raise ValueError(f"{source}: not bins binning.fit makes: {problem}; fit them again")
  prior = base.read_accuracy(d, source, counts, hits)
  padded = np.full(n - 1, np.inf, np.float32)
  padded[: edges.shape[0]] = edges
  # On the host in float32, as binning.fit computes them (jnp would compile programs).
  counts, hits, prior = counts.astype(np.int32), hits.astype(np.int32), np.float32(prior)
  prob = binning.calibrated_prob(hits.astype(np.float32), counts.astype(np.float32), prior)
  effective = np.int32(np.sum(counts > 0))
  return binning.Bins(padded, counts, hits, prob, prior, effective)


ESTIMATOR = base.Estimator(
  name="bins",
  needs="scores",
  fit=fit,
  predict=lambda bins, evidence: binning.predict(bins, evidence.u),
  to_dict=to_dict,
  from_dict=from_dict,
  options=("n_bins",),
  predict_interval=predict_interval,
  cross_validate=bins_crossval.cross_validate,
)
