"""Helpers shared by the tests of top1_jax.io (fixtures are in conftest.py)."""

import contextlib
import os
import pathlib
from collections.abc import Iterator

from etils.epath import testing as epath_testing


def assert_one_clean_line(error: BaseException) -> str:
  """The error's message, checked to be one line with no chained traceback."""
  text = str(error)
  assert "\n" not in text
  # No chained traceback from inside TFDS is shown.
  assert error.__cause__ is None
  assert error.__context__ is None or error.__suppress_context__
  return text


@contextlib.contextmanager
def mock_bucket(root: pathlib.Path, monkeypatch, wrap_file=None) -> Iterator[list[tuple[str, str]]]:
  """Serves ``gs://`` paths from the folder ``root`` through epath's backend, offline.

  Like an object store, opening an object for writing needs no folders, and
  there is no rename (using it fails the test). ``wrap_file``, if given, wraps
  every opened file object (e.g. to act as another store's client).

  Yields:
    The (path, mode) of every file opened, in order.
  """
  # With TensorFlow installed, epath would send gs:// to gfile instead of the mock.
  monkeypatch.setenv("EPATH_USE_TF", "false")
  opened = []

  def local(path) -> str:
    text = os.fspath(path)
    return str(root / text.removeprefix("gs://")) if text.startswith("gs://") else text

  def redirect(original, path, *args, **kwargs):
    return original(local(path), *args, **kwargs)

  def open_object(original, path, mode):
    opened.append((os.fspath(path), mode))
    if "w" in mode:
      os.makedirs(os.path.dirname(local(path)), exist_ok=True)
    opened_file = original(local(path), mode)
    return opened_file if wrap_file is None else wrap_file(opened_file)

  def no_rename(original, path, dst, *args, **kwargs):
    raise AssertionError(f"rename {path} -> {dst}: object stores have no rename")

  redirected = ("exists", "isdir", "listdir", "makedirs", "mkdir", "remove", "stat")
  with epath_testing.mock_epath(
    open=open_object,
    rename=no_rename,
    replace=no_rename,
    **dict.fromkeys(redirected, redirect),
  ):
    yield opened


def write_tfds_metadata(data_dir: pathlib.Path, name: str, sizes: dict[str, int]) -> None:
  """The metadata files of a prepared TFDS dataset (no records), for tfds.testing.mock_data."""
  import tensorflow_datasets as tfds  # only the tests that mock TFDS pay its import

  builder = tfds.builder(name, data_dir=str(data_dir), file_format="array_record")
  splits = [
    tfds.core.SplitInfo(
      name=split,
      shard_lengths=[count],
      num_bytes=0,
      filename_template=tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path,
        template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
        dataset_name=builder.name,
        split=split,
        filetype_suffix="array_record",
      ),
    )
    for split, count in sizes.items()
  ]
  builder.info.set_splits(tfds.core.SplitDict(splits))
  builder.data_path.mkdir(parents=True, exist_ok=True)
  builder.info.write_to_directory(builder.data_path)


def not_regular_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
  """Paths in ``folder`` that readers must refuse, by the kind their message names: a
  FIFO, a link to ``/dev/zero`` (a device that never ends), a Unix socket and a folder."""
  import socket

  folder.mkdir(parents=True, exist_ok=True)
  paths = {kind: folder / name for kind, name in [
    ("FIFO", "fifo"), ("character device", "zero"), ("socket", "sock"), ("directory", "dir")
  ]}  # fmt: skip
  os.mkfifo(paths["FIFO"])
  os.symlink("/dev/zero", paths["character device"])
  server = socket.socket(socket.AF_UNIX)
  server.bind(os.fspath(paths["socket"]))
  server.close()  # the socket file stays
  paths["directory"].mkdir()
  return paths


def returns_without_a_writer(call, fifo: pathlib.Path, patience: float = 20.0):
  """``call()``'s outcome (its value, or the exception it raised), where a reader that
  waits on ``fifo`` for a writer fails the test: after ``patience`` seconds a writer
  comes and goes (so the reader ends), and the test fails as hung."""
  import threading

  outcome = []

  def run():
    try:
      outcome.append(call())
    except BaseException as e:  # noqa: BLE001 -- handed to the test
      outcome.append(e)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(patience)
  if thread.is_alive():
    try:  # a writer that comes and goes releases a reader blocked in open() or read()
      os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader any more (ENXIO)
      pass
    thread.join(patience)
    raise AssertionError(f"{fifo}: the reader waited for a writer (a FIFO must be refused)")
  return outcome[0]
