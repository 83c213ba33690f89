"""Merging runs over seeds: statistics against NumPy, refusals, Markdown, the launcher."""

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from top1_jax.evaluation import crossval
from top1_jax.io import files, results
from top1_jax.sweep import aggregate

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = {"n_folds": 4, "scheme": "random_halves", "n_bins": [5, 10]}
# (method, dropout_rate, ensemble_size, num_samples, score) of each predictions file.
POINTS = (
  ("deterministic", 0.0, 0, 1, "pmax"),
  ("mc_dropout", 0.05, 0, 20, "covariance_norm_probs"),
  ("mc_dropout", 0.1, 0, 20, "covariance_norm_probs"),
  ("mc_dropout", 0.1, 0, 20, "pmax"),
  ("ensemble", 0.0, 5, 5, "pmax"),
)


def _run_rows(seed: int, model: str = "cnn", topks=(1,), n_bins=(5, 10)) -> list[dict]:
  """One run's tidy results.csv rows, metrics random but reproducible from the seed."""
  rng = np.random.default_rng([seed, len(model)])
  rows = []
  for method, rate, size, samples, score in POINTS:
    name = {"deterministic": "model", "mc_dropout": f"dropout_{rate}", "ensemble": "ensemble"}
    for topk in topks:
      for bins in n_bins:
        row = {
          "dataset": "fashion_mnist",
          "model": model,
          "method": method,
          "train_dropout_rate": 0.1,
          "dropout_rate": rate,
          "num_samples": samples,
          "ensemble_size": size,
          "seed": seed,
          "source": f"{model}_tdr0.1_seed{seed}/{name[method]}",
          "score": score,
          "topk": topk,
          "estimator": "bins",
          "n_bins": bins,
        }
        for metric in crossval.METRICS:
          row[metric] = float(rng.random())
          row[f"{metric}_std"] = float(rng.random() / 10)
          if metric in crossval.UNDEFINABLE:
            row[f"{metric}_num_splits"] = CONFIG["n_folds"]
        rows.append(row)
  return rows


def _key(row):
  return tuple(row[c] for c in aggregate.KEY_COLUMNS)


@pytest.mark.parametrize("num_runs", [2, 3])
def test_merge_matches_numpy_mean_and_sample_std(num_runs):
  runs = [_run_rows(seed) for seed in range(num_runs)]
  merged = aggregate.merge_runs(runs)
  assert len(merged) == len(runs[0])
  assert [_key(row) for row in merged] == [_key(row) for row in runs[0]]  # order kept
  for i, row in enumerate(merged):
    assert row["num_runs"] == num_runs
    assert row["seeds"] == ",".join(str(s) for s in range(num_runs))
    for metric in crossval.METRICS:
      values = np.array([run[i][metric] for run in runs])
      assert row[metric] == pytest.approx(values.mean(), rel=1e-12)
      assert row[f"{metric}_std"] == pytest.approx(values.std(ddof=1), rel=1e-12)
  expected = [*aggregate.KEY_COLUMNS, "seeds", "num_runs"]
  assert list(merged[0])[: len(expected)] == expected
  assert "seed" not in merged[0] and "source" not in merged[0]
  assert "auroc_num_runs" in merged[0] and "brier_num_runs" not in merged[0]


def test_merge_skips_undefined_values_per_metric():
  runs = [_run_rows(seed) for seed in (3, 5, 7)]
  runs[1][0]["auroc"] = None  # one run leaves AUROC undefined here
  runs[0][0]["eor"] = runs[2][0]["eor"] = None  # only one run defines EOR
  for run in runs:
    run[1]["auroc"] = None  # no run defines it
  merged = aggregate.merge_runs(runs)
  first, second = merged[0], merged[1]
  defined = np.array([runs[0][0]["auroc"], runs[2][0]["auroc"]])
  assert first["auroc"] == pytest.approx(defined.mean())
  assert first["auroc_std"] == pytest.approx(defined.std(ddof=1))
  assert first["auroc_num_runs"] == 2 and first["num_runs"] == 3
  assert first["eor"] == pytest.approx(runs[1][0]["eor"]) and first["eor_std"] is None
  assert first["eor_num_runs"] == 1
  assert second["auroc"] is None and second["auroc_std"] is None
  assert second["auroc_num_runs"] == 0
  assert first["seeds"] == "3,5,7"


def test_one_run_has_no_std_across_runs():
  (row, *_) = aggregate.merge_runs([_run_rows(4)])
  assert row["num_runs"] == 1 and row["seeds"] == "4"
  assert row["brier"] == _run_rows(4)[0]["brier"] and row["brier_std"] is None


def test_points_missing_from_a_run_and_rows_without_a_seed():
  first = _run_rows(0)
  second = [row for row in _run_rows(1) if row["method"] != "ensemble"]
  for row in first + second:
    row["seed"] = None  # files brought by the user: never taken for duplicates
  merged = aggregate.merge_runs([first, second])
  ensemble = [row for row in merged if row["method"] == "ensemble"]
  assert {row["num_runs"] for row in ensemble} == {1}
  assert {row["num_runs"] for row in merged if row["method"] != "ensemble"} == {2}
  assert {row["seeds"] for row in merged} == {None}


def test_same_seed_twice_is_refused():
  with pytest.raises(ValueError, match=r"seed 0 of .* in both runs/a and runs/b: the same run"):
    aggregate.merge_runs([_run_rows(0), _run_rows(0)], names=["runs/a", "runs/b"])
  run = _run_rows(0)
  with pytest.raises(ValueError, match="twice in runs/a"):
    aggregate.merge_runs([run + run[:1]], names=["runs/a"])


def test_runs_with_other_cross_validation_are_refused():
  other = {**CONFIG, "n_folds": 10}
  with pytest.raises(ValueError, match="different n_folds: runs/a has 4, runs/b has 10"):
    aggregate.merge_runs(
      [_run_rows(0), _run_rows(1)], names=["runs/a", "runs/b"], configs=[CONFIG, other]
    )
  other = {**CONFIG, "scheme": "kfold"}
  with pytest.raises(ValueError, match="different scheme"):
    aggregate.merge_runs([_run_rows(0), _run_rows(1)], configs=[CONFIG, other])
  merged = aggregate.merge_runs([_run_rows(0), _run_rows(1)], configs=[CONFIG, dict(CONFIG)])
  assert merged[0]["num_runs"] == 2


def test_bad_inputs():
  with pytest.raises(ValueError, match="runs: expected at least one"):
    aggregate.merge_runs([])
  row = _run_rows(0)[0]
  del row["n_bins"]
  with pytest.raises(ValueError, match="run 0: row 0 has no column n_bins"):
    aggregate.merge_runs([[row]])
  with pytest.raises(ValueError, match="names: expected one per run"):
    aggregate.merge_runs([_run_rows(0)], names=["a", "b"])


def test_markdown_tables_and_labels():
  runs = [_run_rows(seed, topks=(1, 2)) for seed in range(3)]
  runs[1][0]["auroc"] = None
  merged = aggregate.merge_runs(runs)
  text = aggregate.markdown(merged)
  headings = [line for line in text.splitlines() if line.startswith("### ")]
  assert headings == ["### Top-1, 5 bins", "### Top-1, 10 bins", "### Top-2, 5 bins"] + [
    "### Top-2, 10 bins"
  ]
  table = text.split("### Top-1, 5 bins")[1].split("###")[0]
  cells = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]
  assert [c[0].lstrip("| ") for c in cells] == [
    "model",
    "dropout 0.05",
    "dropout 0.1",
    "dropout 0.1",
    "ensemble (5)",
  ]
  assert cells[1][1] == "cov. 2-norm (probs)" and cells[3][1] == "pmax (Vanilla)"
  brier = [run[0]["brier"] for run in runs]
  assert cells[0][2] == f"{np.mean(brier):.4f} ± {np.std(brier, ddof=1):.4f}"
  assert cells[0][6].endswith("(2/3)")  # AUROC of the model defined in 2 of 3 runs
  assert cells[0][7] == "3 |"
  # One run: the mean alone; settings that differ between rows prefix the labels.
  mixed = aggregate.merge_runs([_run_rows(0, "cnn", n_bins=(5,)) + _run_rows(0, "mlp", (1,), (5,))])
  labels = [line.split(" | ")[0][2:] for line in aggregate.markdown(mixed).splitlines()[4:]]
  assert labels[:2] == ["cnn: model", "cnn: dropout 0.05"] and labels[5] == "mlp: model"
  assert " ± " not in aggregate.markdown(mixed)
  assert aggregate.markdown([]) == ""


# --------------------------------------------------------------------------- reading results


def _workdir(path: pathlib.Path, seed: int, config=CONFIG, **kwargs) -> pathlib.Path:
  rows = _run_rows(seed, **kwargs)
  rows[0]["auroc"] = rows[0]["auroc_std"] = None  # an empty cell
  files.write_csv(path / "results.csv", rows)
  files.write_json(path / "results.json", {"config": config, "rows": []})
  return path


def test_read_results_types_and_errors(tmp_path):
  rows, config = results.read_results(_workdir(tmp_path / "s0", 0))
  assert config == CONFIG
  written = _run_rows(0)
  assert len(rows) == len(written)
  assert rows[0]["auroc"] is None and rows[0]["auroc_std"] is None
  row, expected = rows[1], written[1]
  assert row == expected
  assert isinstance(row["seed"], int) and isinstance(row["dropout_rate"], float)
  assert isinstance(row["auroc_num_splits"], int) and isinstance(row["source"], str)
  with pytest.raises(FileNotFoundError, match="nowhere: no such work dir"):
    results.read_results(tmp_path / "nowhere")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="empty: no results.csv .*top1_jax.launch.evaluate"):
    results.read_results(tmp_path / "empty")
  files.write_csv(tmp_path / "old" / "results.csv", [{"method": "x", "brier": 0.1}])
  with pytest.raises(ValueError, match="no column dataset, model,"):
    results.read_results(tmp_path / "old")
  bad = _run_rows(0)
  bad[2]["topk"] = "one"
  files.write_csv(tmp_path / "bad" / "results.csv", bad)
  with pytest.raises(ValueError, match="line 4: expected a number in column topk, got 'one'"):
    results.read_results(tmp_path / "bad")


def test_expand_workdirs(tmp_path):
  for name in ("s2", "s0", "s1", "merged"):
    (tmp_path / name).mkdir()
  (tmp_path / "s9.txt").write_text("not a work dir")
  found = results.expand_workdirs(
    [f"{tmp_path}/*", str(tmp_path / "s0")], exclude=tmp_path / "merged"
  )
  assert found == [str(tmp_path / name) for name in ("s0", "s1", "s2")]
  assert results.expand_workdirs([str(tmp_path / "x*")]) == []
  assert results.expand_workdirs(["gs://bucket/run"]) == ["gs://bucket/run"]


# --------------------------------------------------------------------------- the launcher


def _launch(*args):
  return subprocess.run(
    [sys.executable, "-m", "top1_jax.launch.aggregate", *args],
    cwd=ROOT,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=120,
  )


@pytest.mark.slow
def test_launcher_writes_tables_json_and_figure(tmp_path):
  for seed in range(3):
    _workdir(tmp_path / "runs" / f"seed{seed}", seed, topks=(1, 2))
  out = tmp_path / "runs" / "merged"
  result = _launch(f"--workdir={out}", f"--workdirs={tmp_path}/runs/*")
  assert result.returncode == 0, result.stderr[-2000:]
  with open(out / "aggregate.csv", newline="") as file:
    header, *body = list(csv.reader(file))
  assert header[: len(aggregate.KEY_COLUMNS) + 2] == [*aggregate.KEY_COLUMNS, "seeds", "num_runs"]
  assert len(body) == len(_run_rows(0, topks=(1, 2)))
  merged = [dict(zip(header, line, strict=True)) for line in body]
  assert {row["seeds"] for row in merged} == {"0,1,2"} and {row["num_runs"] for row in merged} == {
    "3"
  }
  saved = json.loads((out / "aggregate.json").read_text())
  assert saved["inputs"] == [str(tmp_path / "runs" / f"seed{s}") for s in range(3)]
  assert saved["configs"][saved["inputs"][0]] == CONFIG and len(saved["rows"]) == len(body)
  assert "### Top-2, 10 bins" in (out / "aggregate.md").read_text()
  for topk in (1, 2):
    assert (out / "figures" / f"dropout_rate_top{topk}.png").stat().st_size > 10_000
  assert "aggregate.csv" in result.stdout.splitlines()[-1]


def _error_line(result) -> str:
  """The failure's one line (after any progress lines), with no traceback."""
  assert result.returncode == 1 and "Traceback" not in result.stderr
  return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_launcher_errors_are_one_line(tmp_path):
  result = _launch(f"--workdir={tmp_path / 'out'}", f"--workdirs={tmp_path}/nothing*")
  assert _error_line(result) == f"error: --workdirs: {tmp_path}/nothing* names no work dir"
  _workdir(tmp_path / "a", 0)
  _workdir(tmp_path / "b", 1, config={**CONFIG, "n_folds": 10})
  result = _launch(f"--workdir={tmp_path / 'out'}", f"--workdirs={tmp_path}/a,{tmp_path}/b")
  assert _error_line(result).endswith(f"{tmp_path}/a has 4, {tmp_path}/b has 10")
