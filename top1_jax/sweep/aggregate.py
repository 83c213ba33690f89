"""Merging the results of several runs of one sweep (one per seed): mean ± std across runs.

Each run's ``results.csv`` holds one tidy row per sweep point (a predictions file,
score, Top-k event, estimator and bin count) with every metric's mean and std over
cross-validation splits. A point is identified across runs by ``KEY_COLUMNS``,
which leave out what differs from run to run (``seed``, and ``source``, the file
name, which carries the seed). Merging gives one row per point with the mean over
runs of the per-run means and their spread across runs: the "± std across seeds"
that papers report. Rows in, rows out: reading and writing files is ``io.results``'
and the launcher's job.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from top1_jax.core import scores
from top1_jax.evaluation import crossval
from top1_jax.sweep import tables

COLUMNS = tables.COLUMNS

KEY_COLUMNS = tuple(c for c in COLUMNS if c not in ("seed", "source"))
"""The columns that identify a sweep point across runs (all of ``COLUMNS`` but seed and source)."""

SHARED_CONFIG = ("n_folds", "scheme")
"""Config entries runs must share to be merged: their stds over splits mean the same thing."""


def _run_names(num_runs: int, names: Sequence[str] | None) -> list[str]:
  if names is None:
    return [f"run {i}" for i in range(num_runs)]
  if len(names) != num_runs:
    raise ValueError(f"names: expected one per run ({num_runs}), got {len(names)}")
  return [str(name) for name in names]


def check_configs(configs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
  """Refuses runs whose cross-validation differs (``SHARED_CONFIG``), naming both runs.

  Raises:
    ValueError: two runs differ in one of ``SHARED_CONFIG``.
  """
  for key in SHARED_CONFIG:
    first = configs[0].get(key)
    for name, config in zip(names[1:], configs[1:], strict=True):
      if config.get(key) != first:
        raise ValueError(
          f"cannot merge runs with different {key}: {names[0]} has {first!r}, "
          f"{name} has {config.get(key)!r}"
        )


def _group(runs: Sequence[Sequence[Mapping[str, Any]]], names: list[str]) -> dict[tuple, list]:
  """Key -> the rows of that sweep point, one per (run, seed), in order of first appearance."""
  groups: dict[tuple, list] = {}
  origin: dict[tuple, str] = {}  # (key, seed) -> the run it came from, for the error
  for name, rows in zip(names, runs, strict=True):
    for index, row in enumerate(rows):
      missing = [c for c in (*KEY_COLUMNS, "seed") if c not in row]
      if missing:
        raise ValueError(f"{name}: row {index} has no column {', '.join(missing)}")
      key = tuple(row[c] for c in KEY_COLUMNS)
      # Rows without a seed cannot be told apart across runs: each counts as its run's own.
      seed = (None, name) if row["seed"] is None else row["seed"]
      if (key, seed) in origin:
        where = origin[(key, seed)]
        same = "twice in " + name if where == name else f"in both {where} and {name}"
        raise ValueError(
          f"seed {row['seed']} of {row['method']} ({row.get('source')}, {row['score']}, "
          f"top-{row['topk']}, {row['n_bins']} bins) appears {same}: the same run merged twice"
        )
      origin[(key, seed)] = name
      groups.setdefault(key, []).append(row)
  return groups


def _seeds(rows: list[Mapping[str, Any]]) -> str | None:
  seeds = sorted({row["seed"] for row in rows if row["seed"] is not None})
  return ",".join(str(seed) for seed in seeds) or None


def merge_runs(
  runs: Sequence[Sequence[Mapping[str, Any]]],
  *,
  names: Sequence[str] | None = None,
  configs: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
  """One row per sweep point with each metric's mean and std across runs.

  For every metric of ``crossval.METRICS``, ``<name>`` is the mean over runs of
  the per-run means and ``<name>_std`` the sample standard deviation (ddof=1)
  of those means across runs: the spread from seed to seed, not over splits.
  With one run defining a metric its std is None (a sample std needs two
  values), as is everything about a metric no run defines. A metric a run
  leaves undefined (None, NaN or infinite, e.g. AUROC on a split of one class)
  is skipped for that point; for the metrics that can be undefined
  (``crossval.UNDEFINABLE``) ``<name>_num_runs`` counts the runs that define
  it, so a mean over fewer runs shows.

  A point is a ``KEY_COLUMNS`` value; its members are the runs' rows, one per
  seed. Rows without a seed count as their own run's (they cannot be matched),
  so they are never taken for duplicates.

  Args:
    runs: each run's rows (``io.results.read_results``): dicts holding
      ``KEY_COLUMNS``, ``seed`` and metric columns (None where undefined).
    names: each run's name (its work dir) for error messages.
    configs: each run's ``results.json`` config; when given, runs must agree
      on ``SHARED_CONFIG``.

  Returns:
    Rows in order of first appearance: ``KEY_COLUMNS``, ``seeds`` (the distinct
    seeds, e.g. "0,1,2"; None when no row has one), ``num_runs``, then for each
    metric ``<name>``, ``<name>_std`` and for the undefinable ones ``<name>_num_runs``.

  Raises:
    ValueError: no runs, a row without a key column, the same seed of a point
      twice (the same run merged twice), or runs whose configs differ.
  """
  if not runs:
    raise ValueError("runs: expected at least one run's rows, got none")
  names = _run_names(len(runs), names)
  if configs is not None:
    if len(configs) != len(runs):
      raise ValueError(f"configs: expected one per run ({len(runs)}), got {len(configs)}")
    check_configs(configs, names)
  groups = _group(runs, names)
  width = max(len(members) for members in groups.values()) if groups else 0
  # [num_points, most runs] per metric, NaN where a run is absent or leaves it undefined.
  per_run = {name: np.full((len(groups), width), np.nan) for name in crossval.METRICS}
  for i, members in enumerate(groups.values()):
    for j, row in enumerate(members):
      for name in crossval.METRICS:
        value = row.get(name)
        per_run[name][i, j] = np.nan if value is None else float(value)
  # The statistics over splits and over runs are the same rule: over the defined values.
  stats = crossval.CrossValidation.from_per_fold(range(len(groups)), per_run)
  out = []
  for i, (key, members) in enumerate(groups.items()):
    row: dict[str, Any] = dict(zip(KEY_COLUMNS, key, strict=True))
    row["seeds"] = _seeds(members)
    row["num_runs"] = len(members)
    for name in crossval.METRICS:
      count = int(stats.num_defined[name][i])
      row[name] = float(stats.mean[name][i]) if count > 0 else None
      row[f"{name}_std"] = float(stats.std[name][i]) if count > 1 else None
      if name in crossval.UNDEFINABLE:
        row[f"{name}_num_runs"] = count
    out.append(row)
  return out


# --------------------------------------------------------------------------- Markdown


def _mean_std(row: Mapping[str, Any], name: str, digits: int, scale: float = 1.0) -> str:
  mean, std = row.get(name), row.get(f"{name}_std")
  if mean is None:
    return "–"
  cell = tables.cell(scale * mean, digits)
  if std is not None:
    cell += f" ± {tables.cell(scale * std, digits)}"
  count = row.get(f"{name}_num_runs")
  if count is not None and count != row.get("num_runs"):
    cell += f" ({count}/{row['num_runs']})"
  return cell


def _varying(rows: Sequence[Mapping[str, Any]]) -> set[str]:
  """The settings that differ between rows, and so must be named in a row's label."""
  # Not the seed: merged rows are means over seeds.
  varying = tables.varying(rows, ("dataset", "model", "train_dropout_rate"))
  mc_rows = [r for r in rows if r["method"] == "mc_dropout"]
  return varying | tables.varying(mc_rows, ("num_samples",))


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """Merged rows (``merge_runs``) as Markdown: one table per (Top-k, bin count).

  Each cell is the mean ± std across runs (ddof=1; the mean alone for one
  run), "–" where no run defines the metric, and "(k/n)" where k of the n runs
  define it. ECE is in percent.

  Returns:
    The tables, each under a "### Top-k, n bins" heading; an empty string for no rows.
  """
  varying = _varying(rows) if rows else set()
  events = sorted({(row["topk"], row["n_bins"]) for row in rows})
  parts = []
  for topk, n_bins in events:
    lines = [
      f"### Top-{topk}, {n_bins} bins",
      "",
      "| method | score | Brier | NLL | ECE (%) | EOR | AUROC | runs |",
      "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
      if (row["topk"], row["n_bins"]) != (topk, n_bins):
        continue
      estimator = row.get("estimator") or "bins"
      score = scores.label(row["score"]) + ("" if estimator == "bins" else f" [{estimator}]")
      eor = _mean_std(row, "eor", tables.eor_digits(row.get("eor")))
      lines.append(
        f"| {tables.row_label(row, varying)} | {score} | {_mean_std(row, 'brier', 4)} "
        f"| {_mean_std(row, 'nll', 4)} | {_mean_std(row, 'ece', 2, 100.0)} "
        f"| {eor} | {_mean_std(row, 'auroc', 3)} "
        f"| {row['num_runs']} |"
      )
    parts.append("\n".join(lines))
  return "\n\n".join(parts) + ("\n" if parts else "")
