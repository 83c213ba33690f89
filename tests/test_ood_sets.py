"""Out-of-distribution sets (io.ood_sets) and their device maths (engine.ood)."""

import gzip
import importlib.machinery
import importlib.util
import pathlib
import sys

import jax
import numpy as np
import pytest

from top1_jax.engine import ood
from top1_jax.io import ood_sets
from top1_jax.io.splits import DataUnavailableError

SHAPES = [(28, 28, 1), (32, 32, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ood_sets.names())
def test_shape_dtype_and_range(name, shape):
  images = np.asarray(ood_sets.load(name, shape, 40, seed=3))
  assert images.shape == (40, *shape) and images.dtype == np.float32
  assert images.min() >= 0.0 and images.max() <= 1.0
  # Real pictures, not a constant: every image has dark and bright pixels.
  assert (images.reshape(40, -1).max(axis=1) - images.reshape(40, -1).min(axis=1) > 0.5).all()
  if shape[2] == 3 and name == "digits":
    assert (images[..., 0] == images[..., 2]).all()


@pytest.mark.parametrize("name", ood_sets.names())
def test_deterministic_by_seed_and_seeds_differ(name):
  first = np.asarray(ood_sets.load(name, (28, 28, 1), 16, seed=7))
  np.testing.assert_array_equal(first, np.asarray(ood_sets.load(name, (28, 28, 1), 16, seed=7)))
  other = np.asarray(ood_sets.load(name, (28, 28, 1), 16, seed=8))
  assert not np.array_equal(first, other)


def test_digits_are_the_scikit_learn_digits_in_a_seeded_order():
  from sklearn.datasets import load_digits

  digits = ood_sets.digits_images()  # read from scikit-learn's file without importing it
  np.testing.assert_array_equal(digits, load_digits().images.astype(np.float32) / 16)
  assert digits.dtype == np.float32 and digits.max() == 1.0 and digits.min() == 0.0
  # At their own size the resize is the identity: each image is one of the digits.
  images = np.asarray(ood_sets.load("digits", (8, 8, 1), 30, seed=1))[..., 0]
  rows = [np.flatnonzero((digits == image).all(axis=(1, 2))) for image in images]
  assert all(len(r) >= 1 for r in rows)
  assert len({int(r[0]) for r in rows}) > 25  # distinct draws, not one image repeated


def test_resize_keeps_constants_and_bilinear_means():
  zeros = np.zeros((2, 8, 8), np.float32)
  np.testing.assert_array_equal(np.asarray(ood.resize(zeros, (28, 28, 1))), 0.0)
  constant = np.full((1, 8, 8, 1), 0.37, np.float32)
  np.testing.assert_allclose(np.asarray(ood.resize(constant, (32, 32, 3))), 0.37, atol=1e-6)
  # A left-dark, right-bright image keeps that order after upsampling; the mean stays.
  ramp = np.tile(np.linspace(0, 1, 8, dtype=np.float32), (1, 8, 1))
  out = np.asarray(ood.resize(ramp, (32, 32, 1)))[0, :, :, 0]
  assert (np.diff(out, axis=1) >= -1e-7).all() and out[:, 0].max() < out[:, -1].min()
  np.testing.assert_allclose(out.mean(), ramp.mean(), atol=1e-6)


def test_uniform_noise_per_image_keys():
  key = jax.random.key(0)
  whole = np.asarray(ood.uniform_noise(key, 10, (4, 5, 3)))
  np.testing.assert_array_equal(np.asarray(ood.uniform_noise(key, 4, (4, 5, 3))), whole[:4])
  tail = ood.uniform_noise(key, 6, (4, 5, 3), first_index=4)
  np.testing.assert_array_equal(np.asarray(tail), whole[4:])
  assert not np.array_equal(whole[0], whole[1])
  many = np.asarray(ood.uniform_noise(key, 200, (28, 28, 1)))
  assert abs(many.mean() - 0.5) < 0.005 and abs(many.var() - 1 / 12) < 0.002


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: ood_sets.load("svhn", (28, 28, 1), 4), "name: expected one of digits"),
    (lambda: ood_sets.load("digits", (28, 28, 1), 1798), "num: expected at most 1797"),
    (lambda: ood_sets.load("uniform_noise", (28, 28, 1), 0), "num: expected at least 1"),
    (lambda: ood_sets.load("digits", (28, 28), 4), "shape: expected (height, width, ch"),
    (lambda: ood_sets.load("digits", (28, 0, 1), 4), "shape: expected"),
    (lambda: ood_sets.load("digits", (28, 28, 1), 4, seed=-1), "seed: expected at least 0"),
    (lambda: ood.resize(np.zeros((1, 8, 8, 2), np.float32), (8, 8, 3)), "images: expected 1"),
    (lambda: ood.resize(np.zeros((1, 8, 8), np.int32), (8, 8, 1)), "images: expected float"),
    (lambda: ood.uniform_noise(3, 4, (8, 8, 1)), "key: expected a jax.random key"),
  ],
)
def test_refusals_are_one_line(call, message):
  with pytest.raises(ValueError) as raised:
    call()
  assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_missing_scikit_learn_names_the_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "sklearn", None)  # find_spec: None, as when not installed
  with pytest.raises(DataUnavailableError, match="pip install scikit-learn") as raised:
    ood_sets.load("digits", (28, 28, 1), 4)
  assert "\n" not in str(raised.value)
  # The noise set does not need it.
  assert ood_sets.load("uniform_noise", (28, 28, 1), 4).shape == (4, 28, 28, 1)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_an_unreadable_digits_file_is_one_line(monkeypatch, tmp_path, damage):
  spec = importlib.util.find_spec("sklearn")
  package = tmp_path / "sklearn"
  (package / "datasets" / "data").mkdir(parents=True)
  if damage == "truncated":  # a whole gzip stream, with only its first rows
    csv = gzip.decompress((pathlib.Path(spec.origin).parent / ood_sets.DIGITS_CSV).read_bytes())
    (package / ood_sets.DIGITS_CSV).write_bytes(gzip.compress(csv[:5000]))
  fake = importlib.machinery.ModuleSpec("sklearn", None, is_package=True)
  fake.submodule_search_locations = [str(package)]
  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda name, *a: fake if name == "sklearn" else real(name, *a)
  )
  with pytest.raises(DataUnavailableError, match="reinstall scikit-learn$") as raised:
    ood_sets.digits_images()
  assert f"scikit-learn's digits in {package / ood_sets.DIGITS_CSV}: expected 1797 rows" in str(
    raised.value
  )
  assert "\n" not in str(raised.value)
