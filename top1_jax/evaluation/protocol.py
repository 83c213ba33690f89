"""The evaluation protocol: fit each method on a clean set's calibration parts, score test parts.

Brier and NLL are per-example means of the test predictions; ECE, EOR, AUROC and the
decompositions use equal-count bins of U fitted on the calibration part, each bin's
prediction its mean test prediction (an empty bin: the calibration accuracy). An estimator's
fast path (``cross_validate``, ``fit_splits``), taken for a set scored on its own test
parts, agrees with the loop to float rounding.
"""

from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, equal_width, events, metrics, validation
from top1_jax.core import scores as score_registry
from top1_jax.core.splits import METRICS, CrossValidation, Splits
from top1_jax.estimators import base, registry
from top1_jax.kernels import compile_policy

OWN = "own"
"""The key of a set scored on its own test parts (no ``test_sets``)."""


class Inputs(NamedTuple):
  """One set of N examples: log_probs [N, K] (or logits), labels [N] int (None for unlabelled
  inputs) and scores, name -> [N] float uncertainty scores U."""

  log_probs: ArrayLike
  labels: ArrayLike | None
  scores: Mapping[str, ArrayLike]


class Method(NamedTuple):
  """One method: an estimator, the score U it is fitted on (or binned by), its options.

  ``per_bin_count``: fitted at each reported bin count (its ``n_bins`` is not in ``options``).
  ``update``: with ``refit_on``, None refits the estimator on those examples alone; else
  ``update(state, evidence) -> state`` takes them into the clean fit (its prior).
  """

  estimator: str
  score: str
  options: Mapping[str, Any] = MappingProxyType({})
  per_bin_count: bool = False
  update: Callable[[Any, base.Evidence], Any] | None = None

  @property
  def entry(self) -> base.Estimator:
    return registry.lookup(self.estimator)


class Result(NamedTuple):
  """One method's ``CrossValidation`` of ``METRICS`` on one test set (``OWN``: its own test
  parts). ``extras``: name -> [F], ``confidence_ece`` (with ``ece_bins``) and what an
  estimator's ``fit_splits`` reports (per example: its test part's mean)."""

  score: str
  estimator: str
  test_set: Hashable
  metrics: CrossValidation
  extras: dict[str, np.ndarray]


class Data(NamedTuple):
  """One checked set on the host: correct [N] bool (None without labels), scores name
  -> [N], log_probs [N, K] and labels [N] int (None where not given)."""

  correct: np.ndarray | None
  scores: Mapping[str, np.ndarray]
  log_probs: np.ndarray | None = None
  labels: np.ndarray | None = None


def methods(
  estimators: Sequence[str],
  scores: Sequence[str],
  log_probs_score: str | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
  bin_count: int | None = None,
) -> list[Method]:
  """Every (method, score) pair, estimators in order, then scores.

  An estimator on U is fitted on each of ``scores``; one on the log-probabilities is binned
  by ``log_probs_score``. ``bin_count``: the ``n_bins`` of estimators whose ``options`` do
  not set it (None: fitted at every reported bin count).
  """
  entries = [registry.lookup(name) for name in _names("estimators", estimators, "estimator")]
  if not entries:
    raise ValueError("estimators: expected at least one method, got none")
  options = {} if options is None else options
  known = {entry.name for entry in entries}
  unknown = sorted(set(options) - known, key=str) if isinstance(options, Mapping) else []
  if not isinstance(options, Mapping) or unknown:
    got = f"{unknown[0]!r}, not among the estimators" if unknown else repr(options)
    raise ValueError(f"options: expected a mapping of method name -> its options, got {got}")
  scores = _names("scores", scores, "score")
  if any(entry.scores_only for entry in entries) and not scores:
    raise ValueError("scores: expected at least one score name for the estimators on U, got none")
  if not all(entry.scores_only for entry in entries) and not isinstance(log_probs_score, str):
    needs = next(entry.name for entry in entries if not entry.scores_only)
    raise ValueError(f"log_probs_score: {needs!r} needs a score to bin by, got {log_probs_score!r}")
  return [
    method(entry.name, score, options.get(entry.name, {}), bin_count)
    for entry in entries
    for score in (scores if entry.scores_only else (log_probs_score,))
  ]


def method(estimator: str, score: str, options: Mapping[str, Any], bin_count=None) -> Method:
  """One ``Method``, its options completed (isotonic's ``increasing`` from the score's
  direction)."""
  entry = registry.lookup(estimator)
  fit_options = dict(entry.check_options(options))
  if "increasing" in entry.options and "increasing" not in fit_options:
    known = score_registry.lookup(score)
    fit_options["increasing"] = known is not None and known.confident_when_high
  per_bin_count = "n_bins" in entry.options and "n_bins" not in fit_options
  if per_bin_count and bin_count is not None:
    fit_options["n_bins"], per_bin_count = bin_count, False
  return Method(entry.name, score, MappingProxyType(fit_options), per_bin_count)


def _names(name: str, value, what: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, Sequence):
    raise ValueError(f"{name}: expected a sequence of {what} names, got {value!r}")
  return tuple(dict.fromkeys(value))


def bin_counts(n_bins, splits: Splits) -> tuple[int, ...]:
  """``n_bins`` (a count or a sequence) as a tuple, each in [1, the smallest calibration part];
  refuses splits without calibration or test examples."""
  if isinstance(n_bins, (int, np.integer)) and not isinstance(n_bins, bool):
    n_bins = (n_bins,)
  if isinstance(n_bins, (str, bytes)) or not hasattr(n_bins, "__iter__"):
    raise ValueError(f"n_bins: expected an integer or a sequence of integers, got {n_bins!r}")
  n_bins = tuple(n_bins)
  if not n_bins:
    raise ValueError("n_bins: expected at least one bin count, got none")
  sizes = np.array([splits.test_mask(f).sum() for f in range(splits.num_splits)])
  num = splits.fold.shape[-1]
  for size, part in ((sizes.min(), "test"), (num - sizes.max(), "calibration")):
    if size < 1:
      raise ValueError(f"splits: a split has no {part} examples")
  smallest = int(num - sizes.max())
  return tuple(validation.positive_int("n_bins", n, maximum=smallest) for n in n_bins)


def checked(name: str, inputs, needed, k: int, num_classes: int | None, labelled: bool) -> Data:
  """``inputs`` (``Inputs``) checked on the host, with the Top-k events where labelled."""
  validation.instance(name, inputs, Inputs, "protocol.Inputs(log_probs, labels, scores)")
  log_probs = validation.float_array(f"{name}.log_probs", inputs.log_probs, 2, host=True)
  validation.check_nonempty(f"{name}.log_probs", log_probs)
  if num_classes is not None and log_probs.shape[1] != num_classes:
    raise ValueError(
      f"{name}.log_probs: expected {num_classes} classes like clean, got shape {log_probs.shape}"
    )
  validation.refuse_probabilities(
    f"{name}.log_probs", log_probs, "pass their log (Inputs holds log-probabilities)"
  )
  if not isinstance(inputs.scores, Mapping):
    raise ValueError(f"{name}.scores: expected a mapping name -> [N] scores, got {inputs.scores!r}")
  missing = sorted(set(needed) - set(inputs.scores))
  if missing:
    have = ", ".join(sorted(inputs.scores)) or "none"
    raise ValueError(f"{name}.scores: no score {missing[0]!r} (it has: {have})")
  arrays = {f"{name}.log_probs": log_probs}
  for score in sorted(set(needed)):
    key = f"{name}.scores[{score!r}]"
    arrays[key] = validation.float_array(key, inputs.scores[score], 1, host=True)
  if labelled:
    if inputs.labels is None:
      raise ValueError(f"{name}.labels: expected [{log_probs.shape[0]}] true labels, got None")
    labels = validation.labels_array(f"{name}.labels", inputs.labels, log_probs.shape[1], host=True)
    arrays[f"{name}.labels"] = labels
  validation.same_length(**arrays)
  host_scores = {score: arrays[f"{name}.scores[{score!r}]"] for score in needed}
  if not labelled:
    return Data(None, host_scores, log_probs)
  return Data(np.asarray(events.topk_correct(log_probs, labels, k)), host_scores, log_probs, labels)


def checked_sets(name: str, sets, needed, k: int, clean: Data, labelled: bool, optional=False):
  """[(key, Data)] of a mapping (by key) or a sequence (by index) of ``Inputs``, each
  checked against ``clean``; ``optional``: an empty one gives []."""
  items = None
  if isinstance(sets, Mapping):
    items = list(sets.items())
  elif isinstance(sets, Sequence) and not isinstance(sets, (str, Inputs)):
    items = list(enumerate(sets))
  if optional and items == []:
    return []
  if not items:
    raise ValueError(f"{name}: expected a mapping or sequence of protocol.Inputs, got {sets!r:.80}")
  num, num_classes = clean.log_probs.shape
  out = []
  for key, inputs in items:
    data = checked(f"{name}[{key!r}]", inputs, needed, k, num_classes, labelled)
    if labelled and data.log_probs.shape[0] != num:
      raise ValueError(
        f"{name}[{key!r}].log_probs: expected clean's {num} examples, got {len(data.log_probs)}"
      )
    out.append((key, data))
  return out


def check_splits(splits, num: int | None = None, name: str = "") -> None:
  """A one-line ValueError unless ``splits`` are ``Splits`` (made for ``name``'s ``num``
  examples, where ``num`` is given)."""
  validation.instance("splits", splits, Splits, "crossval.Splits from make_splits")
  if num is not None and splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, {name} has {num}")


def checked_clean(clean, splits, methods_: Sequence[Method], k) -> tuple[Data, int]:
  """The clean set and ``k``, checked against each other and the splits."""
  check_splits(splits)  # its type first: a bad ``splits`` is told before a bad ``clean``
  k = validation.positive_int("k", k)
  data = checked("clean", clean, {m.score for m in methods_}, k, None, labelled=True)
  num, num_classes = data.log_probs.shape
  validation.positive_int("k", k, maximum=num_classes)
  check_splits(splits, num, "clean")
  return data, k


def evaluate(
  clean: Inputs,
  splits: Splits,
  methods_: Sequence[Method],
  *,
  test_sets: Mapping[Hashable, Inputs] | Sequence[Inputs] | None = None,
  n_bins: int | Sequence[int] = (10, 20, 100),
  k: int = 1,
  ece_bins: int | None = None,
  refit_on: ArrayLike | None = None,
) -> list[Result]:
  """``METRICS`` of each method fitted on ``clean``'s calibration parts, on test parts.

  Args:
    clean: N labelled examples (also the test set when ``test_sets`` is None).
    splits: ``crossval.make_splits(N, ...)``.
    methods_: ``Method`` values (``methods`` builds them).
    test_sets: None, or labelled sets of the same N examples transformed, by key or in a
      sequence (keys 0, 1, ...); include ``clean`` for its rows.
    n_bins: the bin counts, each in [1, the smallest calibration part].
    k: the event "the true label is among the k top classes".
    ece_bins: also give each split's equal-width ``confidence_ece`` with this many bins.
    refit_on: None, or [F, N] bool within each split's calibration part: split f fits each
      method, per test set, on that set's examples there (or updates its clean fit with
      them, ``Method.update``); the bins of U stay clean's.

  Returns:
    One ``Result`` per (method, set): methods in order, then sets.
  """
  clean_data, k = checked_clean(clean, splits, methods_, k)
  n_bins = bin_counts(n_bins, splits)
  if ece_bins is not None:
    ece_bins = equal_width.checked_n_bins(ece_bins, "ece_bins")
  if test_sets is not None:
    needed = {m.score for m in methods_}
    test_sets = checked_sets("test_sets", test_sets, needed, k, clean_data, labelled=True)
  if refit_on is not None:
    refit_on, shape = np.asarray(refit_on), (splits.num_splits, splits.fold.shape[-1])
    if refit_on.dtype != bool or refit_on.shape != shape:
      got = f"{refit_on.dtype} {refit_on.shape}"
      raise ValueError(f"refit_on: expected a {list(shape)} bool mask, got {got}")
    for f, mask in enumerate(refit_on):
      if not mask.any() or (mask & splits.test_mask(f)).any():
        raise ValueError(
          f"refit_on: split {f} needs examples to fit on, all within its calibration part"
        )
  methods_ = list(methods_)
  return evaluate_checked(clean_data, splits, methods_, test_sets, n_bins, k, ece_bins, refit_on)


def evaluate_shifts(
  clean: Inputs,
  shifted: Mapping[Hashable, Inputs] | Sequence[Inputs],
  splits: Splits,
  *,
  scores: Sequence[str],
  estimators: Sequence[str],
  n_bins: int | Sequence[int] = (10, 20, 100),
  k: int = 1,
  log_probs_score: str | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Result]:
  """Calibrated on clean data, tested under shift (Ovadia et al. 2019): ``evaluate`` of
  ``methods(estimators, scores, log_probs_score, options)`` with ``test_sets=shifted``."""
  chosen = methods(estimators, scores, log_probs_score, options)
  return evaluate(clean, splits, chosen, test_sets=shifted, n_bins=n_bins, k=k)


def evaluate_checked(
  clean: Data, splits: Splits, methods_: list[Method], sets, n_bins, k, ece_bins=None, refit_on=None
) -> list[Result]:
  """``evaluate`` of checked arguments (``sets``: [(key, Data)] or None)."""
  own = sets is None
  sets = [(OWN, clean)] if own else sets
  fast = [
    _fast_path(m, clean, splits, n_bins, k, ece_bins) if own and refit_on is None else None
    for m in methods_
  ]
  found = {i: [result] for i, result in enumerate(fast) if result is not None}
  generic = [i for i, result in enumerate(fast) if result is None]
  for score in dict.fromkeys(methods_[i].score for i in generic):
    group = [i for i in generic if methods_[i].score == score]
    chosen = [methods_[i] for i in group]
    per_method = _loop(chosen, clean, sets, splits, n_bins, k, ece_bins, refit_on)
    found.update(zip(group, per_method, strict=True))
  return [
    Result(m.score, m.estimator, key, *found[i][s])
    for i, m in enumerate(methods_)
    for s, (key, _) in enumerate(sets)
  ]


def _evidence(data: Data, method: Method, rows, k: int) -> base.Evidence:
  evidence = base.Evidence(data.scores[method.score][rows], data.correct[rows], k=k)
  if method.entry.scores_only:
    return evidence
  return evidence._replace(log_probs=data.log_probs[rows], labels=data.labels[rows])


def fit_predict(method: Method, clean: Data, cal: np.ndarray, target: base.Evidence, n_bins):
  """The method fitted on the clean calibration part (``cal``, [N] bool) predicting
  ``target``: [M], or [B, M] when fitted at each of ``n_bins``; float64, host."""
  return _predicted(method, _fits(method, clean, cal, target.k, n_bins), target)


def fit_predict_sets(method: Method, clean: Data, cal: np.ndarray, datas, rows, k: int) -> list:
  """``fit_predict`` of the ``rows`` of each of ``datas``, stacked: one [M_s] array per set."""
  u = [data.scores[method.score][r] for data, r in zip(datas, rows, strict=True)]
  target = base.Evidence(np.concatenate(u), k=k)
  if not method.entry.scores_only:
    log_probs = np.concatenate([data.log_probs[r] for data, r in zip(datas, rows, strict=True)])
    target = target._replace(log_probs=log_probs)
  p = fit_predict(method, clean, cal, target, None)
  return np.split(p, np.cumsum([len(values) for values in u])[:-1], axis=-1)


def _fits(method: Method, data: Data, rows, k: int, n_bins) -> list:
  evidence = _evidence(data, method, rows, k)
  if not method.per_bin_count:
    return [method.entry.fit(evidence, **method.options)]
  return [method.entry.fit(evidence, **method.options, n_bins=n) for n in n_bins]


def _predicted(method: Method, states: list, target: base.Evidence) -> np.ndarray:
  p = [np.asarray(method.entry.predict(state, target), np.float64) for state in states]
  return np.stack(p) if method.per_bin_count else p[0]


def _fast_path(method: Method, clean: Data, splits: Splits, n_bins, k, ece_bins):
  """(``CrossValidation``, extras) by the estimator's fast path, or None without one."""
  entry, u = method.entry, clean.scores[method.score]
  if entry.cross_validate is not None and method.per_bin_count:
    return entry.cross_validate(u, clean.correct, n_bins, splits, **method.options), {}
  if entry.fit_splits is None:
    return None
  masks = np.stack([splits.test_mask(f) for f in range(splits.num_splits)])
  everything = _evidence(clean, method, slice(None), k)
  fits = entry.fit_splits(everything, ~masks, **method.options)
  if fits is None:
    return None
  per_split, extras = [], []
  for f, test in enumerate(masks):
    p, fitted = _split_rows(fits, f, test)
    correct_test = clean.correct[test][None]
    held = held_out_bins(u[~test], clean.correct[~test], u[test][None], correct_test, n_bins)
    per_split.append(binned_predictions(held, p))
    extras.append(_extras(p[None], correct_test, ece_bins, fitted))
  return _per_set(per_split, extras, n_bins)[0]


def _split_rows(fits: base.SplitFit, f: int, rows) -> tuple[np.ndarray, dict[str, float]]:
  """Split f's predictions of ``rows`` (float64) and extras (per example: their mean)."""
  p, per_example = fits.split(f)
  fitted = {name: float(np.asarray(value)[f]) for name, value in fits.extras.items()}
  for name, value in per_example.items():
    fitted[name] = float(np.sum(np.asarray(value)[rows], dtype=np.float64) / np.count_nonzero(rows))
  return np.asarray(np.asarray(p)[rows], np.float64), fitted


def _loop(group: list[Method], clean: Data, sets, splits: Splits, n_bins, k, ece_bins, refit_on):
  """Each method's [(``CrossValidation``, extras)] per set, for methods of one score (they
  share the calibration bins)."""
  score = group[0].score
  datas = [data for _, data in sets]
  u = np.stack([data.scores[score] for data in datas])  # [S, N]
  correct = np.stack([data.correct for data in datas])
  needs_log_probs = not all(m.entry.scores_only for m in group)
  sums, extras = [[] for _ in group], [[] for _ in group]
  if refit_on is not None:
    refit = [_refit_predictions(m, clean, datas, splits, refit_on, n_bins, k) for m in group]
  for f in range(splits.num_splits):
    test = splits.test_mask(f)
    cal = ~test
    u_cal, correct_cal = clean.scores[score][cal], clean.correct[cal]
    held = held_out_bins(u_cal, correct_cal, u[:, test], correct[:, test], n_bins)
    target = base.Evidence(u[:, test].reshape(-1), k=k)
    if needs_log_probs:  # each set's test rows: never every set's [N, K] stacked at once
      target = target._replace(log_probs=np.concatenate([data.log_probs[test] for data in datas]))
    for i, m in enumerate(group):
      p = fit_predict(m, clean, cal, target, n_bins) if refit_on is None else refit[i][f]
      sums[i].append(binned_predictions(held, p))
      shared = p if p.ndim == 1 else p[0]
      extras[i].append(_extras(shared.reshape(len(sets), -1), correct[:, test], ece_bins))
  return [_per_set(s, e, n_bins) for s, e in zip(sums, extras, strict=True)]


def _refit_predictions(method: Method, clean: Data, datas, splits, refit_on, n_bins, k) -> list:
  """Per split f: the method's predictions [S * T] (or [B, S * T]) of each set's test part,
  fitted on that set's examples where ``refit_on[f]``."""
  tests = [splits.test_mask(f) for f in range(splits.num_splits)]
  parts, clean_fits = [[] for _ in tests], {}
  fast = method.entry.fit_splits is not None and method.update is None and not method.per_bin_count
  for data in datas:
    everything = _evidence(data, method, slice(None), k)
    fits = method.entry.fit_splits(everything, refit_on, **method.options) if fast else None
    if fits is not None:
      for f, test in enumerate(tests):
        parts[f].append(np.asarray(np.asarray(fits.split(f)[0])[test], np.float64))
      continue
    for f, test in enumerate(tests):
      target = _evidence(data, method, test, k)
      if method.update is None:
        states = _fits(method, data, refit_on[f], k, n_bins)
      else:  # the clean fit once per split, each set's update from it
        if f not in clean_fits:
          clean_fits[f] = _fits(method, clean, ~test, k, n_bins)
        labelled = _evidence(data, method, refit_on[f], k)
        states = [method.update(state, labelled) for state in clean_fits[f]]
      parts[f].append(_predicted(method, states, target))
  return [np.concatenate(p, axis=-1) for p in parts]


def _extras(p, correct, ece_bins, fitted=MappingProxyType({})) -> list[dict[str, float]]:
  """Each set's ``Result.extras`` of one split: p and correct [S, T]; ``fitted``: a fast
  path's (``_split_rows``)."""
  out = [{} for _ in range(p.shape[0])]
  if ece_bins is not None:
    for values, p_set, correct_set in zip(out, p, correct, strict=True):
      gap = correct_set - p_set.astype(np.float32).astype(np.float64)
      per_bin = np.bincount(equal_width.equal_width_index(p_set, ece_bins), gap, ece_bins)
      values["confidence_ece"] = float(np.sum(np.abs(per_bin)) / p_set.shape[0])
  return [values | fitted for values in out]


def _per_set(sums: list, extras: list[list[dict]], n_bins) -> list[tuple[CrossValidation, dict]]:
  """Each set's (``CrossValidation``, extras name -> [F]) of the splits' ``BinnedPredictions``
  and ``_extras``."""
  per_fold = split_metrics(sums)  # name -> [S, B, F]
  num_sets = next(iter(per_fold.values())).shape[0]
  flat = {name: value.reshape(-1, value.shape[-1]) for name, value in per_fold.items()}
  stats = CrossValidation.from_per_fold(range(num_sets * len(n_bins)), flat)[1:]
  stats = [{name: v.reshape(num_sets, -1, *v.shape[1:]) for name, v in d.items()} for d in stats]
  return [
    (
      CrossValidation(n_bins, *({name: v[s] for name, v in d.items()} for d in stats)),
      {name: np.array([split[s][name] for split in extras]) for name in extras[0][s]},
    )
    for s in range(num_sets)
  ]


class HeldOutBins(NamedTuple):
  """One split: the calibration part's equal-count bins of U (B bin counts, W = max(n_bins)
  slots each), and where the test examples of S test sets fall in them."""

  n_bins: tuple[int, ...]
  cal_counts: np.ndarray  # [B, W] float32, calibration examples per bin (zero beyond n)
  prior: float  # the calibration accuracy
  slots: np.ndarray  # [B, S * T] int, bin + W * set of each test example, set after set
  correct: np.ndarray  # [S * T] bool, the test events in that order
  test_counts: np.ndarray  # [S, B, W] float32, test examples per bin
  test_hits: np.ndarray  # [S, B, W] float32, correct ones


def held_out_bins(u_cal, correct_cal, u_test, correct_test, n_bins) -> HeldOutBins:
  """``HeldOutBins`` of host arrays: ``u_cal``, ``correct_cal`` [M]; ``u_test``,
  ``correct_test`` [S, T]."""
  fitted = [binning.fit(u_cal, correct_cal, n) for n in n_bins]
  return counted_in(fitted, u_test, correct_test)


def counted_in(fitted: Sequence[binning.Bins], u_test, correct_test, prior=None) -> HeldOutBins:
  """``HeldOutBins`` of bins already fitted, one per bin count (``prior``: None for theirs)."""
  num_sets, n_bins = u_test.shape[0], tuple(bins.n_bins for bins in fitted)
  width = max(n_bins)
  offsets = np.repeat(np.arange(num_sets) * width, u_test.shape[1])
  u_flat, correct_flat = u_test.reshape(-1), correct_test.reshape(-1)
  cal_counts = np.zeros((len(n_bins), width), np.float32)
  slots = np.empty((len(n_bins), u_flat.shape[0]), np.int64)
  for b, (n, bins) in enumerate(zip(n_bins, fitted, strict=True)):
    cal_counts[b, :n] = bins.counts
    slots[b] = offsets + np.asarray(binning.assign(bins.edges, u_flat))
  size = num_sets * width
  counts = np.stack([np.bincount(s, minlength=size) for s in slots])
  hits = np.stack([np.bincount(s, correct_flat, size) for s in slots])
  shape = (len(n_bins), num_sets, width)
  test_counts, test_hits = (np.moveaxis(x.reshape(shape), 1, 0) for x in (counts, hits))
  prior = float(fitted[-1].prior) if prior is None else prior
  return HeldOutBins(
    n_bins, cal_counts, prior, slots, correct_flat,
    *(x.astype(np.float32) for x in (test_counts, test_hits)),
  )  # fmt: skip


class BinnedPredictions(NamedTuple):
  """One split's sufficient statistics of a method's test predictions, per test set (fields
  named as ``HeldOutBins``' are its). ``prediction_means``: [S, B, W] float32, the mean
  predicted P(correct) per calibration bin (0 where none), summed in float64 so that a bin
  of equal predictions gets exactly that value; ``brier``, ``nll``: [S, B] per-example means."""

  n_bins: tuple[int, ...]
  cal_counts: np.ndarray
  prior: float
  test_counts: np.ndarray
  test_hits: np.ndarray
  prediction_means: np.ndarray
  brier: np.ndarray
  nll: np.ndarray


@jax.jit
def _example_terms(p, correct):
  p = p.astype(jnp.float32)
  return metrics.brier_terms(p, correct), metrics.nll_terms(p, correct)


def binned_predictions(test: HeldOutBins, p) -> BinnedPredictions:
  """A method's test predictions ``p`` counted in ``test``'s bins.

  ``p``: [S * T] float P(correct) in ``test.slots``' order, or [B, S * T] (one per bin count).
  """
  num_sets, num_bin_counts = test.test_counts.shape[0], len(test.n_bins)
  shared = np.ndim(p) == 1
  p = np.broadcast_to(np.asarray(p, np.float64), test.slots.shape)
  size = num_sets * max(test.n_bins)
  sums = np.stack([np.bincount(s, w, size) for s, w in zip(test.slots, p, strict=True)])
  sums = np.moveaxis(sums.reshape(num_bin_counts, num_sets, -1), 1, 0)
  means = (sums / np.maximum(test.test_counts, 1)).astype(np.float32)
  # Each set's mean of the per-example terms (one row when p is shared by the bin counts).
  rows = p[:1] if shared else p
  terms = (np.asarray(x, np.float64) for x in _example_terms(rows, test.correct[None]))
  brier, nll = (x.reshape(rows.shape[0], num_sets, -1).mean(-1).T for x in terms)
  shape = (num_sets, num_bin_counts)
  return BinnedPredictions(
    test.n_bins, test.cal_counts, test.prior, test.test_counts, test.test_hits, means,
    np.broadcast_to(brier, shape), np.broadcast_to(nll, shape),
  )  # fmt: skip


def split_metrics(per_split: Sequence[BinnedPredictions]) -> dict[str, np.ndarray]:
  """``METRICS`` from each split's ``BinnedPredictions``: name -> [S, B, F] (NaN: undefined)."""
  # The splits axis goes before the bins: [B, F, W], [F], [S, B, F, W] and [S, B, F].
  splits_axis = {"prior": 0, "brier": -1, "nll": -1}
  stacked = {
    name: np.stack([getattr(sums, name) for sums in per_split], axis=splits_axis.get(name, -2))
    for name in BinnedPredictions._fields[1:]
  }
  # One bin count at a time, each at its own width: AUROC's cost grows as the square.
  values = []
  for b, n in enumerate(per_split[0].n_bins):
    bins = {"cal_counts": stacked["cal_counts"][b : b + 1, :, :n], "prior": stacked["prior"]}
    bins |= {name: stacked[name][:, b : b + 1, :, :n] for name in _PER_BIN}
    bins |= {name: stacked[name][:, b : b + 1] for name in ("brier", "nll")}
    values.append(_metrics_of_sums(**bins))
  return {name: np.concatenate([v[name] for v in values], axis=1) for name in METRICS}


_PER_BIN = ("test_counts", "test_hits", "prediction_means")


@compile_policy.jit_small
def _metrics_of_sums(cal_counts, prior, test_counts, test_hits, prediction_means, brier, nll):
  shape = test_counts.shape[:-1]  # [S, B, F]
  prior = jnp.broadcast_to(prior, shape)
  prob = jnp.where(test_counts > 0, prediction_means, prior[..., None])
  cal_counts = jnp.broadcast_to(cal_counts, test_counts.shape)
  return metrics.split_metrics(prob, prior, cal_counts, test_counts, test_hits, brier, nll)
