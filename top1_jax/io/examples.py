"""Example data inside the package: two real networks' softmax outputs on CIFAR test sets,
in ``example_data/<name>.npz`` (the README there gives their source and licence).
"""

import importlib.resources
from typing import NamedTuple

import numpy as np

EXAMPLES: dict[str, str] = {
  "densenet-bc-100-cifar-100": (
    "DenseNet-BC-100 on the CIFAR-100 test set: 10,000 images, 100 classes, accuracy 0.754"
  ),
  "lenet-5-cifar-10": "LeNet-5 on the CIFAR-10 test set: 10,000 images, 10 classes, accuracy 0.531",
}
"""Each example's name (its file's stem) and its one-line description."""


class Example(NamedTuple):
  """One example: a network's softmax outputs on a labelled test set.

  Attributes:
    probs: ``[N, K]`` float32 softmax probabilities (rows sum to 1 within 3e-7; the
      smallest entries underflow to 1e-37 or 0), for ``Calibrator(inputs="probs")``.
    labels: ``[N]`` int64 true classes in ``[0, K)``.
    num_classes: K.
    description: one line: network, test set, size, number of classes, accuracy.
  """

  probs: np.ndarray
  labels: np.ndarray
  num_classes: int
  description: str


def load_example(name: str) -> Example:
  """Loads the example data set ``name`` (a key of ``EXAMPLES``, whose value describes it),
  from any folder or an installed wheel.

  Raises:
    ValueError: ``name`` is not one of ``EXAMPLES``.
  """
  if not isinstance(name, str) or name not in EXAMPLES:
    known = ", ".join(repr(known) for known in sorted(EXAMPLES))
    raise ValueError(f"name: expected one of {known}, got {name!r}")
  resource = importlib.resources.files("top1_jax.io") / "example_data" / f"{name}.npz"
  with resource.open("rb") as stream, np.load(stream) as record:
    probs, labels = record["predictions"], record["ground_truth"]
  return Example(probs, labels, int(probs.shape[-1]), EXAMPLES[name])
