r"""Trains each (model, train dropout rate, seed) of the config: a base network and a deep ensemble.

  python -m top1_jax.launch.train --config=default --workdir=runs/default

Training is data-parallel over all processes' devices. The ensemble's members
are trained together (one vmapped step) on GPU/TPU and one after the other on
CPU (config.ensemble_strategy). Checkpoints go through orbax's CheckpointManager
after every epoch (the last one kept): a killed run resumes from it; a finished
stage (``train/<point>/<stage>.json``) is skipped.
"""

import time

from top1_jax.launch import cli

with cli.requiring("train"):  # Flax, optax, orbax: one line naming the extra if missing
  import jax
  import numpy as np
  import optax
  from absl import logging

  from top1_jax.configs import default
  from top1_jax.core.validation import SettingError
  from top1_jax.engine import models, parallel, train
  from top1_jax.io import checkpoints, files, sweep_data
  from top1_jax.launch import common, config_flag
  from top1_jax.sweep import plan

STAGES = ("base", "ensemble")


def _template(settings, point, stage: str, num_classes: int, sample) -> train.TrainState:
  """A fresh state of the right structure: the initial state, and the restore template."""
  key = jax.random.fold_in(jax.random.key(point.seed), STAGES.index(stage))
  model = models.MODELS[point.model](num_classes=num_classes)
  tx, rate = optax.adam(settings.learning_rate), point.train_dropout_rate
  if stage == "base":
    return train.create_train_state(model, tx, key, sample, dropout_rate=rate)
  return train.init_ensemble(
    model, tx, key, sample, ensemble_size=settings.ensemble_size, dropout_rate=rate
  )


def _folder(point: plan.TrainingPoint):
  return common.workdir() / "train" / point.name


def is_done(settings, point, stage: str) -> bool:
  done = files.read_json(_folder(point) / f"{stage}.json")
  if done is None:
    return False
  if done.get("config") != plan.training_config(settings, point, stage):
    raise common.ExperimentError(
      f"--workdir: {_folder(point) / stage} was trained with other settings "
      f"({done.get('config')}); use a new --workdir or the same config"
    )
  return True


def _progress(label: str, epoch: int, epochs: int):
  def callback(info):
    member = "" if info.get("member") is None else f" member {info['member']}"
    logging.info(
      "  %s%s epoch %d/%d step %d/%d: loss %.4f acc %.4f (%.0f ex/s)",
      label, member, epoch, epochs, info["step"], info["num_steps"],
      np.mean(info["loss"]), np.mean(info["accuracy"]), info["examples_per_second"],
    )  # fmt: skip

  return callback


def _fit_epoch(settings, stage, state, images, labels, key, callback):
  kwargs = dict(num_steps=images.shape[0] // settings.batch_size, batch_size=settings.batch_size)
  kwargs["log_every"] = kwargs["num_steps"]
  if stage == "base":
    return train.fit(state, images, labels, key, callback=callback, **kwargs)
  strategy = settings.ensemble_strategy
  return train.fit_ensemble(
    state, images, labels, key, strategy=strategy, callback=callback, **kwargs
  )


def _diverged(settings, point, stage: str, epoch: int, error: train.DivergedError):
  """A diverged training as one line naming the learning rate, where, and the way out."""
  return SettingError(
    f"learning_rate: training diverged with learning_rate={settings.learning_rate:g} in epoch "
    f"{epoch} of train/{point.name}/{stage} (loss {error.loss:.3g} by step {error.step}, not "
    f"finite or above {train.MAX_LOSS:g}); try a smaller learning_rate (the default is "
    f"{default.get_config().learning_rate:g}) with a new --workdir, or after deleting "
    f"{_folder(point) / stage}"
  )


def run_stage(settings, point, stage: str, train_split, test_split) -> None:
  """Trains (or resumes) one stage of a training point and evaluates it on the test split."""
  label = f"train/{point.name}/{stage}"
  if stage == "ensemble" and settings.ensemble_size < 1:
    return
  if is_done(settings, point, stage):
    logging.info("%s: done already, skipping", label)
    return
  images, labels = train_split.images, train_split.labels
  state = _template(settings, point, stage, train_split.num_classes, images[:1])
  # Epoch checkpoints may only be resumed by a run with the same settings.
  started = _folder(point) / stage / "config.json"
  saved = files.read_json(started)
  if saved is not None and saved != plan.training_config(settings, point, stage):
    raise common.ExperimentError(
      f"--workdir: {started.parent} holds an unfinished run with other settings ({saved}); "
      "use a new --workdir or the same config"
    )
  if common.is_writer():
    files.write_json(started, plan.training_config(settings, point, stage))
  key = jax.random.fold_in(jax.random.key(point.seed), 10 + STAGES.index(stage))
  start = time.perf_counter()
  with checkpoints.RunCheckpoints(_folder(point) / stage / "checkpoints") as manager:
    first, state = manager.latest(state)
    if first:
      logging.info("%s: resuming after epoch %d", label, first)
    logging.info(
      "%s: %s on %s images, %d epochs", label, point.model, f"{len(labels):,}", settings.num_epochs
    )
    for epoch in range(first + 1, settings.num_epochs + 1):
      callback = _progress(label, epoch, settings.num_epochs)
      try:
        state = _fit_epoch(settings, stage, state, images, labels, key, callback)
      except train.DivergedError as e:  # before this epoch is saved or anything predicted
        raise _diverged(settings, point, stage, epoch, e) from None
      manager.save(epoch, state)
  seconds = time.perf_counter() - start
  if stage == "base":
    metrics = train.evaluate(state, test_split.images, test_split.labels)
  else:
    metrics = train.evaluate_ensemble(
      state, test_split.images, test_split.labels, strategy=settings.ensemble_strategy
    )
  accuracy, loss = metrics["accuracy"], metrics["loss"]
  logging.info("%s: test accuracy %.4f, NLL %.4f (%.0f s)", label, accuracy, loss, seconds)
  config = plan.training_config(settings, point, stage)
  result = {"config": config, "test": metrics, "train_seconds": seconds}
  if common.is_writer():
    files.write_json(_folder(point) / f"{stage}.json", result)
  parallel.barrier(label)  # the others read that marker next (is_done): wait for it


def restore(settings, point, stage: str, num_classes: int, sample: np.ndarray) -> train.TrainState:
  """The trained state of a finished stage."""
  if not is_done(settings, point, stage):
    raise common.ExperimentError(
      f"--workdir: no finished {stage} training of {point.name} in {common.workdir()}; run "
      "top1_jax.launch.train first"
    )
  state = _template(settings, point, stage, num_classes, sample)
  with checkpoints.RunCheckpoints(_folder(point) / stage / "checkpoints") as manager:
    return manager.latest(state)[1]


def run(settings: plan.Settings, points, train_split, test_split) -> None:
  for point in points:
    for stage in STAGES:
      run_stage(settings, point, stage, train_split, test_split)


def main(argv):
  del argv
  settings = config_flag.check()
  sweep_data.check(settings)
  train_split, test_split = sweep_data.load_both(settings)
  points = plan.task_share(plan.training_points(settings), common.tasks())
  run(settings, points, train_split, test_split)


if __name__ == "__main__":
  common.run(main)
