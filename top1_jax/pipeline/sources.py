"""The predictions files a sweep evaluates (``asked_files``), each read and scored once
(``Source``).
"""

import concurrent.futures
import time

import numpy as np

from top1_jax.core.validation import SettingError
from top1_jax.engine import streaming
from top1_jax.evaluation import crossval
from top1_jax.io import files, stream
from top1_jax.io import predictions as predictions_lib
from top1_jax.pipeline import jobs, tables
from top1_jax.pipeline.runs import is_writer
from top1_jax.pipeline.settings import Settings, fail


class Source:
  """One predictions file, its settings (``columns``, from its meta), scores and
  calibration/test splits. It is read and scored a chunk of examples at a time: memory
  holds the [N, K] log-probabilities and one chunk, never the file's [S, N, K] samples.
  """

  def __init__(self, name: str, path, settings: Settings, timings: dict):
    tic = time.perf_counter()
    self.name, self.slug, self.path = name, name.replace("/", "__"), path
    with (
      stream.PredictionsReader(path) as reader,
      concurrent.futures.ThreadPoolExecutor(1) as hashing,
    ):
      # The file's hash (which sweep points are reused) in a thread while its chunks are
      # read and scored: hashlib lets go of the GIL.
      digest = hashing.submit(reader.file_sha1)
      self.meta, self.labels = dict(reader.meta), reader.labels
      if max(settings.topk) > reader.num_classes:
        fail("topk", f"{max(settings.topk)} exceeds the {reader.num_classes} classes of {name}")
      num_samples = reader.num_samples or 1
      self.columns = tables.file_columns(self.meta, name, num_samples)
      if not isinstance(self.columns["seed"], int):
        # A user's file names no seed: the config's first draws its splits.
        self.columns["seed"] = settings.seeds[0]
      self.label = tables.row_label(self.columns)  # load_sources names mixed settings too
      # One network (not MC dropout or an ensemble): temperature scaling applies.
      sampled = self.columns["method"] in ("mc_dropout", "ensemble")
      self.single_model = num_samples == 1 and not sampled
      size = streaming.chunk_size(len(self.labels), num_samples, reader.num_classes)
      chunks = _timed(reader.chunks(size), timings, "load")
      timings["load"] = timings.get("load", 0.0) + time.perf_counter() - tic
      tic, before = time.perf_counter(), timings["load"]
      self.log_probs, self.scores, self.label_terms = streaming.from_chunks(
        chunks, len(self.labels), topk=settings.topk
      )
      waited = time.perf_counter()
      self.digest = digest.result()
      timings["load"] += time.perf_counter() - waited
    self.splits = crossval.make_splits(
      len(self.labels), settings.n_folds, self.columns["seed"], settings.scheme
    )
    read = timings["load"] - before  # the chunks' reads (and the hash) count as loading
    timings["scores"] = timings.get("scores", 0.0) + time.perf_counter() - tic - read

  def correct(self, k: int) -> np.ndarray:
    """[N] bool, the Top-k event, shared by every score's point (from the scores' pass)."""
    return self.label_terms.rank < k


def _timed(items, timings: dict, key: str):
  """``items``, with the seconds spent producing each added to ``timings[key]``."""
  iterator = iter(items)
  while True:
    tic = time.perf_counter()
    try:
      item = next(iterator)
    except StopIteration:
      return
    finally:
      timings[key] = timings.get(key, 0.0) + time.perf_counter() - tic
    yield item


def check_present(asked) -> None:
  """Raises FileNotFoundError naming the files of ``asked`` ((name, path) pairs) not there."""
  missing = [name for name, path in asked if not path.exists()]
  if missing:
    raise FileNotFoundError(
      f"predictions files not there: {', '.join(missing)}; run the predict stage "
      "(experiments/predict.py, top1-predict) or reproduce with this config first"
    )


def load_sources(asked, settings: Settings, timings: dict | None = None) -> list[Source]:
  """The predictions files ``asked`` ((name, path) pairs), checked to share their labels;
  ``timings`` (if given) accumulates the seconds of ``load`` and ``scores``."""
  timings = {} if timings is None else timings
  check_present(asked)
  sources = [Source(name, path, settings, timings) for name, path in asked]
  first = sources[0]
  for other in sources[1:]:
    if not np.array_equal(other.labels, first.labels):  # False too when their shapes differ
      raise SettingError(
        f"predictions: {other.name} and {first.name} have different labels "
        f"({other.labels.shape[0]} vs {first.labels.shape[0]} examples): files of different "
        "datasets, splits or example orders cannot share calibration splits"
      )
  mixed = tables.varying([source.columns for source in sources])
  for source in sources:
    source.label = tables.row_label(source.columns, mixed)
  return sources


def _given_files(settings: Settings, workdir) -> list[tuple[str, object]]:
  """``inputs``: predictions files (globs expanded), or one array made a predictions file."""
  if settings.single_input:  # one .npy array, with labels
    (array,) = settings.inputs
    path = workdir / "predictions" / f"{files.as_path(array).stem}.npz"
    if is_writer():
      kind = "array" if settings.input_kind == "auto" else settings.input_kind
      arrays = {kind: array}  # logits=..., probs=... or array=... (its rows say which)
      meta = {"dataset": settings.dataset} if settings.dataset else None
      predictions = predictions_lib.from_arrays(labels=settings.labels, meta=meta, **arrays)
      predictions_lib.save_predictions(path, predictions)
    return [(path.stem, path)]
  return expanded("inputs", settings.inputs)


SHIFTED = "shifted/"
"""The name prefix of a user's shifted files (``shift_inputs``)."""


def expanded(field: str, given) -> list[tuple[str, object]]:
  """(name, path) of every file a field's paths and globs name (``SettingError`` naming the
  field when one names nothing); shifted files are named ``shifted/<stem>``."""
  try:
    paths = files.expand(given)
  except FileNotFoundError as e:
    raise SettingError(f"{field}: {e}") from None
  prefix = SHIFTED if field == "shift_inputs" else ""
  return [(f"{prefix}{path.stem}", path) for path in paths]


def asked_files(settings: Settings, workdir) -> list[tuple[str, object]]:
  """(name, path) of every predictions file the settings ask for, in the sweep's order."""
  if settings.inputs:
    return _given_files(settings, workdir)
  points = jobs.training_points(settings)
  every = [job for point in points for job in jobs.prediction_jobs(settings, point)]
  return [(job.name, workdir / "predictions" / f"{job.name}.npz") for job in every]
