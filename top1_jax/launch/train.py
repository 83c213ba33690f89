r"""Trains each (model, train dropout rate, seed) of the config: a base network and a deep ensemble.

  python -m top1_jax.launch.train --config=default --workdir=runs/default

Training is data-parallel over all processes' devices. The ensemble's members
are trained together (one vmapped step) on GPU/TPU and one after the other on
CPU (config.ensemble_strategy). The optimizer, schedule, augmentation and
precision are the config's recipe (``top1_jax.engine.optimizers``, ``augment``,
``train_state``). Checkpoints go through orbax's CheckpointManager after every
epoch (the last one kept): a killed run resumes from it; a finished stage
(``train/<point>/<stage>.json``) is skipped. Curves (``engine.monitor``: loss,
accuracy, learning rate and examples/s every ``log_every_steps``, the epoch's means
and the test split every ``eval_every_epochs``) go to TensorBoard event files in
``train/<point>/<stage>/tensorboard`` and the log.
"""

import time

from top1_jax.launch import cli

with cli.requiring("train"):  # Flax, optax, orbax: one line naming the extra if missing
  import jax
  import numpy as np
  from absl import logging

  from top1_jax.configs import default
  from top1_jax.core.validation import SettingError
  from top1_jax.engine import augment, models, monitor, optimizers, parallel, train, train_state
  from top1_jax.io import checkpoints, files, metric_writer, sweep_data
  from top1_jax.launch import common, config_flag
  from top1_jax.sweep import plan

STAGES = ("base", "ensemble")


def optimizer(settings, steps_per_epoch: int) -> optimizers.Optimizer:
  """The config's optimizer; its schedule counts ``steps_per_epoch`` steps an epoch."""
  r = plan.recipe(settings)
  rate = optimizers.schedule(
    settings.learning_rate,
    r["lr_schedule"],
    num_steps=settings.num_epochs * steps_per_epoch,
    steps_per_epoch=steps_per_epoch,
    lr_boundaries=r["lr_boundaries"],
    lr_factor=r["lr_factor"],
    warmup_epochs=r["warmup_epochs"],
  )
  return optimizers.make(
    r["optimizer"],
    rate,
    momentum=r["momentum"],
    nesterov=r["nesterov"],
    weight_decay=r["weight_decay"],
  )


def _template(
  settings, point, stage: str, num_classes: int, sample, steps_per_epoch: int = 1
) -> train.TrainState:
  """A fresh state of the right structure: the initial state, and the restore template
  (whose schedule's values do not matter, only its structure: ``steps_per_epoch`` 1)."""
  r = plan.recipe(settings)
  key = jax.random.fold_in(jax.random.key(point.seed), STAGES.index(stage))
  kwargs = {"num_classes": num_classes}
  if r["half_precision"] != "none":  # the default module stays as it was (and hashes so)
    kwargs["dtype"] = train_state.compute_dtype(r["half_precision"])
  model = models.MODELS[point.model](**kwargs)
  tx = optimizer(settings, steps_per_epoch).tx
  extras = {
    "dropout_rate": point.train_dropout_rate,
    "augmentation": augment.make(r["augment"], r["crop_padding"] if "crop" in r["augment"] else 0),
    "dynamic_scale": train_state.loss_scale(r["half_precision"]),
  }
  if stage == "base":
    return train.create_train_state(model, tx, key, sample, **extras)
  return train.init_ensemble(model, tx, key, sample, ensemble_size=settings.ensemble_size, **extras)


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


def _fit_epoch(settings, stage, state, images, labels, key, callback):
  kwargs = dict(num_steps=images.shape[0] // settings.batch_size, batch_size=settings.batch_size)
  kwargs["log_every"] = settings.log_every_steps
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


def _evaluate(settings, stage: str, state, test_split) -> dict:
  if stage == "base":
    return train.evaluate(state, test_split.images, test_split.labels)
  return train.evaluate_ensemble(
    state, test_split.images, test_split.labels, strategy=settings.ensemble_strategy
  )


def _curves(point, stage: str):
  """The stage's metric writer (TensorBoard files from process 0; the log without
  tensorboardX, said once)."""
  enabled = common.is_writer()
  try:
    return metric_writer.MetricWriter(_folder(point) / stage / "tensorboard", enabled=enabled)
  except ModuleNotFoundError as e:
    logging.warning("train/%s/%s: no TensorBoard curves (%s)", point.name, stage, e)
    return metric_writer.MetricWriter(_folder(point) / stage / "tensorboard", enabled=False)


def _train_epochs(settings, point, stage, state, train_split, test_split, writer):
  """Resumes from the last checkpoint and trains the remaining epochs, saving each.

  Returns the trained state, the test metrics of the last epoch (None when it was not
  evaluated) and the seconds spent in evaluation."""
  label, (images, labels) = f"train/{point.name}/{stage}", (train_split.images, train_split.labels)
  key = jax.random.fold_in(jax.random.key(point.seed), 10 + STAGES.index(stage))
  steps_per_epoch = images.shape[0] // settings.batch_size
  curves = monitor.Monitor(writer, optimizer(settings, steps_per_epoch).learning_rate)
  test, eval_seconds = None, 0.0
  with checkpoints.RunCheckpoints(_folder(point) / stage / "checkpoints") as manager:
    first, state = manager.latest(state)
    if first:
      logging.info("%s: resuming after epoch %d", label, first)
    logging.info(
      "%s: %s on %s images, %d epochs", label, point.model, f"{len(labels):,}", settings.num_epochs
    )
    for epoch in range(first + 1, settings.num_epochs + 1):
      curves.start_epoch(int(np.reshape(state.step, -1)[0]))
      try:
        state = _fit_epoch(settings, stage, state, images, labels, key, curves.callback)
      except train.DivergedError as e:  # before this epoch is saved or anything predicted
        raise _diverged(settings, point, stage, epoch, e) from None
      manager.save(epoch, state)
      every, test, start = settings.eval_every_epochs, None, time.perf_counter()
      if epoch == settings.num_epochs or (every and epoch % every == 0):
        test = _evaluate(settings, stage, state, test_split)
        eval_seconds += time.perf_counter() - start
      members = 1 if stage == "base" else settings.ensemble_size
      step = int(np.reshape(state.step, -1)[0])
      shown = curves.end_epoch(epoch, step, members * steps_per_epoch * settings.batch_size, test)
      logging.info(
        "%s: epoch %d/%d: %s", label, epoch, settings.num_epochs,
        ", ".join(f"{tag} {value:.4g}" for tag, value in shown.items() if tag != "epoch/epoch"),
      )  # fmt: skip
  return state, test, eval_seconds


def run_stage(settings, point, stage: str, train_split, test_split) -> None:
  """Trains (or resumes) one stage of a training point and evaluates it on the test split."""
  label = f"train/{point.name}/{stage}"
  if stage == "ensemble" and settings.ensemble_size < 1:
    return
  if is_done(settings, point, stage):
    logging.info("%s: done already, skipping", label)
    return
  images = train_split.images
  steps_per_epoch = images.shape[0] // settings.batch_size
  state = _template(settings, point, stage, train_split.num_classes, images[:1], steps_per_epoch)
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
  start = time.perf_counter()
  with _curves(point, stage) as writer:
    state, metrics, eval_seconds = _train_epochs(
      settings, point, stage, state, train_split, test_split, writer
    )
    seconds = time.perf_counter() - start - eval_seconds
    if metrics is None:  # every epoch was done before: a resumed, finished run
      metrics = _evaluate(settings, stage, state, test_split)
      writer.write_scalars(int(np.reshape(state.step, -1)[0]), {
        "test/loss": metrics["loss"], "test/accuracy": metrics["accuracy"]
      })  # fmt: skip
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
