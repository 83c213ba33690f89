"""What every dataset loader returns (``DatasetSplit``) or raises (``DataUnavailableError``),
apart so that ``datasets`` -> ``idx``, ``tfds`` -> ``splits`` stay one-way."""

from typing import NamedTuple

import numpy as np

# Advice that loaders append to their errors.
INSTALL_TENSORFLOW = (
  "pip install '.[tf]' in a top1_jax clone (or pip install 'top1_jax[tf]' from an index)"
)
INSTALL_FASHION_MNIST = "apt-get install dataset-fashion-mnist"


class DataUnavailableError(RuntimeError):
  """The data is not on this machine and cannot be fetched from here; ``detail`` is the
  reason alone, without the advice (for composing messages)."""

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


def scale_images(images: np.ndarray, what: str) -> np.ndarray:
  """Images as float32 in [0, 1]: uint8 and uint16 divided by the dtype's maximum, floats
  kept as they are; any other dtype is a ValueError naming ``what``."""
  if images.dtype == np.uint8 or images.dtype == np.uint16:
    scaled = images.astype(np.float32)
    scaled /= np.float32(np.iinfo(images.dtype).max)
    return scaled
  if np.issubdtype(images.dtype, np.floating):
    return images.astype(np.float32, copy=False)
  raise ValueError(f"{what}: expected uint8, uint16 or float images, got {images.dtype}")
