"""A curve tabulated at knots of U and interpolated linearly: how isotonic and kde predict.

Tables are padded to a power-of-two length by repeating the last knot, so that predicting
with tables of different sizes reuses one compiled program.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.estimators import base


@jax.jit
def interpolate(u: jax.Array, knots: jax.Array, values: jax.Array) -> jax.Array:
  """[N] ``values`` [T] at ``u`` [N], linear between ascending ``knots`` [T], constant
  beyond them."""
  return jnp.interp(u, knots, values)


def padded_size(num_knots: int) -> int:
  """The power of two (at least 2) that ``num_knots`` knots are padded to."""
  return 1 << max(1, int(num_knots - 1).bit_length())


def pad(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
  """Each [T] array padded to ``padded_size(T)`` by repeating its last value."""
  size = padded_size(arrays[0].shape[0])
  return tuple(np.pad(x, (0, size - x.shape[0]), mode="edge") for x in arrays)


def read_knots(d: Mapping, source: str, *value_fields: str) -> tuple[np.ndarray, ...]:
  """A saved table: "knots" (ascending) and the value fields, each as long, as float64."""
  knots = base.read_array(d, "knots", source, "f")
  if knots.shape[0] == 0 or np.any(np.diff(knots) < 0):
    raise ValueError(f"{source}: field 'knots' must be one or more ascending numbers")
  values = [base.read_array(d, name, source, "f") for name in value_fields]
  for name, value in zip(value_fields, values, strict=True):
    if value.shape != knots.shape:
      raise ValueError(
        f"{source}: field {name!r} must have one value per knot ({knots.shape[0]}),"
        f" got {value.shape[0]}"
      )
  return knots, *values
