"""Image grid with given and predicted labels (the supplement's mislabelled-image finder)."""

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from top1_jax.plots import figures

_TILE_INCHES = 1.75  # per image: the three title lines stay legible at 8 pt
_WRONG_COLOR = "#a50f15"  # dark red: titles of tiles whose prediction disagrees


def _shorten(name: str, max_chars: int) -> str:
  return name if len(name) <= max_chars else name[: max_chars - 1].rstrip() + "…"


def _format_prob(p: float) -> str:
  """Three decimals, more when needed so that p < 1 never prints as 1.000."""
  for digits in range(3, 7):
    text = f"{p:.{digits}f}"
    if (float(text) not in (0.0, 1.0)) or p in (0.0, 1.0):
      return text
  return text


def _check_images(images) -> np.ndarray:
  images = np.asarray(images)
  if images.ndim != 4:
    raise ValueError(f"images: expected [N, H, W, C], got shape {images.shape}")
  if images.shape[0] == 0:
    raise ValueError(f"images: expected at least one image, got shape {images.shape}")
  if images.shape[-1] not in (1, 3, 4):
    raise ValueError(f"images: expected 1, 3 or 4 channels, got shape {images.shape}")
  # imshow reads integer RGB as 0..255 and clips floats outside [0, 1]: not what the model saw.
  if images.dtype.kind != "f":
    raise ValueError(f"images: expected floats in [0, 1], got dtype {images.dtype}")
  if not np.all(np.isfinite(images)) or images.min() < 0.0 or images.max() > 1.0:
    raise ValueError(
      f"images: expected finite values in [0, 1], got min {np.nanmin(images):g},"
      f" max {np.nanmax(images):g}"
    )
  return images


def _check_labels(name: str, labels, num: int, num_classes: int) -> np.ndarray:
  arr = np.asarray(labels)
  if arr.ndim != 1:
    raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
  if arr.shape[0] != num:
    raise ValueError(f"{name}: expected {num} entries like images, got {arr.shape[0]}")
  if arr.dtype.kind not in "iu":
    raise ValueError(f"{name}: expected integer class indices, got dtype {arr.dtype}")
  if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
    raise ValueError(
      f"{name}: labels out of range [0, {num_classes}): min {arr.min()}, max {arr.max()}"
    )
  return arr


def image_grid(
  images,
  given_labels,
  predicted_labels,
  probs,
  class_names: Sequence[str],
  *,
  columns: int = 8,
  title: str | None = None,
  max_name_chars: int = 18,
) -> Figure:
  """Images titled with their given label, predicted label and a probability.

  Args:
    images: [N, H, W, C] float in [0, 1], C = 1 (shown in grayscale), 3 or 4.
    given_labels: [N] int; ``predicted_labels`` likewise.
    probs: [N] in [0, 1], e.g. the most confident errors' calibrated P(correct) or pmax.
    class_names: one name per class, cut to ``max_name_chars`` with an ellipsis.

  Raises:
    ValueError: images, labels, probs or class names of the wrong shape, range or type.
  """
  images = _check_images(images)
  num, height, width, channels = images.shape
  # A string would be indexed character by character and name every class wrongly.
  if isinstance(class_names, str) or not all(isinstance(c, str) for c in class_names):
    raise ValueError("class_names: expected a sequence of strings, one per class")
  given_labels = _check_labels("given_labels", given_labels, num, len(class_names))
  predicted_labels = _check_labels("predicted_labels", predicted_labels, num, len(class_names))
  probs = np.asarray(probs)
  if probs.shape != (num,):
    raise ValueError(f"probs: expected shape ({num},) like images, got {probs.shape}")
  if probs.dtype.kind not in "fiu" or not np.all((probs >= 0) & (probs <= 1)):
    raise ValueError("probs: expected probabilities in [0, 1]")

  columns = min(int(columns), num)
  rows = math.ceil(num / columns)
  tile_height = _TILE_INCHES * height / width
  fig = figures.new_figure(
    (columns * _TILE_INCHES, rows * (tile_height + 0.62) + (0.45 if title else 0.0))
  )
  for i in range(num):
    ax = fig.add_subplot(rows, columns, i + 1)
    image = images[i, ..., 0] if channels == 1 else images[i]
    ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set(xticks=[], yticks=[])
    given = _shorten(class_names[given_labels[i]], max_name_chars)
    predicted = _shorten(class_names[predicted_labels[i]], max_name_chars)
    text = f"given: {given}\npred: {predicted}\np={_format_prob(float(probs[i]))}"
    color = _WRONG_COLOR if given_labels[i] != predicted_labels[i] else "black"
    ax.set_title(text, fontsize=8, linespacing=1.15, color=color)
  if title:
    fig.suptitle(title)
  return fig
