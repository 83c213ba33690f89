"""The figures of a finished sweep into ``out_dir/figures``; each ``write_*`` returns the paths
it wrote. ``sources``: the sweep's loaded prediction files (``name``, ``label``, ``slug``,
``splits``, ``scores``, ``correct(k)``)."""

import fnmatch
import os
import re

import numpy as np

from top1_jax.core import binning, scores
from top1_jax.evaluation import crossval, selective
from top1_jax.io import results as results_io
from top1_jax.plots.bins import bin_figure, refinement_figure
from top1_jax.plots.figures import save_figure
from top1_jax.plots.reliability import reliability_diagram
from top1_jax.plots.risk import OperatingPoint, risk_coverage_figure
from top1_jax.plots.shift_figures import (
  accuracy_scatter,
  corruption_boxes,
  ood_histograms,
  recalibration_curves,
  shift_curves,
)
from top1_jax.plots.sweeps import ablation_figure, dropout_rate_figure

RELIABILITY_BINS = 15  # equal-width bins of the raw reliability diagrams, as the benchmark's ECE

# The file-name prefix of every figure written here -> what its group shows.
FIGURE_GROUPS = {
  "bins_": "Calibrated bins of each file's headline score (paper Fig. 1)",
  "reliability_": "Reliability diagrams of the raw max-softmax",
  "refinement_": "Few vs many bins (paper Fig. 2)",
  "ablation_": "Metrics against the number of bins",
  "dropout_rate_": "MC dropout: metrics against the test-time dropout rate",
  "risk_coverage_": "Selective prediction: risk against coverage",
  "shift_": "Calibration under dataset shift",
}

# The figure a results page leads with: the first name matching the first pattern that matches.
KEY_FIGURES = (
  "bins_*_top1.png", "shift_rotate*.png", "shift_*.png", "dropout_rate_top1.png",
  "ablation_top1.png",
)  # fmt: skip


def key_figure(names: list[str]) -> str | None:
  """The figure of ``names`` a page leads with (``KEY_FIGURES``), or None."""
  found = (n for p in KEY_FIGURES for n in names if fnmatch.fnmatch(os.path.basename(n), p))
  return next(found, None)


def figure_groups(names: list[str]) -> list[tuple[str, list[str]]]:
  """``names`` by ``FIGURE_GROUPS`` (in its order, each name once), then "Other figures"."""
  groups: dict[str, list[str]] = {}
  for name in names:
    base = os.path.basename(name)
    prefix = next((p for p in FIGURE_GROUPS if base.startswith(p)), None)
    groups.setdefault(FIGURE_GROUPS.get(prefix, "Other figures"), []).append(name)
  order = [*FIGURE_GROUPS.values(), "Other figures"]
  return sorted(groups.items(), key=lambda item: order.index(item[0]))


def _save(fig, out_dir, name: str):
  return save_figure(fig, out_dir / "figures" / f"{name}.png")


def _cv_from_record(record: dict) -> crossval.CrossValidation:
  n_bins = tuple(r["n_bins"] for r in record["rows"])
  return crossval.CrossValidation.from_per_fold(n_bins, record["per_fold"])


def _ablation_figure(out_dir, sources, results, k) -> list:
  """The Top-k ablation: the compared scores as lines, the first file's oracle as a reference."""
  names = {source.name: source.label for source in sources}
  # Every score of a file without samples; of MC dropout and ensembles, the paper's measure.
  # Twins (pmax, -log pmax) share a line only where their rows are equal (float32 ties).
  sampled, measure = ("mc_dropout", "ensemble"), "covariance_norm_probs"
  curves, oracles = {}, {}
  for r in results:
    if r["topk"] != k or (r["columns"]["method"] in sampled and r["score"] != measure):
      continue
    if scores.needs_labels(r["score"]):  # the oracle: a reference line, one file's enough
      oracles.setdefault(r["source"], r)
      continue
    curves[f"{names[r['source']]}: {scores.label(r['score'])}"] = _cv_from_record(r)
  if not curves:
    return []
  first = [s.name for s in sources if s.name in oracles][:1]
  references = {f"{names[n]}: oracle (needs labels)": _cv_from_record(oracles[n]) for n in first}
  title = f"Top-{k}: scores against the number of bins (mean ± std over splits)"
  fig = ablation_figure(curves, references=references, title=title)
  return [_save(fig, out_dir, f"ablation_top{k}")]


def _split_bins(correct, u, test, n_bins: int) -> tuple[binning.Bins, binning.Bins]:
  """(bins fitted on the calibration part, the test part counted in them)."""
  bins = binning.fit(u[~test], correct[~test], n_bins)
  return bins, binning.refit(bins, u[test], correct[test])


def write_figures(
  out_dir, sources, results, n_bins, topks, figure_bins, reliability_bins=RELIABILITY_BINS
) -> list:
  """Per-bin figures (Fig. 1), reliability diagrams, the refinement (Fig. 2), the ablation,
  each on a source's first calibration/test split."""
  written = []
  for source in sources:
    test = np.asarray(source.splits.test_mask(0))
    # The raw max-softmax, as benchmarks report it (no calibration split), in equal-width bins:
    # equal-mass ones would crowd the points near 1 on a saturated network.
    correct, confidence = source.correct(1)[test], source.scores["pmax"][test]
    title = f"{source.label}: raw max-softmax, Top-1\nfirst split's test part, {{bins}}"
    fig = reliability_diagram(
      confidence, correct, reliability_bins, binning="equal-width", title=title
    )
    written.append(_save(fig, out_dir, f"reliability_{source.slug}_top1"))
    score = scores.headline(source.scores)
    if score is None:
      continue
    for k in topks if source is sources[0] else topks[:1]:
      bins, test_bins = _split_bins(source.correct(k), source.scores[score], test, figure_bins)
      title = f"{source.label}: {scores.label(score)}, Top-{k}, {{bins}}, first split"
      fig = bin_figure(bins, test_bins, event=f"Top-{k}", title=title)
      written.append(_save(fig, out_dir, f"bins_{source.slug}_{score}_top{k}"))
  if len(n_bins) < 2:
    return written
  source = sources[0]
  score = scores.headline(source.scores)
  if score is not None:
    test = np.asarray(source.splits.test_mask(0))
    correct, u = source.correct(topks[0]), source.scores[score]
    pairs = [_split_bins(correct, u, test, n) for n in (min(n_bins), max(n_bins))]
    fig = refinement_figure(*pairs, event=f"Top-{topks[0]}")
    written.append(_save(fig, out_dir, f"refinement_{source.slug}_{score}"))
  for k in topks:
    written += _ablation_figure(out_dir, sources, results, k)
  return written


def write_risk_coverage_figures(out_dir, sources, chosen) -> list:
  """Each file's risk-coverage curve (first split's test part) with its guaranteed selections."""
  written = []
  for source in sources:
    test = np.asarray(source.splits.test_mask(0))
    rows = [r for r in chosen if r["source"] == source.name]
    if not rows:
      continue
    score = rows[0]["score"]
    u = np.asarray(source.scores[score])[test]
    correct = source.correct(1)[test]
    curve = selective.risk_coverage(-u if rows[0]["order"] == "descending" else u, correct)
    outcome = ("test_coverage", "test_accuracy", "guaranteed_accuracy")  # on the first split
    points = [
      OperatingPoint(r["target_accuracy"], *(r["per_split"][0][c] for c in outcome)) for r in rows
    ]
    title = (
      f"{source.label}: {scores.label(score)}, Top-1\nfirst split's test part "
      f"(δ = {rows[0]['delta']:g}, {rows[0]['n_bins']} bins)"
    )
    fig = risk_coverage_figure(curve, points, title=title)
    written.append(_save(fig, out_dir, f"risk_coverage_{source.slug}"))
  return written


def write_dropout_rate_figures(out_dir, rows, topks) -> list:
  """``dropout_rate_figure`` of tidy ``rows`` for each Top-k event with MC-dropout rows."""
  written = []
  for k in sorted(set(topks)):
    try:
      fig = dropout_rate_figure(rows, topk=k)
    except ValueError:
      continue  # no MC-dropout rows at a rate > 0 for this event
    written.append(_save(fig, out_dir, f"dropout_rate_top{k}"))
  return written


def write_shift_figures(out_dir, panels) -> list:
  """The shift protocol's figures. ``panels``: per trained model, ``(name, rows, variants,
  p_correct, recalibrated, estimated)``: a file-name suffix ("" for a run of one model), its
  tidy rows, the variants to compare, ``ood_histograms``' P(correct), and its recalibration
  and accuracy-estimate rows by method label (the last three empty when absent)."""
  written = []
  for name, rows, variants, p_correct, recalibrated, estimated in panels:
    suffix = f"_{name}" if name else ""
    shifts = {row["shift"] for row in rows}
    for shift in [s for s in results_io.GEOMETRIC_SHIFTS if s in shifts]:
      written.append(_save(shift_curves(rows, variants, shift), out_dir, f"shift_{shift}{suffix}"))
    if shifts - {results_io.CLEAN, *results_io.GEOMETRIC_SHIFTS}:
      fig = corruption_boxes(rows, variants, ("brier", "ece", "accuracy"))
      written.append(_save(fig, out_dir, f"shift_corruptions{suffix}"))
    if p_correct:
      written.append(_save(ood_histograms(p_correct), out_dir, f"shift_ood{suffix}"))
    for stem, by_method, draw in (
      ("recalibration", recalibrated, recalibration_curves),
      ("accuracy_estimates", estimated, accuracy_scatter),
    ):
      for label, method_rows in by_method.items():
        method = re.sub(r"[^A-Za-z0-9.]+", "_", label).strip("_")
        written.append(_save(draw(method_rows), out_dir, f"{stem}{suffix}_{method}"))
  return written
