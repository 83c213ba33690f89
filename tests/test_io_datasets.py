"""Tests for top1_jax.io.datasets: load_dataset's arguments and dispatch, batches."""

import io_testing
import numpy as np
import pytest

from top1_jax.io import datasets


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"name": "fashion_mnist", "split": "validation"}, "split: fashion_mnist IDX"),
    ({"name": "fashion_mnist", "split": "test", "source": "x"}, "source: expected"),
    ({"name": "cifar10", "split": "test", "source": "idx"}, "name: IDX files are read"),
    ({"name": "", "split": "test"}, "name: expected a dataset name"),
    ({"name": "mnist", "split": ""}, "split: expected a split name"),
  ],
)
def test_load_dataset_argument_errors(tmp_path, no_system_fmnist, kwargs, message):
  with pytest.raises(ValueError, match=message):
    datasets.load_dataset(data_dir=tmp_path, **kwargs)


def test_idx_only_source_without_files(tmp_path, no_system_fmnist):
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("fashion_mnist", "train", data_dir=tmp_path, source="idx")
  text = str(info.value)
  assert "train-images-idx3-ubyte[.gz]" in text and str(tmp_path) in text
  assert str(no_system_fmnist) in text and "apt-get install dataset-fashion-mnist" in text


# ----------------------------------------------------------------------------
# No local data and no network: one clear error, at once


def test_fashion_mnist_offline_without_data(tmp_path, no_system_fmnist, offline):
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  text = io_testing.assert_one_clean_line(info.value)
  for expected in [
    "no local data",
    "t10k-images-idx3-ubyte[.gz]",
    str(no_system_fmnist),
    f"{tmp_path}/fashion_mnist/",
    "TensorFlow is not installed",
    "the network is unreachable",
    "apt-get install dataset-fashion-mnist",
    "pip install 'top1_jax[tf]'",
  ]:
    assert expected in text, (expected, text)


# ----------------------------------------------------------------------------
# Batches


def test_iterate_batches():
  images, labels = np.arange(10, dtype=np.float32)[:, None, None, None], np.arange(10)
  split = datasets.DatasetSplit(images, labels, 10, "toy", "train", "memory", tuple("0123456789"))
  batches = list(datasets.iterate_batches(split, 4))
  assert [len(y) for _, y in batches] == [4, 4, 2]
  np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
  dropped = list(datasets.iterate_batches(split, 4, drop_remainder=True))
  assert [len(y) for _, y in dropped] == [4, 4]
  first = np.concatenate([y for _, y in datasets.iterate_batches(split, 3, seed=1)])
  again = np.concatenate([y for _, y in datasets.iterate_batches(split, 3, seed=1)])
  np.testing.assert_array_equal(first, again)
  np.testing.assert_array_equal(np.sort(first), labels)
  assert not np.array_equal(first, labels)
  for x, y in datasets.iterate_batches(split, 3, seed=2):
    np.testing.assert_array_equal(x[:, 0, 0, 0], y)  # images stay with labels
  with pytest.raises(ValueError, match="batch_size: expected at least 1, got 0"):
    next(datasets.iterate_batches(split, 0))
