"""Dataset shift (Ovadia et al. 2019): every method calibrated on clean data, tested shifted.

``run`` trains or reuses the networks, predicts every ``ShiftSet`` into ``shift/predictions/``
of the work dir and evaluates them into ``shift/`` (results.{csv,md,json}, ood.csv, figures/).
"""

import dataclasses
import itertools
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.engine import corruptions, shifts
from top1_jax.evaluation import accuracy_estimates, ood, protocol, recalibration
from top1_jax.io import files, ood_sets, results
from top1_jax.io import predictions as predictions_lib
from top1_jax.pipeline import jobs, prediction_sets, runs, shift_tables, sources, tables
from top1_jax.pipeline.settings import (
  Settings,
  check_test_examples,
  refuse_inputs,
  smallest_calibration,
)

LOG_PROBS_SCORE = shift_tables.LOG_PROBS_SCORE


@dataclasses.dataclass(frozen=True)
class ShiftSet:
  """One test set: ``clean``, a rotation (degrees), a translation (pixels), a corruption
  (intensity 1-5) or ``ood_<name>`` (images outside the label set); intensity 0 for clean
  and OOD."""

  shift: str
  severity: int | float = 0

  @property
  def ood(self) -> bool:
    return results.is_ood(self.shift)

  @property
  def slug(self) -> str:
    """Its folder name: ``clean``, ``rotate_15``, ``gaussian_noise_3``, ``ood_digits``."""
    if self.shift == results.CLEAN or self.ood:
      return self.shift
    return f"{self.shift}_{self.severity:g}"

  def meta(self) -> dict[str, Any]:
    """What its predictions files record beside the method's meta."""
    return {"shift": self.shift, "severity": self.severity, **({"ood": True} if self.ood else {})}


def shift_sets(settings: Settings) -> list[ShiftSet]:
  """Every set of the settings, once each, the clean one first, in the tables' order."""
  sets = [
    ShiftSet(results.CLEAN, 0),
    *(ShiftSet(settings.shift_rotation, tables.severity(d)) for d in settings.shift_rotations),
    *(ShiftSet(settings.shift_translation, p) for p in settings.shift_translations),
    *(ShiftSet(name, s) for name in settings.shift_corruptions for s in settings.shift_severities),
    *(ShiftSet(results.OOD_PREFIX + name) for name in settings.shift_ood),
  ]
  return list(dict.fromkeys(sets))


def first_examples(split, num: int | None):
  """The clean set: a ``DatasetSplit``'s first ``num`` examples (all when None)."""
  if num is None or num >= len(split.labels):
    return split
  ids = None if split.ids is None else split.ids[:num]
  return split._replace(images=split.images[:num], labels=split.labels[:num], ids=ids)


def make_images(shift_set: ShiftSet, images: np.ndarray, seed: int) -> np.ndarray:
  """The set's images from the clean ones ([M, H, W, C] float32 in [0, 1]), by seed; a
  corruption's intensities share its key, so a higher one corrupts the same image more."""
  if shift_set.shift == results.CLEAN:
    return images
  if shift_set.shift in shifts.GEOMETRIC:
    return np.asarray(shifts.GEOMETRIC[shift_set.shift](images, shift_set.severity))
  if shift_set.ood:
    name = shift_set.shift.removeprefix(results.OOD_PREFIX)
    num = min(len(images), ood_sets.OOD_SETS[name].max_num or len(images))
    return np.asarray(ood_sets.load(name, images.shape[1:], num, seed))
  key = jax.random.fold_in(jax.random.key(seed), corruptions.names().index(shift_set.shift))
  return np.asarray(corruptions.corrupt(shift_set.shift, images, key, int(shift_set.severity)))


@dataclasses.dataclass
class Group:
  """One method of one model: its clean file, shifted files and OOD files."""

  clean: sources.Source
  shifted: list = dataclasses.field(default_factory=list)
  ood: list = dataclasses.field(default_factory=list)


_NOT_THE_MODEL = ("source", "shift", "severity")  # what differs between a group's files


def _key(source: sources.Source) -> tuple:
  return tuple(v for k, v in source.columns.items() if k not in _NOT_THE_MODEL)


def _is_clean(source: sources.Source) -> bool:
  return source.columns["shift"] == results.CLEAN and not source.meta.get("ood")


def group_sources(found: Sequence[sources.Source]) -> list[Group]:
  """The files by model and method (their columns but source, shift and severity), each
  group with one clean file whose labels its shifted files share. A user's shifted file
  (named ``shifted/...``) must say in its meta what shift it holds."""
  groups: dict[tuple, Group] = {}
  for source in filter(_is_clean, found):
    if source.name.startswith(sources.SHIFTED):
      raise SettingError(
        f"shift_inputs: {source.path} names no shift in its meta (a shifted file's meta holds "
        '"shift" and "severity", or "ood": true); without them it would read as a second clean '
        "set"
      )
    if _key(source) in groups:
      raise SettingError(
        f"inputs: {source.name} and {groups[_key(source)].clean.name} are both clean files "
        "of one model and method; give one clean file per model"
      )
    groups[_key(source)] = Group(source)
  for source in itertools.filterfalse(_is_clean, found):
    group = groups.get(_key(source))
    if group is None:
      raise SettingError(
        f"shift_inputs: {source.name} has no clean file of the same model and method "
        f"({', '.join(f'{k}={v}' for k, v in source.columns.items() if k not in _NOT_THE_MODEL)}"
        "); give it in inputs"
      )
    if source.meta.get("ood"):
      group.ood.append(source)
      continue
    if not np.array_equal(source.labels, group.clean.labels):
      raise SettingError(
        f"shift_inputs: {source.name} has other labels than the clean {group.clean.name}: a "
        "shifted set must hold the clean set's examples, in the same order"
      )
    group.shifted.append(source)
  return list(groups.values())


def _score_names(settings: Settings, source: sources.Source) -> list[str]:
  """The clean file's scores of ``settings.scores`` that exist on any input (no oracle, no
  human ones: they need labels)."""
  wanted, names = tuple(settings.scores), []
  for name in source.scores:
    known = scores.lookup(name)
    if known is not None and (known.inputs in ("labels", "human_probs") or known.per_k):
      continue  # per-k: neg_log_top<k>_mass, whose k = 1 twin is neg_log_pmax
    if wanted == ("all",) or name in wanted:
      names.append(name)
  return names


def _inputs(source: sources.Source, labelled: bool = True) -> protocol.Inputs:
  return protocol.Inputs(source.log_probs, source.labels if labelled else None, source.scores)


def _evaluate_group(settings: Settings, group: Group, names: list[str]) -> tuple[list, list, list]:
  """One model's records (``tables.tidy_rows``'), OOD rows and OOD results."""
  clean, estimators = group.clean, settings.shift_estimators
  sets = [clean, *group.shifted]
  chosen = protocol.methods(estimators, names, LOG_PROBS_SCORE)
  found = protocol.evaluate(
    _inputs(clean), clean.splits, chosen, test_sets=[_inputs(s) for s in sets],
    n_bins=settings.n_bins,
  )  # fmt: skip
  records = []
  for r in found:
    record = {"columns": sets[r.test_set].columns, "score": r.score, "topk": 1}
    records.append({**record, "estimator": r.estimator, "rows": r.metrics.rows()})
  if not group.ood:
    return records, [], []
  reports = ood.ood_report(
    _inputs(clean), [_inputs(s, False) for s in group.ood], clean.splits, scores=names,
    estimators=estimators, k=1, log_probs_score=LOG_PROBS_SCORE, n_bins=settings.compare_bins,
  )  # fmt: skip
  ood_rows = []
  for r in reports:
    source = group.ood[r.ood]
    row = {**clean.columns, "source": source.name, "shift": source.columns["shift"]}
    row.update(score=r.score, estimator=r.estimator, ood_auroc=r.auroc)
    row["ood_auroc_by_p_correct"] = float(np.nanmean(r.auroc_prob))
    row.update({f"p_correct_{k}": v for k, v in r.ood_summary.items()})
    row.update({f"clean_p_correct_{k}": v for k, v in r.clean_summary.items()})
    ood_rows.append(row)
  return records, ood_rows, reports


def _recalibration_rows(settings: Settings, group: Group, names: list[str]) -> list[dict]:
  """recalibration.csv's rows of one model: every recalibration after m labels, per set."""
  if not settings.shift_num_labels or not (
    group.clean.single_model or settings.shift_recalibrate_samples
  ):
    return []
  clean, splits = group.clean, group.clean.splits
  sets = [clean, *group.shifted]
  smallest = min(int((~splits.test_mask(f)).sum()) for f in range(splits.num_splits))
  check_num_labels(settings, smallest, f"the {len(clean.labels)} examples of {clean.name}")
  found = recalibration.recalibrate(
    _inputs(clean), [_inputs(s) for s in sets], splits,
    scores=[s for s in settings.shift_recalibration_scores if s in names],
    log_probs_score=LOG_PROBS_SCORE, num_labels=settings.shift_num_labels,
    num_draws=settings.shift_label_draws, seed=clean.columns["seed"],
    n_bins=settings.compare_bins, prior_strength=settings.shift_prior_strength,
  )  # fmt: skip
  rows = []
  for r in found:
    columns = sets[r.test_set].columns
    row = {**columns, "recalibration": r.recalibration, "score": r.score, "topk": 1}
    row.update(num_labels=r.num_labels, **r.metrics.rows()[0], label=clean.label)
    rows.append(row)
  return rows


def check_num_labels(settings: Settings, smallest: int, what: str) -> None:
  """``shift_num_labels`` against the smallest calibration part (of ``what``)."""
  if settings.shift_num_labels and max(settings.shift_num_labels) > smallest:
    raise SettingError(
      f"shift_num_labels: {max(settings.shift_num_labels)} labelled examples exceed the "
      f"smallest calibration part ({smallest} of {what}); choose at most {smallest}"
    )


def _accuracy_rows(settings: Settings, group: Group, names: list[str]) -> list[dict]:
  """accuracy_estimates.csv's rows of one model: each estimator on each set, and the truth."""
  sets = [group.clean, *group.shifted]
  outside = {len(sets) + i: _inputs(source, False) for i, source in enumerate(group.ood)}
  found = accuracy_estimates.estimate(
    _inputs(group.clean), group.clean.splits,
    scores=[s for s in settings.shift_accuracy_scores if s in names],
    shifted=[_inputs(s) for s in sets], ood=outside, n_bins=settings.compare_bins,
    log_probs_score=LOG_PROBS_SCORE,
  )  # fmt: skip
  rows = []
  for e in found:
    columns = (sets + group.ood)[e.target].columns
    error = e.predicted - e.accuracy
    rows.append({
      **columns, "estimator": e.estimator, "score": e.score,
      "predicted_accuracy": float(np.mean(e.predicted)), "accuracy": float(np.mean(e.accuracy)),
      "error": float(np.mean(error)), "absolute_error": float(np.mean(np.abs(error))),
      "label": group.clean.label,  # the model's, not each file's
    })  # fmt: skip
  return rows


def evaluate(settings: Settings, found: Sequence[sources.Source], log: Callable = print) -> dict:
  """Every group's tables: ``rows`` (results.csv's, with ``label``), ``ood_rows``,
  ``histograms`` (OOD and clean P(correct) of the first split, by OOD row's source, score
  and estimator), ``recalibration_rows``, ``accuracy_rows`` and ``set_rows``."""
  records, ood_rows, histograms = [], [], {}
  recalibrated, accuracies, set_rows = [], [], []
  for group in group_sources(found):
    tic, names = time.perf_counter(), _score_names(settings, group.clean)
    group_records, group_ood, reports = _evaluate_group(settings, group, names)
    records += group_records
    ood_rows += group_ood
    recalibrated += _recalibration_rows(settings, group, names)
    accuracies += _accuracy_rows(settings, group, names)
    set_rows += prediction_sets.rows(settings, group.clean, group.shifted)
    first = int(group.clean.splits.test_mask(0).sum())  # clean_prob: the splits in order
    for row, report in zip(group_ood, reports, strict=True):
      # The histograms show one calibration: the first split's.
      arrays = {results.CLEAN: report.clean_prob[:first], row["shift"]: report.ood_prob[0]}
      histograms[row["source"], row["score"], row["estimator"]] = arrays
    log(
      f"shift: {group.clean.label}: {1 + len(group.shifted)} set(s), {len(group.ood)} OOD "
      f"set(s), {len(group_records)} rows in {time.perf_counter() - tic:.1f} s"
    )
  return {
    "rows": tables.tidy_rows(records), "ood_rows": ood_rows, "histograms": histograms,
    "recalibration_rows": recalibrated, "accuracy_rows": accuracies, "set_rows": set_rows,
  }  # fmt: skip


_LABEL = operator.itemgetter("label")
_TABLES = ("rows", "ood_rows", "recalibration_rows", "accuracy_rows", "set_rows")


def _by_model(evaluated: dict) -> dict[tuple, dict[str, list]]:
  """Per model (in the results' order), its rows of each of ``evaluate``'s tables."""
  return {
    key: {name: [r for r in evaluated[name] if shift_tables.model_of(r) == key] for name in _TABLES}
    for key in shift_tables.grouped(evaluated["rows"])
  }


def markdown(settings: Settings, evaluated: dict) -> str:
  """results.md: per model, the variants' metrics at every shift and on the OOD sets."""
  n_bins = settings.compare_bins
  text = [
    "# Calibration under dataset shift",
    "",
    f"Every method is fitted on the clean calibration part of each of {settings.n_folds} "
    f"{settings.scheme} splits of the clean test examples and applied unchanged to the test "
    "part of every set, the same examples shifted; means over the splits. Accuracy, Brier "
    f"and ECE (%) of the Top-1 event; the ECE over {n_bins} equal-mass bins of the score, "
    "fitted on the clean calibration part. Vanilla, temperature scaling, dropout and the "
    "ensemble use their own max probability as P(correct) (Ovadia et al.); the bins, "
    "isotonic and top-label rows calibrate a score. Corruptions: the mean over the "
    "corruptions at each intensity, and the worst in parentheses.",
  ]
  for (dataset, model, rate, seed), mine in _by_model(evaluated).items():
    model_rows = mine["rows"]
    variants = shift_tables.present_variants(model_rows, n_bins)
    name = f"{dataset or 'predictions'}, {model or 'model'}, train dropout {rate}, seed {seed}"
    text += ["", f"## {name}"]
    for metric in shift_tables.METRICS:
      title = shift_tables.metric_title(metric, n_bins)
      for shift, axis in results.GEOMETRIC_SHIFTS.items():
        if any(r["shift"] == shift for r in model_rows):
          table = shift_tables.geometric_table(model_rows, variants, shift, metric)
          text += ["", f"### {axis}: {title}", "", table]
      if any(r["shift"] in corruptions.names() for r in model_rows):
        table = shift_tables.corruption_table(model_rows, variants, metric)
        text += ["", f"### corruptions: {title}", "", table]
    if mine["ood_rows"]:
      table = shift_tables.ood_table(mine["ood_rows"], variants)
      text += ["", "### out-of-distribution inputs", "", table]
    text += _recalibration_markdown(mine["recalibration_rows"], n_bins)
    text += _accuracy_markdown(mine["accuracy_rows"])
    text += _sets_markdown(mine["set_rows"])
  return "\n".join(text) + "\n"


def _sets_markdown(rows: list[dict]) -> list[str]:
  if not rows:
    return []
  header = ["method", "set method", "alpha", "set", "coverage", "mean size"]
  lines = [tables.md_row(header), "|---|---|---:|---|---:|---:|"]
  for r in rows:
    where = r["shift"] if r["shift"] == results.CLEAN else f"{r['shift']} {r['severity']:g}"
    cells = [r["label"], r["estimator"], f"{r['alpha']:g}", where]
    cells += [tables.pm_value(r, "coverage", 3), tables.pm_value(r, "mean_size", 2)]
    lines.append(tables.md_row(cells))
  note = (
    "Prediction sets calibrated on the clean calibration parts and applied unchanged to "
    "every set's test parts: the guarantee (coverage >= 1 - alpha) holds on clean data only."
  )
  return ["", "### prediction sets: coverage as the data moves", "", note, "", *lines]


def _recalibration_markdown(rows: list[dict], n_bins: int) -> list[str]:
  text = []
  for label, mine in shift_tables.grouped(rows, _LABEL).items():
    for metric in ("ece", "brier"):
      title = shift_tables.metric_title(metric, n_bins)
      text += ["", f"### {label}: recalibrated on m labelled shifted examples, {title}", ""]
      text.append(shift_tables.recalibration_table(mine, metric))
  if text:
    text[:0] = [
      "",
      "Each method refitted on m labelled examples of each shifted set, drawn from its "
      "calibration part (bins_from_clean: the clean bins, each bin's probability a prior "
      "worth s pseudo-counts, updated with them); scored on the set's test part in the "
      "clean calibration part's bins. The clean ECE: m = 0 on the clean set; the mean "
      "(worst) over the shifted sets.",
    ]
  return text


def _accuracy_markdown(rows: list[dict]) -> list[str]:
  text = []
  titles = {name: e.title for name, e in accuracy_estimates.ESTIMATORS.items()}
  for label, mine in shift_tables.grouped(rows, _LABEL).items():
    text += ["", f"### {label}: accuracy predicted without labels (percentage points)", ""]
    text.append(shift_tables.accuracy_table(mine, titles))
  return text


def figure_data(evaluated: dict, n_bins: int) -> list[tuple]:
  """``plots.write_shift_figures``' panels: per model, its rows, variants, OOD histograms'
  P(correct) by variant, and its recalibration and accuracy rows by label."""
  by_model = _by_model(evaluated)
  panels = []
  for key, mine in by_model.items():
    model_rows = mine["rows"]
    variants = shift_tables.present_variants(model_rows, n_bins, shift_tables.FIGURE_VARIANTS)
    p_correct: dict[str, dict] = {}
    for label, selector in variants.items():
      selector = {k: v for k, v in selector.items() if k != "n_bins"}
      for row in mine["ood_rows"]:
        if shift_tables.matches(row, selector):
          arrays = evaluated["histograms"][row["source"], row["score"], row["estimator"]]
          p_correct.setdefault(label, {}).update(arrays)
    name = "" if len(by_model) == 1 else "_".join(str(v) for v in key if v is not None)
    by_method = [
      shift_tables.grouped(mine[t], _LABEL) for t in ("recalibration_rows", "accuracy_rows")
    ]
    panels.append((name, model_rows, variants, p_correct, *by_method))
  return panels


def write(folder, settings: Settings, evaluated: dict) -> None:
  """results.{csv,json,md}, ood.csv, recalibration.csv and accuracy_estimates.csv, atomically."""
  unlabelled = lambda rows: [{k: v for k, v in r.items() if k != "label"} for r in rows]
  files.write_csv(folder / "results.csv", unlabelled(evaluated["rows"] + evaluated["set_rows"]))
  files.write_csv(folder / "ood.csv", evaluated["ood_rows"])
  summary = {"results": evaluated["rows"], "ood": evaluated["ood_rows"]}
  summary["sets"] = evaluated["set_rows"]
  for name, stem in (("recalibration", "recalibration"), ("accuracy", "accuracy_estimates")):
    written = unlabelled(evaluated[f"{name}_rows"])
    files.write_csv(folder / f"{stem}.csv", written)
    summary[stem] = written
  files.write_json(folder / "results.json", summary)
  files.write_bytes(folder / "results.md", markdown(settings, evaluated).encode())


def evaluate_files(settings: Settings, asked, folder) -> dict:
  """The protocol over ``asked`` ((name, path) of clean, shifted and OOD files) into
  ``folder``; returns the seconds of each step."""
  timings: dict[str, float] = {}
  sources.check_present(asked)
  found = [sources.Source(name, path, settings, timings) for name, path in asked]
  tic = time.perf_counter()
  evaluated = evaluate(settings, found, logging.info)
  timings["protocol"] = time.perf_counter() - tic
  tic = time.perf_counter()
  write(folder, settings, evaluated)
  timings["write"] = time.perf_counter() - tic
  num_rows, num_ood = len(evaluated["rows"]), len(evaluated["ood_rows"])
  logging.info("shift: %d rows, %d OOD rows in %s", num_rows, num_ood, folder)
  from top1_jax.pipeline import pages  # the page's template (jinja2)

  pages.write_shift_page(settings, folder, timings)  # the tables first
  if settings.figures:
    from top1_jax import plots  # matplotlib

    tic = time.perf_counter()
    with plots.rendering():
      written = plots.write_shift_figures(folder, figure_data(evaluated, settings.compare_bins))
    seconds = timings["figures"] = time.perf_counter() - tic
    logging.info("shift: %d figures in %s (%.1f s)", len(written), folder / "figures", seconds)
    pages.write_shift_page(settings, folder, timings)
  return timings


def _predict_sets(settings, workdir, point, pool, out) -> list[tuple[str, object]]:
  """Every set's predictions files of one training point: (name, path), made if missing."""
  from top1_jax.pipeline import prediction  # Flax

  states = prediction.trained_states(settings, workdir, point, pool)
  asked = []
  for index, shift_set in enumerate(shift_sets(settings)):
    images = None
    for job in jobs.prediction_jobs(settings, point):
      meta = {**job.meta(settings), **shift_set.meta(), "shift_examples": len(pool.labels)}
      path = out / "predictions" / point.name / shift_set.slug / f"{job.kind}.npz"
      asked.append((f"{point.name}/{shift_set.slug}/{job.kind}", path))
      if prediction.is_current(path, meta):
        continue
      tic = time.perf_counter()
      if images is None:
        images = make_images(shift_set, pool.images, point.seed)
      # OOD labels are placeholders (meta ood): never scored.
      labels = pool.labels[: len(images)] if shift_set.ood else pool.labels
      result = prediction.predict_images(settings, job, meta, states, images, labels, index)
      if runs.is_writer():
        predictions_lib.save_predictions(path, result)
      logging.info("shift: %s (%.1f s)", asked[-1][0], time.perf_counter() - tic)
  return asked


def run(settings: Settings, workdir, tasks=(0, 1), command: str = "") -> None:
  """The shift stage: train (or reuse) the networks, predict every set, evaluate."""
  from top1_jax.pipeline import training  # Flax

  start = time.perf_counter()
  train_split, test_split = training.load_data(settings)
  pool = first_examples(test_split, settings.shift_examples)
  num = len(pool.labels)
  refuse_inputs(settings)
  check_test_examples(settings, num, pool.num_classes)
  check_num_labels(settings, smallest_calibration(settings, num), f"the {num} shift_examples")
  out = workdir / "shift"
  if runs.is_writer():
    files.write_json(out / "config.json", runs.record(settings, command))
  points = jobs.task_share(jobs.training_points(settings), tasks)
  timings = {}
  tic = time.perf_counter()
  training.run(settings, workdir, tasks, (train_split, test_split))
  timings["train"] = time.perf_counter() - tic
  tic = time.perf_counter()
  asked = [item for p in points for item in _predict_sets(settings, workdir, p, pool, out)]
  timings["predict"] = time.perf_counter() - tic
  if not runs.is_writer() or tasks[1] > 1:
    return  # one run without --task_index evaluates every task's files
  timings["evaluate"] = evaluate_files(settings, asked, out)
  timings["total"] = time.perf_counter() - start
  files.write_json(out / "timings.json", timings)
  logging.info(
    "shift: done in %.0f s; tables in %s, results page %s",
    timings["total"], out / "results.md", out / "index.html",
  )  # fmt: skip
