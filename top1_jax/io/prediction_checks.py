"""The checks of a predictions file's fields, one function per field, each naming the
field in its error; and of its archive, before any array is read (each field stored
once, each ``.npy`` header declaring the bytes it holds, no zip bomb).
"""

import contextlib
import json
import math
import re
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from top1_jax.core import validation
from top1_jax.io import files

ARRAY_FIELDS = ("labels", "logits", "mean_probs", "human_probs")
"""The array fields of a predictions file, besides ``score_<name>`` and ``meta``."""
SCORE_PREFIX = "score_"
"""A stored score's field is ``score_<name>``."""
_SCORE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_]+$")
MAX_INFLATED_BYTES = 1 << 30
"""``load_predictions`` refuses a zip-compressed member declared to inflate to more than this
and ``MAX_INFLATION`` times its compressed size: a zip bomb (real logits shrink under 2x)."""
MAX_INFLATION = 20
"""The compression ratio above which a member over ``MAX_INFLATED_BYTES`` is refused."""
READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)
"""What reading a member of a corrupt archive may raise."""
_META_TYPES = {
  **dict.fromkeys(("dataset", "split", "model", "method", "version"), (str,)),
  "dropout_rate": (int, float),
  **dict.fromkeys(("ensemble_size", "seed"), (int,)),
  "shift": (str,),
  "severity": (int, float),
  "ood": (bool,),
}


def _numpy(name: str, value: Any, ndim: tuple[int, ...], kind: type, what: str) -> np.ndarray:
  """``value`` as an array of one of the ranks ``ndim`` and a dtype of ``kind`` (``what``):
  unlike ``validation.float_array``, an int array where floats belong (labels saved as
  logits) is refused, not promoted."""
  if value is None:
    raise ValueError(f"{name}: expected an array, got None")
  try:
    array = np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: cannot convert to an array ({e})") from None
  if array.ndim not in ndim:
    want = " or ".join(f"{d}-D" for d in ndim)
    raise ValueError(f"{name}: expected a {want} array, got shape {array.shape}")
  if not np.issubdtype(array.dtype, kind):
    raise ValueError(f"{name}: expected {what} dtype, got {array.dtype}")
  return array


def float_field(name: str, value: Any, ndim: tuple[int, ...]) -> np.ndarray:
  """A finite float32 array of one of the ranks ``ndim``; errors name the field ``name``."""
  array = _numpy(name, value, ndim, np.floating, "a float").astype(np.float32, copy=False)
  flat = array.reshape(-1)
  # In chunks: [S, N, K] logits can be gigabytes, and so would a full bool mask.
  chunk = 1 << 22
  for start in range(0, flat.size, chunk):
    finite = np.isfinite(flat[start : start + chunk])
    if not finite.all():
      first = start + int(np.argmin(finite))
      bad = sum(
        int(np.count_nonzero(~np.isfinite(flat[i : i + chunk])))
        for i in range(start, flat.size, chunk)
      )
      raise ValueError(
        f"{name}: {bad} non-finite value(s) (first at flat index {first}:"
        f" {flat[first]}); remove or fix NaN/Inf"
      )
  return array


def probs_field(name: str, value: Any, num_examples: int) -> np.ndarray:
  """[N, K] float32 probabilities, one row per label, rows summing to 1."""
  array = float_field(name, value, (2,))
  if array.shape[0] != num_examples:
    raise ValueError(
      f"{name}: expected {num_examples} rows (one per label), got shape {array.shape}"
    )
  validation.probability_array(name, array, 2, sums_to_one=True)
  return array


def meta_json(meta: Mapping) -> str:
  """``meta`` as the file stores it: sorted JSON, NumPy scalars as plain numbers."""

  def plain(value):
    if isinstance(value, np.generic):
      return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serializable")

  return json.dumps(meta, sort_keys=True, allow_nan=False, default=plain)


def checked_meta(meta: Any) -> dict:
  """``meta`` as a plain JSON object, its known keys of their types and ranges ({} for None)."""
  if meta is None:
    return {}
  if not isinstance(meta, Mapping):
    raise ValueError(f"meta: expected a dict (JSON object), got {type(meta).__name__}")
  meta = dict(meta)
  for key in meta:
    if not isinstance(key, str):
      raise ValueError(f"meta: keys must be strings, got {key!r}")
  try:
    meta = json.loads(meta_json(meta))
  except (TypeError, ValueError) as e:
    raise ValueError(f"meta: not JSON-serializable ({e})") from None
  for key, types in _META_TYPES.items():
    if key in meta:
      value = meta[key]
      if isinstance(value, bool) != (types == (bool,)) or not isinstance(value, types):
        want = " or ".join(t.__name__ for t in types)
        raise ValueError(f"meta: {key} must be {want}, got {value!r}")
  if "dropout_rate" in meta and not 0.0 <= meta["dropout_rate"] < 1.0:
    raise ValueError(f"meta: dropout_rate must be in [0, 1), got {meta['dropout_rate']}")
  if "ensemble_size" in meta and meta["ensemble_size"] < 1:
    raise ValueError(f"meta: ensemble_size must be >= 1, got {meta['ensemble_size']}")
  if "severity" in meta and not 0 <= meta["severity"] < float("inf"):
    raise ValueError(f"meta: severity must be a finite number >= 0, got {meta['severity']}")
  return meta


def labels_field(value: Any) -> np.ndarray:
  """[N] integer labels, N >= 1 (their range is checked once K is known)."""
  labels = _numpy("labels", value, (1,), np.integer, "an integer")
  validation.check_nonempty("labels", labels)
  return labels


def logits_field(value: Any, num_examples: int) -> np.ndarray:
  """[S, N, K] float32 logits; a [N, K] array is taken as S = 1."""
  logits = float_field("logits", value, (2, 3))
  if logits.ndim == 2:
    logits = logits[None]
  if logits.shape[1] != num_examples:
    raise ValueError(
      f"logits: expected N={num_examples} (from labels) on axis 1 of"
      f" [S, N, K], got shape {logits.shape}"
    )
  if logits.shape[0] < 1:
    raise ValueError(f"logits: expected at least one sample, got shape {logits.shape}")
  return logits


def scores_fields(scores: Any, num_examples: int) -> dict[str, np.ndarray]:
  """name -> [N] float32 scores; names fit a file field ``score_<name>``."""
  if not isinstance(scores, Mapping):
    raise ValueError(f"scores: expected a dict name -> [N] array, got {type(scores).__name__}")
  checked = {}
  for score_name, value in scores.items():
    field = f"{SCORE_PREFIX}{score_name}"
    if not isinstance(score_name, str) or not _SCORE_NAME_PATTERN.match(score_name):
      raise ValueError(
        f"{field}: score names must be letters, digits or underscores, got {score_name!r}"
      )
    score = float_field(field, value, (1,))
    if score.shape[0] != num_examples:
      raise ValueError(
        f"{field}: expected shape ({num_examples},) (one per label), got {score.shape}"
      )
    checked[score_name] = score
  return checked


def check_agreement(logits: np.ndarray, mean_probs: np.ndarray) -> None:
  """``mean_probs`` must be the mean softmax of ``logits`` (atol 1e-3, as the row sums):
  evaluation uses the logits and would silently ignore a ``mean_probs`` that disagrees."""
  z = logits.astype(np.float64)
  z = np.exp(z - z.max(axis=-1, keepdims=True))
  expected = (z / z.sum(axis=-1, keepdims=True)).mean(axis=0)
  worst = np.abs(expected - mean_probs).max(axis=-1)
  row = int(np.argmax(worst))
  if worst[row] > 1e-3:
    raise ValueError(
      f"mean_probs: row {row} differs from the mean softmax of logits by {worst[row]:.3g};"
      " store one of the two, or consistent values"
    )


def read_meta(value: np.ndarray) -> dict:
  """The ``meta`` field (a 0-d JSON string array) as a dict, parsed strictly."""
  if value.ndim != 0 or value.dtype.kind not in "US":
    raise ValueError(
      f"meta: expected a JSON string (0-d str array), got shape {value.shape} dtype {value.dtype}"
    )
  with files.named("meta"):
    meta = files.parse_json(value.item())
  if not isinstance(meta, dict):
    raise ValueError(f"meta: expected a JSON object, got {type(meta).__name__}")
  return meta


def check_field_name(key: str) -> None:
  """A field a predictions file may hold: ``ARRAY_FIELDS``, ``score_<name>`` or ``meta``."""
  if key != "meta" and key not in ARRAY_FIELDS and not key.startswith(SCORE_PREFIX):
    raise ValueError(
      f"{key}: unexpected field; allowed: labels, logits, mean_probs,"
      " score_<name>, human_probs, meta"
    )


def archive_members(path: Any, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
  """Each field's zip member by name (``.npy`` removed); a field stored twice is refused
  (zip readers let the last one win)."""
  members: dict[str, list[zipfile.ZipInfo]] = {}
  for info in archive.infolist():
    members.setdefault(info.filename.removesuffix(".npy"), []).append(info)
  for key, infos in members.items():
    if len(infos) > 1:
      names = ", ".join(info.filename for info in infos)
      raise ValueError(
        f"{path}: field {key!r} is stored {len(infos)} times ({names}); a predictions file"
        " holds each field once (write it again with save_predictions)"
      )
  return {key: infos[0] for key, infos in members.items()}


@contextlib.contextmanager
def reading(path: Any, key: str) -> Iterator[None]:
  """``READ_ERRORS`` of the block (a corrupt member) as one ValueError naming the field."""
  try:
    yield
  except READ_ERRORS as e:
    raise ValueError(f"{path}: field {key!r} cannot be read ({e})") from None


def npy_header(file) -> tuple[tuple[int, ...], bool, np.dtype]:
  """(shape, Fortran order, dtype) of the ``.npy`` header at ``file``'s position, which it
  leaves at the data."""
  version = np.lib.format.read_magic(file)
  if version == (1, 0):
    return np.lib.format.read_array_header_1_0(file)
  if version in ((2, 0), (3, 0)):  # 3.0 differs only in text encoding, ASCII for numbers
    return np.lib.format.read_array_header_2_0(file)
  raise ValueError(f"unsupported .npy format version {version}")


def member_header(
  path: Any, key: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], bool, np.dtype, int]:
  """A member's ``.npy`` (shape, Fortran order, dtype, header bytes), checked to declare
  exactly the data bytes the member holds before anything is allocated, and no objects."""
  with reading(path, key), archive.open(info) as file:
    shape, fortran_order, dtype = npy_header(file)
    header_bytes = file.tell()
  if dtype.hasobject:
    raise ValueError(
      f"{path}: field {key!r} cannot be read: it holds Python objects ({dtype}), and a"
      " predictions file holds numeric arrays and a JSON string"
    )
  declared = math.prod(shape) * dtype.itemsize
  actual = info.file_size - header_bytes
  if declared != actual:
    raise ValueError(
      f"{path}: field {key!r}: its .npy header declares shape {shape} {dtype}"
      f" ({declared} bytes), the member holds {actual} bytes of data; the file is"
      " truncated or corrupt: write it again"
    )
  return shape, fortran_order, dtype, header_bytes


def check_inflation(path: Any, key: str, info: zipfile.ZipInfo) -> None:
  """Refuses a zip bomb (``MAX_INFLATED_BYTES``)."""
  inflated, compressed = info.file_size, max(info.compress_size, 1)
  stored = info.compress_type == zipfile.ZIP_STORED
  if not stored and inflated > max(MAX_INFLATED_BYTES, MAX_INFLATION * compressed):
    raise ValueError(
      f"{path}: field {key!r}: {compressed} compressed bytes declare {inflated} inflated"
      f" (over {MAX_INFLATED_BYTES >> 20} MiB and {MAX_INFLATION}x: a zip bomb?); not read"
      " whole. top1-evaluate and io.stream.PredictionsReader read it a block at a time"
    )
