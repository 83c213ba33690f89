"""Tables (Markdown, CSV, JSON) and figures from the sweep results (formatting only)."""

import math
import pathlib

import numpy as np

from experiments import common
from top1_jax import binning, crossval, events, plots, scores, selective


def flat_rows(results: list[dict]) -> list[dict]:
  """One row per (method, score, event, bin count) with every metric's mean and std."""
  rows = []
  for record in results:
    for row in record["rows"]:
      rows.append(
        {
          "method": record["method"],
          "source": record["source"],
          "score": record["score"],
          "topk": record["topk"],
          "estimator": record.get("estimator", "bins"),
          **row,
        }
      )
  return rows


def _num(value: float | None, digits: int) -> str:
  """A table cell: "–" for an undefined metric; never "-0.0000" for a rounding residue."""
  if value is None:
    return "–"
  text = f"{value:.{digits}f}"
  return text[1:] if text.startswith("-") and float(text) == 0 else text


def _pm(mean: float | None, std: float | None, digits: int) -> str:
  return "–" if mean is None else f"{_num(mean, digits)} ± {_num(std, digits)}"


def _eor(mean: float | None, std: float | None) -> str:
  if mean is None or not math.isfinite(mean):
    return _num(mean, 2)
  digits = 2 if mean < 10 else 1 if mean < 100 else 0
  return _pm(mean, std, digits)


def _defined_on(row: dict, metric: str, n_folds: int | None) -> str:
  """ " (k/F splits)" when the metric is undefined on some splits (one class in a half)."""
  count = row.get(f"{metric}_num_splits")
  return "" if count is None or n_folds is None or count == n_folds else f" ({count}/{n_folds})"


def metric_table(rows: list[dict], topk: int, n_bins: int, n_folds: int | None = None) -> str:
  lines = [
    "| method | score | Brier | NLL | ECE (%) | EOR | AUROC | bins |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    if r["topk"] != topk or r["n_bins"] != n_bins:
      continue
    ece = None if r["ece"] is None else (100 * r["ece"], 100 * r["ece_std"])
    lines.append(
      f"| {r['method']} | {_score_cell(r)} | {_num(r['brier'], 4)} | {_num(r['nll'], 4)} "
      f"| {_pm(*(ece or (None, None)), 2)} "
      f"| {_eor(r['eor'], r['eor_std'])}{_defined_on(r, 'eor', n_folds)} "
      f"| {_num(r['auroc'], 3)}{_defined_on(r, 'auroc', n_folds)} "
      f"| {_num(r['num_effective_bins'], 0)} |"
    )
  return "\n".join(lines)


def _score_cell(row: dict) -> str:
  """The score's label, and the estimator when it is not the paper's bins."""
  estimator = row.get("estimator", "bins")
  return scores.label(row["score"]) + ("" if estimator == "bins" else f" [{estimator}]")


def summary_table(rows: list[dict], metric: str, n_bins: int, topks: tuple[int, ...]) -> str:
  keys = []
  for r in rows:
    key = (r["method"], r["score"], r.get("estimator", "bins"))
    if key not in keys:
      keys.append(key)
  header = "| method | score | " + " | ".join(f"Top-{k}" for k in topks) + " |"
  lines = [header, "|---|---|" + "---:|" * len(topks)]
  for method, score, estimator in keys:
    cells = []
    for k in topks:
      match = [
        r
        for r in rows
        if (r["method"], r["score"], r.get("estimator", "bins"), r["topk"], r["n_bins"])
        == (method, score, estimator, k, n_bins)
      ]
      if not match:
        cells.append("–")
      elif metric == "eor":
        cells.append(_eor(match[0]["eor"], match[0]["eor_std"]))
      else:
        cells.append(_num(match[0][metric], 4))
    label = _score_cell({"score": score, "estimator": estimator})
    lines.append(f"| {method} | {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown(rows: list[dict], config: dict, topks: tuple[int, ...], title: str) -> str:
  n_bins = config["n_bins"]
  parts = [
    f"# {title}",
    "",
    f"{config['n_folds']} {config['scheme']} calibration/test splits (seed {config['seed']}); "
    "mean ± std over splits. ECE, EOR and AUROC of the binned Top-k predictions; "
    "`bins` = bins left after merging tied edges (mean).",
  ]
  accuracy = {}
  for r in rows:
    accuracy.setdefault((r["method"], r["topk"]), r["accuracy"])
  parts += ["", "Test accuracy of each classifier (mean over test halves):", ""]
  parts += ["| method | " + " | ".join(f"Top-{k}" for k in topks) + " |"]
  parts += ["|---|" + "---:|" * len(topks)]
  for method in dict.fromkeys(m for m, _ in accuracy):
    cells = [_num(accuracy.get((method, k)), 4) for k in topks]
    parts.append(f"| {method} | " + " | ".join(cells) + " |")
  for k in topks:
    for n in n_bins:
      parts += ["", f"## Top-{k}, {n} bins", "", metric_table(rows, k, n, config["n_folds"])]
  largest = max(n_bins)
  parts += ["", f"## Brier score, {largest} bins (supplementary table)", ""]
  parts += [summary_table(rows, "brier", largest, topks)]
  parts += ["", f"## Expected odds ratio, {largest} bins (supplementary table)", ""]
  parts += [summary_table(rows, "eor", largest, topks)]
  return "\n".join(parts) + "\n"


def comparison_table(comparison: list[dict]) -> str:
  if not comparison:
    return ""
  n_bins, ece_bins = comparison[0]["top1_n_bins"], comparison[0]["ece_bins"]
  lines = [
    f"## Benchmark metrics vs Top-1 binning (paper Table 1; {n_bins} Top-1 bins, "
    f"{ece_bins} equal-width ECE bins)",
    "",
    "Multiclass Brier scores the whole probability vector, Top-1 Brier only the event "
    '"the prediction is correct": compare Top-1 binning with the *raw pmax* columns, '
    "which use max-softmax directly as P(correct). The benchmark's confidence ECE is "
    "exactly the raw pmax's Top-1 ECE with equal-width bins.",
    "",
    "| method | binned score | multiclass Brier (benchmark) | Top-1 Brier: raw pmax "
    "| Top-1 Brier: binned | ECE (%): benchmark = raw pmax | ECE (%): Top-1 binned |",
    "|---|---|---:|---:|---:|---:|---:|",
  ]
  for r in comparison:
    method = r["method"]
    if r["temperature"] != 1.0:
      method += f" (T = {r['temperature']:.2f})"
    toplabel = r.get("top1_estimator") == "toplabel"
    score = scores.label(r["top1_score"]) + (", per predicted class" if toplabel else "")
    ece = _num(100 * r["top1_binned_ece"], 2) + (" †" if toplabel else "")
    lines.append(
      f"| {method} | {score} | {_num(r['multiclass_brier'], 4)} "
      f"| {r['raw_top1_brier']:.4f} | {r['top1_binned_brier']:.4f} "
      f"| {100 * r['confidence_ece']:.2f} | {ece} |"
    )
  if any(r.get("top1_estimator") == "toplabel" for r in comparison):
    lines += [
      "",
      f"Top-label binning (Gupta & Ramdas, ICLR 2022): {n_bins} equal-count bins of pmax for "
      "each predicted class (pooled bins for a class with too few calibration examples), fitted "
      "on each calibration half; it predicts P(correct) only, so no multiclass Brier. "
      f"† its ECE is the equal-width ECE ({ece_bins} bins) of its P(correct), as the benchmark "
      "column; the other binned ECEs use the fitted quantile bins.",
    ]
  return "\n".join(lines)


def selective_table(rows: list[dict]) -> str:
  """Selective prediction with a guarantee: one line per (file, target accuracy)."""
  if not rows:
    return ""
  first = rows[0]
  lines = [
    "## Selective prediction with a guarantee",
    "",
    f"Top-1 event; {first['n_bins']} bins of each file's headline score fitted on each "
    "calibration part; the largest set of most-confident bins whose accuracy is at least the "
    f"target with probability {1 - first['delta']:g} (Geifman & El-Yaniv's SGR), applied to the "
    "test part. Means over splits; the guaranteed (lower bound) and test accuracies over the "
    "splits that selected something.",
    "",
    "| method | score | target | guaranteed accuracy | test coverage | test accuracy "
    "| splits: nothing selected | splits: test accuracy < target |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    lines.append(
      f"| {r['method']} | {scores.label(r['score'])} | {r['target_accuracy']:g} "
      f"| {_num(r['guaranteed_accuracy'], 4)} | {100 * r['test_coverage']:.1f}% "
      f"| {_num(r['test_accuracy'], 4)} | {r['num_empty']}/{r['num_splits']} "
      f"| {r['num_below_target']}/{r['num_splits']} |"
    )
  return "\n".join(lines)


def write_results(
  out_dir: pathlib.Path, results: list[dict], config: dict, topks, comparison=(), chosen=()
) -> dict:
  rows = flat_rows(results)
  dataset = next((r["meta"].get("dataset") for r in results if r["meta"].get("dataset")), None)
  title = f"Calibrated Top-k bins: {dataset or 'predictions'}"
  text = markdown(rows, config, tuple(topks), title)
  if comparison:
    text += "\n" + comparison_table(list(comparison)) + "\n"
  if chosen:
    text += "\n" + selective_table(list(chosen)) + "\n"
  summary = {
    "config": config,
    "versions": common.versions(),
    "results": rows,
    "comparison": list(comparison),
    "selective": list(chosen),
    "points": results,
  }
  common.write_json(out_dir / "results.json", summary)
  common.write_csv(out_dir / "results.csv", rows)
  common.atomic_write_bytes(out_dir / "results.md", text.encode())
  print(text, flush=True)
  common.say(f"wrote {out_dir}/results.json, results.csv, results.md")
  return summary


def _cv_from_record(record: dict) -> crossval.CrossValidation:
  n_bins = tuple(r["n_bins"] for r in record["rows"])
  return crossval.CrossValidation.from_per_fold(n_bins, record["per_fold"])


RELIABILITY_BINS = 15


def _reliability_figure(figures, source, test):
  """The raw max-softmax's reliability diagram (Top-1) on the test part of ``test``."""
  correct = np.asarray(events.topk_correct(source.log_probs, source.labels, 1))[test]
  # The raw confidence, as benchmarks report it: no calibration split is used.
  confidence = source.scores["pmax"][test]
  n = min(RELIABILITY_BINS, confidence.shape[0])
  title = f"{source.label()}: raw max-softmax, Top-1 ({n} equal-mass bins, test split)"
  fig = plots.reliability_diagram(confidence, correct, n, title=title)
  return plots.save_figure(fig, figures / f"reliability_{source.name}_top1.png")


def write_figures(out_dir, sources, results, splits, n_bins, topks, figure_bins) -> None:
  """Per-bin figures (Fig. 1), reliability diagrams, the refinement (Fig. 2), the ablation."""
  figures = out_dir / "figures"
  test = splits.test_mask(0)  # the first calibration/test split
  written = []
  figure_bins = min(figure_bins, int((~test).sum()))
  for source in sources:
    written.append(_reliability_figure(figures, source, test))
    score = scores.headline(source.scores)
    if score is None:
      continue
    for k in topks if source is sources[0] else topks[:1]:
      correct = np.asarray(events.topk_correct(source.log_probs, source.labels, k))
      u = source.scores[score]
      bins = binning.fit(u[~test], correct[~test], figure_bins)
      test_bins = binning.refit(bins, u[test], correct[test])
      fig = plots.bin_figure(
        bins,
        test_bins,
        event=f"Top-{k}",
        title=f"{source.label()}: {scores.label(score)}, Top-{k}, {figure_bins} bins",
      )
      written.append(plots.save_figure(fig, figures / f"bins_{source.name}_{score}_top{k}.png"))
  source = sources[0]
  score = scores.headline(source.scores)
  if score is not None and len(n_bins) > 1:
    correct = np.asarray(events.topk_correct(source.log_probs, source.labels, topks[0]))
    u = source.scores[score]
    pairs = []
    for n in (min(n_bins), max(n_bins)):
      bins = binning.fit(u[~test], correct[~test], n)
      pairs.append((bins, binning.refit(bins, u[test], correct[test])))
    fig = plots.refinement_figure(*pairs, event=f"Top-{topks[0]}")
    written.append(plots.save_figure(fig, figures / f"refinement_{source.name}_{score}.png"))
  if len(n_bins) > 1:
    for k in topks:
      # Every score of the plain model; for samples, the paper's measure (cov. of probs).
      # A score that orders the examples like another one shown (pmax, -log pmax) is
      # one line, labelled with both.
      chosen = [
        r
        for r in results
        if r["topk"] == k
        and (
          r["meta"].get("method") not in ("mc_dropout", "ensemble")
          or r["score"] == "covariance_norm_probs"
        )
      ]
      shown = {(r["source"], r["score"]) for r in chosen}
      curves = {}
      for r in chosen:
        twin = scores.same_order_as(r["score"])
        if twin is not None and (r["source"], twin) in shown and scores.is_tied_twin(r["score"]):
          continue  # drawn as its tie-free twin's line
        label = scores.label(r["score"])
        if twin is not None and (r["source"], twin) in shown:
          label += f" = {scores.label(twin)}"
        curves[f"{r['method']}: {label}"] = _cv_from_record(r)
      if curves:
        fig = plots.ablation_figure(curves, title=f"Top-{k}: scores against the number of bins")
        written.append(plots.save_figure(fig, figures / f"ablation_top{k}.png"))
  common.say(f"wrote {len(written)} figures to {figures}")


def write_risk_coverage_figures(out_dir, sources, splits, chosen) -> None:
  """Each file's risk-coverage curve (first split's test part) with its guaranteed selections."""
  test = np.asarray(splits.test_mask(0))
  written = []
  for source in sources:
    rows = [r for r in chosen if r["source"] == source.name]
    if not rows:
      continue
    score = rows[0]["score"]
    u = np.asarray(source.scores[score])[test]
    correct = np.asarray(events.topk_correct(source.log_probs, source.labels, 1))[test]
    curve = selective.risk_coverage(-u if rows[0]["order"] == "descending" else u, correct)
    points = [
      plots.OperatingPoint(
        r["target_accuracy"],
        r["per_split"][0]["test_coverage"],
        r["per_split"][0]["test_accuracy"],
        r["per_split"][0]["guaranteed_accuracy"],
      )
      for r in rows
    ]
    title = (
      f"{source.label()}: {scores.label(score)}, Top-1, test split "
      f"(δ = {rows[0]['delta']:g}, {rows[0]['n_bins']} bins)"
    )
    fig = plots.risk_coverage_figure(curve, points, title=title)
    written.append(plots.save_figure(fig, out_dir / "figures" / f"risk_coverage_{source.name}.png"))
  common.say(f"wrote {len(written)} risk-coverage figure(s) to {out_dir / 'figures'}")
