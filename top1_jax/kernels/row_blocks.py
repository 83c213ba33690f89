"""Per-example reductions over [N, K] arrays, a cache-sized block of examples at a time.

Several sums of one element-wise term make XLA on CPU write the term as a whole [N, K]
array and read it back once per sum; over ~1 MB blocks it stays in cache. Inside ``jit``.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

BLOCK_ELEMENTS = 1 << 18
"""Elements of one [rows, K] float32 block (1 MiB): it and a few temporaries fit in L2."""


def map_row_blocks(fn: Callable, arrays: Sequence[jax.Array]) -> tuple:
  """The tuple of ``fn(*blocks)``'s per-row outputs over blocks of ``BLOCK_ELEMENTS // K``
  rows (K: the first array's last axis), for all N. ``fn`` must treat rows independently;
  ``arrays`` share their leading N >= 1. The last block is shifted back to end at N,
  overlapping the one before, so nothing is padded."""
  num = arrays[0].shape[0]
  # All rows at once on an accelerator: it needs the whole array to keep its threads busy.
  on_cpu = jax.default_backend() == "cpu"
  rows = min(max(1, BLOCK_ELEMENTS // max(1, arrays[0].shape[-1])), num) if on_cpu else num
  count = -(-num // rows)
  if count == 1:
    return tuple(fn(*arrays))

  def one_block(index):
    start = jnp.minimum(index * rows, num - rows)
    return start, tuple(fn(*(lax.dynamic_slice_in_dim(a, start, rows, 0) for a in arrays)))

  # Each output is one [N] buffer written in place, starting as block 0's output padded
  # to N (fresh zeros would not type-check inside shard_map). The last block goes first,
  # so the block before it writes the rows they share, as if they ran in order.
  first = one_block(0)[1]
  out = tuple(jnp.pad(v, [(0, num - rows)] + [(0, 0)] * (v.ndim - 1)) for v in first)

  def write(i, out):
    start, values = one_block(jnp.where(i == 1, count - 1, i - 1))
    written = zip(out, values, strict=True)
    return tuple(lax.dynamic_update_slice_in_dim(o, v, start, 0) for o, v in written)

  return lax.fori_loop(1, count, write, out)
