"""Datasets as numpy arrays, and the predictions file that any model can write.

Datasets. ``load_dataset(name, split)`` returns a ``DatasetSplit``: images
``[N, H, W, C]`` float32 in [0, 1] and labels ``[N]`` int32. Sources, in order:

* ``fashion_mnist`` / ``mnist`` as IDX files (``train-images-idx3-ubyte.gz``,
  ``t10k-labels-idx1-ubyte.gz``, ...; gzipped or not) in ``data_dir``, then, for
  Fashion-MNIST, in ``/usr/share/datasets/fashion-mnist`` (Debian package
  ``dataset-fashion-mnist``). This is the offline default.
* Any TFDS name (``cifar10``, ``cifar100``, ``imagenet2012``, ...) prepared in
  ``data_dir`` (or TFDS's default directory). Prepared ArrayRecord data is read
  with ``tfds`` data sources, which need no TensorFlow; TFRecord data needs it.
* Otherwise TFDS builds the dataset, which needs TensorFlow (``pip install
  'top1_jax[tf]'``) and the network. Both are checked first (the network probe
  waits at most 3 s), so a machine without them gets one clear
  ``DataUnavailableError`` instead of TFDS's download retries (about 205 s
  offline).

The training split trains; the held-out (test) split is what cross-validation
divides into calibration and evaluation folds.

Predictions file (``.npz``, written atomically):

* ``labels``: int ``[N]``;
* ``logits``: float ``[S, N, K]`` (S = 1 for a plain model; samples from MC
  dropout or ensemble members otherwise) and/or ``mean_probs``: float ``[N, K]``,
  rows summing to 1, when the samples are not kept;
* ``score_<name>``: float ``[N]``, one per precomputed uncertainty score;
* ``human_probs``: float ``[N, K]``, optional per-image human label frequencies
  (CIFAR-10H), rows summing to 1;
* ``meta``: a JSON object as a string (dataset, split, model, method,
  dropout_rate, ensemble_size, seed, version, and anything else).

Loading checks every field (dtype, shape, agreement of N and K, finite values,
label range, rows summing to 1) and the error names the file and the field.
"""

import dataclasses
import gzip
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import socket
import struct
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from top1_jax import __version__, validation

FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")

FASHION_MNIST_CLASSES = (
  "T-shirt/top",
  "Trouser",
  "Pullover",
  "Dress",
  "Coat",
  "Sandal",
  "Shirt",
  "Sneaker",
  "Bag",
  "Ankle boot",
)

# Datasets that are also read from IDX files: name -> class names.
_IDX_DATASETS = {
  "fashion_mnist": FASHION_MNIST_CLASSES,
  "mnist": tuple(str(digit) for digit in range(10)),
}
_IDX_PREFIX = {"train": "train", "test": "t10k"}

# TFDS downloads prepared data and sources from Google Cloud Storage; reaching it
# is the cheapest honest answer to "can TFDS download anything from here?".
_NETWORK_PROBE = ("storage.googleapis.com", 443)

_INSTALL_TF = "pip install 'top1_jax[tf]'"
_INSTALL_FMNIST = "apt-get install dataset-fashion-mnist"


class DataUnavailableError(RuntimeError):
  """The data is not on this machine and cannot be fetched from here.

  Attributes:
    detail: the reason alone, without the advice (for composing messages).
  """

  def __init__(self, message: str, detail: str | None = None):
    super().__init__(message)
    self.detail = message if detail is None else detail


class DatasetSplit(NamedTuple):
  """One split of a labelled image dataset, in memory.

  Attributes:
    images: [N, H, W, C] float32 in [0, 1].
    labels: [N] int32 in [0, num_classes).
    num_classes: K.
    name: dataset name, e.g. ``"fashion_mnist"``.
    split: split name, e.g. ``"train"`` or ``"test"``.
    source: where the data was read from (``"idx:<dir>"`` or ``"tfds:<dir>"``).
    class_names: K class names.
    ids: [N] str example ids when the source has them (TFDS ``id`` feature,
      e.g. CIFAR-10's ``"test_00042"``), else None.
  """

  images: np.ndarray
  labels: np.ndarray
  num_classes: int
  name: str
  split: str
  source: str
  class_names: tuple[str, ...]
  ids: np.ndarray | None = None


# ----------------------------------------------------------------------------
# IDX files


_IDX_DTYPES = {
  0x08: np.dtype(np.uint8),
  0x09: np.dtype(np.int8),
  0x0B: np.dtype(">i2"),
  0x0C: np.dtype(">i4"),
  0x0D: np.dtype(">f4"),
  0x0E: np.dtype(">f8"),
}
_IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims: [N, rows, cols]
_IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim: [N]


def _read_bytes(path: pathlib.Path) -> bytes:
  """File contents, gunzipped when the file starts with the gzip magic."""
  try:
    raw = path.read_bytes()
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  if raw[:2] != b"\x1f\x8b":
    return raw
  try:
    return gzip.decompress(raw)
  except (EOFError, OSError, zlib.error) as e:
    raise ValueError(f"{path}: corrupt or truncated gzip data ({e})") from None


def _read_idx(path: pathlib.Path) -> tuple[int, np.ndarray]:
  raw = _read_bytes(path)
  if len(raw) < 4:
    raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes)")
  (magic,) = struct.unpack(">I", raw[:4])
  type_code, ndim = raw[2], raw[3]
  if raw[:2] != b"\0\0" or type_code not in _IDX_DTYPES or ndim == 0:
    raise ValueError(
      f"{path}: bad IDX magic number 0x{magic:08x}; expected 0x0000TTDD with a"
      " type code TT in {08, 09, 0b, 0c, 0d, 0e} and DD >= 1 dimensions"
    )
  header_size = 4 + 4 * ndim
  if len(raw) < header_size:
    raise ValueError(
      f"{path}: truncated IDX header: {ndim} dimensions need {header_size}"
      f" bytes, file has {len(raw)}"
    )
  shape = struct.unpack(f">{ndim}I", raw[4:header_size])
  dtype = _IDX_DTYPES[type_code]
  expected = math.prod(shape) * dtype.itemsize
  actual = len(raw) - header_size
  if actual != expected:
    problem = "truncated" if actual < expected else "has trailing bytes"
    raise ValueError(
      f"{path}: {problem}: header says shape {shape} ({expected} data bytes),"
      f" file has {actual} data bytes"
    )
  array = np.frombuffer(raw, dtype, count=math.prod(shape), offset=header_size)
  return magic, array.reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads an IDX file (gzipped or not) as a numpy array.

  The header is two zero bytes, a type code, the number of dimensions D and D
  big-endian uint32 sizes; the data that follows must have exactly that size.

  Args:
    path: the file.

  Returns:
    The array, shape given by the header, native byte order.

  Raises:
    ValueError: bad magic number, truncated file or trailing bytes; the message
      names the file.
  """
  return _read_idx(pathlib.Path(path))[1]


def _read_idx_with_magic(path: pathlib.Path, magic: int, what: str) -> np.ndarray:
  found, array = _read_idx(path)
  if found != magic:
    raise ValueError(f"{path}: bad magic number 0x{found:08x} for {what}: expected 0x{magic:08x}")
  return array


def find_idx_files(
  directory: str | os.PathLike, split: str
) -> tuple[pathlib.Path, pathlib.Path] | None:
  """The (images, labels) IDX files of a split in a directory, if both exist.

  Looks for ``{train,t10k}-images-idx3-ubyte[.gz]`` and
  ``{train,t10k}-labels-idx1-ubyte[.gz]``, the names MNIST and Fashion-MNIST use.

  Args:
    directory: where to look.
    split: ``"train"`` or ``"test"``.

  Returns:
    The two paths, or None when either is missing.
  """
  if split not in _IDX_PREFIX:
    raise ValueError(f"split: expected one of {sorted(_IDX_PREFIX)}, got {split!r}")
  directory = pathlib.Path(directory)
  found = []
  for kind in ("images-idx3", "labels-idx1"):
    stem = f"{_IDX_PREFIX[split]}-{kind}-ubyte"
    candidates = [directory / f"{stem}.gz", directory / stem]
    match = next((c for c in candidates if c.is_file()), None)
    if match is None:
      return None
    found.append(match)
  return found[0], found[1]


def _check_limit(limit: int | None) -> int | None:
  return None if limit is None else validation.positive_int("limit", limit)


def _scale_images(images: np.ndarray, what: str) -> np.ndarray:
  """uint8/uint16 -> float32 in [0, 1]; float images are kept (as float32)."""
  if images.dtype == np.uint8 or images.dtype == np.uint16:
    scaled = images.astype(np.float32)
    scaled /= np.float32(np.iinfo(images.dtype).max)
    return scaled
  if np.issubdtype(images.dtype, np.floating):
    return images.astype(np.float32, copy=False)
  raise ValueError(f"{what}: expected uint8, uint16 or float images, got {images.dtype}")


def _check_labels(labels: np.ndarray, num_classes: int, what: str) -> np.ndarray:
  if labels.size:
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
      raise ValueError(f"{what}: labels out of range [0, {num_classes}): min {low}, max {high}")
  return labels.astype(np.int32)


def load_idx(
  images_path: str | os.PathLike,
  labels_path: str | os.PathLike,
  *,
  num_classes: int = 10,
  name: str = "idx",
  split: str = "",
  limit: int | None = None,
  class_names: tuple[str, ...] | None = None,
) -> DatasetSplit:
  """Reads an MNIST-style pair of IDX files.

  Args:
    images_path: IDX3 ubyte images file (magic 0x00000803), [N, H, W].
    labels_path: IDX1 ubyte labels file (magic 0x00000801), [N].
    num_classes: K; every label must be in [0, K).
    name: dataset name to record.
    split: split name to record.
    limit: keep the first ``limit`` examples (all when None).
    class_names: K names (default ``"0"``, ``"1"``, ...).

  Returns:
    A ``DatasetSplit`` with images [N, H, W, 1] float32 in [0, 1].

  Raises:
    ValueError: corrupt, truncated or mismatched files, or labels out of range;
      the message names the file.
  """
  num_classes = validation.positive_int("num_classes", num_classes, minimum=2)
  limit = _check_limit(limit)
  images_path, labels_path = pathlib.Path(images_path), pathlib.Path(labels_path)
  images = _read_idx_with_magic(images_path, _IDX_IMAGES_MAGIC, "IDX3 ubyte images")
  labels = _read_idx_with_magic(labels_path, _IDX_LABELS_MAGIC, "IDX1 ubyte labels")
  if len(images) != len(labels):
    raise ValueError(
      f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
    )
  if len(images) == 0:
    raise ValueError(f"{images_path}: expected at least one image, got 0")
  labels = _check_labels(labels, num_classes, str(labels_path))
  if limit is not None:
    images, labels = images[:limit], labels[:limit]
  if class_names is None:
    class_names = tuple(str(k) for k in range(num_classes))
  if len(class_names) != num_classes:
    raise ValueError(f"class_names: expected {num_classes} names, got {len(class_names)}")
  return DatasetSplit(
    images=_scale_images(images[..., None], str(images_path)),
    labels=labels,
    num_classes=num_classes,
    name=name,
    split=split,
    source=f"idx:{images_path.parent}",
    class_names=tuple(class_names),
  )


# ----------------------------------------------------------------------------
# What this machine can do


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

  The default target is the TFDS download host (or the HTTPS proxy when one is
  set). Name resolution and connecting run in a daemon thread, so a resolver
  that hangs cannot stall the caller beyond ``timeout``.

  Args:
    host: host name or address; default ``storage.googleapis.com`` or the proxy.
    port: TCP port; default 443 or the proxy's.
    timeout: seconds to wait.

  Returns:
    True when the connection opened.
  """
  default_port = 443
  if host is None:
    host, default_port = _proxy_address() or _NETWORK_PROBE
  port = default_port if port is None else port
  result: list[bool] = []

  def probe() -> None:
    try:
      with socket.create_connection((host, port), timeout=timeout):
        result.append(True)
    except OSError:
      result.append(False)

  thread = threading.Thread(target=probe, name="top1_jax-network-probe", daemon=True)
  thread.start()
  thread.join(timeout)
  return bool(result and result[0])


# ----------------------------------------------------------------------------
# TFDS


def _import_tfds():
  try:
    # Imported here: it is slow to import and only the TFDS path needs it.
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise DataUnavailableError(
      f"tensorflow_datasets cannot be imported ({e}); install the requirements:"
      " pip install -r requirements.txt"
    ) from None
  return tfds


def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."


def _tfds_builder(tfds, name: str, data_dir: str | os.PathLike | None):
  try:
    return tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir))
  except tfds.core.DatasetNotFoundError:
    raise ValueError(
      f"name: unknown dataset {name!r} (not an IDX dataset, not a TFDS name, and"
      " not prepared in data_dir)"
    ) from None
  except Exception as e:  # TFDS raises many kinds; report them on one line.
    raise DataUnavailableError(
      f"{name}: TFDS could not open the dataset: {type(e).__name__}: {_one_line(e)}"
    ) from None


def _manual_dir(builder) -> pathlib.Path | None:
  if not getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
    return None
  return pathlib.Path(os.fspath(builder.data_dir_root)) / "downloads" / "manual"


def _build_blockers(builder) -> list[str]:
  """Why TFDS cannot build (download and prepare) this dataset here; [] if it can."""
  blockers = []
  if not tensorflow_available():
    blockers.append(f"TensorFlow is not installed (building needs it: {_INSTALL_TF})")
  manual_dir = _manual_dir(builder)
  if manual_dir is not None:
    if not (manual_dir.is_dir() and any(manual_dir.iterdir())):
      blockers.append(
        f"{builder.name} needs a manual download into {manual_dir}:"
        f" {_one_line(builder.MANUAL_DOWNLOAD_INSTRUCTIONS, 200)}"
      )
  elif not network_available():
    host, port = _proxy_address() or _NETWORK_PROBE
    blockers.append(f"the network is unreachable (no connection to {host}:{port})")
  return blockers


def _prepare(builder) -> None:
  try:
    builder.download_and_prepare(file_format="array_record")
  except Exception as e:  # One line instead of a traceback from inside TFDS.
    raise DataUnavailableError(
      f"{builder.name}: TFDS failed to download and prepare it in"
      f" {builder.data_path}: {type(e).__name__}: {_one_line(e)}"
    ) from None


def _feature_keys(builder) -> tuple[str, str]:
  keys = builder.info.supervised_keys
  if not (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys)):
    keys = ("image", "label")
  features = builder.info.features
  missing = [k for k in keys if k not in features]
  if missing:
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
  """Stacks examples (dicts of numpy arrays) into images, labels and ids."""
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


def load_tfds(
  name: str,
  split: str,
  *,
  data_dir: str | os.PathLike | None = None,
  limit: int | None = None,
  image_size: tuple[int, int] | None = None,
) -> DatasetSplit:
  """Reads a TFDS dataset into memory, building it first only when possible.

  Prepared ArrayRecord data is read with TFDS data sources (no TensorFlow).
  Prepared TFRecord data needs TensorFlow. Unprepared data is built (as
  ArrayRecord) only when TensorFlow is installed and the network (or, for
  ImageNet-style datasets, the manual download) is there; otherwise this raises
  ``DataUnavailableError`` at once, saying which is missing.

  Args:
    name: TFDS name, optionally with config and version (``"cifar10:3.0.2"``).
    split: TFDS split, slicing allowed (``"test"``, ``"train[:10%]"``).
    data_dir: TFDS data directory (default: TFDS's, ``~/tensorflow_datasets``).
    limit: keep the first ``limit`` examples (all when None).
    image_size: (height, width) to resize (shorter side) and centre-crop uint8
      images to; needed when images differ in size (ImageNet).

  Returns:
    A ``DatasetSplit``; ``ids`` holds the ``id`` feature when there is one.
  """
  limit = _check_limit(limit)
  if image_size is not None:
    if len(image_size) != 2:
      raise ValueError(f"image_size: expected (height, width), got {image_size!r}")
    image_size = tuple(validation.positive_int("image_size", s) for s in image_size)
  tfds = _import_tfds()
  builder = _tfds_builder(tfds, name, data_dir)
  what = f"{name} ({split})"
  if not builder.is_prepared():
    blockers = _build_blockers(builder)
    if blockers:
      detail = (
        f"no prepared TFDS dataset in {builder.data_path}, and it cannot be built"
        f" here: {'; '.join(blockers)}"
      )
      raise DataUnavailableError(
        f"{what}: {detail}. Fix: provide what is missing, or copy a prepared TFDS"
        f" folder to {builder.data_path} (data_dir), or use the offline default"
        f" fashion_mnist ({_INSTALL_FMNIST})",
        detail=detail,
      )
    _prepare(builder)
  keys = _feature_keys(builder)
  label_feature = builder.info.features[keys[1]]
  num_classes = getattr(label_feature, "num_classes", None)
  if not num_classes:
    raise ValueError(f"{name}: label feature {keys[1]!r} is not a ClassLabel")
  file_format = str(getattr(builder.info.file_format, "value", builder.info.file_format))
  known_splits = list(builder.info.splits)
  base_split = re.split(r"[\[+]", split)[0]
  if known_splits and base_split not in known_splits:
    raise ValueError(f"split: {name} has splits {known_splits}, got {split!r}")
  try:
    if file_format == "array_record":
      source = builder.as_data_source(split=split)
      count = len(source) if limit is None else min(limit, len(source))
      examples = (source[i] for i in range(count))
    else:
      if not tensorflow_available():
        raise DataUnavailableError(
          f"{what}: the prepared data in {builder.data_path} is {file_format},"
          f" which needs TensorFlow to read: {_INSTALL_TF}"
        )
      examples = itertools.islice(tfds.as_numpy(builder.as_dataset(split=split)), limit)
    images, labels, ids = _collect(examples, keys, what, image_size)
  except (ValueError, DataUnavailableError):
    raise
  except Exception as e:  # One line instead of a traceback from inside TFDS.
    raise DataUnavailableError(
      f"{what}: reading the TFDS data in {builder.data_path} failed:"
      f" {type(e).__name__}: {_one_line(e)}"
    ) from None
  labels = _check_labels(labels, num_classes, what)
  names = tuple(getattr(label_feature, "names", None) or map(str, range(num_classes)))
  return DatasetSplit(
    images=_scale_images(images, what),
    labels=labels,
    num_classes=int(num_classes),
    name=name,
    split=split,
    source=f"tfds:{builder.data_path}",
    class_names=names,
    ids=ids,
  )


def load_dataset(
  name: str,
  split: str,
  *,
  data_dir: str | os.PathLike | None = None,
  limit: int | None = None,
  source: str = "auto",
  image_size: tuple[int, int] | None = None,
) -> DatasetSplit:
  """Loads one split of a dataset into memory.

  ``fashion_mnist`` and ``mnist`` are read from IDX files in ``data_dir`` (and
  Fashion-MNIST from ``/usr/share/datasets/fashion-mnist``) when present; any
  other name, or these when no IDX files are found, goes through TFDS
  (``load_tfds``).

  Args:
    name: ``"fashion_mnist"``, ``"mnist"`` or any TFDS name.
    split: ``"train"`` or ``"test"`` (TFDS: any TFDS split string).
    data_dir: directory with IDX files or a TFDS data directory.
    limit: keep the first ``limit`` examples (all when None).
    source: ``"auto"``, ``"idx"`` (IDX files only) or ``"tfds"`` (TFDS only).
    image_size: (height, width) for TFDS images of varying size (see
      ``load_tfds``).

  Returns:
    A ``DatasetSplit``: images [N, H, W, C] float32 in [0, 1], labels [N] int32.

  Raises:
    DataUnavailableError: no local copy and no way to fetch one (one line saying
      what to install or where to put the files).
    ValueError: bad arguments or corrupt files.
  """
  if source not in ("auto", "idx", "tfds"):
    raise ValueError(f"source: expected 'auto', 'idx' or 'tfds', got {source!r}")
  if not isinstance(name, str) or not name:
    raise ValueError(f"name: expected a dataset name, got {name!r}")
  if not isinstance(split, str) or not split:
    raise ValueError(f"split: expected a split name, got {split!r}")
  if source == "idx" and name not in _IDX_DATASETS:
    raise ValueError(f"name: IDX files are read for {sorted(_IDX_DATASETS)}, got {name!r}")
  if source == "tfds" or name not in _IDX_DATASETS:
    return load_tfds(name, split, data_dir=data_dir, limit=limit, image_size=image_size)

  if split not in _IDX_PREFIX:
    raise ValueError(
      f"split: {name} IDX files have splits {sorted(_IDX_PREFIX)}, got {split!r}"
      " (use limit= for a subset)"
    )
  directories = [pathlib.Path(data_dir)] if data_dir is not None else []
  if name == "fashion_mnist":
    directories.append(pathlib.Path(FASHION_MNIST_DIR))
  for directory in directories:
    files = find_idx_files(directory, split)
    if files is not None:
      return load_idx(
        *files,
        num_classes=len(_IDX_DATASETS[name]),
        name=name,
        split=split,
        limit=limit,
        class_names=_IDX_DATASETS[name],
      )

  prefix = _IDX_PREFIX[split]
  searched = " or ".join(str(d) for d in directories) or "(no data_dir given)"
  no_idx = (
    f"no IDX files ({prefix}-images-idx3-ubyte[.gz], {prefix}-labels-idx1-ubyte[.gz]) in {searched}"
  )
  fix_idx = (
    f"{_INSTALL_FMNIST} (the offline default), or put the IDX files in data_dir"
    if name == "fashion_mnist"
    else "put the IDX files in data_dir"
  )
  if source == "idx":
    raise DataUnavailableError(f"{name} ({split}): {no_idx}. Fix: {fix_idx}")
  try:
    return load_tfds(name, split, data_dir=data_dir, limit=limit, image_size=image_size)
  except DataUnavailableError as e:
    raise DataUnavailableError(
      f"{name} ({split}): no local data and no way to fetch it: {no_idx}; {e.detail}."
      f" Fix: {fix_idx}, or {_INSTALL_TF} and run once with network access",
      detail=f"{no_idx}; {e.detail}",
    ) from None


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


# ----------------------------------------------------------------------------
# Predictions file


_SCORE_PREFIX = "score_"
_SCORE_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_META_TYPES = {
  "dataset": (str,),
  "split": (str,),
  "model": (str,),
  "method": (str,),
  "version": (str,),
  "dropout_rate": (int, float),
  "ensemble_size": (int,),
  "seed": (int,),
}


def _numpy(name: str, value: Any) -> np.ndarray:
  if value is None:
    raise ValueError(f"{name}: expected an array, got None")
  try:
    return np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}: cannot convert to an array ({e})") from None


def _check_float(name: str, value: Any, ndim: tuple[int, ...]) -> np.ndarray:
  array = _numpy(name, value)
  if array.ndim not in ndim:
    want = " or ".join(f"{d}-D" for d in ndim)
    raise ValueError(f"{name}: expected a {want} array, got shape {array.shape}")
  if not np.issubdtype(array.dtype, np.floating):
    raise ValueError(f"{name}: expected a float dtype, got {array.dtype}")
  array = array.astype(np.float32, copy=False)
  flat = array.reshape(-1)
  # In chunks: [S, N, K] logits can be gigabytes, and so would a full bool mask.
  chunk = 1 << 22
  for start in range(0, flat.size, chunk):
    finite = np.isfinite(flat[start : start + chunk])
    if not finite.all():
      first = start + int(np.argmin(finite))
      bad = sum(
        int(np.count_nonzero(~np.isfinite(flat[i : i + chunk])))
        for i in range(start, flat.size, chunk)
      )
      raise ValueError(
        f"{name}: {bad} non-finite value(s) (first at flat index {first}:"
        f" {flat[first]}); remove or fix NaN/Inf"
      )
  return array


def _check_probs(name: str, value: Any, num_examples: int) -> np.ndarray:
  array = _check_float(name, value, (2,))
  if array.shape[0] != num_examples:
    raise ValueError(
      f"{name}: expected {num_examples} rows (one per label), got shape {array.shape}"
    )
  validation.probability_array(name, array, 2, sums_to_one=True)
  return array


def _check_meta(meta: Any) -> dict:
  if meta is None:
    return {}
  if not isinstance(meta, Mapping):
    raise ValueError(f"meta: expected a dict (JSON object), got {type(meta).__name__}")
  meta = dict(meta)
  for key in meta:
    if not isinstance(key, str):
      raise ValueError(f"meta: keys must be strings, got {key!r}")
  try:
    meta = json.loads(_meta_json(meta))
  except (TypeError, ValueError) as e:
    raise ValueError(f"meta: not JSON-serializable ({e})") from None
  for key, types in _META_TYPES.items():
    if key in meta:
      value = meta[key]
      if isinstance(value, bool) or not isinstance(value, types):
        want = " or ".join(t.__name__ for t in types)
        raise ValueError(f"meta: {key} must be {want}, got {value!r}")
  if "dropout_rate" in meta and not 0.0 <= meta["dropout_rate"] < 1.0:
    raise ValueError(f"meta: dropout_rate must be in [0, 1), got {meta['dropout_rate']}")
  if "ensemble_size" in meta and meta["ensemble_size"] < 1:
    raise ValueError(f"meta: ensemble_size must be >= 1, got {meta['ensemble_size']}")
  return meta


def _meta_json(meta: Mapping) -> str:
  def plain(value):
    if isinstance(value, np.generic):
      return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serializable")

  return json.dumps(meta, sort_keys=True, allow_nan=False, default=plain)


@dataclasses.dataclass(frozen=True, eq=False)
class Predictions:
  """A model's outputs on one split; validated on construction.

  Build one directly (``Predictions(labels=y, logits=l)``), read one with
  ``load_predictions``, change one with ``dataclasses.replace`` (revalidated).
  Arrays are stored as numpy: labels int32, the rest float32.

  Attributes:
    labels: [N] int, in [0, K).
    logits: [S, N, K] float (a [N, K] array is taken as S = 1), or None.
    mean_probs: [N, K] float, rows summing to 1, or None. At least one of
      ``logits`` and ``mean_probs`` is required; with both, N and K agree.
    scores: name -> [N] float precomputed uncertainty scores (file fields
      ``score_<name>``; names are letters, digits and underscores).
    human_probs: [N, K] float human label frequencies (CIFAR-10H), or None.
    meta: JSON-serializable dict (dataset, split, model, method, dropout_rate,
      ensemble_size, seed, version, ...).
  """

  labels: np.ndarray
  logits: np.ndarray | None = None
  mean_probs: np.ndarray | None = None
  scores: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  human_probs: np.ndarray | None = None
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    labels = _numpy("labels", self.labels)
    if labels.ndim != 1:
      raise ValueError(f"labels: expected a 1-D array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
      raise ValueError(f"labels: expected an integer dtype, got {labels.dtype}")
    if labels.size == 0:
      raise ValueError("labels: expected at least one example, got shape (0,)")
    num_examples = labels.shape[0]
    if self.logits is None and self.mean_probs is None:
      raise ValueError(
        "logits/mean_probs: expected logits [S, N, K] or mean_probs [N, K], got neither"
      )
    num_classes = None
    logits = None
    if self.logits is not None:
      logits = _check_float("logits", self.logits, (2, 3))
      if logits.ndim == 2:
        logits = logits[None]
      if logits.shape[1] != num_examples:
        raise ValueError(
          f"logits: expected N={num_examples} (from labels) on axis 1 of"
          f" [S, N, K], got shape {logits.shape}"
        )
      if logits.shape[0] < 1:
        raise ValueError(f"logits: expected at least one sample, got shape {logits.shape}")
      num_classes = logits.shape[2]
    mean_probs = None
    if self.mean_probs is not None:
      mean_probs = _check_probs("mean_probs", self.mean_probs, num_examples)
      if num_classes is not None and mean_probs.shape[1] != num_classes:
        raise ValueError(
          f"mean_probs: expected K={num_classes} (from logits) columns, got shape"
          f" {mean_probs.shape}"
        )
      num_classes = mean_probs.shape[1]
    if num_classes < 2:
      field = "logits" if logits is not None else "mean_probs"
      raise ValueError(f"{field}: expected at least 2 classes, got K={num_classes}")
    labels = validation.labels_array("labels", labels, num_classes)
    labels = np.asarray(labels, np.int32)
    if not isinstance(self.scores, Mapping):
      raise ValueError(
        f"scores: expected a dict name -> [N] array, got {type(self.scores).__name__}"
      )
    scores = {}
    for score_name, value in self.scores.items():
      field = f"{_SCORE_PREFIX}{score_name}"
      if not isinstance(score_name, str) or not _SCORE_NAME.match(score_name):
        raise ValueError(
          f"{field}: score names must be letters, digits or underscores, got {score_name!r}"
        )
      score = _check_float(field, value, (1,))
      if score.shape[0] != num_examples:
        raise ValueError(
          f"{field}: expected shape ({num_examples},) (one per label), got {score.shape}"
        )
      scores[score_name] = score
    human_probs = None
    if self.human_probs is not None:
      human_probs = _check_probs("human_probs", self.human_probs, num_examples)
      if human_probs.shape[1] != num_classes:
        raise ValueError(
          f"human_probs: expected K={num_classes} columns, got shape {human_probs.shape}"
        )
    fields = {
      "labels": labels,
      "logits": logits,
      "mean_probs": mean_probs,
      "scores": scores,
      "human_probs": human_probs,
      "meta": _check_meta(self.meta),
    }
    for key, value in fields.items():
      object.__setattr__(self, key, value)

  @property
  def num_examples(self) -> int:
    """N."""
    return int(self.labels.shape[0])

  @property
  def num_classes(self) -> int:
    """K."""
    source = self.logits if self.logits is not None else self.mean_probs
    return int(source.shape[-1])

  @property
  def num_samples(self) -> int | None:
    """S, or None when only ``mean_probs`` is kept."""
    return None if self.logits is None else int(self.logits.shape[0])


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> pathlib.Path:
  """Writes a file so that readers see the old file or the new one, never a part.

  Calls ``write(file)`` on a temp file in ``path``'s directory (created if
  needed), syncs it, makes it world-readable and renames it over ``path``. On
  any failure, including KeyboardInterrupt, the temp file is removed and
  ``path`` is left as it was.

  Returns:
    ``path`` as a ``pathlib.Path``.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as file:
      write(file)
      file.flush()
      os.fsync(file.fileno())
    os.chmod(temp_name, 0o644)  # mkstemp makes 0600; outputs are meant to be shared
    os.replace(temp_name, path)
  except BaseException:
    try:
      os.unlink(temp_name)
    except FileNotFoundError:
      pass
    raise
  return path


def save_predictions(
  path: str | os.PathLike, predictions: Predictions, *, compress: bool = False
) -> pathlib.Path:
  """Writes a predictions file atomically (temp file in the same folder + rename).

  ``meta["version"]`` is set to this library's version when absent.

  Args:
    path: destination, used as given (conventionally ``*.npz``).
    predictions: a ``Predictions`` (validated on construction).
    compress: zip-compress the arrays (smaller, slower).

  Returns:
    The path written.
  """
  if not isinstance(predictions, Predictions):
    raise ValueError(
      f"predictions: expected a top1_jax.data.Predictions, got {type(predictions).__name__}"
    )
  meta = {"version": __version__, **predictions.meta}
  arrays = {"labels": predictions.labels, "meta": np.asarray(_meta_json(meta))}
  for key in ("logits", "mean_probs", "human_probs"):
    if getattr(predictions, key) is not None:
      arrays[key] = getattr(predictions, key)
  for score_name, score in predictions.scores.items():
    arrays[f"{_SCORE_PREFIX}{score_name}"] = score
  path = pathlib.Path(path)
  save = np.savez_compressed if compress else np.savez
  atomic_write(path, lambda file: save(file, **arrays))
  return path


def _read_meta(value: np.ndarray) -> dict:
  if value.ndim != 0 or value.dtype.kind not in "US":
    raise ValueError(
      f"meta: expected a JSON string (0-d str array), got shape {value.shape} dtype {value.dtype}"
    )
  text = value.item()
  if isinstance(text, bytes):
    text = text.decode("utf-8", errors="replace")
  try:
    meta = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"meta: invalid JSON ({e})") from None
  if not isinstance(meta, dict):
    raise ValueError(f"meta: expected a JSON object, got {type(meta).__name__}")
  return meta


def load_predictions(path: str | os.PathLike) -> Predictions:
  """Reads and validates a predictions file (schema in the module docstring).

  Args:
    path: the ``.npz`` file.

  Returns:
    ``Predictions`` with labels [N] int32, logits [S, N, K] and/or mean_probs
    [N, K] float32, scores {name: [N]}, human_probs [N, K] or None, meta dict.

  Raises:
    FileNotFoundError: no such file.
    ValueError: not an ``.npz`` file, an unknown or missing field, or a field
      with a wrong dtype, shape or value; the message names the file and field.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path}: predictions file not found")
  try:
    archive = np.load(path, allow_pickle=False)
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f"{path}: not a readable .npz predictions file ({e})") from None
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ValueError(f"{path}: expected an .npz archive of named arrays, got a single array")
  fields: dict[str, Any] = {"scores": {}}
  with archive:
    for key in archive.files:
      try:
        value = archive[key]
      except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"{path}: field {key!r} cannot be read ({e})") from None
      try:
        if key == "meta":
          fields["meta"] = _read_meta(value)
        elif key.startswith(_SCORE_PREFIX):
          fields["scores"][key[len(_SCORE_PREFIX) :]] = value
        elif key in ("labels", "logits", "mean_probs", "human_probs"):
          fields[key] = value
        else:
          raise ValueError(
            f"{key}: unexpected field; allowed: labels, logits, mean_probs,"
            " score_<name>, human_probs, meta"
          )
      except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
  if "labels" not in fields:
    raise ValueError(f"{path}: labels: missing field (int [N] class labels)")
  try:
    return Predictions(**fields)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


# ----------------------------------------------------------------------------
# Human labels


def load_human_probs(
  path: str | os.PathLike,
  *,
  num_examples: int | None = None,
  num_classes: int | None = None,
) -> np.ndarray:
  """Reads per-image human label probabilities (CIFAR-10H ``cifar10h-probs.npy``).

  Rows must be in the same example order as the predictions they go with
  (CIFAR-10H: the original CIFAR-10 test order; TFDS ``cifar10`` examples sorted
  by their ``id``).

  Args:
    path: ``.npy`` file holding [N, K] floats, rows summing to 1.
    num_examples: expected N, when known.
    num_classes: expected K, when known.

  Returns:
    [N, K] float32.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path}: human label file not found")
  try:
    array = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    raise ValueError(f"{path}: not a readable .npy file ({e})") from None
  if not isinstance(array, np.ndarray):
    raise ValueError(f"{path}: expected a single [N, K] array (.npy), got an archive")
  if array.ndim == 2 and np.issubdtype(array.dtype, np.number) and array.size:
    sums = array.sum(axis=1, dtype=np.float64)
    if array.min() >= 0 and np.all(array == np.round(array)) and sums.max() > 1.5:
      raise ValueError(
        f"{path}: human_probs: looks like annotator counts (row sums up to"
        f" {sums.max():g}); divide each row by its sum to get probabilities"
      )
  try:
    probs = _check_float("human_probs", array, (2,))
    for name, want, got in (
      ("num_examples", num_examples, probs.shape[0]),
      ("num_classes", num_classes, probs.shape[1]),
    ):
      if want is not None and want != got:
        raise ValueError(f"human_probs: expected {name}={want}, got shape {probs.shape}")
    return _check_probs("human_probs", probs, probs.shape[0])
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


def attach_human_probs(
  predictions_path: str | os.PathLike,
  human_probs: str | os.PathLike | np.ndarray,
  *,
  output_path: str | os.PathLike | None = None,
) -> pathlib.Path:
  """Adds human label probabilities to a predictions file (for ``human_entropy``).

  Args:
    predictions_path: an existing predictions file.
    human_probs: [N, K] array or a ``.npy`` path (``load_human_probs``), rows in
      the predictions' example order.
    output_path: where to write (default: replace ``predictions_path``,
      atomically).

  Returns:
    The path written.
  """
  predictions = load_predictions(predictions_path)
  if isinstance(human_probs, (str, os.PathLike)):
    human_probs = load_human_probs(
      human_probs,
      num_examples=predictions.num_examples,
      num_classes=predictions.num_classes,
    )
  updated = dataclasses.replace(predictions, human_probs=human_probs)
  target = predictions_path if output_path is None else output_path
  return save_predictions(target, updated)


__all__ = [
  "FASHION_MNIST_CLASSES",
  "FASHION_MNIST_DIR",
  "DataUnavailableError",
  "DatasetSplit",
  "Predictions",
  "attach_human_probs",
  "find_idx_files",
  "iterate_batches",
  "load_dataset",
  "load_human_probs",
  "load_idx",
  "load_predictions",
  "load_tfds",
  "network_available",
  "read_idx",
  "save_predictions",
  "tensorflow_available",
]
