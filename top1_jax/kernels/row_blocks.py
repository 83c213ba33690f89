"""Per-example reductions over [N, K] arrays, a cache-sized block of examples at a time.

Why: a reduction over classes that needs several sums of one element-wise term
(e.g. sum w, sum w c and sum w c^2 with w = exp(beta c), for temperature
scaling's Newton steps) makes XLA on CPU write the term as a whole [N, K] array
and read it back once per sum: at N = 50,000, K = 1,000 that is 200 MB each
way, where the same sums over blocks of ~1 MB read the term from cache
(docs/performance.md has the timings).
Inside ``jit`` only; the blocks run one after another in one compiled loop (on the
CPU: an accelerator gets the whole array as one block).
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

BLOCK_ELEMENTS = 1 << 18
"""Elements of one [rows, K] float32 block (1 MiB): it and a few temporaries fit in L2."""


def block_rows(num_classes: int) -> int:
  """Rows per block for K classes (at least 1), on the CPU.

  On an accelerator, all rows: a GPU keeps its thousands of threads busy only
  with the whole array, and streams it at TB/s rather than from a cache.
  """
  if jax.default_backend() != "cpu":
    return 1 << 62
  return max(1, BLOCK_ELEMENTS // max(1, num_classes))


def map_row_blocks(fn: Callable, arrays: Sequence[jax.Array], rows: int) -> tuple:
  """``fn`` over blocks of ``rows`` examples of ``arrays``, its outputs stacked back to N.

  Args:
    fn: (*blocks) -> tuple of per-example arrays [rows, ...]; each block is
      ``arrays[i][start : start + rows]``. It must treat rows independently.
    arrays: arrays sharing their leading dimension N >= 1.
    rows: rows per block (capped at N).

  Returns:
    ``fn``'s outputs for all N rows, as a tuple. The last block is shifted back
    to end at N (it overlaps the one before, whose values its repeated rows
    keep), so no input is padded or copied.
  """
  num = arrays[0].shape[0]
  rows = min(rows, num)
  count = -(-num // rows)
  if count == 1:
    return tuple(fn(*arrays))

  def one_block(index):
    start = jnp.minimum(index * rows, num - rows)
    return tuple(fn(*(lax.dynamic_slice_in_dim(a, start, rows, 0) for a in arrays)))

  # Stacked [count, rows, ...] outputs rather than a carried [N] buffer: a carry made
  # of fresh zeros does not type-check inside shard_map (it is not per-device).
  stacked = lax.map(one_block, jnp.arange(count))
  repeated = count * rows - num  # the last block's first rows, already in the one before

  def assemble(value):
    head = value[:-1].reshape((count - 1) * rows, *value.shape[2:])
    return jnp.concatenate([head, value[-1, repeated:]])

  return tuple(assemble(value) for value in stacked)
