"""The paper's Table 1: the benchmark's metrics of a classifier, on the Top-1 splits.

For one classifier's log-probabilities, each variant below is scored on the test
part of every split (the same splits the Top-1 bins are cross-validated on) and
the metrics are averaged over splits:

* ``"raw"``: the classifier's softmax as it is;
* ``"temperature"`` (single models): softmax(log_probs / T) with T fitted on each
  calibration part (``temperature.fit_temperature``);
* ``"toplabel"`` (single models): top-label binning of pmax (``toplabel``, Gupta &
  Ramdas), fitted on each calibration part; it predicts P(correct) only.

Metrics of a variant (``baselines`` defines them): the multiclass Brier, the
confidence ECE (equal-width bins of pmax) and the binary Top-1 Brier of pmax used
directly as P(correct), the like-for-like baseline of Top-1 binning. The
predicted class is the argmax of the (scaled) log-probabilities, as in
``events.topk_correct``, so the Top-1 event is the one the bins are fitted to.
``table_row`` puts a variant beside the Top-1 bins' own Brier and ECE.
"""

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax import baselines, crossval, metrics, rowblocks, temperature, toplabel, validation

VARIANTS = ("raw", "temperature", "toplabel")
"""Every variant ``benchmark_rows`` scores, in its order (a model with samples: raw only)."""


@jax.jit
def _centred_and_correct(log_probs, labels):
  """log_probs minus each row's max, and the Top-1 event (the argmax: the same for any T)."""
  predicted = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
  return log_probs - jnp.max(log_probs, axis=-1, keepdims=True), predicted, predicted == labels


def _softmax_terms(centred, labels, temperature_value):
  """Per example: multiclass Brier and pmax of softmax(centred / T), by row blocks."""

  def terms(block, block_labels):
    weights = jnp.exp(block / temperature_value)  # the top class's weight is exactly 1
    total = jnp.sum(weights, axis=-1)
    probs = weights / total[:, None]
    # (p_k - y_k)^2 with y one-hot, without materialising the one-hot array.
    is_label = jnp.arange(block.shape[-1]) == block_labels[:, None]
    return jnp.sum(jnp.where(is_label, probs - 1, probs) ** 2, axis=-1), 1 / total

  rows = rowblocks.block_rows(centred.shape[-1])
  return rowblocks.map_row_blocks(terms, (centred, labels), rows)


@functools.partial(jax.jit, static_argnames=("ece_bins",))
def _test_means(test, brier, pmax, correct, ece_bins):
  """[F] means of each split's test examples; ``test`` is [F, N] 0/1 weights."""
  hit = correct.astype(pmax.dtype)
  count = jnp.sum(test, axis=-1)
  dot = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
  in_bin = jax.nn.one_hot(baselines.equal_width_index(pmax, ece_bins), ece_bins, dtype=pmax.dtype)
  # Per-bin sufficient statistics of every split at once: [F, N] @ [N, B].
  hits, confidence = dot(test, in_bin * hit[:, None]), dot(test, in_bin * pmax[:, None])
  return {
    "multiclass_brier": dot(test, brier) / count,
    "confidence_ece": jnp.sum(jnp.abs(hits - confidence), axis=-1) / count,
    "raw_top1_brier": dot(test, (pmax - hit) ** 2) / count,
  }


@functools.partial(jax.jit, static_argnames=("ece_bins",))
def _raw_test_means(centred, labels, correct, test, ece_bins):
  """[F] metrics of each split's test part under the raw softmax, and every pmax."""
  brier, pmax = _softmax_terms(centred, labels, jnp.ones((), centred.dtype))
  return _test_means(test, brier, pmax, correct, ece_bins), pmax


@functools.partial(jax.jit, static_argnames=("ece_bins",))
def _scaled_test_means(centred, labels, correct, test, temperatures, ece_bins):
  """[F] metrics of split f's test part under its own T: one [N, K] pass per split."""

  def one_split(split):
    test_f, temperature_f = split
    # Over all N rather than the test part: one compiled pass serves every split.
    brier, pmax = _softmax_terms(centred, labels, temperature_f)
    means = _test_means(test_f[None], brier, pmax, correct, ece_bins)
    return {key: value[0] for key, value in means.items()}

  return jax.lax.map(one_split, (test, temperatures))


def _temperature_splits(log_probs, centred, labels, correct, masks, ece_bins) -> dict:
  """Per split: T fitted on the calibration part, the metrics of the scaled test part."""
  test = jnp.asarray(masks, log_probs.dtype)
  # Every split's T in one program over the one [N, K] array, each split's calibration
  # part as 0/1 weights: no copy of its rows, no per-split dispatch.
  fitted = temperature.fit_temperature(log_probs, labels, weights=1 - test)
  per_split = _scaled_test_means(centred, labels, correct, test, fitted, ece_bins)
  per_split = {key: np.asarray(value) for key, value in per_split.items()}
  return {**per_split, "temperature": np.asarray(fitted)}


def _toplabel_splits(pmax, predicted, correct, masks, num_classes, n_bins, ece_bins) -> dict:
  """Per split: top-label bins of pmax fitted on the calibration part, scored on the test."""
  per_split = {"toplabel_brier": [], "toplabel_ece": [], "toplabel_classes_with_own_bins": []}
  for test in masks:
    cal = ~test
    model = toplabel.fit(pmax[cal], predicted[cal], correct[cal], n_bins, num_classes=num_classes)
    prob = toplabel.predict(model, pmax[test], predicted[test])
    per_split["toplabel_brier"].append(float(metrics.brier(prob, correct[test])))
    per_split["toplabel_ece"].append(
      float(baselines.equal_width_ece(prob, correct[test], ece_bins))
    )
    per_split["toplabel_classes_with_own_bins"].append(float(np.sum(np.asarray(model.own))))
  return per_split


def _mean_over_splits(per_split: Mapping) -> dict[str, float]:
  return {key: float(np.mean(np.asarray(values, np.float64))) for key, values in per_split.items()}


def _check(log_probs, labels, splits, compare_bins, ece_bins, single_model):
  log_probs = validation.float_array("log_probs", log_probs, 2)
  if log_probs.shape[-1] < 2:
    raise ValueError(f"log_probs: expected at least 2 classes, got shape {log_probs.shape}")
  labels = validation.labels_array("labels", labels, log_probs.shape[-1])
  num = validation.same_length(log_probs=log_probs, labels=labels)
  validation.instance("splits", splits, crossval.Splits, "crossval.Splits from make_splits")
  if splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, log_probs has {num}")
  masks = np.stack([np.asarray(splits.test_mask(f), bool) for f in range(splits.num_splits)])
  if not np.all(masks.any(axis=1)) or np.any(masks.all(axis=1)):
    raise ValueError("splits: every split needs calibration and test examples")
  smallest_cal = int(num - masks.sum(axis=1).max())
  compare_bins = validation.positive_int(
    "compare_bins", compare_bins, maximum=smallest_cal if single_model else None
  )
  return log_probs, labels, masks, compare_bins, validation.positive_int("ece_bins", ece_bins)


def benchmark_rows(
  log_probs: ArrayLike,
  labels: ArrayLike,
  splits: crossval.Splits,
  *,
  single_model: bool,
  compare_bins: int,
  ece_bins: int = baselines.DEFAULT_ECE_BINS,
) -> list[dict[str, str | float]]:
  """The benchmark's metrics of each variant, mean over the splits' test parts.

  Args:
    log_probs: [N, K] float, the classifier's log-probabilities (or logits).
    labels: [N] int in [0, K).
    splits: ``crossval.make_splits(N, ...)``, the splits of the Top-1 sweep.
    single_model: one network (no MC samples, no ensemble): temperature scaling
      and top-label binning apply, and add their rows.
    compare_bins: top-label binning's bins per predicted class (the Top-1 bins'
      count in the comparison), at most the smallest calibration part.
    ece_bins: equal-width bins of the confidence ECE (15 in the benchmark).

  Returns:
    One dict per variant, in ``VARIANTS`` order ("raw" only unless
    ``single_model``), with ``variant`` and the means over splits of
    ``multiclass_brier``, ``confidence_ece``, ``raw_top1_brier`` (of the variant's
    own pmax) and ``temperature`` (1.0 but for "temperature", the mean fitted T).
    "toplabel" repeats the raw metrics (it leaves the softmax alone) and adds
    ``toplabel_brier``, ``toplabel_ece`` (equal-width, ``ece_bins``) and
    ``toplabel_classes_with_own_bins``.
  """
  log_probs, labels, masks, compare_bins, ece_bins = _check(
    log_probs, labels, splits, compare_bins, ece_bins, single_model
  )
  centred, predicted, correct = _centred_and_correct(log_probs, labels)
  # The raw softmax does not depend on the split: one pass, then every split's means.
  test = jnp.asarray(masks, log_probs.dtype)
  raw, pmax = _raw_test_means(centred, labels, correct, test, ece_bins)
  raw = _mean_over_splits({key: np.asarray(value) for key, value in raw.items()})
  rows = [{"variant": "raw", **raw, "temperature": 1.0}]
  if not single_model:
    return rows
  scaled = _temperature_splits(log_probs, centred, labels, correct, masks, ece_bins)
  rows.append({"variant": "temperature", **_mean_over_splits(scaled)})
  host = [np.asarray(v) for v in (pmax, predicted, correct)]
  num_classes = log_probs.shape[-1]
  binned = _toplabel_splits(*host, masks, num_classes, compare_bins, ece_bins)
  rows.append({**rows[0], "variant": "toplabel", **_mean_over_splits(binned)})
  return rows


def table_row(row: Mapping[str, str | float], top1_bins: Mapping[str, float | None]) -> dict:
  """A Table-1 row: a variant's benchmark metrics beside Top-1 binning's Brier and ECE.

  Temperature scaling keeps the order of pmax, so "raw" and "temperature" share the
  Top-1 bins of the classifier's score. Top-label binning is itself a binning of
  pmax: its own Brier and ECE fill the binned cells, and as it predicts P(correct)
  only, it has no multiclass Brier (None).

  Args:
    row: one of ``benchmark_rows``.
    top1_bins: the Top-1 bins' cross-validated means at ``compare_bins`` bins,
      with keys "brier" and "ece" (a row of ``crossval.CrossValidation.rows()``).

  Returns:
    ``row`` with ``top1_estimator`` ("bins" or "toplabel"), ``top1_binned_brier``
    and ``top1_binned_ece``; for "toplabel" without ``toplabel_brier`` /
    ``toplabel_ece`` (moved to the binned cells) and ``multiclass_brier`` None.
  """
  row = dict(row)
  variant = row.get("variant")
  if variant not in VARIANTS:
    raise ValueError(f"row: expected a variant among {VARIANTS}, got {variant!r}")
  if variant != "toplabel":
    binned = {"top1_binned_brier": top1_bins["brier"], "top1_binned_ece": top1_bins["ece"]}
    return {"variant": variant, "top1_estimator": "bins", **row, **binned}
  binned = {
    "top1_binned_brier": row.pop("toplabel_brier"),
    "top1_binned_ece": row.pop("toplabel_ece"),
    "multiclass_brier": None,
  }
  return {"variant": variant, "top1_estimator": "toplabel", **row, **binned}
