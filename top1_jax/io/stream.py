"""A predictions file read a chunk of examples at a time, so [S, N, K] is never held whole.

``np.savez`` stores each array as an uncompressed ``.npy`` member of a zip
archive, so the bytes of examples [a, b) of each sample lie at a known offset:
``PredictionsReader`` finds it (the zip entry's local header, then the ``.npy``
header) and reads only those bytes. A file in an object store (``gs://``, ``s3://``,
through ``epath``) is first downloaded, in one sequential read, into a temporary
file (its SHA-1 taken on the way): a chunk of examples is S separate byte ranges,
one request each, thousands for an ImageNet MC-dropout file. A zip-compressed
member (``np.savez_compressed``) has no offsets to read at: it is inflated once,
as a stream, into a temporary file (larger than ``IN_MEMORY_BYTES``) or into
memory, and read from there. A stored member in an unusual layout (Fortran-
ordered) is read whole. Both kinds are named in ``PredictionsReader.read_whole``.
Temporary files go to ``tempfile.gettempdir()`` ($TMPDIR) and are deleted when
the reader closes.

Every chunk is a validated ``predictions.Predictions`` of its examples, so a
file's values get the same checks (finite, label range, rows summing to 1) as a
full load, one chunk at a time; the checks of the file as a whole (fields,
shapes, agreement of N and K, meta) run when the reader opens.
"""

import contextlib
import hashlib
import pathlib
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
from etils import epath

from top1_jax.core import validation
from top1_jax.io import files, prediction_checks
from top1_jax.io import predictions as predictions_lib
from top1_jax.io.prediction_checks import SCORE_PREFIX

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip entry's local file header (30 bytes)
_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile)

IN_MEMORY_BYTES = 1 << 26
"""A zip-compressed member of up to this many bytes (inflated) is read into memory; a
larger one is inflated into a temporary file, so a compressed [S, N, K] array is
never held whole in memory either."""
_BLOCK = 1 << 24  # bytes per read of a sequential copy (download, inflation, hash)


class _Member:
  """One array of the archive: read in example ranges from a file (the archive, or
  ``file``: a temporary one holding the inflated member), or held in memory."""

  def __init__(self, shape, dtype, offset=None, array: np.ndarray | None = None, file=None):
    self.shape, self.dtype, self.offset, self.array = tuple(shape), np.dtype(dtype), offset, array
    self.file = file

  def rows(self, file, start: int, stop: int) -> np.ndarray:
    """Examples [start, stop): the example axis is 1 of a 3-D array, else 0."""
    if self.array is not None:
      return self.array[:, start:stop] if self.array.ndim == 3 else self.array[start:stop]
    file = file if self.file is None else self.file
    outer, num, *inner = self.shape if len(self.shape) == 3 else (1, *self.shape)
    row_bytes = int(np.prod(inner, dtype=np.int64)) * self.dtype.itemsize
    out = np.empty((outer, stop - start, *inner), self.dtype)
    for index in range(outer):
      file.seek(self.offset + (index * num + start) * row_bytes)
      view = memoryview(out[index]).cast("B")
      if file.readinto(view) != view.nbytes:
        raise ValueError(f"truncated array data ({self.shape} {self.dtype})")
    return out if len(self.shape) == 3 else out[0]


def _temporary_copy(source, size: int, spill, doing: str, advice: str = "", digest=None):
  """What is left of the file object ``source``, copied a block at a time into a
  temporary file that ``spill`` (an ``ExitStack``) closes, its bytes fed to
  ``digest`` on the way; refused up front when the folder has less than ``size``
  bytes free. Returns the temporary file, at its start."""
  folder = tempfile.gettempdir()
  advice = f"free space in {folder} (or set TMPDIR){advice}"
  if shutil.disk_usage(folder).free < size:
    raise OSError(f"{doing} needs {size / 1e9:.2f} GB of disk; {advice}")
  file = spill.enter_context(tempfile.TemporaryFile())
  while block := source.read(_BLOCK):
    if digest is not None:
      digest.update(block)
    try:
      file.write(block)
    except OSError as e:
      raise OSError(f"{doing} ({size / 1e9:.2f} GB) failed ({e}); {advice}") from None
  file.seek(0)
  return file


def _stored_member(file, info: zipfile.ZipInfo) -> _Member | None:
  """The ``.npy`` header of an uncompressed member and its data offset; None if unusual."""
  if info.compress_type != zipfile.ZIP_STORED:
    return None
  file.seek(info.header_offset)
  fields = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
  if fields[0] != b"PK\x03\x04":
    return None
  file.seek(info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
  return _npy_member(file)


def _whole_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, spill) -> _Member:
  """A member read whole: into memory, or, when zip-compressed and larger than
  ``IN_MEMORY_BYTES``, inflated a block at a time into a temporary file that
  ``spill`` (an ``ExitStack``) closes, and read from there like a stored one."""
  with archive.open(info) as data:
    if info.compress_type == zipfile.ZIP_STORED or info.file_size <= IN_MEMORY_BYTES:
      value = np.lib.format.read_array(data, allow_pickle=False)
      return _Member(value.shape, value.dtype, array=value)
    advice = ", or write the file with np.savez"
    file = _temporary_copy(data, info.file_size, spill, "inflating it", advice)
  member = _npy_member(file)
  if member is None:  # e.g. Fortran order: not readable by rows, so into memory after all
    file.seek(0)
    value = np.lib.format.read_array(file, allow_pickle=False)
    return _Member(value.shape, value.dtype, array=value)
  member.file = file
  return member


def _npy_member(file) -> _Member | None:
  """The ``.npy`` array whose header starts at ``file``'s position; None if unusual."""
  version = np.lib.format.read_magic(file)
  if version == (1, 0):
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(file)
  elif version == (2, 0):
    shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(file)
  else:
    return None
  if fortran_order or dtype.hasobject or len(shape) not in (1, 2, 3):
    return None
  return _Member(shape, dtype, offset=file.tell())


def file_sha1(path: epath.PathLike) -> str:
  """The SHA-1 of a file's bytes, read a block at a time (not the whole file at once)."""
  digest = hashlib.sha1()
  with files.as_path(path).open("rb") as file:
    while data := file.read(_BLOCK):
      digest.update(data)
  return digest.hexdigest()


class PredictionsReader:
  """An opened predictions file, read a chunk of examples at a time.

  Use as a context manager::

    with PredictionsReader(path) as reader:
      for start, chunk in reader.chunks(4096):  # chunk: Predictions of [start, start + n)
        ...

  Attributes:
    path: the file.
    labels: [N] int32, checked to lie in [0, K).
    meta: the file's meta dict.
    num_examples, num_classes: N and K.
    num_samples: S of the logits, or None when only ``mean_probs`` is kept.
    fields: which of ``logits``, ``mean_probs``, ``human_probs`` the file holds.
    score_names: the stored scores (``score_<name>`` fields).
    read_whole: members read whole rather than at their offsets in the file (zip-
      compressed ones, inflated into memory or a temporary file; unusual ones).
  """

  def __init__(self, path: epath.PathLike):
    self.path = files.as_path(path)
    if not self.path.is_file():
      raise FileNotFoundError(f"{self.path}: predictions file not found")
    self._opened = contextlib.ExitStack()  # the file and any temporary copies
    self._sha1 = None
    try:
      if isinstance(self.path, pathlib.Path):
        self._file = self._opened.enter_context(open(self.path, "rb", buffering=0))
      else:
        self._file = self._downloaded()
      self._open()
    except BaseException:
      self.close()
      raise

  def _downloaded(self):
    """A temporary copy of the object-store file, read in order (module docstring)."""
    digest = hashlib.sha1()
    try:
      with self.path.open("rb") as remote:  # epath's opens are context managers
        size = self.path.stat().length
        copy = _temporary_copy(remote, size, self._opened, "downloading it", digest=digest)
    except OSError as e:
      raise OSError(f"{self.path}: {e}") from None
    self._sha1 = digest.hexdigest()
    return copy

  def file_sha1(self) -> str:
    """``file_sha1`` of the file: taken as it was downloaded, or read now (a block at a
    time, from a file handle of its own: safe beside ``chunks`` in another thread)."""
    if self._sha1 is None:
      self._sha1 = file_sha1(self.path)
    return self._sha1

  def _open(self) -> None:
    members = self._members()
    if members is None:
      # Not a zip archive: a full load, checked as a whole (its error names the problem).
      predictions = predictions_lib.load_predictions(self.path)
      members = {
        "labels": predictions.labels,
        "logits": predictions.logits,
        "mean_probs": predictions.mean_probs,
        "human_probs": predictions.human_probs,
        **{f"{SCORE_PREFIX}{k}": v for k, v in predictions.scores.items()},
      }
      members = {k: _Member(v.shape, v.dtype, array=v) for k, v in members.items() if v is not None}
      self.meta, self._members_by_name = dict(predictions.meta), members
      self.read_whole = tuple(k for k in members if k != "labels")
    self._check_fields()

  def _members(self) -> dict[str, _Member] | None:
    """Each member's location (or its array, read whole); None when not a zip archive."""
    try:
      archive = zipfile.ZipFile(self._file)
    except (zipfile.BadZipFile, OSError, ValueError):
      return None  # load_predictions says what the file is instead
    members, read_whole, self.meta = {}, [], {}
    with archive:
      for info in archive.infolist():
        key = info.filename.removesuffix(".npy")
        try:
          member = None if key == "meta" else _stored_member(self._file, info)
          if member is None:
            member = _whole_member(archive, info, self._opened)
            read_whole.append(key)
        except _READ_ERRORS as e:
          raise ValueError(f"{self.path}: field {key!r} cannot be read ({e})") from None
        if key == "meta":
          try:
            self.meta = prediction_checks.read_meta(member.array)
          except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None
          continue
        members[key] = member
    self._members_by_name = members
    self.read_whole = tuple(k for k in read_whole if k not in ("labels", "meta"))
    return members

  def _check_fields(self) -> None:
    """The file as a whole: known fields, labels, and N and K agreeing across fields."""
    members = self._members_by_name
    for key in members:
      try:
        prediction_checks.check_field_name(key)
      except ValueError as e:
        raise ValueError(f"{self.path}: {e}") from None
    if "labels" not in members:
      raise ValueError(f"{self.path}: labels: missing field (int [N] class labels)")
    labels = members["labels"]
    labels = (
      labels.array if labels.array is not None else labels.rows(self._file, 0, labels.shape[0])
    )
    if labels.ndim != 1 or labels.shape[0] == 0 or labels.dtype.kind not in "iu":
      # Predictions checks the labels before any other field: its message names the problem.
      self._validate(None, labels=labels, mean_probs=np.full((1, 2), 0.5, np.float32))
    num = labels.shape[0]
    for key, member in members.items():
      axis = 1 if len(member.shape) == 3 else 0
      if len(member.shape) and member.shape[axis] != num:
        raise ValueError(
          f"{self.path}: {key}: expected N={num} (from labels) on axis {axis}, got shape"
          f" {member.shape}"
        )
    # The first example checks each field's dtype, rank and K, and the meta.
    self.labels = labels
    first = self._chunk(0, 1, where="")
    try:
      self.labels = validation.labels_array("labels", labels, first.num_classes, host=True)
    except ValueError as e:
      raise ValueError(f"{self.path}: {e}") from None
    self.num_examples, self.num_classes = num, first.num_classes
    self.num_samples, self.score_names = first.num_samples, tuple(first.scores)
    arrays = prediction_checks.ARRAY_FIELDS[1:]  # all but the labels
    self.fields = tuple(k for k in arrays if getattr(first, k) is not None)

  def _validate(self, where: str | None, **fields: Any) -> predictions_lib.Predictions:
    try:
      return predictions_lib.Predictions(meta=self.meta, **fields)
    except ValueError as e:
      raise ValueError(f"{self.path}: {e}{where or ''}") from None

  def _chunk(self, start: int, stop: int, where: str | None = None) -> predictions_lib.Predictions:
    arrays = {"labels": self.labels[start:stop], "scores": {}}
    for key, member in self._members_by_name.items():
      if key.startswith(SCORE_PREFIX):
        arrays["scores"][key.removeprefix(SCORE_PREFIX)] = member.rows(self._file, start, stop)
      elif key != "labels":
        arrays[key] = member.rows(self._file, start, stop)
    if where is None:
      where = "" if (start, stop) == (0, self.num_examples) else f" (examples {start}-{stop - 1})"
    return self._validate(where, **arrays)

  def chunks(self, chunk_size: int) -> Iterator[tuple[int, predictions_lib.Predictions]]:
    """(start, ``Predictions`` of examples [start, start + chunk_size)), in order; the
    last chunk may be shorter. Each chunk is validated as a file would be."""
    for start in range(0, self.num_examples, chunk_size):
      yield start, self._chunk(start, min(start + chunk_size, self.num_examples))

  def close(self) -> None:
    self._opened.close()
    self._file = None

  def __enter__(self) -> "PredictionsReader":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


__all__ = ["PredictionsReader", "file_sha1"]
