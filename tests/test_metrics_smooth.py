"""Binning-free metrics: the smooth ECE against relplot and a plain loop; the AURC.

relplot (Błasiok & Nakkiran's reference code) is a dev dependency; its comparison
is skipped without it. Where relplot departs from the paper's definition, the
test says how, and compares with the plain-loop oracle of the definition instead.
"""

import itertools

import numpy as np
import pytest

from top1_jax.core import metrics
from top1_jax.evaluation import selective
from top1_jax.io.examples import load_example


def _real(name):
  probs, labels = load_example(name)[:2]
  return probs.max(axis=1), probs.argmax(axis=1) == labels


def _synthetic(kind, num, seed=0):
  rng = np.random.default_rng(seed)
  if kind == "overconfident":
    prob = rng.beta(5, 1, num)
    return prob, rng.random(num) < prob**2
  prob = rng.random(num)
  truth = {
    "calibrated": prob,
    "underconfident": 0.5 + 0.8 * (prob - 0.5),
    "anticalibrated": 1 - prob,
    "constant": np.full(num, 0.7),
  }[kind]
  return prob, rng.random(num) < truth


def _oracle_smooth_ece(prob, correct, steps=20):
  """The paper's definition by direct sums: a 2001-point trapezoid rule in t, the
  Gaussian and its images under reflection at 0 and 1 within one period (the
  rest lie 2 or more from [0, 1]), the bisection for smECE_sigma = sigma on [1e-3, 1]."""
  t = np.linspace(0, 1, 2001)
  weight = np.full(t.shape, t[1])
  weight[[0, -1]] /= 2
  residual = correct - prob
  images = [s * prob + 2 * k for k in range(-1, 2) for s in (1, -1)]

  def at(sigma):
    total = sum(
      np.exp(-((t[:, None] - z[None]) ** 2) / (2 * sigma**2)) @ residual for z in images
    ) / (np.sqrt(2 * np.pi) * sigma)
    return np.sum(weight * np.abs(total)) / prob.shape[0]

  low, high = 1e-3, 1.0
  for _ in range(steps):
    mid = (low + high) / 2
    low, high = (mid, high) if at(mid) > mid else (low, mid)
  return at(high)


@pytest.mark.parametrize(
  "kind", ["calibrated", "overconfident", "underconfident", "anticalibrated", "constant"]
)
def test_smooth_ece_matches_the_definition_by_plain_loop(kind):
  prob, correct = _synthetic(kind, 400, seed=1)
  expected = _oracle_smooth_ece(prob, correct)
  assert metrics.smooth_ece(prob, correct) == pytest.approx(expected, abs=2e-4)


def test_residuals_of_one_sign_give_the_mean_residual_at_any_bandwidth():
  # The reflected kernel keeps each example's whole mass in [0, 1], points at 0
  # and 1 included, so residuals of one sign integrate to |mean(correct - prob)|.
  prob = np.concatenate([np.ones(500), np.zeros(50), np.random.default_rng(2).random(300)])
  value = metrics.smooth_ece(prob, np.ones(prob.shape[0], bool))
  assert value == pytest.approx(np.mean(1 - prob), rel=1e-4)
  assert metrics.smooth_ece(prob, np.zeros(prob.shape[0], bool)) == pytest.approx(
    np.mean(prob), rel=1e-4
  )


def test_smooth_ece_is_small_for_calibrated_data_and_order_free():
  prob, correct = _synthetic("calibrated", 200_000, seed=3)
  value = metrics.smooth_ece(prob, correct)
  assert 0 <= value < 0.01
  perm = np.random.default_rng(4).permutation(prob.shape[0])
  assert metrics.smooth_ece(prob[perm], correct[perm]) == pytest.approx(value, abs=1e-6)


RELPLOT_CASES = [
  ("lenet-5-cifar-10", lambda: _real("lenet-5-cifar-10")),
  # relplot's grid halves the weight of points in its last cell [0.999, 1] (40% of
  # this network's predictions, see the next test); 0.998 keeps them out of it.
  ("densenet-bc-100-cifar-100 clipped at 0.998", lambda: _clip(_real("densenet-bc-100-cifar-100"))),
] + [
  (f"{kind}-{num}", lambda kind=kind, num=num: _synthetic(kind, num))
  for kind in ("calibrated", "overconfident", "underconfident")
  for num in (300, 3000, 100_000)
]


def _clip(data, top=0.998):
  prob, correct = data
  return np.minimum(prob, top), correct


@pytest.mark.parametrize("make", [m for _, m in RELPLOT_CASES], ids=[n for n, _ in RELPLOT_CASES])
def test_smooth_ece_agrees_with_relplot(make):
  relplot = pytest.importorskip("relplot", reason="relplot (requirements-dev.txt) not installed")
  prob, correct = make()
  expected = relplot.smECE(prob.astype(np.float64), correct.astype(np.float64))
  assert metrics.smooth_ece(prob, correct) == pytest.approx(expected, abs=2e-3)


def test_where_relplot_departs_from_the_definition():
  """relplot's two approximations, and that the metric here does not share them.

  * Its grid reflects the masses without doubling the end points, so a point in
    its last cell [0.999, 1] keeps half to all of its weight; then it divides by
    the smoothed mass, which reweights the examples. Moving DenseNet's predictions
    by at most 0.002 moves relplot's value by 0.028, and ours by under 2e-3.
  * It truncates the kernel at |t - p| = 1/2, which is felt when the fixed-point
    bandwidth exceeds ~0.15 (a constant 0.7 accuracy: relplot 0.247, the definition 0.241).
  """
  relplot = pytest.importorskip("relplot", reason="relplot (requirements-dev.txt) not installed")
  prob, correct = _real("densenet-bc-100-cifar-100")
  ours, ours_clipped = (metrics.smooth_ece(*d) for d in ((prob, correct), _clip((prob, correct))))
  theirs, theirs_clipped = (
    relplot.smECE(p.astype(np.float64), c.astype(np.float64))
    for p, c in ((prob, correct), _clip((prob, correct)))
  )
  assert abs(ours - ours_clipped) < 2e-3 < 0.02 < abs(theirs - theirs_clipped)
  # DenseNet is overconfident at every confidence: the residuals have one sign.
  assert ours == pytest.approx(np.mean(prob) - np.mean(correct), abs=1e-4)
  prob, correct = _synthetic("constant", 3000)
  theirs = relplot.smECE(prob, correct.astype(np.float64))
  assert 3e-3 < theirs - metrics.smooth_ece(prob, correct) < 1e-2


def _plain_aurc(confidence, correct):
  order = np.argsort(-confidence, kind="stable")
  wrong = ~correct[order]
  return np.mean(np.cumsum(wrong) / np.arange(1, wrong.shape[0] + 1))


def test_aurc_without_ties_matches_plain_loop():
  rng = np.random.default_rng(5)
  confidence = rng.random(1000)
  correct = rng.random(1000) < confidence
  assert metrics.aurc(confidence, correct) == pytest.approx(
    _plain_aurc(confidence, correct), rel=1e-5
  )


def test_aurc_with_ties_averages_every_order_of_the_tied_examples():
  confidence = np.array([0.9, 0.9, 0.9, 0.5, 0.5, 0.2, 0.9])
  correct = np.array([True, False, True, False, True, True, False])
  every_order = [
    _plain_aurc(confidence[list(perm)], correct[list(perm)])
    for perm in itertools.permutations(range(confidence.shape[0]))
  ]
  assert metrics.aurc(confidence, correct) == pytest.approx(np.mean(every_order), rel=1e-6)


def test_aurc_does_not_depend_on_the_input_order():
  rng = np.random.default_rng(6)
  confidence = np.round(rng.random(5000), 1)  # 11 values: many ties
  correct = rng.random(5000) < confidence
  risk = np.asarray(metrics.selective_risk(confidence, correct))
  for seed in range(3):
    perm = np.random.default_rng(seed).permutation(5000)
    np.testing.assert_array_equal(metrics.selective_risk(confidence[perm], correct[perm]), risk)


def test_aurc_of_perfect_and_uninformative_rankings():
  correct = np.array([True] * 80 + [False] * 20)
  perfect = np.sum([(n - 80) / n for n in range(81, 101)]) / 100
  assert metrics.aurc(correct.astype(float), correct) == pytest.approx(perfect, rel=1e-6)
  # All tied: every prefix has the overall error rate in expectation.
  assert metrics.aurc(np.ones(100), correct) == pytest.approx(0.2, rel=1e-6)


def test_risk_coverage_is_the_aurc_curve_of_the_uncertainty():
  rng = np.random.default_rng(7)
  u = rng.random(300)
  correct = rng.random(300) < 1 - u
  curve = selective.risk_coverage(u, correct)
  assert curve.coverage.shape == curve.risk.shape == (300,)
  assert float(curve.coverage[-1]) == 1.0
  assert float(curve.risk[-1]) == pytest.approx(1 - np.mean(correct), rel=1e-6)
  assert float(np.mean(curve.risk)) == pytest.approx(metrics.aurc(-u, correct), rel=1e-6)


def test_risk_coverage_of_host_scores_is_one_program(compiles):
  # Op by op, its negation, range and division compiled a program each beside the
  # curve's own. 307 examples: a length no other test here compiles.
  rng = np.random.default_rng(8)
  u = rng.random(307)
  correct = rng.random(307) < 1 - u
  compiles.clear()
  curve = selective.risk_coverage(u, correct)
  assert len(compiles) <= 1
  np.testing.assert_allclose(curve.coverage, np.arange(1, 308) / 307, rtol=1e-6)


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: metrics.smooth_ece([0.5, 1.2], [True, False]), "prob: probabilities must lie in"),
    (lambda: metrics.smooth_ece([0.5, np.nan], [True, False]), "prob: 1 non-finite"),
    (lambda: metrics.smooth_ece([0.5], [True, False]), "length mismatch"),
    (lambda: metrics.aurc([], []), "confidence: expected at least one example"),
    (lambda: metrics.aurc([0.5, 0.2], [2, 0]), "correct: expected bool or 0/1"),
    (lambda: selective.risk_coverage([[0.5]], [True]), "u: expected a 1-D array"),
  ],
)
def test_bad_input_gets_a_one_line_value_error(call, message):
  with pytest.raises(ValueError, match=message) as info:
    call()
  assert "\n" not in str(info.value)
