r"""Trains a base network and a deep ensemble, with a checkpoint after every epoch.

  python -m experiments.train --workdir=runs/fmnist --model=cnn --epochs=3 \
      --ensemble_size=5 --train_dropout_rate=0.1

The ensemble's members are trained together (one vmapped step) on GPU/TPU and
one after the other on CPU, where convolutions under vmap are slower
(--ensemble_strategy overrides). A killed run resumes from the last finished epoch;
a finished stage is skipped.
"""

import os
import pathlib
import shutil
import time
from collections.abc import Sequence

import jax
import numpy as np
import optax
from absl import flags

from experiments import common
from top1_jax import models, train
from top1_jax.io import checkpoints, datasets, files

MODEL = flags.DEFINE_enum(
  "model",
  "cnn",
  sorted(models.MODELS),
  "Network: mlp, cnn (28x28, strided convs) or resnet (ResNet-20).",
)
TRAIN_DROPOUT_RATE = flags.DEFINE_float("train_dropout_rate", 0.1, "Dropout rate while training.")
ENSEMBLE_SIZE = flags.DEFINE_integer("ensemble_size", 5, "Deep-ensemble members (0: no ensemble).")
EPOCHS = flags.DEFINE_integer("epochs", 3, "Training epochs (base model and each member).")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 128, "Examples per training step.")
LEARNING_RATE = flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
ENSEMBLE_STRATEGY = flags.DEFINE_enum(
  "ensemble_strategy", "auto", ["auto", "vmap", "loop"], "auto: vmap on GPU/TPU, loop on CPU."
)

STAGES = ("base", "ensemble")
STAGE_SPLITS = ("train", "test")


def config() -> dict:
  """The settings a trained checkpoint depends on."""
  return {
    "dataset": common.DATASET.value,
    "limit_train": common.LIMIT_TRAIN.value,
    "model": MODEL.value,
    "train_dropout_rate": TRAIN_DROPOUT_RATE.value,
    "epochs": EPOCHS.value,
    "batch_size": BATCH_SIZE.value,
    "learning_rate": LEARNING_RATE.value,
    "seed": common.SEED.value,
  }


def check_settings() -> None:
  """Every training flag, before any data is read or anything written: one line per problem."""
  common.workdir()  # required
  if EPOCHS.value < 1:
    raise common.ExperimentError(f"--epochs: expected at least 1, got {EPOCHS.value}")
  if BATCH_SIZE.value < 1:
    raise common.ExperimentError(f"--batch_size: expected at least 1, got {BATCH_SIZE.value}")
  if ENSEMBLE_SIZE.value < 0:
    raise common.ExperimentError(f"--ensemble_size: expected >= 0, got {ENSEMBLE_SIZE.value}")
  if not 0.0 <= TRAIN_DROPOUT_RATE.value < 1.0:
    raise common.ExperimentError(
      f"--train_dropout_rate: expected a rate in [0, 1), got {TRAIN_DROPOUT_RATE.value}"
    )
  if not LEARNING_RATE.value > 0:
    raise common.ExperimentError(f"--learning_rate: expected > 0, got {LEARNING_RATE.value}")
  # JAX takes any seed, but the later stages' NumPy splits need one >= 0.
  if common.SEED.value < 0:
    raise common.ExperimentError(f"--seed: expected an integer >= 0, got {common.SEED.value}")
  for flag in (common.LIMIT_TRAIN, common.LIMIT_TEST):
    if flag.value is not None and flag.value < 1:
      raise common.ExperimentError(f"--{flag.name}: expected an integer >= 1, got {flag.value}")


LIMITS = {"train": common.LIMIT_TRAIN, "test": common.LIMIT_TEST}


def _data_dir() -> str | None:
  data_dir = common.DATA_DIR.value or None
  return os.path.expanduser(data_dir) if data_dir and files.is_local(data_dir) else data_dir


def check_data(splits: Sequence[str] = STAGE_SPLITS) -> dict[str, datasets.SplitInfo]:
  """Where each split will be read from, and its size when the file headers tell it.

  Reads no data (IDX headers at most), so it runs before any work. An explicit
  --data_dir must exist and is the only place read (never replaced by the
  system copy), and the splits must come from one copy of the dataset.
  """
  data_dir = _data_dir()
  if data_dir and files.is_local(data_dir) and not os.path.isdir(data_dir):
    raise common.ExperimentError(
      f"--data_dir: no such directory: {common.DATA_DIR.value} (for TFDS to build a dataset "
      "into a new directory, create it first)"
    )
  info = {}
  for split in splits:
    try:
      info[split] = datasets.split_info(
        common.DATASET.value, split, data_dir=data_dir, limit=LIMITS[split].value, fallback=False
      )
    except (ValueError, FileNotFoundError, datasets.DataUnavailableError) as e:
      raise common.ExperimentError(f"--data_dir: {e}") from None
  _check_one_source({split: i.source for split, i in info.items()})
  count = info["train"].num_examples if "train" in info else None
  if count is not None:
    _check_batch_size(count)
  return info


def _check_one_source(sources: dict[str, str]) -> None:
  if len(set(sources.values())) > 1:
    where = " but ".join(f"the {split} split from {source}" for split, source in sources.items())
    raise common.ExperimentError(
      f"--data_dir: {common.DATASET.value}: {where}; both splits must come from one copy of "
      "the dataset (put all of its files in one directory)"
    )


def _check_batch_size(num_train: int) -> None:
  if num_train < BATCH_SIZE.value:
    raise common.ExperimentError(
      f"--batch_size: {BATCH_SIZE.value} is larger than the {num_train} training examples"
    )


def load_split(split: str) -> datasets.DatasetSplit:
  """One split, read where ``check_data`` found it: an explicit --data_dir is never replaced."""
  return datasets.load_dataset(
    common.DATASET.value,
    split,
    data_dir=_data_dir(),
    limit=LIMITS[split].value,
    fallback=False,
  )


def load_data() -> tuple[datasets.DatasetSplit, datasets.DatasetSplit]:
  """The train and test splits, checked to come from one source (TFDS: known only now)."""
  train_split, test_split = load_split("train"), load_split("test")
  _check_one_source({"train": train_split.source, "test": test_split.source})
  _check_batch_size(len(train_split.labels))
  # Checked before training: a network trained on one image size fails on another.
  if train_split.images.shape[1:] != test_split.images.shape[1:]:
    raise common.ExperimentError(
      f"--data_dir: train images are {train_split.images.shape[1:]} but test images"
      f" {test_split.images.shape[1:]}; both splits must have one image size"
    )
  return train_split, test_split


def make_model(num_classes: int):
  return models.MODELS[MODEL.value](num_classes=num_classes)


def template(stage: str, num_classes: int, sample: np.ndarray) -> train.TrainState:
  """A fresh state of the right structure: the initial state, and the restore template."""
  key = jax.random.fold_in(jax.random.key(common.SEED.value), STAGES.index(stage))
  tx = optax.adam(LEARNING_RATE.value)
  model = make_model(num_classes)
  if stage == "base":
    return train.create_train_state(model, tx, key, sample, dropout_rate=TRAIN_DROPOUT_RATE.value)
  return train.init_ensemble(
    model,
    tx,
    key,
    sample,
    ensemble_size=ENSEMBLE_SIZE.value,
    dropout_rate=TRAIN_DROPOUT_RATE.value,
  )


def stage_dir(stage: str) -> pathlib.Path:
  return common.workdir() / "train" / stage


def marker(stage: str) -> pathlib.Path:
  return common.workdir() / "train" / f"{stage}.json"


def expected_marker(stage: str) -> dict:
  cfg = config()
  if stage == "ensemble":
    cfg["ensemble_size"] = ENSEMBLE_SIZE.value
  return cfg


def is_done(stage: str) -> bool:
  done = common.read_json(marker(stage))
  if done is None:
    return False
  if done.get("config") != expected_marker(stage):
    raise common.ExperimentError(
      f"--workdir: {marker(stage)} was trained with other settings "
      f"({done.get('config')}); use a new --workdir or the same flags"
    )
  return True


def _latest_epoch(stage: str, state: train.TrainState) -> tuple[int, train.TrainState]:
  """The last finished epoch with a readable checkpoint, and its state (0 if none)."""
  epochs = sorted(
    (int(p.name.split("_")[1]) for p in stage_dir(stage).glob("epoch_*") if p.name[6:].isdigit()),
    reverse=True,
  )
  for epoch in epochs:
    try:
      return epoch, checkpoints.restore_checkpoint(stage_dir(stage) / f"epoch_{epoch}", state)
    except ValueError as e:
      common.say(f"  ignoring unreadable checkpoint epoch_{epoch}: {e}")
  return 0, state


def _progress(stage: str, epoch: int, epochs: int):
  def callback(info):
    member = "" if info.get("member") is None else f" member {info['member']}"
    loss = np.mean(info["loss"])
    accuracy = np.mean(info["accuracy"])
    common.say(
      f"  {stage}{member} epoch {epoch}/{epochs} step {info['step']}/{info['num_steps']}: "
      f"loss {loss:.4f} acc {accuracy:.4f} ({info['examples_per_second']:.0f} ex/s)"
    )

  return callback


def run_stage(stage: str, train_split, test_split) -> dict:
  """Trains (or resumes) one stage and evaluates it on the test split."""
  if stage == "ensemble" and ENSEMBLE_SIZE.value < 1:
    return {}
  if is_done(stage):
    common.say(f"train/{stage}: done already, skipping")
    return common.read_json(marker(stage))
  images, labels = train_split.images, train_split.labels
  state = template(stage, train_split.num_classes, images[:1])
  # Epoch checkpoints may only be resumed by a run with the same settings.
  started = stage_dir(stage) / "config.json"
  saved = common.read_json(started)
  if saved is not None and saved != expected_marker(stage):
    raise common.ExperimentError(
      f"--workdir: {stage_dir(stage)} holds an unfinished run with other settings ({saved}); "
      "use a new --workdir or the same flags"
    )
  common.write_json(started, expected_marker(stage))
  start_epoch, state = _latest_epoch(stage, state)
  steps_per_epoch = images.shape[0] // BATCH_SIZE.value
  if steps_per_epoch < 1:
    raise common.ExperimentError(
      f"--batch_size: {BATCH_SIZE.value} is larger than the {images.shape[0]} training examples"
    )
  key = jax.random.fold_in(jax.random.key(common.SEED.value), 10 + STAGES.index(stage))
  label = stage if stage == "base" else f"ensemble of {ENSEMBLE_SIZE.value}"
  if start_epoch:
    common.say(f"train/{stage}: resuming after epoch {start_epoch}")
  common.say(
    f"train/{stage}: {label} {MODEL.value} on {images.shape[0]:,} images, "
    f"{EPOCHS.value} epochs of {steps_per_epoch} steps"
  )
  start = time.perf_counter()
  for epoch in range(start_epoch + 1, EPOCHS.value + 1):
    callback = _progress(stage, epoch, EPOCHS.value)
    kwargs = dict(num_steps=steps_per_epoch, batch_size=BATCH_SIZE.value, log_every=steps_per_epoch)
    if stage == "base":
      state = train.fit(state, images, labels, key, callback=callback, **kwargs)
    else:
      state = train.fit_ensemble(
        state, images, labels, key, strategy=ENSEMBLE_STRATEGY.value, callback=callback, **kwargs
      )
    checkpoints.save_checkpoint(stage_dir(stage) / f"epoch_{epoch}", state, overwrite=True)
    for old in stage_dir(stage).glob("epoch_*"):
      if old.name != f"epoch_{epoch}":
        shutil.rmtree(old, ignore_errors=True)
  seconds = time.perf_counter() - start
  if stage == "base":
    metrics = train.evaluate(state, test_split.images, test_split.labels)
  else:
    metrics = train.evaluate_ensemble(
      state, test_split.images, test_split.labels, strategy=ENSEMBLE_STRATEGY.value
    )
  common.say(
    f"train/{stage}: test accuracy {metrics['accuracy']:.4f}, NLL {metrics['loss']:.4f} "
    f"({seconds:.0f} s)"
  )
  result = {
    "config": expected_marker(stage),
    "test": metrics,
    "train_seconds": seconds,
    "checkpoint": str(stage_dir(stage) / f"epoch_{EPOCHS.value}"),
  }
  common.write_json(marker(stage), result)
  return result


def restore(stage: str, num_classes: int, sample: np.ndarray) -> train.TrainState:
  """The trained state of a finished stage."""
  if not is_done(stage):
    raise common.ExperimentError(
      f"--workdir: no finished {stage} training in {common.workdir()}; run experiments.train first"
    )
  state = template(stage, num_classes, sample)
  return checkpoints.restore_checkpoint(stage_dir(stage) / f"epoch_{EPOCHS.value}", state)


def main(argv):
  del argv
  check_settings()
  check_data()
  train_split, test_split = load_data()
  common.say(
    f"data: {common.DATASET.value} train {train_split.images.shape} from {train_split.source}, "
    f"test {test_split.images.shape}"
  )
  for stage in STAGES:
    run_stage(stage, train_split, test_split)


if __name__ == "__main__":
  common.run(main)
