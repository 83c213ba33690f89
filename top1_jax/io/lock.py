"""One run per work dir: a lock file naming its owner, and stale locks of killed runs. A URL
work dir has no atomic create: there the lock is written after checking that none is held,
which guards against a second run on a busy work dir, not against a race."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import sys
import time
from collections.abc import Iterator

from top1_jax.io import files

LOCK_NAME = ".lock"
_MAX_LOCK_BYTES = 1 << 16  # a lock names a host, a pid and a command line


class WorkdirBusyError(RuntimeError):
  """Another live run holds the work dir."""


def _start_time(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
  try:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  return stat.rsplit(")", 1)[1].split()[19]


def _alive(owner: dict) -> bool:
  """Whether the lock's owner still runs (on another host we cannot tell: assume so)."""
  if owner.get("host") != socket.gethostname():
    return True
  pid = owner.get("pid")
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  started = _start_time(pid)
  return started is None or owner.get("start_time") in (None, started)


def _usable(workdir) -> None:
  """The work dir exists (created if missing) and is a directory: else one line naming it."""
  if isinstance(workdir, pathlib.Path):  # it, or the folder it would be made in
    existing = next(p for p in (workdir, *workdir.parents) if p.exists())
    if not existing.is_dir():
      raise ValueError(f"--workdir: {existing} is a file, not a directory; give a directory")
  try:
    workdir.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a parent that is a file, a read-only or unwritable parent
    raise ValueError(
      f"--workdir: cannot create {workdir} ({e.strerror or e}: {e.filename or workdir}); give a"
      " directory you can write to"
    ) from None


def _take(path, owner: dict) -> bool:
  """Creates the lock file naming ``owner``: False when one exists; ValueError if it cannot."""
  local = isinstance(path, pathlib.Path)
  if local and path.is_dir():
    raise ValueError(
      f"--workdir: {path} is a directory where the lock file goes; remove it (rm -r {path})"
      " if no run of this work dir is going on"
    )
  try:
    if not local:  # a URL: check, then write
      if path.exists():
        return False
      path.write_text(json.dumps(owner))
      return True
    with os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as file:
      json.dump(owner, file)
    return True
  except FileExistsError:
    return False
  except OSError as e:
    raise ValueError(
      f"--workdir: cannot write in {path.parent} ({e.strerror or e}); give a directory you can"
      " write to"
    ) from None


def _read_owner(path) -> dict:
  """The owner a lock file names, or {} when it names none (half-written, or not a lock)."""
  try:
    with files.open_regular(path) as file:
      owner = files.parse_json(file.read(_MAX_LOCK_BYTES))
  except (OSError, ValueError):
    return {}
  return owner if isinstance(owner, dict) else {}


def release(path, pid: int | None = None) -> None:
  """Removes the lock at ``path`` if process ``pid`` (default: this one) holds it."""
  if _read_owner(path).get("pid") == (os.getpid() if pid is None else pid):
    with contextlib.suppress(OSError):
      path.unlink()


@contextlib.contextmanager
def hold(workdir, say=print, name: str = LOCK_NAME) -> Iterator[pathlib.Path]:
  """Holds ``workdir``'s lock (host, pid, start time, command) for the duration of the block.

  A lock of a killed run (same host, and its pid gone or now another process) is taken
  over with a note to ``say``; the lock is removed however the block ends short of
  ``kill -9``. ``workdir``: a local directory (created if missing) or an ``epath.Path``;
  tasks of one sweep each hold their own ``name``.

  Raises:
    WorkdirBusyError: a live run holds it (the message names it and how to clear it).
    ValueError: the work dir is a file or cannot be created or written to, or a
      directory has the lock's name.
  """
  workdir = workdir if hasattr(workdir, "exists") else pathlib.Path(workdir)
  _usable(workdir)
  path = workdir / name
  owner = {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "start_time": _start_time(os.getpid()),
    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    "command": " ".join(sys.argv),
  }
  while not _take(path, owner):
    held = _read_owner(path)  # {}: stale
    if held and _alive(held):
      raise WorkdirBusyError(
        f"--workdir: {workdir} is in use by pid {held.get('pid')} on {held.get('host')} since"
        f" {held.get('started')} ({held.get('command')}); wait for it, or delete {path} if"
        " that run is gone"
      )
    say(
      f"taking over the stale lock of a run that ended without cleaning up ({held or 'unreadable'})"
    )
    with contextlib.suppress(FileNotFoundError):
      path.unlink()
  try:
    yield path
  finally:
    release(path, owner["pid"])
