"""Dataset shift (Ovadia et al. 2019): the shifted sets, their images, and the protocol's tables.

The protocol: every method is calibrated on the clean calibration part of a split and
applied unchanged to the test part of each shifted set, whose examples are the same
ones transformed (``evaluation.shift``). A *set* is a shift and an intensity:

* ``clean`` (severity 0): the first ``shift_examples`` test images as they are;
* ``rotate`` (degrees) and ``translate`` (pixels): Ovadia et al.'s MNIST shifts
  (``engine.shifts``);
* a corruption of ``engine.corruptions`` at intensity 1-5 (CIFAR-10-C's parameters);
* ``ood_<name>``: images from outside the label set (``io.ood_sets``), as many as
  the clean set (fewer if the set is smaller); their labels are placeholders.

``launch.shift`` predicts each set with every method of a training point and writes
``<workdir>/shift/predictions/<point>/<set>/<method>.npz`` (meta ``shift``,
``severity``, ``ood``); ``top1_jax.launch.evaluate`` takes a user's own files with such
meta (``shift_inputs``). Either way ``evaluate`` turns the files into tidy rows
(results.csv's columns with ``shift`` and ``severity``), OOD rows and the
P(correct) arrays of the histograms.
"""

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.engine import corruptions, shifts
from top1_jax.evaluation import ood, protocol
from top1_jax.io import files, ood_sets, results
from top1_jax.sweep import plan, runner, shift_tables, tables

OOD_PREFIX = "ood_"
"""An out-of-distribution set's ``shift`` is this prefix and its ``io.ood_sets`` name."""

LOG_PROBS_SCORE = shift_tables.LOG_PROBS_SCORE


@dataclasses.dataclass(frozen=True)
class ShiftSet:
  """One test set: a shift and its intensity (degrees, pixels, 1-5; 0 for clean and OOD)."""

  shift: str
  severity: int | float = 0

  @property
  def ood(self) -> bool:
    return self.shift.startswith(OOD_PREFIX)

  @property
  def slug(self) -> str:
    """Its folder name: ``clean``, ``rotate_15``, ``gaussian_noise_3``, ``ood_digits``."""
    if self.shift == results.CLEAN or self.ood:
      return self.shift
    return f"{self.shift}_{self.severity:g}"

  def meta(self) -> dict[str, Any]:
    """What its predictions files record beside the method's meta."""
    return {"shift": self.shift, "severity": self.severity, **({"ood": True} if self.ood else {})}


def shift_sets(settings: Any) -> list[ShiftSet]:
  """Every set of a (checked) config, once each, the clean one first, in the tables' order."""
  field = functools.partial(plan.field_items, settings)
  names = field("shift_corruptions")
  names = corruptions.names() if names == ("all",) else names
  sets = [
    ShiftSet(results.CLEAN, 0),
    *(ShiftSet("rotate", tables.severity(d)) for d in field("shift_rotations")),
    *(ShiftSet("translate", int(p)) for p in field("shift_translations")),
    *(ShiftSet(name, int(s)) for name in names for s in field("shift_severities")),
    *(ShiftSet(OOD_PREFIX + name) for name in field("shift_ood")),
  ]
  return list(dict.fromkeys(sets))  # a value given twice (90 and 90.0) would repeat its rows


def first_examples(split, num: int | None):
  """The clean set: a ``DatasetSplit``'s first ``num`` examples (all when None)."""
  if num is None or num >= len(split.labels):
    return split
  ids = None if split.ids is None else split.ids[:num]
  return split._replace(images=split.images[:num], labels=split.labels[:num], ids=ids)


def make_images(shift_set: ShiftSet, images: np.ndarray, seed: int) -> np.ndarray:
  """The set's images from the clean ones ([M, H, W, C] float32 in [0, 1]), by seed.

  Corruption ``c`` draws from ``fold_in(key(seed), index of c)``, shared by its
  intensities (a higher one corrupts the same image more); OOD sets are ``seed``'s draw.
  """
  if shift_set.shift == results.CLEAN:
    return images
  if shift_set.shift == "rotate":
    return np.asarray(shifts.rotate(images, shift_set.severity))
  if shift_set.shift == "translate":
    return np.asarray(shifts.translate(images, int(shift_set.severity)))
  if shift_set.ood:
    name = shift_set.shift[len(OOD_PREFIX) :]
    num = min(len(images), ood_sets.OOD_SETS[name].max_num or len(images))
    return np.asarray(ood_sets.load(name, images.shape[1:], num, seed))
  key = jax.random.fold_in(jax.random.key(seed), corruptions.names().index(shift_set.shift))
  return np.asarray(corruptions.corrupt(shift_set.shift, images, key, int(shift_set.severity)))


# The protocol over predictions files: a group is one method of one training point (or one
# user's model), its clean file, its shifted files and its OOD files.


@dataclasses.dataclass
class Group:
  clean: runner.Source
  shifted: list = dataclasses.field(default_factory=list)
  ood: list = dataclasses.field(default_factory=list)


_NOT_THE_MODEL = ("source", "shift", "severity")  # what differs between a group's files


def _key(source: runner.Source) -> tuple:
  return tuple(v for k, v in source.columns.items() if k not in _NOT_THE_MODEL)


def _is_clean(source: runner.Source) -> bool:
  return source.columns["shift"] == results.CLEAN and not source.meta.get("ood")


def group_sources(sources: Sequence[runner.Source]) -> list[Group]:
  """The files by model and method (their columns but source, shift and severity), each
  group with one clean file whose labels its shifted files share."""
  groups: dict[tuple, Group] = {}
  for source in sources:
    if _is_clean(source):
      if _key(source) in groups:
        raise SettingError(
          f"inputs: {source.name} and {groups[_key(source)].clean.name} are both clean files "
          "of one model and method; give one clean file per model"
        )
      groups[_key(source)] = Group(source)
  for source in sources:
    group = groups.get(_key(source))
    if _is_clean(source):
      continue
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


def _score_names(settings: Any, source: runner.Source) -> list[str]:
  """The clean file's Top-1 scores that a model has on any input: not the oracle (it
  reads the labels, meaningless on OOD inputs) nor human ones; ``settings.scores``'."""
  wanted = tuple(settings.scores)
  names = []
  for name in source.scores:
    known = scores.lookup(name)
    if known is not None and (known.inputs in ("labels", "human_probs") or known.per_k):
      continue  # per-k: neg_log_top<k>_mass, whose k = 1 twin is neg_log_pmax
    if wanted == ("all",) or name in wanted:
      names.append(name)
  return names


def _inputs(source: runner.Source, labelled: bool = True) -> protocol.Inputs:
  return protocol.Inputs(source.log_probs, source.labels if labelled else None, source.scores)


def _evaluate_group(settings: Any, group: Group, estimators: tuple) -> tuple[list, list, list]:
  """One model's records (``tables.tidy_rows``'), OOD rows and OOD results."""
  clean, names = group.clean, _score_names(settings, group.clean)
  sets = [clean, *group.shifted]
  common = dict(scores=names, estimators=estimators, k=1, log_probs_score=LOG_PROBS_SCORE)
  chosen = protocol.methods(estimators, names, LOG_PROBS_SCORE)
  found = protocol.evaluate(
    _inputs(clean), clean.splits, chosen, test_sets=[_inputs(s) for s in sets],
    n_bins=settings.n_bins,
  )  # fmt: skip
  records = [
    {
      "columns": sets[r.test_set].columns,
      "score": r.score,
      "topk": 1,
      "estimator": r.estimator,
      "rows": r.metrics.rows(),
    }
    for r in found
  ]
  if not group.ood:
    return records, [], []
  reports = ood.ood_report(
    _inputs(clean), [_inputs(s, False) for s in group.ood], clean.splits,
    n_bins=settings.compare_bins, **common,
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


def evaluate(settings: Any, sources: Sequence[runner.Source], log: Callable = print) -> dict:
  """Every group's rows under shift (``rows``: results.csv's, with ``label``), OOD rows
  (``ood_rows``: ood.csv's) and the OOD histograms' P(correct) (``histograms``: by OOD
  row's source, score and estimator, the clean test part's and the OOD set's, both
  from the first split's calibration)."""
  estimators = plan.field_items(settings, "shift_estimators")
  records, ood_rows, histograms = [], [], {}
  for group in group_sources(sources):
    tic = time.perf_counter()
    found, ood, reports = _evaluate_group(settings, group, estimators)
    records += found
    ood_rows += ood
    first = int(group.clean.splits.test_mask(0).sum())  # clean_prob: the splits in order
    for row, report in zip(ood, reports, strict=True):
      # The histograms show one calibration: the first split's.
      arrays = {results.CLEAN: report.clean_prob[:first], row["shift"]: report.ood_prob[0]}
      histograms[row["source"], row["score"], row["estimator"]] = arrays
    log(
      f"shift: {group.clean.label}: {1 + len(group.shifted)} set(s), {len(group.ood)} OOD "
      f"set(s), {len(found)} rows in {time.perf_counter() - tic:.1f} s"
    )
  return {"rows": tables.tidy_rows(records), "ood_rows": ood_rows, "histograms": histograms}


def _model(row: dict) -> tuple:
  """The trained model a row belongs to: its dataset, model, train dropout rate and seed."""
  return tuple(row[c] for c in tables.TRAINING)


def _models(rows: list[dict]) -> dict[tuple, list[dict]]:
  """Rows by trained model (dataset, model, train dropout rate, seed)."""
  by_model: dict[tuple, list[dict]] = {}
  for row in rows:
    by_model.setdefault(_model(row), []).append(row)
  return by_model


def _model_name(key: tuple) -> str:
  dataset, model, rate, seed = key
  return f"{dataset or 'predictions'}, {model or 'model'}, train dropout {rate}, seed {seed}"


def markdown(settings: Any, evaluated: dict) -> str:
  """results.md: per model, the variants' metrics at every shift and on the OOD sets."""
  rows, n_bins = evaluated["rows"], settings.compare_bins
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
  for key, model_rows in _models(rows).items():
    variants = shift_tables.present_variants(model_rows, n_bins)
    text += ["", f"## {_model_name(key)}"]
    for metric, title in shift_tables.METRIC_TITLES.items():
      for shift, axis in shift_tables.GEOMETRIC.items():
        if any(r["shift"] == shift for r in model_rows):
          table = shift_tables.geometric_table(model_rows, variants, shift, metric)
          text += ["", f"### {axis}: {title}", "", table]
      if any(r["shift"] in corruptions.names() for r in model_rows):
        table = shift_tables.corruption_table(model_rows, variants, metric)
        text += ["", f"### corruptions: {title}", "", table]
    ood = [r for r in evaluated["ood_rows"] if _model(r) == key]
    if ood:
      text += ["", "### out-of-distribution inputs", "", shift_tables.ood_table(ood, variants)]
  return "\n".join(text) + "\n"


def figure_data(evaluated: dict, n_bins: int) -> list[tuple]:
  """``plots.write_shift_figures``' panels: per model, its rows, the variants and the
  OOD histograms' P(correct) (each variant's OOD predictions, and on the clean test parts)."""
  by_model = _models(evaluated["rows"])
  panels = []
  for key, model_rows in by_model.items():
    variants = shift_tables.present_variants(model_rows, n_bins, shift_tables.FIGURE_VARIANTS)
    p_correct: dict[str, dict] = {}
    for label, selector in variants.items():
      selector = {k: v for k, v in selector.items() if k != "n_bins"}
      for row in evaluated["ood_rows"]:
        if _model(row) == key and shift_tables.matches(row, selector):
          arrays = evaluated["histograms"][row["source"], row["score"], row["estimator"]]
          p_correct.setdefault(label, {}).update(arrays)
    name = "" if len(by_model) == 1 else "_".join(str(v) for v in key if v is not None)
    panels.append((name, model_rows, variants, p_correct))
  return panels


def write(folder, settings: Any, evaluated: dict) -> None:
  """results.{csv,json,md} and ood.csv into ``folder`` (atomically)."""
  rows = [{k: v for k, v in r.items() if k != "label"} for r in evaluated["rows"]]
  files.write_csv(folder / "results.csv", rows)
  files.write_csv(folder / "ood.csv", evaluated["ood_rows"])
  summary = {"results": evaluated["rows"], "ood": evaluated["ood_rows"]}
  files.write_json(folder / "results.json", summary)
  files.write_bytes(folder / "results.md", markdown(settings, evaluated).encode())


def evaluate_and_write(settings: Any, asked, folder, log: Callable = print) -> tuple[dict, dict]:
  """The protocol over the files ``asked`` ((name, path)), its tables into ``folder``;
  returns what ``evaluate`` returns and the seconds of each step."""
  timings: dict[str, float] = {}
  runner.check_present(asked)
  sources = [runner.Source(name, path, settings, timings) for name, path in asked]
  tic = time.perf_counter()
  evaluated = evaluate(settings, sources, log)
  timings["protocol"] = time.perf_counter() - tic
  tic = time.perf_counter()
  write(folder, settings, evaluated)
  timings["write"] = time.perf_counter() - tic
  log(f"shift: {len(evaluated['rows'])} rows, {len(evaluated['ood_rows'])} OOD rows in {folder}")
  return evaluated, timings
