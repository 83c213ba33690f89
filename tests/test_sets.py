"""Prediction sets: each method against its published algorithm (tests/conformal_reference.py),
the coverage guarantee in simulation, nested sets, saving and loading, refusals."""

import json
import math
import os
import pathlib

import conformal_reference as reference
import jax.numpy as jnp
import numpy as np
import processes
import pytest
import synthetic

from top1_jax import SetPredictor, crossval, scores
from top1_jax.evaluation import conformal, sets

NUM_CAL, NUM_TEST, K = 200, 100, 6


def _data(num: int = NUM_CAL + NUM_TEST, num_classes: int = K, seed: int = 0):
  """Logits of a mediocre classifier (a label's rank often beyond 1), and labels."""
  logits, labels = synthetic.classifier_logits(num, num_classes, seed)
  return logits / 3, labels


def _port(method, options, logits, labels, u_cal, tuning, u_test, alpha):
  """(sorted calibration scores, [N_test, K] sets, params) of the reference port."""
  cal, test = slice(0, NUM_CAL), slice(NUM_CAL, None)
  probs = reference.softmax(logits)
  if method == "raps":
    k_reg, lam, scores_cal, got = reference.raps_sets(
      probs[cal], labels[cal], u_cal, tuning, probs[test], u_test, alpha, tune_alpha=0.1
    )
    return scores_cal, got, (k_reg, lam)
  if method == "topk":
    arguments = (logits[cal], labels[cal], u_cal, tuning, logits[test], u_test, alpha)
    return (*reference.topk_sets(*arguments, n_bins=options["n_bins"]), None)
  score = reference.lac_score if method == "lac" else reference.aps_score
  arguments = (probs[cal], labels[cal], u_cal, probs[test], u_test, alpha)
  return (*reference.conformal_sets(score, *arguments), None)


CASES = [
  ("lac", {}),
  ("aps", {"randomized": True}),
  ("aps", {"randomized": False}),
  ("raps", {"randomized": True}),
  ("raps", {"randomized": False}),
  ("topk", {"randomized": True, "n_bins": 5}),
  ("topk", {"randomized": False, "n_bins": 5}),
]


@pytest.mark.parametrize("method, options", CASES, ids=lambda c: str(c))
def test_each_method_equals_its_reference_given_the_same_draws(method, options):
  logits, labels = _data()
  predictor = SetPredictor(method, seed=3, **options).fit(logits[:NUM_CAL], labels[:NUM_CAL])
  u_cal, tuning = sets.fit_draws(predictor.method_, 3, NUM_CAL, predictor.options_)
  u_test = sets.predict_draws(3, NUM_TEST, predictor.options_)
  assert (u_cal > 0).any() == options.get("randomized", False)
  for alpha in (0.1, 0.2):
    expected_scores, expected, params = _port(
      method, options, logits, labels, u_cal, tuning, u_test, alpha
    )
    np.testing.assert_allclose(predictor.calibration_scores_, expected_scores, atol=2e-6)
    got = predictor.predict_set(logits[NUM_CAL:], alpha=alpha)
    np.testing.assert_array_equal(got, expected)
    assert 0 < got.sum(axis=1).mean() < K  # the sets are neither trivial nor full
    if params is not None:
      assert predictor.params_ == params


def test_probabilities_with_ties_and_zeros_rank_towards_the_lower_index():
  logits, labels = _data()
  probs = reference.softmax(logits)
  tied = np.array([[0.4, 0.2, 0.2, 0.2, 0.0, 0.0], [0.0, 0.3, 0.3, 0.0, 0.3, 0.1]])
  for randomized in (False, True):
    predictor = SetPredictor("aps", inputs="probs", randomized=randomized).fit(probs, labels)
    u = sets.predict_draws(0, 2, predictor.options_)
    for alpha in (0.05, 0.1, 0.2, 0.3):
      q = predictor.threshold(alpha)
      expected = [
        reference.label_set(reference.aps_score, p, v, q) for p, v in zip(tied, u, strict=True)
      ]
      np.testing.assert_array_equal(predictor.predict_set(tied, alpha=alpha), expected)
  # Two of three tied labels: the lower indices.
  mask = conformal.prefix_mask(
    jnp.float32([[1, 1, 1, 0]]), jnp.float32([[1, 1, 1, 0]]), jnp.int32([2])
  )
  np.testing.assert_array_equal(mask, [[True, True, False, False]])


def test_all_topk_masses_equal_the_score_of_each_k():
  logits, _ = _data(50)
  order = conformal.ranked(logits).rows
  masses = np.asarray(sets.neg_log_topk_masses(order))[:50]
  for k in range(1, K + 1):
    np.testing.assert_allclose(
      masses[:, k - 1], scores.neg_log_topk_mass(logits, k), rtol=1e-5, atol=1e-6
    )
  device_sorted = conformal.sort_rows(conformal.pad_rows(logits, order.shape[0]), on_host=False)
  np.testing.assert_array_equal(np.asarray(device_sorted), order)


def test_threshold_is_the_ceil_n_plus_1_times_1_minus_alpha_th_smallest():
  scores_ = np.arange(1.0, 10.0)  # n = 9
  assert conformal.threshold(scores_, 0.1) == 9.0  # ceil(10 * 0.9) = 9
  assert conformal.threshold(scores_, 0.3) == 7.0  # exactly 7, not 7.000000000000001
  assert conformal.threshold(scores_, 0.5) == 5.0
  assert conformal.threshold(scores_, 0.09) == math.inf  # alpha < 1 / (n + 1): full sets


# The guarantee: over random splits, coverage is ceil((n + 1)(1 - alpha)) / (n + 1) in
# expectation (the scores are tie-free), inside [1 - alpha, 1 - alpha + 1 / (n + 1)]; with
# n = 44 that is 41 / 45, in the middle of [0.9, 0.922].
SIMULATED = [
  ("lac", 88, {}),
  ("aps", 88, {}),
  ("raps", 176, {"tune_fraction": 0.5}),
  ("topk", 176, {"tune_fraction": 0.5, "n_bins": 4}),
]


@pytest.mark.parametrize("method, num, options", SIMULATED, ids=[c[0] for c in SIMULATED])
def test_coverage_guarantee_in_simulation(method, num, options):
  logits, labels = _data(num, seed=1)
  halves = [crossval.make_splits(num, 2, seed=seed).fold[0] for seed in range(100)]
  folds = crossval.Splits(np.stack(halves), per_rep=2, num_splits=200)  # each half both ways
  (row,) = sets.evaluate_sets(
    logits, labels, folds, methods=(method,), alphas=(0.1,), seed=4, **options
  )
  assert row["num_conformal"] == 44
  margin = 3 * row["coverage_std"] / math.sqrt(row["num_splits"])  # three standard errors
  assert 0.9 - margin <= row["coverage"] <= 0.9 + 1 / 45 + margin
  if method != "topk":  # its calibrated probabilities tie: coverage may exceed 41 / 45
    assert abs(row["coverage"] - 41 / 45) <= margin


@pytest.mark.parametrize("method", list(sets.METHODS))
def test_sets_grow_as_alpha_falls_and_save_load_round_trip(method, tmp_path):
  logits, labels = _data()
  options = {"n_bins": 5} if method == "topk" else {}
  predictor = SetPredictor(method, seed=5, **options).fit(logits[:NUM_CAL], labels[:NUM_CAL])
  masks = [predictor.predict_set(logits[NUM_CAL:], alpha) for alpha in (0.5, 0.2, 0.1, 0.05)]
  for larger, smaller in zip(masks[1:], masks[:-1], strict=True):
    assert np.all(larger >= smaller)
  assert predictor.predict_set(logits[:3], alpha=1e-3).all()  # below 1 / (n + 1): full
  predictor.save(tmp_path / "sets.json")
  loaded = SetPredictor.load(tmp_path / "sets.json")
  np.testing.assert_array_equal(loaded.predict_set(logits[NUM_CAL:], 0.1), masks[2])
  assert loaded.to_dict() == json.loads(json.dumps(predictor.to_dict()))
  metrics = loaded.evaluate(logits[NUM_CAL:], labels[NUM_CAL:], alpha=0.1)
  assert metrics["coverage"] == masks[2][np.arange(NUM_TEST), labels[NUM_CAL:]].mean()
  assert metrics["mean_size"] == masks[2].sum(axis=1).mean()
  assert metrics["coverage_size_101_up"] is None  # K = 6: no set that large


def test_evaluate_sets_rows_in_distribution_and_under_shift():
  logits, labels = _data(120)
  folds = crossval.make_splits(120, 2, seed=0)
  rows = sets.evaluate_sets(logits, labels, folds, alphas=(0.1, 0.2), n_bins=5)
  assert [(r["method"], r["set"], r["alpha"]) for r in rows] == [
    (m, "clean", a) for m in sets.METHODS for a in (0.1, 0.2)
  ]
  for row in rows:
    assert 0 <= row["sscv"] <= 1 and row["num_splits"] == 2 and row["num_test"] == 60
    assert {f"coverage_size_{name}" for name in conformal.STRATUM_NAMES} <= set(row)
    assert (row["k_reg"] is None) == (row["method"] != "raps")
  json.dumps(rows, allow_nan=False)  # None where undefined, never NaN
  noisy = logits + np.random.default_rng(1).normal(scale=2.0, size=logits.shape)
  shifted = sets.evaluate_sets(
    logits, labels, folds, methods=("aps",), alphas=(0.1,), shifted={"noisy": (noisy, labels)}
  )
  assert [r["set"] for r in shifted] == ["clean", "noisy"]
  assert shifted[0] == rows[2]  # calibrated and tested on the clean set alike
  assert shifted[1]["coverage"] < shifted[0]["coverage"]  # noise the calibration never saw


def test_sets_of_many_examples_are_computed_in_blocks_of_rows_alike(monkeypatch):
  # Each part's [rows, K] temporaries are bounded by sets.ROWS: blocks of 64 rows here (the
  # last padded), against the whole part at once.
  logits, labels = _data(600)
  folds = crossval.make_splits(600, 2, seed=0)
  whole = sets.evaluate_sets(logits, labels, folds, alphas=(0.1, 0.2), n_bins=5, randomized=True)
  monkeypatch.setattr(sets, "ROWS", 64)
  blocks = sets.evaluate_sets(logits, labels, folds, alphas=(0.1, 0.2), n_bins=5, randomized=True)
  assert blocks == whole


def test_raps_tuning_by_blocks_of_rows_equals_the_whole_tuning_part_at_once():
  # Bit for bit across block shapes is a property of the code XLA's CPU emits as users
  # compile (its fusion emitters), not of the older emitters the suite compiles with
  # (conftest): a child process checks it with the fusion emitters.
  flags = processes.xla_flags(1).replace("--xla_cpu_use_fusion_emitters=false", "")
  code = "import test_sets; test_sets.raps_blocks_equal_the_whole_part(); print('blocks: equal')"
  env, here = {**os.environ, "XLA_FLAGS": flags}, pathlib.Path(__file__).parent
  (output,) = processes.wait(processes.start([["-c", code]], env, cwd=here), timeout=600)
  assert output.splitlines()[-1] == "blocks: equal", output[-3000:]  # every check ran


def raps_blocks_equal_the_whole_part():
  # raps tunes lam on [L, n] scores, then sizes, a block of sets.ROWS rows at a time (64
  # here, the last padded): the same (k_reg, lam) and sets as its whole part at once. (100
  # classes: XLA's CPU rounds rows of 64 to 1024 alike there, not for every K.)
  logits, labels = _data(1000, 100)
  raps, data, chosen = sets.lookup("raps"), conformal.ranked(logits, labels), set()
  sets.ROWS = 64  # in its own process
  for seed, alpha in [(seed, alpha) for seed in range(3) for alpha in (0.05, 0.1, 0.2, 0.4)]:
    options = sets.checked_options(raps, {"tune_alpha": alpha})
    u, tuning = sets.fit_draws(raps, seed, 1000, options)
    tune, rest = np.flatnonzero(tuning), np.flatnonzero(~tuning)
    k_reg = int(np.quantile(data.rank[tune], 1 - alpha, method="higher")) + 1
    means = []
    for lam in sets.LAMBDA_GRID:
      whole = raps.scores((k_reg, lam), data.rows[tune], u[tune])  # [n, K] at once
      q = conformal.threshold(np.sort(conformal.at_rank(whole, data.rank[tune])), alpha)
      means.append(np.mean(conformal.sizes(whole, jnp.float32([q]))[0]))
    fitted = sets.calibrate(raps, data, u, tuning, options)
    assert fitted.params == (k_reg, sets.LAMBDA_GRID[int(np.argmin(means))])
    chosen.add(fitted.params[1])
    whole = raps.scores(fitted.params, data.rows[rest], u[rest])
    assert np.array_equal(fitted.scores, np.sort(conformal.at_rank(whole, data.rank[rest])))
    q = jnp.float32([conformal.threshold(fitted.scores, alpha)])
    everything = raps.scores(fitted.params, data.rows[:1000], u)
    got = sets.set_sizes(raps, fitted.params, data, u, q)
    assert np.array_equal(got, conformal.sizes(everything, q))
  assert len(chosen) > 1  # the choice depends on the sizes: a wrong block would show


def _refused(call, message: str) -> None:
  with pytest.raises(ValueError, match=message) as info:
    call()
  assert "\n" not in str(info.value)


def test_bad_inputs_give_one_line_value_errors():
  logits, labels = _data(40)
  fitted = SetPredictor("aps").fit(logits, labels)
  probs = reference.softmax(logits).astype(np.float32)
  for call, message in [
    (lambda: SetPredictor("thr").fit(logits, labels), "method: expected one of lac, aps, raps"),
    (lambda: SetPredictor(inputs="p").fit(logits, labels), "inputs: expected one of"),
    (lambda: SetPredictor(seed=-1).fit(logits, labels), "seed: expected at least 0"),
    (lambda: SetPredictor("aps", lam=0.1).fit(logits, labels), "method 'aps' takes randomized"),
    (lambda: SetPredictor(randomized="no").fit(logits, labels), "randomized: expected True"),
    (lambda: SetPredictor("raps", lam=-1).fit(logits, labels), "lam: expected a finite number"),
    (lambda: SetPredictor("raps", k_reg=0).fit(logits, labels), "k_reg: expected at least 1"),
    (lambda: SetPredictor("topk", tune_fraction=1).fit(logits, labels), "tune_fraction"),
    (lambda: SetPredictor("topk").fit(logits[:30], labels[:30]), "n_bins: 20 bins need as"),
    (lambda: SetPredictor("raps").fit(logits[:1], labels[:1]), "leave none for the conformal"),
    (lambda: SetPredictor(inputs="logits").fit(probs, labels), 'pass inputs="probs"'),
    (lambda: SetPredictor(inputs="probs").fit(logits, labels), "probabilities must lie in"),
    (lambda: SetPredictor().fit(logits, labels + 10), "labels: labels out of range"),
    (lambda: SetPredictor().fit(logits, labels[:5]), "length mismatch"),
    (lambda: SetPredictor().fit(logits[0], labels), "x: expected a 2-D array"),
    (lambda: SetPredictor().fit(logits * np.nan, labels), "non-finite"),
    (lambda: SetPredictor().predict_set(logits), "not fitted"),
    (lambda: fitted.predict_set(logits[:, :4]), "expected 6 classes like the calibration"),
    (lambda: fitted.predict_set(logits, alpha=0), "alpha: expected a probability in"),
    (lambda: fitted.predict_set(logits, alpha=1.5), "alpha: expected a probability in"),
    (lambda: sets.evaluate_sets(logits, labels, crossval.make_splits(40, 2), k=2), "options"),
    (lambda: sets.evaluate_sets(logits, labels, crossval.make_splits(30, 2)), "splits: made"),
    (lambda: sets.evaluate_sets(probs, labels, crossval.make_splits(40, 2)), "log_probs_from"),
    (
      lambda: sets.evaluate_sets(
        logits, labels, crossval.make_splits(40, 2), shifted={"a": (logits[:, :3], labels)}
      ),
      r"shifted\['a'\]: expected 6 classes",
    ),
  ]:
    _refused(call, message)


def test_hostile_files_are_refused_in_one_line(tmp_path):
  logits, labels = _data(60)
  state = SetPredictor("topk", n_bins=3).fit(logits, labels).to_dict()
  path = tmp_path / "sets.json"
  for changed, message in [
    ({"format": "top1_jax.Calibrator"}, "not a top1_jax set predictor"),
    ({"version": True}, "set predictor version True"),
    ({"options": {"randomized": "yes"}}, "randomized: expected True or False"),
    ({"options": {"method": "lac"}}, "bad set predictor field"),
    ({"num_classes": 1}, "num_classes: expected at least 2"),
    ({"calibration_scores": []}, "field 'calibration_scores' is empty"),
    ({"calibration_scores": ["0.5"]}, "must hold numbers"),
    ({"calibration_scores": [1e300]}, "overflows float32"),
    ({"params": {"bins": state["params"]["bins"][:2]}}, "must list 6 bins"),
    ({"seed": 2**40}, "seed: expected at least 0, at most"),
  ]:
    path.write_text(json.dumps({**state, **changed}))
    _refused(lambda: SetPredictor.load(path), message)
  del state["method"]
  path.write_text(json.dumps(state))
  _refused(lambda: SetPredictor.load(path), "field 'method' is missing")


def test_parameters_follow_scikit_learn():
  predictor = SetPredictor("raps", lam=0.01)
  assert predictor.get_params() == {"method": "raps", "inputs": "auto", "seed": 0, "lam": 0.01}
  predictor.set_params(seed=2, k_reg=3)
  assert predictor.get_params()["seed"] == 2 and predictor.options == {"lam": 0.01, "k_reg": 3}
  logits, labels = _data(40)
  assert predictor.fit(logits, labels).params_ == (3, 0.01)  # given: nothing is tuned
  assert predictor.calibration_scores_.shape == (40,)


def test_evaluating_sets_holds_at_most_one_sorted_copy_of_the_logits(monkeypatch):
  # Logits up to conformal.SORTED_COPY_BYTES are ranked once into one [N, K] copy, larger
  # ones a block at a time as gathered; a split's parts, the tuning part's too, are gathered
  # a block of sets.ROWS rows at a time. NumPy's peak is that copy (if any) and topk's
  # [K, n] masses of its tuning part: under 1.75x the logits with the copy (1.95x with the
  # tuning part copied whole, 3.5x with every part), under 0.75x without; the rows alike.
  import tracemalloc

  logits, labels = _data(20_000, 200)
  folds = crossval.make_splits(20_000, 2, seed=0)
  monkeypatch.setattr(sets, "ROWS", 2048)
  sets.evaluate_sets(logits[:3000], labels[:3000], crossval.make_splits(3000, 2, seed=0))
  found = {}
  for copy_bytes, bound in [(1 << 28, 1.75), (0, 0.75)]:
    monkeypatch.setattr(conformal, "SORTED_COPY_BYTES", copy_bytes)
    tracemalloc.start()
    try:
      found[copy_bytes] = sets.evaluate_sets(logits, labels, folds, alphas=(0.1,))
      peak = tracemalloc.get_traced_memory()[1]
    finally:
      tracemalloc.stop()
    assert peak < bound * logits.nbytes, (copy_bytes, peak / logits.nbytes)
  assert found[0] == found[1 << 28]
