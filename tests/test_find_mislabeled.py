"""top1_jax.launch.find_mislabeled end to end (real Fashion-MNIST images and planted errors, or a
tiny IDX folder), and the files it reads and writes (io.mislabeled_report)."""

import csv
import gzip
import json
import os
import pathlib
import struct
import subprocess
import sys

import matplotlib.image
import numpy as np
import processes
import pytest

from top1_jax.core.validation import SettingError
from top1_jax.evaluation import mislabeled
from top1_jax.io import datasets, idx, mislabeled_report
from top1_jax.io import predictions as predictions_lib
from top1_jax.io.splits import DatasetSplit

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
    [sys.executable, processes.script("find_mislabeled"), *args],
    cwd=ROOT,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=120,
  )


def _one_line_error(result, *fragments):
  """Exit 1 and one error line, the last (progress lines may come before it)."""
  assert result.returncode == 1, result.stdout + result.stderr
  lines = result.stderr.strip().splitlines()
  assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result.stderr
  for fragment in fragments:
    assert fragment in lines[-1]


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
  assert f"{len(rows)} confident error(s)" in result.stderr


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


# ----------------------------------------------------------------------------
# io.mislabeled_report on a tiny IDX folder (no Fashion-MNIST needed)

TINY = 40
WRONG = [0, 2, 4, 6, 8, 11, 14, 17, 23, 27, 38]  # in 4 bins of 10: 5, 3, 2 and 1 wrong


def _write_idx(path: pathlib.Path, array: np.ndarray) -> None:
  header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  """A Fashion-MNIST-shaped test split of TINY images, labels 0..9 in turn."""
  directory = tmp_path_factory.mktemp("tiny_idx")
  images = np.random.default_rng(0).integers(0, 256, (TINY, 28, 28))
  _write_idx(directory / "t10k-images-idx3-ubyte.gz", images)
  _write_idx(directory / "t10k-labels-idx1-ubyte.gz", np.arange(TINY) % 10)
  return directory


def _tiny_predictions(path, labels=None, meta=None, **fields):
  """Wrong on WRONG, fewer of them in bins of larger margins (which grow with the index)."""
  labels = np.arange(TINY) % 10 if labels is None else labels
  predicted = labels.copy()
  predicted[WRONG] = (labels[WRONG] + 1) % 10
  logits = np.zeros((TINY, 10), np.float32)
  logits[np.arange(TINY), predicted] = np.linspace(1.0, 8.0, TINY)
  meta = {"dataset": "fashion_mnist", "split": "test"} if meta is None else meta
  predictions = predictions_lib.Predictions(labels=labels, logits=logits, meta=meta, **fields)
  return predictions_lib.save_predictions(path, predictions)


def test_load_inputs_gives_the_score_event_and_checked_images(tmp_path, tiny_dir):
  path = _tiny_predictions(tmp_path / "p.npz")
  inputs = mislabeled_report.load_inputs(path, score="margin", n_bins=4, data_dir=tiny_dir)
  assert inputs.u.dtype == np.float32 and inputs.u.shape == (TINY,)
  assert np.flatnonzero(~inputs.correct).tolist() == WRONG
  assert inputs.images.images.shape == (TINY, 28, 28, 1) and inputs.images.name == "fashion_mnist"
  np.testing.assert_array_equal(inputs.predicted[[0, 38]], [1, 9])
  found = mislabeled.report(
    inputs.u, inputs.correct, inputs.predicted, inputs.predictions.labels,
    inputs.images.class_names, n_bins=4,
  )  # fmt: skip
  assert [r["index"] for r in found.rows] == [38]
  assert found.rows[0]["given_name"] == "Bag" and found.rows[0]["predicted_name"] == "Ankle boot"


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"topk": 11}, r"^topk: expected 1 <= k <= 10 \(the classes of p.npz\), got 11$"),
    ({"n_bins": 41}, r"^n_bins: 41 bins need at least that many examples; p.npz has 40$"),
    ({"score": "covariance_norm_probs"}, r"^score: .* \(needs MC-dropout or ensemble"),
    ({"dataset": "mnist"}, r"^dataset: p.npz is of dataset 'fashion_mnist', not 'mnist'$"),
  ],
)
def test_a_setting_that_does_not_fit_the_file_is_named(tmp_path, tiny_dir, kwargs, match):
  path = _tiny_predictions(tmp_path / "p.npz")
  with pytest.raises(SettingError, match=match):
    mislabeled_report.load_inputs(path, **kwargs, data_dir=tiny_dir)


def test_predictions_of_another_order_or_without_a_dataset_are_refused(tmp_path, tiny_dir):
  rolled = _tiny_predictions(tmp_path / "rolled.npz", labels=np.roll(np.arange(TINY) % 10, 1))
  with pytest.raises(SettingError, match="^predictions: rolled.npz .*differ"):
    mislabeled_report.load_inputs(rolled, data_dir=tiny_dir)
  nameless = _tiny_predictions(tmp_path / "nameless.npz", meta={"split": "test"})
  with pytest.raises(SettingError, match="^dataset: nameless.npz names no"):
    mislabeled_report.load_inputs(nameless, data_dir=tiny_dir)
  found = mislabeled_report.load_inputs(nameless, dataset="fashion_mnist", data_dir=tiny_dir)
  assert found.images.name == "fashion_mnist"


def test_file_score_prefers_stored_scores_and_says_what_a_missing_one_needs(tmp_path):
  stored = np.linspace(0.0, 1.0, TINY, dtype=np.float32)
  path = _tiny_predictions(tmp_path / "p.npz", scores={"custom": stored})
  predictions = predictions_lib.load_predictions(path)
  log_probs, u = mislabeled_report.file_score(predictions, "custom", 1)
  assert log_probs.shape == (TINY, 10) and np.array_equal(u, stored)
  _, top2 = mislabeled_report.file_score(predictions, "neg_log_topk_mass", 2)
  expected = -np.log(np.sort(np.exp(np.asarray(log_probs)), axis=1)[:, -2:].sum(axis=1))
  np.testing.assert_allclose(top2, expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(SettingError, match=r"available: custom, entropy"):
    mislabeled_report.file_score(predictions, "human_entropy", 1)


@pytest.mark.parametrize(
  "change, problem",
  [
    ({"labels": np.arange(TINY - 1) % 10}, "40 predictions vs 39 images"),
    ({"num_classes": 12}, "10 classes vs 12"),
    ({"labels": (np.arange(TINY) + 1) % 10}, "labels differ at 40 examples, the first at index 0"),
  ],
)
def test_check_images_says_how_they_differ(tmp_path, change, problem):
  predictions = predictions_lib.load_predictions(_tiny_predictions(tmp_path / "p.npz"))
  labels = np.arange(TINY) % 10
  images = DatasetSplit(np.zeros((TINY, 2, 2, 1), np.float32), labels, 10, "d", "test", "", ())
  assert mislabeled_report.check_images(images, predictions) is images
  with pytest.raises(SettingError, match=problem):
    mislabeled_report.check_images(images._replace(**change), predictions, "p.npz")


def test_write_report_keeps_the_header_of_an_empty_table(tmp_path):
  u = np.arange(8, dtype=np.float32)
  labels = np.zeros(8, int)
  found = mislabeled.report(u, u >= 0, labels, labels, ("a",), n_bins=2)
  csv_path, json_path = mislabeled_report.write_report(tmp_path / "out", found, {"x": 1})
  assert csv_path.read_text().splitlines() == [",".join(mislabeled.COLUMNS)]
  assert json.loads(json_path.read_text()) == {"x": 1}


@pytest.mark.slow
def test_the_launcher_on_a_tiny_idx_folder(tmp_path, tiny_dir):
  _tiny_predictions(tmp_path / "predictions" / "deterministic.npz")
  result = _run(f"--workdir={tmp_path}", f"--data_dir={tiny_dir}", "--n_bins=4", "--top_bins=2")
  assert result.returncode == 0, result.stderr
  with open(tmp_path / "mislabeled" / "mislabeled.csv", newline="") as f:
    assert [int(r["index"]) for r in csv.DictReader(f)] == [38, 27, 23]
  summary = json.loads((tmp_path / "mislabeled" / "mislabeled.json").read_text())
  assert summary["num_found"] == 3 and summary["dataset"] == "fashion_mnist"
  assert [b["bin"] for b in summary["searched_bins"]] == [3, 2]
  assert (tmp_path / "mislabeled" / "mislabeled.png").is_file()
  result = _run(f"--workdir={tmp_path}", f"--data_dir={tiny_dir}", "--score=human_entropy")
  _one_line_error(result, "--score: 'human_entropy' is not available", "(needs human labels)")
