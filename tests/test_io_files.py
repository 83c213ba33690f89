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


# ----------------------------------------------------------------------------
# Files that are not regular: refused before anything is read, in one line naming them


@pytest.mark.parametrize("kind", ["FIFO", "character device", "socket", "directory"])
def test_readers_refuse_what_is_not_a_regular_file(tmp_path, kind, caplog):
  # A FIFO had hung Calibrator.load (read_strict_json) until a writer came; a link to
  # /dev/zero had been read without end by read_json.
  path = io_testing.not_regular_files(tmp_path)[kind]
  for read in (
    files.open_regular,
    files.read_text,
    lambda p: files.read_strict_json(p, 1 << 20, "a top1_jax calibrator"),
  ):
    error = io_testing.returns_without_a_writer(lambda read=read: read(path), tmp_path / "fifo")
    assert isinstance(error, ValueError), error
    text = io_testing.assert_one_clean_line(error)
    assert text.startswith(f"{path}: ") and kind in text and "not a regular file" in text
  with caplog.at_level(logging.WARNING):
    got = io_testing.returns_without_a_writer(lambda: files.read_json(path), tmp_path / "fifo")
  assert got is None  # a marker of finished work that cannot be read: the work is redone
  assert [r.getMessage() for r in caplog.records] == [
    f"{path} is unreadable ({path}: a {kind}{' (named pipe)' if kind == 'FIFO' else ''}, not a"
    " regular file; give the path of a file); treated as missing"
  ]


def test_a_link_to_a_regular_file_is_read(tmp_path):
  target = files.write_json(tmp_path / "real.json", {"a": 1})
  (tmp_path / "link.json").symlink_to(target)
  assert files.read_json(tmp_path / "link.json") == {"a": 1}
  assert files.read_text(tmp_path / "link.json") == '{\n  "a": 1\n}\n'


@pytest.mark.parametrize(
  "content, why",
  [
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (b'{"config": 1, "config": 2}', "field 'config' is given twice in one object"),
    (b'{"test": NaN}', "NaN is not strict JSON"),
    (b'{"a": 1', "invalid JSON: Expecting ',' delimiter: line 1 column 8 (char 7)"),
    (b"\xff\xfe", "not UTF-8 text: invalid start byte at byte 0"),
  ],
)
def test_a_garbage_marker_is_missing_work_with_one_warning_naming_it(
  tmp_path, caplog, content, why
):
  # A stage's <stage>.json marker nested 100,000 deep had ended the launcher in a
  # RecursionError traceback.
  path = tmp_path / "base.json"
  path.write_bytes(content)
  with caplog.at_level(logging.WARNING):
    assert files.read_json(path) is None
  (message,) = [r.getMessage() for r in caplog.records]
  assert message.startswith(f"{path}: not valid JSON ({why}") and "\n" not in message


def test_an_unwritable_folder_names_the_file_asked_for_not_a_temporary_one(tmp_path, monkeypatch):
  # As root, permissions do not stop a write: the system's refusal is simulated.
  def refused(dir, prefix, suffix):
    name = os.path.join(dir, f"{prefix}x1y2z3{suffix}")
    raise PermissionError(13, "Permission denied", name)

  monkeypatch.setattr(files.tempfile, "mkstemp", refused)
  target = tmp_path / "calibrator.json"
  with pytest.raises(PermissionError) as info:
    files.write_json(target, {"a": 1})
  assert str(info.value) == f"[Errno 13] Permission denied: '{target}'"
  assert info.value.filename == str(target)


def test_write_csv_escapes_text_a_spreadsheet_would_run_as_a_formula(tmp_path):
  # OWASP's CSV injection: a meta value "=1+2" had landed in results.csv as a formula.
  rows = [
    {"model": '=HYPERLINK("http://x")', "seed": -1, "ece": -0.5, "note": "@SUM(A1)"},
    {"model": "+1", "seed": 2, "ece": 0.25, "note": "-2", "\ttab": "\rcr"},
    {"model": "cnn", "seed": 3, "ece": 0.125, "note": "plain 'quoted'"},
  ]
  path = files.write_csv(tmp_path / "results.csv", rows)
  import csv

  with open(path, newline="") as file:
    read = list(csv.reader(file))
  assert read == [
    ["model", "seed", "ece", "note", "'\ttab"],
    ['\'=HYPERLINK("http://x")', "-1", "-0.5", "'@SUM(A1)", ""],  # numbers are data
    ["'+1", "2", "0.25", "'-2", "'\rcr"],
    ["cnn", "3", "0.125", "plain 'quoted'", ""],
  ]
  assert not any(
    cell.startswith(files.FORMULA_STARTS) for row in read for cell in row[0:1] + row[3:]
  )
