"""Plain NumPy reference implementations: the spec the fast code is checked against.

Written the straightforward way, in float64, one split and one bin count at a
time. Of the library it uses only the definition of the quantile ranks
(``binning.quantile_edge_ranks``, the paper's floor(i M / n)); bin assignment,
counting and every metric are written here again as plain loops, so the tests
check the library's code against an independent spelling of the rules, and
``benchmarks/`` times them as the naive baseline. Slow by design: a test oracle,
not API (it lives with the tests).
"""

from collections.abc import Sequence

import numpy as np

from top1_jax.core import binning


def fit_bins(u: np.ndarray, correct: np.ndarray, n_bins: int):
  """Equal-count bins: (edges, counts, hits, prob, prior); edges without padding."""
  u = np.asarray(u, np.float64)
  correct = np.asarray(correct, bool)
  sorted_u = np.sort(u)
  edges = []
  for rank in binning.quantile_edge_ranks(len(u), n_bins):
    value = sorted_u[rank - 1]
    if not edges or value > edges[-1]:
      edges.append(value)
  edges = np.array(edges)
  index = assign(edges, u)
  counts = np.zeros(n_bins, np.int64)
  hits = np.zeros(n_bins, np.int64)
  for i in range(n_bins):
    counts[i] = np.sum(index == i)
    hits[i] = np.sum(correct[index == i])
  prior = correct.mean()
  prob = (hits + prior) / (counts + 1)
  return edges, counts, hits, prob, prior


def assign(edges: np.ndarray, u: np.ndarray) -> np.ndarray:
  """Bin of each score: how many edges lie strictly below it (right-closed bins)."""
  return np.sum(np.asarray(u, np.float64)[:, None] > np.asarray(edges)[None, :], axis=1)


def brier(p: np.ndarray, correct: np.ndarray) -> float:
  return float(np.mean((np.asarray(p, np.float64) - correct) ** 2))


def nll(p: np.ndarray, correct: np.ndarray, eps: float = 2.0**-23) -> float:
  p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
  return float(np.mean(np.where(correct, -np.log(p), -np.log(1 - p))))


def auroc(score: np.ndarray, correct: np.ndarray) -> float:
  """Mann–Whitney U with mid-ranks for ties."""
  score = np.asarray(score, np.float64)
  correct = np.asarray(correct, bool)
  values, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
  first_rank = np.concatenate([[1], 1 + np.cumsum(counts)[:-1]])
  mid_rank = first_rank + (counts - 1) / 2
  ranks = mid_rank[inverse]
  num_pos = correct.sum()
  num_neg = len(correct) - num_pos
  if num_pos == 0 or num_neg == 0:
    return float("nan")  # undefined with one class
  return float((ranks[correct].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def binned_scores(prob: np.ndarray, prior: float, index: np.ndarray, correct: np.ndarray) -> dict:
  """Every metric of bin predictions ``prob`` on test examples in bins ``index``."""
  n_bins = len(prob)
  correct = np.asarray(correct, bool)
  p = prob[index]
  acc = correct.mean()
  ece = eor = unc_res_b = cal_b = res_n = cal_n = 0.0
  for i in range(n_bins):
    in_bin = index == i
    if not in_bin.any():
      continue
    w = in_bin.mean()
    a = correct[in_bin].mean()
    ece += w * abs(a - prob[i])
    if 0 < prior < 1:
      odds = prob[i] / (1 - prob[i])
      base = prior / (1 - prior)
      eor += w * max(odds / base, base / odds)
    unc_res_b += w * (a - acc) ** 2
    cal_b += w * (prob[i] - a) ** 2
    res_n += w * _kl(a, acc)
    cal_n += w * _kl(a, prob[i])
  return {
    "accuracy": acc,
    "brier": brier(p, correct),
    "brier_uncertainty": acc * (1 - acc),
    "brier_resolution": unc_res_b,
    "brier_calibration": cal_b,
    "nll": nll(p, correct),
    "nll_uncertainty": _entropy(acc),
    "nll_resolution": res_n,
    "nll_calibration": cal_n,
    "ece": ece,
    "eor": eor if 0 < prior < 1 else float("nan"),  # undefined without a base rate inside (0, 1)
    "auroc": auroc(p, correct),
  }


def _entropy(a: float) -> float:
  return -sum(x * np.log(x) for x in (a, 1 - a) if x > 0)


def _kl(a: float, p: float, eps: float = 2.0**-23) -> float:
  """KL(Bernoulli(a) || Bernoulli(p)), p clipped like ``nll``."""
  p = min(max(p, eps), 1 - eps)
  return sum(x * np.log(x / y) for x, y in ((a, p), (1 - a, 1 - p)) if x > 0)


def served_prob(hits: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """The bins' probabilities as the library serves them: float32 arithmetic.

  Scored in float64 afterwards. Needed where ties matter: two bins whose exact
  probabilities are equal, (3 + 0.6) / 6 and 0.6 / 1, differ by an ulp in float32,
  and AUROC counts a tie as one half but an ulp as a win.
  """
  f32 = np.float32
  prior = f32(hits.sum()) / f32(counts.sum())
  return ((hits.astype(f32) + prior) / (counts.astype(f32) + f32(1))).astype(np.float64)


def cross_validate(
  u: np.ndarray, correct: np.ndarray, n_bins: Sequence[int], test_masks: Sequence[np.ndarray]
) -> dict[str, np.ndarray]:
  """Per-split metrics [len(n_bins), len(test_masks)], sorting each calibration split."""
  u = np.asarray(u, np.float64)
  correct = np.asarray(correct, bool)
  out: dict[str, np.ndarray] = {}
  for f, test in enumerate(test_masks):
    cal = ~test
    for b, n in enumerate(n_bins):
      edges, counts, hits, _, prior = fit_bins(u[cal], correct[cal], n)
      prob = served_prob(hits, counts)
      row = binned_scores(prob, prior, assign(edges, u[test]), correct[test])
      row["num_effective_bins"] = float(np.sum(counts > 0))
      for k, v in row.items():
        out.setdefault(k, np.zeros((len(n_bins), len(test_masks))))[b, f] = v
  return out


def covariance_norm(samples: np.ndarray) -> np.ndarray:
  """||np.cov||_2 of each example's samples, via the K x K covariance: [S, N, K] -> [N]."""
  samples = np.asarray(samples, np.float64)
  return np.array(
    [
      np.linalg.eigvalsh(np.cov(samples[:, n, :], rowvar=False))[-1]
      for n in range(samples.shape[1])
    ]
  )


# Top-label histogram binning, ported from the reference code of Gupta & Ramdas, "Top-label
# calibration and multiclass-to-binary reductions" (ICLR 2022; AIgen/df-posthoc-calibration,
# calibration.py: get_uniform_mass_bins, bin_points, nudge, HB_binary, HB_toplabel), with the
# same loops, float64 and noise; only the prior (an option of the library) is added, and the
# classes are numbered from 0 and the noise drawn from a seeded generator.


def _nudge(values, delta: float, rng: np.random.Generator) -> np.ndarray:
  """The reference's delta-randomisation: (x + U[0, delta)) / (1 + delta)."""
  values = np.asarray(values, np.float64)
  return (values + rng.uniform(low=0, high=delta, size=values.shape)) / (1 + delta)


def uniform_mass_upper_edges(scores: np.ndarray, n_bins: int) -> np.ndarray:
  """``get_uniform_mass_bins``: the largest score of each of ``np.array_split``'s groups
  of the sorted scores but the last, then +inf."""
  groups = np.array_split(np.sort(scores), n_bins)
  return np.array([np.max(group) for group in groups[:-1]] + [np.inf])


def bin_points(scores: np.ndarray, upper_edges: np.ndarray) -> np.ndarray:
  """``bin_points``: how many upper edges lie strictly below each score."""
  return np.sum(np.reshape(scores, (-1, 1)) > np.reshape(upper_edges, (1, -1)), axis=1)


class HistogramBinning:
  """``HB_binary``: equal-mass bins of a score, each predicting its mean outcome."""

  def __init__(self, n_bins: int, delta: float, rng: np.random.Generator, prior: bool = False):
    self.n_bins, self.delta, self.rng, self.prior = n_bins, delta, rng, prior

  def fit(self, scores, outcome):
    scores = _nudge(scores, self.delta, self.rng)
    outcome = np.asarray(outcome, np.float64)
    self.upper_edges = uniform_mass_upper_edges(scores, self.n_bins)
    assigned = bin_points(scores, self.upper_edges)
    self.counts = np.zeros(self.n_bins, np.int64)
    self.mean = np.empty(self.n_bins)
    for i in range(self.n_bins):
      in_bin = assigned == i
      self.counts[i] = np.sum(in_bin)
      if self.prior:  # the library's option: one pseudo-count at the class's accuracy
        self.mean[i] = (np.sum(outcome[in_bin]) + outcome.mean()) / (self.counts[i] + 1)
      elif self.counts[i] > 0:
        self.mean[i] = _nudge(outcome[in_bin].mean(), self.delta, self.rng)
      else:
        self.mean[i] = _nudge(0.5, self.delta, self.rng)
    assert self.counts.sum() == outcome.size
    return self

  def predict(self, scores) -> np.ndarray:
    return self.mean[bin_points(_nudge(scores, self.delta, self.rng), self.upper_edges)]


class TopLabelHistogramBinning:
  """``HB_toplabel``: per predicted class, ``n_c // points_per_bin`` bins of the top score;
  a class with fewer points than one bin is left uncalibrated (the top score itself)."""

  def __init__(self, points_per_bin=50, delta=1e-10, seed=0, prior=False):
    self.points_per_bin, self.delta, self.prior = points_per_bin, delta, prior
    self.rng = np.random.default_rng(seed)

  def fit(self, probs: np.ndarray, labels: np.ndarray):
    top_score, predicted = np.max(probs, axis=1), np.argmax(probs, axis=1)
    self.per_class = []
    for c in range(probs.shape[1]):
      members = np.flatnonzero(predicted == c)
      n_bins = members.size // self.points_per_bin
      if n_bins == 0:
        self.per_class.append(None)  # the reference's identity()
      else:
        binning_c = HistogramBinning(n_bins, self.delta, self.rng, self.prior)
        self.per_class.append(binning_c.fit(top_score[members], labels[members] == c))
    return self

  def predict(self, probs: np.ndarray) -> np.ndarray:
    top_score, predicted = np.max(probs, axis=1), np.argmax(probs, axis=1)
    out = np.zeros(top_score.shape[0])
    for i in range(top_score.shape[0]):
      fitted = self.per_class[predicted[i]]
      out[i] = top_score[i] if fitted is None else fitted.predict(top_score[i : i + 1])[0]
    return out
