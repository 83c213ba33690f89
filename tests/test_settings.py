"""Every setting of every stage is checked before any work, in one line naming the flag.

The checks are pure: ``settings.parse`` (every field), ``settings.check_examples`` (against the
test split's size) and the data's headers (``io.sweep_data``), which the launchers run
first. Each refusal is checked here, in this process, on a config parsed from the same
command-line overrides a user types; two launchers (reproduce, evaluate) run as a user
runs them to show that a refusal is one line, exit status 1, before any work. The data is
a tiny Fashion-MNIST-shaped IDX data dir written here: 300 training and 200 test images,
so the cross-stage checks (bins vs. test examples, topk vs. classes, batch_size vs.
training examples) have known numbers to meet.
"""

import errno
import gzip
import pathlib
import shutil
import struct
import sys
import types

import numpy as np
import processes
import pytest
from absl import flags
from absl.testing import flagsaver
from ml_collections import config_flags

from top1_jax.core.validation import SettingError
from top1_jax.io import datasets, idx, sweep_data
from top1_jax.io import predictions as predictions_lib
from top1_jax.launch import find_mislabeled, runner, usage
from top1_jax.pipeline import jobs, reproduce, sources, sweep
from top1_jax.pipeline import settings as settings_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUM_TRAIN, NUM_TEST = 300, 200


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


def _config(name: str, *overrides: str):
  """A packaged config with ``--config.<field>=<value>`` overrides, parsed as a launcher
  parses them (ml_collections' flag), in this process."""
  argv = ["test", f"--config={pathlib.Path(runner.PACKAGED_CONFIGS) / name}.py", *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def _refusal(check, *args) -> str:
  """The ``SettingError`` of ``check(*args)`` as a launcher prints it, after "error: "."""
  with pytest.raises(SettingError) as info:
    check(*args)
  message = runner.one_line(info.value)
  assert "\n" not in message
  return message


def _reproduce_checks(config) -> None:
  """What reproduce checks before it reads data: every field, then the data's headers."""
  reproduce.check(settings_lib.parse(config))


# (config overrides after the quick config and the tiny data dir, the field named, the text)
REPRODUCE_BAD = [
  # The evaluate stage's own settings, checked before stage 1 (they used to wait ~350 s).
  (["--config.compare_bins=7"], "compare_bins", "7 is not one of n_bins=(5, 10, 20)"),
  (["--config.ece_bins=0"], "ece_bins", "expected an integer in [1, 65536], got 0"),
  (["--config.figure_bins=0"], "figure_bins", "expected an integer >= 1, got 0"),
  (["--config.n_bins=(5,x)"], "n_bins", "expected int values, got ('5', 'x')"),
  (["--config.n_bins=(0,5)"], "n_bins", "expected values in [1, 1048576], got (0, 5)"),
  (["--config.topk=0"], "topk", "expected values >= 1, got (0,)"),
  (["--config.scores=(pmax,bogus)"], "scores", "unknown score(s) bogus"),
  (["--config.scores=(all,pmax)"], "scores", "expected ('all',) or score names"),
  (["--config.scores=human_entropy"], "scores", "human_entropy needs human label frequencies"),
  (["--config.seeds=(-1,)"], "seeds", "expected values >= 0, got (-1,)"),
  (["--config.n_folds=1"], "n_folds", "expected 2 to 127 splits, got 1"),
  (["--config.n_folds=128"], "n_folds", "expected 2 to 127 splits, got 128"),
  # The other stages' settings.
  (["--config.num_epochs=0"], "num_epochs", "expected an integer >= 1, got 0"),
  (["--config.ensemble_size=-1"], "ensemble_size", "expected an integer >= 0, got -1"),
  (["--config.train_dropout_rates=1.0"], "train_dropout_rates", "expected values in [0, 1)"),
  (["--config.learning_rate=0"], "learning_rate", "expected a number > 0, got 0"),
  # Not finite: inf passed "> 0", then JSON refused it ("Out of range float values...").
  (["--config.learning_rate=inf"], "learning_rate", "expected a finite number, got inf"),
  (["--config.learning_rate=1e400"], "learning_rate", "expected a finite number, got inf"),
  (["--config.dropout_rates=(0.1,nan)"], "dropout_rates", "expected finite numbers"),
  # A parenthesis missing: ml_collections keeps the text, which ran as 0.1 and was
  # recorded as ["(0.1"].
  (["--config.dropout_rates=(0.1"], "dropout_rates", "malformed value '(0.1': its parenth"),
  (["--config.train_dropout_rates=0.1)"], "train_dropout_rates", "malformed value '0.1)'"),
  (["--config.models=(mlp"], "models", "malformed value '(mlp'"),
  (["--config.limit_train=0"], "limit_train", "expected an integer >= 1, got 0"),
  (["--config.limit_test=0"], "limit_test", "expected an integer >= 1, got 0"),
  (["--config.num_samples=1"], "num_samples", "need >= 2 for MC dropout, got 1"),
  (["--config.dropout_rates=(0.1,1.5)"], "dropout_rates", "expected values in [0, 1)"),
  (["--config.chunk_size=0"], "chunk_size", "expected an integer >= 1, got 0"),
  (["--config.models=(mlp,vgg)"], "models", "expected names among cnn, cnn_wide, mlp, resnet,"),
  (["--config.estimators=(bins,trees)"], "estimators", "expected names among bins"),
  (["--config.inputs=other.npz"], "inputs", "reproduce and shift evaluate the predictions they"),
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


@pytest.mark.parametrize(
  "args, flag, text", REPRODUCE_BAD, ids=[" ".join(case[0]) for case in REPRODUCE_BAD]
)
def test_reproduce_checks_every_setting_before_training(data_dir, args, flag, text):
  message = _refusal(_reproduce_checks, _config("quick", _data(data_dir), *args))
  assert message.startswith(f"--config.{flag}: ") and text in message, message


def _refused(result, flag, text, workdir):
  """Exit status 1, one line on stderr naming the flag, and no work done."""
  assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-2000:])
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f"error: --config.{flag}: "), lines[0]
  assert text in lines[0], lines[0]
  # Before any training: no checkpoint, no predictions, no config, no progress line.
  for name in ("train", "predictions", "sweep", "config.json", "results.json"):
    assert not (workdir / name).exists(), name
  assert "train/" not in result.stderr and "predict:" not in result.stderr, result.stderr


def test_the_full_preset_refuses_in_one_line_before_any_work(tmp_path, data_dir):
  # The case: the default job (CNN, ensemble of 5) reached ece_bins only after
  # training and prediction. A launcher as a user runs it: one line, nothing written.
  workdir = tmp_path / "work"
  args = [f"--workdir={workdir}", _data(data_dir), "--config.ece_bins=0"]
  result = processes.launcher("reproduce", *args)
  _refused(result, "ece_bins", "expected an integer in [1, 65536], got 0", workdir)


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
  message = _refusal(_reproduce_checks, _config("quick", _data(partial)))
  assert message.startswith("--config.data_dir: "), message
  assert f"{partial} has t10k-images-idx3-ubyte.gz but no t10k-labels-idx1-ubyte[.gz]" in message


def test_data_dir_with_only_the_train_split_is_refused(tmp_path, data_dir):
  # The test split would have come from another source (TFDS) than the train split;
  # train checks both splits' headers first.
  partial = _partial_copy(tmp_path, data_dir, [p.name for p in data_dir.glob("train-*")])
  message = _refusal(sweep_data.check, settings_lib.parse(_config("default", _data(partial))))
  assert message.startswith("--config.data_dir: "), message
  assert f"the train split from idx:{partial} but the test split from tfds:{partial}" in message


def test_train_and_test_images_of_different_sizes_are_refused_before_training(tmp_path, data_dir):
  # Known only once the images are read: reproduce and train load both splits first.
  mixed = _partial_copy(tmp_path, data_dir, [p.name for p in data_dir.glob("train-*")])
  rng = np.random.default_rng(2)
  _write_idx(mixed / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (NUM_TEST, 32, 32)))
  _write_idx(mixed / "t10k-labels-idx1-ubyte.gz", np.arange(NUM_TEST) % 10)
  settings = settings_lib.parse(_config("quick", _data(mixed)))
  reproduce.check(settings)  # the headers alone cannot tell
  message = _refusal(sweep_data.load_both, settings)
  assert message.startswith("--config.data_dir: "), message
  assert "train images are (28, 28, 1) but test images (32, 32, 1)" in message


# (the launcher, the splits whose headers it checks first, overrides, field, text)
OTHER_STAGES_BAD = [
  ("train", ("train", "test"), ["--config.data_dir=/nonexistent"], "data_dir", "no such dir"),
  ("train", ("train", "test"), ["--config.batch_size=301"], "batch_size", "301 is larger than"),
  ("train", ("train", "test"), ["--config.limit_test=0"], "limit_test", "expected an integer"),
  ("predict", ("test",), ["--config.num_samples=1"], "num_samples", "need >= 2 for MC dropout"),
  ("predict", ("test",), ["--config.num_epochs=0"], "num_epochs", "expected an integer >= 1"),
  ("predict", ("test",), ["--config.data_dir=/nonexistent"], "data_dir", "no such directory"),
]


@pytest.mark.parametrize(
  "launcher, splits, args, flag, text",
  OTHER_STAGES_BAD,
  ids=[f"{case[0]} {' '.join(case[2])}" for case in OTHER_STAGES_BAD],
)
def test_train_and_predict_check_their_settings_first(data_dir, launcher, splits, args, flag, text):
  # What train and predict run before any work: every field, then their splits' headers.
  config = _config("default", _data(data_dir), *args)
  message = _refusal(lambda: sweep_data.check(settings_lib.parse(config), splits))
  assert message.startswith(f"--config.{flag}: ") and text in message, (launcher, message)


@pytest.mark.parametrize(
  "values, text",
  [
    ({"data_dir": "/nonexistent"}, "--data_dir: no such directory"),
    ({"topk": 0}, "--topk: expected an integer >= 1, got 0"),
    ({"n_bins": 4, "top_bins": 5}, "--top_bins: expected at most --n_bins=4, got 5"),
  ],
)
def test_find_mislabeled_checks_its_flags_first(values, text):
  flags.FLAGS.mark_as_parsed()  # the launcher's flags at their defaults, but these
  try:
    with flagsaver.flagsaver(**values), pytest.raises(runner.ExperimentError) as info:
      find_mislabeled.check_settings()
  finally:
    flags.FLAGS.unparse_flags()
  assert runner.one_line(info.value).startswith(text), info.value


def test_a_config_that_is_not_a_python_file_is_refused_naming_it(tmp_path):
  # The issue's case: --config=<a .npy> failed with "SyntaxError: source code string
  # cannot contain null bytes", naming neither the flag nor the file.
  array = tmp_path / "logits.npy"
  np.save(array, np.zeros(3))
  source = tmp_path / "mine.py"
  source.write_text("def get_config():\n  return None\n")
  cases = {
    str(array): f"--config: {array}: binary data, not text; give a packaged config by name "
    "(cifar10, cifar100, cifar100_wrn,",
    str(tmp_path / "nope.py"): f"--config: {tmp_path / 'nope.py'}: no such file; give a packaged",
    str(tmp_path): f"--config: {tmp_path}: a directory; give a packaged config",
  }
  for value, text in cases.items():
    with pytest.raises(runner.ExperimentError) as info:
      runner.check_config_file(value)
    assert runner.one_line(info.value).startswith(text), info.value
  runner.check_config_file(f"{source}:an_argument")  # a Python file, with get_config's argument


def test_an_empty_workdir_and_a_full_one_name_the_flag(tmp_path):
  flags.FLAGS.mark_as_parsed()
  try:
    # --workdir= (an unset shell variable) wrote to the default runs/<config>.
    with flagsaver.flagsaver(workdir=""), pytest.raises(runner.ExperimentError) as info:
      runner.workdir()
    assert str(info.value) == "--workdir: empty; give a directory or URL for this run's files"
    with flagsaver.flagsaver(workdir=str(tmp_path)):
      # A full disk fails in write() or fsync(), naming no file (io.files adds it).
      full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "results.json"))
      assert runner.one_line(full) == (
        f"--workdir: {tmp_path}: no space left on device (writing {tmp_path}/results.json);"
        " free some space or give another --workdir, then rerun the same command to resume"
      )
      unnamed = OSError(errno.ENOSPC, "No space left on device")
      assert runner.one_line(unnamed).startswith(f"--workdir: {tmp_path}: no space left")
      elsewhere = OSError(errno.EACCES, "Permission denied", "/etc/shadow")  # an input's problem
      assert runner.one_line(elsewhere) == "[Errno 13] Permission denied: '/etc/shadow'"
  finally:
    flags.FLAGS.unparse_flags()


def _predictions_file(path, num=400, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  meta = {"dataset": "fashion_mnist"}
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta=meta)
  )
  return path


# (the overrides after --config.inputs=p.npz unless they name the inputs, the field, the text):
# all checked before the sweep (ece_bins used to fail only after it) and before a file is read.
EVALUATE_BAD = [
  (["--config.ece_bins=0"], "ece_bins", "expected an integer in [1, 65536], got 0"),
  (["--config.compare_bins=7"], "compare_bins", "7 is not one of n_bins=(10, 20, 100)"),
  (["--config.figure_bins=-1"], "figure_bins", "expected an integer >= 1, got -1"),
  (["--config.scores=(all,pmax)"], "scores", "expected ('all',) or score names"),
  (["--config.n_folds=200"], "n_folds", "expected 2 to 127 splits, got 200"),
  (["--config.seeds=(-3,)"], "seeds", "expected values >= 0, got (-3,)"),
  (["--config.selective_targets=(0.9,x)"], "selective_targets", "expected float values"),
  (["--config.selective_targets=(0.9,1.5)"], "selective_targets", "expected values in [0, 1)"),
  (["--config.selective_targets=0"], "selective_targets", "expected accuracies in (0, 1)"),
  (["--config.selective_delta=0.5"], "selective_delta", "expected a probability in (0, 0.5)"),
  (["--config.selective_delta=nan"], "selective_delta", "expected a finite number, got nan"),
  (["--config.selective_targets=(0.9,inf)"], "selective_targets", "expected finite numbers"),
  (["--config.scores=pmax)"], "scores", "malformed value 'pmax)'"),
  # The inputs: what they are, and what goes with them.
  (["--config.labels=y.npy"], "labels", "goes with a .npy array of logits or probs"),
  (["--config.input_kind=npz"], "input_kind", "expected one of auto, predictions, logits, probs"),
  (["--config.inputs=x.npy", "--config.input_kind=predictions"], "input_kind", "x.npy is an array"),
  (["--config.inputs=x.npy"], "labels", "required with a .npy array of logits or probs"),
  (["--config.inputs=x.npy", "--config.input_kind=probs"], "labels", "required with a .npy array"),
  (["--config.input_kind=logits", "--config.labels=y.npy"], "inputs", "required with input_kind"),
  (
    ["--config.inputs=x.npy,z.npy", "--config.input_kind=logits", "--config.labels=y.npy"],
    "inputs",
    "an array input reads one .npy array, got 2",
  ),
]


@pytest.mark.parametrize(
  "args, flag, text", EVALUATE_BAD, ids=[" ".join(case[0]) for case in EVALUATE_BAD]
)
def test_evaluate_checks_every_setting_before_the_sweep(args, flag, text):
  named = any(a.startswith(("--config.inputs=", "--config.input_kind=")) for a in args)
  given = [] if named else ["--config.inputs=p.npz"]
  message = _refusal(settings_lib.parse, _config("default", *given, *args))
  assert message.startswith(f"--config.{flag}: ") and text in message, message


def test_evaluate_refuses_in_one_line_before_any_work(tmp_path):
  # The other launcher as a user runs it: one line, no sweep started, nothing written.
  path = _predictions_file(tmp_path / "p.npz")
  workdir = tmp_path / "work"
  args = [f"--workdir={workdir}", f"--config.inputs={path}", "--config.labels=y.npy"]
  result = processes.launcher("evaluate", *args)
  _refused(result, "labels", "goes with a .npy array of logits or probs", workdir)
  assert "evaluate:" not in result.stderr  # no sweep started


def test_default_compare_bins_follows_n_bins(tmp_path):
  # Unset, the comparison uses 20 bins when the sweep has them, else the sweep's first.
  assert settings_lib.parse(_config("default", "--config.n_bins=(10,20,30)")).compare_bins == 20
  path = _predictions_file(tmp_path / "p.npz", num=100)
  args = ["--config.n_bins=(2,4)", "--config.n_folds=2", "--config.topk=1", "--config.scores=pmax"]
  settings = settings_lib.parse(_config("default", f"--config.inputs={path}", *args))
  assert settings.compare_bins == 2
  found = sources.load_sources([("p", path)], settings)
  records = sweep.sweep(settings, found, tmp_path / "sweep", log=lambda line: None)
  comparison = sweep.table1(settings, found, records)
  assert comparison and {row["top1_n_bins"] for row in comparison} == {2}


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


@pytest.mark.parametrize("name", ["default", "quick", "cifar10", "cifar100", "evaluate_files"])
def test_every_config_loads_and_passes_its_checks(name):
  config = _config(name)
  if name == "evaluate_files":
    assert config.dataset is None  # a user's files: no dataset unless they name one
    config.inputs = "val.npz"  # it evaluates a file the user names
  checked = settings_lib.parse(config)
  assert checked.n_bins and checked.topk and checked.seeds == (0,)
  points = jobs.training_points(checked)
  assert [p.name for p in points] == [
    f"{m}_tdr{r:g}_seed0" for m in checked.models for r in checked.train_dropout_rates
  ]
  names = [job.name for job in jobs.prediction_jobs(checked, points[0])]
  assert names[0].endswith("/deterministic") and len(names) == 1 + len(checked.dropout_rates) + (
    checked.ensemble_size >= 1
  )


def test_every_field_of_every_config_is_in_default():
  # Variants override default's fields; none adds a field that default does not explain.
  fields = set(_config("default").keys())
  for name in ("quick", "cifar10", "cifar100", "evaluate_files"):
    assert set(_config(name).keys()) == fields, name


def test_a_task_share_is_every_nth_unit_from_its_index():
  units = list(range(5))
  assert jobs.task_share(units, (1, 2)) == [1, 3]
  shares = [jobs.task_share(units, (i, 3)) for i in range(3)]
  assert sorted(sum(shares, [])) == units  # the tasks split the units: none twice, none left


# ----------------------------------------------------------------------------
# The command line's words for itself: --help's fields, "did you mean", missing packages


def test_every_field_has_its_meaning_in_default():
  from top1_jax.configs import default

  assert set(default.HELP) == set(_config("default").keys())
  assert all(meaning and "\n" not in meaning for meaning in default.HELP.values())


def test_help_text_lists_each_field_with_its_meaning_and_value():
  from top1_jax.configs import default

  flag_values = flags.FlagValues()
  argv = ["test", f"--config={pathlib.Path(runner.PACKAGED_CONFIGS) / 'quick'}.py"]
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  text = " ".join(usage.help_text(flag_values, "The launcher.").split())
  assert text.startswith("The launcher.") and "The fields of --config=quick" in text
  assert (
    "--config.limit_test: Predict the first N test examples only; unset: all (default: 2000)"
    in text
  )
  for field, meaning in default.HELP.items():
    assert f"--config.{field}: {' '.join(meaning.split())} (default: " in text


def test_a_mistyped_field_is_one_line_with_the_nearest_field():
  argv = ["--config.inputs=p.npz", "--config.seed=1"]
  with pytest.raises(AttributeError) as info:  # ml_collections': a repr of a KeyError
    _config("default", *argv)
  assert str(info.value).startswith("'\\'seed\\'\\nDid you mean")  # the old message's repr
  assert usage.unknown_field(argv) == (
    "--config.seed: no such field; did you mean --config.seeds? (--help lists every field)"
  )
  assert usage.unknown_field(["--noconfig.figure"]).startswith(
    "--config.figure: no such field; did you mean --config.figures?"
  )
  assert usage.unknown_field(["--config.zzz=1"]) == (
    "--config.zzz: no such field; (--help lists every field)"
  )


@pytest.mark.parametrize(
  "arg, text",
  [
    (
      "--probs=p.npy",
      "--probs: no such flag (--help lists every flag and field); an array of probs is "
      "--config.inputs=<.npy> --config.input_kind=probs --config.labels=<.npy>",
    ),
    (
      "--inputs=p.npy",
      "--inputs: no such flag (--help lists every flag and field); did you mean --config.inputs?",
    ),  # fmt: skip
    (
      "--n_bin=5",
      "--n_bin: no such flag (--help lists every flag and field); did you mean --config.n_bins?",
    ),  # fmt: skip
    (
      "--workdirr=out",
      "--workdirr: no such flag (--help lists every flag and field); did you mean --workdir?",
    ),  # fmt: skip
    ("--config.seed=1", "--config.seed: no such field; did you mean --config.seeds?"),
  ],
)
def test_an_unknown_flag_names_the_config_field_it_may_mean(arg, text):
  flag_values = flags.FlagValues()
  argv = ["test", f"--config={pathlib.Path(runner.PACKAGED_CONFIGS) / 'default'}.py"]
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  with pytest.raises(flags.UnrecognizedFlagError) as info:
    flag_values([*argv, arg])
  assert usage.unknown_flag(info.value.flagname, flag_values).startswith(text)


def test_a_missing_package_names_the_extra_to_install(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["/venv/bin/top1-evaluate", "--workdir=out"])
  flax_missing = ModuleNotFoundError("No module named 'flax'", name="flax")
  assert runner.one_line(flax_missing) == (
    "top1-evaluate needs the package 'flax' (pip install 'top1_jax[all]'; from a clone: "
    "pip install '.[all]')"
  )
  assert "'absl-py' (pip install 'top1_jax[cli]'" in runner.install_hint("find_mislabeled", "absl")
  assert "'absl-py' (pip install 'top1_jax[all]'" in runner.install_hint("train", "absl")
  # Nested (reproduce imports train), the launcher the user ran is named.
  with pytest.raises(SystemExit) as info, runner.requiring("reproduce"), runner.requiring("train"):
    raise ModuleNotFoundError("No module named 'orbax'", name="orbax.checkpoint")
  assert info.value.code == runner.MISSING_STATUS == 2
  assert capsys.readouterr().err == (
    "error: top1-reproduce needs the package 'orbax-checkpoint' (pip install 'top1_jax[all]'; "
    "from a clone: pip install '.[all]')\n"
  )
  with pytest.raises(ModuleNotFoundError), runner.requiring("evaluate"):  # our own: a bug
    raise ModuleNotFoundError("No module named 'top1_jax.nope'", name="top1_jax.nope")


def test_evaluating_files_needs_no_model_names():
  # engine.models imports Flax, which a [cli] install lacks: only a config that trains
  # looks its model names up.
  assert settings_lib.parse(_config("default", "--config.inputs=p.npz", "--config.models=(vgg,)"))
  message = _refusal(settings_lib.parse, _config("default", "--config.models=(vgg,)"))
  assert message.startswith("--config.models: expected names among cnn, cnn_wide, mlp, resnet,")


def test_a_tuple_given_twice_is_refused_not_merged(monkeypatch):
  # ml_collections merges repeated tuple overrides: both (5,) and (7,) were swept.
  from top1_jax.launch import config_flag

  argv = ["test", "--config.n_bins=(5,)", "--config.n_bins=(7,)", "--config.figures=False"]
  monkeypatch.setattr(sys, "argv", argv)
  monkeypatch.setattr(config_flag, "CONFIG", types.SimpleNamespace(value=_config("quick")))
  message = _refusal(config_flag.settings)
  assert message.startswith("--config.n_bins: given twice on the command line; give it once")
  monkeypatch.setattr(sys, "argv", ["test", "--config.figures=False", "--config.figures=True"])
  assert config_flag.settings().figures  # a scalar: the last one wins, as absl's flags


def test_a_stray_word_is_refused_not_ignored():
  with pytest.raises(runner.ExperimentError) as info:
    runner.no_arguments(["experiments/evaluate.py", "preds.npz"])
  assert runner.one_line(info.value).startswith("unexpected argument(s): preds.npz; every")


def test_any_real_path_is_one_input(tmp_path):
  # Paths with spaces, commas or parentheses were split and refused.
  odd = tmp_path / "run (2), final.npz"
  odd.write_bytes(b"")
  config = _config("default", f"--config.inputs={odd}")
  assert settings_lib.parse(config).inputs == (str(odd),)
  config = _config("default", f"--config.inputs=a.npz,{tmp_path}/x\\,y.npz")
  assert settings_lib.parse(config).inputs == ("a.npz", f"{tmp_path}/x,y.npz")


@pytest.mark.slow
def test_a_config_file_that_raises_is_one_line_naming_it(tmp_path):
  # "RuntimeError: boom" named neither the flag nor the file; a RecursionError neither.
  for body, what in (("raise RuntimeError('boom')", "RuntimeError: boom"),
                     ("get_config()", "RecursionError: maximum recursion depth")):  # fmt: skip
    path = tmp_path / f"mine_{len(body)}.py"
    path.write_text(f"def get_config():\n  {body}\n")
    result = processes.launcher("evaluate", f"--config={path}", "--workdir=out")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: --config: {path}: {what}"), result.stderr
