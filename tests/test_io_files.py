"""Tests for top1_jax.io.files: atomic writes, local and through epath (gs:// mocked)."""

import json
import logging
import os
import pathlib
import stat
import threading

import io_testing
import pytest
from etils import epath
from etils.epath import testing as epath_testing

from top1_jax.io import files


def _fail_half_way(file):
  file.write(b"half of the new file")
  raise OSError("No space left on device")


@pytest.mark.parametrize("as_type", [str, pathlib.Path, epath.Path])
def test_atomic_write_accepts_str_pathlib_and_epath(tmp_path, as_type):
  target = tmp_path / "out" / "a.bin"  # the folder is created
  written = files.atomic_write(as_type(target), lambda file: file.write(b"new"))
  assert isinstance(written, pathlib.Path) and written == target
  assert target.read_bytes() == b"new"
  assert os.listdir(target.parent) == ["a.bin"]  # no temp file left behind
  assert stat.S_IMODE(target.stat().st_mode) == 0o644  # outputs are shared


@pytest.mark.parametrize("error", [OSError("No space left on device"), KeyboardInterrupt()])
def test_atomic_write_keeps_the_old_file_when_the_writer_raises(tmp_path, error):
  target = tmp_path / "a.json"
  target.write_bytes(b"old")

  def write_then_fail(file):
    file.write(b"half of the new file")
    raise error

  with pytest.raises(type(error)):
    files.atomic_write(target, write_then_fail)
  assert target.read_bytes() == b"old"
  assert os.listdir(tmp_path) == ["a.json"]


def test_atomic_write_of_a_new_file_leaves_nothing_when_the_writer_raises(tmp_path):
  with pytest.raises(OSError, match="No space left"):
    files.atomic_write(tmp_path / "a.bin", _fail_half_way)
  assert os.listdir(tmp_path) == []


def test_atomic_write_replaces_an_existing_file(tmp_path):
  target = tmp_path / "a.txt"
  files.write_bytes(target, b"first")
  files.write_bytes(target, b"second")
  assert target.read_bytes() == b"second" and os.listdir(tmp_path) == ["a.txt"]


def test_json_round_trip(tmp_path):
  value = {"b": [1, 2.5, None], "a": {"nested": "é"}}
  path = files.write_json(tmp_path / "r.json", value)
  assert files.read_json(path) == value
  assert files.read_json(str(path)) == value
  text = path.read_text()
  assert text.endswith("\n") and text.index('"a"') < text.index('"b"')  # sorted, indented
  assert json.loads(text) == value


@pytest.mark.parametrize("content", [b'{"a": 1', b"\xff\xfe not utf-8", b""])
def test_read_json_of_a_corrupt_file_is_none(tmp_path, content):
  path = tmp_path / "r.json"
  path.write_bytes(content)
  assert files.read_json(path) is None


def test_read_json_of_a_missing_file_is_none(tmp_path):
  assert files.read_json(tmp_path / "missing.json") is None


def test_write_csv_columns_are_every_key_in_first_seen_order(tmp_path):
  path = files.write_csv(tmp_path / "r.csv", [{"a": 1, "b": 2}, {"c": 3, "a": 4}])
  assert path.read_text().splitlines() == ["a,b,c", "1,2,", "4,,3"]


def test_is_local():
  assert files.is_local("/tmp/x") and files.is_local(pathlib.Path("rel/x"))
  assert files.is_local(epath.Path("/tmp/x"))
  assert not files.is_local("gs://bucket/x") and not files.is_local(epath.Path("s3://b/x"))
  assert isinstance(files.as_path("gs://bucket/x"), epath.Path)
  assert type(files.as_path("/tmp/x")) is pathlib.PosixPath


# ----------------------------------------------------------------------------
# A bucket: epath's backend, mocked onto a local folder


def test_remote_write_is_one_object_write_through_epath(tmp_path, monkeypatch):
  with io_testing.mock_bucket(tmp_path, monkeypatch) as opened:
    written = files.write_json("gs://bucket/run/results.json", {"a": 1})
    assert isinstance(written, epath.Path) and str(written) == "gs://bucket/run/results.json"
    assert opened == [("gs://bucket/run/results.json", "wb")]  # no temp object, no rename
    assert files.read_json(written) == {"a": 1}
    assert files.read_json("gs://bucket/run/missing.json") is None
  assert json.loads((tmp_path / "bucket" / "run" / "results.json").read_text()) == {"a": 1}


def test_remote_write_leaves_the_old_object_when_the_writer_raises(tmp_path, monkeypatch):
  with io_testing.mock_bucket(tmp_path, monkeypatch) as opened:
    files.write_bytes("gs://bucket/a.bin", b"old")
    opened.clear()
    with pytest.raises(OSError, match="No space left"):
      files.atomic_write(epath.Path("gs://bucket/a.bin"), _fail_half_way)
    assert opened == []  # the object was not even opened
  assert (tmp_path / "bucket" / "a.bin").read_bytes() == b"old"
  assert os.listdir(tmp_path / "bucket") == ["a.bin"]


# ----------------------------------------------------------------------------
# A bucket that cannot be reached: one line, in bounded time, without the libraries' noise


def _unreachable(release: threading.Event, log: bool):
  """An ``exists`` that hangs (like gcsfs retrying without network) until ``release``."""

  def exists(original, path):
    if log:  # gcsfs logs each failed retry with its traceback
      try:
        raise ConnectionError("Cannot connect to host storage.googleapis.com:443")
      except ConnectionError:
        logging.getLogger("gcsfs.retry").exception("_request out of retries on exception")
    release.wait(30)
    release.returned = True  # the probe gave up: only after the test releases it
    raise ConnectionError("Cannot connect to host storage.googleapis.com:443")

  return exists


def test_an_unreachable_bucket_is_one_line_within_the_timeout(monkeypatch, caplog):
  monkeypatch.setenv("EPATH_USE_TF", "false")
  release = threading.Event()
  try:
    with epath_testing.mock_epath(exists=_unreachable(release, log=True)):
      with pytest.raises(ValueError) as info, caplog.at_level(logging.DEBUG):
        files.check_usable("gs://bucket/run", "--workdir", timeout=0.5)
      # It answered at its timeout, while the probe still hung (no wall-time bound).
      assert not getattr(release, "returned", False)
  finally:
    release.set()  # the probe's thread ends
  text = io_testing.assert_one_clean_line(info.value)
  assert text == (
    "--workdir: gs://bucket/run: cannot be reached (no answer within 0.5 s); check the "
    "network, the bucket's name and your credentials, or use a local directory. Nothing was "
    "written"
  )
  assert not [r for r in caplog.records if r.name.startswith("gcsfs")]  # no retry tracebacks


def test_a_bucket_that_refuses_is_one_line_naming_why(monkeypatch):
  monkeypatch.setenv("EPATH_USE_TF", "false")

  def exists(original, path):
    raise PermissionError("403 Forbidden: no storage.objects.get access")

  with epath_testing.mock_epath(exists=exists), pytest.raises(ValueError) as info:
    files.check_usable("gs://bucket/run", "--workdir")
  assert io_testing.assert_one_clean_line(info.value).startswith(
    "--workdir: gs://bucket/run: cannot be reached (403 Forbidden: no storage.objects.get access)"
  )
  level = logging.getLogger("gcsfs").level
  with epath_testing.mock_epath(exists=lambda original, path: False):
    files.check_usable("gs://bucket/new_run", "--workdir")  # a new work dir: usable
  assert logging.getLogger("gcsfs").level == level  # the libraries speak again
