"""The main job: train, predict and evaluate, each stage skipped where its outputs exist.

With several tasks (a job array) each runs its share of the training points, and a final
run with one task writes the tables.
"""

import time

from absl import logging

from top1_jax.io import files, sweep_data
from top1_jax.pipeline import jobs, prediction, runs, sources, sweep, training
from top1_jax.pipeline.settings import Settings, check_test_examples, refuse_inputs


def check(settings: Settings) -> None:
  """The settings against the data's headers (no data read): before anything is written."""
  refuse_inputs(settings)
  test = sweep_data.check(settings)["test"]
  if test.num_examples is not None:
    check_test_examples(settings, test.num_examples, test.num_classes)


def run(settings: Settings, workdir, tasks=(0, 1), command: str = "") -> None:
  """The main job in ``workdir``: this task's training points trained, predicted, evaluated."""
  check(settings)
  timings = {}
  start = tic = time.perf_counter()
  data = training.load_data(settings)  # checked before anything is written
  train_split, test_split = data
  check_test_examples(settings, len(test_split.labels), test_split.num_classes)
  timings["data"] = time.perf_counter() - tic
  asked = sources.asked_files(settings, workdir)
  runs.record_sweep(settings, workdir, [name for name, _ in asked], command, tasks)
  points = jobs.task_share(jobs.training_points(settings), tasks)
  logging.info(
    "reproduce: %d of %d training point(s) in %s; data %s: %s train / %s test %s from %s",
    len(points), len(jobs.training_points(settings)), workdir, settings.dataset,
    f"{len(train_split.labels):,}", f"{len(test_split.labels):,}",
    train_split.images.shape[1:], train_split.source,
  )  # fmt: skip
  for stage, step in (("train", training.run), ("predict", prediction.run)):
    tic = time.perf_counter()
    step(settings, workdir, tasks, data if stage == "train" else test_split)
    timings[stage] = time.perf_counter() - tic
  if not runs.is_writer():
    return  # evaluation is process 0's alone (no collectives): the others are done
  tic = time.perf_counter()
  ours = {p.name for p in points}
  mine = [item for item in asked if item[0].split("/")[0] in ours]  # <point>/<kind>
  timings["evaluate"] = sweep.evaluate(settings, workdir, mine, tasks)
  timings["evaluate"]["total"] = time.perf_counter() - tic
  timings["total"] = time.perf_counter() - start
  index, count = tasks  # a task writes no tables: the run with one task does
  done = f"task {index} of {count} done"
  if count == 1:
    files.write_json(workdir / "timings.json", timings)
    page = sweep.write_page(settings, workdir, timings)
    done = f"done; tables in {workdir}/results.md, results page {page}"
  seconds = ", ".join(
    f"{k} {v['total'] if isinstance(v, dict) else v:.0f} s" for k, v in timings.items()
  )
  logging.info("reproduce: %s (%s)", done, seconds)
