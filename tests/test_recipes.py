"""The training recipes: augmentation, optimizers and schedules, mixed precision, curves,
and the CIFAR recipe configs run end to end by the launcher on TFDS mock data."""

import json
import pathlib

import io_testing
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow_datasets as tfds
from absl import flags

# TFDS reads array_record files through this module, which defines absl flags on import:
# imported here, before any flagsaver, which drops the flags defined inside it on exit
# (a later test reading TFDS data in the same process then failed on a missing flag).
from array_record.python import array_record_data_source  # noqa: F401
from ml_collections import config_flags

from top1_jax.configs import default
from top1_jax.core.validation import SettingError
from top1_jax.engine import augment, models, monitor, optimizers, train, train_state
from top1_jax.io import checkpoints, metric_writer, sweep_data
from top1_jax.launch import runner, usage
from top1_jax.pipeline import jobs, training
from top1_jax.pipeline import settings as settings_lib

# ----------------------------------------------------------------------------
# Augmentation


def _images(shape=(16, 6, 5, 3), seed=0):
  return jax.random.uniform(jax.random.key(seed), shape) + 0.5  # no zeros: padding shows


def test_crop_is_a_window_of_the_zero_padded_image_and_deterministic():
  images, padding = _images(), 2
  crop = augment.make(("crop",), padding)
  out = np.asarray(jax.jit(crop)(jax.random.key(1), images))
  assert out.shape == images.shape and out.dtype == images.dtype
  np.testing.assert_array_equal(out, jax.jit(crop)(jax.random.key(1), images))
  padded = np.pad(np.asarray(images), ((0, 0), (padding,) * 2, (padding,) * 2, (0, 0)))
  offsets = set()
  for i in range(len(images)):
    found = [
      (dy, dx)
      for dy in range(2 * padding + 1)
      for dx in range(2 * padding + 1)
      if np.array_equal(out[i], padded[i, dy : dy + 6, dx : dx + 5])
    ]
    assert found, f"image {i} is not a window of its padded image"
    offsets.add(found[0])
  assert len(offsets) > 3  # the offsets vary from image to image
  other = np.asarray(crop(jax.random.key(2), images))
  assert not np.array_equal(out, other)


def test_flip_mirrors_about_half_the_images_and_grayscale_keeps_its_shape():
  images = _images((200, 4, 7))  # [B, H, W]: no channel axis
  flip = augment.make("flip")
  out = np.asarray(flip(jax.random.key(3), images))
  assert out.shape == images.shape
  same = [np.array_equal(o, i) for o, i in zip(out, np.asarray(images), strict=True)]
  mirrored = [np.array_equal(o, i[:, ::-1]) for o, i in zip(out, np.asarray(images), strict=True)]
  assert all(s != m for s, m in zip(same, mirrored, strict=True))
  assert 70 < sum(mirrored) < 130


def test_augmentation_names_and_padding_are_checked():
  assert not augment.make(("none",)) and not augment.make(())
  assert augment.make(("flip", "crop"), 4) == augment.Augmentation(("crop", "flip"), 4)
  assert augment.make(("flip",), 4).crop_padding == 0  # padding only matters with a crop
  with pytest.raises(ValueError, match="augment: expected 'none' or names among crop, flip"):
    augment.make(("crop", "rotate"), 4)
  with pytest.raises(ValueError, match="crop_padding: expected an integer >= 1 with crop, got 0"):
    augment.make(("crop",), 0)


def test_a_training_step_augments_with_its_own_key():
  model = models.CNN(num_classes=3, features=(4,), dense_size=8)
  x = np.asarray(_images((8, 8, 8, 1)))
  y = np.arange(8, dtype=np.int32) % 3
  plain = train.create_train_state(model, optax.sgd(0.1), jax.random.key(0), x[:1])
  crops = train.create_train_state(
    model, optax.sgd(0.1), jax.random.key(0), x[:1], augmentation=augment.make(("crop",), 2)
  )
  key = jax.random.key(5)
  _, plain_metrics = train.train_step(plain, (x, y), key)
  first, first_metrics = train.train_step(crops, (x, y), key)
  second, _ = train.train_step(crops, (x, y), key)
  assert float(first_metrics["loss"]) != float(plain_metrics["loss"])
  jax.tree_util.tree_map(np.testing.assert_array_equal, first.params, second.params)


# ----------------------------------------------------------------------------
# Optimizers and schedules


def test_schedules_follow_their_definitions():
  steps = dict(num_steps=100, steps_per_epoch=10)
  assert optimizers.schedule(0.1, "constant", **steps) == 0.1  # a float: optax.sgd(0.1) as before
  cosine = optimizers.schedule(0.1, "cosine", **steps)
  assert float(cosine(0)) == pytest.approx(0.1) and float(cosine(100)) == pytest.approx(0.0)
  assert float(cosine(50)) == pytest.approx(0.05)
  step = optimizers.schedule(0.1, "step", lr_boundaries=(3, 6), lr_factor=0.2, **steps)
  values = [float(step(t)) for t in (0, 29, 30, 59, 60, 99)]
  np.testing.assert_allclose(values, [0.1, 0.1, 0.02, 0.02, 0.004, 0.004], rtol=1e-6)
  warm = optimizers.schedule(0.1, "cosine", warmup_epochs=2, **steps)
  np.testing.assert_allclose([float(warm(t)) for t in (0, 10, 20)], [0.0, 0.05, 0.1], rtol=1e-6)
  assert float(warm(100)) == pytest.approx(0.0, abs=1e-9)
  with pytest.raises(ValueError, match=r"lr_boundaries: expected epochs inside the run \(0, 10\)"):
    optimizers.schedule(0.1, "step", lr_boundaries=(3, 10), **steps)
  with pytest.raises(ValueError, match="lr_schedule: expected one of constant, cosine, step"):
    optimizers.schedule(0.1, "linear", **steps)


def test_weight_decay_is_coupled_l2_on_kernels_only():
  params = {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)}
  grads = {"kernel": jnp.full((2, 3), 0.5), "bias": jnp.full((3,), 0.5)}
  opt = optimizers.make("sgd", 0.1, momentum=0.0, weight_decay=0.01)
  updates, _ = opt.tx.update(grads, opt.tx.init(params), params)
  # -lr * (g + wd * w) on the kernel, -lr * g on the bias.
  np.testing.assert_allclose(updates["kernel"], -0.1 * (0.5 + 0.01 * 2.0), rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], -0.1 * 0.5, rtol=1e-6)
  momentum = optimizers.make("sgd", 0.1, momentum=0.9, nesterov=True)
  state = momentum.tx.init(params)
  first, state = momentum.tx.update(grads, state, params)
  second, _ = momentum.tx.update(grads, state, params)
  # Nesterov: -lr * (g + m * (m * v + g)) with v the previous trace.
  np.testing.assert_allclose(second["bias"], -0.1 * (0.5 + 0.9 * (0.9 * 0.5 + 0.5)), rtol=1e-5)
  assert momentum.learning_rate(7) == 0.1


def test_the_default_optimizer_is_adam_with_its_old_state():
  params = {"w": jnp.ones((2, 2))}
  opt = optimizers.make("adam", 1e-3)
  same = optax.adam(1e-3)
  got, expected = opt.tx.init(params), same.init(params)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
  with pytest.raises(ValueError, match="optimizer: expected one of adam, sgd, got 'rmsprop'"):
    optimizers.make("rmsprop", 0.1)


# ----------------------------------------------------------------------------
# Mixed precision


def _blobs(n=64, shape=(8, 8, 1), classes=3, seed=0):
  rng = np.random.default_rng(seed)
  labels = np.arange(n, dtype=np.int32) % classes
  images = rng.normal(0, 0.3, (n, *shape)).astype(np.float32)
  images[np.arange(n), labels] += 1.0  # the class lights up one row
  return images, labels


def test_bfloat16_training_is_finite_and_logits_stay_float32():
  images, labels = _blobs()
  model = models.CNN(num_classes=3, features=(8,), dense_size=16, dtype=jnp.bfloat16)
  state = train.create_train_state(model, optax.adam(1e-2), jax.random.key(0), images[:1])
  losses = []
  state = train.fit(
    state, images, labels, jax.random.key(1), num_steps=12, batch_size=16, log_every=4,
    callback=lambda info: losses.append(info["loss"]),
  )  # fmt: skip
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(state.params)} == {jnp.dtype("float32")}
  apply_fn = models.make_apply_fn(model)
  plain = apply_fn(state.variables, images[:4])
  dropped = apply_fn(state.variables, images[:4], jax.random.key(2), 0.3)
  assert plain.dtype == dropped.dtype == jnp.float32
  assert np.all(np.isfinite(dropped)) and not np.array_equal(plain, dropped)
  # The float32 network with the same parameters agrees to bfloat16's precision.
  exact = models.make_apply_fn(model.clone(dtype=jnp.float32))(state.variables, images[:4])
  np.testing.assert_allclose(plain, exact, atol=0.1)


def test_float16_loss_scaling_skips_non_finite_steps_and_grows_the_scale():
  images, labels = _blobs(16)
  model = models.CNN(num_classes=3, features=(4,), dense_size=8, dtype=jnp.float16)
  scale = train_state.loss_scale("float16", growth_interval=2)
  state = train.create_train_state(
    model, optax.sgd(0.1), jax.random.key(0), images[:1], dynamic_scale=scale
  )
  assert float(state.dynamic_scale.scale) == 2.0**15
  batch = (images, labels)
  # A scale of 2^100 overflows float16 in the backward pass: the step is skipped.
  huge = state.replace(dynamic_scale=state.dynamic_scale.replace(scale=jnp.float32(2.0**100)))
  skipped, metrics = train.train_step(huge, batch, jax.random.key(1))
  assert np.isfinite(float(metrics["loss"]))
  jax.tree_util.tree_map(np.testing.assert_array_equal, skipped.params, huge.params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, skipped.opt_state, huge.opt_state)
  assert float(skipped.dynamic_scale.scale) == 2.0**99 and int(skipped.dynamic_scale.fin_steps) == 0
  assert int(skipped.step) == 1
  # Finite steps update the parameters; after growth_interval of them the scale doubles.
  scales, params = [], state.params
  for step in range(3):
    state, _ = train.train_step(state, batch, jax.random.key(10 + step))
    scales.append(float(state.dynamic_scale.scale))
    assert not np.array_equal(state.params["Dense_0"]["kernel"], params["Dense_0"]["kernel"])
    params = state.params
  assert scales == [2.0**15, 2.0**15, 2.0**16]
  assert train_state.loss_scale("bfloat16") is None and train_state.loss_scale("none") is None
  with pytest.raises(ValueError, match="half_precision: expected one of none, bfloat16, float16"):
    train_state.compute_dtype("float8")


# ----------------------------------------------------------------------------
# Curves


class _Recorder:
  def __init__(self):
    self.rows = []

  def write_scalars(self, step, scalars):
    self.rows.append((step, dict(scalars)))


def test_monitor_writes_steps_epochs_and_members():
  recorder = _Recorder()
  curves = monitor.Monitor(recorder, lambda step: 0.1 if step < 3 else 0.01)
  curves.start_epoch(0)
  for step, loss in ((2, 1.0), (4, 3.0)):
    info = {"step": step, "member": None, "loss": loss, "accuracy": 0.5, "examples_per_second": 9}
    curves.callback(info)
  shown = curves.end_epoch(1, 4, 100, {"loss": 0.7, "accuracy": 0.8})
  assert recorder.rows[0] == (2, {
    "train/loss": 1.0, "train/accuracy": 0.5, "train/learning_rate": 0.1,
    "train/examples_per_second": 9.0,
  })  # fmt: skip
  assert recorder.rows[1][1]["train/learning_rate"] == 0.01  # the rate of step 4 (0-based 3)
  assert shown["epoch/train_loss"] == 2.0 and shown["test/accuracy"] == 0.8
  assert recorder.rows[2] == (4, shown)
  # A vmapped ensemble reports [M] arrays: one curve per member, the epoch's mean.
  curves.start_epoch(4)
  curves.callback({"step": 6, "member": None, "loss": np.array([1.0, 2.0]),
                   "accuracy": np.array([0.5, 1.0]), "examples_per_second": 5})  # fmt: skip
  assert recorder.rows[3][1]["train/member_1/loss"] == 2.0
  assert curves.end_epoch(2, 6, 10)["epoch/train_accuracy"] == 0.75


# ----------------------------------------------------------------------------
# Settings


def _config(name: str, *overrides: str):
  argv = ["test", f"--config={pathlib.Path(runner.PACKAGED_CONFIGS) / name}.py", *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


RECIPE_BAD = [
  ("optimizer=rmsprop", "optimizer: expected one of adam, sgd, got 'rmsprop'"),
  ("lr_schedule=linear", "lr_schedule: expected one of constant, cosine, step, got 'linear'"),
  ("half_precision=float8", "half_precision: expected one of none, bfloat16, float16"),
  ("momentum=1.0", "momentum: expected a number in [0, 1), got 1.0"),
  ("weight_decay=-1e-4", "weight_decay: expected a number >= 0, got -0.0001"),
  ("warmup_epochs=-1", "warmup_epochs: expected a number >= 0, got -1"),
  ("warmup_epochs=3", "warmup_epochs: expected fewer than num_epochs=3, got 3"),
  ("lr_factor=0", "lr_factor: expected a number > 0, got 0"),
  ("lr_schedule=step", "lr_boundaries: lr_schedule=step needs the epochs where the rate drops"),
  (
    "lr_schedule=step --config.lr_boundaries=(2,1)",
    "lr_boundaries: expected increasing epochs in (0, num_epochs=3)",
  ),
  (
    "lr_schedule=step --config.lr_boundaries=(1,3)",
    "lr_boundaries: expected increasing epochs in (0, num_epochs=3)",
  ),
  ("augment=(crop,rotate)", "augment: expected names among none, crop, flip"),
  ("crop_padding=-1", "crop_padding: expected an integer >= 0, got -1"),
  ("log_every_steps=0", "log_every_steps: expected an integer >= 1, got 0"),
  ("eval_every_epochs=-1", "eval_every_epochs: expected an integer >= 0, got -1"),
]


@pytest.mark.parametrize("override, text", RECIPE_BAD)
def test_recipe_fields_are_checked_in_one_line(override, text):
  with pytest.raises(SettingError) as info:
    settings_lib.parse(_config("default", *(f"--config.{o}" for o in override.split(" --config."))))
  message = runner.one_line(info.value)
  assert "\n" not in message and message.startswith(f"--config.{text}"), message


def test_crop_without_padding_is_refused():
  config = _config("default", "--config.augment=(crop,flip)", "--config.crop_padding=0")
  with pytest.raises(SettingError, match="crop_padding: expected an integer >= 1, got 0"):
    settings_lib.parse(config)


def test_the_default_records_what_it_did_before_and_recipes_record_theirs():
  settings = settings_lib.parse(default.get_config())
  point = jobs.training_points(settings)[0]
  assert jobs.training_config(settings, point, "base") == {
    "dataset": "fashion_mnist", "limit_train": None, "model": "cnn", "train_dropout_rate": 0.1,
    "epochs": 3, "batch_size": 128, "learning_rate": 0.001, "seed": 0,
  }  # fmt: skip
  cifar = settings_lib.parse(_config("cifar10"))
  recorded = jobs.training_config(cifar, jobs.training_points(cifar)[0], "base")
  assert {k: recorded[k] for k in ("optimizer", "lr_schedule", "lr_boundaries")} == {
    "optimizer": "sgd", "lr_schedule": "step", "lr_boundaries": [82.0, 123.0]
  }  # fmt: skip
  assert recorded["augment"] == ["crop", "flip"] and "crop_padding" not in recorded  # 4
  assert recorded["weight_decay"] == 1e-4 and "momentum" not in recorded  # 0.9, the default
  assert "half_precision" not in recorded and "nesterov" not in recorded


@pytest.mark.parametrize(
  "name, model", [("cifar10", "resnet"), ("cifar100", "resnet"), ("cifar10_wrn", "wrn16_4"),
                  ("cifar100_wrn", "wrn16_4"), ("fashion_mnist_recipe", "cnn_wide")],
)  # fmt: skip
def test_every_recipe_config_checks_and_names_a_registered_model(name, model):
  settings = settings_lib.parse(_config(name))
  assert settings.models == (model,) and model in models.MODELS
  assert settings.optimizer == "sgd" and settings.augment
  steps = 50000 // settings.batch_size
  rate = training.optimizer(settings, steps).learning_rate
  assert rate(0) == pytest.approx(settings.learning_rate)
  assert rate(settings.num_epochs * steps - 1) <= settings.learning_rate / 100 * (1 + 1e-6)


def test_help_lists_every_recipe_field():
  text = usage.describe(_config("cifar10_wrn"), default.HELP)
  for field in jobs.RECIPE_DEFAULTS | {"log_every_steps": 0, "eval_every_epochs": 0}:
    assert f"--config.{field}: " in text and "(no description)" not in text
  assert "(default: 'sgd')" in text and "(default: (60, 120, 160))" in text


def test_the_packaged_names_agree_with_the_engine():
  assert settings_lib.OPTIMIZERS == optimizers.OPTIMIZERS
  assert settings_lib.SCHEDULES == optimizers.SCHEDULES
  assert settings_lib.AUGMENTATIONS == tuple(augment.AUGMENTATIONS)
  assert settings_lib.HALF_PRECISIONS == tuple(train_state.HALF_PRECISIONS)


# ----------------------------------------------------------------------------
# The CIFAR recipes end to end on TFDS mock data (tiny networks of the same classes)


TINY = {
  "resnet": lambda **kw: models.ResNet(blocks_per_stage=(1, 1, 1), widths=(4, 8, 8), **kw),
  "wrn16_4": lambda **kw: models.WideResNet(depth=10, widen_factor=1, **kw),
}


def _run_recipe(tmp_path, monkeypatch, name: str, *overrides: str):
  """The train launcher's work on ``name``'s config with mock CIFAR data: 48 training and
  24 test images, batches of 8 (6 steps an epoch), 2 epochs, a tiny network."""
  for model, make in TINY.items():
    monkeypatch.setitem(models.MODELS, model, make)
  dataset = "cifar100" if "100" in name else "cifar10"
  io_testing.write_tfds_metadata(tmp_path / "metadata", dataset, {"train": 50000, "test": 10000})
  config = _config(
    name, "--config.num_epochs=2", "--config.batch_size=8", "--config.ensemble_size=0",
    "--config.log_every_steps=2", "--config.limit_test=24", *overrides,
  )  # fmt: skip
  config.data_dir = str(tmp_path / "user")
  (tmp_path / "user").mkdir()
  settings = settings_lib.parse(config)
  policy = tfds.testing.MockPolicy.USE_FILES
  workdir = tmp_path / "work"
  with tfds.testing.mock_data(num_examples=48, policy=policy, data_dir=str(tmp_path / "metadata")):
    train_split, test_split = sweep_data.load_both(settings)
    points = jobs.training_points(settings)
    training.run(settings, workdir, data=(train_split, test_split))
    classes, sample = train_split.num_classes, train_split.images[:1]
    state = training.restore(settings, workdir, points[0], "base", classes, sample)
  folder = tmp_path / "work" / "train" / points[0].name / "base"
  return settings, train_split, state, folder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar10", "cifar100_wrn"])
def test_cifar_recipes_run_end_to_end_on_mock_data(tmp_path, monkeypatch, name):
  overrides = ["--config.lr_boundaries=(1,)"]
  settings, train_split, state, folder = _run_recipe(tmp_path, monkeypatch, name, *overrides)
  assert train_split.images.shape == (48, 32, 32, 3)
  assert state.augmentation == augment.Augmentation(("crop", "flip"), 4)
  assert int(state.step) == 12
  assert type(state.model).__name__ == ("ResNet" if name == "cifar10" else "WideResNet")
  done = json.loads((folder.parent / "base.json").read_text())
  assert done["config"]["optimizer"] == "sgd" and done["test"]["num_examples"] == 24
  with checkpoints.RunCheckpoints(folder / "checkpoints") as manager:
    assert manager.latest(state)[0] == 2  # the last epoch's checkpoint
  curves = metric_writer.read_scalars(folder / "tensorboard")
  rates = dict(curves["train/learning_rate"])
  peak, factor = settings.learning_rate, settings.lr_factor
  # Step 2 and 6 of epoch 1 at the peak; steps 8-12 of epoch 2 after the boundary.
  assert rates == pytest.approx({2: peak, 4: peak, 6: peak, 8: peak * factor, 10: peak * factor,
                                 12: peak * factor})  # fmt: skip
  assert [step for step, _ in curves["test/accuracy"]] == [6, 12]  # eval_every_epochs=1
  assert [step for step, _ in curves["epoch/train_loss"]] == [6, 12]
  assert all(np.isfinite(value) for _, value in curves["train/loss"])
  assert dict(curves["test/accuracy"])[12] == pytest.approx(done["test"]["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_a_cosine_recipe_with_warmup_and_bfloat16_on_mock_data(tmp_path, monkeypatch):
  overrides = [
    "--config.lr_schedule=cosine", "--config.warmup_epochs=1", "--config.half_precision=bfloat16",
    "--config.eval_every_epochs=0", "--config.augment=none",
  ]  # fmt: skip
  settings, _, state, folder = _run_recipe(tmp_path, monkeypatch, "cifar10", *overrides)
  assert not state.augmentation and state.model.dtype == jnp.bfloat16
  curves = metric_writer.read_scalars(folder / "tensorboard")
  rates = dict(curves["train/learning_rate"])
  peak = settings.learning_rate
  # Warmup over steps 0-5, then cosine from the peak over steps 6-11.
  expected = {2: peak / 6, 4: peak * 3 / 6, 6: peak * 5 / 6}
  expected |= {t: peak * 0.5 * (1 + np.cos(np.pi * (t - 7) / 6)) for t in (8, 10, 12)}
  assert rates == pytest.approx(expected, rel=1e-5)
  assert [step for step, _ in curves["test/accuracy"]] == [12]  # only after the last epoch
  assert all(np.isfinite(value) for _, value in curves["train/loss"])
