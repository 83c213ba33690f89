"""The predict stage: ``predictions/<point>/<job kind>.npz`` per prediction job, current
files skipped. MC dropout is sharded and chunked: [S, N, K] never has to fit in memory.
"""

import functools
import time

import jax
from absl import logging

from top1_jax.engine import mc, models
from top1_jax.io import predictions as predictions_lib
from top1_jax.io import sweep_data
from top1_jax.pipeline import jobs, training
from top1_jax.pipeline.runs import is_writer
from top1_jax.pipeline.settings import Settings


def is_current(path, expected: dict) -> bool:
  """The file exists, loads cleanly, and was made with the same settings."""
  if not path.exists():
    return False
  try:
    saved = predictions_lib.load_predictions(path).meta
  except ValueError as e:
    logging.warning("  %s is unreadable (%s); writing it again", path.name, e)
    return False
  return all(saved.get(k) == v for k, v in expected.items() if k != "version")


def _progress(label: str, every_seconds: float = 10.0):
  """A progress callback that logs at most every ``every_seconds`` and at the end."""
  start = last = time.perf_counter()

  def callback(done: int, total: int) -> None:
    nonlocal last
    now = time.perf_counter()
    if done == total or now - last >= every_seconds:
      last = now
      rate = done / max(now - start, 1e-9)
      logging.info(
        "  %s: %s/%s examples (%s ex/s)", label, f"{done:,}", f"{total:,}", f"{rate:,.0f}"
      )

  return callback


def predict_images(
  settings: Settings, job: jobs.PredictionJob, meta: dict, states, x, labels, key_index: int = 0
) -> predictions_lib.Predictions:
  """One predictions file's contents for ``job`` on images ``x``; ``states(stage)`` gives
  the trained state, ``key_index`` (the shift job's set; 0 for none) is folded into MC
  dropout's keys so that sets share no masks."""
  state = states(job.stage)
  apply_fn = models.make_apply_fn(state.model)
  if job.method != "mc_dropout":
    result = mc.predict(
      apply_fn, state.variables, x, ensemble=job.method == "ensemble", keep_samples=True,
      chunk_size=settings.chunk_size, strategy=settings.ensemble_strategy,
    )  # fmt: skip
    return predictions_lib.Predictions(labels=labels, logits=result.logits, meta=meta)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(job.point.seed), 100), job.key_index)
  key = jax.random.fold_in(key, key_index) if key_index else key
  result = mc.predict(
    apply_fn, state.variables, x, key=key, num_samples=job.num_samples, rate=job.dropout_rate,
    chunk_size=settings.chunk_size, keep_samples=settings.keep_samples,
    progress=_progress(f"dropout {job.dropout_rate!r} x{job.num_samples}"),
  )  # fmt: skip
  # Scores computed on device in log space keep the precision that a float32 mean
  # probability loses when it saturates at 1.
  logits = result.logits if settings.keep_samples else None
  return predictions_lib.Predictions(
    labels=labels, logits=logits, mean_probs=result.mean_probs, scores=result.scores, meta=meta
  )


def trained_states(settings: Settings, workdir, point: jobs.TrainingPoint, test_split):
  """``states(stage)``: a point's trained base network or ensemble, restored once."""
  num_classes, sample = test_split.num_classes, test_split.images[:1]
  return functools.cache(
    lambda stage: training.restore(settings, workdir, point, stage, num_classes, sample)
  )


def run(settings: Settings, workdir, tasks=(0, 1), test_split=None) -> None:
  """The predict stage: every missing or stale file of this task's training points."""
  if test_split is None:
    sweep_data.check(settings, ("test",))
    test_split = sweep_data.load(settings, "test")
  for point in jobs.task_share(jobs.training_points(settings), tasks):
    states = trained_states(settings, workdir, point, test_split)
    for job in jobs.prediction_jobs(settings, point):
      target, meta = workdir / "predictions" / f"{job.name}.npz", job.meta(settings)
      if is_current(target, meta):
        logging.info("predict: %s done already, skipping", job.name)
        continue
      start = time.perf_counter()
      result = predict_images(settings, job, meta, states, test_split.images, test_split.labels)
      if is_writer():
        predictions_lib.save_predictions(target, result)
        logging.info("predict: wrote %s (%.1f s)", target, time.perf_counter() - start)
