"""How the library's small programs (over per-bin or per-split arrays) are compiled.

XLA's backend at optimisation level 0 compiles them several times faster and they still
run in milliseconds; compile time is much of a first evaluate's (docs/performance.md).
"""

import jax


def jit_small(fun):
  """``jax.jit`` at XLA backend optimisation level 0, a decorator; only outside ``jit``
  (JAX refuses compiler options on a nested one)."""
  return jax.jit(fun, compiler_options={"xla_backend_optimization_level": 0})
