"""IDX files: MNIST and Fashion-MNIST (``{train,t10k}-{images-idx3,labels-idx1}-ubyte``,
gzipped or not), read offline. The Debian package ``dataset-fashion-mnist`` installs
Fashion-MNIST in ``FASHION_MNIST_DIR``, which makes it the offline default dataset.
"""

import contextlib
import gzip
import math
import pathlib
import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
from etils import epath

from top1_jax.core import validation
from top1_jax.io import files
from top1_jax.io.splits import DatasetSplit, scale_images

FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")

FASHION_MNIST_CLASSES = (
  *("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"),
  *("Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
)

IDX_SPLIT_PREFIX = {"train": "train", "test": "t10k"}

_IDX_DTYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IMAGES = (0x00000803, "IDX3 ubyte images")  # (magic, what): unsigned bytes, [N, rows, cols]
_LABELS = (0x00000801, "IDX1 ubyte labels")  # unsigned bytes, [N]
_COMPARE_BLOCK = 1 << 20  # bytes per read when comparing a .gz file with its raw twin


MAX_IDX_BYTES = 1 << 30
"""The most data bytes an IDX file's header may declare (well over EMNIST's largest split):
a larger one is refused before any allocation."""

_GZIP_MAGIC = b"\x1f\x8b"
_DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error)


@contextlib.contextmanager
def _opened(path: pathlib.Path | epath.Path) -> Iterator[BinaryIO]:
  """The file's bytes as a stream, gunzipped if it starts with the gzip magic; errors name it."""
  try:
    file = files.open_regular(path)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  with file:
    gzipped = file.read(2) == _GZIP_MAGIC
    file.seek(0)
    with gzip.GzipFile(fileobj=file) if gzipped else contextlib.nullcontext(file) as stream:
      try:
        yield stream
      except _DECOMPRESS_ERRORS as e:
        if not gzipped:
          raise
        raise _gzip_error(path, e) from None


def _gzip_error(path, error: BaseException) -> ValueError:
  return ValueError(f"{path}: corrupt or truncated gzip data ({error})")


def _header(path, stream: BinaryIO) -> tuple[int, np.dtype, tuple[int, ...]]:
  """(magic, dtype, shape) from the stream's first bytes, which it leaves at the data."""
  raw = stream.read(4)
  if len(raw) < 4:
    raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes)")
  raw += stream.read(4 * raw[3])
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
  return magic, np.dtype(_IDX_DTYPES[type_code]), shape


def _check_magic(path, found: int, kind: tuple[int, str]) -> None:
  magic, what = kind
  if found != magic:
    raise ValueError(f"{path}: bad magic number 0x{found:08x} for {what}: expected 0x{magic:08x}")


def _check_counts(images_path, labels_path, images: int, labels: int) -> None:
  if images != labels:
    raise ValueError(f"{images_path} has {images} images but {labels_path} has {labels} labels")


def _read_idx(path: pathlib.Path | epath.Path, kind: tuple[int, str] | None = None) -> np.ndarray:
  """The file's array; ``kind``: the (magic, what) it must have, checked once it is read."""
  with _opened(path) as stream:
    magic, dtype, shape = _header(path, stream)
    expected = math.prod(shape) * dtype.itemsize
    if expected > MAX_IDX_BYTES:
      raise ValueError(
        f"{path}: header says shape {shape} ({expected} data bytes), over the"
        f" {MAX_IDX_BYTES} an IDX file may hold (idx.MAX_IDX_BYTES); not read"
      )
    # Into a buffer of the declared size, then one byte more: a gzip bomb stops there.
    data = bytearray(expected)
    view, got = memoryview(data), 0
    while got < expected and (count := stream.readinto(view[got:])):
      got += count
    if got < expected:
      raise ValueError(
        f"{path}: truncated: header says shape {shape} ({expected} data bytes),"
        f" file has {got} data bytes"
      )
    if stream.read(1):
      raise ValueError(
        f"{path}: has trailing bytes: header says shape {shape} ({expected} data bytes),"
        " the file holds more"
      )
  if kind is not None:
    _check_magic(path, magic, kind)
  array = np.frombuffer(data, dtype, count=math.prod(shape))
  return array.reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def _read_header(path: pathlib.Path | epath.Path) -> tuple[int, np.dtype, tuple[int, ...]]:
  with _opened(path) as stream:
    return _header(path, stream)


def read_idx_shape(path: epath.PathLike) -> tuple[int, ...]:
  """The shape an IDX file's header declares, e.g. ``(60000, 28, 28)``, without reading
  (or checking) the data; a ValueError naming the file for a bad or truncated header."""
  return _read_header(files.as_path(path))[2]


def read_idx(path: epath.PathLike) -> np.ndarray:
  """An IDX file (gzipped or not, local or a URL) as an array in native byte order; a
  ValueError naming the file for a bad magic number, a truncated file or trailing bytes."""
  return _read_idx(files.as_path(path))


def _same_data(first: pathlib.Path | epath.Path, second: pathlib.Path | epath.Path) -> bool:
  """Whether two IDX files hold the same bytes once gunzipped, read a block at a time."""
  with _opened(first) as stream_a, _opened(second) as stream_b:
    while True:
      blocks = []
      for path, stream in ((first, stream_a), (second, stream_b)):
        try:
          blocks.append(stream.read(_COMPARE_BLOCK))
        except _DECOMPRESS_ERRORS as e:  # named here: it passes through the other's context
          raise _gzip_error(path, e) from None
      if blocks[0] != blocks[1]:
        return False
      if not blocks[0]:
        return True


def _idx_pair(
  directory: epath.PathLike, split: str
) -> list[tuple[str, pathlib.Path | epath.Path | None]]:
  """[(file name pattern, the file or None)] for a split's images and labels files.

  With both ``<stem>.gz`` and ``<stem>``, either is used when they hold the same data,
  and both are refused when they differ: which one is meant is not known.
  """
  if split not in IDX_SPLIT_PREFIX:
    raise ValueError(f"split: expected one of {sorted(IDX_SPLIT_PREFIX)}, got {split!r}")
  directory = files.as_path(directory)
  pair = []
  for kind in ("images-idx3", "labels-idx1"):
    stem = f"{IDX_SPLIT_PREFIX[split]}-{kind}-ubyte"
    # exists(), not is_file(): a FIFO or a device by that name is refused, not passed over
    found = [c for c in (directory / f"{stem}.gz", directory / stem) if c.exists()]
    if len(found) == 2 and not _same_data(*found):
      raise ValueError(
        f"{directory}: {stem}.gz and {stem} hold different data; remove the one that is not"
        " wanted (or make them the same)"
      )
    pair.append((f"{stem}[.gz]", found[0] if found else None))
  return pair


def find_idx_files(
  directory: epath.PathLike, split: str
) -> tuple[pathlib.Path | epath.Path, pathlib.Path | epath.Path] | None:
  """The (images, labels) IDX files of a split (``"train"`` or ``"test"``) in a directory,
  or None when either is missing."""
  (_, images), (_, labels) = _idx_pair(directory, split)
  return None if images is None or labels is None else (images, labels)


def incomplete_idx_pair(directory: epath.PathLike, split: str) -> str | None:
  """Why a directory holds half of a split's IDX pair (one file, not the other), else None:
  callers refuse it, since looking elsewhere for the pair would read another copy."""
  (image_name, images), (label_name, labels) = _idx_pair(directory, split)
  if (images is None) == (labels is None):
    return None
  found, missing = (images, label_name) if labels is None else (labels, image_name)
  return f"{files.as_path(directory)} has {found.name} but no {missing}"


def count_idx_examples(images_path: epath.PathLike, labels_path: epath.PathLike) -> int:
  """The number of examples of an images/labels pair, from the two headers alone (checked
  as ``load_idx`` checks them); a ValueError for a bad header, kind of file or count."""
  counts = []
  for path, kind in ((images_path, _IMAGES), (labels_path, _LABELS)):
    path = files.as_path(path)
    found, _, shape = _read_header(path)
    _check_magic(path, found, kind)
    counts.append(shape[0])
  _check_counts(images_path, labels_path, *counts)
  return counts[0]


def load_idx(
  images_path: epath.PathLike,
  labels_path: epath.PathLike,
  *,
  num_classes: int = 10,
  name: str = "idx",
  split: str = "",
  limit: int | None = None,
  class_names: tuple[str, ...] | None = None,
) -> DatasetSplit:
  """A ``DatasetSplit`` (images [N, H, W, 1] float32 in [0, 1]) from an MNIST-style pair of
  IDX files, the first ``limit`` examples (None: all). ``class_names`` None: "0", "1", ...

  Raises:
    ValueError: corrupt, truncated or mismatched files, or labels out of [0, K), naming it.
  """
  num_classes = validation.positive_int("num_classes", num_classes, minimum=2)
  if limit is not None:
    limit = validation.positive_int("limit", limit)
  images_path, labels_path = files.as_path(images_path), files.as_path(labels_path)
  images, labels = _read_idx(images_path, _IMAGES), _read_idx(labels_path, _LABELS)
  _check_counts(images_path, labels_path, len(images), len(labels))
  if len(images) == 0:
    raise ValueError(f"{images_path}: expected at least one image, got 0")
  labels = validation.labels_array(str(labels_path), labels, num_classes, host=True)
  if limit is not None:
    images, labels = images[:limit], labels[:limit]
  if class_names is None:
    class_names = tuple(str(k) for k in range(num_classes))
  if len(class_names) != num_classes:
    raise ValueError(f"class_names: expected {num_classes} names, got {len(class_names)}")
  return DatasetSplit(
    images=scale_images(images[..., None], str(images_path)),
    labels=labels,
    num_classes=num_classes,
    name=name,
    split=split,
    source=f"idx:{images_path.parent}",
    class_names=tuple(class_names),
  )
