r"""Sweeps scores x bin counts x Top-k events over predictions files; writes the results.

  python -m top1_jax.launch.evaluate --config=default --workdir=runs/default
  python -m top1_jax.launch.evaluate --config=evaluate_files --workdir=out \
      --config.inputs=a.npz,b.npz '--config.n_bins=(10,20,100)' '--config.topk=(1,5)'
  python -m top1_jax.launch.evaluate --config=evaluate_files --workdir=out \
      --config.inputs=p.npy --config.input_kind=probs --config.labels=y.npy
  python -m top1_jax.launch.evaluate --config=evaluate_files --workdir=out \
      --config.inputs=clean.npz '--config.shift_inputs=cifar10c/*.npz'   # under shift

The files are the ones the config asks for (``manifest.json``): its training
points' predictions, or ``config.inputs`` (predictions files, or one array of
``config.input_kind`` with ``config.labels``). Every (file, score,
event, estimator) is one sweep point, cross-validated over all bin counts on the
same random splits (``crossval.cross_validate``) and saved to ``sweep/``; a rerun
skips points that are done. With --num_tasks, each task sweeps its share of the
files, and a run without --task_index merges. Then ``results.{json,csv,md}``,
``figures/``, ``timings.json`` and ``index.html`` (all of them on one page) are written.
With ``config.shift_inputs`` (files of the inputs' examples shifted, their meta naming
``shift`` and ``severity``), each input is also calibrated on its clean examples and
tested on the shifted ones (``top1_jax.sweep.shift``), into ``shift/``.
"""

import concurrent.futures
import contextlib
import json
import os
import sys
import time

from absl import logging

from top1_jax.core.validation import SettingError
from top1_jax.io import files
from top1_jax.io import predictions as predictions_lib
from top1_jax.launch import common, config_flag
from top1_jax.sweep import plan, runner, shift, tables

CPU_DEVICE_PER_CORE = True
"""On a CPU, JAX gets a device per core, each scoring its own chunk of a file (chunked)."""


def _given_files(settings: plan.Settings) -> list[tuple[str, object]]:
  """config.inputs: predictions files (globs expanded), or one array made a predictions file."""
  if settings.input_kind != "predictions":  # plan.check: one .npy array, with labels
    (array,) = settings.inputs
    name = os.path.splitext(os.path.basename(array))[0]
    path = common.workdir() / "predictions" / f"{name}.npz"
    if common.is_writer():
      arrays = {settings.input_kind: array}  # logits=... or probs=...
      meta = {"dataset": settings.dataset} if settings.dataset else None
      predictions = predictions_lib.from_arrays(labels=settings.labels, meta=meta, **arrays)
      predictions_lib.save_predictions(path, predictions)
    return [(path.stem, path)]
  try:
    return [(path.stem, path) for path in files.expand(settings.inputs)]
  except FileNotFoundError as e:
    raise SettingError(f"inputs: {e}") from None


def _shifted_files(settings: plan.Settings) -> list[tuple[str, object]]:
  """config.shift_inputs: predictions files of the inputs' examples shifted (globs expanded)."""
  try:
    paths = files.expand(plan.field_items(settings, "shift_inputs"))
  except FileNotFoundError as e:
    raise SettingError(f"shift_inputs: {e}") from None
  return [(f"shifted/{path.stem}", path) for path in paths]


def asked_files(settings: plan.Settings) -> list[tuple[str, object]]:
  """(name, path) of every predictions file the config asks for, in the sweep's order."""
  if settings.inputs:
    return _given_files(settings)
  folder = common.workdir() / "predictions"
  return [
    (name, folder / f"{name}.npz")
    for point in plan.training_points(settings)
    for name in plan.predictions_names(settings, point)
  ]


def record_run(settings: plan.Settings, names: list[str], command: str) -> None:
  """config.json and manifest.json: what this sweep asks for, and a word on what it replaces.

  Files of an earlier sweep in the same work dir stay on disk but are never
  reported. Tasks of one sweep (--num_tasks) must share its config.
  """
  workdir = common.workdir()
  config = json.loads(settings.config.to_json())  # as it reads back: tuples are lists in JSON
  manifest = {"config": config, "files": names}
  before = files.read_json(workdir / "manifest.json")
  if before is not None and before != manifest:
    if common.tasks()[1] > 1:
      raise common.ExperimentError(
        f"--task_index: {workdir} holds a sweep of another config; all tasks of a sweep share "
        "one config (use a new --workdir for another sweep)"
      )
    dropped = sorted(set(before.get("files", [])) - set(names))
    changed = sorted(k for k in config if before.get("config", {}).get(k) != config[k])
    listed = f": {', '.join(dropped)}" if dropped else ""
    logging.warning(
      "evaluate: %s held a sweep of another config (changed: %s); its %d file(s) not asked for "
      "now stay on disk and are not reported%s",
      workdir, ", ".join(changed) or "none", len(dropped), listed,
    )  # fmt: skip
  if common.is_writer():
    files.write_json(workdir / "manifest.json", manifest)
    files.write_json(workdir / "config.json", common.run_record(settings, command))


def _check_present(settings: plan.Settings, asked: list[tuple[str, object]]) -> None:
  """Before anything is written: a run of the wrong --config leaves the work dir as it was."""
  try:
    runner.check_present(asked)
  except FileNotFoundError as e:
    made_with = (files.read_json(common.workdir() / "manifest.json") or {}).get("config")
    if made_with is not None and made_with != json.loads(settings.config.to_json()):
      raise FileNotFoundError(f"{e}; or give the --config {common.workdir()} was made with") from e
    raise


def _write_tables(settings, asked, records, table1, chosen) -> list[dict]:
  rows = tables.tidy_rows(records)
  for row in rows if settings.inputs and settings.dataset else ():
    row["dataset"] = settings.dataset  # the user's word for their files (main)
  dataset = next((r["dataset"] for r in rows if r["dataset"]), "predictions")
  config = {"n_bins": list(settings.n_bins), "n_folds": settings.n_folds, "scheme": settings.scheme}
  config.update(seed=settings.seeds[0], dataset=settings.dataset, labels=settings.labels or None)
  config["inputs"] = list(settings.inputs) or [name for name, _ in asked]  # what was evaluated
  text = tables.markdown(rows, config, settings.topk, f"Calibrated Top-k bins: {dataset}")
  text += "".join("\n" + t + "\n" for t in (tables.comparison_table(table1),
                                            tables.selective_table(chosen)) if t)  # fmt: skip
  out = common.workdir()
  summary = {"config": config, "versions": common.versions(), "results": rows}
  summary.update(comparison=table1, selective=chosen, points=records)
  files.write_json(out / "results.json", summary)
  files.write_csv(out / "results.csv", [{k: v for k, v in r.items() if k != "label"} for r in rows])
  files.write_bytes(out / "results.md", text.encode())
  return rows


def write_figures(settings, sources, records, rows, chosen, figure_bins) -> int:
  """The last stage: every figure of the sweep into figures/; returns how many."""
  from top1_jax import plots  # matplotlib: 0.5 s of import that runs without figures skip

  out = common.workdir()
  binned = [r for r in records if r["estimator"] == "bins"]
  written = plots.write_figures(out, sources, binned, settings.n_bins, settings.topk, figure_bins)
  written += plots.write_risk_coverage_figures(out, sources, chosen)
  return len(written + plots.write_dropout_rate_figures(out, rows, settings.topk))


def write_shift(settings: plan.Settings, asked, folder) -> dict:
  """The shift protocol over ``asked`` (clean, shifted and OOD files) into ``folder``:
  tables, figures and index.html; returns the seconds of each step."""
  evaluated, timings = shift.evaluate_and_write(settings, asked, folder, logging.info)
  if settings.figures:
    from top1_jax import plots  # matplotlib

    tic = time.perf_counter()
    panels = shift.figure_data(evaluated, settings.compare_bins)
    written = plots.write_shift_figures(folder, panels)
    timings["figures"] = time.perf_counter() - tic
    logging.info(
      "shift: %d figures in %s (%.1f s)", len(written), folder / "figures", timings["figures"]
    )
  from top1_jax.plots import page

  page.write_run_page(folder, timings, figures=None if settings.figures else [])
  return timings


def write_page(settings: plan.Settings, timings: dict) -> None:
  """index.html: results.md's tables, figures/, config.json and the timings on one page."""
  from top1_jax.plots import page

  page.write_run_page(common.workdir(), timings, figures=None if settings.figures else [])


def _comparison(settings: plan.Settings, sources: list) -> tuple[dict, list[dict], float]:
  tic = time.perf_counter()  # Table 1's baseline rows, the selective rows, their seconds
  baseline_rows = runner.baselines(settings, sources)
  chosen = runner.selective_rows(settings, sources)
  return baseline_rows, chosen, time.perf_counter() - tic


@contextlib.contextmanager
def _beside():
  """A thread beside the sweep; a stop (Ctrl-C, SIGTERM) leaves without waiting for it."""
  pool, stopped = concurrent.futures.ThreadPoolExecutor(1), False
  try:
    yield pool
  except KeyboardInterrupt:
    stopped = True  # its XLA compiles may run for seconds; common.run exits at once
    raise
  finally:
    pool.shutdown(wait=not stopped, cancel_futures=stopped)


def run(settings: plan.Settings, asked: list[tuple[str, object]]) -> dict:
  """The sweep of ``asked`` (this task's share of ``asked_files``); without tasks, then the
  tables and figures. Returns the seconds of each stage."""
  timings = {}
  index, count = common.tasks()
  sources = runner.load_sources(asked, settings, timings)
  figure_bins = plan.check_examples(
    settings, len(sources[0].labels), max(x.log_probs.shape[-1] for x in sources), "examples"
  )
  with _beside() as beside:
    # Table 1 and the selective rows need no sweep record: their XLA passes and compiles
    # (which let go of the GIL) run beside the sweep's host sorts; their seconds overlap.
    comparison = beside.submit(_comparison, settings, sources) if count == 1 else None
    tic = time.perf_counter()
    records = runner.run(settings, sources, common.workdir() / "sweep", log=logging.info)
    timings["sweep"] = time.perf_counter() - tic
    if comparison is None:
      done = "evaluate: task %d of %d done; when every task is, top1_jax.launch.evaluate with "
      logging.info(done + "this config and no --task_index writes the tables", index, count)
      return timings
    baseline_rows, chosen, timings["comparison"] = comparison.result()
  table1 = runner.table1(settings, sources, records, baseline_rows)
  tic = time.perf_counter()
  rows = _write_tables(settings, asked, records, table1, chosen)
  timings["write"] = time.perf_counter() - tic
  out = common.workdir()
  logging.info("evaluate: %d rows; tables in %s (.csv, .json)", len(rows), out / "results.md")
  if settings.figures:
    logging.info("evaluate: drawing the figures")
    tic = time.perf_counter()
    num_figures = write_figures(settings, sources, records, rows, chosen, figure_bins)
    timings["figures"] = time.perf_counter() - tic
    logging.info(
      "evaluate: %d figures in %s (%.1f s)", num_figures, out / "figures", timings["figures"]
    )
  return timings


def main(argv):
  del argv
  settings = config_flag.check()
  ignored = sorted(config_flag.given() & {"data_dir", "limit_train", "limit_test"})
  if settings.inputs and ignored:  # a sweep's own (quick's limit_test) made its files: no word
    named = ", ".join(f"--config.{name}" for name in ignored)
    logging.warning("evaluate: %s: for train and predict; evaluate reads files", named)
  if settings.inputs and "dataset" not in config_flag.given():
    settings.config.dataset = None  # a config's dataset is its training data's, not the files'
  start = time.perf_counter()
  asked = asked_files(settings)
  shifted = _shifted_files(settings) if settings.shift_inputs else []  # before any work
  ours = plan.task_share(asked, common.tasks())
  _check_present(settings, ours)
  command = " ".join(["python -m top1_jax.launch.evaluate", *sys.argv[1:]])
  record_run(settings, [name for name, _ in asked], command)
  if not common.is_writer():
    return  # evaluation is process 0's alone
  timings = run(settings, ours)
  if settings.shift_inputs and common.tasks()[1] == 1:
    timings["shift"] = write_shift(settings, asked + shifted, common.workdir() / "shift")
  timings["total"] = time.perf_counter() - start
  if common.tasks()[1] == 1:
    files.write_json(common.workdir() / "timings.json", timings)
    write_page(settings, timings)


if __name__ == "__main__":
  common.run(main, cpu_device_per_core=CPU_DEVICE_PER_CORE)
