"""Plain NumPy ports of the published conformal set algorithms: the oracle of tests/test_sets.py.

Written from the papers, one example and one label at a time, in float64:

* LAC / THR (Sadinle, Lei & Wasserman, JASA 2019): the score of label y is 1 - p_y; the set
  holds every label whose score is at most the threshold (p_y >= 1 - q).
* APS (Romano, Sesia & Candes, NeurIPS 2020): the generalised inverse quantile score of y
  is the mass of the labels ranked above it plus u p_y for a uniform u drawn once per
  example (randomized), or the mass above it alone (non-randomized: the set is the
  smallest Top-L whose mass exceeds the threshold, the top label always in).
* RAPS (Angelopoulos, Bates, Malik & Jordan, ICLR 2021): APS's score plus
  lam * (o(y) - k_reg)^+ for o(y) the label's 1-based rank; k_reg is the 1 - alpha
  quantile (numpy's "higher") of the true labels' 1-based ranks on a tuning part of the
  calibration data, and lam the first value of (0.001, 0.01, 0.1, 0.2, 0.5) whose sets,
  calibrated on that tuning part, are smallest there on average; the quantile is then
  taken over the rest of the calibration data.

The threshold is the ceil((n + 1)(1 - alpha))-th smallest calibration score (+inf when
that exceeds n), and the set of x is {y : score(x, y) <= threshold}. Labels are ranked by
decreasing probability, ties towards the lower class index (a stable sort).

``topk_sets`` is the loop form of the package's own method (the paper's bins of each k,
fitted with ``binning.fit`` on ``scores.neg_log_topk_mass``), for its vectorised path.
"""

import math

import numpy as np

LAMBDAS = (0.001, 0.01, 0.1, 0.2, 0.5)


def softmax(logits: np.ndarray) -> np.ndarray:
  z = np.asarray(logits, np.float64)
  z = np.exp(z - z.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)


def ranking(probs: np.ndarray) -> np.ndarray:
  """The labels of one example by decreasing probability, ties by lower index."""
  return np.argsort(-probs, kind="stable")


def quantile(scores: list[float], alpha: float) -> float:
  n = len(scores)
  rank = math.ceil(round((n + 1) * (1 - alpha), 9))
  return math.inf if rank > n else sorted(scores)[rank - 1]


def lac_score(probs: np.ndarray, label: int, u: float = 0.0) -> float:
  del u
  return 1.0 - probs[label]


def aps_score(probs: np.ndarray, label: int, u: float) -> float:
  """The mass ranked above ``label`` plus u times its own (u = 0: non-randomized)."""
  order = list(ranking(probs))
  above = sum(probs[j] for j in order[: order.index(label)])
  return above + u * probs[label]


def raps_score(probs: np.ndarray, label: int, u: float, k_reg: int, lam: float) -> float:
  rank = list(ranking(probs)).index(label) + 1
  return aps_score(probs, label, u) + lam * max(rank - k_reg, 0)


def label_set(score, probs: np.ndarray, u: float, q: float) -> np.ndarray:
  """[K] bool: the labels whose score is at most q."""
  return np.array([score(probs, y, u) <= q for y in range(probs.shape[0])])


def conformal_sets(score, probs_cal, labels_cal, u_cal, probs_test, u_test, alpha):
  """(sorted calibration scores, [N_test, K] bool sets) of one score function."""
  cal = [score(p, y, u) for p, y, u in zip(probs_cal, labels_cal, u_cal, strict=True)]
  q = quantile(cal, alpha)
  sets = [label_set(score, p, u, q) for p, u in zip(probs_test, u_test, strict=True)]
  return sorted(cal), np.stack(sets)


def raps_parameters(probs, labels, u, alpha: float) -> tuple[int, float]:
  """RAPS's k_reg and lam from its tuning part."""
  ranks = [list(ranking(p)).index(y) for p, y in zip(probs, labels, strict=True)]
  k_reg = int(np.quantile(ranks, 1 - alpha, method="higher")) + 1
  best, best_size = None, math.inf
  for lam in LAMBDAS:

    def score(p, y, v, lam=lam):
      return raps_score(p, y, v, k_reg, lam)

    _, tuned = conformal_sets(score, probs, labels, u, probs, u, alpha)
    size = tuned.sum(axis=1).mean()
    if size < best_size:
      best, best_size = lam, size
  return k_reg, best


def raps_sets(probs_cal, labels_cal, u_cal, tuning, probs_test, u_test, alpha, tune_alpha):
  """(k_reg, lam, sorted calibration scores, sets): tuned on ``tuning``, calibrated on
  the rest."""
  k_reg, lam = raps_parameters(probs_cal[tuning], labels_cal[tuning], u_cal[tuning], tune_alpha)

  def score(p, y, v):
    return raps_score(p, y, v, k_reg, lam)

  rest = ~tuning
  cal, sets = conformal_sets(
    score, probs_cal[rest], labels_cal[rest], u_cal[rest], probs_test, u_test, alpha
  )
  return k_reg, lam, cal, sets


def topk_sets(logits_cal, labels_cal, u_cal, tuning, logits_test, u_test, alpha, n_bins):
  """(sorted calibration scores, sets) of the calibrated Top-k method, k by k."""
  import jax.numpy as jnp

  from top1_jax.core import binning, events, scores

  num_classes = logits_cal.shape[-1]

  def calibrated(logits):  # [N, K + 1]: Q_0 = 0, then the running max of P(label in Top-k)
    q = np.zeros((logits.shape[0], num_classes + 1))
    for k in range(1, num_classes + 1):
      u_k = np.asarray(scores.neg_log_topk_mass(logits, k))
      correct = np.asarray(events.topk_correct(logits_cal[tuning], labels_cal[tuning], k))
      fitted = binning.fit(
        np.asarray(scores.neg_log_topk_mass(logits_cal[tuning], k)), correct, n_bins
      )
      p_k = np.asarray(binning.predict(fitted, jnp.asarray(u_k)))
      q[:, k] = np.maximum(q[:, k - 1], p_k)
    return q

  def score(q_row, probs, label, u):
    rank = list(ranking(probs)).index(label) + 1
    return q_row[rank - 1] + u * (q_row[rank] - q_row[rank - 1])

  rest = ~tuning
  q_cal, probs_cal = calibrated(logits_cal[rest]), softmax(logits_cal[rest])
  cal = [
    score(q, p, y, v)
    for q, p, y, v in zip(q_cal, probs_cal, labels_cal[rest], u_cal[rest], strict=True)
  ]
  threshold = quantile(cal, alpha)
  q_test, probs_test = calibrated(logits_test), softmax(logits_test)
  sets = np.array(
    [
      [score(q, p, y, v) <= threshold for y in range(num_classes)]
      for q, p, v in zip(q_test, probs_test, u_test, strict=True)
    ]
  )
  return sorted(cal), sets
