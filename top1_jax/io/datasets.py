"""Datasets as numpy arrays: the names in ``REGISTRY`` from IDX files, any other (or
these when no IDX files are found) through TFDS."""

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
from etils import epath

from top1_jax.core import validation
from top1_jax.io import files, idx, tfds
from top1_jax.io.splits import (
  INSTALL_FASHION_MNIST,
  INSTALL_TENSORFLOW,
  DatasetSplit,
  DataUnavailableError,
)


class IdxDataset(NamedTuple):
  """A dataset read from IDX files before TFDS is tried.

  Attributes:
    class_names: the K class names, in label order.
    system_dir: a function giving where a system package installs the IDX files (looked
      up at each load), read when ``data_dir`` lacks them; None: no system copy.
    install: the command that installs that package, for error messages.
  """

  class_names: tuple[str, ...]
  system_dir: Callable[[], epath.PathLike] | None = None
  install: str | None = None


REGISTRY: dict[str, IdxDataset] = {
  "fashion_mnist": IdxDataset(
    idx.FASHION_MNIST_CLASSES, lambda: idx.FASHION_MNIST_DIR, INSTALL_FASHION_MNIST
  ),
  "mnist": IdxDataset(tuple(str(digit) for digit in range(10))),
}
"""Datasets read from IDX files, by name; every other name is TFDS's."""


def _no_idx_error(
  name: str, split: str, dataset: IdxDataset, directories: list, tfds_error=None
) -> DataUnavailableError:
  """No IDX files in ``directories`` (and, with ``tfds_error``, no TFDS data either)."""
  prefix = idx.IDX_SPLIT_PREFIX[split]
  searched = " or ".join(str(d) for d in directories) or "(no data_dir given)"
  no_idx = (
    f"no IDX files ({prefix}-images-idx3-ubyte[.gz], {prefix}-labels-idx1-ubyte[.gz]) in {searched}"
  )
  if dataset.system_dir is None:
    fix_idx = "put the IDX files in data_dir"
  elif files.as_path(dataset.system_dir()) in directories:
    fix_idx = f"{dataset.install} (the offline default), or put the IDX files in data_dir"
  else:  # an explicit data_dir that must not fall back to the system copy
    fix_idx = f"put the IDX files in data_dir, or leave data_dir out for {dataset.install}"
  if tfds_error is None:
    return DataUnavailableError(f"{name} ({split}): {no_idx}. Fix: {fix_idx}")
  return DataUnavailableError(
    f"{name} ({split}): no local data and no way to fetch it: {no_idx}; {tfds_error.detail}."
    f" Fix: {fix_idx}, or {INSTALL_TENSORFLOW} and run once with network access",
    detail=f"{no_idx}; {tfds_error.detail}",
  )


def _find_idx(
  name, split, data_dir, fallback: bool, source: str
) -> tuple[IdxDataset | None, list, tuple | None]:
  """Checks load_dataset's arguments; (the registry entry, or None for TFDS alone; the
  directories searched; the IDX pair found first). With ``source="idx"``, none is an error."""
  if source not in ("auto", "idx", "tfds"):
    raise ValueError(f"source: expected 'auto', 'idx' or 'tfds', got {source!r}")
  if not isinstance(name, str) or not name:
    raise ValueError(f"name: expected a dataset name, got {name!r}")
  if not isinstance(split, str) or not split:
    raise ValueError(f"split: expected a split name, got {split!r}")
  if source == "idx" and name not in REGISTRY:
    raise ValueError(f"name: IDX files are read for {sorted(REGISTRY)}, got {name!r}")
  if source == "tfds" or name not in REGISTRY:
    return None, [], None
  if split not in idx.IDX_SPLIT_PREFIX:
    raise ValueError(
      f"split: {name} IDX files have splits {sorted(idx.IDX_SPLIT_PREFIX)}, got {split!r}"
      " (use limit= for a subset)"
    )
  dataset = REGISTRY[name]
  directories = [files.as_path(data_dir)] if data_dir is not None else []
  if dataset.system_dir is not None and (data_dir is None or fallback):
    directories.append(files.as_path(dataset.system_dir()))
  for directory in directories:
    if (half := idx.incomplete_idx_pair(directory, split)) is not None:
      # Looking further would take images and labels from two copies of the data.
      raise DataUnavailableError(
        f"{name} ({split}): {half}; a split's images and labels must come from one directory"
      )
    if (found := idx.find_idx_files(directory, split)) is not None:
      return dataset, directories, found
  if source == "idx":
    raise _no_idx_error(name, split, dataset, directories)
  return dataset, directories, None


def load_dataset(
  name: str,
  split: str,
  *,
  data_dir: epath.PathLike | None = None,
  limit: int | None = None,
  source: str = "auto",
  image_size: tuple[int, int] | None = None,
  fallback: bool = True,
) -> DatasetSplit:
  """Loads one split of a dataset into memory.

  Args:
    name: ``"fashion_mnist"``, ``"mnist"`` or any TFDS name.
    split: ``"train"`` or ``"test"`` (TFDS: any TFDS split string).
    data_dir: directory with IDX files or a TFDS data directory.
    limit: keep the first ``limit`` examples (all when None).
    source: ``"auto"``, ``"idx"`` (IDX files only) or ``"tfds"`` (TFDS only).
    image_size: (height, width) for TFDS images of varying size.
    fallback: when ``data_dir`` lacks the split's IDX files, look in the system copy
      (Fashion-MNIST's) before TFDS. False: an explicit ``data_dir`` is used or
      refused, never silently replaced.

  Raises:
    DataUnavailableError: no local copy and no way to fetch one (saying what to install
      or where to put the files), or a directory with half of a split's IDX pair.
    ValueError: bad arguments or corrupt files.
  """
  dataset, directories, found = _find_idx(name, split, data_dir, fallback, source)
  if found is not None:
    classes = {"num_classes": len(dataset.class_names), "class_names": dataset.class_names}
    return idx.load_idx(*found, name=name, split=split, limit=limit, **classes)
  try:
    return tfds.load_tfds(name, split, data_dir=data_dir, limit=limit, image_size=image_size)
  except DataUnavailableError as e:
    if dataset is None:
      raise
    raise _no_idx_error(name, split, dataset, directories, e) from None


class SplitInfo(NamedTuple):
  """Where ``load_dataset`` would read a split from, and its size when that is cheap.

  Attributes:
    source: ``"idx:<dir>"`` or ``"tfds:<data_dir>"`` (``"tfds:default"``: TFDS's own).
    num_examples: N after ``limit``, from the IDX headers; None for TFDS.
    num_classes: K of an IDX dataset; None for TFDS.
  """

  source: str
  num_examples: int | None
  num_classes: int | None


def split_info(
  name: str,
  split: str,
  *,
  data_dir: epath.PathLike | None = None,
  limit: int | None = None,
  source: str = "auto",
  fallback: bool = True,
) -> SplitInfo:
  """What ``load_dataset`` with the same arguments would read, from the IDX headers alone
  (TFDS is not imported); raises as ``load_dataset`` would for bad arguments or headers."""
  if limit is not None:
    limit = validation.positive_int("limit", limit)
  dataset, _, found = _find_idx(name, split, data_dir, fallback, source)
  if found is not None:
    count = idx.count_idx_examples(*found)
    count = count if limit is None else min(count, limit)
    return SplitInfo(f"idx:{found[0].parent}", count, len(dataset.class_names))
  return SplitInfo(f"tfds:{'default' if data_dir is None else data_dir}", None, None)


def iterate_batches(
  dataset: DatasetSplit, batch_size: int, *, seed: int | None = None, drop_remainder: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields numpy (images [B, H, W, C], labels [B]) batches covering the split once, shuffled
  by ``seed`` (one permutation per call; None keeps the order)."""
  batch_size = validation.positive_int("batch_size", batch_size)
  count = len(dataset.labels)
  order = np.arange(count) if seed is None else np.random.default_rng(seed).permutation(count)
  stop = count - count % batch_size if drop_remainder else count
  for start in range(0, stop, batch_size):
    index = order[start : start + batch_size]
    yield dataset.images[index], dataset.labels[index]
