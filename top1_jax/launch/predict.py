r"""Writes each training point's predictions files: plain model, MC dropout, ensemble.

  python -m top1_jax.launch.predict --config=default --workdir=runs/default

Writes ``predictions/<point>/deterministic.npz`` (logits, S = 1),
``dropout_<rate>.npz`` (mean probabilities and the scores computed on device, or
all S samples with config.keep_samples) and ``ensemble.npz`` (the members'
logits). MC dropout is sharded over all processes' devices, chunked
(config.chunk_size), so [S, N, K] never has to fit in memory. A file that
exists and matches the config is skipped.
"""

import time

from top1_jax.launch import cli

with cli.requiring("predict"):  # Flax, optax, orbax: one line naming the extra if missing
  import jax
  from absl import logging

  from top1_jax.engine import mc, models
  from top1_jax.io import predictions as predictions_lib
  from top1_jax.io import sweep_data
  from top1_jax.launch import common, config_flag
  from top1_jax.launch import train as train_exp
  from top1_jax.sweep import plan


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
  settings, point, info: dict, states, x, labels, key_index: int = 0
) -> predictions_lib.Predictions:
  """One predictions file's contents: ``info`` (``plan.predictions_meta``) says which method.

  ``states(method)`` gives the trained state; ``key_index`` picks MC dropout's keys (0:
  the main job's; the shift job gives each set's its own, so sets share no masks).
  """
  state = states(info["method"])
  apply_fn = models.make_apply_fn(state.model)
  if info["method"] != "mc_dropout":
    result = mc.predict(
      apply_fn, state.variables, x, ensemble=info["method"] == "ensemble", keep_samples=True,
      chunk_size=settings.chunk_size, strategy=settings.ensemble_strategy,
    )  # fmt: skip
    return predictions_lib.Predictions(labels=labels, logits=result.logits, meta=info)
  index = settings.dropout_rates.index(info["dropout_rate"])
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(point.seed), 100), index)
  key = jax.random.fold_in(key, key_index) if key_index else key
  result = mc.predict(
    apply_fn, state.variables, x, key=key, num_samples=settings.num_samples,
    rate=info["dropout_rate"], chunk_size=settings.chunk_size, keep_samples=settings.keep_samples,
    progress=_progress(f"dropout {info['dropout_rate']:g} x{settings.num_samples}"),
  )  # fmt: skip
  # Scores computed on device in log space keep the precision that a float32 mean
  # probability loses when it saturates at 1.
  return predictions_lib.Predictions(
    labels=labels,
    logits=result.logits if settings.keep_samples else None,
    mean_probs=result.mean_probs,
    scores=result.scores,
    meta=info,
  )


def trained_states(settings, point, test_split):
  """``states(method)``: a point's trained base network or ensemble, restored once."""
  restored = {}

  def states(method):
    stage = "ensemble" if method == "ensemble" else "base"
    if stage not in restored:
      restored[stage] = train_exp.restore(
        settings, point, stage, test_split.num_classes, test_split.images[:1]
      )
    return restored[stage]

  return states


def run(settings: plan.Settings, points, test_split) -> None:
  """Writes every predictions file of ``points`` that is missing or stale."""
  for point in points:
    states = trained_states(settings, point, test_split)
    for name in plan.predictions_names(settings, point):
      path = common.workdir() / "predictions" / f"{name}.npz"
      if is_current(path, plan.predictions_meta(settings, point, name)):
        logging.info("predict: %s done already, skipping", name)
        continue
      start = time.perf_counter()
      info = plan.predictions_meta(settings, point, name)
      predictions = predict_images(
        settings, point, info, states, test_split.images, test_split.labels
      )
      if common.is_writer():
        predictions_lib.save_predictions(path, predictions)
        logging.info("predict: wrote %s (%.1f s)", path, time.perf_counter() - start)


def main(argv):
  del argv
  settings = config_flag.check()
  sweep_data.check(settings, ("test",))
  test_split = sweep_data.load(settings, "test")
  run(settings, plan.task_share(plan.training_points(settings), common.tasks()), test_split)


if __name__ == "__main__":
  common.run(main)
