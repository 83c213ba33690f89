r"""The main job: train, sample, sweep, and write the paper-style tables and figures.

  python -m top1_jax.launch.reproduce                   # the default config, into runs/default
  python -m top1_jax.launch.reproduce --config=quick    # under a minute, into runs/quick
  python -m top1_jax.launch.reproduce --config=cifar10 --workdir=gs://bucket/c10
  python -m top1_jax.launch.reproduce --config=my_config.py  # a config of your own, by path
  python -m top1_jax.launch.reproduce --config=quick '--config.seeds=(0,1,2)' \
      --task_index=$SLURM_ARRAY_TASK_ID --num_tasks=3 --workdir=runs/seeds

Stages, each skipped when its outputs exist (so a killed run resumes):
  1. train each (model, train dropout rate, seed): a base network and a deep ensemble
  2. predict: the plain model, MC dropout at every rate, the ensemble
  3. sweep every score x bin count x Top-k over calibration/test splits, then
     write results.{json,csv,md}, figures/ and timings.json
Every setting is checked, against the others and the test split's size, before stage 1.
With --num_tasks, each task runs its share of the training points; a final run
without --task_index (or top1_jax.launch.evaluate) writes the tables.
"""

import sys
import time

from top1_jax.launch import cli

with cli.requiring("reproduce"):  # Flax, optax, orbax: one line naming the extra if missing
  from absl import logging

  from top1_jax.core.validation import SettingError
  from top1_jax.io import files, sweep_data
  from top1_jax.launch import common, config_flag, evaluate, predict, train
  from top1_jax.sweep import plan


def check(settings: plan.Settings) -> None:
  """The settings against the data's headers (no data read): before anything is written."""
  if settings.inputs:
    raise SettingError(
      "inputs: reproduce and shift evaluate the predictions they write; for other files run "
      "top1_jax.launch.evaluate (shifted ones: with shift_inputs)"
    )
  test = sweep_data.check(settings)["test"]
  if test.num_examples is not None:
    check_test_split(settings, test.num_examples, test.num_classes)


def check_test_split(settings: plan.Settings, num_examples: int, num_classes: int) -> None:
  limited = settings.limit_test == num_examples
  what = f"test examples (limit_test={settings.limit_test})" if limited else "test examples"
  plan.check_examples(settings, num_examples, num_classes, what)


def main(argv):
  del argv
  settings = config_flag.check()
  check(settings)
  timings = {}
  start = tic = time.perf_counter()
  # The data is loaded and checked before anything is written: a refused run leaves
  # the work dir as it was.
  train_split, test_split = sweep_data.load_both(settings)
  check_test_split(settings, len(test_split.labels), test_split.num_classes)
  timings["data"] = time.perf_counter() - tic
  workdir = common.workdir()
  asked = evaluate.asked_files(settings)
  command = " ".join(["python -m top1_jax.launch.reproduce", *sys.argv[1:]])
  evaluate.record_run(settings, [name for name, _ in asked], command)
  points = plan.task_share(plan.training_points(settings), common.tasks())
  logging.info(
    "reproduce: %s, %d of %d training point(s) in %s; data %s: %s train / %s test %s from %s",
    config_flag.config_name(), len(points), len(plan.training_points(settings)), workdir,
    settings.dataset,
    f"{len(train_split.labels):,}", f"{len(test_split.labels):,}",
    train_split.images.shape[1:], train_split.source,
  )  # fmt: skip
  tic = time.perf_counter()
  train.run(settings, points, train_split, test_split)
  timings["train"] = time.perf_counter() - tic
  tic = time.perf_counter()
  predict.run(settings, points, test_split)
  timings["predict"] = time.perf_counter() - tic
  if not common.is_writer():
    return  # evaluation is process 0's alone (no collectives): the others are done
  tic = time.perf_counter()
  ours = {f"{p.name}/" for p in points}
  timings["evaluate"] = evaluate.run(
    settings, [a for a in asked if a[0].split("/")[0] + "/" in ours]
  )
  timings["evaluate"]["total"] = time.perf_counter() - tic
  timings["total"] = time.perf_counter() - start
  if common.tasks()[1] == 1:
    files.write_json(workdir / "timings.json", timings)
    evaluate.write_page(settings, timings)
  seconds = ", ".join(
    f"{k} {v['total'] if isinstance(v, dict) else v:.0f} s" for k, v in timings.items()
  )
  index, count = common.tasks()  # a task writes no tables: the run without --task_index does
  done = f"task {index} of {count} done" if count > 1 else f"done; tables in {workdir}/results.md"
  logging.info("reproduce: %s (%s)", done, seconds)


def default_workdir() -> str:
  """runs/<config name>, e.g. runs/quick, when --workdir is not given."""
  return f"runs/{config_flag.config_name()}"


if __name__ == "__main__":
  common.run(main, default_workdir)
