"""Prediction sets with a coverage guarantee: the methods, one registry, and their evaluation.

A method is a score S_r(x) of the label at rank r = 1..K of the model's ranking, for
``conformal``'s split conformal calibration (there: the threshold, the sets, the guarantee).
With p_(r) the r-th largest probability, C_r their cumulative sum, Q_k the running max over
j <= k of the paper's calibrated P(label in Top-j), u ~ U[0, 1) one draw per example (0
when not randomized), and C_0 = Q_0 = 0:

```text
  lac   S_r = 1 - p_(r)                              Sadinle, Lei & Wasserman (2019), "THR"
  aps   S_r = C_(r-1) + u p_(r)                      Romano, Sesia & Candes (2020)
  raps  S_r = C_(r-1) + u p_(r) + lam (r - k_reg)^+  Angelopoulos, Bates, Malik & Jordan (2021)
  topk  S_r = Q_(r-1) + u (Q_r - Q_(r-1))            this package: the paper's equal-count
        bins of -log top-k mass (``scores.neg_log_topk_mass``) for the event "label in Top-k"
```

Non-randomized (u = 0; topk's default) the top label is always in the set; randomized sets
(aps' and raps' default) reach 1 - alpha exactly and may be empty.

raps and topk fit parameters (k_reg and lam by the RAPS paper's rule; the bins of every k)
on a random ``tune_fraction`` of the calibration data and take the quantile over the rest,
so that the conformal scores stay exchangeable and the guarantee exact.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, validation
from top1_jax.core.splits import Splits
from top1_jax.estimators import base
from top1_jax.estimators import bins as saved_bins
from top1_jax.evaluation import conformal, protocol

LAMBDA_GRID = (0.001, 0.01, 0.1, 0.2, 0.5)
"""The RAPS paper's values of lam, from which tuning chooses."""
_CALIBRATION, _TUNING, _PREDICTION = 0, 1, 2  # the random streams of one seed


class Calibrated(NamedTuple):
  """A fitted set predictor: the method's ``params`` (None, raps' ``(k_reg, lam)``,
  topk's stacked ``binning.Bins``) and the [n] ascending calibration ``scores``."""

  params: Any
  scores: np.ndarray


def _probabilities(sorted_logits: jax.Array) -> jax.Array:
  """[N, K] softmax of rows sorted in decreasing order (the first entry is the max)."""
  exp_z = jnp.exp(sorted_logits - sorted_logits[:, :1])
  return exp_z / jnp.sum(exp_z, axis=-1, keepdims=True)


@jax.jit
def _lac_scores(params, sorted_logits, u):
  del params, u
  return 1.0 - _probabilities(sorted_logits)


@jax.jit
def _aps_scores(params, sorted_logits, u):
  del params
  return conformal.interpolated(conformal.cumulative_sum(_probabilities(sorted_logits)), u)


def _penalty(k_reg, lam, num_classes: int) -> jax.Array:
  """[K] lam (r - k_reg)^+ for r = 1..K."""
  return lam * jnp.maximum(jnp.arange(1, num_classes + 1) - k_reg, 0).astype(jnp.float32)


@jax.jit
def _raps_scores(params, sorted_logits, u):
  return _aps_scores(None, sorted_logits, u) + _penalty(*params, sorted_logits.shape[-1])


@jax.jit
def neg_log_topk_masses(sorted_logits: jax.Array) -> jax.Array:
  """[N, K]: column k - 1 is ``scores.neg_log_topk_mass(logits, k)`` (up to rounding), for
  every k at once from [N, K] logits in decreasing order."""
  z = sorted_logits - sorted_logits[:, :1]
  exp_z = jnp.exp(z)
  below = conformal.cumulative_sum(exp_z[:, ::-1])[:, ::-1]  # from the small end: no cancellation
  rest = jnp.pad(below[:, 1:], ((0, 0), (0, 1)))
  return jnp.log1p(rest / conformal.cumulative_sum(exp_z))


_masses_by_k = jax.jit(lambda order: neg_log_topk_masses(order).T)  # [K, N], transposed by XLA


@jax.jit
def _topk_scores(bins: binning.Bins, sorted_logits, u):
  masses = neg_log_topk_masses(sorted_logits)
  probability = jax.vmap(lambda b, m: b.prob[binning.assign(b.edges, m)], (0, 1), 1)
  running_max = jax.lax.associative_scan(jnp.maximum, probability(bins, masses), axis=1)
  return conformal.interpolated(running_max, u)


# The methods' tuning (on the tuning part alone) and their saved parameters.


@jax.jit
def _per_lam(aps_scores, k_reg, thresholds, rank) -> jax.Array:
  """[len(LAMBDA_GRID), R]: for each lam, the raps calibration scores of the rows of
  ``aps_scores`` (``thresholds`` None), or their set sizes at its threshold."""

  def one(lam_and_q):
    lam, q = lam_and_q
    scores = aps_scores + _penalty(k_reg, lam, aps_scores.shape[-1])
    return conformal.at_rank(scores, rank) if q is None else conformal.sizes(scores, q[None])[0]

  return jax.lax.map(one, (jnp.float32(LAMBDA_GRID), thresholds))


def _raps_tuning(part, options: dict) -> tuple[int, float]:
  """(k_reg, lam): the options given, or the RAPS paper's rule on the tuning part: k_reg the
  1 - alpha quantile ("higher") of the label's 1-based rank; lam the value of ``LAMBDA_GRID``
  (first of ties) whose sets, calibrated on the tuning part, are smallest there on average."""
  k_reg, lam, alpha = options["k_reg"], options["lam"], options["tune_alpha"]
  if part is None:
    return k_reg, lam
  data, u, rows = part
  rank = data.rank[rows]
  if k_reg is None:
    k_reg = int(np.quantile(rank, 1 - alpha, method="higher")) + 1
  if lam is None:  # [L, n] scores, then sizes, by blocks of rows: never an [n, K] array
    # aps in a program of its own: fused with the penalty, XLA's FMAs would round otherwise
    by_lam = lambda q: lambda o, draws, r=None: _per_lam(_aps_scores(None, o, draws), k_reg, q, r)
    scores = np.empty((len(LAMBDA_GRID), rows.shape[0]), np.float32)
    _by_rows(by_lam(None), data, rows, u[rows], rank, out=scores)
    scores.sort()
    at = conformal.quantile_rank(rows.shape[0], alpha)
    q = scores[:, at - 1] if at <= rows.shape[0] else np.full(len(LAMBDA_GRID), np.inf, np.float32)
    sizes = np.empty(scores.shape, np.int32)
    _by_rows(by_lam(q), data, rows, u[rows], out=sizes)
    # the count over n divided on the host: XLA's vector division is not exact
    mean = sizes.sum(axis=-1).astype(jnp.result_type(float)) / rows.shape[0]
    lam = LAMBDA_GRID[int(np.argmin(mean))]
  return k_reg, float(lam)


def _topk_tuning(part, options: dict) -> binning.Bins:
  """The paper's equal-count bins of -log top-k mass for the event "label in Top-k", for
  each k, on the tuning part; stacked on a leading [K] axis."""
  data, _, rows = part
  masses = np.empty((data.rows.shape[1], rows.shape[0]), np.float32)
  _by_rows(_masses_by_k, data, rows, out=masses)
  rank = data.rank[rows]
  fits = [binning.fit(m, rank < k, options["n_bins"]) for k, m in enumerate(masses, 1)]
  return jax.tree.map(lambda *fields: jnp.stack(fields), *fits)


def _raps_from_dict(d, source: str, num_classes: int):
  del num_classes  # a k_reg beyond K penalises nothing
  return base.read_int(d, "k_reg", source), base.read_number(d, "lam", source, 0.0, 1e30)


def _topk_to_dict(bins: binning.Bins) -> dict:
  host = jax.tree.map(np.asarray, bins)  # one copy, then K host slices
  per_k = [jax.tree.map(lambda field, k=k: field[k], host) for k in range(host.prob.shape[0])]
  return {"bins": [saved_bins.to_dict(b) for b in per_k]}


def _topk_from_dict(d, source: str, num_classes: int) -> binning.Bins:
  per_k = base.field(d, "bins", source)
  if not isinstance(per_k, list) or len(per_k) != num_classes:
    raise ValueError(f"{source}: field 'bins' must list {num_classes} bins (one per k)")
  fits = [saved_bins.host_from_dict(b, f"{source}: bins[{k}]") for k, b in enumerate(per_k)]
  if len({f.prob.shape for f in fits}) != 1:
    raise ValueError(f"{source}: field 'bins' must hold bins of one n_bins for every k")
  return jax.tree.map(lambda *fields: jnp.stack(fields), *fits)


# The registry.


def _boolean(name: str, value) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name}: expected True or False, got {value!r}")
  return bool(value)


def _lam(name: str, value) -> float:
  number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  if not number or not 0 <= float(value) < 1e30:
    raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
  return float(value)


_CHECKS = {
  "randomized": _boolean,
  "k_reg": lambda name, v: v if v is None else validation.positive_int(name, v, maximum=2**31 - 1),
  "lam": lambda name, v: v if v is None else _lam(name, v),
  "tune_fraction": validation.probability,
  "tune_alpha": validation.probability,
  "n_bins": validation.positive_int,
}
"""Each option's check: the value as the method uses it, or a one-line ValueError."""


class SetMethod(NamedTuple):
  """One method of ``METHODS``.

  Attributes:
    name: its key.
    options: each option's default.
    scores: jitted (params, [N, K] sorted logits, [N] u) -> [N, K] S_r of every rank.
    tune: (tuning part or None, options) -> params; the part is (``Ranked``, [N] u, its rows).
    tunes: options -> whether the method fits parameters on a tuning part.
    to_dict, from_dict: its params as JSON values and back, checked (d, source, K).
  """

  name: str
  options: dict[str, Any]
  scores: Any
  tune: Any = lambda part, options: None
  tunes: Any = lambda options: False
  to_dict: Any = lambda params: {}
  from_dict: Any = lambda d, source, num_classes: None


METHODS: dict[str, SetMethod] = {
  "lac": SetMethod("lac", {}, _lac_scores),
  "aps": SetMethod("aps", {"randomized": True}, _aps_scores),
  "raps": SetMethod(
    "raps",
    {"randomized": True, "k_reg": None, "lam": None, "tune_fraction": 0.3, "tune_alpha": 0.1},
    _raps_scores,
    _raps_tuning,
    lambda options: None in (options["k_reg"], options["lam"]),
    lambda params: {"k_reg": int(params[0]), "lam": float(params[1])},
    _raps_from_dict,
  ),
  "topk": SetMethod(
    "topk",
    {"randomized": False, "n_bins": 20, "tune_fraction": 0.5},
    _topk_scores,
    _topk_tuning,
    lambda options: True,
    _topk_to_dict,
    _topk_from_dict,
  ),
}
"""Every set method by name, in the order tables list them."""


def lookup(name: str) -> SetMethod:
  """The method called ``name``, or a one-line ValueError listing them."""
  if not isinstance(name, str) or name not in METHODS:
    raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {name!r}")
  return METHODS[name]


def checked_options(method: SetMethod, options: dict[str, Any]) -> dict[str, Any]:
  """Every option of ``method``: the given ones checked, the others at their defaults."""
  unknown = sorted(set(options) - set(method.options))
  if unknown:
    takes = ", ".join(method.options) or "no options"
    raise ValueError(f"options: method {method.name!r} takes {takes}; got {', '.join(unknown)}")
  given = {name: _CHECKS[name](name, value) for name, value in options.items()}
  return {**method.options, **given}


def check_sizes(method: SetMethod, options: dict[str, Any], num: int, name: str) -> None:
  """A one-line ValueError when ``num`` calibration examples leave the tuning part or the
  conformal part empty, or fewer tuning examples than topk's ``n_bins``."""
  tuned = conformal.ceil_times(num, options["tune_fraction"]) if method.tunes(options) else 0
  if num - tuned < 1:
    raise ValueError(
      f"{name}: {num} calibration example(s) leave none for the conformal quantile after"
      f" tune_fraction={options['tune_fraction']}; pass more data or a smaller tune_fraction"
    )
  if tuned < options.get("n_bins", 0):
    raise ValueError(
      f"n_bins: {options['n_bins']} bins need as many tuning examples, the tuning part has"
      f" {tuned} of {num}; lower n_bins or raise tune_fraction"
    )


# Fitting and predicting.


@functools.partial(jax.jit, static_argnums=(0, 1))
def _of_scores(scores_of, then, params, order, u, *args) -> jax.Array:
  return then(scores_of(params, order, u), *args)  # S is never stored


ROWS = 1 << 12
"""Rows a set program takes at once: its [rows, K] temporaries stay bounded however many
examples a part holds (docs/performance.md)."""


def _by_rows(program, data: conformal.Ranked, rows: np.ndarray, *per_row, out: np.ndarray):
  """``out`` [..., R] filled with ``program(sorted logits, *per_row)`` of the R ``rows`` of
  ``data`` (``per_row`` given for those rows), at most ``ROWS`` rows at a time (the last
  block padded, so that one program serves them all)."""
  num = rows.shape[0]
  size = conformal.bucket(num) if num <= ROWS else ROWS
  for start in range(0, num, size):
    block = [conformal.pad_rows(a[start : start + size], size) for a in per_row]
    sorted_logits = conformal.sorted_rows(data, size, rows[start : start + size])
    out[..., start : start + size] = np.asarray(program(sorted_logits, *block))[..., : num - start]
  return out


def calibrate(
  method: SetMethod, data: conformal.Ranked, u, tuning, options: dict[str, Any], rows=None
) -> Calibrated:
  """Fits ``method`` on the labelled ``rows`` of ``data`` (an int array, or None: all), with
  ``u`` the [N] draws of ``data``'s examples: its parameters on the ``tuning`` part (a bool
  array, one per row, when it tunes), the calibration scores on the others."""
  rows = np.arange(data.num) if rows is None else rows
  params = method.tune((data, u, rows[tuning]) if method.tunes(options) else None, options)
  rest = rows[~tuning]
  at_ranks = functools.partial(_of_scores, method.scores, conformal.at_rank, params)
  scores = np.empty(rest.shape[0], np.float32)
  _by_rows(at_ranks, data, rest, u[rest], data.rank[rest], out=scores)
  return Calibrated(params, np.sort(scores))


def set_sizes(method: SetMethod, params, data: conformal.Ranked, u, thresholds, rows=None):
  """[A, R] int32 set sizes of the ``rows`` of ``data`` (None: all N) at [A] thresholds,
  with ``u`` the [N] draws of ``data``'s examples."""
  rows = np.arange(data.num) if rows is None else rows
  thresholds = jnp.asarray(thresholds, jnp.float32)
  program = lambda o, d: _of_scores(method.scores, conformal.sizes, params, o, d, thresholds)
  out = np.empty((thresholds.shape[0], rows.shape[0]), np.int32)
  return _by_rows(program, data, rows, u[rows], out=out)


def fit_draws(method: SetMethod, seed: int, num: int, options) -> tuple[np.ndarray, np.ndarray]:
  """``fit``'s draws from ``seed`` for ``num`` calibration examples: [num] u (zeros when not
  randomized) and the [num] bool tuning part (all False when not tuning)."""
  key, randomized = jax.random.key(seed), options.get("randomized", False)
  u = conformal.uniform_draws(jax.random.fold_in(key, _CALIBRATION), num, randomized)
  if not method.tunes(options):
    return u, np.zeros(num, bool)
  return u, conformal.tuning_mask(jax.random.fold_in(key, _TUNING), num, options["tune_fraction"])


def predict_draws(seed: int, num: int, options: dict[str, Any]) -> np.ndarray:
  """[num] u of ``seed`` for ``num`` examples to predict (zeros when not randomized)."""
  key = jax.random.fold_in(jax.random.key(seed), _PREDICTION)
  return conformal.uniform_draws(key, num, options.get("randomized", False))


def predict_sizes(
  method: SetMethod, fitted: Calibrated, data: conformal.Ranked, alphas, seed: int, options
) -> np.ndarray:
  """[A, N] int32 set sizes of ``data`` at [A] levels, with ``seed``'s prediction draws:
  one u per row, so the same inputs give the same sets."""
  u = predict_draws(seed, data.num, options)
  thresholds = [conformal.threshold(fitted.scores, alpha) for alpha in alphas]
  return set_sizes(method, fitted.params, data, u, thresholds)


# Evaluation over random splits.


def _evaluate_method(method, options, data, u, splits, alphas, key, tune_per_alpha) -> list[dict]:
  """``evaluate_sets``' rows of one method, fitted on the first set of ``data`` (name ->
  ``conformal.Ranked``), scored on every set."""
  u = u if options.get("randomized", False) else np.zeros_like(u)
  groups = [(a,) for a in alphas] if tune_per_alpha and method.tunes(options) else [alphas]
  results = {}  # (set, alpha) -> per split: (metrics, params, n conformal, n test)
  clean = next(iter(data.values()))
  for split in range(splits.num_splits):
    test = np.flatnonzero(splits.test_mask(split))
    calibration = np.flatnonzero(~splits.test_mask(split))
    tuning = np.zeros(calibration.shape[0], bool)
    if method.tunes(options):
      split_key = jax.random.fold_in(jax.random.fold_in(key, _TUNING), split)
      tuning = conformal.tuning_mask(split_key, calibration.shape[0], options["tune_fraction"])
    for group in groups:
      settings = {**options, "tune_alpha": group[0]} if tune_per_alpha else options
      fitted = calibrate(method, clean, u, tuning, settings, rows=calibration)
      thresholds = [conformal.threshold(fitted.scores, alpha) for alpha in group]
      for name, whole in data.items():
        rank = whole.rank[test]
        sizes = set_sizes(method, fitted.params, whole, u, thresholds, rows=test)
        for alpha, size in zip(group, sizes, strict=True):
          entry = (conformal.set_metrics(size, rank, alpha), fitted.params, len(fitted.scores))
          results.setdefault((name, alpha), []).append((*entry, rank.size))
  rows = []
  for (name, alpha), per_split in results.items():
    metrics, params, num_conformal, num_test = zip(*per_split, strict=True)
    raps = method.name == "raps"
    k_reg, lam = (float(np.median(p)) for p in zip(*params, strict=True)) if raps else (None, None)
    rows.append({
      "method": method.name, "randomized": bool(options.get("randomized", False)), "set": name,
      "alpha": alpha, "num_splits": splits.num_splits,
      "num_conformal": float(np.mean(num_conformal)), "num_test": float(np.mean(num_test)),
      "k_reg": k_reg, "lam": lam, **conformal.summary(list(metrics)),
    })  # fmt: skip
  return sorted(rows, key=lambda row: (list(data).index(row["set"]), alphas.index(row["alpha"])))


def _checked_set(name: str, log_probs: ArrayLike, labels: ArrayLike, num_classes=None):
  """([N, K] float32 logits, [N] int32 labels) of one set, checked."""
  logits = np.asarray(validation.float_array(name, log_probs, 2, host=True), np.float32)
  if logits.shape[-1] < 2 or logits.shape[-1] != (num_classes or logits.shape[-1]):
    raise ValueError(f"{name}: expected {num_classes or '>= 2'} classes, got shape {logits.shape}")
  fix = "pass scores.log_probs_from_probs(probs)"
  validation.refuse_probabilities(name, logits, fix, given=log_probs)
  labels = validation.labels_array(f"{name} labels", labels, logits.shape[-1], host=True)
  validation.same_length(**{name: logits, f"{name} labels": labels})
  return logits, labels


def evaluate_sets(
  log_probs: ArrayLike,
  labels: ArrayLike,
  splits: Splits,
  *,
  methods=tuple(METHODS),
  alphas=(0.1, 0.05),
  seed: int = 0,
  shifted=None,
  **options,
) -> list[dict[str, Any]]:
  """Every method's prediction sets over random calibration/test splits, as tidy rows.

  Each split fits the method on its calibration part and scores the sets of its test part
  and, with ``shifted``, of the same test examples of every shifted set. The draws u are one
  per example, from ``seed``, shared by the splits and the sets.

  Args:
    log_probs: [N, K] log-probabilities or logits (normalised here).
    labels: [N] int true classes.
    splits: ``crossval.make_splits(N, ...)``.
    methods: names of ``METHODS``.
    alphas: miscoverage levels in (0, 1).
    seed: of the draws u and the tuning parts.
    shifted: None, or set name -> ([N, K] log-probabilities, [N] labels) of the same N
      examples transformed.
    **options: given to every method that takes them. raps tunes k_reg and lam for each
      alpha, as its paper does, unless ``tune_alpha`` is given.

  Returns:
    One row per method, set and alpha: method, randomized, set ("clean", or a name of
    ``shifted``), alpha, num_splits, num_conformal and num_test (mean sizes of the parts),
    k_reg and lam (raps: medians over the splits; else None), then ``conformal.summary``
    of ``conformal.set_metrics`` over the splits.
  """
  sets = {"clean": _checked_set("log_probs", log_probs, labels)}
  num, num_classes = sets["clean"][0].shape
  for name, (values, set_labels) in (shifted or {}).items():
    sets[name] = _checked_set(f"shifted[{name!r}]", values, set_labels, num_classes)
    validation.same_length(log_probs=sets["clean"][0], **{f"shifted[{name!r}]": sets[name][0]})
  protocol.check_splits(splits, num, "log_probs")
  chosen = [lookup(name) for name in ((methods,) if isinstance(methods, str) else methods)]
  alphas = tuple(validation.probability("alphas", alpha) for alpha in alphas)
  if not chosen or not alphas:
    raise ValueError("methods and alphas: expected at least one of each")
  unused = set(options) - {name for method in chosen for name in method.options}
  if unused:
    raise ValueError(f"options: no method of {[m.name for m in chosen]} takes {sorted(unused)}")
  key = jax.random.key(validation.positive_int("seed", seed, minimum=0, maximum=2**32 - 1))
  smallest = int(num - max(np.sum(splits.test_mask(f)) for f in range(splits.num_splits)))
  settings = []
  for method in chosen:
    given = checked_options(method, {k: v for k, v in options.items() if k in method.options})
    check_sizes(method, given, smallest, "splits")
    settings.append((method, given))
  data = {name: conformal.ranked(*arrays) for name, arrays in sets.items()}
  u = conformal.uniform_draws(jax.random.fold_in(key, _CALIBRATION), num)
  rows = []
  for method, given in settings:
    per_alpha = "tune_alpha" in method.options and "tune_alpha" not in options
    rows += _evaluate_method(method, given, data, u, splits, alphas, key, per_alpha)
  return rows
