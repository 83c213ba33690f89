"""Flags, files and progress shared by the experiments (no maths here).

Every experiment writes into one work dir, one run at a time:

  workdir/
    .lock                       held while a run works here (host, pid, command)
    config.json                 the flags of the last run
    train/{base,ensemble}/      orbax checkpoints, one per finished epoch
    train/{base,ensemble}.json  training log; written last, marks the stage done
    predictions/*.npz           predictions files (see top1_jax.io.predictions)
    sweep/*.json                one cross-validation result per (file, score, event)
    results.{json,csv,md}       every metric, mean and std over splits
    figures/*.png

All files are written to a temporary name and renamed, so a killed run leaves
either the old file or the new one; each stage skips work whose output exists.
"""

import contextlib
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from absl import app, flags, logging

from top1_jax import __version__
from top1_jax.io import datasets, files, lock

WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, predictions, results.")
DATASET = flags.DEFINE_string(
  "dataset",
  "fashion_mnist",
  "Dataset: fashion_mnist / mnist (offline IDX files or TFDS), or any TFDS name "
  "(cifar10, cifar100, imagenet2012, ...).",
)
DATA_DIR = flags.DEFINE_string(
  "data_dir",
  None,
  "IDX files or a TFDS data dir (default: the Debian package, then ~/tensorflow_datasets).",
)
SEED = flags.DEFINE_integer("seed", 0, "Seed for initialisation, shuffling, dropout and splits.")
LIMIT_TRAIN = flags.DEFINE_integer("limit_train", None, "Use only the first N training examples.")
LIMIT_TEST = flags.DEFINE_integer("limit_test", None, "Use only the first N test examples.")


class ExperimentError(Exception):
  """A problem the user can fix (bad flag, missing file): printed as one line."""


def workdir() -> pathlib.Path:
  if not WORKDIR.value:
    raise ExperimentError("--workdir: required (a directory for this run's outputs)")
  return pathlib.Path(WORKDIR.value).expanduser()


def say(message: str) -> None:
  """One progress line with the wall-clock time, flushed at once."""
  print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# The experiments' names for the library's atomic file helpers.
atomic_write_bytes = files.write_bytes
write_json = files.write_json
read_json = files.read_json
write_csv = files.write_csv


def parse_ints(name: str, values: Sequence[str], minimum: int = 1) -> tuple[int, ...]:
  try:
    parsed = tuple(int(v) for v in values)
  except ValueError:
    raise ExperimentError(f"--{name}: expected integers, got {','.join(values)}") from None
  if not parsed or min(parsed) < minimum:
    raise ExperimentError(f"--{name}: expected integers >= {minimum}, got {','.join(values)}")
  return parsed


def parse_floats(name: str, values: Sequence[str], low: float, high: float) -> tuple[float, ...]:
  try:
    parsed = tuple(float(v) for v in values)
  except ValueError:
    raise ExperimentError(f"--{name}: expected numbers, got {','.join(values)}") from None
  if not parsed or not all(low <= v < high for v in parsed):
    raise ExperimentError(f"--{name}: expected numbers in [{low}, {high}), got {','.join(values)}")
  return parsed


def versions() -> dict[str, str]:
  import flax
  import jax
  import numpy
  import optax

  return {
    "top1_jax": __version__,
    "jax": jax.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
    "numpy": numpy.__version__,
    "python": sys.version.split()[0],
    "backend": jax.default_backend(),
    "devices": str(len(jax.devices())),
  }


_USER_ERRORS = (
  ExperimentError,
  ValueError,
  OSError,  # a work dir that is a file, unwritable, full, ...
  datasets.DataUnavailableError,
  lock.WorkdirBusyError,
)


def _one_line(error: BaseException) -> str:
  text = " ".join(str(error).split()) or type(error).__name__
  if isinstance(error, _USER_ERRORS):
    return text
  # Anything else (Flax, orbax, XLA): its type and first words, the rest with TOP1_DEBUG=1.
  return f"{type(error).__name__}: {text[:300]} (TOP1_DEBUG=1 shows the traceback)"


def run(main: Callable[[list[str]], None]) -> None:
  """``app.run`` that holds the work dir's lock and ends any failure in one line, exit 1."""

  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)  # JAX's INFO lines about absent TPUs are noise here
    try:
      with lock.hold(workdir(), say=say) if WORKDIR.value else contextlib.nullcontext():
        main(argv)
    except Exception as e:  # noqa: BLE001 -- every failure becomes one line
      if os.environ.get("TOP1_DEBUG"):
        traceback.print_exc()
      print(f"error: {_one_line(e)}", file=sys.stderr, flush=True)
      sys.exit(1)

  app.run(wrapped)
