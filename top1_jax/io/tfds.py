"""TFDS datasets. What building one needs is checked first, so a machine without it gets
one ``DataUnavailableError`` at once, not minutes of TFDS's download retries offline.
"""

import importlib.util
import itertools
import os
import pathlib
import re
import socket

import numpy as np
from etils import epath

from top1_jax.core import validation
from top1_jax.io import files
from top1_jax.io.splits import (
  INSTALL_FASHION_MNIST,
  INSTALL_TENSORFLOW,
  DatasetSplit,
  DataUnavailableError,
  scale_images,
)

_NETWORK_PROBE = ("storage.googleapis.com", 443)


def tensorflow_available() -> bool:
  """Whether TensorFlow is installed (checked without importing it)."""
  return importlib.util.find_spec("tensorflow") is not None


def _proxy_address() -> tuple[str, int] | None:
  for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
    match = re.match(r"^(?:\w+://)?(?:[^@/]*@)?([^:/]+)(?::(\d+))?", os.environ.get(var, ""))
    if match:
      return match.group(1), int(match.group(2) or 8080)
  return None


def network_available(
  host: str | None = None, port: int | None = None, timeout: float = 3.0
) -> bool:
  """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds.

  ``host`` None: TFDS's download host (Google Cloud Storage), or the HTTPS proxy when one
  is set. A resolver that hangs cannot stall the caller beyond ``timeout``.
  """
  host, default_port = (host, 443) if host is not None else _proxy_address() or _NETWORK_PROBE
  port = default_port if port is None else port

  def probe() -> bool:
    with socket.create_connection((host, port), timeout=timeout):
      return True

  return files.in_daemon_thread(probe, timeout, "top1_jax-network-probe")[0] is True


def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _failed(what: str, error: Exception) -> DataUnavailableError:
  """A failure inside TFDS as one line instead of a traceback."""
  return DataUnavailableError(f"{what}: {type(error).__name__}: {_one_line(error)}")


def _tfds_builder(name: str, data_dir: epath.PathLike | None):
  """(tensorflow_datasets, the dataset's builder); a failure of either in one line."""
  try:
    import tensorflow_datasets as tfds  # slow to import: only the TFDS path needs it
  except ImportError as e:
    raise DataUnavailableError(
      f"tensorflow_datasets cannot be imported ({e}); install the requirements:"
      " pip install -r requirements.txt"
    ) from None
  try:
    return tfds, tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir))
  except tfds.core.DatasetNotFoundError:
    raise ValueError(
      f"name: unknown dataset {name!r} (not an IDX dataset, not a TFDS name, and"
      " not prepared in data_dir)"
    ) from None
  except Exception as e:  # TFDS raises many kinds
    raise _failed(f"{name}: TFDS could not open the dataset", e) from None


def _prepare(builder, what: str) -> None:
  """Has TFDS download and prepare the dataset, once what that needs is checked: else one
  ``DataUnavailableError`` says what is missing."""
  blockers = []
  if not tensorflow_available():
    blockers.append(f"TensorFlow is not installed (building needs it: {INSTALL_TENSORFLOW})")
  if getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
    manual_dir = pathlib.Path(os.fspath(builder.data_dir_root)) / "downloads" / "manual"
    if not (manual_dir.is_dir() and any(manual_dir.iterdir())):
      blockers.append(
        f"{builder.name} needs a manual download into {manual_dir}:"
        f" {_one_line(builder.MANUAL_DOWNLOAD_INSTRUCTIONS, 200)}"
      )
  elif not network_available():
    host, port = _proxy_address() or _NETWORK_PROBE
    blockers.append(f"the network is unreachable (no connection to {host}:{port})")
  if blockers:
    detail = (
      f"no prepared TFDS dataset in {builder.data_path}, and it cannot be built"
      f" here: {'; '.join(blockers)}"
    )
    raise DataUnavailableError(
      f"{what}: {detail}. Fix: provide what is missing, or copy a prepared TFDS"
      f" folder to {builder.data_path} (data_dir), or use the offline default"
      f" fashion_mnist ({INSTALL_FASHION_MNIST})",
      detail=detail,
    )
  try:
    builder.download_and_prepare(file_format="array_record")
  except Exception as e:
    where = f"{builder.name}: TFDS failed to download and prepare it in {builder.data_path}"
    raise _failed(where, e) from None


def _feature_keys(builder) -> tuple[str, str]:
  keys = builder.info.supervised_keys
  if not (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys)):
    keys = ("image", "label")
  features = builder.info.features
  if missing := [k for k in keys if k not in features]:
    raise ValueError(
      f"{builder.name}: expected image and label features {keys}, missing"
      f" {missing} (features: {sorted(features.keys())})"
    )
  return keys


def _resize_center_crop(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  """Resizes the shorter side to cover ``size`` (bilinear), then crops the centre."""
  from PIL import Image  # Pillow comes with matplotlib; only resizing needs it.

  height, width = size
  scale = max(height / image.shape[0], width / image.shape[1])
  new_h = max(height, round(image.shape[0] * scale))
  new_w = max(width, round(image.shape[1] * scale))
  pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
  resized = np.asarray(pil.resize((new_w, new_h), Image.Resampling.BILINEAR))
  top, left = (new_h - height) // 2, (new_w - width) // 2
  cropped = resized[top : top + height, left : left + width]
  return cropped.reshape(height, width, image.shape[-1])


def _collect(examples, keys, what: str, image_size) -> tuple:
  """Stacks examples (dicts of numpy arrays) into images, labels and ids (or None)."""
  image_key, label_key = keys
  images, labels, ids = [], [], []
  for index, example in enumerate(examples):
    image = np.asarray(example[image_key])
    if image.ndim == 2:
      image = image[..., None]
    if image_size is not None:
      if image.dtype != np.uint8:
        raise ValueError(f"image_size: resizing needs uint8 images, got {image.dtype}")
      image = _resize_center_crop(image, image_size)
    if images and image.shape != images[0].shape:
      raise ValueError(
        f"{what}: images have different shapes ({images[0].shape} at index 0,"
        f" {image.shape} at index {index}); pass image_size=(height, width) to"
        " resize and centre-crop them"
      )
    images.append(image)
    labels.append(int(example[label_key]))
    if "id" in example:
      value = example["id"]
      ids.append(value.decode() if isinstance(value, bytes) else str(value))
  if not images:
    raise ValueError(f"{what}: the split is empty")
  ids = np.asarray(ids) if len(ids) == len(images) else None
  return np.stack(images), np.asarray(labels, np.int64), ids


def _read_examples(tfds, builder, split: str, limit: int | None, keys, what, image_size):
  """Reads (images, labels, ids) of a prepared dataset; TFDS failures as one line."""
  file_format = str(getattr(builder.info.file_format, "value", builder.info.file_format))
  try:
    if file_format == "array_record":
      source = builder.as_data_source(split=split)
      count = len(source) if limit is None else min(limit, len(source))
      examples = (source[i] for i in range(count))
    else:
      if not tensorflow_available():
        raise DataUnavailableError(
          f"{what}: the prepared data in {builder.data_path} is {file_format},"
          f" which needs TensorFlow to read: {INSTALL_TENSORFLOW}"
        )
      examples = itertools.islice(tfds.as_numpy(builder.as_dataset(split=split)), limit)
    return _collect(examples, keys, what, image_size)
  except (ValueError, DataUnavailableError):
    raise
  except Exception as e:
    raise _failed(f"{what}: reading the TFDS data in {builder.data_path} failed", e) from None


def load_tfds(
  name: str,
  split: str,
  *,
  data_dir: epath.PathLike | None = None,
  limit: int | None = None,
  image_size: tuple[int, int] | None = None,
) -> DatasetSplit:
  """Reads a TFDS dataset into memory (its ``id`` feature, if any, as the split's ``ids``),
  building it first only when possible.

  Prepared ArrayRecord data needs no TensorFlow, TFRecord data does. Unprepared data is
  built only with TensorFlow and the network (or the manual download); else
  ``DataUnavailableError`` says which is missing.

  Args:
    name: TFDS name, optionally with config and version (``"cifar10:3.0.2"``).
    split: TFDS split, slicing allowed (``"test"``, ``"train[:10%]"``).
    data_dir: TFDS data directory (None: TFDS's, ``~/tensorflow_datasets``).
    limit: keep the first ``limit`` examples (all when None).
    image_size: (height, width) to resize (shorter side) and centre-crop uint8
      images to; needed when images differ in size (ImageNet).
  """
  if limit is not None:
    limit = validation.positive_int("limit", limit)
  if image_size is not None:
    if len(image_size) != 2:
      raise ValueError(f"image_size: expected (height, width), got {image_size!r}")
    image_size = tuple(validation.positive_int("image_size", s) for s in image_size)
  tfds, builder = _tfds_builder(name, data_dir)
  what = f"{name} ({split})"
  if not builder.is_prepared():
    _prepare(builder, what)
  keys = _feature_keys(builder)
  label_feature = builder.info.features[keys[1]]
  num_classes = getattr(label_feature, "num_classes", None)
  if not num_classes:
    raise ValueError(f"{name}: label feature {keys[1]!r} is not a ClassLabel")
  known_splits = list(builder.info.splits)
  base_split = re.split(r"[\[+]", split)[0]
  if known_splits and base_split not in known_splits:
    raise ValueError(f"split: {name} has splits {known_splits}, got {split!r}")
  images, labels, ids = _read_examples(tfds, builder, split, limit, keys, what, image_size)
  labels = validation.labels_array(what, labels, num_classes, host=True)
  names = tuple(getattr(label_feature, "names", None) or map(str, range(num_classes)))
  return DatasetSplit(
    images=scale_images(images, what),
    labels=labels,
    num_classes=int(num_classes),
    name=name,
    split=split,
    source=f"tfds:{builder.data_path}",
    class_names=names,
    ids=ids,
  )
