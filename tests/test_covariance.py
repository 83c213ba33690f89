"""covariance: batched covariance 2-norms against float64 NumPy ``eigvalsh``."""

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
