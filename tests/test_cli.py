"""Console scripts and plain-array input, as a user runs them: installed, from another folder."""

import csv
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import processes
import pytest

from top1_jax import load_example

BIN = pathlib.Path(sys.executable).parent
LAUNCHERS = (
  "reproduce",
  "train",
  "predict",
  "evaluate",
  "find-mislabeled",
  "demo",
  "aggregate",
  "shift",
)


def _run(args, cwd, check=True):
  out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
  if check and out.returncode != 0:
    raise AssertionError(out.stdout[-2000:] + out.stderr[-2000:])
  return out


@pytest.mark.slow
@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_console_script_is_installed_and_starts_anywhere(name, tmp_path):
  script = BIN / f"top1-{name}"
  assert script.exists(), f"{script} missing: pip install -e . installs the console scripts"
  out = _run([str(script), "--helpfull"], cwd=tmp_path, check=False)  # absl exits 1 after help
  assert "--workdir" in out.stdout + out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_top1_evaluate_on_npy_probabilities_from_another_folder(tmp_path):
  data = load_example("lenet-5-cifar-10")
  np.save(tmp_path / "lenet_probs.npy", data.probs)
  np.save(tmp_path / "labels.npy", data.labels)
  args = [
    str(BIN / "top1-evaluate"),
    "--workdir=out",
    "--config.inputs=lenet_probs.npy",
    "--config.input_kind=probs",
    "--config.labels=labels.npy",
    "--config.n_bins=(5,20)",
    "--config.n_folds=4",
    "--config.topk=1",
    "--config.figures=False",
    "--config.dataset=cifar10",  # the files' dataset, as the user names it
  ]
  _run(args, cwd=tmp_path)
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["config"]["dataset"] == "cifar10"
  assert results["config"]["inputs"] == ["lenet_probs.npy"]
  assert {row["dataset"] for row in results["results"]} == {"cifar10"}
  methods = [row["label"] for row in results["comparison"]]
  # A single model named "plain" still gets the temperature-scaling and top-label baselines.
  assert methods == [
    "lenet_probs",
    "lenet_probs + temperature scaling",
    "lenet_probs + top-label binning",
  ]
  binned = results["comparison"][0]
  assert binned["top1_binned_brier"] < binned["raw_top1_brier"]
  assert (tmp_path / "out" / "predictions" / "lenet_probs.npz").is_file()
  with open(tmp_path / "out" / "results.csv") as file:
    assert {row["dataset"] for row in csv.DictReader(file)} == {"cifar10"}


# The config's own refusals (labels without an array, selective_targets, ...) are checked
# in-process in test_settings.py; these need the arrays read.
@pytest.mark.parametrize(
  "flags, message",
  [
    (["--config.inputs=missing.npy", "--config.labels=labels.npy"], "probs: no such file"),
    (["--config.inputs=p.npy", "--config.labels=short.npy"], "probs: expected 3 rows (one per"),
    (["--config.inputs=bad.npy", "--config.labels=labels.npy"], "probs: each row must sum to 1"),
    (  # probabilities given as logits (the last input_kind is the one taken)
      ["--config.inputs=p.npy", "--config.labels=labels.npy", "--config.input_kind=logits"],
      "logits: these look like probabilities (every row in [0, 1], summing to 1); pass them as"
      " probs (--config.input_kind=probs)",
    ),
  ],
)
@pytest.mark.slow
def test_top1_evaluate_array_errors_are_one_line(flags, message, tmp_path):
  np.save(tmp_path / "p.npy", np.full((4, 3), 1 / 3, np.float32))
  np.save(tmp_path / "bad.npy", np.full((4, 3), 0.5, np.float32))
  np.save(tmp_path / "labels.npy", np.array([0, 1, 2, 0]))
  np.save(tmp_path / "short.npy", np.array([0, 1, 2]))
  args = [str(BIN / "top1-evaluate"), "--workdir=out", "--config.input_kind=probs", *flags]
  out = _run(args, cwd=tmp_path, check=False)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [out.stderr.strip()]
  assert message in out.stderr


_CORE_ONLY = r"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
  HEAVY = ("flax", "optax", "orbax", "matplotlib", "tensorflow", "tensorflow_datasets", "absl",
           "etils")

  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in self.HEAVY:
      raise ImportError(f"blocked: {name}")

sys.meta_path.insert(0, Block())
import numpy as np
import top1_jax as t1
from top1_jax import metrics

probs, labels = t1.load_example(sys.argv[1])[:2]  # the package's example data, from any folder
rng = np.random.default_rng(0)
order = rng.permutation(len(labels))
cal, test = order[:5000], order[5000:]
calibrator = t1.Calibrator(score="neg_log_pmax", n_bins=20, inputs="probs")
calibrator.fit(probs[cal], labels[cal])
calibrator.save(sys.argv[2])
loaded = t1.Calibrator.load(sys.argv[2])
p = loaded.predict_confidence(probs[test])
correct = probs[test].argmax(1) == labels[test]
print(float(metrics.brier(p, correct)), float(metrics.brier(probs[test].max(1), correct)))
print(sorted(m for m in Block.HEAVY if m in sys.modules))
"""


@pytest.mark.slow
def test_the_core_works_without_the_heavy_packages(tmp_path):
  script = tmp_path / "core_only.py"
  script.write_text(_CORE_ONLY)
  args = [sys.executable, str(script), "densenet-bc-100-cifar-100", "cal.json"]
  out = _run(args, cwd=tmp_path)
  brier_lines = out.stdout.strip().splitlines()
  binned, raw = map(float, brier_lines[0].split())
  assert binned < raw  # calibrated bins beat raw max-softmax on held-out real predictions
  assert brier_lines[1] == "[]"
  assert json.loads((tmp_path / "cal.json").read_text())["format"] == "top1_jax.Calibrator"


# The [cli] install: no Flax, optax, orbax, TFDS or TensorFlow. A module set to None in
# sys.modules cannot be imported (ModuleNotFoundError) and importlib.util.find_spec says it is
# not installed, as in an environment without it (a finder that raises would make etils'
# "is TensorFlow installed?" raise instead).
_WITHOUT_TRAINING = r"""
import runpy, sys
for name in ("flax", "optax", "orbax", "tensorflow", "tensorflow_datasets"):
  sys.modules[name] = None
sys.argv = sys.argv[1:]
if sys.argv[0].endswith(".py"):  # an experiment's main
  runpy.run_path(sys.argv[0], run_name="__main__")
else:  # a console script, top1-<name>
  from top1_jax.launch import cli
  getattr(cli, sys.argv[0].removeprefix("top1-").replace("-", "_"))()
"""


@pytest.mark.slow
def test_top1_evaluate_runs_on_arrays_without_the_training_stack(tmp_path):
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 5, 300)
  logits = rng.normal(size=(300, 5)).astype(np.float32)
  logits[np.arange(300), labels] += 2.0
  np.save(tmp_path / "logits.npy", logits)
  np.save(tmp_path / "labels.npy", labels)
  (tmp_path / "without.py").write_text(_WITHOUT_TRAINING)
  launch = [sys.executable, "without.py"]
  args = [processes.script("evaluate"), "--workdir=out", "--config=quick", "--config.topk=1"]
  args += ["--config.inputs=logits.npy", "--config.input_kind=logits", "--config.labels=labels.npy"]
  out = _run([*launch, *args, "--config.n_bins=(5,10)", "--config.limit_test=100"], cwd=tmp_path)
  with open(tmp_path / "out" / "results.csv") as file:
    rows = list(csv.DictReader(file))
  assert rows and {row["dataset"] for row in rows} == {""}  # quick's fashion_mnist is not theirs
  config = json.loads((tmp_path / "out" / "config.json").read_text())["config"]
  assert config["dataset"] is None and config["inputs"] == "logits.npy"
  results = json.loads((tmp_path / "out" / "results.json").read_text())["config"]
  assert results["dataset"] is None and results["inputs"] == ["logits.npy"]
  assert results["labels"] == "labels.npy"
  # Only the field the user set is warned about (quick's own limit_test made no warning).
  warnings = [line for line in out.stderr.splitlines() if line.startswith("W")]
  assert len(warnings) == 1 and "--config.limit_test: for train and predict" in warnings[0]
  assert "figures in" in out.stderr and (tmp_path / "out" / "figures").is_dir()  # matplotlib
  # A launcher that trains says which extra it needs, in one line.
  train = _run([*launch, "top1-train", "--workdir=run"], cwd=tmp_path, check=False)
  assert train.returncode == 2 and train.stdout == ""
  # The first blocked package it imports (flax, optax or orbax), named with its extra.
  assert re.fullmatch(
    r"error: top1-train needs the package '(flax|optax|orbax-checkpoint)' \(pip install "
    r"'top1_jax\[all\]'; from a clone: pip install '\.\[all\]'\)\n",
    train.stderr,
  ), train.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_help_lists_every_config_field_and_a_typo_is_one_line(tmp_path):
  from top1_jax.configs import default

  out = _run([str(BIN / "top1-evaluate"), "--help"], cwd=tmp_path)
  text = " ".join(out.stdout.split())  # the meanings are wrapped
  assert out.stderr == "" and text.startswith("The evaluate stage: every (file, score")
  for field, meaning in default.HELP.items():
    assert f"--config.{field}: {' '.join(meaning.split())}" in text
  assert "--config.seeds: Seeds, a sweep axis" in text and "(default: (0,))" in text
  assert "--workdir: Directory or URL" in text and "--verbosity:" not in text  # --helpfull lists it
  # Without --config=, ml_collections applies overrides as the flag is defined, on import.
  typo = _run([str(BIN / "top1-evaluate"), "--workdir=out", "--config.seed=1"], tmp_path, False)
  assert typo.returncode == 1 and typo.stderr == (
    "error: --config.seed: no such field; did you mean --config.seeds? (--help lists every field)\n"
  )


@pytest.mark.slow
def test_degenerate_top5_gives_strict_json_and_marked_cells(tmp_path):
  # Top-5 is right for all but one example: most test halves hold one class only.
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 80)
  logits = rng.normal(size=(80, 10)).astype(np.float32)
  logits[np.arange(80), labels] += 3.0
  logits[0, labels[0]] = -10.0
  np.save(tmp_path / "logits.npy", logits)
  np.save(tmp_path / "labels.npy", labels)
  args = [str(BIN / "top1-evaluate"), "--workdir=out", "--config.inputs=logits.npy"]
  args += ["--config.input_kind=logits", "--config.labels=labels.npy"]
  more = [
    "--config.topk=(1,5)",
    "--config.n_bins=(2,4)",
    "--config.n_folds=4",
    "--config.figures=False",
  ]
  _run([*args, *more], cwd=tmp_path)

  def refuse(token):
    raise AssertionError(f"non-strict JSON token {token}")

  out = tmp_path / "out"
  results = json.loads((out / "results.json").read_text(), parse_constant=refuse)
  top5 = [r for r in results["results"] if r["topk"] == 5]
  assert any(r["auroc"] is None or r["auroc_num_splits"] < 4 for r in top5)
  for path in (out / "sweep").glob("*.json"):
    json.loads(path.read_text(), parse_constant=refuse)
  table = (out / "results.md").read_text()
  assert "nan" not in table and "-0.0000" not in table
  assert "/4)" in table or "–" in table


_MY_CONFIG = """
from top1_jax.configs import default


def get_config():
  config = default.get_config()
  config.models = ("mlp",)
  config.seeds = (7,)
  return config
"""


@pytest.mark.parametrize(
  "config, files",
  [
    ("quick", "mlp_tdr0.1_seed0/deterministic, mlp_tdr0.1_seed0/dropout_0.01"),
    ("mine/my.py", "mlp_tdr0.1_seed7/deterministic"),
  ],
)
def test_a_packaged_config_by_name_and_a_users_by_path_from_another_folder(config, files, tmp_path):
  # evaluate names the predictions files the config asks for: which config was loaded.
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "my.py").write_text(_MY_CONFIG)
  args = [str(BIN / "top1-evaluate"), "--workdir=out", f"--config={config}"]
  out = _run(args, cwd=tmp_path, check=False)
  lines = out.stderr.strip().splitlines()  # quick's limit_test adds a warning before
  assert out.returncode == 1 and [line for line in lines if "error" in line] == lines[-1:]
  assert lines[-1].startswith(f"error: predictions files not there: {files}"), out.stderr


def test_top1_demo_runs_and_writes_its_table(tmp_path):
  args = [str(BIN / "top1-demo"), "--num_examples=400", "--n_bins=5,10", "--n_folds=2"]
  out = _run([*args, "--seed=3", "--workdir=out"], cwd=tmp_path)
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["config"]["seed"] == 3 and results["config"]["n_bins"] == [5, 10]
  assert {row["n_bins"] for row in results["results"]} == {5, 10} and "| pmax | 5 |" in out.stdout
  bad = _run([*args[:2], "--n_bins=5,x"], cwd=tmp_path, check=False)
  assert (
    bad.returncode == 1
    and bad.stderr.strip() == "error: --n_bins: expected integers >= 1, got ['5', 'x']"
  )


@pytest.mark.slow
@pytest.mark.parametrize("where", ["a_file", "a_file/below"])
def test_a_work_dir_that_cannot_be_one_is_one_line(where, tmp_path):
  (tmp_path / "a_file").write_text("not a folder")
  args = [str(BIN / "top1-demo"), "--num_examples=200", f"--workdir={tmp_path / where}"]
  out = _run(args, cwd=tmp_path, check=False)
  assert out.returncode == 1
  assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: ")


def _lenet_arrays(tmp_path, num=3000) -> list[str]:
  """LeNet's first ``num`` probabilities and labels as .npy files; top1-evaluate's arguments."""
  data = load_example("lenet-5-cifar-10")
  np.save(tmp_path / "p.npy", data.probs[:num])
  np.save(tmp_path / "y.npy", data.labels[:num])
  return [
    str(BIN / "top1-evaluate"),
    "--workdir=out",
    "--config.inputs=p.npy",
    "--config.input_kind=probs",
    "--config.labels=y.npy",
  ]


@pytest.mark.slow
def test_estimators_setting_gives_an_estimator_column(tmp_path):
  args = _lenet_arrays(tmp_path)
  flags = ["--config.estimators=(bins,isotonic,kde)", "--config.scores=(pmax,entropy)"]
  flags += [
    "--config.n_bins=(10,20)",
    "--config.topk=1",
    "--config.n_folds=4",
    "--config.figures=False",
  ]
  _run([*args, *flags], cwd=tmp_path)
  with open(tmp_path / "out" / "results.csv") as file:
    rows = [r for r in csv.DictReader(file) if r["score"] != "prediction_set"]
  assert {r["estimator"] for r in rows} == {"bins", "isotonic", "kde"}
  assert len(rows) == 3 * 2 * 2  # estimators x scores x bin counts
  brier = {(r["score"], r["estimator"]): float(r["brier"]) for r in rows if r["n_bins"] == "20"}
  # pmax is a confidence: the isotonic fit must follow it upwards, not flatten it.
  assert brier[("pmax", "isotonic")] < brier[("pmax", "bins")] + 5e-3
  table = (tmp_path / "out" / "results.md").read_text()
  assert "[isotonic]" in table and "[kde]" in table
  comparison = json.loads((tmp_path / "out" / "results.json").read_text())["comparison"]
  assert all(row["top1_score"] == "pmax" for row in comparison)  # Table 1 stays the bins'


@pytest.mark.slow
def test_selective_prediction_and_top_label_binning_on_lenet(tmp_path):
  args = _lenet_arrays(tmp_path)
  # 5 Top-1 bins; every predicted class (about 150 of a half's 1500) gets top-label bins.
  flags = ["--config.scores=pmax", "--config.n_bins=5", "--config.topk=1", "--config.n_folds=4"]
  out = _run([*args, *flags, "--config.selective_targets=(0.99,0.8,0.9)"], cwd=tmp_path)

  def refuse(token):
    raise AssertionError(f"non-strict JSON token {token}")

  results = json.loads((tmp_path / "out" / "results.json").read_text(), parse_constant=refuse)
  chosen = results["selective"]
  assert [r["target_accuracy"] for r in chosen] == [0.8, 0.9, 0.99]  # sorted
  for row in chosen:
    assert row["score"] == "pmax" and row["order"] == "descending"
    assert 0 <= row["num_empty"] <= row["num_splits"] == 4 == len(row["per_split"])
    assert 0.0 <= row["test_coverage"] <= 1.0
    for split in row["per_split"]:
      assert 0.0 <= split["test_coverage"] <= 1.0
      if split["guaranteed_accuracy"] is None:  # nothing selected
        assert split["test_coverage"] == 0.0 and split["test_accuracy"] is None
      else:
        assert split["guaranteed_accuracy"] >= row["target_accuracy"]
  # 5 bins of 300: LeNet's most confident fifth is right often enough to guarantee 80%.
  assert chosen[0]["num_empty"] < 4 and chosen[-1]["num_empty"] == 4
  assert (tmp_path / "out" / "figures" / "risk_coverage_p.png").is_file()
  comparison = {row["label"]: row for row in results["comparison"]}
  top_label = comparison["p + top-label binning"]
  assert top_label["multiclass_brier"] is None and top_label["top1_estimator"] == "toplabel"
  assert np.isfinite(top_label["top1_binned_brier"]) and np.isfinite(top_label["top1_binned_ece"])
  # Every class is predicted 50 times or more in each 1,500-point calibration half, so each
  # gets floor(n_c / 50) bins of its own (Gupta & Ramdas's default), not pmax's 5 pooled bins.
  assert top_label["toplabel_classes_with_own_bins"] == 10
  assert top_label["top1_binned_brier"] != comparison["p"]["top1_binned_brier"]
  assert abs(top_label["top1_binned_brier"] - comparison["p"]["raw_top1_brier"]) < 0.01
  table = (tmp_path / "out" / "results.md").read_text()
  assert "## Selective prediction with a guarantee" in table
  line = (
    "| p + top-label binning | pmax (Vanilla), per predicted class (own bins: 10 of 10 classes)"
  )
  assert f"{line} | – |" in table
  assert "nan" not in table and "results.md" in out.stderr
