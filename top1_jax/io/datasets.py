"""Datasets as numpy arrays: one registry of loaders, IDX files and TFDS.

``load_dataset(name, split)`` returns a ``DatasetSplit``: images
``[N, H, W, C]`` float32 in [0, 1] and labels ``[N]`` int32. Sources, in order:

* A name in ``REGISTRY`` (``fashion_mnist``, ``mnist``) as IDX files
  (``train-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz``, ...; gzipped or
  not) in ``data_dir``, then in its system copy: Fashion-MNIST's in
  ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``),
  the offline default (``top1_jax.io.idx``). With ``fallback=False`` an explicit
  ``data_dir`` is the only place read. A directory with only one of a split's two
  IDX files is refused, never skipped.
* Any TFDS name (``cifar10``, ``cifar100``, ``imagenet2012``, ...) prepared in
  ``data_dir`` (or TFDS's default directory), or built by TFDS when TensorFlow
  and the network are there (``top1_jax.io.tfds``); otherwise one clear
  ``DataUnavailableError``.

The training split trains; the held-out (test) split is what cross-validation
divides into calibration and evaluation folds. ``split_info`` says where a split
would be read from, and its size for IDX files, from the file headers alone.
"""

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
  """A dataset read from IDX files (``top1_jax.io.idx``) before TFDS is tried.

  Attributes:
    class_names: the K class names, in label order.
    system_dir: where a system package installs the IDX files, read when
      ``data_dir`` lacks them (unless ``fallback=False``); a function, so the place
      is looked up at each load (tests point it elsewhere). None: no system copy.
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
"""Datasets with a loader of their own, by name; every other name is TFDS's (its own
registry). Adding an IDX dataset is one entry here."""


def _no_idx_error(
  name: str,
  split: str,
  dataset: IdxDataset,
  directories: list,
  tfds_error: DataUnavailableError | None,
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


def _idx_dataset(name, split, source: str) -> IdxDataset | None:
  """Checks load_dataset's arguments; the registry entry whose IDX files are looked
  for, or None when the name goes to TFDS alone."""
  if source not in ("auto", "idx", "tfds"):
    raise ValueError(f"source: expected 'auto', 'idx' or 'tfds', got {source!r}")
  if not isinstance(name, str) or not name:
    raise ValueError(f"name: expected a dataset name, got {name!r}")
  if not isinstance(split, str) or not split:
    raise ValueError(f"split: expected a split name, got {split!r}")
  if source == "idx" and name not in REGISTRY:
    raise ValueError(f"name: IDX files are read for {sorted(REGISTRY)}, got {name!r}")
  if source == "tfds" or name not in REGISTRY:
    return None
  if split not in idx.IDX_SPLIT_PREFIX:
    raise ValueError(
      f"split: {name} IDX files have splits {sorted(idx.IDX_SPLIT_PREFIX)}, got {split!r}"
      " (use limit= for a subset)"
    )
  return REGISTRY[name]


def _find_idx(
  name: str, split: str, dataset: IdxDataset, data_dir, fallback: bool
) -> tuple[list, tuple | None]:
  """(the directories searched, the split's IDX pair found in the first that has it)."""
  directories = [files.as_path(data_dir)] if data_dir is not None else []
  if dataset.system_dir is not None and (data_dir is None or fallback):
    directories.append(files.as_path(dataset.system_dir()))
  for directory in directories:
    half = idx.incomplete_idx_pair(directory, split)
    if half is not None:
      # Looking further would take this split's images and labels (or this split
      # and the other one) from two different copies of the data.
      raise DataUnavailableError(
        f"{name} ({split}): {half}; a split's images and labels must come from one directory"
      )
    found = idx.find_idx_files(directory, split)
    if found is not None:
      return directories, found
  return directories, None


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

  The names in ``REGISTRY`` (``fashion_mnist``, ``mnist``) are read from IDX files in
  ``data_dir`` (and from their system copy, Fashion-MNIST's in
  ``/usr/share/datasets/fashion-mnist``) when present; any other name, or these
  when no IDX files are found, goes through TFDS (``tfds.load_tfds``).

  Args:
    name: ``"fashion_mnist"``, ``"mnist"`` or any TFDS name.
    split: ``"train"`` or ``"test"`` (TFDS: any TFDS split string).
    data_dir: directory with IDX files or a TFDS data directory.
    limit: keep the first ``limit`` examples (all when None).
    source: ``"auto"``, ``"idx"`` (IDX files only) or ``"tfds"`` (TFDS only).
    image_size: (height, width) for TFDS images of varying size (see
      ``tfds.load_tfds``).
    fallback: when ``data_dir`` is given but lacks the split's IDX files, look
      in the system copy of Fashion-MNIST before TFDS. False makes ``data_dir``
      the only place read (its IDX files, else TFDS data in it), so an explicit
      directory is used or refused, never silently replaced.

  Returns:
    A ``DatasetSplit``: images [N, H, W, C] float32 in [0, 1], labels [N] int32.

  Raises:
    DataUnavailableError: no local copy and no way to fetch one (one line saying
      what to install or where to put the files), or a directory with only one
      of a split's two IDX files.
    ValueError: bad arguments or corrupt files.
  """
  dataset = _idx_dataset(name, split, source)
  if dataset is None:
    return tfds.load_tfds(name, split, data_dir=data_dir, limit=limit, image_size=image_size)
  directories, found = _find_idx(name, split, dataset, data_dir, fallback)
  if found is not None:
    return idx.load_idx(
      *found,
      num_classes=len(dataset.class_names),
      name=name,
      split=split,
      limit=limit,
      class_names=dataset.class_names,
    )
  if source == "idx":
    raise _no_idx_error(name, split, dataset, directories, None)
  try:
    return tfds.load_tfds(name, split, data_dir=data_dir, limit=limit, image_size=image_size)
  except DataUnavailableError as e:
    raise _no_idx_error(name, split, dataset, directories, e) from None


class SplitInfo(NamedTuple):
  """Where ``load_dataset`` would read a split from, and its size when that is cheap.

  Attributes:
    source: ``"idx:<dir>"`` (as ``DatasetSplit.source``) or ``"tfds:<data_dir>"``
      (``"tfds:default"`` for TFDS's own directory).
    num_examples: N after ``limit``, from the IDX headers; None for TFDS (known
      once the dataset is opened).
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
  """What ``load_dataset`` with the same arguments would read, without reading it.

  For IDX files only the headers are read (milliseconds), so a launcher can
  check its settings against N and K before any work; TFDS is not imported.

  Raises:
    DataUnavailableError, ValueError: as ``load_dataset`` would for a missing
      half of an IDX pair, bad arguments or bad headers.
  """
  if limit is not None:
    limit = validation.positive_int("limit", limit)
  dataset = _idx_dataset(name, split, source)
  if dataset is not None:
    directories, found = _find_idx(name, split, dataset, data_dir, fallback)
    if found is not None:
      count = idx.count_idx_examples(*found)
      count = count if limit is None else min(count, limit)
      return SplitInfo(f"idx:{found[0].parent}", count, len(dataset.class_names))
    if source == "idx":
      raise _no_idx_error(name, split, dataset, directories, None)
  return SplitInfo(f"tfds:{'default' if data_dir is None else data_dir}", None, None)


def iterate_batches(
  dataset: DatasetSplit,
  batch_size: int,
  *,
  seed: int | None = None,
  drop_remainder: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Yields (images [B, H, W, C], labels [B]) batches covering the split once.

  Args:
    dataset: the split.
    batch_size: B.
    seed: shuffle with this seed (one permutation per call); None keeps order.
    drop_remainder: drop the last batch when it is smaller than B.

  Yields:
    numpy batches.
  """
  batch_size = validation.positive_int("batch_size", batch_size)
  count = len(dataset.labels)
  order = np.arange(count) if seed is None else np.random.default_rng(seed).permutation(count)
  stop = count - count % batch_size if drop_remainder else count
  for start in range(0, stop, batch_size):
    index = order[start : start + batch_size]
    yield dataset.images[index], dataset.labels[index]


__all__ = [
  "DataUnavailableError",
  "DatasetSplit",
  "IdxDataset",
  "REGISTRY",
  "SplitInfo",
  "iterate_batches",
  "load_dataset",
  "split_info",
]
