"""experiments.find_mislabeled end to end on real Fashion-MNIST images and planted errors."""

import csv
import json
import os
import pathlib
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from top1_jax.io import datasets, idx
from top1_jax.io import predictions as predictions_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
needs_fmnist = pytest.mark.skipif(
  not (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
  reason=f"Fashion-MNIST test files not in {idx.FASHION_MNIST_DIR} "
  "(apt-get install dataset-fashion-mnist)",
)
NUM = 300
PLANTED = [17, 123, 256]  # wrong with the three largest margins, in this order


def _run(*args):
  return subprocess.run(
    [sys.executable, "-m", "experiments.find_mislabeled", *args],
    cwd=ROOT,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=120,
  )


def _one_line_error(result, *fragments):
  assert result.returncode == 1, result.stdout + result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  for fragment in fragments:
    assert fragment in lines[0]


def _workdir(tmp_path, labels):
  """A work dir whose plain-model predictions are right on the 27 most confident others.

  Logits are 0 except the predicted class's, so pmax = e^m / (e^m + 9) orders the
  examples exactly by the margin m. With 10 bins of 30, the top bin holds the
  three planted errors (margins 12, 11, 10) and 27 correct examples: 90% right,
  more than any other bin, where 60% are right.
  """
  rng = np.random.default_rng(0)
  margin = rng.uniform(0.5, 9.0, NUM)
  margin[PLANTED] = [12.0, 11.0, 10.0]
  correct = rng.uniform(size=NUM) < 0.6
  others = np.setdiff1d(np.arange(NUM), PLANTED)
  correct[others[np.argsort(margin[others])[-27:]]] = True
  correct[PLANTED] = False
  predicted = np.where(correct, labels, (labels + 1 + np.arange(NUM) % 9) % 10)
  logits = np.zeros((NUM, 10), np.float32)
  logits[np.arange(NUM), predicted] = margin
  meta = {"dataset": "fashion_mnist", "split": "test", "limit_test": NUM}
  predictions = predictions_lib.Predictions(labels=labels, logits=logits, meta=meta)
  predictions_lib.save_predictions(tmp_path / "predictions" / "deterministic.npz", predictions)
  return predicted


@needs_fmnist
@pytest.mark.slow
def test_planted_confident_errors_come_first_with_their_images(tmp_path):
  test = datasets.load_dataset("fashion_mnist", "test", limit=NUM)
  predicted = _workdir(tmp_path, test.labels)
  result = _run(f"--workdir={tmp_path}", "--n_bins=10", "--top_bins=2", "--max_images=5")
  assert result.returncode == 0, result.stderr
  out = tmp_path / "mislabeled"
  with open(out / "mislabeled.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["index"]) for r in rows[:3]] == PLANTED
  summary = json.loads((out / "mislabeled.json").read_text())
  first, second = summary["searched_bins"]
  assert first["bin"] == 9 and first["count"] == 30 and first["correct"] == 27
  # Then the errors of the next most accurate bin (about 60% right, which one is chance).
  assert len(rows) > 3 and {int(r["bin"]) for r in rows[:3]} == {9}
  assert {int(r["bin"]) for r in rows[3:]} == {second["bin"]} and second["bin"] != 9
  assert len(rows) - 3 == second["count"] - second["correct"]
  assert [int(r["rank"]) for r in rows] == list(range(1, len(rows) + 1))
  prior = np.mean(test.labels == predicted)
  assert float(rows[0]["bin_prob"]) == pytest.approx((27 + prior) / 31, abs=1e-6)
  assert min(float(r["bin_prob"]) for r in rows[:3]) > max(float(r["bin_prob"]) for r in rows[3:])
  for r in rows:
    i = int(r["index"])
    assert int(r["given_label"]) == test.labels[i] != int(r["predicted_label"]) == predicted[i]
    assert r["given_name"] == test.class_names[test.labels[i]]
    assert r["predicted_name"] == test.class_names[predicted[i]]
  scores = [float(r["score"]) for r in rows[:3]]
  assert scores == sorted(scores, reverse=True) and scores[0] > 0.9999

  assert summary["num_found"] == len(rows)
  assert summary["direction"] == "higher is more confident"
  figure = matplotlib.image.imread(out / "mislabeled.png")
  assert figure.ndim == 3 and figure.shape[0] > 100 and figure.shape[1] > 500  # 5 tiles wide
  assert f"{len(rows)} confident error(s)" in result.stdout


@needs_fmnist
@pytest.mark.slow
def test_predictions_of_another_example_order_are_refused(tmp_path):
  test = datasets.load_dataset("fashion_mnist", "test", limit=NUM)
  _workdir(tmp_path, np.roll(test.labels, 1))
  result = _run(f"--workdir={tmp_path}")
  _one_line_error(result, "deterministic.npz", "another dataset or example order")
  assert not (tmp_path / "mislabeled").exists()


def test_a_missing_predictions_file_is_one_line(tmp_path):
  result = _run(f"--workdir={tmp_path}", "--score=entropy")
  _one_line_error(result, "--predictions: no such file", "deterministic.npz")
