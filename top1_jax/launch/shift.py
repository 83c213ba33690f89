r"""Calibration under dataset shift: calibrated on clean test examples, tested on them shifted.

  python -m top1_jax.launch.shift --config=shift --workdir=runs/default   # after the main job
  python -m top1_jax.launch.shift --config=shift --config.shift_examples=10000 \
      '--config.dropout_rates=(0.01,0.05,0.2)' --config.num_samples=32      # on a GPU

Stages, each skipped when its outputs exist (a killed run resumes):
  1. train: the config's networks, reused from the work dir where the main job (the same
     training fields) trained them;
  2. predict: the first ``shift_examples`` test images, clean, rotated, translated and
     corrupted, and out-of-distribution images, by the network, MC dropout at each rate
     and the ensemble, into ``<workdir>/shift/predictions/<point>/<set>/``;
  3. evaluate: every method calibrated on the clean calibration part of each split and
     tested on the same examples shifted (``top1_jax.evaluation.shift``), into
     ``<workdir>/shift/``: results.{csv,md,json}, ood.csv, figures/ and index.html.
"""

import sys
import time

from top1_jax.launch import cli

with cli.requiring("shift"):  # Flax, optax, orbax: one line naming the extra if missing
  from absl import logging

  from top1_jax.io import files, sweep_data
  from top1_jax.io import predictions as predictions_lib
  from top1_jax.launch import common, config_flag, evaluate, predict, reproduce, train
  from top1_jax.sweep import plan
  from top1_jax.sweep import shift as shift_sweep


def _predict_sets(settings, point, pool, out) -> list[tuple[str, object]]:
  """Every set's predictions files of one training point: (name, path), made if missing."""
  states = predict.trained_states(settings, point, pool)
  asked = []
  for index, shift_set in enumerate(shift_sweep.shift_sets(settings)):
    images = None
    for name in plan.predictions_names(settings, point):
      method = name.rsplit("/", 1)[1]
      info = {**plan.predictions_meta(settings, point, name), **shift_set.meta()}
      info["shift_examples"] = len(pool.labels)
      path = out / "predictions" / point.name / shift_set.slug / f"{method}.npz"
      asked.append((f"{point.name}/{shift_set.slug}/{method}", path))
      if predict.is_current(path, info):
        continue
      tic = time.perf_counter()
      if images is None:
        images = shift_sweep.make_images(shift_set, pool.images, point.seed)
      # OOD labels are placeholders (meta ood): never scored.
      labels = pool.labels[: len(images)] if shift_set.ood else pool.labels
      result = predict.predict_images(settings, point, info, states, images, labels, index)
      if common.is_writer():
        predictions_lib.save_predictions(path, result)
      logging.info("shift: %s (%.1f s)", asked[-1][0], time.perf_counter() - tic)
  return asked


def main(argv):
  del argv
  settings = config_flag.check()
  reproduce.check(settings)
  start = time.perf_counter()
  train_split, test_split = sweep_data.load_both(settings)
  pool = shift_sweep.first_examples(test_split, settings.shift_examples)
  reproduce.check_test_split(settings, len(pool.labels), pool.num_classes)
  out = common.workdir() / "shift"
  command = " ".join(["python -m top1_jax.launch.shift", *sys.argv[1:]])
  if common.is_writer():
    files.write_json(out / "config.json", common.run_record(settings, command))
  points = plan.task_share(plan.training_points(settings), common.tasks())
  timings = {}
  tic = time.perf_counter()
  train.run(settings, points, train_split, test_split)
  timings["train"] = time.perf_counter() - tic
  tic = time.perf_counter()
  asked = [item for point in points for item in _predict_sets(settings, point, pool, out)]
  timings["predict"] = time.perf_counter() - tic
  if not common.is_writer() or common.tasks()[1] > 1:
    return  # one run without --task_index evaluates every task's files
  timings["evaluate"] = evaluate.write_shift(settings, asked, out)
  timings["total"] = time.perf_counter() - start
  files.write_json(out / "timings.json", timings)
  logging.info("shift: done in %.0f s; tables in %s", timings["total"], out / "results.md")


def default_workdir() -> str:
  """The main job's work dir, whose networks it reuses: runs/default for the shift
  config, runs/cifar10 for cifar10_shift."""
  name = config_flag.config_name()
  return f"runs/{'default' if name == 'shift' else name.removesuffix('_shift')}"


if __name__ == "__main__":
  common.run(main, default_workdir)
