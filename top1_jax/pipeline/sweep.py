"""The evaluate stage: every (file, score, Top-k event, estimator) cross-validated, and tables.

Each sweep point is saved in ``<workdir>/sweep/`` with its settings and the file's hash; a
rerun reuses the points whose settings and file match, so a killed run resumes. Table 1 and
selective prediction need no sweep record and run beside the sweep.
"""

import concurrent.futures
import contextlib
import itertools
import re
import time
from collections.abc import Callable

import numpy as np
from absl import logging

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.evaluation import comparison, crossval, selective
from top1_jax.io import files
from top1_jax.pipeline import jobs, prediction_sets, runs, sources, tables
from top1_jax.pipeline.settings import Settings, check_examples, fail

Source = sources.Source


def _requested_scores(settings: Settings, found: list[Source]) -> list[str]:
  available = {name for source in found for name in source.scores}
  known = set(scores.REGISTRY)
  if settings.scores == ("all",):
    per_k = {scores.topk_name(k) for k in settings.topk}
    registered = [n for n in scores.REGISTRY if n in available or scores.REGISTRY[n].per_k]
    return registered + sorted(available - known - per_k)  # then the files' own scores
  unknown = [n for n in settings.scores if n not in available and n not in known]
  if unknown:
    raise SettingError(
      f"scores: unknown score(s) {', '.join(unknown)}; known: "
      f"{', '.join(scores.REGISTRY)} and the files' stored scores "
      f"{', '.join(sorted(available - known)) or '(none)'}"
    )
  return list(settings.scores)


def _points(settings: Settings, found: list[Source]) -> list[tuple]:
  requested = _requested_scores(settings, found)
  grid = itertools.product(settings.estimators, found, settings.topk, requested)
  every = dict.fromkeys((source, scores.for_event(score, k), k, e) for e, source, k, score in grid)
  points = [point for point in every if point[1] in point[0].scores]  # each once, if stored
  if not points:
    fail("scores", f"none of {', '.join(requested)} is available in the predictions files")
  return points


def _sweep_point(settings, source: Source, score: str, k: int, estimator: str, folder) -> dict:
  """One point's cross-validation, or the saved one when its settings and file match."""
  name = f"{source.slug}__{score}__top{k}" + tables.estimator_suffix(estimator, "__{}")
  path = folder / f"{name}.json"
  expected = dict(
    n_bins=list(settings.n_bins), n_folds=settings.n_folds, scheme=settings.scheme,
    seed=source.columns["seed"], file_sha1=source.digest,
  )  # fmt: skip
  saved = files.read_json(path)
  if saved is not None and saved.get("settings") == expected:
    return {**saved, "reused": True}
  cv = crossval.cross_validate(
    source.scores[score], source.correct(k), settings.n_bins, splits=source.splits,
    estimator=estimator, increasing=getattr(scores.lookup(score), "confident_when_high", False),
  )  # fmt: skip
  record = dict(
    settings=expected, file=str(source.path), source=source.name, columns=source.columns,
    score=score, topk=k, estimator=estimator, rows=cv.rows(), per_fold=cv.per_fold_lists(),
  )  # fmt: skip
  files.write_json(path, record)
  return record


def sweep(
  settings: Settings, found: list[Source], folder, *, log: Callable[[str], object] = print
) -> list[dict]:
  """Every sweep point of ``found``, cross-validated (and saved) or reused from ``folder``,
  ``log``ged: one record per (file, score, k, estimator) with ``settings``, ``file``,
  ``source``, ``columns``, ``score``, ``topk``, ``estimator``, ``rows`` and ``per_fold``."""
  points = _points(settings, found)
  num = len(found[0].labels)
  log(
    f"evaluate: {len(found)} file(s), {num:,} examples, {len(points)} sweep points x bins "
    f"{','.join(map(str, settings.n_bins))} x {settings.n_folds} {settings.scheme} splits"
  )
  records, reused, start = [], 0, time.perf_counter()
  for index, point in enumerate(points, 1):
    tic = time.perf_counter()
    records.append(_sweep_point(settings, *point, folder))
    if records[-1].pop("reused", False):
      reused += 1
      continue
    row, (source, score, k, estimator) = records[-1]["rows"][0], point
    log(
      f"  [{index}/{len(points)}] {source.label} {score} Top-{k} {estimator}: Brier "
      f"{row['brier']:.4f} ECE {row['ece']:.4f} ({row['n_bins']} bins) in "
      f"{time.perf_counter() - tic:.2f} s"
    )
  done = f" ({reused} point(s) done already, skipped)" if reused else ""
  log(f"evaluate: sweep finished in {time.perf_counter() - start:.1f} s{done}")
  return records


def baselines(settings: Settings, found: list[Source]) -> dict[str, list[dict]]:
  """Table 1's ``comparison.baseline_rows`` of each file whose headline score the sweep
  bins at Top-1, by file name."""
  points = _points(settings, found)
  out = {}
  for source in found:
    score = scores.headline(source.scores)
    if score is None or (source, score, 1, "bins") not in points:
      continue
    out[source.name] = comparison.baseline_rows(
      source.log_probs, source.labels, source.splits, single_model=source.single_model,
      ece_bins=settings.ece_bins, label_terms=source.label_terms,
    )  # fmt: skip
  return out


def table1(
  settings: Settings, found: list[Source], records: list[dict], baseline_rows: dict | None = None
) -> list[dict]:
  """The paper's Table 1 for each file's headline score (``evaluation.comparison``): the
  ``baselines`` (computed here when not given) beside the Top-1 bins' records."""
  baseline_rows = baselines(settings, found) if baseline_rows is None else baseline_rows
  binned = {
    (r["source"], r["score"]): next(x for x in r["rows"] if x["n_bins"] == settings.compare_bins)
    for r in records
    if r["topk"] == 1 and r["estimator"] == "bins"
  }
  rows = []
  for source in found:
    score = scores.headline(source.scores)
    if source.name not in baseline_rows or (source.name, score) not in binned:
      continue
    for row in baseline_rows[source.name]:
      row = comparison.table_row(row, binned[(source.name, score)])
      label = tables.variant_label(source.label, row["variant"])
      rows.append({"label": label, "source": source.name, "top1_score": score, **row})
      rows[-1].update(top1_n_bins=settings.compare_bins, ece_bins=settings.ece_bins)
  return rows


def selective_rows(settings: Settings, found: list[Source]) -> list[dict]:
  """Selective prediction with a guarantee from each file's headline-score bins (Top-1)."""
  rows = []
  for source in found:
    score = scores.headline(source.scores)
    if score is None:
      continue
    known = scores.lookup(score)
    order = "descending" if known is not None and known.confident_when_high else "ascending"
    for row in selective.validate_over_splits(
      np.asarray(source.scores[score]), source.correct(1), source.splits,
      n_bins=settings.compare_bins, targets=settings.selective_targets,
      delta=settings.selective_delta, order=order,
    ):  # fmt: skip
      rows.append({"label": source.label, "source": source.name, "score": score, **row})
  return rows


def _write_tables(settings, workdir, asked, records, table1, chosen, sets_) -> list[dict]:
  """results.{json,csv,md}; returns the sweep's tidy rows (results.csv also holds the sets')."""
  rows = tables.tidy_rows(records)
  for row in rows + sets_ if settings.inputs and settings.dataset else ():
    row["dataset"] = settings.dataset  # the user's word for their files (main)
  dataset = next((r["dataset"] for r in rows if r["dataset"]), "predictions")
  config = {"n_bins": list(settings.n_bins), "n_folds": settings.n_folds, "scheme": settings.scheme}
  config.update(seed=settings.seeds[0], dataset=settings.dataset, labels=settings.labels or None)
  config["inputs"] = list(settings.inputs) or [name for name, _ in asked]  # what was evaluated
  text = tables.markdown(rows, config, settings.topk, f"Calibrated Top-k bins: {dataset}")
  text += "".join("\n" + t + "\n" for t in (tables.comparison_table(table1),
                                            tables.selective_table(chosen),
                                            tables.sets_table(sets_)) if t)  # fmt: skip
  summary = {"config": config, "versions": runs.versions(), "results": rows, "sets": sets_}
  summary.update(comparison=table1, selective=chosen, points=records)
  files.write_json(workdir / "results.json", summary)
  csv_rows = [{k: v for k, v in r.items() if k != "label"} for r in rows + sets_]
  files.write_csv(workdir / "results.csv", csv_rows)
  files.write_bytes(workdir / "results.md", text.encode())
  return rows


HEADLINE_METRICS = ("accuracy", "brier", "nll", "ece", "eor", "auroc")
"""What the TensorBoard events hold of each file's headline score (Top-1, Table 1's bins)."""


def _write_curves(settings: Settings, workdir, rows: list[dict]) -> None:
  """The headline rows' metrics as TensorBoard scalars ``<file>/<metric>`` at step 0."""
  from top1_jax.io import metric_writer  # tensorboardX, in the [all] extra

  headline = [
    r for r in rows
    if (r["topk"], r["n_bins"], r["estimator"]) == (1, settings.compare_bins, "bins")
    and r["score"] == scores.headline([x["score"] for x in rows if x["source"] == r["source"]])
  ]  # fmt: skip
  tag = lambda r, m: re.sub(r"[^\w./-]", "_", f"{r['source']}/{m}")  # noqa: E731
  values = {tag(r, m): r[m] for r in headline for m in HEADLINE_METRICS if r[m] is not None}
  try:
    with metric_writer.MetricWriter(workdir / "tensorboard", enabled=runs.is_writer()) as writer:
      writer.write_scalars(0, values)
  except ModuleNotFoundError as e:  # a [cli] install: the tables hold the same numbers
    logging.info("evaluate: no TensorBoard events (%s)", e)


def write_figures(settings, workdir, sources_, records, rows, chosen, figure_bins) -> int:
  """The last step: every figure of the sweep into figures/; returns how many."""
  from top1_jax import plots  # matplotlib, imported only by runs that draw figures

  binned = [r for r in records if r["estimator"] == "bins"]
  topk = settings.topk
  written = plots.write_figures(
    workdir, sources_, binned, settings.n_bins, topk, figure_bins, settings.ece_bins
  )
  written += plots.write_risk_coverage_figures(workdir, sources_, chosen)
  return len(written + plots.write_dropout_rate_figures(workdir, rows, topk))


def _comparison(settings: Settings, sources_: list) -> tuple[dict, list, list, dict]:
  """Table 1's baseline rows, the selective rows, the prediction sets' rows, and the
  seconds of the first two ("comparison") and of the sets ("sets")."""
  tic = time.perf_counter()
  baseline_rows = baselines(settings, sources_)
  chosen = selective_rows(settings, sources_)
  toc = time.perf_counter()
  sets_ = [row for source in sources_ for row in prediction_sets.rows(settings, source)]
  seconds = {"comparison": toc - tic, "sets": time.perf_counter() - toc}
  if settings.set_methods:
    logging.info(
      "evaluate: prediction sets (%s) over %d splits in %.1f s",
      ", ".join(settings.set_methods), settings.n_folds, seconds["sets"],
    )  # fmt: skip
  return baseline_rows, chosen, sets_, seconds


@contextlib.contextmanager
def _beside():
  """A thread beside the sweep; a stop (Ctrl-C, SIGTERM) leaves without waiting for it."""
  pool, stopped = concurrent.futures.ThreadPoolExecutor(1), False
  try:
    yield pool
  except KeyboardInterrupt:
    stopped = True  # its XLA compiles may run for seconds; the runner exits at once
    raise
  finally:
    pool.shutdown(wait=not stopped, cancel_futures=stopped)


def evaluate(settings: Settings, workdir, asked, tasks=(0, 1)) -> dict:
  """The sweep of ``asked`` (this task's share), then (one task) the tables and figures.
  Returns the seconds of each step."""
  timings = {}
  index, count = tasks
  found = sources.load_sources(asked, settings, timings)
  num_classes = max(x.log_probs.shape[-1] for x in found)
  figure_bins = check_examples(settings, len(found[0].labels), num_classes, "examples")
  with _beside() as beside:
    # Table 1's XLA passes and compiles (which let go of the GIL) beside the host sorts.
    comparison_ = beside.submit(_comparison, settings, found) if count == 1 else None
    tic = time.perf_counter()
    records = sweep(settings, found, workdir / "sweep", log=logging.info)
    timings["sweep"] = time.perf_counter() - tic
    if comparison_ is None:
      done = "evaluate: task %d of %d done; when every task is, evaluate with this config and "
      logging.info(done + "no --task_index writes the tables", index, count)
      return timings
    baseline_rows, chosen, sets_, seconds = comparison_.result()
    timings.update(seconds)
  table1_rows = table1(settings, found, records, baseline_rows)
  tic = time.perf_counter()
  rows = _write_tables(settings, workdir, asked, records, table1_rows, chosen, sets_)
  _write_curves(settings, workdir, rows)
  timings["write"] = time.perf_counter() - tic
  logging.info("evaluate: %d rows; tables in %s (.csv, .json)", len(rows), workdir / "results.md")
  if settings.figures:
    from top1_jax.plots import figures  # matplotlib

    write_page(settings, workdir, timings)  # the tables first; with the figures when drawn
    logging.info("evaluate: drawing the figures")
    tic = time.perf_counter()
    with figures.rendering():
      num = write_figures(settings, workdir, found, records, rows, chosen, figure_bins)
    timings["figures"] = seconds = time.perf_counter() - tic
    logging.info("evaluate: %d figures in %s (%.1f s)", num, workdir / "figures", seconds)
  return timings


def check_present(settings: Settings, workdir, asked) -> None:
  """Before anything is written: a run of the wrong config leaves the work dir as it was."""
  try:
    sources.check_present(asked)
  except FileNotFoundError as e:
    made_with = (files.read_json(workdir / "manifest.json") or {}).get("config")
    if made_with is not None and made_with != runs.config_json(settings):
      raise FileNotFoundError(f"{e}; or give the --config {workdir} was made with") from e
    raise


def write_page(settings: Settings, workdir, timings: dict):
  """index.html from results.json, figures/, config.json and the timings; returns its path."""
  from top1_jax.pipeline import pages  # the page's template (jinja2) and the figures' names

  return pages.write_run_page(settings, workdir, timings)


def run(settings: Settings, workdir, tasks=(0, 1), command: str = "") -> None:
  """The evaluate stage over the files the settings ask for, and with ``shift_inputs`` the
  shift protocol over the shifted files, into ``shift/``."""
  from top1_jax.pipeline import dataset_shift  # its figures, data and tables

  start = time.perf_counter()
  asked = sources.asked_files(settings, workdir)
  shifted = sources.expanded("shift_inputs", settings.shift_inputs)
  ours = jobs.task_share(asked, tasks)
  check_present(settings, workdir, ours)
  runs.record_sweep(settings, workdir, [name for name, _ in asked], command, tasks)
  if not runs.is_writer():
    return  # evaluation is process 0's alone
  timings = evaluate(settings, workdir, ours, tasks)
  if tasks[1] > 1:
    return
  if settings.shift_inputs:
    timings["shift"] = dataset_shift.evaluate_files(settings, asked + shifted, workdir / "shift")
  timings["total"] = time.perf_counter() - start
  files.write_json(workdir / "timings.json", timings)
  path = write_page(settings, workdir, timings)
  logging.info("evaluate: done in %.0f s; results page %s", timings["total"], path)
