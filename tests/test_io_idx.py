"""Tests for top1_jax.io.idx: IDX files, read directly and through load_dataset."""

import gzip
import pathlib
import struct

import io_testing
import numpy as np
import pytest

from top1_jax.io import datasets, idx

# ----------------------------------------------------------------------------
# Helpers


def _idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
  dtype = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
  header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  return header + np.asarray(array, dtype[type_code]).tobytes()


def _write(path: pathlib.Path, payload: bytes, gz: bool = True) -> pathlib.Path:
  path.write_bytes(gzip.compress(payload) if gz else payload)
  return path


def _write_idx_split(directory, split, images, labels, gz=True):
  prefix = {"train": "train", "test": "t10k"}[split]
  suffix = ".gz" if gz else ""
  image_path = directory / f"{prefix}-images-idx3-ubyte{suffix}"
  label_path = directory / f"{prefix}-labels-idx1-ubyte{suffix}"
  _write(image_path, _idx_bytes(images), gz)
  _write(label_path, _idx_bytes(labels), gz)
  return image_path, label_path


def _small_images(n=7, height=4, width=5, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, size=(n, height, width), dtype=np.uint8)
  images[0, 0, 0], images[0, 0, 1] = 0, 255  # both ends of the range
  return images, (np.arange(n) % 10).astype(np.uint8)


# ----------------------------------------------------------------------------
# IDX files


@pytest.mark.parametrize("gz", [True, False])
def test_idx_dataset_roundtrip(tmp_path, no_system_fmnist, gz):
  images, labels = _small_images()
  _write_idx_split(tmp_path, "test", images, labels, gz=gz)
  split = datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  assert split.images.shape == (7, 4, 5, 1) and split.images.dtype == np.float32
  np.testing.assert_array_equal(split.images[..., 0] * 255, images.astype(np.float32))
  assert split.images.min() == 0.0 and split.images.max() == 1.0
  assert split.labels.dtype == np.int32
  np.testing.assert_array_equal(split.labels, labels)
  assert split.num_classes == 10 and split.class_names == idx.FASHION_MNIST_CLASSES
  assert (split.name, split.split) == ("fashion_mnist", "test")
  assert split.source == f"idx:{tmp_path}"
  assert split.ids is None


def test_idx_limit_keeps_the_first_examples(tmp_path, no_system_fmnist):
  images, labels = _small_images()
  _write_idx_split(tmp_path, "train", images, labels)
  split = datasets.load_dataset("mnist", "train", data_dir=tmp_path, limit=3)
  np.testing.assert_array_equal(split.labels, labels[:3])
  np.testing.assert_array_equal(split.images[..., 0] * 255, images[:3])
  assert split.class_names == tuple("0123456789")


def test_a_new_idx_dataset_is_one_registry_entry(tmp_path, monkeypatch):
  system = tmp_path / "system"
  system.mkdir()
  images, labels = _small_images(n=5)
  labels = labels % 3
  _write_idx_split(system, "test", images, labels)
  entry = datasets.IdxDataset(("a", "b", "c"), lambda: system, "apt-get install toy-digits")
  monkeypatch.setitem(datasets.REGISTRY, "toy_digits", entry)
  split = datasets.load_dataset("toy_digits", "test")
  assert (split.num_classes, split.class_names, split.source) == (
    3,
    ("a", "b", "c"),
    f"idx:{system}",
  )
  info = datasets.split_info("toy_digits", "test", limit=4)
  assert (info.source, info.num_examples, info.num_classes) == (f"idx:{system}", 4, 3)
  empty = tmp_path / "user"
  empty.mkdir()
  with pytest.raises(
    datasets.DataUnavailableError, match="leave data_dir out for apt-get install toy-digits"
  ):
    datasets.load_dataset("toy_digits", "train", data_dir=empty, source="idx", fallback=False)


def test_idx_system_directory_is_the_fallback(tmp_path, monkeypatch):
  system = tmp_path / "system"
  system.mkdir()
  images, labels = _small_images(n=3)
  _write_idx_split(system, "train", images, labels)
  monkeypatch.setattr(idx, "FASHION_MNIST_DIR", system)
  empty = tmp_path / "user"
  empty.mkdir()
  split = datasets.load_dataset("fashion_mnist", "train", data_dir=empty)
  assert split.source == f"idx:{system}"
  # data_dir wins over the system directory.
  _write_idx_split(empty, "train", images[:2], labels[:2])
  assert len(datasets.load_dataset("fashion_mnist", "train", data_dir=empty).labels) == 2


@pytest.mark.parametrize(
  "type_code, dtype",
  [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32)]
  + [(0x0D, np.float32), (0x0E, np.float64)],
)
def test_read_idx_all_types(tmp_path, type_code, dtype):
  array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
  if dtype == np.uint8:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  path = _write(tmp_path / "x.idx", _idx_bytes(array, type_code), gz=False)
  result = idx.read_idx(path)
  assert result.dtype == np.dtype(dtype) and result.dtype.isnative
  np.testing.assert_array_equal(result, array)


def _corrupt_cases():
  images, labels = _small_images(n=4)
  good_images, good_labels = _idx_bytes(images), _idx_bytes(labels)
  gz_images = gzip.compress(good_images)
  flipped = bytearray(gz_images)
  flipped[len(flipped) // 2] ^= 0xFF
  return {
    "labels_file_as_images": ("images", good_labels, False, "bad magic number 0x00000801"),
    "images_file_as_labels": ("labels", good_images, False, "bad magic number 0x00000803"),
    "garbage_magic": ("images", b"\x12\x34" + good_images[2:], False, "bad IDX magic"),
    "unknown_type_code": ("images", b"\0\0\x07" + good_images[3:], False, "bad IDX magic"),
    "empty_file": ("images", b"", False, "truncated IDX header"),
    "short_header": ("images", good_images[:9], False, "truncated IDX header"),
    "truncated_data": ("images", good_images[:-5], False, "truncated: header says"),
    "trailing_bytes": ("labels", good_labels + b"\0", False, "has trailing bytes"),
    "truncated_gzip": ("images", gz_images[:-20], True, "corrupt or truncated gzip"),
    "corrupt_gzip": ("images", bytes(flipped), True, "corrupt or truncated gzip"),
    "label_out_of_range": (
      "labels",
      _idx_bytes(np.array([0, 3, 10, 1], np.uint8)),
      False,
      r"labels out of range \[0, 10\): min 0, max 10",
    ),
    "count_mismatch": ("labels", _idx_bytes(labels[:3]), False, "has 4 images but"),
    "images_2d": ("images", _idx_bytes(images[:, 0]), False, "bad magic number 0x00000802"),
  }


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
def test_corrupt_idx_files_name_the_file(tmp_path, no_system_fmnist, case):
  which, payload, already_gz, message = _corrupt_cases()[case]
  images, labels = _small_images(n=4)
  image_path, label_path = _write_idx_split(tmp_path, "test", images, labels)
  bad = image_path if which == "images" else label_path
  bad.write_bytes(payload if already_gz else gzip.compress(payload))
  with pytest.raises(ValueError, match=message) as info:
    datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  text = str(info.value)
  assert bad.name in text and "\n" not in text


def test_read_idx_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.idx: no such file"):
    idx.read_idx(tmp_path / "nothing.idx")


def test_load_idx_rejects_bad_arguments(tmp_path):
  images, labels = _small_images(n=3)
  paths = _write_idx_split(tmp_path, "train", images, labels)
  with pytest.raises(ValueError, match="class_names: expected 10 names, got 2"):
    idx.load_idx(*paths, class_names=("a", "b"))
  with pytest.raises(ValueError, match="limit: expected at least 1, got 0"):
    idx.load_idx(*paths, limit=0)
  with pytest.raises(ValueError, match="num_classes: expected at least 2"):
    idx.load_idx(*paths, num_classes=1)


# ----------------------------------------------------------------------------
# The real Fashion-MNIST files (Debian package dataset-fashion-mnist)


@pytest.mark.skipif(
  not (pathlib.Path(idx.FASHION_MNIST_DIR) / "t10k-labels-idx1-ubyte.gz").is_file(),
  reason=f"Fashion-MNIST not installed in {idx.FASHION_MNIST_DIR}"
  " (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_counts_and_balance():
  for split_name, count in [("train", 60000), ("test", 10000)]:
    split = datasets.load_dataset("fashion_mnist", split_name)
    assert split.source == f"idx:{idx.FASHION_MNIST_DIR}"
    assert split.images.shape == (count, 28, 28, 1)
    assert split.images.dtype == np.float32 and split.labels.dtype == np.int32
    assert split.images.min() == 0.0 and split.images.max() == 1.0
    np.testing.assert_array_equal(np.bincount(split.labels, minlength=10), [count // 10] * 10)


def test_idx_files_in_a_bucket(tmp_path, monkeypatch):
  images, labels = _small_images(n=3)
  (tmp_path / "bucket").mkdir()
  _write_idx_split(tmp_path / "bucket", "train", images, labels)
  with io_testing.mock_bucket(tmp_path, monkeypatch):
    found = idx.find_idx_files("gs://bucket", "train")
    assert [str(p) for p in found] == [
      "gs://bucket/train-images-idx3-ubyte.gz",
      "gs://bucket/train-labels-idx1-ubyte.gz",
    ]
    split = idx.load_idx(*found, name="mnist", split="train")
    assert split.source == "idx:gs://bucket"
    np.testing.assert_array_equal(idx.read_idx("gs://bucket/train-labels-idx1-ubyte.gz"), labels)
  np.testing.assert_array_equal(split.images[..., 0] * 255, images)
