"""covariance: batched covariance 2-norms against float64 NumPy ``eigvalsh``."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference

from top1_jax.kernels import covariance


def _oracle(samples: np.ndarray) -> np.ndarray:
  """Top eigenvalue of each example's unbiased covariance, float64: [S, N, K] -> [N].

  Through the S x S Gram matrix when S < K (same nonzero spectrum; the K x K
  route itself is checked against ``np.cov`` in the test below).
  """
  x = np.asarray(samples, np.float64)
  x = x - x.mean(axis=0)
  if x.shape[0] < x.shape[2]:
    matrices = np.einsum("snk,tnk->nst", x, x)
  else:
    matrices = np.einsum("snk,snl->nkl", x, x)
  return np.linalg.eigvalsh(matrices / (x.shape[0] - 1))[:, -1]


def _orthonormal(rng, size: int, count: int) -> np.ndarray:
  return np.linalg.qr(rng.normal(size=(size, count)))[0].T


def _examples(num_samples: int, num_classes: int, seed: int = 0) -> np.ndarray:
  """[S, N, K] float32: realistic samples plus the hard cases, one kind per example."""
  rng = np.random.default_rng(seed)
  s, k = num_samples, num_classes
  logits = 3 * rng.normal(size=(1, 1, k)) + 0.5 * rng.normal(size=(s, 1, k))
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  out = [probs / probs.sum(-1, keepdims=True), rng.normal(size=(s, 1, k))]
  mean = rng.normal(size=(1, 1, k))
  out.append(np.repeat(mean, s, axis=0))  # identical samples: norm 0
  out.append(mean + rng.normal(size=(s, 1, 1)) * rng.normal(size=(1, 1, k)))  # rank 1
  out.append(10 + 1e-3 * rng.normal(size=(s, 1, k)))  # tiny spread around a large mean
  if s >= 3 and k >= 2:
    # Two directions with equal or nearly equal variance: a (near-)degenerate top.
    # Orthonormal weights over the samples, orthogonal to the all-ones (centred).
    basis = np.linalg.qr(np.column_stack([np.ones(s), rng.normal(size=(s, 2))]))[0]
    weights = basis[:, 1:].T
    directions = _orthonormal(rng, k, 2)
    for gap in (0.0, 1e-6, 1e-4, 1e-2):
      coefficients = np.stack([weights[0], (1 - gap) * weights[1]], axis=1)
      out.append((coefficients @ directions)[:, None, :] + mean)
  return np.concatenate(out, axis=1).astype(np.float32)


def _check(samples: np.ndarray) -> None:
  got = np.asarray(covariance.covariance_norm(samples))
  want = _oracle(samples)
  assert got.shape == want.shape and np.all(got >= 0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(np.max(want)))


def test_gram_route_at_large_k_over_several_chunks_with_out_of_range_examples():
  # S < K: the S x S Gram route. 301 examples make two chunks of 151, the last
  # shifted back to overlap the first; examples whose squared spread overflows
  # (1e18) or sinks into subnormals (1e-15) force their chunk onto the rescaled path.
  base = _examples(32, 1000)
  rng = np.random.default_rng(1)
  filler = rng.normal(size=(32, 301 - base.shape[1] - 2, 1000)).astype(np.float32)
  extremes = np.concatenate([1e18 * filler[:, :1], 1e-15 * filler[:, 1:2]], axis=1)
  samples = np.concatenate([base, filler[:, 2:], extremes, base[:, :2]], axis=1)
  _check(samples)


def test_gram_route_equals_the_k_by_k_covariance_of_np_cov():
  samples = _examples(32, 1000)[:, :2]
  np.testing.assert_allclose(
    covariance.covariance_norm(samples), reference.covariance_norm(samples), rtol=1e-4
  )


def test_covariance_route_at_small_k_over_several_chunks():
  # K <= S: the K x K covariance, 102 examples per product step; N = 2600 makes
  # two overlapping chunks of 1326.
  base = _examples(32, 10)
  rng = np.random.default_rng(2)
  filler = (3 * rng.normal(size=(32, 2600 - base.shape[1], 10))).astype(np.float32)
  _check(np.concatenate([base, filler], axis=1))


@pytest.mark.parametrize("num_samples, num_classes", [(2, 2), (2, 7), (5, 5), (6, 3), (3, 1)])
def test_small_and_square_shapes(num_samples, num_classes):
  _check(_examples(num_samples, num_classes))


def test_examples_with_non_finite_samples_are_nan_and_the_others_unaffected():
  # scores.covariance_norm checks its input only when a norm is not finite.
  samples = _examples(6, 3)
  want = _oracle(samples)
  samples[2, 1, 0] = np.nan
  samples[0, 4, 2] = np.inf
  samples[5, 6, 1] = -np.inf
  got = np.asarray(covariance.covariance_norm(samples))
  bad = np.isin(np.arange(len(got)), [1, 4, 6])
  assert np.all(np.isnan(got[bad]))
  np.testing.assert_allclose(got[~bad], want[~bad], rtol=1e-4, atol=1e-6 * float(np.max(want)))


def test_top_eigenvalue_of_matrices_that_trap_a_single_start_vector():
  # diag(3) + [[2, 2], [2, 2]]: the column of the largest diagonal entry spans an
  # invariant subspace without the top eigenvector (eigenvalue 4).
  trap = np.zeros((6, 6))
  trap[0, 0] = 3
  trap[1:3, 1:3] = 2
  rng = np.random.default_rng(3)
  vectors = _orthonormal(rng, 6, 6)
  clustered = vectors.T @ np.diag([5, 5 - 1e-5, 5 - 2e-5, 1, 0, 0]) @ vectors
  factor = rng.normal(size=(6, 6))
  matrices = np.stack(
    [trap, np.zeros((6, 6)), np.diag([0, 1, 7, 2, 7, 3]), clustered, factor @ factor.T]
  )
  got = np.asarray(covariance.top_eigenvalue(matrices.astype(np.float32)))
  np.testing.assert_allclose(got, np.linalg.eigvalsh(matrices)[:, -1], rtol=1e-5, atol=1e-6)


def test_shapes_are_checked():
  with pytest.raises(ValueError, match=r"samples: expected shape \[S >= 2, N, K >= 1\]"):
    covariance.covariance_norm(np.zeros((1, 3, 4), np.float32))
  with pytest.raises(ValueError, match=r"matrices: expected shape \[B, m, m\]"):
    covariance.top_eigenvalue(np.zeros((3, 4, 5), np.float32))
  assert covariance.covariance_norm(np.zeros((3, 0, 4), np.float32)).shape == (0,)


def _np_cov_norms(samples: np.ndarray) -> np.ndarray:
  """np.cov's largest eigenvalue per example, in float64: [S, N, K] -> [N]."""
  x = np.asarray(samples, np.float64)
  covs = [np.atleast_2d(np.cov(x[:, n], rowvar=False)) for n in range(x.shape[1])]
  return np.array([np.linalg.eigvalsh(c)[-1] for c in covs])


FLOAT32 = np.finfo(np.float32)
# Norms at 1e-30 and 1e30, at the float32 limits (4x the smallest normal float, half
# the largest), and the issue's 9.8e37: a Gram trace past 8.5e37 had its reciprocal
# below the normal range (flushed to 0, so every norm came out 0).
NORMS = (1e-30, 1e30, 4 * float(FLOAT32.tiny), 0.5 * float(FLOAT32.max), 9.8e37)
# (S, K): the S x S Gram route, the K x K route, a two-sample one, K = 1.
ROUTES = ((4, 50), (40, 5), (2, 3), (3, 1))


@pytest.mark.parametrize("num_samples, num_classes", ROUTES)
@pytest.mark.parametrize("num_examples", [1, 5])  # one plain matmul, and batched
def test_norms_at_extreme_scales_match_np_cov(num_samples, num_classes, num_examples):
  rng = np.random.default_rng(7)
  directions = rng.normal(size=(num_samples, num_examples, num_classes))
  unit = _np_cov_norms(directions)
  for norm in NORMS:
    samples = (directions * np.sqrt(norm / unit)[:, None]).astype(np.float32)
    want = _np_cov_norms(samples)
    got = np.asarray(covariance.covariance_norm(samples))
    assert got.dtype == np.float32 and np.all(np.isfinite(got)) and np.all(got > 0), norm
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"norm {norm:g}")


def test_the_issue_example_is_not_zero():
  samples = np.zeros((2, 3, 3), np.float32)
  samples[0, :, 0], samples[1, :, 0] = 7e18, -7e18
  np.testing.assert_allclose(covariance.covariance_norm(samples), 9.8e37, rtol=1e-6)


@pytest.mark.parametrize("num_samples, num_classes", ROUTES)
def test_identical_samples_give_zero_at_any_magnitude(num_samples, num_classes):
  # A float mean of S equal values need not equal them (1e-13 norms came out), and
  # near the float32 limit their sum overflows (inf or NaN came out).
  rng = np.random.default_rng(8)
  values = [rng.normal(size=(1, 50, num_classes)), np.full((1, 2, num_classes), FLOAT32.max)]
  values += [np.full((1, 2, num_classes), -0.9 * FLOAT32.max), 1e-44 * rng.normal(size=(1, 2, 1))]
  values += [3e20 * rng.normal(size=(1, 2, num_classes))]
  one = np.concatenate([np.broadcast_to(v, (1, v.shape[1], num_classes)) for v in values], 1)
  samples = np.repeat(one.astype(np.float32), num_samples, axis=0)
  np.testing.assert_array_equal(covariance.covariance_norm(samples), 0.0)


@pytest.mark.parametrize("num_samples, num_classes", ROUTES)
def test_subnormal_and_overflowing_spreads(num_samples, num_classes):
  # Samples a subnormal apart: the norm (~1e-88) rounds to 0 in float32 (and XLA on
  # the CPU flushes subnormals), finite and not negative. Near-max values a float
  # spacing (2e31) apart: the norm (~1e62) exceeds float32, inf (never NaN).
  tiny = np.zeros((num_samples, 2, num_classes), np.float32)
  tiny[0, 0, 0], tiny[1:, 1] = 1e-45, FLOAT32.smallest_subnormal
  np.testing.assert_array_equal(covariance.covariance_norm(tiny), 0.0)
  assert np.all(np.float32(_np_cov_norms(tiny)) == 0)
  huge = np.full((num_samples, 2, num_classes), FLOAT32.max, np.float32)
  huge[0, 0, 0] = np.nextafter(FLOAT32.max, np.float32(0))
  huge[1:, 1] = -FLOAT32.max
  np.testing.assert_array_equal(covariance.covariance_norm(huge), np.inf)


@pytest.mark.parametrize("scale", [1e-30, 1e30, 1e-36, 1e38])
def test_top_eigenvalue_at_extreme_scales(scale):
  # Largest entry 1e38: the trace overflows. 1e-36: the smaller entries are near the
  # smallest normal float, or below it (XLA reads those as 0, so the oracle does too).
  rng = np.random.default_rng(9)
  factor = rng.normal(size=(4, 6, 6))
  matrices = np.einsum("bij,bkj->bik", factor, factor)
  matrices = matrices / matrices.max(axis=(1, 2), keepdims=True)
  scaled = (matrices * scale).astype(np.float32)
  scaled[np.abs(scaled) < FLOAT32.tiny] = 0
  want = np.linalg.eigvalsh(scaled.astype(np.float64))[:, -1]
  got = np.asarray(covariance.top_eigenvalue(scaled))
  assert np.all(np.isfinite(got)) and np.all(got > 0)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def _trap(size: int) -> np.ndarray:
  """PSD matrix whose top eigenvector (eigenvalue 10) is orthogonal to the Lanczos
  start vector, which itself is an eigenvector (eigenvalue 1)."""
  start = covariance.start_vector(size)
  rng = np.random.default_rng(size)
  basis = np.linalg.qr(np.column_stack([start, rng.normal(size=(size, size - 1))]))[0]
  top = basis[:, 1]
  return 10 * np.outer(top, top) + np.outer(start, start)


@pytest.mark.parametrize("size", [2, 3, 6, 32])
def test_top_eigenvector_orthogonal_to_the_start_vector(size):
  # Lanczos from that start never leaves span{start}: it reported 1, not 10. The
  # ordinary matrices beside it in the batch keep their own result.
  rng = np.random.default_rng(10)
  factor = rng.normal(size=(3, size, size))
  ordinary = np.einsum("bij,bkj->bik", factor, factor)
  matrices = np.concatenate([_trap(size)[None], ordinary]).astype(np.float32)
  want = np.linalg.eigvalsh(matrices.astype(np.float64))[:, -1]
  np.testing.assert_allclose(covariance.top_eigenvalue(matrices), want, rtol=1e-5)


def test_covariance_whose_top_direction_is_orthogonal_to_the_start_vector():
  # The K x K route (S > K): samples whose covariance is exactly the trap.
  size, num_samples = 6, 9
  values, vectors = np.linalg.eigh(_trap(size))
  rng = np.random.default_rng(11)
  centred = np.linalg.qr(np.column_stack([np.ones(num_samples), rng.normal(size=(9, size))]))[0]
  deviations = centred[:, 1:] * np.sqrt(np.maximum(values, 0) * (num_samples - 1)) @ vectors.T
  samples = (deviations + rng.normal(size=size))[:, None, :].astype(np.float32)
  np.testing.assert_allclose(covariance.covariance_norm(samples), 10.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_low_precision_samples_are_computed_in_float32(dtype):
  samples = _examples(5, 7)[:, :3]
  low = jnp.asarray(samples, dtype)
  got = covariance.covariance_norm(low)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, covariance.covariance_norm(np.asarray(low, np.float32)))
