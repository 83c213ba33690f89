"""Reading a work dir's ``results.csv`` and ``results.json`` (local or a URL) back into rows."""

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
  *("dataset", "model", "method", "train_dropout_rate", "dropout_rate", "num_samples"),
  *("ensemble_size", "seed", "source", "shift", "severity", "score", "topk", "estimator"),
  *("n_bins", "alpha"),
)
"""results.csv's settings columns, in order; the metrics' columns follow (``METRIC_COLUMNS``).

``shift`` and ``severity``: ``clean`` and 0 for an unshifted test part, else a dataset
shift and its intensity (degrees, pixels, 1-5), calibrated on the clean calibration part."""

CLEAN = "clean"
"""The ``shift`` of an unshifted test part (with severity 0)."""
OOD_PREFIX = "ood_"
"""An out-of-distribution set's ``shift`` is this prefix and its ``io.ood_sets`` name
(``ood_digits``); its severity is 0."""


def is_ood(shift: str) -> bool:
  return shift.startswith(OOD_PREFIX)


UNSHIFTED = {"shift": CLEAN, "severity": 0, "alpha": None}
"""The values of the columns an older results.csv lacks: a clean test part, no set."""

SET_SCORE = "prediction_set"
"""The ``score`` of a prediction-set row (its ``estimator`` is the set method)."""
SET_METRICS = ("coverage", "mean_size", "median_size", "empty_fraction", "sscv")
"""A prediction-set row's metrics (``evaluation.sets``), means over the splits, with their
``_std``; the row's ``alpha`` is the miscoverage level."""

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
"""results.csv's metric columns, in order: each metric's mean over splits, ``_std`` and
``_num_splits`` (the splits where it is defined)."""

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
  """``row`` with its cells in results.csv's order: ``COLUMNS``, ``METRIC_COLUMNS``, then
  the rest in the row's own order (a record read back from JSON has its keys sorted, and a
  rerun must write the same file)."""
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
  """Rows of a results CSV (``text``, with a header line), numbers back to int/float and
  empty cells to None; a ValueError naming ``name`` for a cell that should be a number."""
  rows = []
  for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
    with files.named(f"{name}, line {line}"):
      rows.append({column: _cell(column, value or "") for column, value in row.items()})
  return rows


def _evaluated(workdir, name: str) -> epath.Path:
  """The work dir's file ``name``, which ``launch.evaluate`` writes: FileNotFoundError if none."""
  path = files.as_path(workdir) / name
  if not path.exists():
    raise FileNotFoundError(
      f"{workdir}: no {name} (run top1_jax.launch.evaluate with --workdir={workdir} first)"
    )
  return path


def read_results(workdir: epath.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """A work dir's ``results.csv`` rows (``parse_csv``) and its ``results.json`` config.

  Raises:
    FileNotFoundError: no such work dir, or no ``results.csv`` / ``results.json`` in it.
    ValueError: a file that does not parse, or a CSV without the ``COLUMNS``.
  """
  if not files.as_path(workdir).is_dir():
    raise FileNotFoundError(f"{workdir}: no such work dir")
  csv_path = _evaluated(workdir, "results.csv")
  text = files.read_text(csv_path)
  header = next(csv.reader(io.StringIO(text)), [])
  missing = [column for column in COLUMNS if column not in header and column not in UNSHIFTED]
  if missing:
    raise ValueError(
      f"{csv_path}: no column {', '.join(missing)} (written by an older "
      "top1_jax.launch.evaluate? run it again there)"
    )
  rows = [{**UNSHIFTED, **row} for row in parse_csv(text, str(csv_path))]
  json_path = _evaluated(workdir, "results.json")
  results = files.read_json(json_path)
  if not isinstance(results, dict) or not isinstance(results.get("config"), dict):
    raise ValueError(f"{json_path}: expected a JSON object with a 'config' object")
  return rows, results["config"]


TABLES = ("comparison", "selective")
"""results.json's lists of table rows besides the sweep's."""


def read_tables(workdir: epath.PathLike) -> dict[str, list[dict[str, Any]]]:
  """A work dir's Table 1 and selective-prediction rows from its ``results.json``:
  ``{"comparison": [...], "selective": [...]}``, each row naming its file (``source``).

  Raises:
    FileNotFoundError: no ``results.json`` in the work dir.
    ValueError: one of ``TABLES`` that is not a list of JSON objects with a ``source``.
  """
  path = _evaluated(workdir, "results.json")
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
  """Work dirs named by ``patterns``, in order and without repeats: local globs expanded to
  the directories they match (sorted) but ``exclude`` (the output work dir, which ``runs/*``
  may match), other patterns kept even when they do not exist."""
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
