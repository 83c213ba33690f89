"""The example data shipped inside the package: ``top1_jax.load_example``."""

import subprocess
import sys

import numpy as np
import pytest

import top1_jax as t1
from top1_jax.io import examples

SHAPES = {"densenet-bc-100-cifar-100": (10000, 100), "lenet-5-cifar-10": (10000, 10)}
ACCURACY = {"densenet-bc-100-cifar-100": 0.7541, "lenet-5-cifar-10": 0.5308}


def test_every_example_is_named_once_and_exported():
  assert sorted(examples.EXAMPLES) == sorted(SHAPES)
  assert "load_example" in t1.__all__ and t1.load_example is examples.load_example


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_an_example_is_probabilities_and_labels_as_its_readme_says(name):
  probs, labels, num_classes, description = t1.load_example(name)
  assert probs.shape == SHAPES[name] and probs.dtype == np.float32
  assert labels.shape == SHAPES[name][:1] and labels.dtype == np.int64
  assert num_classes == SHAPES[name][1] and 0 <= labels.min() and labels.max() < num_classes
  np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=3e-7)
  assert np.mean(probs.argmax(axis=1) == labels) == ACCURACY[name]
  assert f"{num_classes} classes" in description and "\n" not in description


@pytest.mark.parametrize("name", ["cifar10", "lenet-5-cifar-10.npz", "", None, 3])
def test_an_unknown_name_is_one_line_listing_the_names(name):
  with pytest.raises(ValueError) as raised:
    t1.load_example(name)
  message = str(raised.value)
  assert message.startswith("name: expected one of") and f"got {name!r}" in message
  assert all(repr(known) in message for known in SHAPES) and "\n" not in message


def test_it_loads_from_any_folder_without_the_heavy_packages(tmp_path):
  # As a user with the core install: another folder, and etils, absl, flax... absent.
  code = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("etils", "absl", "flax", "matplotlib", "tensorflow_datasets"):
      raise ImportError(f"blocked: {name}")

sys.meta_path.insert(0, Block())
import top1_jax
example = top1_jax.load_example("lenet-5-cifar-10")
print(example.probs.shape, example.num_classes)
"""
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "(10000, 10) 10"
