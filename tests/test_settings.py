"""Every setting of every stage is checked before any work, in one line naming the flag.

The launchers run as a user runs them (subprocesses, as in test_experiments.py),
on a tiny Fashion-MNIST-shaped IDX data dir written here: 300 training and 200
test images, so the cross-stage checks (bins vs. test examples, --topk vs.
classes, --batch_size vs. training examples) have known numbers to meet.
"""

import gzip
import json
import pathlib
import shutil
import struct
import sys
import time

import numpy as np
import processes
import pytest

from top1_jax.io import datasets, idx
from top1_jax.io import predictions as predictions_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_TRAIN, NUM_TEST = 300, 200
# A refused run exits in a few seconds (imports); the quick preset trains for far longer.
FAST = 30.0


def _run(module, *args):
  start = time.perf_counter()
  result = processes.launcher(module, *args)
  return result, time.perf_counter() - start


def _write_idx(path: pathlib.Path, array: np.ndarray) -> None:
  type_and_dims = bytes([0, 0, 0x08, array.ndim])
  header = type_and_dims + struct.pack(f">{array.ndim}I", *array.shape)
  path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def _write_split(directory: pathlib.Path, split: str, num: int, seed: int = 0) -> None:
  rng = np.random.default_rng(seed)
  prefix = idx.IDX_SPLIT_PREFIX[split]
  _write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (num, 28, 28)))
  _write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", np.arange(num) % 10)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("tiny_fmnist")
  _write_split(directory, "train", NUM_TRAIN)
  _write_split(directory, "test", NUM_TEST, seed=1)
  return directory


def _data(directory) -> str:
  return f"--config.data_dir={directory}"


QUICK = "--config=top1_jax/configs/quick.py"


def _refused(result, elapsed, flag, text, workdir, prefix="config."):
  """Exit status 1, one line on stderr naming the flag, and no work done."""
  assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f"error: --{prefix}{flag}: "), lines[0]
  assert text in lines[0], lines[0]
  # Before any training: no checkpoint, no predictions, no config, no progress line.
  for name in ("train", "predictions", "sweep", "config.json", "results.json"):
    assert not (workdir / name).exists(), name
  assert "train/" not in result.stderr and "predict:" not in result.stderr, result.stderr
  assert elapsed < FAST, elapsed


# (config overrides after the quick config and the tiny data dir, the field named, the text)
REPRODUCE_BAD = [
  # The evaluate stage's own settings, checked before stage 1 (they used to wait ~350 s).
  (["--config.compare_bins=7"], "compare_bins", "7 is not one of n_bins=(5, 10, 20)"),
  (["--config.ece_bins=0"], "ece_bins", "expected an integer >= 1, got 0"),
  (["--config.figure_bins=0"], "figure_bins", "expected an integer >= 1, got 0"),
  (["--config.n_bins=(5,x)"], "n_bins", "expected int values, got ('5', 'x')"),
  (["--config.n_bins=(0,5)"], "n_bins", "expected values >= 1, got (0, 5)"),
  (["--config.topk=0"], "topk", "expected values >= 1, got (0,)"),
  (["--config.scores=(pmax,bogus)"], "scores", "unknown score(s) bogus"),
  (["--config.scores=(all,pmax)"], "scores", "expected ('all',) or score names"),
  (["--config.scores=human_entropy"], "scores", "human_entropy needs human label frequencies"),
  (["--config.seeds=(-1,)"], "seeds", "expected values >= 0, got (-1,)"),
  (["--config.n_folds=1"], "n_folds", "expected 2 to 127 splits, got 1"),
  (["--config.n_folds=128"], "n_folds", "expected 2 to 127 splits, got 128"),
  # The other stages' settings.
  (["--config.epochs=0"], "epochs", "expected an integer >= 1, got 0"),
  (["--config.ensemble_size=-1"], "ensemble_size", "expected an integer >= 0, got -1"),
  (["--config.train_dropout_rates=1.0"], "train_dropout_rates", "expected values in [0.0, 1.0)"),
  (["--config.learning_rate=0"], "learning_rate", "expected > 0, got 0"),
  (["--config.limit_train=0"], "limit_train", "expected an integer >= 1, got 0"),
  (["--config.limit_test=0"], "limit_test", "expected an integer >= 1, got 0"),
  (["--config.num_samples=1"], "num_samples", "need >= 2 for MC dropout, got 1"),
  (["--config.dropout_rates=(0.1,1.5)"], "dropout_rates", "expected values in [0.0, 1.0)"),
  (["--config.chunk_size=0"], "chunk_size", "expected an integer >= 1, got 0"),
  (["--config.models=(mlp,vgg)"], "models", "expected names among cnn, mlp, resnet"),
  (["--config.estimators=(bins,trees)"], "estimators", "expected names among bins"),
  (["--config.predictions=other.npz"], "predictions", "reproduce evaluates the predictions it"),
  # Across stages: the test split's size (from the IDX headers) and classes.
  (
    ["--config.n_bins=(5,10,150)"],
    "n_bins",
    "150 bins need at least that many calibration examples; a split has 100 of the 200 test",
  ),
  (
    ["--config.limit_test=30"],
    "n_bins",
    "20 bins need at least that many calibration examples; a split has 15 of the 30 test "
    "examples (limit_test=30)",
  ),
  (
    ["--config.scheme=kfold", "--config.n_folds=40", "--config.limit_test=30"],
    "n_folds",
    "40 splits need at least that many examples; there are 30 test examples",
  ),
  (["--config.topk=(1,11)"], "topk", "11 exceeds the 10 classes of fashion_mnist"),
  (["--config.batch_size=400"], "batch_size", "400 is larger than the 300 training examples"),
  (
    [
      "--config.scores=covariance_norm_probs",
      "--config.dropout_rates=()",
      "--config.ensemble_size=1",
    ],
    "scores",
    "covariance_norm_probs needs MC-dropout samples or an ensemble of 2 or more",
  ),
  # An explicit data_dir is used or refused, never replaced by the system copy.
  (["--config.data_dir=/nonexistent"], "data_dir", "no such directory: /nonexistent"),
]


# As a subprocess (exit status, the one stderr line, timing): a few rows; the whole table
# runs in-process below, where a row costs milliseconds instead of the launcher's imports.
AS_SUBPROCESS = [REPRODUCE_BAD[0], REPRODUCE_BAD[12], REPRODUCE_BAD[-1]]


@pytest.mark.parametrize(
  "args, flag, text", AS_SUBPROCESS, ids=[" ".join(case[0]) for case in AS_SUBPROCESS]
)
def test_reproduce_refuses_bad_settings_before_training(tmp_path, data_dir, args, flag, text):
  workdir = tmp_path / "work"
  result, elapsed = _run("reproduce", QUICK, f"--workdir={workdir}", _data(data_dir), *args)
  _refused(result, elapsed, flag, text, workdir)


@pytest.fixture()
def reproduce_in_process(monkeypatch):
  """``reproduce.main`` in this process, with training replaced by a tripwire."""
  from absl import flags

  from top1_jax.launch import common, reproduce
  from top1_jax.launch import train as train_exp

  def tripwire(*_, **__):
    raise AssertionError("training started before the settings were refused")

  monkeypatch.setattr(train_exp, "run", tripwire)

  def run(*argv):
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)  # a parse defines the overrides' flags; the next one again
    flags.FLAGS.unparse_flags()
    monkeypatch.setattr(sys, "argv", ["reproduce", *argv])  # where config overrides are read
    flags.FLAGS(sys.argv)
    with pytest.raises(ValueError) as info:  # a SettingError or the launcher's own error
      reproduce.main([])
    return common.one_line(info.value)  # as the launcher prints it, after "error: "

  yield run
  flags.FLAGS.unparse_flags()


@pytest.mark.parametrize(
  "args, flag, text", REPRODUCE_BAD, ids=[" ".join(case[0]) for case in REPRODUCE_BAD]
)
def test_reproduce_checks_every_setting_before_training(
  tmp_path, data_dir, reproduce_in_process, args, flag, text
):
  workdir = tmp_path / "work"
  message = reproduce_in_process(QUICK, f"--workdir={workdir}", _data(data_dir), *args)
  assert message.startswith(f"--config.{flag}: ") and text in message, message
  assert "\n" not in message
  assert not workdir.exists()  # nothing written, not even the work dir


def test_the_full_preset_checks_evaluate_settings_first(tmp_path, data_dir):
  # The case: the default job (CNN, ensemble of 5) reached --ece_bins only
  # after training and prediction.
  workdir = tmp_path / "work"
  result, elapsed = _run(
    "reproduce", f"--workdir={workdir}", _data(data_dir), "--config.ece_bins=0"
  )
  _refused(result, elapsed, "ece_bins", "expected an integer >= 1, got 0", workdir)


def _partial_copy(tmp_path, data_dir, keep):
  directory = tmp_path / "partial"
  directory.mkdir()
  for name in keep:
    shutil.copy(data_dir / name, directory / name)
  return directory


def test_data_dir_with_test_images_but_no_test_labels_is_refused(tmp_path, data_dir):
  # The test labels would have come from another copy (the system's) than the images.
  keep = [p.name for p in data_dir.iterdir() if not p.name.startswith("t10k-labels")]
  partial = _partial_copy(tmp_path, data_dir, keep)
  workdir = tmp_path / "work"
  result, elapsed = _run("reproduce", QUICK, f"--workdir={workdir}", _data(partial))
  _refused(
    result,
    elapsed,
    "data_dir",
    f"{partial} has t10k-images-idx3-ubyte.gz but no t10k-labels-idx1-ubyte[.gz]",
    workdir,
  )


def test_data_dir_with_only_the_train_split_is_refused(tmp_path, data_dir):
  # The test split would have come from another source (TFDS) than the train split.
  partial = _partial_copy(tmp_path, data_dir, [p.name for p in data_dir.glob("train-*")])
  workdir = tmp_path / "work"
  result, elapsed = _run("train", f"--workdir={workdir}", _data(partial))
  _refused(
    result,
    elapsed,
    "data_dir",
    f"the train split from idx:{partial} but the test split from tfds:{partial}",
    workdir,
  )


@pytest.mark.parametrize(
  "module, args, flag, text",
  [
    ("train", ["--config.data_dir=/nonexistent"], "config.data_dir", "no such directory"),
    ("train", ["--config.batch_size=301"], "config.batch_size", "301 is larger than the 300"),
    ("train", ["--config.limit_test=0"], "config.limit_test", "expected an integer >= 1, got 0"),
    ("predict", ["--config.num_samples=1"], "config.num_samples", "need >= 2 for MC dropout"),
    ("predict", ["--config.epochs=0"], "config.epochs", "expected an integer >= 1, got 0"),
    ("predict", ["--config.data_dir=/nonexistent"], "config.data_dir", "no such directory"),
    ("find_mislabeled", ["--data_dir=/nonexistent"], "data_dir", "no such directory"),
    ("find_mislabeled", ["--topk=0"], "topk", "expected an integer >= 1, got 0"),
  ],
)
def test_other_launchers_refuse_bad_settings_first(tmp_path, data_dir, module, args, flag, text):
  workdir = tmp_path / "work"
  given = any("data_dir" in a for a in args)
  data = (
    [] if given else [f"--data_dir={data_dir}" if module == "find_mislabeled" else _data(data_dir)]
  )
  result, elapsed = _run(module, f"--workdir={workdir}", *data, *args)
  _refused(result, elapsed, flag, text, workdir, prefix="")


def _predictions_file(path, num=400, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  meta = {"dataset": "fashion_mnist"}
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta=meta)
  )
  return path


@pytest.mark.parametrize(
  "args, flag, text",
  [
    # Before the sweep (--ece_bins used to fail only after it) and before any file is read.
    (["--config.ece_bins=0"], "ece_bins", "expected an integer >= 1, got 0"),
    (["--config.compare_bins=7"], "compare_bins", "7 is not one of n_bins=(10, 20, 100)"),
    (["--config.figure_bins=-1"], "figure_bins", "expected an integer >= 1, got -1"),
    (["--config.scores=(all,pmax)"], "scores", "expected ('all',) or score names"),
    (["--config.n_folds=200"], "n_folds", "expected 2 to 127 splits, got 200"),
    (["--config.seeds=(-3,)"], "seeds", "expected values >= 0, got (-3,)"),
    (["--config.labels=y.npy"], "labels", "goes with logits or probs"),
    (["--config.logits=x.npy"], "labels", "required with logits"),
    (["--config.logits=x.npy", "--config.probs=x.npy"], "logits", "give logits or probs, not both"),
  ],
)
def test_evaluate_refuses_bad_settings_before_the_sweep(tmp_path, args, flag, text):
  path = _predictions_file(tmp_path / "p.npz")
  workdir = tmp_path / "work"
  inputs = (
    [] if any("logits" in a or "labels" in a for a in args) else [f"--config.predictions={path}"]
  )
  result, elapsed = _run("evaluate", f"--workdir={workdir}", *inputs, *args)
  _refused(result, elapsed, flag, text, workdir)
  assert "evaluate:" not in result.stderr  # no sweep started


def test_default_compare_bins_follows_n_bins(tmp_path):
  # Unset, the comparison uses 20 bins when the sweep has them, else the sweep's first.
  path = _predictions_file(tmp_path / "p.npz", num=100)
  args = ["--config.n_bins=(2,4)", "--config.n_folds=2", "--config.topk=1", "--config.scores=pmax"]
  args.append("--config.figures=False")
  result, _ = _run("evaluate", f"--workdir={tmp_path}", f"--config.predictions={path}", *args)
  assert result.returncode == 0, result.stderr[-2000:]
  comparison = json.loads((tmp_path / "results.json").read_text())["comparison"]
  assert {row["top1_n_bins"] for row in comparison} == {2}


# ----------------------------------------------------------------------------
# The library side: where a split comes from, read from the headers alone


def test_split_info_reads_only_the_headers(tmp_path, no_system_fmnist, data_dir):
  info = datasets.split_info("fashion_mnist", "test", data_dir=data_dir)
  assert info == datasets.SplitInfo(f"idx:{data_dir}", NUM_TEST, 10)
  limited = datasets.split_info("fashion_mnist", "train", data_dir=data_dir, limit=50)
  assert limited.num_examples == 50
  loaded = datasets.load_dataset("fashion_mnist", "train", data_dir=data_dir, limit=50)
  assert (loaded.source, len(loaded.labels), loaded.num_classes) == limited
  # Only the header is read: a file whose data is cut short still gives its shape.
  header = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 60000, 28, 28)
  (tmp_path / "cut.gz").write_bytes(gzip.compress(header + b"\0" * 10))
  assert idx.read_idx_shape(tmp_path / "cut.gz") == (60000, 28, 28)
  assert datasets.split_info("cifar10", "test").num_examples is None  # TFDS: known once opened


def test_count_idx_examples_checks_both_headers(tmp_path, data_dir):
  images = data_dir / "train-images-idx3-ubyte.gz"
  assert idx.count_idx_examples(images, data_dir / "train-labels-idx1-ubyte.gz") == NUM_TRAIN
  with pytest.raises(ValueError, match="has 300 images but .* has 200 labels"):
    idx.count_idx_examples(images, data_dir / "t10k-labels-idx1-ubyte.gz")
  with pytest.raises(ValueError, match="bad magic number 0x00000803 for IDX1 ubyte labels"):
    idx.count_idx_examples(images, images)


def test_explicit_data_dir_never_falls_back_to_the_system_copy(tmp_path, monkeypatch, data_dir):
  monkeypatch.setattr(idx, "FASHION_MNIST_DIR", data_dir)  # a system copy with every file
  empty = tmp_path / "user"
  empty.mkdir()
  # The library's default keeps the documented fallback ...
  assert datasets.split_info("fashion_mnist", "test", data_dir=empty).source == f"idx:{data_dir}"
  # ... which the launchers switch off: the directory given is the only one read.
  strict = datasets.split_info("fashion_mnist", "test", data_dir=empty, fallback=False)
  assert strict.source == f"tfds:{empty}"
  with pytest.raises(datasets.DataUnavailableError) as info:
    datasets.load_dataset("fashion_mnist", "test", data_dir=empty, source="idx", fallback=False)
  text = str(info.value)
  assert str(empty) in text and str(data_dir) not in text
  assert "leave data_dir out for apt-get install dataset-fashion-mnist" in text


def test_half_an_idx_pair_is_refused_not_skipped(tmp_path, monkeypatch, data_dir):
  monkeypatch.setattr(idx, "FASHION_MNIST_DIR", data_dir)
  shutil.copy(data_dir / "t10k-images-idx3-ubyte.gz", tmp_path)
  assert "no t10k-labels-idx1-ubyte[.gz]" in idx.incomplete_idx_pair(tmp_path, "test")
  assert idx.incomplete_idx_pair(data_dir, "test") is None
  assert idx.incomplete_idx_pair(tmp_path, "train") is None  # neither file: nothing half there
  for fallback in (True, False):
    with pytest.raises(datasets.DataUnavailableError, match="must come from one directory"):
      datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path, fallback=fallback)
    with pytest.raises(datasets.DataUnavailableError, match="must come from one directory"):
      datasets.split_info("fashion_mnist", "test", data_dir=tmp_path, fallback=fallback)


def test_train_and_test_images_of_different_sizes_are_refused_before_training(tmp_path, data_dir):
  mixed = _partial_copy(tmp_path, data_dir, [p.name for p in data_dir.glob("train-*")])
  rng = np.random.default_rng(2)
  _write_idx(mixed / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (NUM_TEST, 32, 32)))
  _write_idx(mixed / "t10k-labels-idx1-ubyte.gz", np.arange(NUM_TEST) % 10)
  workdir = tmp_path / "work"
  result, elapsed = _run("reproduce", QUICK, f"--workdir={workdir}", _data(mixed))
  _refused(
    result, elapsed, "data_dir", "train images are (28, 28, 1) but test images (32, 32, 1)", workdir
  )


@pytest.mark.parametrize("name", ["fashion_mnist", "quick", "cifar10", "cifar100", "imagenet_eval"])
def test_every_config_loads_and_passes_its_checks(name):
  import importlib

  from top1_jax.sweep import plan

  config = importlib.import_module(f"top1_jax.configs.{name}").get_config()
  if name == "imagenet_eval":
    config.predictions = "val.npz"  # it evaluates a file the user names
  checked = plan.check(config)
  assert checked.n_bins and checked.topk and checked.seeds == (0,)
  points = plan.training_points(checked)
  assert [p.name for p in points] == [
    f"{m}_tdr{r:g}_seed0" for m in checked.models for r in checked.train_dropout_rates
  ]
  names = plan.predictions_names(checked, points[0])
  assert names[0].endswith("/deterministic") and len(names) == 1 + len(checked.dropout_rates) + (
    checked.ensemble_size >= 1
  )
  assert plan.mine(list(range(5)), (1, 2)) == [1, 3]  # a task's share: every n-th from its index
