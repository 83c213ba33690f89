"""results.csv's column order: the same file from a fresh sweep and from its reused records."""

import types

import numpy as np

from top1_jax.evaluation import crossval
from top1_jax.io import files, predictions, results
from top1_jax.pipeline import sources, sweep, tables


def _settings():
  return types.SimpleNamespace(
    n_bins=(3, 6), topk=(1,), n_folds=2, scheme="halves", seeds=(0,), scores=("pmax",),
    estimators=("bins",), compare_bins=3, ece_bins=15, selective_targets=(0.9,),
    selective_delta=0.1,
  )  # fmt: skip


def _results_csv(settings, path, folder, out):
  """One sweep of ``path`` (its points saved in, or reused from, ``folder``) as results.csv."""
  found = sources.load_sources([("model", path)], settings)
  records = sweep.sweep(settings, found, folder, log=lambda line: None)
  rows = [{k: v for k, v in row.items() if k != "label"} for row in tables.tidy_rows(records)]
  files.write_csv(out, rows)
  return out.read_bytes()


def test_a_rerun_that_reuses_every_point_writes_the_same_results_csv(tmp_path):
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 4, 200)
  logits = rng.normal(size=(200, 4)).astype(np.float32)
  logits[np.arange(200), labels] += 1.0
  path = predictions.save_predictions(
    tmp_path / "p.npz", predictions.Predictions(labels=labels, logits=logits)
  )
  first = _results_csv(_settings(), path, tmp_path / "sweep", tmp_path / "first.csv")
  # The rerun reads every point back from its saved JSON record (keys sorted there).
  assert len(list((tmp_path / "sweep").glob("*.json"))) == 1
  again = _results_csv(_settings(), path, tmp_path / "sweep", tmp_path / "again.csv")
  assert again == first
  header = first.decode().splitlines()[0].split(",")
  columns = [c for c in results.COLUMNS if c != "alpha"]  # a prediction set's column
  assert header[: len(columns)] == columns
  metrics = header[len(columns) :]
  assert metrics == [c for c in results.METRIC_COLUMNS if c in metrics]
  assert [c for c in metrics if c in crossval.METRICS] == list(crossval.METRICS)
