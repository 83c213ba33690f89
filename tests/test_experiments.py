"""The command-line experiments end to end: the main job, resuming, and bad flags."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from top1_jax.io import idx
from top1_jax.io import predictions as predictions_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAVE_FMNIST = (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists()
needs_fmnist = pytest.mark.skipif(
  not HAVE_FMNIST, reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
QUICK = ["--quick", "--limit_train=3000", "--limit_test=1200"]


def _run(module, *args, timeout=300):
  return subprocess.run(
    [sys.executable, "-m", f"experiments.{module}", *args],
    cwd=ROOT,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("quick")
  result = _run("reproduce", *QUICK, f"--workdir={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir, result


@needs_fmnist
@pytest.mark.slow
def test_main_job_quick_writes_sane_tables_and_figures(quick_run):
  workdir, result = quick_run
  summary = json.loads((workdir / "results.json").read_text())
  rows = summary["results"]
  methods = {r["method"] for r in rows}
  assert methods == {"model", "dropout 0.01", "dropout 0.2", "ensemble (2)"}
  assert {r["topk"] for r in rows} == {1, 2} and {r["n_bins"] for r in rows} == {5, 10, 20}
  scores = {(r["method"], r["score"]) for r in rows}
  assert ("model", "pmax") in scores and ("ensemble (2)", "covariance_norm_probs") in scores
  assert ("dropout 0.2", "covariance_norm_probs") in scores
  for r in rows:
    assert 0.0 < r["brier"] < 0.25 and 0.0 < r["nll"] < 0.7
    assert 0.0 <= r["ece"] < 0.2 and r["eor"] >= 1.0 and 0.0 <= r["auroc"] <= 1.0
    decomposed = r["brier_uncertainty"] - r["brier_resolution"] + r["brier_calibration"]
    assert decomposed == pytest.approx(r["brier"], abs=1e-5)
    decomposed = r["nll_uncertainty"] - r["nll_resolution"] + r["nll_calibration"]
    assert decomposed == pytest.approx(r["nll"], abs=1e-4)
  # Max-softmax bins on a trained model are calibrated to within sampling error:
  # 600 test examples / 5 bins gives ~4% noise per bin.
  vanilla = [
    r for r in rows if (r["method"], r["score"], r["topk"], r["n_bins"]) == ("model", "pmax", 1, 5)
  ]
  assert vanilla[0]["ece"] < 0.06
  # A real model: well above chance, and binning beats predicting the accuracy everywhere.
  assert vanilla[0]["accuracy"] > 0.7
  assert vanilla[0]["brier"] < vanilla[0]["brier_uncertainty"]
  for name in ("results.csv", "results.md", "config.json", "timings.json"):
    assert (workdir / name).stat().st_size > 100
  md = (workdir / "results.md").read_text()
  assert "## Top-1, 10 bins" in md and "## Expected odds ratio, 20 bins" in md
  figures = sorted(p.name for p in (workdir / "figures").glob("*.png"))
  assert "ablation_top1.png" in figures and "bins_deterministic_pmax_top1.png" in figures
  assert any(name.startswith("refinement_") for name in figures)
  assert "reproduce: done" in result.stdout


@needs_fmnist
@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_work(quick_run, tmp_path):
  # Start from the finished run's checkpoints and predictions (training is tested
  # below); drop its sweep and results, then kill the rerun mid-sweep.
  workdir = tmp_path / "killed"
  shutil.copytree(quick_run[0], workdir)
  for name in ("sweep", "figures"):
    shutil.rmtree(workdir / name)
  for name in ("results.json", "results.csv", "results.md"):
    (workdir / name).unlink()
  process = subprocess.Popen(
    [sys.executable, "-m", "experiments.reproduce", *QUICK, f"--workdir={workdir}"],
    cwd=ROOT,
    env=ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  seen = []
  try:
    for line in process.stdout:
      seen.append(line)
      if "[3/" in line:  # a few sweep points are written; kill mid-sweep
        process.send_signal(signal.SIGKILL)
        break
  finally:
    process.kill()
    process.wait(timeout=60)
  assert any("[3/" in line for line in seen), "".join(seen)[-2000:]
  done_points = len(list((workdir / "sweep").glob("*.json")))
  assert done_points >= 3 and not (workdir / "results.json").exists()

  resumed = _run("reproduce", *QUICK, f"--workdir={workdir}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "train/base: done already, skipping" in resumed.stdout
  assert "train/ensemble: done already, skipping" in resumed.stdout
  assert "predict: ensemble.npz done already, skipping" in resumed.stdout
  assert f"({done_points} point(s) done already, skipped)" in resumed.stdout
  assert not list(workdir.rglob("*.tmp"))  # no half-written file survived
  # Same seed, same splits: the resumed run equals the uninterrupted one.
  expected = json.loads((quick_run[0] / "results.json").read_text())["results"]
  got = json.loads((workdir / "results.json").read_text())["results"]
  assert [(r["method"], r["score"], r["topk"], r["n_bins"]) for r in got] == [
    (r["method"], r["score"], r["topk"], r["n_bins"]) for r in expected
  ]
  np.testing.assert_allclose([r["brier"] for r in got], [r["brier"] for r in expected], rtol=1e-5)


def _one_line_error(result, text):
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr


def _predictions_file(path, dataset="fashion_mnist", num=200, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta={"dataset": dataset})
  )
  return path


@pytest.mark.parametrize(
  "args, message",
  [
    (["--scores=pmax,bogus"], "--scores: unknown score(s) bogus"),
    (["--n_bins=0"], "--n_bins: expected integers >= 1, got 0"),
    (["--n_bins=ten"], "--n_bins: expected integers, got ten"),
    (["--n_bins=500"], "--n_bins: 500 bins need at least that many calibration examples"),
    (["--topk=11"], "--topk: 11 exceeds the 10 classes"),
    (["--dataset=mnist"], "is of dataset 'fashion_mnist', not --dataset=mnist"),
  ],
)
def test_evaluate_bad_flags_give_one_line(tmp_path, args, message):
  path = _predictions_file(tmp_path / "p.npz")
  result = _run("evaluate", f"--workdir={tmp_path}", f"--predictions={path}", *args)
  _one_line_error(result, message)


def test_evaluate_refuses_files_of_different_datasets(tmp_path):
  a = _predictions_file(tmp_path / "a.npz", num=200)
  b = _predictions_file(tmp_path / "b.npz", num=300, seed=1)
  result = _run("evaluate", f"--workdir={tmp_path}", f"--predictions={a},{b}")
  _one_line_error(result, "have different labels")


def test_missing_inputs_give_one_line(tmp_path):
  _one_line_error(_run("evaluate", f"--workdir={tmp_path}"), "no .npz files in")
  _one_line_error(
    _run("evaluate", f"--workdir={tmp_path}", "--predictions=nope.npz"), "no such file: nope.npz"
  )
  _one_line_error(_run("evaluate"), "--workdir: required")
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"not a zip")
  _one_line_error(_run("evaluate", f"--workdir={tmp_path}", f"--predictions={bad}"), "bad.npz")


def test_evaluate_on_any_models_file(tmp_path):
  """A file from any framework: the sweep runs, and a second run reuses every point."""
  path = _predictions_file(tmp_path / "external.npz", num=400)
  args = [f"--workdir={tmp_path}", f"--predictions={path}", "--n_bins=4,8", "--n_folds=4"]
  first = _run("evaluate", *args)
  assert first.returncode == 0, first.stderr
  rows = json.loads((tmp_path / "results.json").read_text())["results"]
  assert {r["score"] for r in rows} >= {"pmax", "entropy", "neg_log_pmax", "neg_log_top2_mass"}
  assert {r["method"] for r in rows} == {"external"}
  second = _run("evaluate", *args)
  assert second.returncode == 0 and "done already, skipped" in second.stdout


@needs_fmnist
@pytest.mark.slow
def test_killed_training_resumes_from_the_last_epoch(tmp_path):
  args = [
    "--model=mlp",
    "--epochs=3",
    "--ensemble_size=0",
    "--limit_train=2000",
    "--limit_test=500",
    "--batch_size=100",
  ]
  straight = tmp_path / "straight"
  result = _run("train", *args, f"--workdir={straight}")
  assert result.returncode == 0, result.stderr[-2000:]

  killed = tmp_path / "killed"
  process = subprocess.Popen(
    [sys.executable, "-m", "experiments.train", *args, f"--workdir={killed}"],
    cwd=ROOT,
    env=ENV,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    checkpoint = killed / "train" / "base" / "epoch_1"
    for _ in range(600):  # up to 60 s for the first epoch's checkpoint
      if checkpoint.exists() or process.poll() is not None:
        break
      time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
  finally:
    process.wait(timeout=60)
  assert not (killed / "train" / "base.json").exists(), "finished before it could be killed"

  resumed = _run("train", *args, f"--workdir={killed}")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resuming after epoch" in resumed.stdout
  # Batches and dropout keys follow from the seed and the step: same result as no kill.
  expected = json.loads((straight / "train" / "base.json").read_text())["test"]
  got = json.loads((killed / "train" / "base.json").read_text())["test"]
  assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
  assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4)

  other = _run("train", *args[:-1], "--batch_size=50", f"--workdir={killed}")
  assert other.returncode == 1 and "trained with other settings" in other.stderr
