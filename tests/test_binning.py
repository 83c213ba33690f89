"""Quantile bins: against a plain loop, ties, prior, bounds, calibration guarantee.

``fit`` has two implementations (edges selected by NumPy on the host, or one jitted
program); both are checked bit for bit against each other and the plain-loop oracle.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from top1_jax.core import binning, metrics


def _data(num, seed=0, ties=False):
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if ties:
    u = np.round(u * 7) / 7  # 8 distinct values
  correct = rng.random(num) < 1 - u
  return u, correct


def _bits(x) -> np.ndarray:
  """The bytes of an array, so that -0.0 != 0.0 and the dtype counts."""
  return np.atleast_1d(np.ascontiguousarray(x)).view(np.uint8)


def _assert_bit_equal(actual: binning.Bins, expected: binning.Bins) -> None:
  for name, a, e in zip(binning.Bins._fields, actual, expected, strict=True):
    a, e = np.asarray(a), np.asarray(e)
    assert (a.dtype, a.shape) == (e.dtype, e.shape), name
    np.testing.assert_array_equal(_bits(a), _bits(e), err_msg=name)


def _assert_matches_oracle(bins: binning.Bins, u, correct, n_bins: int) -> None:
  """Every field equals the plain loop's; prob and prior bit for bit in float32."""
  u32 = np.asarray(u).astype(np.float32)
  # The scores as XLA compares them: subnormals are flushed to zero.
  u32 = np.where(np.abs(u32) < np.finfo(np.float32).tiny, np.float32(0), u32)
  edges, counts, hits, _, prior = reference.fit_bins(u32, correct, n_bins)
  got_edges = np.asarray(bins.edges, np.float64)
  np.testing.assert_array_equal(got_edges[: len(edges)], edges)
  assert np.all(np.isposinf(got_edges[len(edges) :]))
  np.testing.assert_array_equal(bins.counts, counts)
  np.testing.assert_array_equal(bins.hits, hits)
  # The library's float32 arithmetic, spelled in NumPy: the float64 oracle's prior
  # rounds to the same float32 for N < 2**24 (one rounding of an exact quotient).
  prior32 = np.float32(hits.sum()) / np.float32(counts.sum())
  assert np.float32(prior) == prior32
  prob32 = (hits.astype(np.float32) + prior32) / (counts + 1).astype(np.float32)
  np.testing.assert_array_equal(_bits(bins.prior), _bits(prior32))
  np.testing.assert_array_equal(_bits(bins.prob), _bits(prob32))
  assert int(bins.num_effective_bins) == int(np.sum(counts > 0))


def _fit_both_ways(u, correct, n_bins: int) -> binning.Bins:
  """Fits on the host, jitted and by default; checks all three are bit-equal."""
  host = binning.fit(u, correct, n_bins, implementation="host")
  _assert_bit_equal(binning.fit(u, correct, n_bins, implementation="jit"), host)
  _assert_bit_equal(binning.fit(u, correct, n_bins), host)
  return host


def _signed_zeros(num: int) -> np.ndarray:
  rng = np.random.default_rng(3)
  u = np.where(rng.random(num) < 0.5, -0.0, 0.0).astype(np.float32)
  u[: num // 4] = rng.random(num // 4)
  return rng.permutation(u)


@pytest.mark.parametrize(
  "u, n_bins",
  [
    pytest.param(_data(1000)[0], 10, id="random"),
    pytest.param(_data(997)[0], 13, id="uneven"),
    pytest.param(_data(500, ties=True)[0], 20, id="many-ties"),
    pytest.param(np.ones(100, np.float32), 10, id="all-equal"),
    pytest.param(_data(50)[0], 50, id="n_bins=N"),
    pytest.param(_data(50, ties=True)[0], 50, id="n_bins=N-ties"),
    pytest.param(_data(30)[0], 1, id="n_bins=1"),
    pytest.param(_data(101)[0], 2, id="one-edge-selection"),
    pytest.param(_data(1000, ties=True)[0], 40, id="binary-search-assign"),
    pytest.param(_signed_zeros(400), 8, id="signed-zeros"),
    pytest.param(
      np.array([1e-45, 0, -1e-45, 3e-40, 1, -0.0, 2] * 9, np.float32), 5, id="subnormals"
    ),
    # Distinct in float64, equal in float32: ties are merged after the cast.
    pytest.param(1 + np.arange(200) * 1e-9, 10, id="float64-ties-in-float32"),
    pytest.param(np.arange(300) % 17, 12, id="integers"),
  ],
)
def test_host_jit_and_oracle_agree_bit_for_bit(u, n_bins):
  correct = np.random.default_rng(len(u)).random(len(u)) < 0.7
  bins = _fit_both_ways(u, correct, n_bins)
  _assert_matches_oracle(bins, u, correct, n_bins)


@settings(max_examples=40)
@given(st.data())
def test_host_jit_and_oracle_agree_on_any_scores(data):
  # Few lengths and bin counts, so the jitted path compiles a bounded number of times.
  num = data.draw(st.sampled_from([1, 2, 5, 24, 63]), label="num")
  pool = data.draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1))
  value = st.one_of(st.sampled_from(pool), st.floats(-2.0, 2.0, width=32))  # with ties
  u = np.array(data.draw(st.lists(value, min_size=num, max_size=num), label="u"), np.float32)
  correct = np.array(data.draw(st.lists(st.booleans(), min_size=num, max_size=num)))
  n_bins = data.draw(st.sampled_from(sorted({1, min(2, num), min(7, num), num})), label="n_bins")
  bins = _fit_both_ways(u, correct, n_bins)
  _assert_matches_oracle(bins, u, correct, n_bins)


@pytest.mark.parametrize("num", [64, 65, 200, 1000])
def test_host_chunks_give_the_same_bits(monkeypatch, num):
  """Large host inputs are counted and predicted in chunks; shrink them to see it."""
  u, correct = _data(num, seed=num, ties=True)
  u_new, correct_new = _data(num + 7, seed=num + 1)
  bins = _fit_both_ways(u, correct, 9)
  p = binning.predict(bins, u_new)
  test = binning.refit(bins, u_new, correct_new)
  monkeypatch.setattr(binning, "_CHUNK", 64)
  _assert_bit_equal(_fit_both_ways(u, correct, 9), bins)
  _assert_matches_oracle(bins, u, correct, 9)
  np.testing.assert_array_equal(_bits(binning.predict(bins, u_new)), _bits(p))
  _assert_bit_equal(binning.refit(bins, u_new, correct_new), test)


def test_fit_runs_on_the_host_for_host_data_and_jitted_under_jit(monkeypatch):
  u, correct = _data(200)
  calls = []
  host_edges, jitted_fit = binning._host_edges, binning._fit
  monkeypatch.setattr(binning, "_host_edges", lambda *a: calls.append("host") or host_edges(*a))
  monkeypatch.setattr(binning, "_fit", lambda *a: calls.append("jit") or jitted_fit(*a))
  binning.fit(u, correct, 5)  # NumPy scores, CPU backend
  binning.fit(jnp.asarray(u), jnp.asarray(correct), 5)  # a jax array on the CPU
  jax.jit(binning.fit, static_argnames="n_bins")(u, correct, n_bins=5)
  binning.fit(u, correct, 5, implementation="jit")
  assert calls == ["host", "host", "jit", "jit"]


def test_fit_rejects_an_unknown_or_impossible_implementation():
  u, correct = _data(20)
  with pytest.raises(ValueError, match="implementation: expected None, 'host' or 'jit'"):
    binning.fit(u, correct, 2, implementation="numpy")
  with pytest.raises(ValueError, match="implementation: 'host' needs concrete arrays"):
    jax.jit(lambda u, c: binning.fit(u, c, 2, implementation="host"))(u, correct)


@pytest.mark.parametrize("num_edges", [0, 1, 19, 32, 33, 40, 300])
def test_assign_matches_the_loop_for_every_search_method(num_edges):
  """Up to 32 edges ``assign`` compares with all of them, beyond it bisects."""
  rng = np.random.default_rng(num_edges)
  edges = np.sort(rng.choice(np.arange(50, dtype=np.float32) / 7, num_edges))  # repeats too
  edges = np.concatenate([edges, [np.inf, np.inf]]).astype(np.float32)  # like Bins' padding
  u = np.concatenate([rng.choice(edges[: max(num_edges, 1)], 300), rng.random(300) * 8 - 0.5])
  u = u.astype(np.float32)
  u = u[np.isfinite(u)]
  on_host = binning.assign(edges, u)  # NumPy scores: NumPy's search
  on_device = binning.assign(jax.device_put(edges), jax.device_put(u))
  assert isinstance(on_host, np.ndarray) and isinstance(on_device, jax.Array)
  np.testing.assert_array_equal(on_host, reference.assign(edges, u))
  np.testing.assert_array_equal(on_device, reference.assign(edges, u))
  # Float64 host scores are compared as the device compares them: rounded to float32.
  just_above = np.nextafter(edges[:num_edges].astype(np.float64), np.inf)
  np.testing.assert_array_equal(
    binning.assign(edges, just_above),
    binning.assign(jax.device_put(edges), just_above.astype(np.float32)),
  )
  # Traced edges with NumPy scores (a constant of the traced function): the device's search.
  traced = jax.jit(lambda e: binning.assign(e, u))(edges)
  np.testing.assert_array_equal(traced, reference.assign(edges, u))


def test_predict_and_refit_take_numpy_and_jax_inputs_alike():
  u, correct = _data(3000, seed=4)
  bins = binning.fit(u[:1000], correct[:1000], 20)
  p = binning.predict(bins, u[1000:])
  np.testing.assert_array_equal(_bits(binning.predict(bins, jnp.asarray(u[1000:]))), _bits(p))
  test = binning.refit(bins, u[1000:], correct[1000:])
  _assert_bit_equal(binning.refit(bins, jnp.asarray(u[1000:]), jnp.asarray(correct[1000:])), test)
  assert isinstance(p, jax.Array) and all(isinstance(x, jax.Array) for x in test)


def test_equal_count_without_ties():
  u, correct = _data(1000)
  bins = binning.fit(u, correct, 10)
  np.testing.assert_array_equal(bins.counts, 100)


def test_ties_merge_edges_instead_of_leaving_empty_bins():
  u = np.concatenate([np.zeros(600), np.linspace(0.1, 1, 400)]).astype(np.float32)
  correct = np.arange(1000) % 3 > 0
  bins = binning.fit(u, correct, 10)
  counts = np.asarray(bins.counts)
  # 600 equal scores cannot be split: one bin holds them, the rest stay equal-count.
  assert counts[0] == 600 and list(counts[1:5]) == [100] * 4
  assert int(bins.num_effective_bins) == 5
  # The unused slots are at the end, with +inf edges, and predict the prior.
  assert np.all(counts[5:] == 0) and np.all(np.isinf(bins.edges[4:]))
  np.testing.assert_allclose(bins.prob[5:], bins.prior)


def test_all_scores_equal_gives_one_bin_at_the_accuracy():
  correct = np.arange(100) % 4 > 0
  bins = binning.fit(np.ones(100), correct, 10)
  assert int(bins.num_effective_bins) == 1
  np.testing.assert_allclose(binning.predict(bins, [0.0, 1.0, 2.0]), (75 + 0.75) / 101)


def test_prior_is_one_pseudo_count_at_calibration_accuracy():
  u = np.arange(10, dtype=np.float32)
  correct = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], bool)
  bins = binning.fit(u, correct, 2)
  np.testing.assert_allclose(bins.prob, [(5 + 0.5) / 6, (0 + 0.5) / 6])
  assert 0 < float(bins.prob.min()) and float(bins.prob.max()) < 1


def test_bins_are_right_closed_and_extend_beyond_the_range():
  u = np.arange(1, 11, dtype=np.float32)  # edges at 2, 4, 6, 8 for 5 bins
  bins = binning.fit(u, np.ones(10, bool), 5)
  np.testing.assert_allclose(bins.edges, [2, 4, 6, 8])
  index = np.asarray(binning.assign(bins.edges, np.array([-5, 2, 2.5, 4, 8, 8.5, 99.0])))
  np.testing.assert_array_equal(index, [0, 0, 1, 1, 3, 4, 4])


def test_predict_and_refit():
  u, correct = _data(2000, seed=1)
  bins = binning.fit(u[:1000], correct[:1000], 10)
  p = np.asarray(binning.predict(bins, u[1000:]))
  index = reference.assign(np.asarray(bins.edges)[np.isfinite(bins.edges)], u[1000:])
  np.testing.assert_allclose(p, np.asarray(bins.prob)[index])
  test = binning.refit(bins, u[1000:], correct[1000:])
  np.testing.assert_array_equal(test.edges, bins.edges)
  np.testing.assert_array_equal(test.counts, np.bincount(index, minlength=10))
  np.testing.assert_array_equal(test.hits, np.bincount(index, correct[1000:], minlength=10))
  np.testing.assert_allclose(test.prior, correct[1000:].mean(), rtol=1e-6)


def test_fit_works_under_jit():
  import jax

  u, correct = _data(100)
  jitted = jax.jit(binning.fit, static_argnames="n_bins")(u, correct, n_bins=5)
  np.testing.assert_array_equal(jitted.counts, binning.fit(u, correct, 5).counts)


def test_hoeffding_halfwidth():
  np.testing.assert_allclose(
    binning.hoeffding_halfwidth(2500, 0.005), np.sqrt(np.log(2 / 0.005) / 5000), rtol=1e-6
  )
  assert np.isinf(binning.hoeffding_halfwidth(0))


@given(st.integers(0, 400), st.integers(1, 400), st.sampled_from([0.01, 0.05, 0.2]))
def test_clopper_pearson_matches_scipy(hits, count, delta):
  hits = min(hits, count)
  lower, upper = binning.clopper_pearson(hits, count, delta)
  exp_lower = 0.0 if hits == 0 else stats.beta.ppf(delta / 2, hits, count - hits + 1)
  exp_upper = 1.0 if hits == count else stats.beta.ppf(1 - delta / 2, hits + 1, count - hits)
  np.testing.assert_allclose([float(lower), float(upper)], [exp_lower, exp_upper], atol=2e-5)


def test_clopper_pearson_under_jit_equals_the_host_one():
  # Traced counts take the jitted bisection of betainc, concrete ones SciPy's quantiles.
  hits = np.array([0, 1, 7, 50, 99, 100, 0])
  count = np.array([100, 100, 100, 100, 100, 100, 0])
  jitted = jax.jit(binning.clopper_pearson)(hits, count)
  host = binning.clopper_pearson(hits, count)
  np.testing.assert_allclose(np.asarray(jitted), np.asarray(host), atol=2e-6)
  assert (float(host[0][-1]), float(host[1][-1])) == (0.0, 1.0)  # an empty bin: [0, 1]


def test_confidence_bounds_cover_the_empirical_accuracy():
  u, correct = _data(3000, seed=2)
  bins = binning.fit(u, correct, 15)
  acc = np.asarray(bins.hits / bins.counts)
  for method in ("clopper_pearson", "hoeffding"):
    lower, upper = map(np.asarray, binning.confidence_bounds(bins, 0.05, method))
    assert np.all(lower <= acc + 1e-6) and np.all(acc <= upper + 1e-6)
  # Hoeffding is the looser of the two at these sizes.
  cp_width = np.subtract(*binning.confidence_bounds(bins, 0.05)[::-1])
  hf_width = np.subtract(*binning.confidence_bounds(bins, 0.05, "hoeffding")[::-1])
  assert np.all(hf_width >= cp_width)


@given(st.integers(0, 2**31 - 1))
def test_calibrated_score_is_recovered_within_hoeffding(seed):
  """P(correct | u) = 1 - u: every test bin's accuracy is within the Hoeffding bound."""
  rng = np.random.default_rng(seed)
  num, n_bins, delta = 20000, 10, 1e-4
  u = rng.random(num).astype(np.float32)
  correct = rng.random(num) < 1 - u
  bins = binning.fit(u[: num // 2], correct[: num // 2], n_bins)
  test = binning.refit(bins, u[num // 2 :], correct[num // 2 :])
  edges = np.concatenate([[0.0], np.asarray(bins.edges), [1.0]])
  true_p = 1 - (edges[:-1] + edges[1:]) / 2  # exact mean of 1 - u over a uniform bin
  width = np.asarray(binning.hoeffding_halfwidth(bins.counts, delta))
  width_test = np.asarray(binning.hoeffding_halfwidth(test.counts, delta))
  # Calibration-split estimate (with its prior) and test accuracy both near the truth.
  assert np.all(np.abs(np.asarray(bins.prob) - true_p) <= width + 1.0 / np.asarray(bins.counts))
  assert np.all(np.abs(np.asarray(test.accuracy) - true_p) <= width_test)


@pytest.mark.parametrize(
  "call, message",
  [
    (
      lambda: binning.fit(np.zeros(5), np.ones(5, bool), 6),
      "n_bins: expected at least 1, at most 5",
    ),
    (lambda: binning.fit(np.zeros(5), np.ones(5, bool), 0), "n_bins: expected at least 1"),
    (
      lambda: binning.fit(np.zeros(5), np.ones(4, bool), 2),
      "length mismatch: u has 5, correct has 4",
    ),
    (lambda: binning.fit(np.array([0, np.nan]), [1, 0], 1), "u: 1 non-finite"),
    (lambda: binning.fit(np.zeros(3), [0, 2, 1], 1), "correct: expected bool or 0/1 values, got 2"),
    (lambda: binning.fit(np.zeros((3, 2)), [0, 1, 1], 1), "u: expected a 1-D array"),
    (lambda: binning.fit(np.zeros(0), np.zeros(0, bool), 1), "u: expected at least one example"),
    (lambda: binning.hoeffding_halfwidth(10, 1.5), "delta: expected a probability"),
    (lambda: binning.clopper_pearson(5, 3), "hits: expected 0 <= hits <= count"),
    (lambda: binning.confidence_bounds(binning.fit([0.0, 1.0], [0, 1], 1), method="x"), "method"),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


# ----------------------------------------------------------------------------
# Impossible input to the low-level functions: one line, never a number. Each had
# returned one (a probability of 1.375 or -0.125, a bin of unsorted edges, a NaN
# decomposition, ranks for 0 points).

_U = np.linspace(0.0, 1.0, 40, dtype=np.float32)
_OK = np.arange(40) % 3 > 0
_FIT = binning.fit(_U, _OK, 4)


def _broken(**fields) -> binning.Bins:
  return _FIT._replace(**{k: jnp.asarray(v) for k, v in fields.items()})


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: binning.calibrated_prob(np.array([11]), np.array([8]), 0.5), "hits 11 and counts 8"),
    (lambda: binning.calibrated_prob(np.array([-1]), np.array([8]), 0.5), "hits -1 and counts 8"),
    (lambda: binning.calibrated_prob(3, -1, 0.5), r"^hits: expected 0 <= hits <= counts"),
    (lambda: binning.calibrated_prob(1, 2, 1.5), r"^prior: expected an accuracy in \[0, 1\]"),
    (lambda: binning.assign(np.array([0.5, 0.2, np.inf]), _U), "got 0.2 at index 1 after 0.5"),
    (lambda: binning.assign(jnp.array([np.nan, 0.2, 0.3]), _U), "got nan at index 0"),
    (lambda: binning.assign(np.array([0.1, np.nan, 0.3]), jnp.asarray(_U)), "got nan at index 1"),
    (lambda: binning.quantile_edge_ranks(0, 10), "num_points: expected integers of at least"),
    (lambda: binning.quantile_edge_ranks(np.array([20, 9]), 10), "n_bins = 10 .*, got 9$"),
    (lambda: binning.quantile_edge_ranks(2.5, 2), "got dtype float64"),
    (lambda: binning.quantile_edge_ranks(10**6, 10**9), "n_bins: expected at least 1, at most"),
    (lambda: binning.fit(np.zeros(2**21, np.float32), np.ones(2**21, bool), 2**20 + 1), "at most"),
    (
      lambda: metrics.brier_decomposition(_FIT, _broken(hits=_FIT.counts + 1)),
      r"^test_bins: expected 0 <= hits <= counts",
    ),
    (
      lambda: metrics.nll_decomposition(_broken(counts=-_FIT.counts), _FIT),
      r"^train_bins: expected 0 <= hits <= counts",
    ),
    (
      lambda: metrics.binned_ece(_broken(edges=_FIT.edges[::-1]), _FIT),
      r"^train_bins.edges: expected ascending edges",
    ),
    (lambda: binning.predict(_broken(prob=_FIT.prob * 3), _U), r"^bins.prob: expected prob"),
    (lambda: binning.refit(_broken(hits=-_FIT.hits), _U, _OK), r"^bins: expected 0 <= hits"),
  ],
)
def test_impossible_input_is_one_line_not_a_number(call, message):
  with pytest.raises(ValueError, match=message) as info:
    call()
  assert "\n" not in str(info.value)


def test_the_checks_leave_jitted_code_and_valid_bins_alone():
  np.testing.assert_array_equal(binning.quantile_edge_ranks(np.array([10, 11]), 2), [[5], [5]])
  assert binning.calibrated_prob(0, 0, float("nan")) != binning.calibrated_prob(0, 0, 0.5)
  traced = jax.jit(binning.calibrated_prob)(jnp.array([11.0]), jnp.array([8.0]), 0.5)
  np.testing.assert_allclose(traced, [11.5 / 9])  # under jit, trusted: no check, no error
  unsorted = jnp.array([0.5, 0.2, jnp.inf])
  assert jax.jit(binning.assign)(unsorted, jnp.asarray(_U)).shape == (40,)
  assert metrics.brier_decomposition(_FIT, binning.refit(_FIT, _U, _OK)).total >= 0


@pytest.mark.parametrize("delta", [1e-300, 1e-320, 5e-324])
def test_a_tiny_delta_gives_a_wide_interval_not_nan(delta):
  # Clopper-Pearson at delta = 1e-300 had given NaN lower ends (SciPy's betaincinv).
  hits, counts = np.arange(0, 11), np.full(11, 10)
  lower, upper = (np.asarray(x) for x in binning.clopper_pearson(hits, counts, delta))
  assert np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))
  assert np.all(lower >= 0) and np.all(lower <= 1e-20) and np.all(upper == 1.0)
  wide = np.asarray(binning.clopper_pearson(hits, counts, 1e-100)[0])
  assert np.all(lower <= wide)  # a smaller delta, a wider interval
