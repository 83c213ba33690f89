"""Tests for top1_jax.io.tfds: TFDS without TensorFlow, what this machine can do."""

import importlib.util
import io
import json
import pathlib
import socket
import sys
import threading

import io_testing
import numpy as np
import pytest
import tensorflow_datasets as tfds

from top1_jax.io import datasets
from top1_jax.io import tfds as tfds_lib

HAS_TF = importlib.util.find_spec("tensorflow") is not None


# ----------------------------------------------------------------------------
# No local data and no network: one clear error, at once


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
  monkeypatch.setattr(tfds_lib, "tensorflow_available", lambda: has_tf)
  monkeypatch.setattr(tfds_lib, "network_available", lambda *a, **k: has_network)
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("cifar10", "test", data_dir=tmp_path)
  text = io_testing.assert_one_clean_line(info.value)
  assert text.startswith("cifar10 (test): no prepared TFDS dataset in")
  assert f"{tmp_path}/cifar10/" in text and "fashion_mnist" in text
  for word in present:
    assert word in text
  for word in absent:
    assert word not in text.split("Fix:")[0]


def test_manual_download_dataset_names_the_manual_dir(tmp_path, offline, monkeypatch):
  monkeypatch.setattr(tfds_lib, "tensorflow_available", lambda: True)
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("imagenet2012", "validation", data_dir=tmp_path, limit=5)
  text = io_testing.assert_one_clean_line(info.value)
  assert f"needs a manual download into {tmp_path}/downloads/manual" in text
  assert "ILSVRC2012_img_val.tar" in text


def test_prepare_is_attempted_when_possible_and_failures_are_one_line(tmp_path, monkeypatch):
  calls = []

  def failing_prepare(self, *args, **kwargs):
    calls.append(kwargs)
    raise RuntimeError("connection reset\nby peer (deep inside TFDS)")

  monkeypatch.setattr(tfds_lib, "tensorflow_available", lambda: True)
  monkeypatch.setattr(tfds_lib, "network_available", lambda *a, **k: True)
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", failing_prepare)
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("cifar10", "test", data_dir=tmp_path)
  text = io_testing.assert_one_clean_line(info.value)
  assert "failed to download and prepare" in text and "connection reset by peer" in text
  assert calls == [{"file_format": "array_record"}]


def test_unknown_dataset_name(tmp_path):
  with pytest.raises(ValueError, match="name: unknown dataset 'no_such_dataset_xyz'"):
    datasets.load_dataset("no_such_dataset_xyz", "test", data_dir=tmp_path)


def test_missing_tfds_import_is_one_clear_error(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
  with pytest.raises(datasets.DataUnavailableError, match="tensorflow_datasets cannot be"):
    datasets.load_dataset("cifar10", "test", data_dir=tmp_path)


def test_network_probe_true_for_a_listening_port():
  with socket.create_server(("127.0.0.1", 0)) as server:
    port = server.getsockname()[1]
    assert tfds_lib.network_available("127.0.0.1", port, timeout=2.0)


def test_network_probe_false_for_a_closed_port():
  with socket.create_server(("127.0.0.1", 0)) as server:
    port = server.getsockname()[1]
  assert not tfds_lib.network_available("127.0.0.1", port, timeout=2.0)


def test_network_probe_does_not_hang_on_a_stuck_resolver(monkeypatch):
  release = threading.Event()

  def stuck(*args, **kwargs):
    release.wait(30)
    raise OSError("resolver gave up")

  monkeypatch.setattr(tfds_lib.socket, "create_connection", stuck)
  try:
    assert not tfds_lib.network_available("example.invalid", 443, timeout=0.2)
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
  monkeypatch.setattr(tfds_lib.socket, "create_connection", record)
  assert tfds_lib.network_available(timeout=1.0)
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
  split = datasets.load_dataset("top1_tiny_images", "test", data_dir=tmp_path)
  assert split.images.shape == (5, 6, 5, 1) and split.images.dtype == np.float32
  assert split.labels.dtype == np.int32 and split.num_classes == 4
  assert split.class_names == ("a", "b", "c", "d")
  assert split.source.startswith(f"tfds:{tmp_path}/top1_tiny_images/1.0.0")
  expected = {key: (image, label) for key, image, label in _tiny_images("test", 5)}
  assert sorted(split.ids) == sorted(expected)
  for key, image, label in zip(split.ids, split.images, split.labels, strict=True):
    np.testing.assert_array_equal(image * 255, expected[key][0].astype(np.float32))
    assert label == expected[key][1]
  limited = datasets.load_dataset("top1_tiny_images", "train", data_dir=tmp_path, limit=4)
  assert limited.images.shape == (4, 6, 5, 1)
  if not HAS_TF:
    assert "tensorflow" not in sys.modules


def test_tfds_unknown_split(tmp_path):
  _prepare(Top1TinyImages, tmp_path)
  with pytest.raises(ValueError, match=r"split: top1_tiny_images has splits \['train', 'test'\]"):
    datasets.load_dataset("top1_tiny_images", "validation", data_dir=tmp_path)


def test_tfds_variable_size_images_need_image_size(tmp_path):
  _prepare(Top1TinyVarsize, tmp_path)
  with pytest.raises(ValueError, match=r"images have different shapes.*image_size="):
    datasets.load_dataset("top1_tiny_varsize", "validation", data_dir=tmp_path)
  split = datasets.load_dataset(
    "top1_tiny_varsize", "validation", data_dir=tmp_path, image_size=(4, 5)
  )
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
  with pytest.raises(datasets.DataUnavailableError) as info_error:
    datasets.load_dataset("top1_tiny_images", "test", data_dir=tmp_path)
  text = io_testing.assert_one_clean_line(info_error.value)
  assert "is tfrecord, which needs TensorFlow" in text and "top1_jax[tf]" in text


# ----------------------------------------------------------------------------
# TFDS: the registered builders under tfds.testing.mock_data (no TensorFlow)


@pytest.mark.parametrize(
  "name, shape, source",
  [("cifar10", (32, 32, 3), "auto"), ("fashion_mnist", (28, 28, 1), "tfds")],
)
def test_tfds_mock_data_registered_builders(tmp_path, no_system_fmnist, name, shape, source):
  # mock_data's default policy has no metadata, so the dataset looks unprepared
  # (is_prepared() is False); with real metadata files it reads like prepared
  # data, through the same data-source path, and needs no TensorFlow.
  metadata = tmp_path / "metadata"
  io_testing.write_tfds_metadata(metadata, name, {"train": 50000, "test": 10000})
  policy = tfds.testing.MockPolicy.USE_FILES
  with tfds.testing.mock_data(num_examples=12, policy=policy, data_dir=str(metadata)):
    split = datasets.load_dataset(name, "test", data_dir=tmp_path / "user", source=source)
    limited = datasets.load_dataset(name, "test", data_dir=tmp_path / "user", limit=5)
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
  io_testing.write_tfds_metadata(metadata, "fashion_mnist", {"train": 60000, "test": 10000})
  policy = tfds.testing.MockPolicy.USE_FILES
  with tfds.testing.mock_data(num_examples=3, policy=policy, data_dir=str(metadata)):
    split = datasets.load_dataset("fashion_mnist", "train", data_dir=tmp_path)
  assert split.source.startswith("tfds:") and split.images.shape == (3, 28, 28, 1)
