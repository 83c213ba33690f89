"""engine.shifts (rotation, translation) and engine.corruptions (the CIFAR-10-C-like suite)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
import scipy.stats

from top1_jax.engine import corruptions, shifts

NAMES = corruptions.names()
NOISES = ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise")


def _images(shape=(3, 12, 12, 1), seed=0) -> jax.Array:
  return jax.random.uniform(jax.random.key(seed), shape, jnp.float32)


def _key(seed=1) -> jax.Array:
  return jax.random.key(seed)


def test_registry_lists_every_corruption_with_five_severities():
  assert set(corruptions.REGISTRY) == set(NAMES) == set(corruptions.PARAMETERS)
  assert len(NAMES) == 8
  assert all(len(c) == corruptions.SEVERITIES for c in corruptions.PARAMETERS.values())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(2, 10, 10), (2, 8, 9, 3)])
def test_shape_dtype_range_and_identity_at_severity_0(name, shape):
  images = _images(shape)
  for severity in range(6):
    out = corruptions.REGISTRY[name](images, _key(), severity)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
  np.testing.assert_array_equal(corruptions.corrupt(name, images, _key(), 0), images)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_by_seed_and_independent_of_chunking(name):
  images = _images((5, 10, 10, 1))
  whole = corruptions.corrupt(name, images, _key(), 3)
  np.testing.assert_array_equal(whole, corruptions.corrupt(name, images, _key(), 3))
  chunks = [
    corruptions.corrupt(name, images[a:b], _key(), 3, first_index=a) for a, b in ((0, 2), (2, 5))
  ]
  np.testing.assert_allclose(jnp.concatenate(chunks), whole, rtol=0, atol=1e-6)
  one = corruptions.corrupt(name, images[3:4], _key(), 3, first_index=3)
  np.testing.assert_allclose(one[0], whole[3], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", NOISES)
def test_noises_differ_between_seeds(name):
  images = _images((2, 10, 10, 1))
  a = corruptions.corrupt(name, images, _key(1), 5)
  b = corruptions.corrupt(name, images, _key(2), 5)
  assert not np.array_equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_effect_grows_with_severity(name):
  images = _images((4, 16, 16, 1)) * 0.8 + 0.1
  change = [
    float(jnp.abs(corruptions.corrupt(name, images, _key(), s) - images).mean()) for s in range(6)
  ]
  assert change[0] == 0.0
  assert np.all(np.diff(change) > 0), change


@pytest.mark.parametrize("name", NAMES)
def test_quantize_is_cifar10c_uint8_truncation_of_the_float_result(name):
  # 8-bit images, as CIFAR-10-C's inputs: unchanged values must stay exactly themselves.
  images = np.floor(np.asarray(_images((3, 10, 10, 3))) * 256).clip(0, 255) / np.float32(255)
  images = images.astype(np.float32)
  exact = np.asarray(corruptions.corrupt(name, images, _key(), 4))
  stored = np.asarray(corruptions.REGISTRY[name](images, _key(), 4, quantize=True))
  expected = (np.uint8(exact * np.float32(255)) / np.float32(255)).astype(np.float32)
  np.testing.assert_array_equal(stored, expected)
  assert np.all(exact - stored >= 0) and np.all(exact - stored < 1 / 255 + 1e-7)
  np.testing.assert_array_equal(corruptions.corrupt(name, images, _key(), 0, quantize=True), images)


def test_low_precision_images_keep_their_dtype():
  images = _images((2, 8, 8, 1)).astype(jnp.bfloat16)
  out = corruptions.corrupt("gaussian_blur", images, _key(), 2)
  assert out.dtype == jnp.bfloat16


def test_brightness_on_grey_is_a_clipped_shift():
  images = _images((2, 8, 8))
  np.testing.assert_allclose(
    corruptions.corrupt("brightness", images, _key(), 5),
    jnp.clip(images + 0.3, 0, 1),
    rtol=0,
    atol=1e-6,
  )


def test_gaussian_blur_keeps_a_constant_image():
  images = jnp.full((1, 9, 9, 1), 0.25)
  np.testing.assert_allclose(
    corruptions.corrupt("gaussian_blur", images, _key(), 5), images, atol=1e-6
  )


@pytest.mark.parametrize("shape", [(2, 7, 7), (2, 6, 6, 3)])
def test_rotation_by_right_angles_is_rot90_exactly(shape):
  images = np.asarray(_images(shape))
  np.testing.assert_array_equal(shifts.rotate(images, 0), images)
  for k in (1, 2, 3):
    np.testing.assert_array_equal(shifts.rotate(images, 90 * k), np.rot90(images, k, axes=(1, 2)))


def test_rotation_keeps_shape_dtype_range_and_fills_outside_with_0():
  images = jnp.ones((2, 9, 11, 1))
  for degrees in shifts.ROTATION_DEGREES:
    out = shifts.rotate(images, degrees)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
  noise = np.asarray(_images((2, 9, 11, 2)))
  np.testing.assert_array_equal(shifts.rotate(noise, 0), noise)
  np.testing.assert_array_equal(shifts.rotate(noise, 180), noise[:, ::-1, ::-1])
  np.testing.assert_array_equal(shifts.translate(noise, 0), noise)
  corner = shifts.rotate(images, 45)
  assert float(corner[0, 0, 0, 0]) == 0.0 and float(corner[0, 4, 5, 0]) == 1.0


@pytest.mark.parametrize("pixels", [0, 1, 5, 14, -3, 40])
def test_translation_is_roll_with_zero_fill(pixels):
  images = np.asarray(_images((2, 6, 14)))
  expected = np.roll(images, pixels, axis=2)
  width = images.shape[2]
  if pixels >= 0:
    expected[:, :, : min(pixels, width)] = 0
  else:
    expected[:, :, max(width + pixels, 0) :] = 0
  out = shifts.translate(images, pixels)
  assert out.shape == images.shape and out.dtype == images.dtype
  np.testing.assert_array_equal(out, expected)


def _ovadia_rotation(images: np.ndarray, degrees: float) -> np.ndarray:
  """The oracle: scipy.ndimage.rotate over the image plane (their ``axes=[-2, -3]`` on
  [B, H, W, C]; sorted, as SciPy sorts them), then the H x W centre of the canvas."""
  canvas = scipy.ndimage.rotate(images, degrees, axes=(2, 1))
  height, width = images.shape[1:3]
  top, left = canvas.shape[1] // 2 - height // 2, canvas.shape[2] // 2 - width // 2
  return canvas[:, top : top + height, left : left + width]


# MNIST- and CIFAR-sized; [B, H, W] too. Uniform noise: the largest spline coefficients.
@pytest.mark.parametrize("shape", [(3, 28, 28, 1), (2, 32, 32, 3), (2, 28, 28)])
def test_rotate_cubic_is_scipy_rotate_with_the_centre_crop(shape):
  images = np.asarray(_images(shape, seed=3))
  worst = 0.0
  for degrees in (0, 15, 33.3, 45, 90, 135, 180, 181, 270, -30, 390):
    expected = _ovadia_rotation(images[..., None] if len(shape) == 3 else images, degrees)
    out = np.asarray(shifts.rotate_cubic(images, degrees))
    assert out.shape == images.shape and out.dtype == images.dtype
    worst = max(worst, float(np.abs(out - expected.reshape(shape)).max()))
  assert worst < 1e-6, worst  # float32 rounding: 5.4e-7 at most on these images
  # Not clipped, as theirs: the cubic spline overshoots near the edges.
  overshoot = np.asarray(shifts.rotate_cubic(images, 45))
  assert overshoot.min() < 0 and overshoot.max() > 1


def test_rotate_cubic_is_exact_at_0_and_one_program_for_every_angle(compiles):
  images = np.asarray(_images((2, 10, 10, 1)))
  np.testing.assert_array_equal(shifts.rotate_cubic(images, 0), images)
  np.testing.assert_array_equal(shifts.rotate_cubic(images, -720), images)  # SciPy: exact too
  shifts.rotate_cubic(images, 10)
  before = len(compiles)
  for degrees in (20, 75.5, 90, 200):
    shifts.rotate_cubic(images, degrees)
  assert len(compiles) == before
  # A non-square image follows the same formula (the canvas is large enough at 45).
  wide = np.asarray(_images((1, 8, 12, 1)))
  np.testing.assert_allclose(
    shifts.rotate_cubic(wide, 45), _ovadia_rotation(wide, 45), rtol=0, atol=1e-6
  )


@pytest.mark.parametrize("pixels", [0, 2, 13, 26, 28, -3, 40])
@pytest.mark.parametrize("shape", [(2, 28, 28, 1), (2, 6, 14)])
def test_roll_is_np_roll_along_x(pixels, shape):
  images = np.asarray(_images(shape))
  out = shifts.roll(images, pixels)
  assert out.shape == images.shape and out.dtype == images.dtype
  np.testing.assert_array_equal(out, np.roll(images, pixels, axis=2))


def test_registry_and_ovadia_grids():
  assert shifts.GEOMETRIC == {
    "rotate": shifts.rotate,
    "translate": shifts.translate,
    "rotate_cubic": shifts.rotate_cubic,
    "roll": shifts.roll,
  }
  assert shifts.ROTATION_DEGREES[1:] == tuple(range(15, 181, 15))  # data_lib's rotate_degs
  assert shifts.ROLL_PIXELS[1:] == tuple(range(2, 28, 2))  # data_lib's roll_pixels
  assert shifts.ROTATION_DEGREES[0] == shifts.ROLL_PIXELS[0] == 0  # the clean set


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda: corruptions.corrupt("fog", _images(), _key(), 1), "name: expected one of"),
    (
      lambda: corruptions.corrupt("contrast", _images(), _key(), 6),
      "severity: expected at least 0, at most 5",
    ),
    (
      lambda: corruptions.corrupt("contrast", jnp.ones((2, 3), jnp.float32), _key(), 1),
      "images: expected shape",
    ),
    (
      lambda: corruptions.corrupt("contrast", jnp.ones((2, 3, 3), jnp.int32), _key(), 1),
      "images: expected float",
    ),
    (lambda: corruptions.corrupt("shot_noise", _images(), 3, 1), "key: expected a JAX PRNG key"),
    (
      lambda: corruptions.corrupt("contrast", _images(), _key(), 1, quantize=1),
      "quantize: expected True or False",
    ),
    (lambda: shifts.translate(_images(), 1.5), "pixels: expected an integer"),
    (lambda: shifts.rotate(_images(), float("nan")), "degrees: expected a finite angle"),
    (lambda: shifts.rotate_cubic(_images(), "x"), "degrees: expected a number"),
    (lambda: shifts.rotate_cubic(_images(), float("inf")), "degrees: expected a finite angle"),
    (lambda: shifts.roll(_images(), 2.0), "pixels: expected an integer"),
    (lambda: shifts.roll(jnp.ones((2, 3), jnp.float32), 2), "images: expected shape"),
  ],
)
def test_bad_inputs_are_one_line_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize("lam", [0.0, 0.5, 4.0, 25.0, 200.0])
def test_poisson_draws_have_the_poisson_mean_and_variance(lam):
  draws = np.asarray(corruptions.poisson(_key(), jnp.full((40_000,), lam)))
  assert np.all(draws == np.round(draws)) and draws.min() >= 0
  tolerance = 5 * np.sqrt(max(lam, 1e-3) / draws.size) + 1e-9
  assert abs(draws.mean() - lam) < tolerance
  assert abs(draws.var() - lam) < 0.05 * lam + 1e-9
  if lam < corruptions.POISSON_EXACT_BELOW:
    counts = np.bincount(draws.astype(int), minlength=60)[:60] / draws.size
    expected = scipy.stats.poisson.pmf(np.arange(60), lam)
    assert 0.5 * np.abs(counts - expected).sum() < 0.02


def test_every_geometric_shift_has_its_axis_in_the_results():
  from top1_jax.io import results

  assert set(shifts.GEOMETRIC) == set(results.GEOMETRIC_SHIFTS)
