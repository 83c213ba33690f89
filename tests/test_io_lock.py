"""One run per work dir: the lock file, stale locks, and a refused launcher run."""

import json
import os
import socket
import subprocess
import sys

import io_testing
import processes
import pytest

from top1_jax.io import lock


def _write_lock(workdir, **owner):
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / lock.LOCK_NAME).write_text(json.dumps(owner))


def test_hold_creates_and_removes_the_lock(tmp_path):
  with lock.hold(tmp_path / "w") as path:
    owner = json.loads(path.read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
  assert not path.exists()


def test_a_live_owner_refuses_a_second_run(tmp_path):
  with lock.hold(tmp_path) as path:
    with pytest.raises(lock.WorkdirBusyError, match=f"in use by pid {os.getpid()}") as info:
      with lock.hold(tmp_path):
        pass
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert path.exists()  # the refused run left the owner's lock alone
  assert not path.exists()


def test_another_hosts_lock_is_respected(tmp_path):
  _write_lock(tmp_path, host="elsewhere", pid=1, started="then", command="x")
  with pytest.raises(lock.WorkdirBusyError, match="on elsewhere"):
    with lock.hold(tmp_path):
      pass


@pytest.mark.parametrize(
  "owner",
  [
    {"pid": 2**22 + 12345},  # no such process
    {"pid": os.getpid(), "start_time": "not-this-process"},  # a pid reused by another process
    None,  # half-written lock of a killed run
  ],
)
def test_a_stale_lock_is_taken_over_with_a_note(owner, tmp_path):
  if owner is None:
    tmp_path.joinpath(lock.LOCK_NAME).write_text("{")
  else:
    _write_lock(tmp_path, host=socket.gethostname(), started="then", command="killed", **owner)
  notes = []
  with lock.hold(tmp_path, say=notes.append) as path:
    assert json.loads(path.read_text())["pid"] == os.getpid()
  assert len(notes) == 1 and "stale lock" in notes[0]


def _refusal(workdir) -> str:
  with pytest.raises(ValueError) as info:
    with lock.hold(workdir):
      pass
  assert "\n" not in str(info.value)
  return str(info.value)


def test_a_work_dir_that_cannot_hold_the_lock_is_one_line_naming_it(tmp_path, monkeypatch):
  # These were bare errno messages naming no setting ([Errno 21] Is a directory: ...).
  busy = tmp_path / "dir_lock"
  (busy / lock.LOCK_NAME).mkdir(parents=True)
  assert _refusal(busy) == (
    f"--workdir: {busy / lock.LOCK_NAME} is a directory where the lock file goes; remove it"
    f" (rm -r {busy / lock.LOCK_NAME}) if no run of this work dir is going on"
  )
  assert (busy / lock.LOCK_NAME).is_dir()  # left as it was
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  expected = f"--workdir: {a_file} is a file, not a directory; give a directory"
  assert _refusal(a_file) == expected
  assert _refusal(a_file / "run" / "1") == expected  # the folder it would be made in
  # Read-only or not ours (as root, permissions do not stop a write: the system's answer
  # is simulated for the lock file alone).
  real_open = os.open

  def read_only(path, *args, **kwargs):
    if os.fspath(path).endswith(lock.LOCK_NAME):
      raise OSError(30, "Read-only file system", os.fspath(path))
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(os, "open", read_only)
  assert _refusal(tmp_path / "ro") == (
    f"--workdir: cannot write in {tmp_path / 'ro'} (Read-only file system); give a directory "
    "you can write to"
  )


def test_a_refused_launcher_run_changes_nothing(tmp_path):
  workdir = tmp_path / "w"
  _write_lock(workdir, host="elsewhere", pid=1, started="then", command="the other run")
  (workdir / "config.json").write_text('{"mine": true}')
  before = sorted(p.name for p in workdir.iterdir())
  args = [sys.executable, processes.script("reproduce"), "--config=quick"]
  args.append(f"--workdir={workdir}")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1
  assert out.stderr.strip().startswith("error: --workdir:") and "in use by pid 1" in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1
  assert sorted(p.name for p in workdir.iterdir()) == before
  assert json.loads((workdir / "config.json").read_text()) == {"mine": True}


@pytest.mark.parametrize("lock_file", ["FIFO", "character device", "nested"])
def test_a_lock_that_is_not_a_lock_file_is_stale(tmp_path, lock_file):
  # A FIFO where the lock goes had hung the run (reading it waited for a writer), a link
  # to /dev/zero read without end, and JSON nested 100,000 deep ended in a RecursionError.
  workdir = tmp_path / "w"
  workdir.mkdir()
  if lock_file == "nested":
    (workdir / lock.LOCK_NAME).write_text("[" * 100_000 + "]" * 100_000)
  else:
    kinds = io_testing.not_regular_files(tmp_path / "kinds")
    os.replace(kinds[lock_file], workdir / lock.LOCK_NAME)

  def hold():
    notes = []
    with lock.hold(workdir, say=notes.append) as path:
      assert json.loads(path.read_text())["pid"] == os.getpid()
    return notes

  notes = io_testing.returns_without_a_writer(hold, workdir / lock.LOCK_NAME)
  assert isinstance(notes, list), notes
  assert len(notes) == 1 and "stale lock" in notes[0] and "unreadable" in notes[0]
  assert not (workdir / lock.LOCK_NAME).exists()
