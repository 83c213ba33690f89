"""The train stage: each training point's base network and deep ensemble, data-parallel; a
checkpoint after every epoch, so a killed run resumes, a finished stage is skipped, and one
whose only change is more epochs trains on.
"""

import time

import jax
import numpy as np
from absl import logging

from top1_jax.configs import default
from top1_jax.core.validation import SettingError
from top1_jax.engine import augment, models, monitor, optimizers, parallel, train, train_state
from top1_jax.io import checkpoints, files, metric_writer, sweep_data
from top1_jax.pipeline import jobs
from top1_jax.pipeline.runs import RunError, is_writer
from top1_jax.pipeline.settings import Settings


def optimizer(settings: Settings, steps_per_epoch: int) -> optimizers.Optimizer:
  """The settings' optimizer; its schedule counts ``steps_per_epoch`` steps an epoch."""
  rate = optimizers.schedule(
    settings.learning_rate, settings.lr_schedule, num_steps=settings.num_epochs * steps_per_epoch,
    steps_per_epoch=steps_per_epoch, lr_boundaries=settings.lr_boundaries,
    lr_factor=settings.lr_factor, warmup_epochs=settings.warmup_epochs,
  )  # fmt: skip
  return optimizers.make(
    settings.optimizer, rate, momentum=settings.momentum, nesterov=settings.nesterov,
    weight_decay=settings.weight_decay,
  )  # fmt: skip


def _template(settings, point, stage, num_classes, sample, steps_per_epoch=1) -> train.TrainState:
  """A fresh state: the initial one, or a restore's template (only its structure matters)."""
  key = jax.random.fold_in(jax.random.key(point.seed), jobs.STAGES.index(stage))
  kwargs = {"num_classes": num_classes}
  if settings.half_precision != "none":  # the default module stays as it was (and hashes so)
    kwargs["dtype"] = train_state.compute_dtype(settings.half_precision)
  model = models.MODELS[point.model](**kwargs)
  tx = optimizer(settings, steps_per_epoch).tx
  padding = settings.crop_padding if "crop" in settings.augment else 0
  extras = {
    "dropout_rate": point.train_dropout_rate,
    "augmentation": augment.make(settings.augment, padding),
    "dynamic_scale": train_state.loss_scale(settings.half_precision),
  }
  if stage == "base":
    return train.create_train_state(model, tx, key, sample, **extras)
  return train.init_ensemble(model, tx, key, sample, ensemble_size=settings.ensemble_size, **extras)


def folder(workdir, point: jobs.TrainingPoint):
  return workdir / "train" / point.name


def _refuse_other(where, saved: dict | None, wanted: dict, what: str) -> None:
  """Refuses a stage made with other settings, unless they only ask for more epochs."""
  saved = saved or {}  # none recorded: every field differs
  differing = sorted(k for k in {**saved, **wanted} if saved.get(k) != wanted.get(k))
  longer = differing == ["epochs"] and wanted["epochs"] > saved.get("epochs", 0)
  if saved != wanted and not longer:
    raise RunError(
      f"--workdir: {where} {what} with other settings (differing: {', '.join(differing)}); use "
      "a new --workdir or the same config (only a larger num_epochs continues a finished stage)"
    )


def is_done(settings, workdir, point, stage: str) -> bool:
  """Whether the stage finished with these settings (not with fewer epochs, nor with a
  damaged last checkpoint); other settings are refused."""
  done = files.read_json(folder(workdir, point) / f"{stage}.json")
  if not isinstance(done, dict) or done.get("retrain"):
    return False
  wanted, saved = jobs.training_config(settings, point, stage), done.get("config")
  _refuse_other(folder(workdir, point) / stage, saved, wanted, "was trained")
  return saved == wanted


def _fit_epoch(settings, stage, state, data, key, callback):
  """One epoch of ``data`` (``train.training_data``: checked and placed once a stage)."""
  kwargs = dict(num_steps=data.num_examples // settings.batch_size, batch_size=settings.batch_size)
  kwargs.update(log_every=settings.log_every_steps, steps_per_call=settings.steps_per_call)
  if stage == "base":
    return train.fit(state, data, None, key, callback=callback, **kwargs)
  strategy = settings.ensemble_strategy
  return train.fit_ensemble(state, data, None, key, strategy=strategy, callback=callback, **kwargs)


def _diverged(settings, label: str, where, epoch: int, error: train.DivergedError):
  """A diverged training as one line naming the learning rate, where, and the way out."""
  return SettingError(
    f"learning_rate: training diverged with learning_rate={settings.learning_rate:g} in epoch "
    f"{epoch} of {label} (loss {error.loss:.3g} by step {error.step}, not finite or above "
    f"{train.MAX_LOSS:g}); try a smaller learning_rate (the default is "
    f"{default.get_config().learning_rate:g}) with a new --workdir, or after deleting {where}"
  )


def _evaluate(settings, stage: str, state, test_split) -> dict:
  if stage == "base":
    return train.evaluate(state, test_split.images, test_split.labels)
  strategy = settings.ensemble_strategy
  return train.evaluate_ensemble(state, test_split.images, test_split.labels, strategy=strategy)


def _curves(workdir, point, stage: str):
  """The stage's metric writer: TensorBoard files from process 0, if tensorboardX is there."""
  logdir = folder(workdir, point) / stage / "tensorboard"
  try:
    return metric_writer.MetricWriter(logdir, enabled=is_writer())
  except ModuleNotFoundError as e:
    logging.warning("train/%s/%s: no TensorBoard curves (%s)", point.name, stage, e)
    return metric_writer.MetricWriter(logdir, enabled=False)


def _train_epochs(settings, workdir, point, stage, state, data, writer):
  """Trains the epochs after the last checkpoint, saving each; returns the state, the last
  epoch's test metrics (None if none ran) and the evaluation's seconds."""
  train_split, test_split = data
  label, (images, labels) = f"train/{point.name}/{stage}", (train_split.images, train_split.labels)
  key = jax.random.fold_in(jax.random.key(point.seed), 10 + jobs.STAGES.index(stage))
  steps_per_epoch = images.shape[0] // settings.batch_size
  curves = monitor.Monitor(writer, optimizer(settings, steps_per_epoch).learning_rate)
  test, eval_seconds = None, 0.0
  placed = train.training_data(state.model, images, labels)  # checked and placed, once
  with checkpoints.RunCheckpoints(folder(workdir, point) / stage / "checkpoints") as manager:
    first, state = manager.latest(state)
    if first:
      logging.info("%s: resuming after epoch %d", label, first)
    logging.info(
      "%s: %s on %s images, %d epochs", label, point.model, f"{len(labels):,}", settings.num_epochs
    )
    for epoch in range(first + 1, settings.num_epochs + 1):
      curves.start_epoch(int(np.reshape(state.step, -1)[0]))
      try:
        state = _fit_epoch(settings, stage, state, placed, key, curves.callback)
      except train.DivergedError as e:  # before this epoch is saved or anything predicted
        raise _diverged(settings, label, folder(workdir, point) / stage, epoch, e) from None
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


def _check_started(settings, workdir, point, stage: str) -> None:
  """Epoch checkpoints are resumed only by a run with the same settings (or more epochs)."""
  started = folder(workdir, point) / stage / "config.json"
  saved, wanted = files.read_json(started), jobs.training_config(settings, point, stage)
  if saved is not None:
    _refuse_other(started.parent, saved, wanted, "holds an unfinished run")
  if is_writer():
    files.write_json(started, wanted)


def run_stage(settings, workdir, point, stage: str, data) -> None:
  """Trains (or resumes) one stage of a training point and evaluates it on the test split."""
  label = f"train/{point.name}/{stage}"
  if stage == "ensemble" and settings.ensemble_size < 1:
    return
  if is_done(settings, workdir, point, stage):
    logging.info("%s: done already, skipping", label)
    return
  train_split, test_split = data
  images = train_split.images
  steps_per_epoch = images.shape[0] // settings.batch_size
  state = _template(settings, point, stage, train_split.num_classes, images[:1], steps_per_epoch)
  _check_started(settings, workdir, point, stage)
  start = time.perf_counter()
  with _curves(workdir, point, stage) as writer:
    state, metrics, eval_seconds = _train_epochs(
      settings, workdir, point, stage, state, data, writer
    )
    seconds = time.perf_counter() - start - eval_seconds
    if metrics is None:  # every epoch was done before: a resumed, finished run
      metrics = _evaluate(settings, stage, state, test_split)
      scalars = {f"test/{k}": metrics[k] for k in monitor.TEST_METRICS if k in metrics}
      writer.write_scalars(int(np.reshape(state.step, -1)[0]), scalars)
  accuracy, loss = metrics["accuracy"], metrics["loss"]
  logging.info("%s: test accuracy %.4f, NLL %.4f (%.0f s)", label, accuracy, loss, seconds)
  config = jobs.training_config(settings, point, stage)
  if is_writer():
    result = {"config": config, "test": metrics, "train_seconds": seconds}
    files.write_json(folder(workdir, point) / f"{stage}.json", result)
  parallel.barrier(label)  # the others read that marker next (is_done): wait for it


def restore(settings, workdir, point, stage: str, num_classes: int, sample) -> train.TrainState:
  """The trained state of a finished stage."""
  if not is_done(settings, workdir, point, stage):
    raise RunError(
      f"--workdir: no finished {stage} training of {point.name} in {workdir}; run the train "
      "stage first (experiments/train.py, or top1-train)"
    )
  state = _template(settings, point, stage, num_classes, sample)
  with checkpoints.RunCheckpoints(folder(workdir, point) / stage / "checkpoints") as manager:
    epoch, state = manager.latest(state)
  if epoch != settings.num_epochs:  # its last checkpoint was damaged, and set aside
    marker = folder(workdir, point) / f"{stage}.json"
    if is_writer():
      files.write_json(marker, {**files.read_json(marker), "retrain": True})
    raise RunError(
      f"--workdir: the last checkpoint of train/{point.name}/{stage} was damaged and set "
      f"aside (epoch {epoch} of {settings.num_epochs} left); rerun the same command: the "
      "train stage trains the missing epochs again"
    )
  return state


def load_data(settings: Settings):
  """The train and test splits, their headers checked first."""
  sweep_data.check(settings)
  return sweep_data.load_both(settings)


def run(settings: Settings, workdir, tasks=(0, 1), data=None) -> None:
  """The train stage: this task's training points, each base and ensemble (``data``: the
  (train, test) splits if already loaded)."""
  data = load_data(settings) if data is None else data
  for point in jobs.task_share(jobs.training_points(settings), tasks):
    for stage in jobs.STAGES:
      run_stage(settings, workdir, point, stage, data)
