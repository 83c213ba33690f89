"""Tests for top1_jax.data: IDX files, TFDS without TensorFlow, predictions files."""

import dataclasses
import gzip
import importlib.util
import io
import json
import os
import pathlib
import socket
import struct
import sys
import tempfile
import threading

import numpy as np
import pytest
import tensorflow_datasets as tfds
from hypothesis import given, settings
from hypothesis import strategies as st

import top1_jax
from top1_jax import data

HAS_TF = importlib.util.find_spec("tensorflow") is not None


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


@pytest.fixture
def no_system_fmnist(monkeypatch, tmp_path):
  """Points the Debian Fashion-MNIST directory at an empty folder."""
  empty = tmp_path / "no-system-fashion-mnist"
  empty.mkdir()
  monkeypatch.setattr(data, "FASHION_MNIST_DIR", empty)
  return empty


@pytest.fixture
def offline(monkeypatch):
  """No TensorFlow, no network, and TFDS must never try to download."""
  monkeypatch.setattr(data, "tensorflow_available", lambda: False)
  monkeypatch.setattr(data, "network_available", lambda *a, **k: False)

  def forbidden(*args, **kwargs):
    pytest.fail("download_and_prepare must not be called when data cannot be fetched")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", forbidden)


# ----------------------------------------------------------------------------
# IDX files


@pytest.mark.parametrize("gz", [True, False])
def test_idx_dataset_roundtrip(tmp_path, no_system_fmnist, gz):
  images, labels = _small_images()
  _write_idx_split(tmp_path, "test", images, labels, gz=gz)
  split = data.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  assert split.images.shape == (7, 4, 5, 1) and split.images.dtype == np.float32
  np.testing.assert_array_equal(split.images[..., 0] * 255, images.astype(np.float32))
  assert split.images.min() == 0.0 and split.images.max() == 1.0
  assert split.labels.dtype == np.int32
  np.testing.assert_array_equal(split.labels, labels)
  assert split.num_classes == 10 and split.class_names == data.FASHION_MNIST_CLASSES
  assert (split.name, split.split) == ("fashion_mnist", "test")
  assert split.source == f"idx:{tmp_path}"
  assert split.ids is None


def test_idx_limit_keeps_the_first_examples(tmp_path, no_system_fmnist):
  images, labels = _small_images()
  _write_idx_split(tmp_path, "train", images, labels)
  split = data.load_dataset("mnist", "train", data_dir=tmp_path, limit=3)
  np.testing.assert_array_equal(split.labels, labels[:3])
  np.testing.assert_array_equal(split.images[..., 0] * 255, images[:3])
  assert split.class_names == tuple("0123456789")


def test_idx_system_directory_is_the_fallback(tmp_path, monkeypatch):
  system = tmp_path / "system"
  system.mkdir()
  images, labels = _small_images(n=3)
  _write_idx_split(system, "train", images, labels)
  monkeypatch.setattr(data, "FASHION_MNIST_DIR", system)
  empty = tmp_path / "user"
  empty.mkdir()
  split = data.load_dataset("fashion_mnist", "train", data_dir=empty)
  assert split.source == f"idx:{system}"
  # data_dir wins over the system directory.
  _write_idx_split(empty, "train", images[:2], labels[:2])
  assert len(data.load_dataset("fashion_mnist", "train", data_dir=empty).labels) == 2


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
  result = data.read_idx(path)
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
    data.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  text = str(info.value)
  assert bad.name in text and "\n" not in text


def test_read_idx_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.idx: no such file"):
    data.read_idx(tmp_path / "nothing.idx")


def test_load_idx_rejects_bad_arguments(tmp_path):
  images, labels = _small_images(n=3)
  paths = _write_idx_split(tmp_path, "train", images, labels)
  with pytest.raises(ValueError, match="class_names: expected 10 names, got 2"):
    data.load_idx(*paths, class_names=("a", "b"))
  with pytest.raises(ValueError, match="limit: expected at least 1, got 0"):
    data.load_idx(*paths, limit=0)
  with pytest.raises(ValueError, match="num_classes: expected at least 2"):
    data.load_idx(*paths, num_classes=1)


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
    data.load_dataset(data_dir=tmp_path, **kwargs)


def test_idx_only_source_without_files(tmp_path, no_system_fmnist):
  with pytest.raises(data.DataUnavailableError) as info:
    data.load_dataset("fashion_mnist", "train", data_dir=tmp_path, source="idx")
  text = str(info.value)
  assert "train-images-idx3-ubyte[.gz]" in text and str(tmp_path) in text
  assert str(no_system_fmnist) in text and "apt-get install dataset-fashion-mnist" in text


# ----------------------------------------------------------------------------
# No local data and no network: one clear error, at once


def _assert_one_clean_line(error: BaseException) -> str:
  text = str(error)
  assert "\n" not in text
  # No chained traceback from inside TFDS is shown.
  assert error.__cause__ is None
  assert error.__context__ is None or error.__suppress_context__
  return text


def test_fashion_mnist_offline_without_data(tmp_path, no_system_fmnist, offline):
  with pytest.raises(data.DataUnavailableError) as info:
    data.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  text = _assert_one_clean_line(info.value)
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


@pytest.mark.parametrize(
  "has_tf, has_network, present, absent",
  [
    (False, False, ["TensorFlow is not installed", "network is unreachable"], []),
    (False, True, ["TensorFlow is not installed"], ["network"]),
    (True, False, ["network is unreachable"], ["TensorFlow"]),
  ],
)
def test_tfds_says_which_requirement_is_missing(
  tmp_path, offline, monkeypatch, has_tf, has_network, present, absent
):
  monkeypatch.setattr(data, "tensorflow_available", lambda: has_tf)
  monkeypatch.setattr(data, "network_available", lambda *a, **k: has_network)
  with pytest.raises(data.DataUnavailableError) as info:
    data.load_dataset("cifar10", "test", data_dir=tmp_path)
  text = _assert_one_clean_line(info.value)
  assert text.startswith("cifar10 (test): no prepared TFDS dataset in")
  assert f"{tmp_path}/cifar10/" in text and "fashion_mnist" in text
  for word in present:
    assert word in text
  for word in absent:
    assert word not in text.split("Fix:")[0]


def test_manual_download_dataset_names_the_manual_dir(tmp_path, offline, monkeypatch):
  monkeypatch.setattr(data, "tensorflow_available", lambda: True)
  with pytest.raises(data.DataUnavailableError) as info:
    data.load_dataset("imagenet2012", "validation", data_dir=tmp_path, limit=5)
  text = _assert_one_clean_line(info.value)
  assert f"needs a manual download into {tmp_path}/downloads/manual" in text
  assert "ILSVRC2012_img_val.tar" in text


def test_prepare_is_attempted_when_possible_and_failures_are_one_line(tmp_path, monkeypatch):
  calls = []

  def failing_prepare(self, *args, **kwargs):
    calls.append(kwargs)
    raise RuntimeError("connection reset\nby peer (deep inside TFDS)")

  monkeypatch.setattr(data, "tensorflow_available", lambda: True)
  monkeypatch.setattr(data, "network_available", lambda *a, **k: True)
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", failing_prepare)
  with pytest.raises(data.DataUnavailableError) as info:
    data.load_dataset("cifar10", "test", data_dir=tmp_path)
  text = _assert_one_clean_line(info.value)
  assert "failed to download and prepare" in text and "connection reset by peer" in text
  assert calls == [{"file_format": "array_record"}]


def test_unknown_dataset_name(tmp_path):
  with pytest.raises(ValueError, match="name: unknown dataset 'no_such_dataset_xyz'"):
    data.load_dataset("no_such_dataset_xyz", "test", data_dir=tmp_path)


def test_missing_tfds_import_is_one_clear_error(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
  with pytest.raises(data.DataUnavailableError, match="tensorflow_datasets cannot be"):
    data.load_dataset("cifar10", "test", data_dir=tmp_path)


def test_network_probe_true_for_a_listening_port():
  with socket.create_server(("127.0.0.1", 0)) as server:
    port = server.getsockname()[1]
    assert data.network_available("127.0.0.1", port, timeout=2.0)


def test_network_probe_false_for_a_closed_port():
  with socket.create_server(("127.0.0.1", 0)) as server:
    port = server.getsockname()[1]
  assert not data.network_available("127.0.0.1", port, timeout=2.0)


def test_network_probe_does_not_hang_on_a_stuck_resolver(monkeypatch):
  release = threading.Event()

  def stuck(*args, **kwargs):
    release.wait(30)
    raise OSError("resolver gave up")

  monkeypatch.setattr(data.socket, "create_connection", stuck)
  try:
    assert not data.network_available("example.invalid", 443, timeout=0.2)
  finally:
    release.set()


def test_network_probe_goes_through_the_proxy(monkeypatch):
  seen = []

  class Connection:
    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

  def record(address, timeout):
    seen.append(address)
    return Connection()

  monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.internal:3128")
  monkeypatch.setattr(data.socket, "create_connection", record)
  assert data.network_available(timeout=1.0)
  assert seen == [("proxy.internal", 3128)]


# ----------------------------------------------------------------------------
# TFDS: a real prepared ArrayRecord dataset, built and read without TensorFlow


def _png(image: np.ndarray) -> bytes:
  from PIL import Image

  buffer = io.BytesIO()
  Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, "PNG")
  return buffer.getvalue()


def _tiny_images(split: str, count: int) -> list[tuple[str, np.ndarray, int]]:
  rng = np.random.default_rng(len(split) + count)
  return [
    (f"{split}_{i:05d}", rng.integers(0, 256, (6, 5, 1), dtype=np.uint8), i % 4)
    for i in range(count)
  ]


class Top1TinyImages(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST-like features (PNG images, a ClassLabel and an id)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {
          "id": tfds.features.Text(),
          "image": tfds.features.Image(shape=(6, 5, 1)),
          "label": tfds.features.ClassLabel(names=["a", "b", "c", "d"]),
        }
      ),
      supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    return {
      "train": self._generate_examples("train", 9),
      "test": self._generate_examples("test", 5),
    }

  def _generate_examples(self, split, count):
    # PNG bytes, not arrays: encoding arrays would need TensorFlow.
    for key, image, label in _tiny_images(split, count):
      yield key, {"id": key, "image": _png(image), "label": label}


class Top1TinyVarsize(tfds.core.GeneratorBasedBuilder):
  """RGB images of different sizes (like ImageNet), constant colour per image."""

  VERSION = tfds.core.Version("1.0.0")
  SIZES = [(8, 12), (10, 6), (7, 7)]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Image(shape=(None, None, 3)),
          "label": tfds.features.ClassLabel(num_classes=3),
        }
      ),
    )

  def _split_generators(self, dl_manager):
    return {"validation": self._generate_examples()}

  def _generate_examples(self):
    for i, (height, width) in enumerate(self.SIZES):
      image = np.full((height, width, 3), [40 * i, 100, 200], np.uint8)
      yield i, {"image": _png(image), "label": i}


def _prepare(builder_cls, data_dir: pathlib.Path) -> None:
  builder_cls(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


def test_tfds_prepared_array_record_is_read_without_tensorflow(tmp_path):
  _prepare(Top1TinyImages, tmp_path)
  split = data.load_dataset("top1_tiny_images", "test", data_dir=tmp_path)
  assert split.images.shape == (5, 6, 5, 1) and split.images.dtype == np.float32
  assert split.labels.dtype == np.int32 and split.num_classes == 4
  assert split.class_names == ("a", "b", "c", "d")
  assert split.source.startswith(f"tfds:{tmp_path}/top1_tiny_images/1.0.0")
  expected = {key: (image, label) for key, image, label in _tiny_images("test", 5)}
  assert sorted(split.ids) == sorted(expected)
  for key, image, label in zip(split.ids, split.images, split.labels, strict=True):
    np.testing.assert_array_equal(image * 255, expected[key][0].astype(np.float32))
    assert label == expected[key][1]
  limited = data.load_dataset("top1_tiny_images", "train", data_dir=tmp_path, limit=4)
  assert limited.images.shape == (4, 6, 5, 1)
  if not HAS_TF:
    assert "tensorflow" not in sys.modules


def test_tfds_unknown_split(tmp_path):
  _prepare(Top1TinyImages, tmp_path)
  with pytest.raises(ValueError, match=r"split: top1_tiny_images has splits \['train', 'test'\]"):
    data.load_dataset("top1_tiny_images", "validation", data_dir=tmp_path)


def test_tfds_variable_size_images_need_image_size(tmp_path):
  _prepare(Top1TinyVarsize, tmp_path)
  with pytest.raises(ValueError, match=r"images have different shapes.*image_size="):
    data.load_dataset("top1_tiny_varsize", "validation", data_dir=tmp_path)
  split = data.load_dataset("top1_tiny_varsize", "validation", data_dir=tmp_path, image_size=(4, 5))
  assert split.images.shape == (3, 4, 5, 3)
  for image, label in zip(split.images, split.labels, strict=True):
    # A constant image stays constant through resize and crop.
    np.testing.assert_allclose(
      image * 255, np.broadcast_to([40 * label, 100, 200], image.shape), atol=1e-4
    )


@pytest.mark.skipif(HAS_TF, reason="checks the error shown when TensorFlow is missing")
def test_tfds_tfrecord_data_needs_tensorflow(tmp_path):
  _prepare(Top1TinyImages, tmp_path)
  info_path = tmp_path / "top1_tiny_images" / "1.0.0" / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info["fileFormat"] = "tfrecord"  # as prepared by a TensorFlow user
  info_path.write_text(json.dumps(info))
  with pytest.raises(data.DataUnavailableError) as info_error:
    data.load_dataset("top1_tiny_images", "test", data_dir=tmp_path)
  text = _assert_one_clean_line(info_error.value)
  assert "is tfrecord, which needs TensorFlow" in text and "top1_jax[tf]" in text


# ----------------------------------------------------------------------------
# TFDS: the registered builders under tfds.testing.mock_data (no TensorFlow)


def _write_tfds_metadata(data_dir: pathlib.Path, name: str, sizes: dict[str, int]):
  """Writes the metadata files of a prepared dataset (no records) for mock_data."""
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


@pytest.mark.parametrize(
  "name, shape, source",
  [("cifar10", (32, 32, 3), "auto"), ("fashion_mnist", (28, 28, 1), "tfds")],
)
def test_tfds_mock_data_registered_builders(tmp_path, no_system_fmnist, name, shape, source):
  # mock_data's default policy has no metadata, so the dataset looks unprepared
  # (is_prepared() is False); with real metadata files it reads like prepared
  # data, through the same data-source path, and needs no TensorFlow.
  metadata = tmp_path / "metadata"
  _write_tfds_metadata(metadata, name, {"train": 50000, "test": 10000})
  policy = tfds.testing.MockPolicy.USE_FILES
  with tfds.testing.mock_data(num_examples=12, policy=policy, data_dir=str(metadata)):
    split = data.load_dataset(name, "test", data_dir=tmp_path / "user", source=source)
    limited = data.load_dataset(name, "test", data_dir=tmp_path / "user", limit=5)
  assert split.images.shape == (12, *shape) and split.images.dtype == np.float32
  assert 0.0 <= split.images.min() and split.images.max() <= 1.0
  assert split.labels.dtype == np.int32 and split.num_classes == 10
  assert split.labels.min() >= 0 and split.labels.max() < 10
  assert split.source.startswith(f"tfds:{metadata}/{name}/")
  assert (split.ids is not None) == (name == "cifar10")
  assert limited.images.shape == (5, *shape)
  np.testing.assert_array_equal(limited.images, split.images[:5])
  if not HAS_TF:
    assert "tensorflow" not in sys.modules


def test_fashion_mnist_falls_back_to_tfds_when_no_idx_files(tmp_path, no_system_fmnist):
  metadata = tmp_path / "metadata"
  _write_tfds_metadata(metadata, "fashion_mnist", {"train": 60000, "test": 10000})
  policy = tfds.testing.MockPolicy.USE_FILES
  with tfds.testing.mock_data(num_examples=3, policy=policy, data_dir=str(metadata)):
    split = data.load_dataset("fashion_mnist", "train", data_dir=tmp_path)
  assert split.source.startswith("tfds:") and split.images.shape == (3, 28, 28, 1)


# ----------------------------------------------------------------------------
# The real Fashion-MNIST files (Debian package dataset-fashion-mnist)


@pytest.mark.skipif(
  not (pathlib.Path(data.FASHION_MNIST_DIR) / "t10k-labels-idx1-ubyte.gz").is_file(),
  reason=f"Fashion-MNIST not installed in {data.FASHION_MNIST_DIR}"
  " (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_counts_and_balance():
  for split_name, count in [("train", 60000), ("test", 10000)]:
    split = data.load_dataset("fashion_mnist", split_name)
    assert split.source == f"idx:{data.FASHION_MNIST_DIR}"
    assert split.images.shape == (count, 28, 28, 1)
    assert split.images.dtype == np.float32 and split.labels.dtype == np.int32
    assert split.images.min() == 0.0 and split.images.max() == 1.0
    np.testing.assert_array_equal(np.bincount(split.labels, minlength=10), [count // 10] * 10)


# ----------------------------------------------------------------------------
# Batches


def test_iterate_batches():
  images, labels = np.arange(10, dtype=np.float32)[:, None, None, None], np.arange(10)
  split = data.DatasetSplit(images, labels, 10, "toy", "train", "memory", tuple("0123456789"))
  batches = list(data.iterate_batches(split, 4))
  assert [len(y) for _, y in batches] == [4, 4, 2]
  np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), labels)
  dropped = list(data.iterate_batches(split, 4, drop_remainder=True))
  assert [len(y) for _, y in dropped] == [4, 4]
  first = np.concatenate([y for _, y in data.iterate_batches(split, 3, seed=1)])
  again = np.concatenate([y for _, y in data.iterate_batches(split, 3, seed=1)])
  np.testing.assert_array_equal(first, again)
  np.testing.assert_array_equal(np.sort(first), labels)
  assert not np.array_equal(first, labels)
  for x, y in data.iterate_batches(split, 3, seed=2):
    np.testing.assert_array_equal(x[:, 0, 0, 0], y)  # images stay with labels
  with pytest.raises(ValueError, match="batch_size: expected at least 1, got 0"):
    next(data.iterate_batches(split, 0))


# ----------------------------------------------------------------------------
# Predictions files


N, K, S = 6, 3, 2


def _softmax(logits):
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _fields(seed: int = 0) -> dict:
  """Every field of a valid predictions file, as an external writer would save it."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(S, N, K)).astype(np.float32)
  return {
    "labels": np.array([0, 1, 2, 0, 1, 2], np.int64),
    "logits": logits,
    "mean_probs": _softmax(logits).mean(0).astype(np.float32),
    "score_entropy": rng.random(N).astype(np.float32),
    "human_probs": rng.dirichlet(np.ones(K), size=N).astype(np.float32),
    "meta": np.array(json.dumps({"dataset": "toy", "split": "test", "seed": 3})),
  }


def _set(key, value):
  def apply(fields):
    fields[key] = value(fields) if callable(value) else value

  return apply


def _drop(*keys):
  def apply(fields):
    for key in keys:
      del fields[key]

  return apply


def _poke(key, index, value):
  def apply(fields):
    fields[key] = fields[key].copy()
    fields[key][index] = value

  return apply


MALFORMED = {
  "missing_labels": (_drop("labels"), "labels: missing field"),
  "no_logits_no_probs": (_drop("logits", "mean_probs"), "logits/mean_probs: expected"),
  "labels_float": (
    _set("labels", lambda f: f["labels"].astype(float)),
    "labels: expected an integer dtype",
  ),
  "labels_2d": (_set("labels", lambda f: f["labels"][:, None]), "labels: expected a 1-D array"),
  "labels_too_big": (_poke("labels", 2, 3), r"labels: labels out of range \[0, 3\): min 0, max 3"),
  "labels_negative": (_poke("labels", 0, -1), r"labels: labels out of range \[0, 3\): min -1"),
  "labels_empty": (
    lambda f: f.update(labels=np.zeros(0, int), logits=np.zeros((1, 0, 3), np.float32)),
    "labels: expected at least one example",
  ),
  "logits_1d": (_set("logits", np.zeros(6, np.float32)), "logits: expected a 2-D or 3-D array"),
  "logits_4d": (
    _set("logits", np.zeros((1, 2, 6, 3), np.float32)),
    "logits: expected a 2-D or 3-D",
  ),
  "logits_wrong_n": (
    _set("logits", lambda f: f["logits"][:, :5]),
    r"logits: expected N=6 .* got shape \(2, 5, 3\)",
  ),
  "logits_int": (
    _set("logits", np.zeros((2, 6, 3), np.int32)),
    "logits: expected a float dtype, got int32",
  ),
  "logits_nan": (
    _poke("logits", (1, 4, 2), np.nan),
    "logits: 1 non-finite value.*flat index 32: nan",
  ),
  "logits_inf": (_poke("logits", (0, 0, 0), -np.inf), "logits: 1 non-finite value.*-inf"),
  "logits_one_class": (
    lambda f: f.update(
      labels=np.zeros(6, int),
      logits=np.zeros((1, 6, 1), np.float32),
      mean_probs=np.ones((6, 1), np.float32),
    ),
    "logits: expected at least 2 classes, got K=1",
  ),
  "logits_no_samples": (
    _set("logits", np.zeros((0, 6, 3), np.float32)),
    "logits: expected at least one sample",
  ),
  "probs_not_summing": (
    _poke("mean_probs", (3, 0), 0.9),
    "mean_probs: each row must sum to 1, row 3 sums to",
  ),
  "probs_negative": (
    _poke("mean_probs", (1, 1), -0.1),
    r"mean_probs: probabilities must lie in \[0, 1\]",
  ),
  "probs_wrong_k": (
    _set("mean_probs", np.full((6, 4), 0.25, np.float32)),
    "mean_probs: expected K=3",
  ),
  "probs_wrong_n": (
    _set("mean_probs", lambda f: f["mean_probs"][:4]),
    "mean_probs: expected 6 rows",
  ),
  "probs_nan": (_poke("mean_probs", (0, 0), np.nan), "mean_probs: 1 non-finite"),
  "probs_3d": (
    _set("mean_probs", lambda f: f["mean_probs"][None]),
    "mean_probs: expected a 2-D array",
  ),
  "score_wrong_length": (
    _set("score_entropy", np.zeros(5, np.float32)),
    r"score_entropy: expected shape \(6,\)",
  ),
  "score_nan": (_poke("score_entropy", 5, np.nan), "score_entropy: 1 non-finite"),
  "score_2d": (
    _set("score_entropy", np.zeros((6, 1), np.float32)),
    "score_entropy: expected a 1-D",
  ),
  "score_strings": (
    _set("score_entropy", np.array(["a"] * 6)),
    "score_entropy: expected a float dtype",
  ),
  "score_empty_name": (_set("score_", np.zeros(6, np.float32)), "score_: score names must be"),
  "score_bad_name": (_set("score_a-b", np.zeros(6, np.float32)), "score_a-b: score names must be"),
  "human_wrong_n": (
    _set("human_probs", lambda f: f["human_probs"][1:]),
    "human_probs: expected 6 rows",
  ),
  "human_not_summing": (
    _poke("human_probs", (2, 2), 0.0),
    "human_probs: each row must sum to 1, row 2",
  ),
  "human_wrong_k": (
    _set("human_probs", np.full((6, 2), 0.5, np.float32)),
    "human_probs: expected K=3",
  ),
  "meta_bad_json": (_set("meta", np.array("{dataset: toy")), "meta: invalid JSON"),
  "meta_not_object": (_set("meta", np.array("[1, 2]")), "meta: expected a JSON object, got list"),
  "meta_not_string": (_set("meta", np.arange(3)), "meta: expected a JSON string"),
  "meta_nan": (_set("meta", np.array('{"seed": 1, "x": NaN}')), "meta: not JSON-serializable"),
  "meta_dropout_range": (
    _set("meta", np.array('{"dropout_rate": 1.5}')),
    r"meta: dropout_rate must be in \[0, 1\)",
  ),
  "meta_ensemble_type": (
    _set("meta", np.array('{"ensemble_size": "five"}')),
    "meta: ensemble_size must be int",
  ),
  "meta_seed_bool": (_set("meta", np.array('{"seed": true}')), "meta: seed must be int"),
  "unknown_field": (_set("logit", np.zeros(3)), "logit: unexpected field"),
  "pickled_object": (
    _set("logits", lambda f: np.array([object()] * 2, dtype=object)),
    "field 'logits' cannot be read",
  ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_load_rejects_malformed_files(tmp_path, case):
  mutate, message = MALFORMED[case]
  fields = _fields()
  mutate(fields)
  path = tmp_path / "preds.npz"
  np.savez(path, **fields)
  with pytest.raises(ValueError, match=message) as info:
    data.load_predictions(path)
  text = str(info.value)
  assert text.startswith(f"{path}: ") and "\n" not in text


def test_save_and_load_roundtrip_all_fields(tmp_path):
  fields = _fields()
  predictions = data.Predictions(
    labels=fields["labels"],
    logits=fields["logits"],
    mean_probs=fields["mean_probs"],
    scores={"entropy": fields["score_entropy"]},
    human_probs=fields["human_probs"],
    meta={"dataset": "toy", "seed": np.int64(3), "dropout_rate": 0.1, "tags": ["a"]},
  )
  path = data.save_predictions(tmp_path / "out" / "preds.npz", predictions)
  assert path == tmp_path / "out" / "preds.npz" and sorted(os.listdir(path.parent)) == ["preds.npz"]
  loaded = data.load_predictions(path)
  assert loaded.labels.dtype == np.int32
  np.testing.assert_array_equal(loaded.labels, fields["labels"])
  for key in ("logits", "mean_probs", "human_probs"):
    assert getattr(loaded, key).dtype == np.float32
    np.testing.assert_array_equal(getattr(loaded, key), fields[key])
  assert list(loaded.scores) == ["entropy"]
  np.testing.assert_array_equal(loaded.scores["entropy"], fields["score_entropy"])
  assert loaded.meta == {
    "dataset": "toy",
    "seed": 3,
    "dropout_rate": 0.1,
    "tags": ["a"],
    "version": top1_jax.__version__,
  }
  assert (loaded.num_examples, loaded.num_classes, loaded.num_samples) == (N, K, S)
  with np.load(path, allow_pickle=False) as raw:  # plain arrays, readable anywhere
    assert sorted(raw.files) == sorted(
      ["labels", "logits", "mean_probs", "score_entropy", "human_probs", "meta"]
    )


def test_roundtrip_mean_probs_only_compressed(tmp_path):
  fields = _fields()
  predictions = data.Predictions(
    labels=fields["labels"],
    mean_probs=fields["mean_probs"].astype(np.float64),
    meta={"version": "mine"},
  )
  path = data.save_predictions(tmp_path / "p.npz", predictions, compress=True)
  loaded = data.load_predictions(path)
  assert loaded.logits is None and loaded.human_probs is None and loaded.scores == {}
  assert loaded.num_samples is None and loaded.num_classes == K
  assert loaded.mean_probs.dtype == np.float32 and loaded.meta == {"version": "mine"}
  np.testing.assert_allclose(loaded.mean_probs, fields["mean_probs"], rtol=1e-6)


def test_external_writer_without_meta_and_2d_logits(tmp_path):
  path = tmp_path / "external.npz"
  logits = np.random.default_rng(1).normal(size=(N, K))  # float64, plain model
  np.savez(path, labels=np.arange(N) % K, logits=logits)
  loaded = data.load_predictions(path)
  assert loaded.logits.shape == (1, N, K) and loaded.logits.dtype == np.float32
  assert loaded.meta == {}


@settings(max_examples=25)
@given(
  num_samples=st.integers(1, 4),
  num_examples=st.integers(1, 20),
  num_classes=st.integers(2, 7),
  seed=st.integers(0, 2**16),
  with_probs=st.booleans(),
)
def test_roundtrip_property(num_samples, num_examples, num_classes, seed, with_probs):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(num_samples, num_examples, num_classes)) * 10).astype(np.float32)
  predictions = data.Predictions(
    labels=rng.integers(0, num_classes, num_examples),
    logits=logits,
    mean_probs=_softmax(logits).mean(0) if with_probs else None,
    scores={"u": rng.random(num_examples), "v2": -rng.random(num_examples)},
    meta={"seed": seed},
  )
  with tempfile.TemporaryDirectory() as directory:
    loaded = data.load_predictions(
      data.save_predictions(pathlib.Path(directory) / "p.npz", predictions)
    )
  np.testing.assert_array_equal(loaded.logits, predictions.logits)
  np.testing.assert_array_equal(loaded.labels, predictions.labels)
  assert (loaded.mean_probs is None) == (not with_probs)
  for name in ("u", "v2"):
    np.testing.assert_array_equal(loaded.scores[name], predictions.scores[name])
  assert loaded.meta["seed"] == seed


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"meta": {"model": object()}}, "meta: not JSON-serializable"),
    ({"meta": ["not", "a", "dict"]}, "meta: expected a dict"),
    ({"meta": {1: "x"}}, "meta: keys must be strings"),
    ({"scores": [1, 2]}, "scores: expected a dict"),
    ({"scores": {"u": None}}, "score_u: expected an array, got None"),
    ({"labels": None}, "labels: expected an array, got None"),
  ],
)
def test_constructor_validates(kwargs, message):
  fields = {"labels": [0, 1], "logits": np.zeros((1, 2, 2), np.float32), **kwargs}
  with pytest.raises(ValueError, match=message):
    data.Predictions(**fields)


def test_replace_revalidates_and_save_needs_predictions(tmp_path):
  predictions = data.Predictions(labels=[0, 1], logits=np.zeros((2, 2), np.float32))
  with pytest.raises(ValueError, match="human_probs: expected 2 rows"):
    dataclasses.replace(predictions, human_probs=np.full((3, 2), 0.5))
  with pytest.raises(ValueError, match="predictions: expected a top1_jax.data.Predictions"):
    data.save_predictions(tmp_path / "p.npz", {"labels": [0, 1]})


def test_load_errors_for_files_that_are_not_predictions(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.npz: predictions file not found"):
    data.load_predictions(tmp_path / "missing.npz")
  text_file = tmp_path / "notes.npz"
  text_file.write_text("hello")
  with pytest.raises(ValueError, match="notes.npz: not a readable .npz"):
    data.load_predictions(text_file)
  single = tmp_path / "single.npy"
  np.save(single, np.zeros(3))
  with pytest.raises(ValueError, match="single.npy: expected an .npz archive"):
    data.load_predictions(single)
  good = tmp_path / "good.npz"
  np.savez(good, **_fields())
  truncated = tmp_path / "truncated.npz"
  truncated.write_bytes(good.read_bytes()[:-200])
  with pytest.raises(ValueError, match="truncated.npz"):
    data.load_predictions(truncated)


@pytest.mark.parametrize("error", [OSError("No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("exists", [False, True])
def test_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch, error, exists):
  path = tmp_path / "preds.npz"
  fields = _fields()
  predictions = data.Predictions(labels=fields["labels"], logits=fields["logits"])
  if exists:
    data.save_predictions(path, predictions)
  before = path.read_bytes() if exists else None

  def savez_then_fail(file, **arrays):
    file.write(b"PK\x03\x04 half of an archive")
    raise error

  monkeypatch.setattr(np, "savez", savez_then_fail)
  with pytest.raises(type(error)):
    data.save_predictions(path, predictions)
  assert os.listdir(tmp_path) == (["preds.npz"] if exists else [])
  if exists:
    assert path.read_bytes() == before
    monkeypatch.undo()
    np.testing.assert_array_equal(data.load_predictions(path).logits, fields["logits"])


# ----------------------------------------------------------------------------
# Human labels


def test_attach_human_probs(tmp_path):
  fields = _fields()
  preds_path = data.save_predictions(
    tmp_path / "preds.npz", data.Predictions(labels=fields["labels"], logits=fields["logits"])
  )
  human_path = tmp_path / "cifar10h-probs.npy"
  np.save(human_path, fields["human_probs"].astype(np.float64))
  out = data.attach_human_probs(preds_path, human_path, output_path=tmp_path / "with_human.npz")
  np.testing.assert_allclose(data.load_predictions(out).human_probs, fields["human_probs"])
  assert data.load_predictions(preds_path).human_probs is None  # input untouched
  data.attach_human_probs(preds_path, fields["human_probs"])  # in place, from an array
  np.testing.assert_array_equal(
    data.load_predictions(preds_path).human_probs, fields["human_probs"]
  )
  assert sorted(os.listdir(tmp_path)) == ["cifar10h-probs.npy", "preds.npz", "with_human.npz"]


def test_attach_human_probs_checks_the_shape(tmp_path):
  fields = _fields()
  preds_path = data.save_predictions(
    tmp_path / "preds.npz", data.Predictions(labels=fields["labels"], logits=fields["logits"])
  )
  human_path = tmp_path / "h.npy"
  np.save(human_path, np.full((N + 1, K), 1 / K))
  with pytest.raises(
    ValueError, match=r"h.npy: human_probs: expected num_examples=6, got shape \(7, 3\)"
  ):
    data.attach_human_probs(preds_path, human_path)
  with pytest.raises(ValueError, match="human_probs: expected K=3"):
    data.attach_human_probs(preds_path, np.full((N, 2), 0.5))


@pytest.mark.parametrize(
  "array, message",
  [
    (np.array([[30, 21], [0, 51]]), "looks like annotator counts.*divide each row"),
    (np.array([[0.5, np.nan]]), "human_probs: 1 non-finite"),
    (np.array([0.5, 0.5]), "human_probs: expected a 2-D array"),
    (np.array([[0.5, 0.6]]), "human_probs: each row must sum to 1"),
  ],
)
def test_load_human_probs_errors(tmp_path, array, message):
  path = tmp_path / "h.npy"
  np.save(path, array)
  with pytest.raises(ValueError, match=message) as info:
    data.load_human_probs(path)
  assert str(info.value).startswith(f"{path}: ")


def test_load_human_probs_one_hot_rows_are_probabilities(tmp_path):
  path = tmp_path / "h.npy"
  np.save(path, np.eye(3))
  probs = data.load_human_probs(path, num_examples=3, num_classes=3)
  assert probs.dtype == np.float32
  np.testing.assert_array_equal(probs, np.eye(3))
