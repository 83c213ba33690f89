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
