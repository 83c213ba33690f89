"""How the library's small programs are compiled.

``jit_small`` is ``jax.jit`` for programs over per-bin or per-split arrays
(kilobytes): XLA's backend at optimisation level 0 compiles them several times
faster, and they still run in a few milliseconds (docs/performance.md). A first evaluate
compiles a few dozen programs, so compile time is much of its wall time. Only for
functions called outside ``jit``: JAX refuses compiler options on a nested one.
"""

import functools

import jax

SMALL_PROGRAM_OPTIONS = {"xla_backend_optimization_level": 0}


def jit_small(fun=None, **jit_kwargs):
  """``jax.jit(fun, **jit_kwargs)`` compiled with ``SMALL_PROGRAM_OPTIONS``; a decorator."""
  if fun is None:
    return functools.partial(jit_small, **jit_kwargs)
  return jax.jit(fun, compiler_options=SMALL_PROGRAM_OPTIONS, **jit_kwargs)
