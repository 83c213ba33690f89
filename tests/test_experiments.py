"""The command-line experiments end to end: the main job, resuming, and bad flags."""

import csv
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import processes
import pytest

from top1_jax.io import checkpoints, idx, metric_writer
from top1_jax.io import predictions as predictions_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAVE_FMNIST = (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists()
needs_fmnist = pytest.mark.skipif(
  not HAVE_FMNIST, reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
ENV = processes.LAUNCHER_ENV
QUICK = [
  "--config=quick",
  "--config.limit_train=3000",
  "--config.limit_test=1200",
]
POINT = "mlp_tdr0.1_seed0"  # the quick config's one training point
NO_FIGURES = "--config.figures=False"  # for tests that check only the numbers: ~10 s less


_run = processes.launcher


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
  methods = {r["label"] for r in rows}
  assert methods == {"deterministic", "dropout 0.01", "dropout 0.2", "ensemble (2)"}
  assert {r["method"] for r in rows} == {"deterministic", "mc_dropout", "ensemble"}
  assert {r["topk"] for r in rows} == {1, 2} and {r["n_bins"] for r in rows} == {5, 10, 20}
  scores = {(r["label"], r["score"]) for r in rows}
  assert ("deterministic", "pmax") in scores and ("ensemble (2)", "covariance_norm_probs") in scores
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
    r
    for r in rows
    if (r["label"], r["score"], r["topk"], r["n_bins"]) == ("deterministic", "pmax", 1, 5)
  ]
  assert vanilla[0]["ece"] < 0.06
  # A real model: well above chance, and binning beats predicting the accuracy everywhere.
  assert vanilla[0]["accuracy"] > 0.7
  assert vanilla[0]["brier"] < vanilla[0]["brier_uncertainty"]
  for name in ("results.csv", "results.md", "config.json", "timings.json", "manifest.json"):
    assert (workdir / name).stat().st_size > 100
  md = (workdir / "results.md").read_text()
  assert "## Top-1, 10 bins" in md and "## Expected odds ratio, 20 bins" in md
  figures = sorted(p.name for p in (workdir / "figures").glob("*.png"))
  assert "ablation_top1.png" in figures and f"bins_{POINT}__deterministic_pmax_top1.png" in figures
  assert any(name.startswith("refinement_") for name in figures)
  assert "dropout_rate_top1.png" in figures
  # The launcher ends with a summary and where the tables are, not the tables themselves.
  assert "reproduce: done" in result.stderr and "results.md" in result.stderr
  assert "## Top-1" not in result.stdout + result.stderr
  timings = json.loads((workdir / "timings.json").read_text())
  assert {"load", "scores", "sweep", "comparison", "write", "figures"} <= set(timings["evaluate"])
  # TensorBoard: the test split's NLL, accuracy, Brier and ECE per evaluation epoch, and
  # each file's headline metrics.
  curves = metric_writer.read_scalars(workdir / "train" / POINT / "base" / "tensorboard")
  assert {"test/loss", "test/accuracy", "test/brier", "test/ece"} <= set(curves)
  assert 0 < curves["test/ece"][-1][1] < 0.2
  headline = metric_writer.read_scalars(workdir / "tensorboard")
  tags = {f"{POINT}/deterministic/brier", f"{POINT}/ensemble/ece", f"{POINT}/dropout_0.2/auroc"}
  assert tags <= set(headline)
  brier = next(r["brier"] for r in rows if (r["label"], r["score"], r["topk"], r["n_bins"])
               == ("deterministic", "pmax", 1, 20))  # fmt: skip
  assert headline[f"{POINT}/deterministic/brier"][0][1] == pytest.approx(brier, rel=1e-6)


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
    [sys.executable, processes.script("reproduce"), *QUICK, f"--workdir={workdir}"],
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

  resumed = _run("reproduce", *QUICK, NO_FIGURES, f"--workdir={workdir}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"train/{POINT}/base: done already, skipping" in resumed.stderr
  assert f"train/{POINT}/ensemble: done already, skipping" in resumed.stderr
  assert f"predict: {POINT}/ensemble done already, skipping" in resumed.stderr
  assert f"({done_points} point(s) done already, skipped)" in resumed.stderr
  assert not list(workdir.rglob("*.tmp"))  # no half-written file survived
  # Same seed, same splits: the resumed run equals the uninterrupted one.
  expected = json.loads((quick_run[0] / "results.json").read_text())["results"]
  got = json.loads((workdir / "results.json").read_text())["results"]
  assert [(r["label"], r["score"], r["topk"], r["n_bins"]) for r in got] == [
    (r["label"], r["score"], r["topk"], r["n_bins"]) for r in expected
  ]
  np.testing.assert_allclose([r["brier"] for r in got], [r["brier"] for r in expected], rtol=1e-5)


def _one_line_error(result, text):
  """Exit 1 and one error line, the last (progress lines may come before it), no traceback."""
  assert result.returncode == 1
  assert "Traceback" not in result.stderr, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("error: ")]
  assert errors == lines[-1:] and text in lines[-1], result.stderr


def _predictions_file(path, dataset="fashion_mnist", num=200, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta={"dataset": dataset})
  )
  return path


EVAL = "--config=evaluate_files"


# A case per place a launcher refuses: a field's rule (the rest of them:
# tests/test_settings.py), the rules against the files, a field or flag that does not
# exist, the processes' and the tasks' flags.
@pytest.mark.parametrize(
  "args, message",
  [
    (["--config.n_bins=(0,)"], "--config.n_bins: expected values in [1, 1048576]"),
    (["--config.n_bins=500"], "--config.n_bins: 500 bins need at least that many calibration"),
    (["--config.topk=11"], "--config.topk: 11 exceeds the 10 classes"),
    (["--config.n_bin=5"], "--config.n_bin: no such field; did you mean --config.n_bins?"),
    (["--nonsense=1"], "--nonsense: no such flag (--help lists every flag and field)"),
    (["--coordinator_address=127.0.0.1:1"], "--num_processes: required with --coordinator_address"),
    (["--task_index=3", "--num_tasks=2"], "--task_index: expected 0 <= --task_index < --num_tasks"),
  ],
)
@pytest.mark.slow
def test_evaluate_bad_settings_give_one_line(tmp_path, args, message):
  path = _predictions_file(tmp_path / "p.npz")
  result = _run("evaluate", f"--workdir={tmp_path}", EVAL, f"--config.inputs={path}", *args)
  _one_line_error(result, message)


@pytest.mark.slow
def test_evaluate_refuses_files_of_different_datasets(tmp_path):
  a = _predictions_file(tmp_path / "a.npz", num=200)
  b = _predictions_file(tmp_path / "b.npz", num=300, seed=1)
  result = _run("evaluate", f"--workdir={tmp_path}", EVAL, f"--config.inputs={a},{b}")
  _one_line_error(result, "have different labels")


@pytest.mark.slow
def test_missing_inputs_give_one_line(tmp_path):
  _one_line_error(_run("evaluate", f"--workdir={tmp_path}"), "run the predict stage")
  _one_line_error(
    _run("evaluate", f"--workdir={tmp_path}", EVAL, "--config.inputs=nope.npz"),
    "--config.inputs: no such file: nope.npz",
  )
  _one_line_error(_run("evaluate"), "--workdir: required")
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"not a zip")
  path = _predictions_file(tmp_path / "p.npz")
  _one_line_error(
    _run("evaluate", f"--workdir={tmp_path}", EVAL, f"--config.inputs={bad}"), "bad.npz"
  )
  _one_line_error(_run("evaluate", f"--workdir={tmp_path}", "--config=nope.py"), "nope.py")
  # An unset shell variable: --workdir= wrote to runs/<config>.
  _one_line_error(_run("reproduce", "--workdir=", "--config=quick"), "--workdir: empty")
  # An array given as the config: "SyntaxError: source code string cannot contain null bytes".
  _one_line_error(
    _run("evaluate", f"--workdir={tmp_path}", f"--config={path}"),
    f"--config: {path}: binary data, not text; give a packaged config by name",
  )


@pytest.mark.slow
def test_evaluate_on_any_models_file(tmp_path):
  """A file from any framework: the sweep runs, and a second run reuses every point."""
  _predictions_file(tmp_path / "external.npz", num=400)
  pattern = tmp_path / "ext*.npz"  # a glob
  args = [f"--workdir={tmp_path}", EVAL, f"--config.inputs={pattern}", "--config.topk=(1,2)"]
  args.append(NO_FIGURES)
  args += ["--config.n_bins=(4,8)", "--config.n_folds=4"]
  first = _run("evaluate", *args)
  assert first.returncode == 0, first.stderr
  rows = json.loads((tmp_path / "results.json").read_text())["results"]
  assert {r["score"] for r in rows} >= {"pmax", "entropy", "neg_log_pmax", "neg_log_top2_mass"}
  assert {r["method"] for r in rows} == {"external"} and {r["label"] for r in rows} == {"external"}
  second = _run("evaluate", *args)
  assert second.returncode == 0 and "done already, skipped" in second.stderr


@pytest.mark.slow
def test_evaluate_with_another_config_than_the_work_dirs_leaves_it_as_it_was(tmp_path):
  # A rerun that forgets --config gets the default (Fashion-MNIST) config, whose files
  # this work dir never had: one line naming the way out, and nothing written.
  path = _predictions_file(tmp_path / "p.npz")
  workdir = tmp_path / "run"
  first = _run("evaluate", f"--workdir={workdir}", EVAL, f"--config.inputs={path}", NO_FIGURES)
  assert first.returncode == 0, first.stderr[-3000:]
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
  again = _run("evaluate", f"--workdir={workdir}")
  assert again.returncode == 1
  lines = again.stderr.strip().splitlines()
  assert lines[-1].startswith("error: predictions files not there: ")
  assert lines[-1].endswith(f"or give the --config {workdir} was made with")
  assert {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()} == before


TINY = ["--config=quick", "--config.limit_train=500", "--config.limit_test=200"]
TINY += ["--config.num_epochs=1", NO_FIGURES]


@needs_fmnist
@pytest.mark.slow
def test_a_diverging_training_stops_naming_the_learning_rate_before_predicting(tmp_path):
  # The case: trained to a loss of 4e19, then failed on non-finite covariance
  # scores, naming nothing.
  result = _run("reproduce", *TINY, "--config.learning_rate=1e6", f"--workdir={tmp_path}")
  _one_line_error(
    result,
    "error: --config.learning_rate: training diverged with learning_rate=1e+06 in epoch 1 "
    f"of train/{POINT}/base (loss ",
  )
  assert "the default is 0.001" in result.stderr
  assert not (tmp_path / "predictions").exists() and not (tmp_path / "results.csv").exists()


@pytest.fixture
def small_disk(tmp_path):
  """A 2 MB file system (tmpfs): room for the config files, not for a checkpoint."""
  disk = tmp_path / "disk"
  disk.mkdir()
  try:
    mounted = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
  except FileNotFoundError:
    pytest.skip("no mount command: a full disk is simulated by tests/test_io_checkpoints.py")
  if mounted.returncode != 0:
    pytest.skip(f"mounting a tmpfs is not permitted here ({mounted.stderr.decode().strip()})")
  try:
    yield disk
  finally:
    subprocess.run(["umount", str(disk)], check=True)


@needs_fmnist
@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_the_work_dir(small_disk):
  # It was 3 to 13 tracebacks (asyncio's "Event loop is closed", orbax's threads) before
  # tensorstore's RESOURCE_EXHAUSTED, and *.orbax-checkpoint-tmp folders left behind.
  workdir = small_disk / "run"
  result = _run("reproduce", *TINY, f"--workdir={workdir}")
  _one_line_error(result, f"error: --workdir: {workdir}: no space left on device (writing ")
  assert "free some space or give another --workdir, then rerun the same command" in result.stderr
  assert not (workdir / ".lock").exists()
  # The failed save's temporary folders are removed at once; tensorstore's threads may
  # still write one after that, which the next run on the folder removes.
  with checkpoints.RunCheckpoints(workdir / "train" / POINT / "base" / "checkpoints"):
    assert not list(small_disk.rglob("*.orbax-checkpoint-tmp*"))


@needs_fmnist
@pytest.mark.slow
def test_killed_training_resumes_from_the_last_epoch(tmp_path):
  args = [
    "--config=quick",
    "--config.num_epochs=3",
    "--config.ensemble_size=0",
    "--config.limit_train=2000",
    "--config.limit_test=500",
    "--config.batch_size=100",
  ]
  straight = tmp_path / "straight"
  result = _run("train", *args, f"--workdir={straight}")
  assert result.returncode == 0, result.stderr[-2000:]

  killed = tmp_path / "killed"
  process = subprocess.Popen(
    [sys.executable, processes.script("train"), *args, f"--workdir={killed}"],
    cwd=ROOT,
    env=ENV,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    checkpoint = killed / "train" / POINT / "base" / "checkpoints" / "1"
    for _ in range(600):  # up to 60 s for the first epoch's checkpoint
      if checkpoint.exists() or process.poll() is not None:
        break
      time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
  finally:
    process.wait(timeout=60)
  assert not (killed / "train" / POINT / "base.json").exists(), "finished before it was killed"

  resumed = _run("train", *args, f"--workdir={killed}")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resuming after epoch" in resumed.stderr
  # Batches and dropout keys follow from the seed and the step: same result as no kill.
  expected = json.loads((straight / "train" / POINT / "base.json").read_text())["test"]
  got = json.loads((killed / "train" / POINT / "base.json").read_text())["test"]
  assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
  assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4)
  # Other settings on a trained point: test_more_epochs_continue_a_finished_training_...


@needs_fmnist
@pytest.mark.slow
def test_a_rerun_with_other_rates_reports_only_the_rates_asked_for(quick_run, tmp_path):
  # The case: 0.05 asked for in a work dir with 0.01 and 0.2 reported all three.
  workdir = tmp_path / "rerun"
  shutil.copytree(quick_run[0], workdir)
  result = _run(
    "reproduce", *QUICK, NO_FIGURES, "--config.dropout_rates=(0.2,)", f"--workdir={workdir}"
  )
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads((workdir / "results.json").read_text())["results"]
  assert {r["label"] for r in rows} == {"deterministic", "dropout 0.2", "ensemble (2)"}
  with open(workdir / "results.csv") as file:
    assert {row["dropout_rate"] for row in csv.DictReader(file)} == {"0.0", "0.2"}
  assert "not reported" in result.stderr and f"{POINT}/dropout_0.01" in result.stderr
  assert (workdir / "predictions" / POINT / "dropout_0.01.npz").exists()  # kept, not reported
  manifest = json.loads((workdir / "manifest.json").read_text())
  assert manifest["config"]["dropout_rates"] == [0.2] and len(manifest["files"]) == 3
  assert "train/" in result.stderr and "done already" in result.stderr  # nothing retrained


def _wait_for(commands: list[list[str]], env=ENV) -> list[str]:
  return processes.wait(processes.start(commands, env, cwd=ROOT), timeout=600)


SMALL = [*QUICK[:1], "--config.limit_train=1000", "--config.limit_test=400"]
SMALL += ["--config.dropout_rates=(0.2,)", "--config.num_samples=4", "--config.ensemble_size=0"]
SMALL += ["--config.n_bins=(5,10)", "--config.topk=1", NO_FIGURES]
TWO_SEEDS = "--config.seeds=(0,1)"


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory):
  """Two seeds of a small sweep as two tasks run at once into one work dir, then merged."""
  workdir = tmp_path_factory.mktemp("seeds")
  outputs = _wait_for(
    [
      [processes.script("reproduce"), *SMALL, TWO_SEEDS, f"--workdir={workdir}"]
      + [f"--task_index={i}", "--num_tasks=2"]
      for i in range(2)
    ]
  )
  tables_after_tasks = (workdir / "results.csv").exists()
  merged = _run("evaluate", *SMALL, TWO_SEEDS, f"--workdir={workdir}")
  assert merged.returncode == 0, merged.stderr[-3000:]
  return workdir, outputs, merged, tables_after_tasks


@needs_fmnist
@pytest.mark.slow
def test_tasks_split_a_seed_sweep_that_evaluate_merges_and_aggregate_averages(seed_sweep, tmp_path):
  workdir, outputs, merged, tables_after_tasks = seed_sweep
  assert not tables_after_tasks  # tasks sweep; the merge writes the tables
  assert "task 0 of 2 done" in outputs[0] and "task 1 of 2 done" in outputs[1]
  assert "results.md" not in outputs[0] + outputs[1]  # no word of a file a task does not write
  assert "done already, skipped" in merged.stderr  # the tasks' points are reused
  with open(workdir / "results.csv") as file:
    rows = list(csv.DictReader(file))
  assert {r["seed"] for r in rows} == {"0", "1"} and {r["model"] for r in rows} == {"mlp"}
  assert not list(workdir.glob(".lock*"))
  assert "another config" not in outputs[0] + outputs[1] + merged.stderr  # one sweep, one config

  out = tmp_path / "merged"
  result = _run("aggregate", f"--workdir={out}", f"--workdirs={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-1].startswith("merged 2 runs from 1 work dir into ")
  with open(out / "aggregate.csv") as file:
    merged_rows = list(csv.DictReader(file))
  assert merged_rows and {r["num_runs"] for r in merged_rows} == {"2"}
  assert {r["seeds"] for r in merged_rows} == {"0,1"}
  one = [
    r for r in merged_rows if (r["method"], r["score"], r["n_bins"]) == ("mc_dropout", "pmax", "5")
  ]
  seeds = [
    float(r["brier"])
    for r in rows
    if (r["method"], r["score"], r["n_bins"]) == ("mc_dropout", "pmax", "5")
  ]
  assert float(one[0]["brier"]) == pytest.approx(np.mean(seeds))
  assert float(one[0]["brier_std"]) == pytest.approx(np.std(seeds, ddof=1))


@needs_fmnist
@pytest.mark.slow
def test_two_processes_give_the_one_process_numbers_and_write_each_file_once(seed_sweep, tmp_path):
  # Seed 0 of the small sweep on two processes; one process made the same in seed_sweep.
  workdir, port = tmp_path / "two", processes.free_port()
  env = {**ENV, "XLA_FLAGS": processes.xla_flags(1)}
  args = [*SMALL, f"--workdir={workdir}", "--num_processes=2"]  # seed 0 alone
  _wait_for(
    [
      ["tests/multihost_launcher.py", str(tmp_path / f"writes{i}.txt"), "reproduce", *args]
      + [f"--coordinator_address=127.0.0.1:{port}", f"--process_id={i}"]
      for i in range(2)
    ],
    env,
  )
  one = json.loads((seed_sweep[0] / "results.json").read_text())["results"]
  one = [r for r in one if r["seed"] == 0]
  two = json.loads((workdir / "results.json").read_text())["results"]
  key = [(r["source"], r["score"], r["topk"], r["n_bins"]) for r in one]
  assert [(r["source"], r["score"], r["topk"], r["n_bins"]) for r in two] == key
  # Data-parallel training sums the gradients in another order: nearly the same networks,
  # whose predictions may cross a bin edge here and there.
  for metric in ("accuracy", "brier", "ece"):
    diff = np.abs(np.subtract([r[metric] for r in two], [r[metric] for r in one]))
    assert diff.max() < 1e-2 and np.median(diff) < 1e-3, (metric, diff.max(), np.median(diff))
  writes = (tmp_path / "writes0.txt").read_text().split()
  assert len(writes) == len(set(writes)) and str(workdir / "results.csv") in writes
  assert not (tmp_path / "writes1.txt").exists()  # process 1 wrote nothing


@pytest.mark.slow
def test_a_cloud_work_dir_without_its_package_is_one_line_and_writes_nothing(tmp_path):
  path = _predictions_file(tmp_path / "p.npz")
  for module, more in (("evaluate", [EVAL, f"--config.inputs={path}"]), ("reproduce", [])):
    result = subprocess.run(
      [sys.executable, processes.script(module), "--workdir=gs://bucket/run1", *more],
      cwd=tmp_path,
      env=ENV,
      capture_output=True,
      text=True,
      timeout=300,
    )
    _one_line_error(result, "--workdir: gs://bucket/run1: gs:// paths need a package")
    assert "Nothing was written" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz"]  # no ./gs:/bucket/run1


@needs_fmnist
@pytest.mark.slow
def test_dropout_rates_are_carried_by_their_jobs_not_parsed_back(tmp_path):
  # 0.1234567 failed after training (a file name's rate looked up in the tuple), and
  # (0.1000001, 0.1) predicted one rate and reported it as both: each is its own job.
  rates = "--config.dropout_rates=(0.1234567,0.1000001,0.1)"
  args = [*TINY, rates, "--config.ensemble_size=0", "--config.num_samples=2"]
  result = _run("reproduce", *args, "--config.n_bins=(5,)", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "results.csv") as file:
    rows = list(csv.DictReader(file))
  assert {float(r["dropout_rate"]) for r in rows if r["method"] == "mc_dropout"} == {
    0.1234567, 0.1000001, 0.1
  }  # fmt: skip
  names = {p.name for p in (tmp_path / "predictions" / POINT).iterdir()}
  assert {"dropout_0.1234567.npz", "dropout_0.1000001.npz", "dropout_0.1.npz"} <= names
  tidy = json.loads((tmp_path / "results.json").read_text())["results"]
  labels = {r["label"] for r in tidy if r["method"] == "mc_dropout"}
  assert labels == {"dropout 0.1234567", "dropout 0.1000001", "dropout 0.1"}  # told apart
  pmax = [r for r in rows if (r["method"], r["score"], r["topk"]) == ("mc_dropout", "pmax", "1")]
  assert len({r["brier"] for r in pmax}) == 3  # three samplings, not one reported thrice


@needs_fmnist
@pytest.mark.slow
def test_more_epochs_continue_a_finished_training_and_other_settings_are_named(tmp_path):
  args = [*TINY, "--config.ensemble_size=0"]
  assert _run("train", *args, f"--workdir={tmp_path}").returncode == 0
  longer = _run("train", *args, "--config.num_epochs=2", f"--workdir={tmp_path}")
  assert longer.returncode == 0, longer.stderr[-2000:]
  assert "resuming after epoch 1" in longer.stderr
  done = json.loads((tmp_path / "train" / POINT / "base.json").read_text())
  assert done["config"]["epochs"] == 2
  other = _run("train", *args, "--config.batch_size=64", f"--workdir={tmp_path}")
  _one_line_error(other, "trained with other settings (differing: batch_size, epochs)")
