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


def pad(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
  """Each [T] array padded to a power of two (at least 2) by repeating its last value."""
  size = 1 << max(1, int(arrays[0].shape[0] - 1).bit_length())
  return tuple(np.pad(x, (0, size - x.shape[0]), mode="edge") for x in arrays)


def to_json(model: tuple) -> dict:
  """A NamedTuple model's arrays as JSON values: floats exactly (as float64), integers."""
  host = {name: np.asarray(x) for name, x in model._asdict().items()}
  return {k: (x.astype(np.float64) if x.dtype.kind == "f" else x).tolist() for k, x in host.items()}


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
