"""Merging several runs of one sweep (one per seed): each metric's mean ± std across runs.

A sweep point is matched across runs by ``KEY_COLUMNS`` (not ``seed`` nor ``source``, whose
file name carries the seed); Table 1 and the selective rows merge the same way.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from top1_jax.evaluation import crossval
from top1_jax.io import files, results
from top1_jax.pipeline import tables
from top1_jax.pipeline.runs import RunError

Row = Mapping[str, Any]
Runs = Sequence[Sequence[Row]]
"""Each run's rows (one list per run)."""

KEY_COLUMNS = tuple(c for c in results.COLUMNS if c not in ("seed", "source"))
"""The columns that identify a sweep point across runs."""

SETTINGS = tuple(
  c for c in KEY_COLUMNS if c not in ("score", "topk", "estimator", "n_bins", "alpha")
)
"""The columns that identify a predictions file across runs (its seed aside)."""

SHARED_CONFIG = ("n_folds", "scheme")
"""Config entries runs must share to be merged: their stds over splits mean the same thing."""


def _run_names(num_runs: int, names: Sequence[str] | None) -> list[str]:
  if names is None:
    return [f"run {i}" for i in range(num_runs)]
  if len(names) != num_runs:
    raise ValueError(f"names: expected one per run ({num_runs}), got {len(names)}")
  return [str(name) for name in names]


def check_configs(configs: Sequence[Row], names: Sequence[str]) -> None:
  """Refuses (ValueError) runs whose cross-validation differs (``SHARED_CONFIG``)."""
  for key in SHARED_CONFIG:
    first = configs[0].get(key)
    for name, config in zip(names[1:], configs[1:], strict=True):
      if config.get(key) != first:
        raise ValueError(
          f"cannot merge runs with different {key}: {names[0]} has {first!r}, "
          f"{name} has {config.get(key)!r}"
        )


def _group(runs: Runs, names: list[str], key_columns: Sequence[str]) -> dict[tuple, list]:
  """Key -> the rows of that point, one per (run, seed), in order of first appearance."""
  groups: dict[tuple, list] = {}
  origin: dict[tuple, str] = {}  # (key, seed) -> the run it came from, for the error
  for name, rows in zip(names, runs, strict=True):
    for index, row in enumerate(rows):
      row = {**results.UNSHIFTED, **row}  # results written before shift and severity
      missing = [c for c in (*key_columns, "seed") if c not in row]
      if missing:
        raise ValueError(f"{name}: row {index} has no column {', '.join(missing)}")
      key = tuple(row[c] for c in key_columns)
      # Rows without a seed cannot be told apart across runs: each counts as its run's own.
      seed = (None, name) if row["seed"] is None else row["seed"]
      if (key, seed) in origin:
        where = origin[(key, seed)]
        same = "twice in " + name if where == name else f"in both {where} and {name}"
        rest = ", ".join(f"{c} {row[c]}" for c in key_columns if c not in SETTINGS)
        raise ValueError(
          f"seed {row['seed']} of {row['method']} ({row.get('source')}, {rest}) appears {same}: "
          "the same run merged twice"
        )
      origin[(key, seed)] = name
      groups.setdefault(key, []).append(row)
  return groups


def _merge_groups(groups: dict, key_columns, metrics, undefinable, summed=()) -> list[dict]:
  """Each group's key, ``seeds``, ``num_runs``, ``summed`` totalled, and each metric's mean,
  ``_std`` and (``undefinable``) ``_num_runs``."""
  width = max(len(members) for members in groups.values()) if groups else 0
  # [num_points, most runs] per metric, NaN where a run is absent or leaves it undefined.
  per_run = {name: np.full((len(groups), width), np.nan) for name in metrics}
  for i, members in enumerate(groups.values()):
    for j, row in enumerate(members):
      for name in metrics:
        per_run[name][i, j] = np.nan if row.get(name) is None else float(row[name])
  stats = crossval.CrossValidation.from_per_fold(range(len(groups)), per_run)
  out = []
  for i, (key, members) in enumerate(groups.items()):
    row: dict[str, Any] = dict(zip(key_columns, key, strict=True))
    seeds = sorted({member["seed"] for member in members if member["seed"] is not None})
    row["seeds"] = ",".join(str(seed) for seed in seeds) or None
    row["num_runs"] = len(members)
    for name in summed:
      row[name] = sum(int(member.get(name) or 0) for member in members)
    for name in metrics:
      count = int(stats.num_defined[name][i])
      row[name] = float(stats.mean[name][i]) if count > 0 else None
      row[f"{name}_std"] = float(stats.std[name][i]) if count > 1 else None
      if name in undefinable:
        row[f"{name}_num_runs"] = count
    out.append(row)
  return out


def merge_runs(
  runs: Runs, *, names: Sequence[str] | None = None, configs: Sequence[Row] | None = None
) -> list[dict[str, Any]]:
  """One row per sweep point of ``runs`` (each run's rows, ``io.results.read_results``), in
  order of first appearance: ``KEY_COLUMNS``, ``seeds`` ("0,1,2"; None without seeds),
  ``num_runs``, then each metric's mean over the runs that define it (undefined: None, NaN,
  inf), its ``_std`` (ddof=1; None with fewer than two) and, for ``crossval.UNDEFINABLE``
  metrics, ``_num_runs``. ``names`` name the runs in messages; ``configs`` (their
  results.json configs) must agree on ``SHARED_CONFIG``.

  Raises ValueError: no runs, a row without a key column, the same seed of a point twice
  (a run merged twice), or runs whose configs differ.
  """
  if not runs:
    raise ValueError("runs: expected at least one run's rows, got none")
  names = _run_names(len(runs), names)
  if configs is not None:
    if len(configs) != len(runs):
      raise ValueError(f"configs: expected one per run ({len(runs)}), got {len(configs)}")
    check_configs(configs, names)
  groups = _group(runs, names, KEY_COLUMNS)
  metrics = (*crossval.METRICS, *results.SET_METRICS)  # a row holds one kind's, None else
  return _merge_groups(groups, KEY_COLUMNS, metrics, crossval.UNDEFINABLE)


def count_runs(runs: Runs) -> int:
  """How many runs the work dirs' rows hold: each dir's distinct seeds, plus one for rows
  without a seed."""
  return sum(
    len({row.get("seed") for row in rows} - {None}) + any(row.get("seed") is None for row in rows)
    for rows in runs
  )


def _plural(count: int, noun: str) -> str:
  return f"{count} {noun}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------- Table 1, selective

COMPARISON_KEY = (
  "variant", "top1_score", "top1_estimator", "top1_n_bins", "ece_bins",
  "toplabel_points_per_bin", "toplabel_num_classes",
)  # fmt: skip
"""What identifies a Table-1 row of a file (beside the file's ``SETTINGS``)."""

COMPARISON_METRICS = (
  "multiclass_brier", "raw_top1_brier", "top1_binned_brier", "confidence_ece",
  "top1_binned_ece", "temperature", "toplabel_classes_with_own_bins",
)  # fmt: skip
"""Table 1's numbers (``sweep.table1``), each a mean over a run's splits."""

SELECTIVE_KEY = ("score", "n_bins", "delta", "order", "target_accuracy")
"""What identifies a selective-prediction row of a file (beside the file's ``SETTINGS``)."""

SELECTIVE_METRICS = (
  "guaranteed_accuracy", "calibration_coverage", "test_coverage", "test_accuracy"
)  # fmt: skip
"""The selective rows' means over a run's splits (``sweep.selective_rows``)."""

SELECTIVE_UNDEFINED = ("guaranteed_accuracy", "test_accuracy")
"""Undefined (None) in a run where no split selected anything."""

SELECTIVE_COUNTS = ("num_splits", "num_empty", "num_below_target")
"""Counts of splits, summed over the runs."""


def _with_settings(rows, tables_rows, name: str, what: str, key: tuple) -> list[dict[str, Any]]:
  """Each of ``tables_rows`` with its file's ``SETTINGS`` and ``seed`` (from the results.csv
  row of its ``source``) and None for the ``key`` columns it lacks."""
  by_source = {row["source"]: row for row in rows if row.get("source") is not None}
  out = []
  for index, row in enumerate(tables_rows):
    source = row.get("source")
    if source not in by_source:
      raise ValueError(
        f"{name}: {what} row {index} is of file {source!r}, which results.csv does not hold"
      )
    settings = {c: by_source[source][c] for c in (*SETTINGS, "seed")}
    kept = {k: v for k, v in row.items() if k != "per_split"}
    out.append({**dict.fromkeys(key), **kept, **settings})
  return out


def _merge_table(runs, tables_runs, names, what: str, key: tuple, **merge) -> list[dict]:
  names = _run_names(len(runs), names)
  if len(tables_runs) != len(runs):
    raise ValueError(f"{what}: expected one list per run ({len(runs)}), got {len(tables_runs)}")
  attached = [
    _with_settings(rows, table, name, what, key)
    for rows, table, name in zip(runs, tables_runs, names, strict=True)
  ]
  key_columns = (*SETTINGS, *key)
  return _merge_groups(_group(attached, names, key_columns), key_columns, **merge)


def merge_comparison(
  runs: Runs, comparisons: Runs, *, names: Sequence[str] | None = None
) -> list[dict[str, Any]]:
  """Table 1 of merged runs (``comparisons``: each run's, ``io.results.read_tables``) keyed
  by ``SETTINGS`` and ``COMPARISON_KEY``, ``COMPARISON_METRICS`` as in ``merge_runs``.
  ValueError for a row of a file the run's results.csv rows (``runs``) lack."""
  return _merge_table(
    runs, comparisons, names, "comparison", COMPARISON_KEY,
    metrics=COMPARISON_METRICS, undefinable=(),
  )  # fmt: skip


def merge_selective(
  runs: Runs, selective: Runs, *, names: Sequence[str] | None = None
) -> list[dict[str, Any]]:
  """The selective rows of merged runs, as ``merge_comparison`` keyed by ``SELECTIVE_KEY``;
  ``SELECTIVE_COUNTS`` are summed over runs, each run's ``per_split`` left out."""
  return _merge_table(
    runs, selective, names, "selective", SELECTIVE_KEY, metrics=SELECTIVE_METRICS,
    undefinable=SELECTIVE_UNDEFINED, summed=SELECTIVE_COUNTS,
  )  # fmt: skip


# --------------------------------------------------------------------------- Markdown


def _labelled(rows: Sequence[Row], comparison=(), selective=()) -> dict[str, list[dict]]:
  """Each table's rows with their ``label``: the settings that differ (not the seed) and a
  Table-1 row's variant."""
  shown = {"rows": rows, "comparison": comparison, "selective": selective}
  everything = [row for rows in shown.values() for row in rows]
  varying = tables.varying(everything, ("dataset", "model", "train_dropout_rate"))
  mc_rows = [r for r in everything if r["method"] == "mc_dropout"]
  varying |= tables.varying(mc_rows, ("num_samples",))

  def label(row: Row) -> str:
    text = tables.row_label(row, varying)
    return text if row.get("variant") is None else tables.variant_label(text, row["variant"])

  return {name: [{**row, "label": label(row)} for row in rows] for name, rows in shown.items()}


def markdown(
  rows: Sequence[Row], comparison: Sequence[Row] = (), selective: Sequence[Row] = ()
) -> str:
  """Merged rows as Markdown: a table per (Top-k, bin count), then Table 1, selective rows
  and prediction sets when given; "" for no rows. Cells are ``tables.mean_std``'s."""
  shown = _labelled(rows, comparison, selective)
  set_rows = [row for row in shown["rows"] if row.get("alpha") is not None]  # prediction sets
  rows = [row for row in shown["rows"] if row.get("alpha") is None]
  parts = []
  for topk, n_bins in sorted({(row["topk"], row["n_bins"]) for row in rows}):
    header = ["method", "score", *tables.metric_names(n_bins), "runs"]
    lines = [f"### Top-{topk}, {n_bins} bins", "", *tables.md_head(header, 2)]
    for row in rows:
      if (row["topk"], row["n_bins"]) == (topk, n_bins):
        cells = [row["label"], tables.score_cell(row), *tables.metric_cells(row, tables.mean_std)]
        lines.append(tables.md_row([*cells, str(row["num_runs"])]))
    parts.append("\n".join(lines))
  parts += [
    tables.comparison_table(shown["comparison"], value=tables.mean_std, across_runs=True),
    tables.selective_table(shown["selective"], value=tables.mean_std, across_runs=True),
    tables.sets_table(set_rows, value=tables.mean_std),
  ]
  parts = [part for part in parts if part]  # "" for a table without rows
  return "\n\n".join(parts) + ("\n" if parts else "")


# --------------------------------------------------------------------------- the stage


def run(workdirs: list[str], out) -> str:
  """The aggregate stage: the runs of ``workdirs`` (paths or globs) merged into ``out``
  (aggregate.{csv,md,json}, aggregate_<table>.csv, figures, index.html); returns a line
  saying what was merged into which files."""
  names = results.expand_workdirs(workdirs or [], exclude=out)
  if not names:
    raise RunError(f"--workdirs: {','.join(workdirs or []) or '(empty)'} names no work dir")
  runs, configs, tables_of_runs = [], [], []
  for name in names:
    rows, config = results.read_results(name)
    logging.info("read %d rows from %s", len(rows), name)
    runs.append(rows)
    configs.append(config)
    tables_of_runs.append(results.read_tables(name))
  merged = merge_runs(runs, names=names, configs=configs)
  merged_tables = {  # Table 1 and the selective rows
    name: merge(runs, [run_tables.get(name, []) for run_tables in tables_of_runs], names=names)
    for name, merge in (("comparison", merge_comparison), ("selective", merge_selective))
  }
  what = f"{_plural(count_runs(runs), 'run')} from {_plural(len(runs), 'work dir')}"
  logging.info("merged %s into %d rows", what, len(merged))
  text = markdown(merged, **merged_tables)
  inputs = {"inputs": names, "num_runs": count_runs(runs)}
  inputs["configs"] = dict(zip(names, configs, strict=True))
  written = [
    files.write_csv(out / "aggregate.csv", merged),
    *(files.write_csv(out / f"aggregate_{k}.csv", v) for k, v in merged_tables.items() if v),
    files.write_bytes(out / "aggregate.md", text.encode()),
    files.write_json(out / "aggregate.json", {**inputs, "rows": merged, **merged_tables}),
  ]
  from top1_jax import plots  # matplotlib, imported only once the runs are merged

  calibration = [row for row in merged if row.get("alpha") is None]  # not prediction sets'
  topk = {row["topk"] for row in calibration}
  figures = plots.write_dropout_rate_figures(out, calibration, topk)
  title = f"Merged runs ({what}): metrics as mean ± std across runs"
  from top1_jax.pipeline import pages

  shown = _labelled(merged, **merged_tables)  # labelled as aggregate.md labels them
  page = pages.write_aggregate_page(out, title, shown, inputs, figures, tables.mean_std)
  written += [*figures, page]
  return f"merged {what} into {len(merged)} rows: {', '.join(map(str, written))}"
