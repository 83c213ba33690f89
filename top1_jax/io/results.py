"""Reading a work dir's results (``results.csv`` and ``results.json``) back into rows.

``top1_jax.launch.evaluate`` writes them; ``top1_jax.launch.aggregate`` reads several
work dirs' to merge runs of one sweep (``top1_jax.pipeline.aggregation``). Work dirs may be
local paths or URLs (``gs://...``, through ``io.files``).
"""

from __future__ import annotations

import csv
import glob
import io
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from top1_jax.evaluation import crossval
from top1_jax.io import files

if TYPE_CHECKING:  # etils is imported only for a URL (see io.files)
  from etils import epath

COLUMNS = (
  "dataset",
  "model",
  "method",
  "train_dropout_rate",
  "dropout_rate",
  "num_samples",
  "ensemble_size",
  "seed",
  "source",
  "shift",
  "severity",
  "score",
  "topk",
  "estimator",
  "n_bins",
  "alpha",
)
"""results.csv's settings columns, in order; the metrics' columns follow (``METRIC_COLUMNS``).

``shift`` and ``severity`` say what the test part was: ``clean``
and 0 for the predictions a model was tested on as they are; otherwise a dataset
shift (``rotate``, ``translate``, a corruption) and its intensity (degrees, pixels,
1-5), whose rows were calibrated on the clean calibration part (``launch.shift``)."""

CLEAN = "clean"
"""The ``shift`` of an unshifted test part (with severity 0)."""

UNSHIFTED = {"shift": CLEAN, "severity": 0, "alpha": None}
"""The columns a row written before they existed lacks: its test part was clean, and it was
no prediction set's (``alpha``)."""

SET_SCORE = "prediction_set"
"""The ``score`` of a prediction-set row (its ``estimator`` is the set method)."""
SET_METRICS = ("coverage", "mean_size", "median_size", "empty_fraction", "sscv")
"""A prediction-set row's metrics (``evaluation.sets``): each a mean over the splits, with
its ``_std`` where the sets have one; the row's ``estimator`` is the set method, its
``score`` "prediction_set" and its ``alpha`` the miscoverage level."""

GEOMETRIC_SHIFTS = {
  "rotate_cubic": "rotation (degrees; Ovadia et al.'s cubic spline)",
  "roll": "translation (pixels, wrapping round; Ovadia et al.'s)",
  "rotate": "rotation (degrees; bilinear, no reshape)",
  "translate": "translation (pixels, zero fill)",
}
"""The shifts whose severity is an amount (``engine.shifts.GEOMETRIC``), with the axis a
table or figure names; any other shifted set is a corruption (intensity 1-5) or OOD."""


METRIC_COLUMNS = tuple(
  f"{name}{suffix}" for name in crossval.METRICS for suffix in ("", "_std", "_num_splits")
)
"""results.csv's metric columns, in order: each metric of ``crossval.METRICS`` (its mean
over splits), its ``_std`` and, for a metric that can be undefined, its ``_num_splits``."""

STRING_COLUMNS = (
  *("dataset", "model", "method", "source", "shift", "score", "estimator", "seeds", "label"),
  *("variant", "top1_score", "top1_estimator", "order"),  # aggregate_{comparison,selective}.csv
)
"""Columns kept as text even when a cell looks like a number (a model named "1")."""

INT_COLUMNS = ("num_samples", "ensemble_size", "seed", "topk", "n_bins", "num_runs")
"""Integer columns, with every ``*_num_splits`` and ``*_num_runs``."""

FLOAT_COLUMNS = ("train_dropout_rate", "dropout_rate", "severity", "alpha") + tuple(
  f"{name}{suffix}" for name in (*crossval.METRICS, *SET_METRICS) for suffix in ("", "_std")
)
"""Real-valued columns; a column of none of these kinds is read as whatever it parses as."""


def in_column_order(row: dict[str, Any]) -> dict[str, Any]:
  """``row`` with its cells in results.csv's order: ``COLUMNS``, then ``METRIC_COLUMNS``,
  then any other key in the row's own order.

  One order whatever the row's keys were built from: a sweep point's record saved as JSON
  comes back with its keys sorted, and a rerun must write the same file.
  """
  known = [c for c in (*COLUMNS, *METRIC_COLUMNS) if c in row]
  return {**{c: row[c] for c in known}, **{k: v for k, v in row.items() if k not in known}}


def _number(column: str, text: str, integer: bool) -> int | float:
  try:
    number = float(text)
  except ValueError:
    raise ValueError(f"expected a number in column {column}, got {text!r}") from None
  if not integer:
    return number
  if not number.is_integer():
    raise ValueError(f"expected an integer in column {column}, got {text!r}")
  return int(text) if text.lstrip("+-").isdigit() else int(number)


def _cell(column: str, text: str) -> Any:
  """A CSV cell as Python: None when empty, int or float by column, text for names."""
  if text == "":
    return None
  if column in STRING_COLUMNS:
    return text
  if column in INT_COLUMNS or column.endswith(("_num_splits", "_num_runs")):
    return _number(column, text, integer=True)
  if column in FLOAT_COLUMNS:
    return _number(column, text, integer=False)
  try:  # a column this reader does not know (from a newer evaluate)
    return _number(column, text, integer=text.lstrip("+-").isdigit())
  except ValueError:
    return text


def parse_csv(text: str, name: str) -> list[dict[str, Any]]:
  """Rows of a tidy results CSV, numbers back to int/float and empty cells to None.

  Args:
    text: the CSV, with a header line.
    name: the file's name, for error messages.

  Raises:
    ValueError: a cell that should be a number is not.
  """
  rows = []
  for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
    try:
      rows.append({column: _cell(column, value or "") for column, value in row.items()})
    except ValueError as e:
      raise ValueError(f"{name}, line {line}: {e}") from None
  return rows


def read_results(workdir: epath.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """A work dir's tidy ``results.csv`` rows and its ``results.json`` config.

  Args:
    workdir: a run's work dir (local path or URL) after ``top1_jax.launch.evaluate``.

  Returns:
    (rows, config): one dict per CSV row (None for empty cells, ints and floats
    for numbers) and the ``"config"`` entry of ``results.json``.

  Raises:
    FileNotFoundError: no such work dir, or no ``results.csv`` / ``results.json`` in it.
    ValueError: a file that does not parse, or a CSV without the columns of
      ``COLUMNS`` (one written before the tidy format).
  """
  root = files.as_path(workdir)
  if not root.is_dir():
    raise FileNotFoundError(f"{workdir}: no such work dir")
  csv_path = root / "results.csv"
  if not csv_path.exists():
    raise FileNotFoundError(
      f"{workdir}: no results.csv (run top1_jax.launch.evaluate with --workdir={workdir} first)"
    )
  text = files.read_text(csv_path)
  header = next(csv.reader(io.StringIO(text)), [])
  missing = [column for column in COLUMNS if column not in header and column not in UNSHIFTED]
  if missing:
    raise ValueError(
      f"{csv_path}: no column {', '.join(missing)} (written by an older "
      "top1_jax.launch.evaluate? run it again there)"
    )
  rows = [{**UNSHIFTED, **row} for row in parse_csv(text, str(csv_path))]
  json_path = root / "results.json"
  if not json_path.exists():
    raise FileNotFoundError(
      f"{workdir}: no results.json (run top1_jax.launch.evaluate with --workdir={workdir} first)"
    )
  results = files.read_json(json_path)
  if not isinstance(results, dict) or not isinstance(results.get("config"), dict):
    raise ValueError(f"{json_path}: expected a JSON object with a 'config' object")
  return rows, results["config"]


TABLES = ("comparison", "selective")
"""results.json's lists of table rows besides the sweep's: Table 1 and selective prediction."""


def read_tables(workdir: epath.PathLike) -> dict[str, list[dict[str, Any]]]:
  """A work dir's Table 1 and selective-prediction rows, from its ``results.json``.

  Args:
    workdir: a run's work dir (local path or URL) after ``top1_jax.launch.evaluate``.

  Returns:
    ``{"comparison": [...], "selective": [...]}`` (``TABLES``): each a list of the
    rows ``sweep.runner.table1`` / ``selective_rows`` wrote, each naming its file
    (``source``); an empty list where results.json holds none (no Top-1 event swept,
    or a file without them).

  Raises:
    FileNotFoundError: no ``results.json`` in the work dir.
    ValueError: one of ``TABLES`` that is not a list of JSON objects with a ``source``.
  """
  path = files.as_path(workdir) / "results.json"
  if not path.exists():
    raise FileNotFoundError(
      f"{workdir}: no results.json (run top1_jax.launch.evaluate with --workdir={workdir} first)"
    )
  saved = files.read_json(path)
  if not isinstance(saved, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(saved).__name__}")
  out = {}
  for name in TABLES:
    rows = saved.get(name) or []
    if not isinstance(rows, list):
      raise ValueError(f"{path}: expected '{name}' to be a list, got {type(rows).__name__}")
    for index, row in enumerate(rows):
      if not isinstance(row, dict) or not isinstance(row.get("source"), str):
        raise ValueError(
          f"{path}: '{name}' row {index}: expected an object naming its file in 'source'"
        )
    out[name] = rows
  return out


def expand_workdirs(patterns: Sequence[str], *, exclude: epath.PathLike | None = None) -> list[str]:
  """Work dirs named by ``patterns``: local globs expanded and sorted, URLs as given.

  Args:
    patterns: paths, local globs (``runs/seed*``) or URLs; a pattern without
      glob characters is kept even when it does not exist (reading it says so).
    exclude: a directory left out of glob matches (the output work dir, which
      ``runs/*`` also matches).

  Returns:
    The work dirs in the order of ``patterns`` (each glob's matches sorted),
    without repeats; only directories are taken from globs.
  """
  skip = os.path.abspath(os.fspath(exclude)) if exclude and files.is_local(exclude) else None
  found: list[str] = []
  for pattern in patterns:
    if files.is_local(pattern) and glob.has_magic(pattern):
      matches = sorted(glob.glob(os.path.expanduser(pattern)))
      matches = [m for m in matches if os.path.isdir(m) and os.path.abspath(m) != skip]
    else:
      matches = [os.path.expanduser(pattern) if files.is_local(pattern) else pattern]
    found += [match for match in matches if match not in found]
  return found
