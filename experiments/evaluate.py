r"""Sweeps scores x bin counts x Top-k events over predictions files; writes the results.

  python -m experiments.evaluate --workdir=runs/fmnist            # the work dir's files
  python -m experiments.evaluate --workdir=out --predictions=a.npz,b.npz \
      --scores=pmax,entropy --n_bins=10,20,100 --topk=1,5 --n_folds=10
  top1-evaluate --workdir=out --probs=probs.npy --labels=labels.npy   # plain arrays

Every (file, score, event) is one sweep point: all bin counts and splits are
computed together by ``top1_jax.crossval.cross_validate`` on the same random
splits for every point, and saved to ``sweep/<point>.json``; a rerun skips points
that are done. Then ``results.json`` / ``.csv`` / ``.md`` and ``figures/`` are
written from all points.
"""

import hashlib
import pathlib
import time
from typing import NamedTuple

import numpy as np
from absl import flags

from experiments import common, report
from top1_jax import baselines, binning, crossval, events, metrics, scores, selective, toplabel
from top1_jax.io import files
from top1_jax.io import predictions as predictions_lib

PREDICTIONS = flags.DEFINE_list(
  "predictions", None, "Predictions files (.npz); default: every file in <workdir>/predictions."
)
LOGITS = flags.DEFINE_string(
  "logits",
  None,
  "A .npy of [N, K] logits or [S, N, K] samples, with --labels (no predictions file).",
)
PROBS = flags.DEFINE_string(
  "probs", None, "A .npy of [N, K] probabilities or [S, N, K] sample probabilities, with --labels."
)
LABELS = flags.DEFINE_string("labels", None, "A .npy of [N] integer labels, for --logits/--probs.")
SCORES = flags.DEFINE_list(
  "scores",
  ["all"],
  "Scores to sweep: all, or names among " + ", ".join(scores.REGISTRY) + " and any stored "
  "score_<name> (neg_log_topk_mass means -log of the top-k mass for each Top-k event).",
)
N_BINS = flags.DEFINE_list("n_bins", ["10", "20", "100"], "Bin counts.")
ESTIMATORS = flags.DEFINE_list(
  "estimators",
  ["bins"],
  "Estimators of P(correct | U) to cross-validate: bins (the paper), isotonic, kde; "
  "ECE, EOR and AUROC of all of them use the same quantile bins (--n_bins).",
)
TOPK = flags.DEFINE_list("topk", ["1", "2"], "Events: the Top-k prediction is correct, for each k.")
N_FOLDS = flags.DEFINE_integer("n_folds", 10, "Calibration/test splits.")
SCHEME = flags.DEFINE_enum("scheme", "halves", crossval.SCHEMES, "halves (paper) or kfold.")
FIGURE_BINS = flags.DEFINE_integer("figure_bins", 20, "Bins in the per-bin figures.")
COMPARE_BINS = flags.DEFINE_integer(
  "compare_bins",
  20,
  "Top-1 bins in the comparison with the benchmark methods: one of --n_bins (the default, "
  "if not among them, becomes the first of them, with a line saying so).",
)
ECE_BINS = flags.DEFINE_integer(
  "ece_bins", baselines.DEFAULT_ECE_BINS, "Equal-width bins of the benchmark's confidence ECE."
)
SELECTIVE_TARGETS = flags.DEFINE_list(
  "selective_targets",
  ["0.9", "0.95", "0.99"],
  "Top-1 accuracies that selective prediction guarantees from the headline score's bins "
  "(--compare_bins bins fitted on each calibration part).",
)
SELECTIVE_DELTA = flags.DEFINE_float(
  "selective_delta", 0.05, "Failure probability of the selective guarantee, in (0, 0.5)."
)
MAX_FOLDS = 127  # crossval.make_splits stores a split's fold in an int8


class Source:
  """One predictions file and the scores it supports."""

  def __init__(self, path: pathlib.Path, topk: tuple[int, ...]):
    self.path = path
    self.name = path.stem
    predictions = predictions_lib.load_predictions(path)
    self.meta = dict(predictions.meta)
    self.labels = np.asarray(predictions.labels)
    # One network (no samples, not MC dropout or an ensemble): temperature scaling applies.
    self.single_model = (predictions.num_samples or 1) == 1 and self.meta.get("method") not in (
      "mc_dropout",
      "ensemble",
    )
    if max(topk) > predictions.num_classes:
      raise common.ExperimentError(
        f"--topk: {max(topk)} exceeds the {predictions.num_classes} classes of {path.name}"
      )
    self.log_probs, self.scores = scores.from_predictions(
      logits=predictions.logits,
      mean_probs=predictions.mean_probs,
      stored_scores=predictions.scores,
      human_probs=predictions.human_probs,
      topk=topk,
      labels=predictions.labels,  # for the oracle row
    )
    with open(path, "rb") as f:
      self.digest = hashlib.sha1(f.read()).hexdigest()

  def label(self) -> str:
    method = self.meta.get("method")
    if method == "deterministic":
      return "model"
    if method == "mc_dropout":
      return f"dropout {self.meta.get('dropout_rate', 0):g}"
    if method == "ensemble":
      return f"ensemble ({self.meta.get('ensemble_size', '?')})"
    return self.name


def _check_inputs() -> None:
  """--predictions, or --logits/--probs with --labels: a valid combination of existing files."""
  array_flag = "logits" if LOGITS.value else "probs" if PROBS.value else None
  if LOGITS.value and PROBS.value:
    raise common.ExperimentError("--logits, --probs: give one of them, not both")
  if array_flag and PREDICTIONS.value:
    raise common.ExperimentError("--predictions: give either predictions files or --logits/--probs")
  if array_flag and not LABELS.value:
    raise common.ExperimentError(f"--labels: required with --{array_flag}")
  if LABELS.value and not array_flag:
    raise common.ExperimentError("--labels: goes with --logits or --probs")
  given = {"predictions": PREDICTIONS.value or []}
  for flag in (LOGITS, PROBS, LABELS):
    given[flag.name] = [flag.value] if flag.value else []
  for name, values in given.items():
    paths = [pathlib.Path(v).expanduser() for v in values if files.is_local(v)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
      raise common.ExperimentError(f"--{name}: no such file: {', '.join(missing)}")


def _file_from_arrays() -> pathlib.Path:
  """--logits/--probs and --labels as a predictions file in the work dir (its name: the array's)."""
  array = LOGITS.value or PROBS.value
  predictions = predictions_lib.from_arrays(
    labels=LABELS.value, logits=LOGITS.value, probs=PROBS.value
  )
  path = common.workdir() / "predictions" / f"{pathlib.Path(array).stem}.npz"
  predictions_lib.save_predictions(path, predictions)
  common.say(f"evaluate: {array} and {LABELS.value} -> {path}")
  return path


def _files() -> list[pathlib.Path]:
  """The predictions files to sweep (``check_settings`` has checked the flags naming them)."""
  if LOGITS.value or PROBS.value:
    return [_file_from_arrays()]
  if PREDICTIONS.value:
    return [pathlib.Path(p).expanduser() for p in PREDICTIONS.value]
  folder = common.workdir() / "predictions"
  paths = sorted(folder.glob("*.npz"), key=_file_order)
  if not paths:
    raise common.ExperimentError(
      f"--predictions: none given and no .npz files in {folder}; run experiments.predict first"
    )
  return paths


def _file_order(path: pathlib.Path):
  name = path.stem
  if name == "deterministic":
    return (0, 0.0, name)
  if name.startswith("dropout_"):
    try:
      return (1, float(name.split("_", 1)[1]), name)
    except ValueError:
      pass
  if name == "ensemble":
    return (2, 0.0, name)
  return (3, 0.0, name)


def _check_sources(sources: list[Source]) -> None:
  first = sources[0]
  for other in sources[1:]:
    if other.labels.shape != first.labels.shape or not np.array_equal(other.labels, first.labels):
      raise common.ExperimentError(
        f"--predictions: {other.path.name} and {first.path.name} have different labels "
        f"({other.labels.shape[0]} vs {first.labels.shape[0]} examples): files of different "
        "datasets, splits or example orders cannot share calibration splits"
      )
  if flags.FLAGS["dataset"].present:
    for source in sources:
      saved = source.meta.get("dataset")
      if saved is not None and saved != common.DATASET.value:
        raise common.ExperimentError(
          f"--predictions: {source.path.name} is of dataset {saved!r}, not --dataset="
          f"{common.DATASET.value}"
        )


def _requested_scores(sources: list[Source], topk: tuple[int, ...]) -> list[str]:
  available = {name for s in sources for name in s.scores}
  known = set(scores.REGISTRY)
  if SCORES.value == ["all"]:
    return [n for n in scores.REGISTRY if n in available or scores.REGISTRY[n].per_k] + sorted(
      available - known - {scores.topk_name(k) for k in topk}
    )
  unknown = [n for n in SCORES.value if n not in available and n not in known]
  if unknown:
    raise common.ExperimentError(
      f"--scores: unknown score(s) {', '.join(unknown)}; known: "
      f"{', '.join(scores.REGISTRY)} and the files' stored scores "
      f"{', '.join(sorted(available - known)) or '(none)'}"
    )
  return list(SCORES.value)


def settings(n_bins) -> dict:
  """What a sweep point's numbers depend on besides its file, score, k and estimator."""
  return {
    "n_bins": list(n_bins),
    "n_folds": N_FOLDS.value,
    "scheme": SCHEME.value,
    "seed": common.SEED.value,
  }


class Settings(NamedTuple):
  """The evaluate flags, parsed and checked by ``check_settings``."""

  n_bins: tuple[int, ...]
  topk: tuple[int, ...]
  compare_bins: int
  estimators: tuple[str, ...] = ("bins",)
  selective_targets: tuple[float, ...] = (0.9, 0.95, 0.99)
  selective_delta: float = 0.05


def _check_selective() -> tuple[tuple[float, ...], float]:
  """--selective_targets (accuracies in (0, 1), each once, ascending) and --selective_delta."""
  targets = common.parse_floats("selective_targets", SELECTIVE_TARGETS.value, 0.0, 1.0)
  if min(targets) <= 0.0:
    raise common.ExperimentError(
      f"--selective_targets: expected accuracies in (0, 1), got {','.join(SELECTIVE_TARGETS.value)}"
    )
  if not 0.0 < SELECTIVE_DELTA.value < 0.5:
    raise common.ExperimentError(
      f"--selective_delta: expected a probability in (0, 0.5), got {SELECTIVE_DELTA.value}"
    )
  return tuple(sorted(set(targets))), SELECTIVE_DELTA.value


def check_settings() -> Settings:
  """Every evaluate flag that can be checked without the predictions, before anything is loaded.

  The ones that depend on the test examples are ``check_examples`` and
  ``check_classes``: called as soon as N and K are known (by reproduce, before
  training).
  """
  common.workdir()  # required
  n_bins = common.parse_ints("n_bins", N_BINS.value)
  topk = common.parse_ints("topk", TOPK.value)
  if N_FOLDS.value < 2:
    raise common.ExperimentError(f"--n_folds: expected at least 2, got {N_FOLDS.value}")
  if N_FOLDS.value > MAX_FOLDS:
    raise common.ExperimentError(f"--n_folds: expected at most {MAX_FOLDS}, got {N_FOLDS.value}")
  if common.SEED.value < 0:  # NumPy's generators take seeds >= 0
    raise common.ExperimentError(f"--seed: expected an integer >= 0, got {common.SEED.value}")
  for flag in (FIGURE_BINS, ECE_BINS):
    if flag.value < 1:
      raise common.ExperimentError(f"--{flag.name}: expected at least 1, got {flag.value}")
  if not SCORES.value or ("all" in SCORES.value and SCORES.value != ["all"]):
    raise common.ExperimentError(
      f"--scores: expected 'all' alone or score names, got {','.join(SCORES.value) or '(none)'}"
    )
  compare_bins = COMPARE_BINS.value
  if compare_bins not in n_bins:
    if flags.FLAGS["compare_bins"].present:
      raise common.ExperimentError(
        f"--compare_bins: {compare_bins} is not one of --n_bins={','.join(map(str, n_bins))}; "
        "the comparison reuses the sweep's bins"
      )
    # Only the default adapts to --n_bins (with a word); a value asked for is never replaced.
    common.say(
      f"evaluate: --compare_bins={compare_bins} (the default) is not one of --n_bins="
      f"{','.join(map(str, n_bins))}; the benchmark comparison uses {n_bins[0]} bins"
    )
    compare_bins = n_bins[0]
  unknown = [e for e in ESTIMATORS.value if e not in crossval.ESTIMATORS]
  if unknown or not ESTIMATORS.value:
    raise common.ExperimentError(
      f"--estimators: expected names among {', '.join(crossval.ESTIMATORS)}, got "
      f"{','.join(ESTIMATORS.value) or '(none)'}"
    )
  targets, delta = _check_selective()
  _check_inputs()
  estimators = tuple(dict.fromkeys(ESTIMATORS.value))
  return Settings(n_bins, topk, compare_bins, estimators, targets, delta)


def smallest_calibration(num_examples: int) -> int:
  """The fewest calibration examples of any split of ``num_examples`` (crossval.make_splits)."""
  folds = 2 if SCHEME.value == "halves" else N_FOLDS.value
  return num_examples - -(-num_examples // folds)


def check_examples(settings: Settings, num_examples: int, what: str = " examples") -> int:
  """The bin counts and splits against N test examples; returns the figures' bin count.

  ``what`` says where N comes from (e.g. `` (--limit_test=1200)``).
  """
  if N_FOLDS.value > num_examples:
    raise common.ExperimentError(
      f"--n_folds: {N_FOLDS.value} splits need at least that many examples; there are "
      f"{num_examples}{what}"
    )
  smallest = smallest_calibration(num_examples)
  if max(settings.n_bins) > smallest:
    raise common.ExperimentError(
      f"--n_bins: {max(settings.n_bins)} bins need at least that many calibration examples; a "
      f"split has {smallest} of the {num_examples}{what}"
    )
  if FIGURE_BINS.value <= smallest:
    return FIGURE_BINS.value
  if flags.FLAGS["figure_bins"].present:
    raise common.ExperimentError(
      f"--figure_bins: {FIGURE_BINS.value} bins need at least that many calibration examples; "
      f"a split has {smallest} of the {num_examples}{what}"
    )
  return smallest  # the default adapts; run_stage says so


def check_classes(settings: Settings, num_classes: int, what: str) -> None:
  if max(settings.topk) > num_classes:
    raise common.ExperimentError(
      f"--topk: {max(settings.topk)} exceeds the {num_classes} classes of {what}"
    )


def run_stage(checked: Settings | None = None) -> dict:
  checked = check_settings() if checked is None else checked
  n_bins, topk = checked.n_bins, checked.topk
  out_dir = common.workdir()
  sources = [Source(path, topk) for path in _files()]
  _check_sources(sources)
  num_examples = sources[0].labels.shape[0]
  figure_bins = check_examples(checked, num_examples)
  if figure_bins != FIGURE_BINS.value:
    common.say(
      f"evaluate: --figure_bins={FIGURE_BINS.value} (the default) is more than a split's "
      f"{figure_bins} calibration examples; the figures use {figure_bins} bins"
    )
  requested = _requested_scores(sources, topk)
  splits = crossval.make_splits(num_examples, N_FOLDS.value, common.SEED.value, SCHEME.value)
  config = settings(n_bins)

  points = []
  for estimator in checked.estimators:
    for source in sources:
      for k in topk:
        for score in requested:
          point = (source, scores.for_event(score, k), k, estimator)
          if point[1] in source.scores and point not in points:
            points.append(point)
  if not points:
    raise common.ExperimentError(
      f"--scores: none of {', '.join(requested)} is available in the predictions files"
    )
  common.say(
    f"evaluate: {len(sources)} file(s), {num_examples:,} examples, {len(points)} sweep points "
    f"x bins {','.join(map(str, n_bins))} x {N_FOLDS.value} {SCHEME.value} splits"
  )
  results = []
  reused = 0
  start = time.perf_counter()
  for index, (source, score, k, estimator) in enumerate(points, 1):
    point = f"{source.name}__{score}__top{k}" + ("" if estimator == "bins" else f"__{estimator}")
    path = out_dir / "sweep" / f"{point}.json"
    saved = common.read_json(path)
    expected = {**config, "file_sha1": source.digest}
    if saved is not None and saved.get("settings") == expected:
      results.append(saved)
      reused += 1
      continue
    correct = events.topk_correct(source.log_probs, source.labels, k)
    tic = time.perf_counter()
    known = scores.lookup(score)
    cv = crossval.cross_validate(
      source.scores[score],
      correct,
      n_bins,
      splits=splits,
      estimator=estimator,
      increasing=known is not None and known.confident_when_high,
    )
    record = {
      "settings": expected,
      "file": str(source.path),
      "source": source.name,
      "method": source.label(),
      "meta": source.meta,
      "score": score,
      "topk": k,
      "estimator": estimator,
      "rows": cv.rows(),
      "per_fold": cv.per_fold_lists(),
    }
    common.write_json(path, record)
    results.append(record)
    common.say(
      f"  [{index}/{len(points)}] {source.label()} {score} Top-{k} {estimator}: "
      f"Brier {cv.mean['brier'][0]:.4f} ECE {cv.mean['ece'][0]:.4f} ({n_bins[0]} bins) "
      f"in {time.perf_counter() - tic:.2f} s"
    )
  common.say(
    f"evaluate: sweep finished in {time.perf_counter() - start:.1f} s"
    + (f" ({reused} point(s) done already, skipped)" if reused else "")
  )
  # Table 1 and the figures are the paper's: of the bins.
  binned = [r for r in results if r.get("estimator", "bins") == "bins"]
  comparison = benchmark_comparison(sources, binned, splits, checked.compare_bins)
  chosen = selective_prediction(
    sources, splits, checked.compare_bins, checked.selective_targets, checked.selective_delta
  )
  summary = report.write_results(out_dir, results, config, topk, comparison, chosen)
  report.write_figures(out_dir, sources, binned, splits, n_bins, topk, figure_bins)
  report.write_risk_coverage_figures(out_dir, sources, splits, chosen)
  return summary


def benchmark_comparison(sources, results, splits, compare_bins: int) -> list[dict]:
  """The paper's Table 1, on the same test halves: benchmark metrics vs Top-1 binning.

  For every classifier: the benchmark's multiclass Brier and confidence ECE
  (equal-width bins of max-softmax), the binary Top-1 Brier / ECE of its raw
  max-softmax used directly as P(correct) (the like-for-like baseline), and Top-1
  binning's Brier / ECE at ``compare_bins`` bins. For every single model (no
  samples), temperature scaling (T fitted on each calibration half) adds a row;
  its Top-1 bins equal the plain model's, since scaling preserves the order of pmax.
  So does top-label binning (Gupta & Ramdas: ``compare_bins`` bins of pmax per
  predicted class, ``toplabel.fit`` on each calibration half): its Top-1 Brier and
  its equal-width ECE (the benchmark's ECE of its P(correct)) fill the binned cells.
  """
  ece_bins = ECE_BINS.value
  binned = {
    (r["source"], r["score"]): next(row for row in r["rows"] if row["n_bins"] == compare_bins)
    for r in results
    if r["topk"] == 1
  }
  rows = []
  for source in sources:
    score = scores.headline(source.scores)
    if score is None or (source.name, score) not in binned:
      continue
    variants = ("raw", "temperature", "toplabel") if source.single_model else ("raw",)
    for variant in variants:
      per_split = [
        _split_metrics(source, variant, splits.test_mask(f), ece_bins, compare_bins)
        for f in range(splits.num_splits)
      ]
      row = {k: float(np.mean([p[k] for p in per_split])) for k in per_split[0]}
      rows.append(_comparison_row(source, variant, score, row, binned[(source.name, score)]))
      rows[-1].update(top1_n_bins=compare_bins, ece_bins=ece_bins)
  return rows


def _split_metrics(source, variant: str, test, ece_bins: int, compare_bins: int) -> dict:
  """One split's metrics of a comparison row (``variant``: raw, temperature, toplabel)."""
  test = np.asarray(test)
  log_probs = np.asarray(source.log_probs)
  temperature = 1.0
  if variant == "temperature":
    temperature = float(baselines.fit_temperature(log_probs[~test], source.labels[~test]))
    log_probs = np.asarray(baselines.apply_temperature(log_probs, temperature))
  probs = np.exp(log_probs - log_probs.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  labels, pmax, predicted = source.labels, probs.max(1), probs.argmax(1)
  correct = predicted == labels
  out = {
    "multiclass_brier": float(baselines.multiclass_brier(labels[test], probs=probs[test])),
    "confidence_ece": float(
      baselines.confidence_ece(labels[test], probs=probs[test], n_bins=ece_bins)
    ),
    "raw_top1_brier": float(metrics.brier(pmax[test], correct[test])),
    "temperature": temperature,
  }
  if variant == "toplabel":
    cal = ~test
    model = toplabel.fit(
      pmax[cal], predicted[cal], correct[cal], compare_bins, num_classes=probs.shape[1]
    )
    prob = toplabel.predict(model, pmax[test], predicted[test])
    out["toplabel_brier"] = float(metrics.brier(prob, correct[test]))
    out["toplabel_ece"] = float(baselines.equal_width_ece(prob, correct[test], ece_bins))
    out["toplabel_classes_with_own_bins"] = float(np.sum(np.asarray(model.own)))
  return out


def _comparison_row(source, variant: str, score: str, row: dict, top1: dict) -> dict:
  """A Table-1 row: the method's name, its benchmark metrics and its Top-1 binned ones."""
  name = source.label()
  if variant == "temperature":
    name = "temperature scaling" if name == "model" else f"{name} + temperature scaling"
  elif variant == "toplabel":
    name = "top-label binning" if name == "model" else f"{name} + top-label binning"
  elif name == "model":
    name = "Vanilla (model)"
  binned = {"top1_binned_brier": top1["brier"], "top1_binned_ece": top1["ece"]}
  if variant == "toplabel":
    binned = {
      "top1_binned_brier": row.pop("toplabel_brier"),
      "top1_binned_ece": row.pop("toplabel_ece"),
      "multiclass_brier": None,  # it predicts P(correct) only, not a class distribution
    }
  estimator = "toplabel" if variant == "toplabel" else "bins"
  return {
    "method": name,
    "source": source.name,
    "top1_score": score,
    "top1_estimator": estimator,
    **row,
    **binned,
  }


def selective_prediction(sources, splits, n_bins: int, targets, delta: float) -> list[dict]:
  """Selection with a guarantee from each file's headline-score bins, Top-1 event.

  On each split: ``n_bins`` bins fitted on the calibration part, the largest set
  of most-confident bins whose accuracy is >= each target with probability
  1 - delta (``selective.guaranteed_coverage``, Geifman & El-Yaniv's SGR), applied
  to the test part (``selective.select``). One row per (file, target): means over
  splits (the guaranteed and test accuracies over the splits that selected some
  examples), and every split's numbers under ``per_split``.
  """
  rows = []
  for source in sources:
    score = scores.headline(source.scores)
    if score is None:
      continue
    known = scores.lookup(score)
    order = "descending" if known is not None and known.confident_when_high else "ascending"
    u = np.asarray(source.scores[score])
    correct = np.asarray(events.topk_correct(source.log_probs, source.labels, 1))
    per_target = {target: [] for target in targets}
    for f in range(splits.num_splits):
      test = np.asarray(splits.test_mask(f))
      bins = binning.fit(u[~test], correct[~test], n_bins)
      for target in targets:
        selection = selective.guaranteed_coverage(bins, target, delta, order=order)
        chosen = np.asarray(selective.select(selection, u[test]))
        per_target[target].append(_selected(selection, chosen, correct[test]))
    for target, per_split in per_target.items():
      base = {"method": source.label(), "source": source.name, "score": score, "order": order}
      rows.append(
        {
          **base,
          **_selective_means(per_split),
          "target_accuracy": target,
          "delta": delta,
          "n_bins": n_bins,
          "num_below_target": sum(
            p["test_accuracy"] is not None and p["test_accuracy"] < target for p in per_split
          ),
          "per_split": per_split,
        }
      )
  return rows


def _selected(selection: selective.Selection, chosen: np.ndarray, correct: np.ndarray) -> dict:
  """One split's selection: its bound, and its coverage and accuracy on the test part."""
  bound = float(selection.guaranteed_accuracy)
  kept = int(chosen.sum())
  return {
    "guaranteed_accuracy": bound if np.isfinite(bound) else None,
    "calibration_coverage": float(selection.coverage),
    "test_coverage": kept / chosen.shape[0],
    "test_accuracy": float(correct[chosen].mean()) if kept else None,
  }


def _selective_means(per_split: list[dict]) -> dict:
  def mean(key):
    values = [p[key] for p in per_split if p[key] is not None]
    return float(np.mean(values)) if values else None

  keys = ("guaranteed_accuracy", "calibration_coverage", "test_coverage", "test_accuracy")
  return {
    **{key: mean(key) for key in keys},
    "num_splits": len(per_split),
    "num_empty": sum(p["guaranteed_accuracy"] is None for p in per_split),
  }


# Flags shared with the other stages that evaluate has no use for: its examples are
# the predictions files' (predict applies these), so a value here would be ignored.
NOT_FOR_EVALUATE = ("data_dir", "limit_train", "limit_test")


def main(argv):
  del argv
  for name in NOT_FOR_EVALUATE:
    if flags.FLAGS[name].present:
      raise common.ExperimentError(
        f"--{name}: evaluate reads the examples of its predictions files, so this would be "
        "ignored; it belongs to experiments.predict or reproduce"
      )
  run_stage(check_settings())


if __name__ == "__main__":
  common.run(main)
