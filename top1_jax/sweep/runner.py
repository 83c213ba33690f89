"""A sweep over predictions files: every (file, score, Top-k event, estimator) cross-validated.

The engine of ``top1_jax.launch.evaluate``, usable on its own:

  sources = sweep.load_sources([("a", path_a), ("b", path_b)], settings)
  records = sweep.run(settings, sources, folder)      # one record per sweep point
  table1 = sweep.table1(settings, sources, records)  # the paper's Table 1
  chosen = sweep.selective_rows(settings, sources)   # selection with a guarantee

Table 1's baseline rows (``baselines``) and the selective rows need no sweep record: they
may run beside ``run``, then ``table1(settings, sources, records, baseline_rows)``.

``settings`` is anything with the attributes ``n_bins``, ``topk``, ``n_folds``,
``scheme``, ``seeds`` (the first draws the splits of files that name no seed),
``scores`` (``("all",)`` or names), ``estimators``, ``compare_bins``,
``ece_bins``, ``selective_targets`` and ``selective_delta`` (the launchers pass
``top1_jax.sweep.plan.Settings``). Every point's record is saved in ``folder``
(``<file>__<score>__top<k>[__<estimator>].json``) with its settings and the
file's hash, and reused when both match. A setting that does not fit the files
raises ``top1_jax.core.validation.SettingError``, whose message starts with the
setting's name.
"""

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.engine import streaming
from top1_jax.evaluation import comparison, crossval, selective
from top1_jax.io import files, stream
from top1_jax.sweep import tables


class Source:
  """One predictions file, its settings (``columns``), scores and calibration/test splits.

  The file is read a chunk of examples at a time (``io.stream``) and its scores
  computed chunk by chunk (``chunked``): memory holds the [N, K] log-probabilities
  and one chunk, never the file's [S, N, K] samples.
  """

  def __init__(self, name: str, path, settings: Any, timings: dict, chunk_size: int | None = None):
    tic = time.perf_counter()
    self.name, self.slug, self.path = name, name.replace("/", "__"), path
    with (
      stream.PredictionsReader(path) as reader,
      concurrent.futures.ThreadPoolExecutor(1) as hashing,
    ):
      # The file's hash (which sweep points are reused) in a thread while its chunks are
      # read and scored: hashlib lets go of the GIL (0.1-0.2 s for 200 MB here).
      digest = hashing.submit(reader.file_sha1)
      self.meta, self.labels = dict(reader.meta), reader.labels
      if max(settings.topk) > reader.num_classes:
        raise SettingError(
          f"topk: {max(settings.topk)} exceeds the {reader.num_classes} classes of {name}"
        )
      num_samples = reader.num_samples or 1
      self.columns = tables.file_columns(self.meta, name, num_samples)
      if not isinstance(self.columns["seed"], int):
        # A user's file names no seed: the config's first draws its splits.
        self.columns["seed"] = settings.seeds[0]
      self.label = tables.row_label(self.columns)  # load_sources names mixed settings too
      # One network (not MC dropout or an ensemble): temperature scaling applies.
      self.single_model = num_samples == 1 and self.columns["method"] not in (
        "mc_dropout",
        "ensemble",
      )
      size = chunk_size or streaming.chunk_size(len(self.labels), num_samples, reader.num_classes)
      chunks = _timed(reader.chunks(size), timings, "load")
      timings["load"] = timings.get("load", 0.0) + time.perf_counter() - tic
      tic = time.perf_counter()
      before = timings["load"]
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


def _requested_scores(settings: Any, sources: list[Source]) -> list[str]:
  available = {name for source in sources for name in source.scores}
  known = set(scores.REGISTRY)
  if settings.scores == ("all",):
    per_k = {scores.topk_name(k) for k in settings.topk}
    return [n for n in scores.REGISTRY if n in available or scores.REGISTRY[n].per_k] + sorted(
      available - known - per_k
    )
  unknown = [n for n in settings.scores if n not in available and n not in known]
  if unknown:
    raise SettingError(
      f"scores: unknown score(s) {', '.join(unknown)}; known: "
      f"{', '.join(scores.REGISTRY)} and the files' stored scores "
      f"{', '.join(sorted(available - known)) or '(none)'}"
    )
  return list(settings.scores)


def _points(settings: Any, sources: list[Source]) -> list[tuple]:
  requested = _requested_scores(settings, sources)
  points = []
  for estimator in settings.estimators:
    for source in sources:
      for k in settings.topk:
        for score in requested:
          point = (source, scores.for_event(score, k), k, estimator)
          if point[1] in source.scores and point not in points:
            points.append(point)
  if not points:
    raise SettingError(
      f"scores: none of {', '.join(requested)} is available in the predictions files"
    )
  return points


def _sweep_point(
  settings, source: Source, score: str, k: int, estimator: str, folder, write
) -> dict:
  """One point's cross-validation, or the saved one when its settings and file match."""
  name = f"{source.slug}__{score}__top{k}" + ("" if estimator == "bins" else f"__{estimator}")
  path = folder / f"{name}.json"
  expected = {
    "n_bins": list(settings.n_bins),
    "n_folds": settings.n_folds,
    "scheme": settings.scheme,
    "seed": source.columns["seed"],
    "file_sha1": source.digest,
  }
  saved = files.read_json(path)
  if saved is not None and saved.get("settings") == expected:
    return {**saved, "reused": True}
  known = scores.lookup(score)
  cv = crossval.cross_validate(
    source.scores[score],
    source.correct(k),
    settings.n_bins,
    splits=source.splits,
    estimator=estimator,
    increasing=known is not None and known.confident_when_high,
  )
  record = {
    "settings": expected,
    "file": str(source.path),
    "source": source.name,
    "columns": source.columns,
    "score": score,
    "topk": k,
    "estimator": estimator,
    "rows": cv.rows(),
    "per_fold": cv.per_fold_lists(),
  }
  if write:
    files.write_json(path, record)
  return record


def run(
  settings: Any,
  sources: list[Source],
  folder,
  *,
  write: bool = True,
  log: Callable[[str], Any] = print,
) -> list[dict]:
  """Every sweep point of ``sources``: cross-validated, or reused from ``folder``.

  Args:
    settings: the settings (module docstring).
    sources: ``load_sources``.
    folder: where each point's record is saved and looked up (a path or ``epath``).
    write: save new records (False on processes that must not write).
    log: receives one progress line per computed point and a summary.

  Returns:
    One record per point (file, score, k, estimator): ``settings``, ``file``,
    ``source``, ``columns`` (the file's, ``tables.file_columns``), ``score``,
    ``topk``, ``estimator``, ``rows`` (``CrossValidation.rows()``) and ``per_fold``.
  """
  points = _points(settings, sources)
  num = len(sources[0].labels)
  log(
    f"evaluate: {len(sources)} file(s), {num:,} examples, {len(points)} sweep points x bins "
    f"{','.join(map(str, settings.n_bins))} x {settings.n_folds} {settings.scheme} splits"
  )
  records, reused, start = [], 0, time.perf_counter()
  for index, point in enumerate(points, 1):
    tic = time.perf_counter()
    records.append(_sweep_point(settings, *point, folder, write))
    if records[-1].pop("reused", False):
      reused += 1
      continue
    row, (source, score, k, estimator) = records[-1]["rows"][0], point
    log(
      f"  [{index}/{len(points)}] {source.label} {score} Top-{k} {estimator}: Brier "
      f"{row['brier']:.4f} ECE {row['ece']:.4f} ({row['n_bins']} bins) in "
      f"{time.perf_counter() - tic:.2f} s"
    )
  done = f" ({reused} point(s) done already, skipped)" if reused else ""
  log(f"evaluate: sweep finished in {time.perf_counter() - start:.1f} s{done}")
  return records


def _check_sources(sources: list[Source]) -> None:
  first = sources[0]
  for other in sources[1:]:
    if other.labels.shape != first.labels.shape or not np.array_equal(other.labels, first.labels):
      raise SettingError(
        f"predictions: {other.name} and {first.name} have different labels "
        f"({other.labels.shape[0]} vs {first.labels.shape[0]} examples): files of different "
        "datasets, splits or example orders cannot share calibration splits"
      )


def check_present(asked) -> None:
  """Raises FileNotFoundError naming the files of ``asked`` ((name, path) pairs) not there."""
  missing = [name for name, path in asked if not path.exists()]
  if missing:
    raise FileNotFoundError(
      f"predictions files not there: {', '.join(missing)}; run top1_jax.launch.predict (or "
      "reproduce) with this config first"
    )


def load_sources(asked, settings: Any, timings: dict | None = None) -> list[Source]:
  """The predictions files ``asked`` ((name, path) pairs), checked to share their labels.

  ``timings`` (if given) accumulates the seconds of ``load`` and ``scores``.
  """
  timings = {} if timings is None else timings
  check_present(asked)
  sources = [Source(name, path, settings, timings) for name, path in asked]
  _check_sources(sources)
  mixed = tables.varying([source.columns for source in sources])
  for source in sources:
    source.label = tables.row_label(source.columns, mixed)
  return sources


def baselines(settings: Any, sources: list[Source]) -> dict[str, list[dict]]:
  """Table 1's ``comparison.baseline_rows`` of each file whose headline score the sweep
  bins at Top-1, by file name. They need no sweep record, so they may be computed
  beside ``run`` (``top1_jax.launch.evaluate`` does, in a thread)."""
  points = _points(settings, sources)
  out = {}
  for source in sources:
    score = scores.headline(source.scores)
    if score is None or (source, score, 1, "bins") not in points:
      continue
    out[source.name] = comparison.baseline_rows(
      source.log_probs, source.labels, source.splits, single_model=source.single_model,
      ece_bins=settings.ece_bins, label_terms=source.label_terms,
    )  # fmt: skip
  return out


def table1(
  settings: Any, sources: list[Source], records: list[dict], baseline_rows: dict | None = None
) -> list[dict]:
  """The paper's Table 1 for each file's headline score (``top1_jax.sweep.comparison``): the
  ``baselines`` (computed here when not given) beside the Top-1 bins' records."""
  baseline_rows = baselines(settings, sources) if baseline_rows is None else baseline_rows
  binned = {
    (r["source"], r["score"]): next(
      row for row in r["rows"] if row["n_bins"] == settings.compare_bins
    )
    for r in records
    if r["topk"] == 1 and r["estimator"] == "bins"
  }
  rows = []
  for source in sources:
    score = scores.headline(source.scores)
    if source.name not in baseline_rows or (source.name, score) not in binned:
      continue
    for row in baseline_rows[source.name]:
      row = comparison.table_row(row, binned[(source.name, score)])
      label = tables.variant_label(source.label, row["variant"])
      rows.append({"label": label, "source": source.name, "top1_score": score, **row})
      rows[-1].update(top1_n_bins=settings.compare_bins, ece_bins=settings.ece_bins)
  return rows


def selective_rows(settings: Any, sources: list[Source]) -> list[dict]:
  """Selective prediction with a guarantee from each file's headline-score bins (Top-1)."""
  rows = []
  for source in sources:
    score = scores.headline(source.scores)
    if score is None:
      continue
    known = scores.lookup(score)
    order = "descending" if known is not None and known.confident_when_high else "ascending"
    for row in selective.validate_over_splits(
      np.asarray(source.scores[score]), source.correct(1), source.splits,
      n_bins=settings.compare_bins, targets=settings.selective_targets,
      delta=settings.selective_delta, order=order,
    ):  # fmt: skip
      rows.append({"label": source.label, "source": source.name, "score": score, **row})
  return rows
