"""The covariance 2-norm ``||Cov_s(x_s)||_2`` of many small [S, K] sample sets at once.

Only the m x m of the covariance or the Gram matrix, m = min(S, K), is formed (they share
their nonzero eigenvalues). Its top eigenvalue: batched Lanczos and bisection on the CPU
(LAPACK's ``eigh`` is serial per matrix), one batched ``eigvalsh`` elsewhere.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Sample values per product step (on the CPU a plain matmul beats a batched one).
_BLOCK_ELEMENTS = {"cpu": 1 << 15, "other": 1 << 28}

# Matrix entries per eigenvalue step: memory stays O(chunk * m^2) whatever N.
_CHUNK_MATRIX_ELEMENTS = {"cpu": 1 << 18, "other": 1 << 26}


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _precision() -> jax.lax.Precision | None:
  # Full float32 products: GPUs would otherwise multiply in TF32.
  return None if _on_cpu() else jax.lax.Precision.HIGHEST


def _at_least_float32(values: jax.Array) -> jax.Array:
  # float16 and bfloat16 are computed in float32: their squares leave their range.
  return values.astype(jnp.promote_types(values.dtype, jnp.float32))


def start_vector(size: int) -> np.ndarray:
  """The fixed [size] float64 unit start vector of Lanczos: not all ones, which centred
  samples have in their null space. Public for a test of the restart."""
  vector = np.random.default_rng(0).normal(size=size)
  return vector / np.linalg.norm(vector)


def _lanczos(matrices: jax.Array, start: jax.Array, breakdown: jax.Array) -> tuple:
  """[B, m, m] symmetric -> Lanczos tridiagonals: [B, m] diagonal, [B, m-1] off-diagonal,
  from [B, m] unit ``start`` vectors, stopping where a residual is below ``breakdown``."""

  def step(carry, _):
    vector, previous, previous_beta = carry
    product = jnp.einsum("bij,bj->bi", matrices, vector, precision=_precision())
    alpha = jnp.sum(product * vector, axis=-1)
    residual = product - alpha[:, None] * vector - previous_beta[:, None] * previous
    beta = jnp.sqrt(jnp.sum(residual * residual, axis=-1))
    alive = beta > breakdown
    beta = jnp.where(alive, beta, 0.0)
    following = residual * jnp.where(alive, 1 / jnp.where(alive, beta, 1.0), 0.0)[:, None]
    return (following, vector, beta), (alpha, beta)

  carry = (start, jnp.zeros_like(start), jnp.zeros_like(start[:, 0]))
  _, (alphas, betas) = jax.lax.scan(step, carry, None, length=matrices.shape[-1])
  return alphas.T, betas.T[:, :-1]


def _restarting_lanczos(matrices: jax.Array, start: jax.Array, breakdown: jax.Array) -> tuple:
  """``_lanczos`` reorthogonalised and restarted where the Krylov space closes: the
  costlier fallback, whose tridiagonal holds every eigenvalue."""
  size = matrices.shape[-1]

  def orthogonalised(vector, basis):
    for _ in range(2):  # twice is enough (Parlett): once leaves rounding in the span
      along = jnp.einsum("bji,bi->bj", basis, vector, precision=_precision())
      vector = vector - jnp.einsum("bji,bj->bi", basis, along, precision=_precision())
    return vector

  def unit(vector):
    length = jnp.sqrt(jnp.sum(vector * vector, axis=-1))
    return vector / jnp.where(length > 0, length, 1.0)[:, None]

  def step(carry, index):
    vector, basis = carry
    basis = jax.lax.dynamic_update_index_in_dim(basis, vector, index, axis=1)
    product = jnp.einsum("bij,bj->bi", matrices, vector, precision=_precision())
    alpha = jnp.sum(product * vector, axis=-1)
    residual = orthogonalised(product, basis)
    beta = jnp.sqrt(jnp.sum(residual * residual, axis=-1))
    alive = beta > breakdown
    outside = 1 - jnp.sum(basis * basis, axis=1)  # [B, m]: each unit vector's part off the span
    fresh = jax.nn.one_hot(jnp.argmax(outside, axis=1), size, dtype=matrices.dtype)
    following = jnp.where(alive[:, None], unit(residual), unit(orthogonalised(fresh, basis)))
    return (following, basis), (alpha, jnp.where(alive, beta, 0.0))

  carry = (start, jnp.zeros_like(matrices))
  _, (alphas, betas) = jax.lax.scan(step, carry, jnp.arange(size))
  return alphas.T, betas.T[:, :-1]


def _top_of_tridiagonal(diagonal: jax.Array, off_diagonal: jax.Array) -> jax.Array:
  """[B, m] diagonal, [B, m-1] off-diagonal -> [B] largest eigenvalue, by bisection in
  [max diagonal, Gershgorin bound]: x is below it iff a pivot of LDL^T(T - x I) is > 0."""
  squares = jnp.square(off_diagonal)
  magnitude = jnp.abs(off_diagonal)
  edge = jnp.zeros(diagonal.shape[:1] + (1,), diagonal.dtype)
  radius = jnp.concatenate([edge, magnitude], 1) + jnp.concatenate([magnitude, edge], 1)
  lower = jnp.max(diagonal, axis=1)
  upper = jnp.max(diagonal + radius, axis=1)
  finfo = jnp.finfo(diagonal.dtype)
  pivot_floor = finfo.tiny * jnp.maximum(1.0, jnp.max(squares, axis=1, initial=0.0))
  squares = jnp.concatenate([edge, squares], 1)

  def below_top(x):
    def pivot(i, carry):
      previous, positive = carry
      current = diagonal[:, i] - x - squares[:, i] / previous
      current = jnp.where(jnp.abs(current) < pivot_floor, -pivot_floor, current)
      return current, positive | (current > 0)

    start = (jnp.ones_like(x), jnp.zeros_like(x, dtype=bool))
    return jax.lax.fori_loop(0, diagonal.shape[1], pivot, start)[1]

  def halve(_, bounds):
    lower, upper = bounds
    middle = 0.5 * (lower + upper)
    below = below_top(middle)
    return jnp.where(below, middle, lower), jnp.where(below, upper, middle)

  # nmant + 3 halvings leave the bracket below one ulp of the top eigenvalue.
  lower, upper = jax.lax.fori_loop(0, finfo.nmant + 3, halve, (lower, upper))
  return 0.5 * (lower + upper)


def _power_of_two(exponent: jax.Array, dtype) -> jax.Array:
  # From its bits, exact: exp2 is not exact on every backend. |exponent| <= 64 here.
  info = jnp.finfo(dtype)
  bits = (exponent.astype(jnp.int32) + (info.maxexp - 1)).astype(
    jnp.int32 if info.bits == 32 else jnp.int64
  )
  return jax.lax.bitcast_convert_type(bits << info.nmant, dtype)


def _binary_exponent(matrices: jax.Array) -> jax.Array:
  """[B] int32 e: 2^-e brings the largest diagonal entry into [0.5, 1), or 0 where it
  lies in [2^-64, 2^64] already (so that ordinary matrices are not touched)."""
  largest = jnp.max(jnp.diagonal(matrices, axis1=1, axis2=2), axis=1)
  exponent = jnp.frexp(largest)[1]
  ordinary = (largest >= 2.0**-64) & (largest <= 2.0**64) | ~jnp.isfinite(largest)
  return jnp.where(ordinary | (largest <= 0), 0, exponent)


def _times_power_of_two(values: jax.Array, exponent: jax.Array) -> jax.Array:
  """``values * 2^exponent``, exact but for overflow; two factors stay normal floats."""
  half = exponent // 2
  factors = (_power_of_two(half, values.dtype), _power_of_two(exponent - half, values.dtype))
  expand = (slice(None),) + (None,) * (values.ndim - 1)
  return values * factors[0][expand] * factors[1][expand]


def _lanczos_top(normalised: jax.Array) -> jax.Array:
  """[B, m, m] PSD with trace 1 (or 0) -> [B] top eigenvalue, by Lanczos and bisection."""
  size = normalised.shape[-1]
  trace = jnp.trace(normalised, axis1=1, axis2=2)
  # ``*_like`` carries, as shard_map requires.
  start = jnp.zeros_like(normalised[:, 0]) + jnp.asarray(start_vector(size), normalised.dtype)
  # An invariant subspace ends the sequence: the next vector would be rounding noise.
  lanczos_args = (normalised, start, size * jnp.finfo(normalised.dtype).eps * trace)
  diagonal, off_diagonal = _lanczos(*lanczos_args)
  top = _top_of_tridiagonal(diagonal, off_diagonal)
  # Where the sequence stopped early and the trace beyond sum(diagonal) (eigenvectors
  # never reached) could hold a larger eigenvalue, Lanczos restarts.
  slack = 4 * size * jnp.finfo(normalised.dtype).eps
  stopped = jnp.any(off_diagonal == 0, axis=1)
  suspect = stopped & (trace - jnp.sum(diagonal, axis=1) > top + slack)
  return jax.lax.cond(
    jnp.any(suspect),
    lambda: jnp.where(suspect, _top_of_tridiagonal(*_restarting_lanczos(*lanczos_args)), top),
    lambda: top,
  )


def _scaled_top_eigenvalue(matrices: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[B, m, m] PSD -> [B] top eigenvalues as ``top * 2^exponent``, so that a caller may
  divide ``top`` before the power of two takes it past the float range."""
  # Scaled by an exact power of two first: traces near the float limits over/underflow.
  exponent = _binary_exponent(matrices)
  matrices = _times_power_of_two(matrices, -exponent)
  if not _on_cpu():
    # cuSOLVER's batched Jacobi beats Lanczos' m sequential steps on a GPU.
    return jnp.maximum(jnp.linalg.eigvalsh(matrices)[:, -1], 0.0), exponent
  # Divided by the trace (>= the top eigenvalue): the squares inside stay in range.
  trace = jnp.trace(matrices, axis1=1, axis2=2)
  trace = jnp.where(trace > 0, trace, 1.0)
  normalised = matrices / trace[:, None, None]
  return jnp.maximum(_lanczos_top(normalised), 0.0) * trace, exponent


@jax.jit
def top_eigenvalue(matrices: jax.Array) -> jax.Array:
  """[B] largest eigenvalue (>= 0, at least float32) of [B, m, m] symmetric PSD matrices,
  unchecked; entries may lie anywhere in the float range."""
  if matrices.ndim != 3 or matrices.shape[1] != matrices.shape[2] or matrices.shape[1] == 0:
    raise ValueError(f"matrices: expected shape [B, m, m] with m >= 1, got {matrices.shape}")
  num_matrices, size, _ = matrices.shape
  matrices = _at_least_float32(matrices)
  if num_matrices == 0:
    return jnp.zeros((0,), matrices.dtype)
  _, chunk, num_chunks = _sizes(num_matrices, size, size, samples_per_block=False)

  def one_chunk(start):
    chunk_matrices = jax.lax.dynamic_slice_in_dim(matrices, start, chunk)
    return _times_power_of_two(*_scaled_top_eigenvalue(chunk_matrices))

  return _over_chunks(one_chunk, num_matrices, chunk, num_chunks)


def _products(centred: jax.Array) -> jax.Array:
  """[S, b, K] centred samples -> [b, m, m]: X X^T when S < K, else X^T X."""
  num_samples, num_examples, num_classes = centred.shape
  if num_examples == 1:
    # One plain matmul: on the CPU faster than a batched one of batch size 1.
    pattern = "sk,tk->st" if num_samples < num_classes else "sk,sl->kl"
    return jnp.einsum(pattern, centred[:, 0], centred[:, 0], precision=_precision())[None]
  pattern = "snk,tnk->nst" if num_samples < num_classes else "snk,snl->nkl"
  return jnp.einsum(pattern, centred, centred, precision=_precision())


def _centred(samples: jax.Array) -> jax.Array:
  # Centred before any product (centring the Gram cancels tiny spreads away), twice:
  # the second pass takes out the mean's rounding error.
  centred = samples - jnp.mean(samples, axis=0)
  centred = centred - jnp.mean(centred, axis=0)
  # Identical samples centre to exactly 0 (a float mean of equal values need not equal them).
  largest = jnp.max(samples, axis=0)
  same = (largest == jnp.min(samples, axis=0)) & jnp.isfinite(largest)
  return jnp.where(same, 0.0, centred)


def _chunk_products(samples: jax.Array, start: jax.Array, chunk: int, block: int) -> jax.Array:
  """Examples [start, start + chunk) -> [chunk, m, m], ``block`` examples per step."""

  def one_block(index):
    # Sliced from the whole array: slicing the chunk first would copy it once more.
    examples = jax.lax.dynamic_slice_in_dim(samples, start + index * block, block, axis=1)
    return _products(_centred(examples))

  if chunk == block:  # no loop to compile for a single step
    return one_block(0)
  products = jax.lax.map(one_block, jnp.arange(chunk // block))
  return products.reshape((chunk,) + products.shape[2:])


def _rescaled_chunk_products(
  samples: jax.Array, start: jax.Array, chunk: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """[chunk, m, m] products of samples divided by each example's largest deviation, that
  scale and the exponent e, per example: the norm is multiplied back by scale^2 4^e."""
  examples = jax.lax.dynamic_slice_in_dim(samples, start, chunk, axis=1)
  # Near the float limit the mean's sum overflows: such examples are first scaled down
  # by an exact 2^64 (their float spacing is over 2^40, so no deviation is lost).
  huge = jnp.max(jnp.abs(examples), axis=(0, 2)) > 2.0**64
  exponent = jnp.where(huge, 64, 0).astype(jnp.int32)  # int32 with x64 on too (as frexp's)
  centred = _centred(_times_power_of_two(examples.swapaxes(0, 1), -exponent).swapaxes(0, 1))
  scale = jnp.max(jnp.abs(centred), axis=(0, 2))
  scale = jnp.where(scale > 0, scale, 1.0)
  return _products(centred / scale[:, None]), scale, exponent


def _chunk_norms(samples: jax.Array, start: jax.Array, chunk: int, block: int) -> jax.Array:
  """[S, N, K] -> [chunk] covariance norms of examples [start, start + chunk)."""
  products = _chunk_products(samples, start, chunk, block)
  # Examples whose raw products overflow or near the subnormals are redone rescaled.
  largest = jnp.max(jnp.diagonal(products, axis1=1, axis2=2), axis=1)
  smallest_safe = np.sqrt(jnp.finfo(samples.dtype).tiny)
  rescale = ~jnp.all(jnp.isfinite(products), axis=(1, 2)) | (largest < smallest_safe)

  def rescaled():
    new_products, scale, exponent = _rescaled_chunk_products(samples, start, chunk)
    new_products = jnp.where(rescale[:, None, None], new_products, products)
    return new_products, jnp.where(rescale, scale, 1.0), jnp.where(rescale, exponent, 0)

  products, scale, exponent = jax.lax.cond(
    jnp.any(rescale),
    rescaled,
    lambda: (products, jnp.ones_like(largest), jnp.zeros_like(largest, dtype=jnp.int32)),
  )
  # In this order so that no intermediate overflows where the norm does not.
  top, top_exponent = _scaled_top_eigenvalue(products)
  norms = top / (samples.shape[0] - 1) * scale * scale
  norms = _times_power_of_two(_times_power_of_two(norms, top_exponent), 2 * exponent)
  # Rescaled products are finite unless the samples are not: mark those examples.
  return jnp.where(jnp.all(jnp.isfinite(products), axis=(1, 2)), norms, jnp.nan)


def _sizes(
  num_examples: int, num_samples: int, num_classes: int, samples_per_block: bool = True
) -> tuple[int, int, int]:
  """Examples per product step, per chunk (a multiple of it, at most N), and chunks."""
  kind = "cpu" if _on_cpu() else "other"
  size = min(num_samples, num_classes)
  per_block = _BLOCK_ELEMENTS[kind] // (num_samples * num_classes) if samples_per_block else 1
  block = max(1, min(num_examples, per_block))
  blocks_per_chunk = max(1, _CHUNK_MATRIX_ELEMENTS[kind] // (size * size * block))
  largest = block * max(1, min(blocks_per_chunk, num_examples // block))
  num_chunks = -(-num_examples // largest)
  # Even chunks: the last, shifted back to end at N, recomputes few of its neighbour's.
  even = -(-num_examples // num_chunks)
  if block >= even:
    return even, even, num_chunks
  return block, block * -(-even // block), num_chunks


def _over_chunks(chunk_fn, num_examples: int, chunk: int, num_chunks: int) -> jax.Array:
  """[N] results of ``chunk_fn(start) -> [chunk]`` over chunks covering [0, N)."""
  # The last chunk is shifted back to end at N, not padded (a copy of the whole input).
  if num_chunks == 1:
    return chunk_fn(0)
  starts = jnp.minimum(jnp.arange(num_chunks) * chunk, num_examples - chunk)
  results = jax.lax.map(chunk_fn, starts)
  tail = num_examples - (num_chunks - 1) * chunk
  return jnp.concatenate([results[:-1].reshape(-1), results[-1, chunk - tail :]])


@jax.jit
def covariance_norm(samples: jax.Array) -> jax.Array:
  """[N] largest eigenvalue of each example's unbiased covariance (``np.cov``) of [S, N, K].
  Unchecked, at least float32, safe under ``shard_map``. 0 for identical samples and
  below the smallest normal float; inf past the float range; NaN for non-finite samples."""
  if samples.ndim != 3 or samples.shape[0] < 2 or samples.shape[2] == 0:
    raise ValueError(f"samples: expected shape [S >= 2, N, K >= 1], got {samples.shape}")
  num_samples, num_examples, num_classes = samples.shape
  samples = _at_least_float32(samples)
  if num_examples == 0:
    return jnp.zeros((0,), samples.dtype)
  block, chunk, num_chunks = _sizes(num_examples, num_samples, num_classes)
  one_chunk = lambda start: _chunk_norms(samples, start, chunk, block)
  return _over_chunks(one_chunk, num_examples, chunk, num_chunks)
