"""The shift job end to end (top1-shift after the main job, the user's files through
top1-evaluate) and, in this process, the sweep's shifted sets, images and grouping.

The end-to-end tests share one work dir (``shift_job``): a tiny main job, then the shift
job with the same training fields and splits on all of its test examples, so its clean
rows are the main job's, computed by another code path.
"""

import csv
import dataclasses
import pathlib
import re
import shutil
import types

import jax
import numpy as np
import processes
import pytest
from absl import flags
from ml_collections import config_flags

from top1_jax.core.validation import SettingError
from top1_jax.engine import corruptions
from top1_jax.io import idx, ood_sets, results, splits
from top1_jax.io import predictions as predictions_lib
from top1_jax.launch import runner
from top1_jax.pipeline import dataset_shift as shift_sweep
from top1_jax.pipeline import settings as settings_lib

HAVE_FMNIST = (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists()
needs_fmnist = pytest.mark.skipif(
  not HAVE_FMNIST, reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)"
)
_run = processes.launcher
POINT = "mlp_tdr0.1_seed0"
NO_FIGURES = "--config.figures=False"
# What both jobs share: the networks (training fields), the predictions (MC dropout's rate
# and samples) and the splits and bins (n_folds, scheme, seed, n_bins) of their tables.
TRAINING = [
  "--config.models=(mlp,)", "--config.num_epochs=1", "--config.ensemble_size=2",
  "--config.limit_train=2000", "--config.limit_test=200", "--config.dropout_rates=(0.2,)",
  "--config.num_samples=4", "--config.topk=(1,)", "--config.n_bins=(5,)", "--config.n_folds=4",
]  # fmt: skip
# Every set of the shift job: all 200 test examples (limit_test), so that its clean set is
# the main job's test split.
SHIFT = [
  "--config=shift", *TRAINING, "--config.shift_examples=200", "--config.shift_rotations=(90,)",
  "--config.shift_translations=(3,)", "--config.shift_corruptions=(contrast,impulse_noise)",
  "--config.shift_severities=(1,5)", "--config.shift_ood=(digits,uniform_noise)",
  "--config.shift_num_labels=(0,20,100)",  # 100: the whole calibration half
]  # fmt: skip
SETS = [("clean", "0"), ("rotate_cubic", "90"), ("roll", "3"), ("contrast", "1"),
        ("contrast", "5"), ("impulse_noise", "1"), ("impulse_noise", "5")]  # fmt: skip
OOD_SETS = ["ood_digits", "ood_uniform_noise"]
SLUGS = ["clean", "rotate_cubic_90", "roll_3", "contrast_1", "contrast_5", "impulse_noise_1",
         "impulse_noise_5", *OOD_SETS]  # fmt: skip
METHODS = {"deterministic": "deterministic", "mc_dropout": "dropout_0.2", "ensemble": "ensemble"}
ON_SCORES = ("bins", "isotonic", "kde")  # the shift config's estimators fitted on a score
METRICS = ("accuracy", "brier", "nll", "ece", "eor", "auroc")
PREDICTED = re.compile(rf"shift: {POINT}/\S+/\S+ \(")  # a predictions file written


def _csv(path) -> list[dict]:
  with open(path) as file:
    return list(csv.DictReader(file))


def _mtimes(folder: pathlib.Path) -> dict:
  return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def shift_job(tmp_path_factory):
  """The main job (bins and isotonic, no figures), then the shift job in its work dir."""
  if not HAVE_FMNIST:
    pytest.skip("Fashion-MNIST not installed")
  workdir = tmp_path_factory.mktemp("shift_job")
  main = _run(
    "reproduce", "--config=quick", *TRAINING, "--config.estimators=(bins,isotonic)", NO_FIGURES,
    f"--workdir={workdir}",
  )  # fmt: skip
  assert main.returncode == 0, main.stderr[-3000:]
  trained = _mtimes(workdir / "train")
  result = _run("shift", *SHIFT, f"--workdir={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  return types.SimpleNamespace(workdir=workdir, log=result.stderr, trained=trained)


@needs_fmnist
@pytest.mark.slow
def test_shift_job_reuses_the_networks_and_writes_every_table(shift_job):
  workdir, out = shift_job.workdir, shift_job.workdir / "shift"
  for stage in ("base", "ensemble"):
    assert f"train/{POINT}/{stage}: done already, skipping" in shift_job.log
  assert "test accuracy" not in shift_job.log  # nothing trained
  assert _mtimes(workdir / "train") == shift_job.trained
  labels = None
  for slug, (shift, severity) in zip(SLUGS, [*SETS, *((n, "0") for n in OOD_SETS)], strict=True):
    for method, stem in METHODS.items():
      saved = predictions_lib.load_predictions(out / "predictions" / POINT / slug / f"{stem}.npz")
      assert (saved.meta["method"], saved.meta["shift"]) == (method, shift)
      assert f"{saved.meta['severity']:g}" == severity
      assert saved.meta.get("ood", False) == slug.startswith("ood_")
      assert len(saved.labels) == 200  # shift_examples; OOD sets as many
      if not slug.startswith("ood_"):  # the same examples at every shift
        labels = saved.labels if labels is None else labels
        np.testing.assert_array_equal(saved.labels, labels)

  every_row = _csv(out / "results.csv")
  rows = [r for r in every_row if not r["alpha"]]  # the calibration rows
  set_rows = [r for r in every_row if r["alpha"]]  # the prediction sets', per alpha
  assert {"shift", "severity"} <= set(rows[0])
  set_keys = [(r["method"], r["estimator"], r["alpha"], r["shift"], r["severity"])
              for r in set_rows]  # fmt: skip
  # Calibrated on the clean calibration parts, scored at every shifted set (OOD has no labels).
  assert sorted(set_keys) == sorted(
    (m, s, a, *shifted) for m in METHODS for s in ("lac", "aps", "raps", "topk")
    for a in ("0.1", "0.05") for shifted in SETS
  )  # fmt: skip
  coverage = {k: float(r["coverage"]) for k, r in zip(set_keys, set_rows, strict=True)}
  for method in METHODS:  # the guarantee holds clean (within a 100-example test part's noise)
    assert coverage[method, "aps", "0.1", "clean", "0"] > 0.8, method
    assert coverage[method, "aps", "0.1", "rotate_cubic", "90"] < 0.8, method  # and breaks
  keys = [(r["method"], r["score"], r["estimator"], r["n_bins"], r["shift"], r["severity"])
          for r in rows]  # fmt: skip
  assert len(keys) == len(set(keys))  # one row per (method, score, estimator, n_bins, set)
  assert {r["method"] for r in rows} == set(METHODS) and {r["n_bins"] for r in rows} == {"5"}
  main_scores = {
    (r["method"], r["score"]) for r in _csv(workdir / "results.csv") if not r["alpha"]
  }  # the calibration rows (not the prediction sets')
  for method in METHODS:
    variants = {k[1:4] for k in keys if k[0] == method}
    # Every variant at every set: the main job's scores (but the oracle, which reads the
    # labels) with each estimator on scores, and the log-probabilities' methods.
    assert {k for k in keys if k[0] == method} == {(method, *v, *s) for v in variants for s in SETS}
    scores = {s for m, s in main_scores if m == method} - {"oracle_loss"}
    expected = {(s, e, "5") for s in scores for e in ON_SCORES}
    expected |= {("neg_log_pmax", e, "5") for e in ("raw", "temperature", "toplabel")}
    assert variants == expected, method
  vanilla = {(r["shift"], r["severity"]): r for r in rows
             if (r["method"], r["estimator"]) == ("deterministic", "raw")}  # fmt: skip
  # A real model: rotating Fashion-MNIST by 90 degrees costs an MLP most of its accuracy.
  rotated = float(vanilla["rotate_cubic", "90"]["accuracy"])
  assert rotated < float(vanilla["clean", "0"]["accuracy"]) - 0.3

  ood = _csv(out / "ood.csv")
  assert {r["shift"] for r in ood} == set(OOD_SETS)
  for name in OOD_SETS:
    assert {(r["method"], r["score"], r["estimator"]) for r in ood if r["shift"] == name} == {
      (k[0], k[1], k[2]) for k in keys if k[4:] == ("clean", "0")
    }
  for r in ood:
    assert 0 <= float(r["ood_auroc"]) <= 1 and 0 <= float(r["p_correct_mean"]) <= 1

  figures = {p.name for p in (out / "figures").glob("*.png") if p.stat().st_size > 1000}
  assert figures == {f"shift_{n}.png" for n in ("rotate_cubic", "roll", "corruptions", "ood")} | {
    "recalibration_deterministic.png",  # the single network's (shift_recalibrate_samples)
    *(f"accuracy_estimates_{n}.png" for n in ("deterministic", "dropout_0.2", "ensemble_2")),
  }
  page = (out / "index.html").read_text()
  assert all(f'src="figures/{name}"' in page for name in figures)
  md = (out / "results.md").read_text()
  for variant in ("Vanilla", "Temp scaling", "Dropout 0.2", "Ensemble", "Top-label bins",
                  "Bins: pmax", "Isotonic: pmax", "Bins: dropout 0.2 cov. 2-norm",
                  "Bins: ensemble cov. 2-norm"):  # fmt: skip
    assert f"\n| {variant} |" in md, variant
  geometric = [results.GEOMETRIC_SHIFTS[shift] for shift in ("rotate_cubic", "roll")]
  for section in (*geometric, "corruptions", "out-of-distrib"):
    assert f"### {section}" in md
  for section in ("deterministic: recalibrated on m labelled shifted examples, ECE % (",
                  "ensemble (2): accuracy predicted without labels"):  # fmt: skip
    assert f"### {section}" in md, section


RECALIBRATIONS = ("temperature", "bins_refit", "bins_from_clean", "isotonic")


@needs_fmnist
@pytest.mark.slow
def test_recalibration_rows_start_from_todays_and_labels_lower_the_ece(shift_job):
  rows = _csv(shift_job.workdir / "shift" / "recalibration.csv")
  keys = [(r["recalibration"], r["shift"], r["severity"], r["num_labels"]) for r in rows]
  assert len(keys) == len(set(keys))
  assert set(keys) == {(n, *s, m) for n in RECALIBRATIONS for s in SETS for m in ("0", "20", "100")}
  assert {(r["method"], r["score"], r["n_bins"]) for r in rows} == {
    ("deterministic", "neg_log_pmax", "5")
  }
  # m = 0 is the clean fit: results.csv's row, cell for cell.
  today = {
    (r["estimator"], r["shift"], r["severity"]): r
    for r in _csv(shift_job.workdir / "shift" / "results.csv")
    if (r["method"], r["score"]) == ("deterministic", "neg_log_pmax")
  }
  for row in rows:
    if row["num_labels"] == "0":
      estimator = {"bins_refit": "bins", "bins_from_clean": "bins"}.get(row["recalibration"])
      expected = today[estimator or row["recalibration"], row["shift"], row["severity"]]
      set_columns = {k for k in expected if k not in row} - {"estimator"}  # the sets' (alpha, ...)
      assert not any(expected[k] for k in set_columns), set_columns
      assert {k: row[k] for k in expected if k not in {"estimator", *set_columns}} == {
        k: v for k, v in expected.items() if k not in {"estimator", *set_columns}
      }
  # The worst shift (rotated 90 degrees): a hundred labels bring every method's ECE down.
  ece = {(r["recalibration"], r["shift"], r["num_labels"]): float(r["ece"]) for r in rows}
  for name in RECALIBRATIONS:
    assert ece[name, "rotate_cubic", "100"] < ece[name, "rotate_cubic", "0"] - 0.1, name


@needs_fmnist
@pytest.mark.slow
def test_accuracy_estimates_of_every_set_beside_the_truth(shift_job):
  rows = _csv(shift_job.workdir / "shift" / "accuracy_estimates.csv")
  results_rows = _csv(shift_job.workdir / "shift" / "results.csv")
  for method in METHODS:
    mine = [r for r in rows if r["method"] == method]
    sets = {(r["shift"], r["severity"]) for r in mine}
    assert sets == {*SETS, *((n, "0") for n in OOD_SETS)}
    estimators = {(r["estimator"], r["score"]) for r in mine}
    scores = ["neg_log_pmax", "entropy"] + (
      ["covariance_norm_probs"] if method != "deterministic" else []
    )
    assert estimators == {("average_confidence", "pmax"), ("doc", "pmax")} | {
      (e, s) for e in ("calibrated", "atc") for s in scores
    }
    for row in mine:
      assert 0 <= float(row["predicted_accuracy"]) <= 1
      if row["shift"].startswith("ood_"):
        assert float(row["accuracy"]) == 0  # no label fits an input from outside the set
      else:  # the true accuracy: results.csv's, over the same test parts
        truth = next(
          r for r in results_rows
          if (r["method"], r["estimator"], r["shift"], r["severity"])
          == (method, "raw", row["shift"], row["severity"])
        )  # fmt: skip
        np.testing.assert_allclose(float(row["accuracy"]), float(truth["accuracy"]), rtol=1e-6)
    doc = next(r for r in mine if (r["estimator"], r["shift"]) == ("doc", "clean"))
    # Halves: each example tested as often, so zero up to the float32 confidences' rounding.
    assert abs(float(doc["error"])) < 1e-7


@needs_fmnist
@pytest.mark.slow
def test_too_many_labels_for_a_calibration_part_is_one_line_before_any_work(shift_job, tmp_path):
  workdir = tmp_path / "labels"
  shutil.copytree(shift_job.workdir / "train", workdir / "train")
  args = [a for a in SHIFT if not a.startswith("--config.shift_num_labels")]
  result = _run("shift", *args, "--config.shift_num_labels=(0,150)", f"--workdir={workdir}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  last = [line for line in result.stderr.splitlines() if line.strip()][-1]
  assert last == (
    "error: --config.shift_num_labels: 150 labelled examples exceed the smallest calibration "
    "part (100 of the 200 shift_examples); choose at most 100"
  ), last
  assert not (workdir / "shift" / "predictions").exists()


@needs_fmnist
@pytest.mark.slow
def test_unshifted_rows_equal_the_main_jobs(shift_job):
  """The issue's check: calibrated and tested on the clean set, the shift protocol gives
  the main job's cross-validated numbers, for the network, MC dropout and the ensemble."""
  main = _csv(shift_job.workdir / "results.csv")
  key = lambda r: (r["method"], r["dropout_rate"], r["score"], r["topk"], r["estimator"],  # noqa: E731
                   r["n_bins"])  # fmt: skip
  clean = {key(r): r for r in _csv(shift_job.workdir / "shift" / "results.csv")
           if (r["shift"], r["severity"]) == ("clean", "0")}  # fmt: skip
  compared = set()
  for row in main:
    if row["score"] in ("oracle_loss", "prediction_set"):  # the labels; sets: not here
      continue
    assert key(row) in clean, key(row)
    for metric in METRICS:
      # The bins go another way there (the sweep's fast path): float32 rounding.
      np.testing.assert_allclose(
        float(clean[key(row)][metric]),
        float(row[metric]),
        rtol=1e-5,
        err_msg=f"{key(row)} {metric}",
      )
    compared.add((row["method"], row["estimator"]))
  assert compared == {(m, e) for m in METHODS for e in ("bins", "isotonic")}


@needs_fmnist
@pytest.mark.slow
def test_a_second_shift_run_predicts_nothing_and_writes_the_same_tables(shift_job, tmp_path):
  workdir = tmp_path / "again"
  shutil.copytree(shift_job.workdir, workdir)  # mtimes kept
  predicted = _mtimes(workdir / "shift" / "predictions")
  again = _run("shift", *SHIFT, NO_FIGURES, f"--workdir={workdir}")
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"train/{POINT}/ensemble: done already, skipping" in again.stderr
  assert not PREDICTED.search(again.stderr) and PREDICTED.search(shift_job.log)
  assert _mtimes(workdir / "shift" / "predictions") == predicted
  for name in ("results.csv", "ood.csv"):
    assert (workdir / "shift" / name).read_bytes() == (
      shift_job.workdir / "shift" / name
    ).read_bytes()


EVALUATE = ["--config=evaluate_files", "--config.topk=(1,)", "--config.n_bins=(5,)"]
EVALUATE += ["--config.n_folds=4", "--config.shift_num_labels=(0,20,100)", NO_FIGURES]


def _copy(shift_job, slug: str, method: str, to: pathlib.Path) -> pathlib.Path:
  to.parent.mkdir(parents=True, exist_ok=True)
  source = shift_job.workdir / "shift" / "predictions" / POINT / slug / f"{METHODS[method]}.npz"
  return pathlib.Path(shutil.copy(source, to))


@needs_fmnist
@pytest.mark.slow
def test_a_users_shifted_files_give_the_shift_jobs_rows(shift_job, tmp_path):
  clean = _copy(shift_job, "clean", "deterministic", tmp_path / "mine" / "clean.npz")
  for slug in ("rotate_cubic_90", "contrast_5", "ood_digits"):
    _copy(shift_job, slug, "deterministic", tmp_path / "mine" / "shifted" / f"{slug}.npz")
  out = tmp_path / "out"
  result = _run(
    "evaluate", *EVALUATE, f"--config.inputs={clean}",
    f"--config.shift_inputs={tmp_path / 'mine' / 'shifted' / '*.npz'}", f"--workdir={out}",
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  assert (out / "results.csv").exists() and (out / "shift" / "index.html").exists()
  rows = _csv(out / "shift" / "results.csv")
  sets = {("clean", "0"), ("rotate_cubic", "90"), ("contrast", "5")}
  assert {(r["shift"], r["severity"]) for r in rows} == sets
  assert {r["method"] for r in rows} == {"deterministic"}
  assert {r["source"] for r in rows} == {
    "clean", "shifted/rotate_cubic_90", "shifted/contrast_5"
  }  # fmt: skip
  key = lambda r: (r["method"], r["score"], r["estimator"], r["n_bins"], r["alpha"], r["shift"],
                   r["severity"])  # noqa: E731  # fmt: skip
  job = {key(r): r for r in _csv(shift_job.workdir / "shift" / "results.csv")}
  # The same files, splits and bins as the shift job's: its rows of these sets.
  assert sorted(map(key, rows)) == sorted(
    k for k in job if k[0] == "deterministic" and k[5:] in sets
  )
  for row in rows:  # the calibration rows' metrics, and the prediction sets'
    for metric in METRICS if not row["alpha"] else ("coverage", "mean_size"):
      np.testing.assert_allclose(float(row[metric]), float(job[key(row)][metric]), rtol=1e-6)
  ood = _csv(out / "shift" / "ood.csv")
  assert {r["shift"] for r in ood} == {"ood_digits"} and {r["source"] for r in ood} == {
    "shifted/ood_digits"
  }
  # After m labels and without labels: the shift job's rows of these sets and this model.
  for name, columns in (
    ("recalibration", ("recalibration", "score", "num_labels")),
    ("accuracy_estimates", ("estimator", "score")),
  ):
    mine = _csv(out / "shift" / f"{name}.csv")
    theirs = {
      (r["shift"], r["severity"], *(r[c] for c in columns)): r
      for r in _csv(shift_job.workdir / "shift" / f"{name}.csv")
      if r["method"] == "deterministic"
    }
    assert {(r["shift"], r["severity"]) for r in mine} == sets | (
      {("ood_digits", "0")} if name == "accuracy_estimates" else set()
    )
    for row in mine:
      expected = theirs[(row["shift"], row["severity"], *(row[c] for c in columns))]
      for metric in ("ece", "brier") if name == "recalibration" else ("predicted_accuracy",):
        np.testing.assert_allclose(float(row[metric]), float(expected[metric]), rtol=1e-6)
  job_ood = {(r["score"], r["estimator"]): r for r in _csv(shift_job.workdir / "shift" / "ood.csv")
             if (r["method"], r["shift"]) == ("deterministic", "ood_digits")}  # fmt: skip
  assert len(ood) == len(job_ood)
  for row in ood:
    for metric in ("ood_auroc", "p_correct_mean"):
      np.testing.assert_allclose(
        float(row[metric]), float(job_ood[row["score"], row["estimator"]][metric]), rtol=1e-6
      )


def _mislabelled(shift_job, folder: pathlib.Path) -> str:
  path = _copy(shift_job, "rotate_cubic_90", "deterministic", folder / "rolled.npz")
  saved = predictions_lib.load_predictions(path)
  predictions_lib.save_predictions(
    path, dataclasses.replace(saved, labels=np.roll(saved.labels, 1))
  )
  return str(path)


@needs_fmnist
@pytest.mark.slow
@pytest.mark.parametrize(
  "case, message",
  [
    ("no_inputs", "required: the files to evaluate"),  # evaluate_files: inputs first
    ("other_labels", "shifted/rolled has other labels than the clean clean"),
    ("no_clean_file", "shifted/dropout_0.2 has no clean file of the same model and method"),
    ("no_match", "no such file: "),
  ],
)
def test_a_users_bad_shifted_files_are_one_line(shift_job, tmp_path, case, message):
  clean = _copy(shift_job, "clean", "deterministic", tmp_path / "clean.npz")
  args = [f"--config.inputs={clean}"]
  if case == "no_inputs":
    args = []
    shifted = str(_copy(shift_job, "rotate_cubic_90", "deterministic", tmp_path / "r90.npz"))
  elif case == "other_labels":
    shifted = _mislabelled(shift_job, tmp_path / "shifted")
  elif case == "no_clean_file":
    shifted = str(_copy(shift_job, "rotate_cubic_90", "mc_dropout", tmp_path / "dropout_0.2.npz"))
  else:
    shifted = str(tmp_path / "nothing" / "*.npz")
  out = tmp_path / "out"
  args += ["--config.scores=(pmax,)", f"--config.shift_inputs={shifted}", f"--workdir={out}"]
  result = _run("evaluate", *EVALUATE, *args)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  field = "inputs" if case == "no_inputs" else "shift_inputs"
  assert lines[-1].startswith(f"error: --config.{field}: "), lines[-1]
  assert (
    message in lines[-1] and [line for line in lines if line.startswith("error:")] == lines[-1:]
  )
  if case in ("no_inputs", "no_match"):  # refused before any work
    assert not (out / "results.csv").exists()


# In this process: the sets of a config, their images, and the grouping of files.


def _settings(*overrides: str) -> settings_lib.Settings:
  """The shift config with command-line overrides, parsed as the launcher parses them."""
  argv = ["test", f"--config={pathlib.Path(runner.PACKAGED_CONFIGS) / 'shift'}.py", *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return settings_lib.parse(flag_values.config)


def test_shift_sets_in_order_from_the_command_lines_tuples():
  sets = shift_sweep.shift_sets(
    _settings(
      "--config.shift_rotations=(90,22.5)", "--config.shift_translations=(3,)",
      "--config.shift_corruptions=(contrast,impulse_noise)", "--config.shift_severities=(1,5)",
      "--config.shift_ood=(digits,)",
    )
  )  # fmt: skip
  assert [s.slug for s in sets] == [
    "clean", "rotate_cubic_90", "rotate_cubic_22.5", "roll_3", "contrast_1", "contrast_5",
    "impulse_noise_1", "impulse_noise_5", "ood_digits",
  ]  # fmt: skip
  assert [(s.shift, s.severity) for s in sets][:4] == [
    ("clean", 0), ("rotate_cubic", 90), ("rotate_cubic", 22.5), ("roll", 3)
  ]  # fmt: skip
  assert [type(s.severity) for s in sets] == [int, int, float, *[int] * 6]
  assert [s.ood for s in sets] == [False] * 8 + [True]


def test_shift_sets_defaults_all_corruptions_and_no_repeats():
  sets = shift_sweep.shift_sets(_settings())
  slugs = [s.slug for s in sets]
  # Ovadia et al.'s rotations and translations (SciPy's cubic rotation, np.roll) by default.
  assert slugs[:13] == ["clean", *(f"rotate_cubic_{d}" for d in range(15, 181, 15))]  # no 0
  assert slugs[13:26] == [f"roll_{p}" for p in range(2, 27, 2)]
  named = [(s.shift, s.severity) for s in sets if s.shift in corruptions.names()]
  assert named == [(n, v) for n in corruptions.names() for v in range(1, 6)]
  assert slugs[-2:] == ["ood_digits", "ood_uniform_noise"]
  # A value given twice (90 and 90.0 are one angle) is one set: one file, one row each.
  sets = shift_sweep.shift_sets(
    _settings(
      "--config.shift_rotations=(90,90.0)", "--config.shift_translations=(3,3)",
      "--config.shift_corruptions=(contrast,contrast)", "--config.shift_severities=(1,1)",
      "--config.shift_ood=(digits,digits)",
    )
  )  # fmt: skip
  assert [s.slug for s in sets] == [
    "clean",
    "rotate_cubic_90",
    "roll_3",
    "contrast_1",
    "ood_digits",
  ]
  ours = shift_sweep.shift_sets(
    _settings("--config.shift_rotation=rotate", "--config.shift_translation=translate")
  )
  slugs = [s.slug for s in ours]
  assert {"rotate_15", "translate_2"} <= set(slugs) and not any("cubic" in s for s in slugs)


def test_shift_set_slug_and_meta():
  clean, ood = shift_sweep.ShiftSet("clean"), shift_sweep.ShiftSet("ood_uniform_noise")
  assert (clean.slug, clean.meta(), clean.ood) == (
    "clean",
    {"shift": "clean", "severity": 0},
    False,
  )
  assert ood.slug == "ood_uniform_noise"
  assert ood.meta() == {"shift": "ood_uniform_noise", "severity": 0, "ood": True}
  rotate = shift_sweep.ShiftSet("rotate", 22.5)
  assert rotate.slug == "rotate_22.5" and rotate.meta() == {"shift": "rotate", "severity": 22.5}
  assert shift_sweep.ShiftSet("gaussian_blur", 3).slug == "gaussian_blur_3"


def _split(num: int, ids: bool) -> splits.DatasetSplit:
  rng = np.random.default_rng(0)
  images = rng.uniform(size=(num, 8, 6, 1)).astype(np.float32)
  labels = rng.integers(0, 3, num).astype(np.int32)
  names = np.array([f"test_{i}" for i in range(num)]) if ids else None
  return splits.DatasetSplit(images, labels, 3, "toy", "test", "memory", ("a", "b", "c"), names)


@pytest.mark.parametrize("ids", [True, False])
def test_first_examples(ids):
  split = _split(10, ids)
  assert shift_sweep.first_examples(split, None) is split
  assert (
    shift_sweep.first_examples(split, 10) is split
    and shift_sweep.first_examples(split, 11) is split
  )
  first = shift_sweep.first_examples(split, 4)
  np.testing.assert_array_equal(first.images, split.images[:4])
  np.testing.assert_array_equal(first.labels, split.labels[:4])
  assert (first.num_classes, first.class_names, first.source) == (3, ("a", "b", "c"), "memory")
  if ids:
    np.testing.assert_array_equal(first.ids, split.ids[:4])
  else:
    assert first.ids is None


def test_make_images_of_each_kind_of_set():
  images = _split(5, False).images
  make = shift_sweep.make_images
  assert make(shift_sweep.ShiftSet("clean"), images, 0) is images
  np.testing.assert_array_equal(
    make(shift_sweep.ShiftSet("rotate", 180), images, 0), images[:, ::-1, ::-1]
  )
  moved = make(shift_sweep.ShiftSet("translate", 2), images, 0)
  np.testing.assert_array_equal(moved[:, :, 2:], images[:, :, :-2])
  assert not moved[:, :, :2].any()
  # A corruption draws from fold_in(key(seed), its index): the same images for the same seed.
  noisy = make(shift_sweep.ShiftSet("impulse_noise", 3), images, 7)
  key = jax.random.fold_in(jax.random.key(7), corruptions.names().index("impulse_noise"))
  np.testing.assert_array_equal(noisy, corruptions.corrupt("impulse_noise", images, key, 3))
  assert noisy.shape == images.shape and noisy.dtype == np.float32
  assert not np.array_equal(noisy, images)
  assert not np.array_equal(make(shift_sweep.ShiftSet("impulse_noise", 3), images, 8), noisy)
  for name in ood_sets.names():
    ood = make(shift_sweep.ShiftSet(f"ood_{name}"), images, 3)
    assert ood.shape == images.shape and ood.dtype == np.float32
    assert 0 <= ood.min() and ood.max() <= 1 and ood.std() > 0
    np.testing.assert_array_equal(ood, ood_sets.load(name, images.shape[1:], 5, 3))


def test_make_images_of_more_than_the_digits():
  images = np.zeros((ood_sets.OOD_SETS["digits"].max_num + 3, 4, 4, 1), np.float32)
  assert len(shift_sweep.make_images(shift_sweep.ShiftSet("ood_digits"), images, 0)) == (
    ood_sets.OOD_SETS["digits"].max_num
  )


def test_rotation_by_0_is_no_set():
  with pytest.raises(SettingError, match=r"^shift_rotations: expected degrees in \(0, 360\]"):
    _settings("--config.shift_rotations=(0,90)")


def _source(name, method="deterministic", shift="clean", severity=0, labels=(0, 1, 2), ood=False):
  columns = {"dataset": "toy", "model": "mlp", "method": method, "dropout_rate": 0.0, "seed": 0}
  columns.update(source=name, shift=shift, severity=severity)
  meta = {"shift": shift, "severity": severity, **({"ood": True} if ood else {})}
  return types.SimpleNamespace(name=name, columns=columns, meta=meta, labels=np.asarray(labels))


def test_group_sources_by_model_and_method():
  clean, ensemble = _source("clean"), _source("ens", "ensemble")
  rotated = _source("rot", shift="rotate", severity=90)
  ood = _source("ood", shift="ood_digits", labels=(0, 0), ood=True)  # placeholder labels
  groups = shift_sweep.group_sources([rotated, clean, ood, ensemble])
  assert [g.clean.name for g in groups] == ["clean", "ens"]
  assert [s.name for s in groups[0].shifted] == ["rot"] and [s.name for s in groups[0].ood] == [
    "ood"
  ]
  assert groups[1].shifted == [] and groups[1].ood == []


@pytest.mark.parametrize(
  "sources, message",
  [
    ([_source("a"), _source("b")], "inputs: b and a are both clean files of one model and method"),
    (
      [_source("clean"), _source("rot", "ensemble", "rotate", 90)],
      "shift_inputs: rot has no clean file of the same model and method (dataset=toy, "
      "model=mlp, method=ensemble,",
    ),
    (
      [_source("clean"), _source("ood", "ensemble", "ood_digits", ood=True)],
      "shift_inputs: ood has no clean file",
    ),
    (
      [_source("clean"), _source("rot", shift="rotate", severity=90, labels=(0, 2, 1))],
      "shift_inputs: rot has other labels than the clean clean",
    ),
    (
      [_source("clean"), _source("rot", shift="rotate", severity=90, labels=(0, 1))],
      "shift_inputs: rot has other labels than the clean clean",
    ),
  ],
)
def test_group_sources_refusals_are_one_line(sources, message):
  with pytest.raises(SettingError) as info:
    shift_sweep.group_sources(sources)
  assert str(info.value).startswith(message) and "\n" not in str(info.value), info.value


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["--config.shift_examples=0"], "shift_examples: expected an integer >= 1, got 0"),
    (["--config.shift_rotations=(400,)"], "shift_rotations: expected degrees in (0, 360]"),
    (["--config.shift_translations=(0,)"], "shift_translations: expected values >= 1"),
    (["--config.shift_translations=(1.5,)"], "shift_translations: expected integers, got (1.5,)"),
    (["--config.shift_corruptions=(fog,)"], "shift_corruptions: expected names among "),
    (["--config.shift_ood=(all,)"], "shift_ood: expected names among digits, uniform_noise"),
    (["--config.shift_estimators=()"], "shift_estimators: expected at least one value, got ()"),
    (["--config.shift_estimators=(raw,platt)"], "shift_estimators: expected names among bins, "),
    (
      ["--config.shift_severities=(1,6)"],
      "shift_severities: expected values in [1, 5], got (1, 6)",
    ),
    (["--config.shift_severities=(0,)"], "shift_severities: expected values in [1, 5]"),
    (["--config.shift_rotations=(90"], "shift_rotations: malformed value '(90'"),
    (["--config.shift_inputs=x.npz"], "shift_inputs: goes with inputs"),
    (["--config.shift_num_labels=(0,5)"], "shift_num_labels: expected 0 or at least 10 labelled"),
    (["--config.shift_label_draws=0"], "shift_label_draws: expected an integer >= 1, got 0"),
    (["--config.shift_prior_strength=0"], "shift_prior_strength: expected a number > 0, got 0"),
    (
      ["--config.shift_accuracy_scores=(pmax,nope)"],
      "shift_accuracy_scores: unknown score(s) nope",
    ),
    (
      [
        "--config.shift_inputs=x.npz",
        "--config.inputs=a.npy",
        "--config.input_kind=logits",
        "--config.labels=y.npy",
      ],
      "shift_inputs: goes with inputs",
    ),  # fmt: skip
  ],
)
def test_plan_check_refuses_bad_shift_fields_in_one_line(overrides, message):
  with pytest.raises(SettingError) as info:
    _settings(*overrides)
  assert str(info.value).startswith(message) and "\n" not in str(info.value), info.value
