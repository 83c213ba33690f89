"""Out-of-distribution image sets by name, shaped like a model's inputs, offline, by seed:
``digits``, scikit-learn's bundled 8x8 handwritten digits resized (``seed`` picks which and
their order; never repeated), and ``uniform_noise``, i.i.d. uniform [0, 1) pixels.
"""

import gzip
import importlib.util
import io
import pathlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import validation
from top1_jax.engine import ood
from top1_jax.io import files
from top1_jax.io.splits import DataUnavailableError

INSTALL_SKLEARN = (
  "pip install scikit-learn (or the extra: pip install 'top1_jax[data]'; from a clone"
  " pip install '.[data]')"
)
NUM_DIGITS = 1797
"""The size of scikit-learn's digits set."""
DIGITS_CSV = "datasets/data/digits.csv.gz"  # in scikit-learn's package
DIGITS_CSV_MAX_CHARS = 1 << 21


class OodSet(NamedTuple):
  """One out-of-distribution set.

  Attributes:
    make: ``(shape, num, seed) -> [num, H, W, C]`` float32 in [0, 1], for checked arguments.
    max_num: the most images the set has (None: unbounded).
    description: one line for tables and help.
  """

  make: Callable[[tuple[int, int, int], int, int], jax.Array]
  max_num: int | None
  description: str


def digits_images() -> np.ndarray:
  """scikit-learn's 1,797 digits as ``[1797, 8, 8]`` float32 in [0, 1] (values / 16), read
  from the CSV in its wheel as ``load_digits`` reads it, without importing it (slow: SciPy).

  Raises:
    DataUnavailableError: scikit-learn is not installed (one line naming the install), or
      its digits file is unreadable.
  """
  spec = importlib.util.find_spec("sklearn")  # finds the package, runs none of it
  folders = (spec and spec.submodule_search_locations) or []
  if not folders:
    raise DataUnavailableError(
      f"the 'digits' OOD set needs scikit-learn: {INSTALL_SKLEARN}", detail="no scikit-learn"
    )
  path = pathlib.Path(folders[0], DIGITS_CSV)
  try:
    with files.open_regular(path) as raw, gzip.open(raw, "rt") as text:
      csv = io.StringIO(text.read(DIGITS_CSV_MAX_CHARS))  # 0-16 per pixel: about 0.3 MB
    rows = np.loadtxt(csv, delimiter=",", dtype=np.float32, ndmin=2)
    problem = None if rows.shape == (NUM_DIGITS, 65) else f"got shape {rows.shape}"
  except (OSError, EOFError, ValueError) as e:
    problem = str(e)
  if problem is not None:  # 1,797 rows of 64 pixels and the label
    raise DataUnavailableError(
      f"scikit-learn's digits in {path}: expected {NUM_DIGITS} rows of 65 numbers"
      f" ({problem[:200]}); reinstall scikit-learn",
      detail=problem,
    )
  return rows[:, :64].reshape(NUM_DIGITS, 8, 8) / np.float32(16.0)


def _digits(shape: tuple[int, int, int], num: int, seed: int) -> jax.Array:
  order = jax.random.permutation(jax.random.key(seed), NUM_DIGITS)[:num]
  return ood.resize(jnp.asarray(digits_images())[order], shape)


def _uniform_noise(shape: tuple[int, int, int], num: int, seed: int) -> jax.Array:
  return ood.uniform_noise(jax.random.key(seed), num, shape)


OOD_SETS: dict[str, OodSet] = {
  "digits": OodSet(
    _digits, NUM_DIGITS, "scikit-learn's 8x8 handwritten digits, bilinearly resized"
  ),
  "uniform_noise": OodSet(_uniform_noise, None, "i.i.d. uniform [0, 1) pixels"),
}


def names() -> tuple[str, ...]:
  """The OOD sets' names."""
  return tuple(OOD_SETS)


def load(name: str, shape, num: int, seed: int = 0) -> jax.Array:
  """``[num, H, W, C]`` float32 images in [0, 1] of the OOD set ``name``, on the default
  device, the same for the same seed; ``shape`` is the in-distribution images' ``(H, W, C)``.

  Raises:
    ValueError: an unknown name, a bad shape, ``num`` or ``seed``, or ``num`` over the set.
    DataUnavailableError: the set's package is missing (one line naming the install).
  """
  if name not in OOD_SETS:
    raise ValueError(f"name: expected one of {', '.join(names())}, got {name!r}")
  entry = OOD_SETS[name]
  shape = ood.check_shape(shape)
  num = validation.positive_int("num", num)
  if entry.max_num is not None and num > entry.max_num:
    raise ValueError(f"num: expected at most {entry.max_num} (the {name!r} set's size), got {num}")
  seed = validation.positive_int("seed", seed, minimum=0, maximum=2**32 - 1)
  return entry.make(shape, num, seed)
