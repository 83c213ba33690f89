"""Writing files atomically, on a local disk or in a bucket (``gs://``, ``s3://``).

Paths go through ``etils.epath``, so any of these functions takes a local path
(``str`` or ``os.PathLike``) or a URL whose file system is installed (``gs://``
needs ``gcsfs`` or TensorFlow, ``s3://`` needs ``s3fs``).

Readers see the old file or the new one, never a part: on a local disk the
file is written under a temp name in the same folder and renamed; in an object
store a single object write is already atomic, so the object is written
directly (from a local staging file, so a writer that fails uploads nothing).
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # etils is imported only for a URL: the core installs without it
  from etils import epath


def is_local(path: epath.PathLike) -> bool:
  """Whether ``path`` names a file on this machine (no ``scheme://`` prefix).

  Raises:
    ValueError: ``path`` is not a path (``str`` or ``os.PathLike``), e.g. None.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise ValueError(
      f"path: expected a file path (str or os.PathLike), got {type(path).__name__} {path!r:.80}"
    )
  return "://" not in os.fspath(path)


def as_path(path: epath.PathLike) -> pathlib.Path | epath.Path:
  """``path`` as a ``pathlib.Path`` when local, else as an ``epath.Path``."""
  if is_local(path):
    return pathlib.Path(path)
  try:
    from etils import epath
  except ImportError:
    raise ValueError(f"{path}: a URL needs etils (pip install etils[epath])") from None
  return epath.Path(path)


def check_usable(path: epath.PathLike, what: str) -> None:
  """Refuses, in one line and before anything is written, a URL whose file system is missing.

  epath reaches ``gs://`` through gcsfs (or TensorFlow), ``s3://`` through s3fs;
  without them the first write would fail half-way into a run.
  """
  if is_local(path):
    return
  try:
    as_path(path).exists()
  except ImportError as e:
    scheme = os.fspath(path).split("://", 1)[0]
    raise ValueError(
      f"{what}: {path}: {scheme}:// paths need a package that is not installed ({e}); "
      "install it, or use a local directory. Nothing was written"
    ) from None


def _write_local(path: pathlib.Path, write: Callable[[BinaryIO], Any]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as file:
      write(file)
      file.flush()
      os.fsync(file.fileno())
    os.chmod(temp_name, 0o644)  # mkstemp makes 0600; outputs are meant to be shared
    os.replace(temp_name, path)
  except BaseException as e:
    try:
      os.unlink(temp_name)
    except FileNotFoundError:
      pass
    if isinstance(e, OSError) and e.errno is not None and e.filename is None:
      # A full disk fails in write or fsync, whose errors name no file: name it.
      raise OSError(e.errno, e.strerror, os.fspath(path)) from e
    raise


def _write_remote(path: epath.Path, write: Callable[[BinaryIO], Any]) -> None:
  # Staged locally first: an object store commits whatever was written when the
  # file is closed, so writing straight into it would publish half a file when
  # `write` raises. A disk file, not memory, since predictions can be gigabytes.
  with tempfile.TemporaryFile() as staging:
    write(staging)
    staging.seek(0)
    # No parent.mkdir(): an object store has no folders, and s3fs would take
    # one at the bucket level as a request to create the bucket.
    with path.open("wb") as file:
      shutil.copyfileobj(staging, file)


def atomic_write(
  path: epath.PathLike, write: Callable[[BinaryIO], Any]
) -> pathlib.Path | epath.Path:
  """Writes a file so that readers see the old file or the new one, never a part.

  On a local disk, calls ``write(file)`` on a temp file in ``path``'s directory
  (created if needed), syncs it, makes it world-readable and renames it over
  ``path``. On any failure, including KeyboardInterrupt, the temp file is
  removed and ``path`` is left as it was. For a URL (``gs://...``), ``write``
  fills a local staging file that is then written as one object; when
  ``write`` raises, nothing is written.

  Args:
    path: destination file, local or a URL.
    write: called once with a binary file object open for writing.

  Returns:
    ``path`` as a ``pathlib.Path`` (local) or an ``epath.Path`` (URL).

  Raises:
    ValueError: ``path`` is a directory (checked before anything is written).
  """
  path = as_path(path)
  if isinstance(path, pathlib.Path):
    if path.is_dir():  # else the rename would fail naming the temporary file
      raise ValueError(f"{path}: is a directory; give the path of a file to write there")
    _write_local(path, write)
  else:
    _write_remote(path, write)
  return path


def write_bytes(path: epath.PathLike, payload: bytes) -> pathlib.Path | epath.Path:
  """Writes ``payload`` to ``path`` atomically (``atomic_write``); returns the path."""
  return atomic_write(path, lambda file: file.write(payload))


def write_json(path: epath.PathLike, value: Any) -> pathlib.Path | epath.Path:
  """Writes ``value`` as strict, indented JSON with sorted keys, atomically; returns the path.

  Raises:
    ValueError: ``value`` holds a NaN or an infinity (strict JSON has neither).
  """
  # Strict JSON: a NaN or Inf is a bug upstream (undefined values are None), not a token.
  text = json.dumps(value, indent=2, sort_keys=True, allow_nan=False)
  return write_bytes(path, (text + "\n").encode())


def read_text(path: epath.PathLike) -> str:
  """The text of a local file or a URL."""
  return as_path(path).read_text()


def read_json(path: epath.PathLike) -> Any | None:
  """The JSON at ``path``, or None when it is missing or unreadable (then redo the work)."""
  try:
    return json.loads(as_path(path).read_text())
  except (OSError, ValueError):
    return None


class _Refused(ValueError):
  """A JSON text that parses, but not strictly (a NaN, a key given twice)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
  seen = set()
  for key, _ in pairs:
    if key in seen:
      raise _Refused(f"field {key!r} is given twice in one object; keep one")
    seen.add(key)
  return dict(pairs)


def _no_constant(token: str):
  raise _Refused(f"{token} is not strict JSON (write null or a number)")


def read_strict_json(path: epath.PathLike, max_bytes: int, what: str) -> Any:
  """The strict JSON of a file that must be ``what`` (e.g. "a top1_jax calibrator").

  Refused in one line naming the file: more than ``max_bytes`` (checked before reading a
  local file; at most ``max_bytes + 1`` bytes are read of any other), not UTF-8, invalid
  JSON, nested deeper than Python's recursion limit, a key given twice in one object
  (which plain ``json`` lets the last one win), ``NaN`` or ``Infinity``.

  Raises:
    ValueError: any of these; OSError: the file cannot be read (its message names it).
  """
  where = as_path(path)
  size = where.stat().st_size if is_local(path) else None
  if size is None or size <= max_bytes:
    with where.open("rb") as file:
      data = file.read(max_bytes + 1)
    size = len(data)
  if size > max_bytes:
    raise ValueError(f"{path}: not {what} ({size} bytes, over the {max_bytes} it may have)")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(
      f"{path}: not {what} (not UTF-8 text: {e.reason} at byte {e.start}); save it as UTF-8"
    ) from None
  try:
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
  except RecursionError:
    raise ValueError(f"{path}: not {what} (JSON nested too deeply)") from None
  except _Refused as e:
    raise ValueError(f"{path}: {e}") from None
  except ValueError as e:  # invalid JSON, or an integer of thousands of digits
    raise ValueError(f"{path}: not {what} (invalid JSON: {e})") from None


def write_csv(path: epath.PathLike, rows: Sequence[dict[str, Any]]) -> pathlib.Path | epath.Path:
  """Writes dict rows as CSV, atomically; returns the path.

  Args:
    path: destination file.
    rows: one dict per row; the columns are every key, in order of first
      appearance (a row without a key leaves that cell empty).
  """
  columns: list[str] = []
  for row in rows:
    columns += [k for k in row if k not in columns]
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=columns)
  writer.writeheader()
  writer.writerows(rows)
  return write_bytes(path, buffer.getvalue().encode())


__all__ = [
  "as_path",
  "atomic_write",
  "is_local",
  "read_json",
  "read_strict_json",
  "write_bytes",
  "write_csv",
  "write_json",
]
