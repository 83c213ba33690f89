"""A predictions file read a chunk of examples at a time, so [S, N, K] is never held whole.

``np.savez`` stores each array as an uncompressed ``.npy`` member, so a chunk's bytes lie at
known offsets: only those are read, their CRC-32 checked. An object-store file is downloaded
first (else a chunk would be S range requests); a compressed member is inflated once, into
memory or (over ``IN_MEMORY_BYTES``) a temporary file in $TMPDIR, deleted at ``close``.
"""

import concurrent.futures
import contextlib
import hashlib
import pathlib
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator

import numpy as np
from etils import epath

from top1_jax.core import validation
from top1_jax.io import files, prediction_checks, zip_crc
from top1_jax.io import predictions as predictions_lib
from top1_jax.io.prediction_checks import SCORE_PREFIX

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip entry's local file header (30 bytes)

IN_MEMORY_BYTES = 1 << 26
"""A zip-compressed member of up to this many bytes (inflated) is read into memory; a larger
one is inflated into a temporary file: a compressed [S, N, K] array is not held whole either."""
_BLOCK = 1 << 24  # bytes per read of a sequential copy (download, inflation, hash)


class _Member:
  """One array of the archive: read in example ranges from ``file`` (the archive, or a
  temporary one holding the inflated member), or held in memory."""

  def __init__(self, shape, dtype, offset=None, array=None, file=None, crc=None):
    self.shape, self.dtype, self.offset, self.array = tuple(shape), np.dtype(dtype), offset, array
    self.file, self.crc = file, crc  # crc: a zip_crc.RunningCrc of a member read at ``offset``
    dims = self.shape if len(self.shape) == 3 else (1, *self.shape, 1)[:3]  # meta: 0-d
    self.outer, self.num, self.inner = dims[0], dims[1], self.shape[1 + (len(self.shape) == 3) :]
    self.row_bytes = int(np.prod(self.inner, dtype=np.int64)) * self.dtype.itemsize

  def rows(self, start: int, stop: int, queue: list | None = None) -> np.ndarray:
    """Examples [start, stop) (axis 1 of a 3-D array, else 0); with ``queue`` (a list), their
    bytes are queued there for ``zip_crc.update`` when read in order from example 0."""
    if self.array is not None:
      if self.array.ndim == 0:  # no example axis: the checks of Predictions refuse it
        return self.array
      return self.array[:, start:stop] if self.array.ndim == 3 else self.array[start:stop]
    crc = self.crc if queue is not None else None
    if crc is not None and start == 0:  # a new pass
      crc.restart(self.outer)
    running = None if crc is None else crc.running
    if running is not None and start != crc.next_row:
      crc.running = running = None  # out of order: cannot be verified in this pass
    out = np.empty((self.outer, stop - start, *self.inner), self.dtype)
    for index in range(self.outer):
      self.file.seek(self.offset + (index * self.num + start) * self.row_bytes)
      view = memoryview(out[index]).cast("B")
      if self.file.readinto(view) != view.nbytes:
        raise ValueError(f"truncated array data ({self.shape} {self.dtype})")
      if running is not None:
        queue.append((running, index, view))
    if running is not None:
      crc.next_row = stop
    return out if len(self.shape) == 3 else out[0]

  def crc_error(self, read: bool = False) -> str | None:
    """Why the bytes read (with ``read``: the whole member, read now) do not match the zip
    directory's CRC-32, or None (matched, or unknown: in memory, or not read in order)."""
    if self.crc is None:
      return None
    if read:
      step = max(1, _BLOCK // max(1, self.outer * self.row_bytes))
      for start in range(0, self.num, step):
        queued = []
        self.rows(start, min(self.num, start + step), queued)
        zip_crc.update(queued)
    got = self.crc.value(self.num * self.row_bytes) if self.crc.next_row == self.num else None
    if got is None or got == self.crc.expected:
      return None
    return f"Bad CRC-32 (the zip directory says {self.crc.expected:08x}, its bytes give {got:08x})"


def _temporary_copy(source, size: int, spill, doing: str, advice: str = "", digest=None):
  """The rest of ``source`` copied a block at a time (fed to ``digest`` on the way) into a
  temporary file, returned at its start, that ``spill`` (an ``ExitStack``) closes; refused
  up front when the folder has under ``size`` bytes free."""
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


def _stored_member(file, info: zipfile.ZipInfo, header) -> _Member | None:
  """An uncompressed member read at its offset in the archive, its CRC-32 taken as it is
  read (``zip_crc.RunningCrc``); None if unusual. ``header``: ``member_header``'s."""
  shape, fortran_order, dtype, header_bytes = header
  if info.compress_type != zipfile.ZIP_STORED or fortran_order or len(shape) not in (1, 2, 3):
    return None
  file.seek(info.header_offset)
  fields = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
  if fields[0] != b"PK\x03\x04":
    return None
  start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
  file.seek(start)
  crc = zip_crc.RunningCrc(info.CRC, zlib.crc32(file.read(header_bytes)))
  return _Member(shape, dtype, offset=start + header_bytes, file=file, crc=crc)


def _whole_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, header, spill) -> _Member:
  """A member read whole: into memory or, when compressed and over ``IN_MEMORY_BYTES``,
  inflated into a temporary file (``spill`` closes it) and read from there like a stored one."""
  with archive.open(info) as data:
    if info.compress_type == zipfile.ZIP_STORED or info.file_size <= IN_MEMORY_BYTES:
      value = np.lib.format.read_array(data, allow_pickle=False)
      data.read()  # to the member's end, where zipfile compares the CRC-32
      return _Member(value.shape, value.dtype, array=value)
    advice = ", or write the file with np.savez"
    file = _temporary_copy(data, info.file_size, spill, "inflating it", advice)
  shape, fortran_order, dtype, header_bytes = header
  if fortran_order or len(shape) not in (1, 2, 3):  # not readable by rows: into memory
    value = np.lib.format.read_array(file, allow_pickle=False)
    return _Member(value.shape, value.dtype, array=value)
  return _Member(shape, dtype, offset=header_bytes, file=file)


def file_sha1(path: epath.PathLike) -> str:
  """The SHA-1 of a file's bytes, read a block at a time (not the whole file at once)."""
  digest = hashlib.sha1()
  with files.open_regular(path) as file:
    while data := file.read(_BLOCK):
      digest.update(data)
  return digest.hexdigest()


class PredictionsReader(contextlib.AbstractContextManager):
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
    read_whole: members read whole, not at their offsets (zip-compressed or unusual ones).
  """

  def __init__(self, path: epath.PathLike):
    self.path = files.as_path(path)
    if not self.path.exists():
      raise FileNotFoundError(f"{self.path}: predictions file not found")
    self._opened = contextlib.ExitStack()  # the file and any temporary copies
    self._sha1 = None
    try:
      if isinstance(self.path, pathlib.Path):  # not a FIFO or a device: files.open_regular
        regular = self._opened.enter_context(files.open_regular(self.path))
        self._file = regular.raw  # unbuffered: reads go where the byte ranges are
      else:
        self._file = self._downloaded()
      self._members()
      self._check_fields()
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

  def _members(self) -> None:
    """Each member's location (or its array, read whole)."""
    try:
      archive = zipfile.ZipFile(self._file)
    except (zipfile.BadZipFile, OSError, ValueError):
      archive = None
    if archive is None:  # np.load fails too: load_predictions says what the file is instead
      predictions_lib.load_predictions(self.path)
      raise ValueError(f"{self.path}: not a zip archive")
    members, read_whole, self.meta = {}, [], {}
    with archive:
      for key, info in prediction_checks.archive_members(self.path, archive).items():
        header = prediction_checks.member_header(self.path, key, archive, info)
        with prediction_checks.reading(self.path, key):
          member = None if key == "meta" else _stored_member(self._file, info, header)
          if member is None:
            member = _whole_member(archive, info, header, self._opened)
            read_whole.append(key)
        if key == "meta":
          with files.named(self.path):
            self.meta = prediction_checks.read_meta(member.array)
          continue
        members[key] = member
    self._members_by_name = members
    self.read_whole = tuple(k for k in read_whole if k not in ("labels", "meta"))

  def _check_fields(self) -> None:
    """The file as a whole: known fields, labels, and N and K agreeing across fields."""
    members = self._members_by_name
    with files.named(self.path):
      for key in members:
        prediction_checks.check_field_name(key)
    if "labels" not in members:
      raise ValueError(f"{self.path}: labels: missing field (int [N] class labels)")
    labels, queued = members["labels"], []  # read whole now, so its CRC-32 is checked now
    with prediction_checks.reading(self.path, "labels"):
      labels = labels.rows(0, labels.num, queued)
    zip_crc.update(queued)
    self._check_crc(["labels"])
    with files.named(self.path):  # before any other field, as Predictions does
      prediction_checks.labels_field(labels)
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
    with files.named(self.path):
      self.labels = validation.labels_array("labels", labels, first.num_classes, host=True)
    self.num_examples, self.num_classes = num, first.num_classes
    self.num_samples, self.score_names = first.num_samples, tuple(first.scores)
    arrays = prediction_checks.ARRAY_FIELDS[1:]  # all but the labels
    self.fields = tuple(k for k in arrays if getattr(first, k) is not None)

  def _check_crc(self, keys, read: bool = False) -> None:
    """Refuses the file when a member of ``keys`` read whole and in order (or, with
    ``read``, read whole now) does not match the zip directory's CRC-32."""
    for key in keys:
      try:
        problem = self._members_by_name[key].crc_error(read)
      except prediction_checks.READ_ERRORS:  # unreadable: the error being raised says so
        problem = None
      if problem is not None:
        raise ValueError(
          f"{self.path}: field {key!r}: {problem}; the file is corrupt: copy or write it again"
        )

  def _chunk(
    self, start: int, stop: int, where: str | None = None, queue: list | None = None
  ) -> predictions_lib.Predictions:
    arrays = {"labels": self.labels[start:stop], "scores": {}}
    for key, member in self._members_by_name.items():
      if key != "labels":
        into = arrays["scores"] if key.startswith(SCORE_PREFIX) else arrays
        with prediction_checks.reading(self.path, key):
          into[key.removeprefix(SCORE_PREFIX)] = member.rows(start, stop, queue)
    if where is None:
      where = "" if (start, stop) == (0, self.num_examples) else f" (examples {start}-{stop - 1})"
    with files.named(self.path, where):
      return predictions_lib.Predictions(meta=self.meta, **arrays)

  def chunks(self, chunk_size: int) -> Iterator[tuple[int, predictions_lib.Predictions]]:
    """(start, ``Predictions`` of examples [start, start + chunk_size)), in order, each
    validated as a file would be; the last chunk may be shorter.

    Each member's CRC-32 is taken as it is read (in a thread, one chunk behind) and checked
    before the last chunk is yielded, so a consumer that writes after the loop writes
    nothing from a corrupt file. A chunk refused by its checks (a NaN, say) is refused as
    corrupt instead when its member's CRC-32 does not match.
    """
    tracked = {k: m for k, m in self._members_by_name.items() if m.crc and k != "labels"}
    with concurrent.futures.ThreadPoolExecutor(1) as crc_thread:
      pending = None
      for start in range(0, self.num_examples, chunk_size):
        stop, queued = min(start + chunk_size, self.num_examples), []
        try:
          chunk = self._chunk(start, stop, queue=queued)
        except ValueError:
          self._check_crc(tracked, read=True)
          raise
        if pending is not None:
          pending.result()
        pending = crc_thread.submit(zip_crc.update, queued)
        if stop == self.num_examples:
          pending.result()
          self._check_crc(tracked)
        yield start, chunk

  def close(self) -> None:
    self._opened.close()
    self._file = None

  def __exit__(self, *exc) -> None:
    self.close()
