"""A sweep's dataset: where each split comes from (checked before any work), and its images.
``s`` is a sweep's ``pipeline.settings.Settings``; problems are a ``SettingError`` naming the
setting (``data_dir: ...``)."""

import os
from typing import Any

from top1_jax.core.validation import SettingError
from top1_jax.io import datasets, files

Settings = Any  # top1_jax.pipeline.settings.Settings (imported there, not here: it needs flax)

SPLITS = ("train", "test")


def _data_dir(s: Settings) -> str | None:
  data_dir = s.data_dir or None
  return os.path.expanduser(data_dir) if data_dir and files.is_local(data_dir) else data_dir


def _limit(s: Settings, split: str) -> int | None:
  return s.limit_train if split == "train" else s.limit_test


def check(s: Settings, splits=SPLITS) -> dict[str, datasets.SplitInfo]:
  """Where each split will be read from, and its size when the IDX headers tell it. An
  explicit data_dir must exist and is the only place read; both splits come from one copy."""
  data_dir = _data_dir(s)
  if data_dir and files.is_local(data_dir) and not os.path.isdir(data_dir):
    raise SettingError(
      f"data_dir: no such directory: {s.data_dir} (for TFDS to build a dataset into a "
      "new directory, create it first)"
    )
  info = {}
  for split in splits:
    try:
      info[split] = datasets.split_info(
        s.dataset, split, data_dir=data_dir, limit=_limit(s, split), fallback=False
      )
    except (ValueError, FileNotFoundError, datasets.DataUnavailableError) as e:
      raise SettingError(f"data_dir: {e}") from None
  _check_one_source(s, {split: i.source for split, i in info.items()})
  if "train" in info and info["train"].num_examples is not None:
    _check_batch_size(s, info["train"].num_examples)
  return info


def _check_one_source(s: Settings, sources: dict[str, str]) -> None:
  if len(set(sources.values())) > 1:
    where = " but ".join(f"the {split} split from {source}" for split, source in sources.items())
    raise SettingError(
      f"data_dir: {s.dataset}: {where}; both splits must come from one copy of the "
      "dataset (put all of its files in one directory)"
    )


def _check_batch_size(s: Settings, num_train: int) -> None:
  if num_train < s.batch_size:
    raise SettingError(
      f"batch_size: {s.batch_size} is larger than the {num_train} training examples"
    )


def load(s: Settings, split: str) -> datasets.DatasetSplit:
  """One split, read where ``check`` found it: an explicit data_dir is never replaced."""
  return datasets.load_dataset(
    s.dataset, split, data_dir=_data_dir(s), limit=_limit(s, split), fallback=False
  )


def load_both(s: Settings) -> tuple[datasets.DatasetSplit, datasets.DatasetSplit]:
  """The train and test splits, checked to come from one source (TFDS: known only now)."""
  train_split, test_split = load(s, "train"), load(s, "test")
  _check_one_source(s, {"train": train_split.source, "test": test_split.source})
  _check_batch_size(s, len(train_split.labels))
  # Checked before training: a network trained on one image size fails on another.
  if train_split.images.shape[1:] != test_split.images.shape[1:]:
    raise SettingError(
      f"data_dir: train images are {train_split.images.shape[1:]} but test images"
      f" {test_split.images.shape[1:]}; both splits must have one image size"
    )
  return train_split, test_split
