"""Merging runs over seeds: statistics against NumPy, refusals, Markdown, the launcher."""

import csv
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import matplotlib
import matplotlib.pyplot
import matplotlib.text
import numpy as np
import processes
import pytest

from top1_jax.evaluation import crossval
from top1_jax.io import files, predictions, results
from top1_jax.pipeline import aggregation as aggregate
from top1_jax.pipeline import sources, sweep, tables

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
    name = {
      "deterministic": "deterministic",
      "mc_dropout": f"dropout_{rate}",
      "ensemble": "ensemble",
    }
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
          "shift": "clean",
          "severity": 0,
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
  return tuple(row.get(c) for c in aggregate.KEY_COLUMNS)  # alpha: a prediction set's only


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
    "deterministic",
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
  assert labels[:2] == ["cnn: deterministic", "cnn: dropout 0.05"]
  assert labels[5] == "mlp: deterministic"
  assert " ± " not in aggregate.markdown(mixed)
  assert aggregate.markdown([]) == ""


# --------------------------------------------------------------------------- Table 1, selective


def _table_rows(seed: int, model: str = "cnn") -> dict[str, list[dict]]:
  """One run's results.json Table 1 and selective rows (as ``runner.table1`` and
  ``selective_rows`` write them) of files of ``_run_rows``, random but reproducible."""
  rng = np.random.default_rng([seed, 7])
  point = f"{model}_tdr0.1_seed{seed}"
  table1, chosen = [], []
  files_ = ((f"{point}/deterministic", VARIANTS, "pmax"),)
  files_ += ((f"{point}/dropout_0.1", ("raw",), "covariance_norm_probs"),)
  for source, variants, score in files_:
    for variant in variants:
      row = {"label": f"seed {seed}: stale", "source": source, "top1_score": score}
      row.update(variant=variant, top1_estimator="bins", top1_n_bins=10, ece_bins=15)
      row.update({name: float(rng.random()) for name in aggregate.COMPARISON_METRICS})
      if variant == "toplabel":
        row.update(top1_estimator="toplabel", multiclass_brier=None)
        row.update(toplabel_num_classes=10, toplabel_points_per_bin=50)
      else:
        del row["toplabel_classes_with_own_bins"]
      if variant != "temperature":
        row["temperature"] = 1.0  # top-label binning leaves the softmax alone
      table1.append(row)
    for target in (0.9, 0.99):
      row = {"label": "stale", "source": source, "score": score, "order": "descending"}
      row.update(target_accuracy=target, delta=0.05, n_bins=10, num_splits=4)
      row.update(num_empty=int(rng.integers(0, 3)), num_below_target=int(rng.integers(0, 2)))
      row.update({name: float(rng.random()) for name in aggregate.SELECTIVE_METRICS})
      row["per_split"] = [{"test_coverage": 0.5}] * 4
      chosen.append(row)
  return {"comparison": table1, "selective": chosen}


VARIANTS = ("raw", "temperature", "toplabel")


def test_merge_comparison_is_each_rows_mean_and_std_across_runs():
  seeds = (0, 1, 2)
  runs = [_run_rows(seed) for seed in seeds]
  per_run = [_table_rows(seed)["comparison"] for seed in seeds]
  merged = aggregate.merge_comparison(runs, per_run)
  assert [(r["method"], r["dropout_rate"], r["variant"]) for r in merged] == [
    ("deterministic", 0.0, "raw"),
    ("deterministic", 0.0, "temperature"),
    ("deterministic", 0.0, "toplabel"),
    ("mc_dropout", 0.1, "raw"),
  ]
  for i, row in enumerate(merged):
    assert row["num_runs"] == 3 and row["seeds"] == "0,1,2"
    assert "source" not in row and "label" not in row and "seed" not in row
    for name in aggregate.COMPARISON_METRICS:
      values = [run[i].get(name) for run in per_run]
      if values[0] is None:  # top-label's multiclass Brier; the others' own bins
        assert row[name] is None and row[f"{name}_std"] is None
        continue
      assert row[name] == pytest.approx(np.mean(values), rel=1e-12)
      assert row[f"{name}_std"] == pytest.approx(np.std(values, ddof=1), rel=1e-12)
  assert merged[2]["toplabel_points_per_bin"] == 50 and merged[0]["toplabel_points_per_bin"] is None
  assert merged[0]["temperature"] == 1.0 and merged[0]["temperature_std"] == 0.0
  # One run: the value itself, no std.
  (one, *_) = aggregate.merge_comparison(runs[:1], per_run[:1])
  assert (
    one["raw_top1_brier"] == per_run[0][0]["raw_top1_brier"] and one["raw_top1_brier_std"] is None
  )


def test_merge_selective_means_undefined_runs_and_summed_counts():
  seeds = (3, 5, 7)
  runs = [_run_rows(seed) for seed in seeds]
  per_run = [_table_rows(seed)["selective"] for seed in seeds]
  per_run[1][0]["guaranteed_accuracy"] = per_run[1][0]["test_accuracy"] = None  # none selected
  merged = aggregate.merge_selective(runs, per_run)
  assert len(merged) == 4
  assert [(r["method"], r["target_accuracy"]) for r in merged][:2] == [
    ("deterministic", 0.9),
    ("deterministic", 0.99),
  ]
  first = merged[0]
  defined = [per_run[i][0]["guaranteed_accuracy"] for i in (0, 2)]
  assert first["guaranteed_accuracy"] == pytest.approx(np.mean(defined))
  assert first["guaranteed_accuracy_std"] == pytest.approx(np.std(defined, ddof=1))
  assert first["guaranteed_accuracy_num_runs"] == 2 and first["num_runs"] == 3
  coverage = [run[0]["test_coverage"] for run in per_run]
  assert first["test_coverage"] == pytest.approx(np.mean(coverage))
  assert first["test_coverage_std"] == pytest.approx(np.std(coverage, ddof=1))
  assert first["num_splits"] == 12
  assert first["num_empty"] == sum(run[0]["num_empty"] for run in per_run)
  assert first["num_below_target"] == sum(run[0]["num_below_target"] for run in per_run)
  assert "per_split" not in first and "test_coverage_num_runs" not in first


def test_table_rows_of_a_file_the_run_does_not_hold_are_refused():
  tables_rows = _table_rows(0)["comparison"]
  tables_rows[1]["source"] = "elsewhere/model"
  with pytest.raises(
    ValueError,
    match="runs/a: comparison row 1 is of file 'elsewhere/model', which results.csv does not hold",
  ):
    aggregate.merge_comparison([_run_rows(0)], [tables_rows], names=["runs/a"])
  chosen = _table_rows(0)["selective"]
  with pytest.raises(ValueError, match="seed 0 of deterministic .* in both runs/a and runs/b"):
    aggregate.merge_selective([_run_rows(0)] * 2, [chosen] * 2, names=["runs/a", "runs/b"])
  with pytest.raises(ValueError, match=r"selective: expected one list per run \(2\), got 1"):
    aggregate.merge_selective([_run_rows(0), _run_rows(1)], [chosen])


def test_markdown_carries_table1_and_the_selective_rows():
  seeds = (0, 1)
  runs = [_run_rows(seed) for seed in seeds]
  per_run = [_table_rows(seed) for seed in seeds]
  per_run[1]["selective"][0]["guaranteed_accuracy"] = None
  table1 = aggregate.merge_comparison(runs, [t["comparison"] for t in per_run])
  chosen = aggregate.merge_selective(runs, [t["selective"] for t in per_run])
  text = aggregate.markdown(aggregate.merge_runs(runs), table1, chosen)
  part = text.split("## Benchmark metrics vs Top-1 binning (paper Table 1; 10 Top-1 bins")[1]
  part, selective = part.split("## Selective prediction with a guarantee")
  lines = [line for line in part.splitlines() if line.startswith("| ")]
  assert lines[0].endswith("| runs |")
  cells = [line.split(" | ") for line in lines[1:]]
  temperatures = [t["comparison"][1]["temperature"] for t in per_run]
  assert [c[0][2:] for c in cells] == [
    "deterministic",
    f"deterministic + temperature scaling (T = {np.mean(temperatures):.2f} ± "
    f"{np.std(temperatures, ddof=1):.2f})",
    "deterministic + top-label binning",
    "dropout 0.1",
  ]
  raw = [t["comparison"][0]["raw_top1_brier"] for t in per_run]
  assert cells[0][3] == f"{np.mean(raw):.4f} ± {np.std(raw, ddof=1):.4f}"
  ece = [100 * t["comparison"][2]["top1_binned_ece"] for t in per_run]
  assert cells[2][6] == f"{np.mean(ece):.2f} ± {np.std(ece, ddof=1):.2f} †"
  assert cells[2][2] == "–" and cells[0][7] == "2 |"
  assert "Each cell is the mean ± std across runs" in part
  rows = [line.split(" | ") for line in selective.splitlines() if line.startswith("| ")][1:]
  assert rows[0][0][2:] == "deterministic" and rows[0][2] == "0.9"
  assert rows[0][3] == f"{per_run[0]['selective'][0]['guaranteed_accuracy']:.4f} (1/2)"
  coverage = [100 * t["selective"][0]["test_coverage"] for t in per_run]
  assert rows[0][4] == f"{np.mean(coverage):.1f} ± {np.std(coverage, ddof=1):.1f}%"
  empty = sum(t["selective"][0]["num_empty"] for t in per_run)
  assert rows[0][6] == f"{empty}/8" and rows[0][8] == "2 |"


def test_count_runs_counts_seeds_per_work_dir():
  assert aggregate.count_runs([_run_rows(0), _run_rows(1)]) == 2
  assert aggregate.count_runs([_run_rows(0) + _run_rows(1)]) == 2  # one work dir, two seeds
  assert aggregate.count_runs([_run_rows(0)]) == 1
  seedless = [{**row, "seed": None} for row in _run_rows(0)]
  assert aggregate.count_runs([seedless, seedless]) == 2


# --------------------------------------------------------------------------- names

OLD_NAMES = re.compile(r"\b(model|plain)\b")
"""What the plain network was called before: "model" (Table 1's "Vanilla (model)"), "plain"."""


def _texts(fig) -> list[str]:
  return [text.get_text() for text in fig.findobj(matplotlib.text.Text) if text.get_text()]


@pytest.mark.slow
def test_a_runs_tables_and_figures_call_the_plain_network_deterministic(tmp_path, monkeypatch):
  """Every label of a run's tables and figures: 'deterministic', never 'model' or 'plain'."""
  from top1_jax import plots
  from top1_jax.plots import results as plot_results

  rng = np.random.default_rng(0)
  labels = rng.integers(0, 4, 400)
  logits = rng.normal(size=(4, 400, 4)).astype(np.float32)
  logits[:, np.arange(400), labels] += 1.5
  meta = {"dataset": "toy", "model": "mlp", "train_dropout_rate": 0.1, "seed": 0}
  given = [
    ("toy_seed0/deterministic", logits[0], {**meta, "method": "deterministic"}),
    ("toy_seed0/dropout_0.1", logits, {**meta, "method": "mc_dropout", "dropout_rate": 0.1}),
    ("theirs", logits[1], {**meta, "method": "plain"}),  # from_arrays' name for one array
  ]
  asked = []
  for name, values, file_meta in given:
    path = tmp_path / "predictions" / f"{name}.npz"
    data = predictions.Predictions(labels=labels, logits=values, meta=file_meta)
    asked.append((name, predictions.save_predictions(path, data)))
  settings = types.SimpleNamespace(
    n_bins=(3, 6), topk=(1, 2), n_folds=2, scheme="halves", seeds=(0,), scores=("all",),
    estimators=("bins",), compare_bins=6, ece_bins=15, selective_targets=(0.8,),
    selective_delta=0.1,
  )  # fmt: skip
  found = sources.load_sources(asked, settings)
  records = sweep.sweep(settings, found, tmp_path / "sweep", log=lambda line: None)
  rows = tables.tidy_rows(records)
  table1 = sweep.table1(settings, found, records)
  chosen = sweep.selective_rows(settings, found)
  assert {r["method"] for r in rows} == {"deterministic", "mc_dropout"}  # plain read as such
  assert {r["label"] for r in rows} == {"deterministic", "dropout 0.1", "theirs"}
  assert [r["label"] for r in table1] == [
    "deterministic",
    "deterministic + temperature scaling",
    "deterministic + top-label binning",
    "dropout 0.1",
    "theirs",
    "theirs + temperature scaling",
    "theirs + top-label binning",
  ]
  config = {"n_bins": settings.n_bins, "n_folds": 2, "scheme": "halves", "seed": 0}
  text = tables.markdown(rows, config, settings.topk, "toy")
  text += tables.comparison_table(table1) + tables.selective_table(chosen)
  firsts = {line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ")}
  assert "deterministic" in firsts and not [c for c in firsts if OLD_NAMES.search(c)]
  # The figures' titles, legends and axes, as drawn (not saved: faster).
  drawn = []

  def keep_texts(fig, path):
    drawn.extend(_texts(fig))
    matplotlib.pyplot.close(fig)
    return path

  monkeypatch.setattr(plot_results, "save_figure", keep_texts)
  out = tmp_path / "run"
  written = plots.write_figures(out, found, records, settings.n_bins, settings.topk, 6)
  written += plots.write_risk_coverage_figures(out, found, chosen)
  written += plots.write_dropout_rate_figures(out, rows, settings.topk)
  assert len(written) >= 10
  assert any(t.startswith("deterministic: ") for t in drawn)  # a figure of the plain network
  assert any(t.startswith("deterministic (") for t in drawn)  # the dropout-rate reference line
  assert [t for t in drawn if OLD_NAMES.search(t)] == []


# --------------------------------------------------------------------------- reading results


def _workdir(
  path: pathlib.Path, seed: int, config=CONFIG, seeds=None, tables=True, **kwargs
) -> pathlib.Path:
  """A finished evaluate's results.csv and results.json, of ``seed`` (or of every one of
  ``seeds``, as a seed sweep's work dir); ``tables``: with Table 1 and the selective rows
  (a work dir of an older evaluate has none)."""
  rows, saved = [], {"config": config, "rows": []}
  for one in (seed,) if seeds is None else seeds:
    rows += _run_rows(one, **kwargs)
    if tables:
      for name, table in _table_rows(one, kwargs.get("model", "cnn")).items():
        saved[name] = saved.get(name, []) + table
  rows[0]["auroc"] = rows[0]["auroc_std"] = None  # an empty cell
  files.write_csv(path / "results.csv", rows)
  files.write_json(path / "results.json", saved)
  return path


def test_read_results_types_and_errors(tmp_path):
  rows, config = results.read_results(_workdir(tmp_path / "s0", 0))
  assert config == CONFIG
  written = _run_rows(0)
  assert len(rows) == len(written)
  assert rows[0]["auroc"] is None and rows[0]["auroc_std"] is None
  row, expected = rows[1], written[1]
  assert row == {**expected, "alpha": None}  # read as no prediction set's
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


def test_results_written_before_the_shift_columns_read_as_clean(tmp_path):
  old = [{k: v for k, v in row.items() if k not in ("shift", "severity")} for row in _run_rows(0)]
  files.write_csv(tmp_path / "results.csv", old)
  files.write_json(tmp_path / "results.json", {"config": CONFIG})
  rows, _ = results.read_results(tmp_path)
  assert {(row["shift"], row["severity"]) for row in rows} == {("clean", 0)}
  merged = aggregate.merge_runs([old, _run_rows(1)])  # an old run beside a new one
  assert len(merged) == len(old) and {row["num_runs"] for row in merged} == {2}


def test_read_tables_and_errors(tmp_path):
  assert results.read_tables(_workdir(tmp_path / "s0", 0)) == _table_rows(0)
  assert results.read_tables(_workdir(tmp_path / "old", 0, tables=False)) == {
    "comparison": [],
    "selective": [],
  }
  with pytest.raises(FileNotFoundError, match="nowhere: no results.json"):
    results.read_tables(tmp_path / "nowhere")
  path = tmp_path / "bad" / "results.json"
  for saved, message in (
    ([], "results.json: expected a JSON object, got list"),
    ({"comparison": {"a": 1}}, "results.json: expected 'comparison' to be a list, got dict"),
    (
      {"selective": [{"source": "a"}, {"score": "pmax"}]},
      "results.json: 'selective' row 1: expected an object naming its file in 'source'",
    ),
  ):
    files.write_json(path, saved)
    with pytest.raises(ValueError, match=message):
      results.read_tables(path.parent)


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
    [sys.executable, processes.script("aggregate"), *args],
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
  assert result.stdout.splitlines()[-1].startswith("merged 3 runs from 3 work dirs into ")
  assert "aggregate.csv" in result.stdout.splitlines()[-1]
  # Table 1 and the selective rows: in their CSVs, the JSON, the Markdown and the page.
  per_run = [_table_rows(seed) for seed in range(3)]
  runs = [_run_rows(seed, topks=(1, 2)) for seed in range(3)]
  for name in ("comparison", "selective"):
    expected = getattr(aggregate, f"merge_{name}")(runs, [t[name] for t in per_run])
    assert saved[name] == expected and len(expected) == 4
    # The tidy CSV reads back (io.results) as the merged rows.
    text = (out / f"aggregate_{name}.csv").read_text()
    assert results.parse_csv(text, name) == expected
  assert saved["num_runs"] == 3
  page = (out / "index.html").read_text()
  for text in ((out / "aggregate.md").read_text(), page):
    assert (
      "Benchmark metrics vs Top-1 binning" in text
      and "Selective prediction with a guarantee" in text
    )
    assert "deterministic + temperature scaling (T = " in text
  assert "Merged runs (3 runs from 3 work dirs)" in page


@pytest.mark.slow
def test_launcher_counts_the_runs_it_merges(tmp_path):
  # A seed sweep's work dir holds one run per seed: 'merged 1 runs' was printed for two.
  _workdir(tmp_path / "seeds", 0, seeds=(0, 1))
  result = _launch(f"--workdir={tmp_path / 'out'}", f"--workdirs={tmp_path / 'seeds'}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-1].startswith("merged 2 runs from 1 work dir into ")
  with open(tmp_path / "out" / "aggregate.csv", newline="") as file:
    assert {row["num_runs"] for row in csv.DictReader(file)} == {"2"}
  # One run, from a work dir of an evaluate that wrote no Table 1: the rest is merged.
  _workdir(tmp_path / "one", 4, tables=False)
  result = _launch(f"--workdir={tmp_path / 'out1'}", f"--workdirs={tmp_path / 'one'}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-1].startswith("merged 1 run from 1 work dir into ")
  assert not (tmp_path / "out1" / "aggregate_comparison.csv").exists()
  saved = json.loads((tmp_path / "out1" / "aggregate.json").read_text())
  assert saved["comparison"] == [] and saved["num_runs"] == 1


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
