"""Files written atomically (readers see the old file or the new one, never a part), on a
local disk or in a bucket (``gs://``, ``s3://``), and read only when regular (a FIFO or a
device would block or never end).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import glob
import io
import json
import logging
import os
import pathlib
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # etils is imported only for a URL: the core installs without it
  from etils import epath

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def named(prefix: Any, suffix: str = "") -> Iterator[None]:
  """A ValueError of the block raised again as ``<prefix>: <message><suffix>``, in one line
  (``prefix``: the file or argument it is about)."""
  try:
    yield
  except ValueError as e:
    raise ValueError(f"{prefix}: {e}{suffix}") from None


def is_local(path: epath.PathLike) -> bool:
  """Whether ``path`` names a file on this machine (no ``scheme://`` prefix); a ValueError
  when it is not a ``str`` or ``os.PathLike`` (e.g. None)."""
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


_NOT_REGULAR = (
  (stat.S_ISDIR, "a directory"),
  (stat.S_ISFIFO, "a FIFO (named pipe)"),
  (stat.S_ISCHR, "a character device"),
  (stat.S_ISBLK, "a block device"),
  (stat.S_ISSOCK, "a socket"),
)


def _refuse_unless_regular(path, mode: int) -> None:
  if not stat.S_ISREG(mode):
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
    raise ValueError(f"{path}: {kind}, not a regular file; give the path of a file")


def open_regular(path: epath.PathLike) -> BinaryIO:
  """``path`` open for binary reading, if it is a regular file (or a link to one); a URL
  is opened as it is (an object store holds objects only).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a regular file, in one line naming it and what it is.
  """
  where = as_path(path)
  if not isinstance(where, pathlib.Path):
    return where.open("rb")
  _refuse_unless_regular(where, os.stat(where).st_mode)
  # Non-blocking, in case a FIFO took the file's place since the stat: checked again below.
  fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
  try:
    _refuse_unless_regular(where, os.fstat(fd).st_mode)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
  except BaseException:
    os.close(fd)
    raise


REACH_SECONDS = 20.0
"""How long ``check_usable`` waits for a URL's first answer (gcsfs retries for ~50 s)."""

CLOUD_LOGGERS = ("gcsfs", "google", "urllib3", "aiohttp", "fsspec", "s3fs", "botocore")
"""Loggers silenced while ``check_usable`` probes: each retry logs a full traceback."""


def in_daemon_thread(function: Callable[[], Any], timeout: float, name: str) -> tuple:
  """``function()`` in a daemon thread ``name``, so that a library that keeps retrying or a
  resolver that hangs holds up neither the caller beyond ``timeout`` seconds nor the exit:
  (its result, None), (None, its error), or (None, TimeoutError) after ``timeout``."""
  outcome: list[tuple[Any, BaseException | None]] = []

  def run():
    try:
      outcome.append((function(), None))
    except BaseException as e:  # noqa: BLE001 -- handed to the caller
      outcome.append((None, e))

  thread = threading.Thread(target=run, name=name, daemon=True)
  thread.start()
  thread.join(timeout)
  return outcome[0] if outcome else (None, TimeoutError(f"no answer within {timeout:g} s"))


def check_usable(path: epath.PathLike, what: str, timeout: float = REACH_SECONDS) -> None:
  """Refuses, before anything is written, a URL whose file system is not installed or
  that does not answer within ``timeout`` seconds (no network, no credentials).

  Raises:
    ValueError: naming ``what`` (the flag), the URL and what is wrong.
  """
  if is_local(path):
    return
  levels = {logger: logger.level for logger in map(logging.getLogger, CLOUD_LOGGERS)}
  for logger in levels:
    logger.setLevel(logging.CRITICAL)
  _, error = in_daemon_thread(lambda: as_path(path).exists(), timeout, "top1_jax: check_usable")
  scheme = os.fspath(path).split("://", 1)[0]
  if isinstance(error, ImportError):
    raise ValueError(
      f"{what}: {path}: {scheme}:// paths need a package that is not installed ({error}); "
      "install it, or use a local directory. Nothing was written"
    ) from None
  if error is not None:  # the libraries stay quiet: their threads may still be retrying
    text = " ".join(str(error).split())[:200] or type(error).__name__
    raise ValueError(
      f"{what}: {path}: cannot be reached ({text}); check the network, the bucket's name "
      "and your credentials, or use a local directory. Nothing was written"
    ) from None
  for logger, level in levels.items():
    logger.setLevel(level)


def split_paths(text: str) -> tuple[str, ...]:
  """Paths or globs given as one string: the whole string when it names an existing file
  or matches a glob (so any real path works: spaces, commas, parentheses), else its parts
  between commas, ``\\,`` being a comma inside a path."""
  text = text.strip()
  if not text:
    return ()
  local = is_local(text)
  if local and (os.path.exists(os.path.expanduser(text)) or glob.glob(os.path.expanduser(text))):
    return (text,)
  parts = re.split(r"(?<!\\),", text)
  return tuple(part.replace("\\,", ",").strip() for part in parts if part.strip())


def expand(patterns: Sequence[str]) -> list[pathlib.Path | epath.Path]:
  """Paths and globs (local ones expanded, ``~`` too), each as a path, in the given order;
  FileNotFoundError for a pattern that names no file."""
  found = []
  for pattern in patterns:
    matches = sorted(glob.glob(os.path.expanduser(pattern))) if is_local(pattern) else []
    if not matches and not as_path(pattern).is_file():
      raise FileNotFoundError(f"no such file: {pattern}")
    found += [as_path(match) for match in matches or [pattern]]
  return found


def not_text(path: str) -> str | None:
  """Why the local ``path`` is not a text file, in words (a null byte in its first 64 KiB
  means binary), or None if it is."""
  if not os.path.isfile(path):
    return "a directory" if os.path.isdir(path) else "no such file"
  with open(path, "rb") as file:
    return "binary data, not text" if b"\0" in file.read(1 << 16) else None


def disk_full(error: BaseException, root: str) -> str | None:
  """``"<root>: no space left on device (writing <file>)"`` when ``error`` is ENOSPC or
  EDQUOT on a file under ``root`` (not another disk's, such as a cache's), else None."""
  if not isinstance(error, OSError) or error.errno not in (errno.ENOSPC, errno.EDQUOT):
    return None
  root, name = os.path.abspath(os.path.expanduser(root)), error.filename
  if name is not None and os.path.commonpath([root, os.path.abspath(name)]) != root:
    return None
  return f"{root}: {os.strerror(error.errno).lower()}{f' (writing {name})' if name else ''}"


def atomic_write(
  path: epath.PathLike, write: Callable[[BinaryIO], Any]
) -> pathlib.Path | epath.Path:
  """Calls ``write(file)`` once on a binary file that replaces ``path`` only when it
  returns; on any failure (KeyboardInterrupt too) ``path`` is left as it was. A local file
  is made world-readable and its directory created if needed. Returns ``as_path(path)``.

  Raises:
    ValueError: ``path`` is a directory (checked before anything is written).
  """
  path = as_path(path)
  if not isinstance(path, pathlib.Path):
    # Staged in a disk file (predictions can be gigabytes): an object store publishes what
    # was written when the file closes, half a file if `write` raises.
    with tempfile.TemporaryFile() as staging:
      write(staging)
      staging.seek(0)
      # No parent.mkdir(): s3fs would take a folder at the bucket level as a new bucket.
      with path.open("wb") as file:
        shutil.copyfileobj(staging, file)
    return path
  if path.is_dir():  # else the rename would fail naming the temporary file
    raise ValueError(f"{path}: is a directory; give the path of a file to write there")
  path.parent.mkdir(parents=True, exist_ok=True)
  try:
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  except OSError as e:  # its message would name the temporary file, which the user never chose
    raise OSError(e.errno, e.strerror, os.fspath(path)) from None
  try:
    with os.fdopen(fd, "wb") as file:
      write(file)
      file.flush()
      os.fsync(file.fileno())
    os.chmod(temp_name, 0o644)  # mkstemp makes 0600; outputs are meant to be shared
    os.replace(temp_name, path)
  except BaseException as e:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(temp_name)
    if isinstance(e, OSError) and e.errno is not None and e.filename is None:
      # A full disk fails in write or fsync, whose errors name no file: name it.
      raise OSError(e.errno, e.strerror, os.fspath(path)) from e
    raise
  return path


def write_bytes(path: epath.PathLike, payload: bytes) -> pathlib.Path | epath.Path:
  """Writes ``payload`` to ``path`` atomically; returns the path."""
  return atomic_write(path, lambda file: file.write(payload))


def write_json(path: epath.PathLike, value: Any) -> pathlib.Path | epath.Path:
  """Writes ``value`` as indented JSON with sorted keys, atomically; returns the path.
  A NaN or infinity is a ValueError (undefined values are None)."""
  text = json.dumps(value, indent=2, sort_keys=True, allow_nan=False)
  return write_bytes(path, (text + "\n").encode())


def read_text(path: epath.PathLike) -> str:
  """The UTF-8 text of a local regular file or a URL."""
  with open_regular(path) as file:
    return file.read().decode()


def read_json(path: epath.PathLike) -> Any | None:
  """The strict JSON at ``path``, or None when it is missing or unusable (with a warning):
  a damaged marker of finished work means the work is done again, not a traceback."""
  try:
    with open_regular(path) as file:
      data = file.read()
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    _log.warning("%s is unreadable (%s); treated as missing", path, e)
    return None
  try:
    return parse_json(data)
  except ValueError as e:
    _log.warning("%s: not valid JSON (%s); treated as missing", path, e)
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


def parse_json(data: bytes | str) -> Any:
  """Strict JSON: UTF-8, no key given twice in one object (plain ``json`` lets the last
  win), no ``NaN`` or ``Infinity``, nested no deeper than Python's recursion limit.

  Raises:
    ValueError: what is wrong, in one line without the file's name (callers add it).
  """
  if isinstance(data, bytes):
    try:
      data = data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"not UTF-8 text: {e.reason} at byte {e.start}; save it as UTF-8") from None
  try:
    return json.loads(data, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
  except RecursionError:
    raise ValueError("JSON nested too deeply") from None
  except _Refused as e:
    raise _Refused(str(e)) from None
  except ValueError as e:  # invalid JSON, or an integer of thousands of digits
    raise ValueError(f"invalid JSON: {' '.join(str(e).split())}") from None


def read_strict_json(path: epath.PathLike, max_bytes: int, what: str) -> Any:
  """The strict JSON of a regular file that must be ``what`` (e.g. "a top1_jax calibrator"),
  reading at most ``max_bytes + 1`` bytes.

  Raises:
    ValueError: not a regular file, over ``max_bytes``, or not strict JSON, naming the file.
    OSError: the file cannot be read.
  """
  with open_regular(path) as file:
    size = os.fstat(file.fileno()).st_size if is_local(path) else None
    if size is None or size <= max_bytes:
      data = file.read(max_bytes + 1)
      size = len(data)
  if size > max_bytes:
    raise ValueError(f"{path}: not {what} ({size} bytes, over the {max_bytes} it may have)")
  try:
    return parse_json(data)
  except _Refused as e:
    raise ValueError(f"{path}: {e}") from None
  except ValueError as e:
    raise ValueError(f"{path}: not {what} ({e})") from None


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""A text cell starting with one of these is a formula to a spreadsheet (OWASP's "CSV
injection"): ``write_csv`` writes it after a single quote, which spreadsheets hide."""


def _cell(value: Any) -> Any:
  return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_STARTS) else value


def write_csv(path: epath.PathLike, rows: Sequence[dict[str, Any]]) -> pathlib.Path | epath.Path:
  """Writes dict rows as CSV, atomically, text cells escaped (``FORMULA_STARTS``); the columns
  are every key in order of first appearance, a missing key an empty cell."""
  columns: list[str] = []
  for row in rows:
    columns += [k for k in row if k not in columns]
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow([_cell(column) for column in columns])
  writer.writerows([_cell(row.get(column, "")) for column in columns] for row in rows)
  return write_bytes(path, buffer.getvalue().encode())
