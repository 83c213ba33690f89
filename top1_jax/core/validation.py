"""Input checks shared by the public entry points.

Each raises a ``ValueError`` naming the argument, what was expected and what was given.
Under ``jit`` only shapes are checked: value checks (finite, range) need concrete arrays.
"""

import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


class SettingError(ValueError):
  """A setting (config field or flag) that does not fit the data; the message starts with
  the setting's name, which a launcher spells as its own flag."""


def is_traced(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def _xp(arr):
  return np if isinstance(arr, np.ndarray) else jnp


def is_floating(dtype) -> bool:
  """Whether ``dtype`` is a float, ml_dtypes' bfloat16 (NumPy kind "V") included."""
  return jnp.issubdtype(dtype, jnp.floating)


def as_array(
  name: str, x: ArrayLike, ndim: int | Sequence[int], *, host: bool = False
) -> jax.Array | np.ndarray:
  """``x`` as an array of rank ``ndim`` (one of them); a NumPy array with ``host``."""
  if x is None:
    raise ValueError(f"{name}: expected an array, got None")
  if isinstance(x, jax.Array) and (not host or is_traced(x)):
    arr = x
  else:
    try:
      converted = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      # torch refuses to convert a tensor that requires grad (a RuntimeError).
      hint = "; call .detach() on the tensor first" if "requires grad" in str(e) else ""
      raise ValueError(f"{name}: cannot convert to an array ({first}){hint}") from None
    if not (converted.dtype.kind in "biu" or is_floating(converted.dtype)):
      raise ValueError(f"{name}: expected a real-valued array, got dtype {converted.dtype}")
    arr = converted if host else jnp.asarray(converted)
  ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
  if arr.ndim not in ndims:
    want = " or ".join(f"{d}-D" for d in ndims)
    raise ValueError(f"{name}: expected a {want} array, got shape {arr.shape}")
  return arr


_CPU_ALIGNMENT = 64  # XLA:CPU's device_put keeps a host buffer so aligned, copies others


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
  """An uninitialised host array (to fill) that XLA:CPU's ``device_put`` keeps, not copies."""
  nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
  raw = np.empty(nbytes + _CPU_ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % _CPU_ALIGNMENT
  return raw[start : start + nbytes].view(dtype).reshape(shape)


def _to_device(arr: np.ndarray, given) -> jax.Array:
  """``arr`` on the device without a compile; copied (aligned) if ``device_put`` could keep
  a buffer shared with the caller's ``given``."""
  shared = np.may_share_memory(arr, given)
  if shared or (arr.ctypes.data % _CPU_ALIGNMENT and arr.nbytes >= 1 << 20):
    aligned = aligned_empty(arr.shape, arr.dtype)
    np.copyto(aligned, arr)
    arr = aligned
  return jax.device_put(arr)


def in_device_dtype(arr: np.ndarray) -> np.ndarray:
  """A host array in the dtype JAX would hold it in (float64 -> float32 unless x64 is on),
  so host arithmetic rounds as the device's would; no copy if it already is."""
  return arr.astype(jax.dtypes.canonicalize_dtype(arr.dtype), copy=False)


def float_array(
  name: str, x: ArrayLike, ndim: int | Sequence[int], *, host: bool = False
) -> jax.Array | np.ndarray:
  """A finite floating array of rank ``ndim`` (not bool); integers, float16 and bfloat16
  become float32 (too small for the scores' logs and sums)."""
  # A host array is checked on the host, then moved: no device program per shape.
  moved = not (host or isinstance(x, jax.Array))
  arr = as_array(name, x, ndim, host=host or moved)
  if arr.dtype == np.bool_:
    raise ValueError(
      f"{name}: expected real numbers, got a bool array; cast it to float if 0/1 values are meant"
    )
  if np.issubdtype(arr.dtype, np.integer) or jnp.finfo(arr.dtype).bits < 32:
    arr = arr.astype(np.float32)
  if moved:
    arr = in_device_dtype(arr)  # as it will be
  check_finite(name, arr)
  return _to_device(arr, x) if moved else arr


# x * 0 is NaN exactly for NaN and +-inf: a float sum, faster on CPU than all(isfinite).
_all_finite = jax.jit(lambda arr: jnp.isfinite(jnp.sum(arr * 0)))


# A device array up to this size is checked from a host copy, not by a program per shape.
_HOST_CHECKED_ELEMENTS = 1 << 16


def _checked_where(arr: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
  """``arr``, or a host copy of a small device array that this process can read whole."""
  if isinstance(arr, np.ndarray) or arr.size > _HOST_CHECKED_ELEMENTS:
    return arr
  return np.asarray(arr) if arr.is_fully_addressable else arr


# A host array is checked this many elements at a time: np.isfinite makes a bool array
# of its input's size.
_HOST_BLOCK_ELEMENTS = 1 << 20


def _host_all_finite(arr: np.ndarray) -> bool:
  if arr.ndim == 0:
    return bool(np.isfinite(arr))
  rows = max(1, _HOST_BLOCK_ELEMENTS // max(1, arr[0].size))
  return all(np.isfinite(arr[i : i + rows]).all() for i in range(0, arr.shape[0], rows))


def check_finite(name: str, arr: jax.Array | np.ndarray) -> None:
  if is_traced(arr) or arr.size == 0:
    return
  arr = _checked_where(arr)
  if not (_host_all_finite(arr) if isinstance(arr, np.ndarray) else bool(_all_finite(arr))):
    xp = _xp(arr)
    finite = xp.isfinite(arr)
    bad = int(finite.size - xp.sum(finite))
    first = int(xp.argmin(finite.reshape(-1)))
    value = arr.reshape(-1)[first]
    raise ValueError(
      f"{name}: {bad} non-finite value(s) (first at flat index {first}: {value});"
      " remove or fix NaN/Inf before scoring"
    )


def check_nonempty(name: str, arr: jax.Array, axis: int = 0, what: str = "example") -> None:
  if arr.shape[axis] == 0:
    raise ValueError(f"{name}: expected at least one {what}, got shape {arr.shape}")


def check_samples(name: str, arr: jax.Array) -> None:
  """[S, N, K] samples (or ensemble members) with S >= 1 and N >= 1."""
  check_nonempty(name, arr, axis=0, what="sample (or member) on the first axis of [S, N, K]")
  check_nonempty(name, arr, axis=1)


def bool_array(name: str, x: ArrayLike, ndim: int = 1, *, host: bool = False) -> jax.Array:
  """A boolean event array; accepts bools or 0/1 numbers."""
  moved = not (host or isinstance(x, jax.Array))  # checked on the host, as float_array
  arr = as_array(name, x, ndim, host=host or moved)
  if arr.dtype != np.bool_:
    if not (np.issubdtype(arr.dtype, np.integer) or is_floating(arr.dtype)):
      raise ValueError(f"{name}: expected bool or 0/1 values, got dtype {arr.dtype}")
    xp = _xp(arr)
    if not is_traced(arr) and arr.size and not bool(xp.all((arr == 0) | (arr == 1))):
      bad = arr.reshape(-1)[xp.argmax((arr != 0) & (arr != 1))]
      raise ValueError(f"{name}: expected bool or 0/1 values, got {bad}")
    arr = arr.astype(bool)
  return _to_device(arr, x) if moved else arr


def labels_array(
  name: str, x: ArrayLike, num_classes: int, *, host: bool = False
) -> jax.Array | np.ndarray:
  """Int32 class labels in [0, num_classes), range-checked in the input's own dtype (so
  that 2**32 + 3 is an error, not a class that wrapped around)."""
  arr = as_array(name, x, 1, host=True)  # a tracer stays one: only its dtype is checked
  floats = arr.dtype.kind == "f" and not is_traced(arr)  # accepted if whole
  if not (floats or jnp.issubdtype(arr.dtype, jnp.integer)):
    raise ValueError(f"{name}: expected integer class labels, got dtype {arr.dtype}")
  if is_traced(arr):
    return arr.astype(jnp.int32)
  if floats and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
    raise ValueError(f"{name}: expected integer class labels, got non-integer floats")
  if arr.size:
    lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= num_classes:
      lo, hi = (int(v) if arr.dtype.kind in "iu" else float(v) for v in (lo, hi))
      raise ValueError(f"{name}: labels out of range [0, {num_classes}): min {lo}, max {hi}")
  return arr.astype(np.int32) if host else _to_device(arr.astype(np.int32), x)


_min_max = jax.jit(lambda arr: (jnp.min(arr), jnp.max(arr)))


SUM_TOLERANCE = 1e-3
"""How far a row of probabilities may sum from 1 (saved float32 softmax outputs do)."""


def sum_tolerance(dtype) -> float:
  """``SUM_TOLERANCE``, or the epsilon of a coarser floating ``dtype`` (bfloat16's 2^-7)."""
  try:
    if dtype is not None and is_floating(dtype):
      return max(SUM_TOLERANCE, float(jnp.finfo(dtype).eps))
  except TypeError:  # not a NumPy dtype (a torch tensor's): its array is converted to one
    pass
  return SUM_TOLERANCE


def rounding_tolerance(dtype, num_classes: int) -> float:
  """How far from 1 a row of ``num_classes`` values may sum and still be probabilities
  passed as logits: ``sum_tolerance(dtype)`` or K * 5e-4, the wider (K probabilities
  saved with three decimals, each off by up to half a unit)."""
  return max(sum_tolerance(dtype), num_classes * 5e-4)


def probability_array(
  name: str,
  x: ArrayLike,
  ndim: int | Sequence[int],
  *,
  sums_to_one: bool = False,
  host: bool = False,
) -> jax.Array | np.ndarray:
  """Values in [0, 1]; with ``sums_to_one`` rows sum to 1 within ``sum_tolerance``."""
  tolerance = sum_tolerance(getattr(x, "dtype", None))
  moved = not (host or isinstance(x, jax.Array))  # checked on the host, as float_array
  arr = float_array(name, x, ndim, host=host or moved)
  if is_traced(arr) or arr.size == 0:
    return arr
  values = _checked_where(arr)
  xp = _xp(values)
  lo, hi = (float(v) for v in (_min_max(values) if xp is jnp else (values.min(), values.max())))
  if lo < 0.0 or hi > 1.0:
    raise ValueError(f"{name}: probabilities must lie in [0, 1], got min {lo:g}, max {hi:g}")
  if sums_to_one:
    sums = xp.sum(values, axis=-1).reshape(-1)  # one per row, whatever the leading axes
    worst = int(xp.argmax(xp.abs(sums - 1.0)))
    if abs(float(sums[worst]) - 1.0) > tolerance:
      raise ValueError(
        f"{name}: each row must sum to 1, row {worst} sums to {float(sums[worst]):.6g}"
      )
  return _to_device(arr, x) if moved else arr


def _host_rows_are_probabilities(rows: np.ndarray, tolerance: float) -> bool:
  rows = rows.astype(np.float32, copy=False)  # bfloat16 and float16 sum in float32
  if not (rows.min() >= 0.0 and rows.max() <= 1.0):
    return False
  return bool(np.all(np.abs(np.sum(rows, axis=-1) - 1.0) <= tolerance))


@jax.jit
def _rows_are_probabilities(arr: jax.Array, tolerance: jax.Array) -> jax.Array:
  in_range = (jnp.min(arr) >= 0.0) & (jnp.max(arr) <= 1.0)
  return in_range & jnp.all(jnp.abs(jnp.sum(arr, axis=-1) - 1.0) <= tolerance)


def looks_like_probabilities(arr: jax.Array | np.ndarray, dtype=None) -> bool:
  """Whether every row of ``arr`` lies in [0, 1] and sums to 1 within
  ``rounding_tolerance(dtype, K)``, as real logits never all do (False if traced or empty).
  A host array's first row decides for real logits before the whole array is read."""
  if is_traced(arr) or arr.size == 0:
    return False
  tolerance = rounding_tolerance(arr.dtype if dtype is None else dtype, arr.shape[-1])
  values = _checked_where(arr)
  if isinstance(values, np.ndarray):
    rows = values.reshape(-1, values.shape[-1])
    first = _host_rows_are_probabilities(rows[:1], tolerance)
    return first and _host_rows_are_probabilities(rows, tolerance)
  return bool(_rows_are_probabilities(values, np.float32(tolerance)))


def refuse_probabilities(name: str, arr: jax.Array | np.ndarray, fix: str, given=None) -> None:
  """A ValueError ending with ``fix`` if logits ``arr`` look like probabilities. ``given``,
  the caller's input, sets the dtype's tolerance and, when NumPy of ``arr``'s shape, is
  read instead of a device ``arr``."""
  host = isinstance(given, np.ndarray) and given.shape == arr.shape
  values = given if host else arr
  dtype = getattr(given, "dtype", None)
  if not looks_like_probabilities(values, dtype):
    return
  sums = np.sum(np.asarray(values, np.float32), axis=-1)
  low, high = float(np.min(sums)), float(np.max(sums))
  rounded = max(1.0 - low, high - 1.0) > sum_tolerance(values.dtype if dtype is None else dtype)
  rescale = f" (rows sum to {low:.4g} to {high:.4g}: divide each by its sum first)"
  raise ValueError(
    f"{name}: these look like probabilities (every row in [0, 1], summing to 1"
    f"{' within rounding' if rounded else ''}); {fix}{rescale if rounded else ''}"
  )


def ascending_edges(name: str, edges: np.ndarray) -> None:
  """Bin edges ascending (ties and +inf padding allowed) without NaN, else a ValueError."""
  # NaN compares false either way: a NaN edge is out of order too.
  out_of_order = ~(edges[1:] >= edges[:-1]) | np.isnan(edges[1:])
  if edges.size and (np.isnan(edges[0]) or out_of_order.any()):
    at = 0 if np.isnan(edges[0]) else int(np.argmax(out_of_order)) + 1
    raise ValueError(
      f"{name}: expected ascending edges (padded with +inf), got {edges[at]} at"
      f" index {at} after {edges[at - 1] if at else 'nothing'}; make bins with binning.fit"
    )


def hits_within_counts(name: str, hits, counts) -> None:
  """0 <= hits <= counts (broadcast together; ``Fraction`` values too), else a ValueError."""
  hits, counts = (x.reshape(-1) for x in np.broadcast_arrays(np.asarray(hits), np.asarray(counts)))
  bad = (hits < 0) | (hits > counts)
  if np.any(bad):
    at = int(np.argmax(bad))
    raise ValueError(
      f"{name}: expected 0 <= hits <= counts, got hits {hits[at]} and counts {counts[at]}"
      f" (at flat index {at})"
    )


def same_length(**arrays: jax.Array) -> int:
  """Checks that the arrays share their leading dimension; returns it."""
  lengths = {name: int(a.shape[0]) for name, a in arrays.items()}
  if len(set(lengths.values())) > 1:
    detail = ", ".join(f"{k} has {v}" for k, v in lengths.items())
    raise ValueError(f"length mismatch: {detail}")
  return next(iter(lengths.values()))


def instance(name: str, value, cls: type, hint: str):
  """``value`` if it is a ``cls``, else a ValueError naming ``hint`` (how to get one)."""
  if not isinstance(value, cls):
    raise ValueError(f"{name}: expected {hint}, got {type(value).__name__}")
  return value


def probability(name: str, value) -> float:
  """A number strictly inside (0, 1), e.g. a failure probability ``delta``."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = np.nan
  if not 0.0 < number < 1.0:  # NaN too
    raise ValueError(f"{name}: expected a probability in (0, 1), got {value!r}")
  return number


def in_range(name: str, value: float, low: float, high: float) -> float:
  """``value`` if ``low <= value <= high``, else a ValueError naming the range."""
  if not low <= value <= high:
    raise ValueError(f"{name}: expected a value in [{low:g}, {high:g}], got {value:g}")
  return value


def seed(name: str, value) -> int:
  """A seed for NumPy's generators: an integer >= 0."""
  return positive_int(name, value, minimum=0)


def positive_int(name: str, value, *, minimum: int = 1, maximum: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name}: expected an integer, got {value!r}")
  value = int(value)
  if value < minimum or (maximum is not None and value > maximum):
    upper = "" if maximum is None else f", at most {maximum}"
    raise ValueError(f"{name}: expected at least {minimum}{upper}, got {value}")
  return value


def _p_correct(name: str, values):
  """The P(correct) column of ``Calibrator.predict_proba``'s [N, 2] rows, deprecated."""
  shape = getattr(values, "shape", None)
  if shape is None or len(shape) != 2 or shape[-1] != 2:
    return values
  warnings.warn(
    f"{name}: got [N, 2] (P(wrong), P(correct)) rows, as Calibrator.predict_proba returns;"
    " taking P(correct), their second column. Pass predict_confidence(x) (or p[:, 1]): [N, 2]"
    " will be refused in a later version",
    DeprecationWarning,
    stacklevel=4,
  )
  return values[:, 1]


def score_and_event(
  name: str, values: ArrayLike, correct: ArrayLike, *, probability: bool = False, host: bool = False
) -> tuple[jax.Array | np.ndarray, jax.Array | np.ndarray]:
  """A finite [N] score (in [0, 1] with ``probability``) and its [N] events, N >= 1."""
  if probability:
    values = probability_array(name, _p_correct(name, values), 1)
  else:
    values = float_array(name, values, 1, host=host)
  correct = bool_array("correct", correct, host=host)
  same_length(**{name: values, "correct": correct})
  check_nonempty(name, values)
  return values, correct
