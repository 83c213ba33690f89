"""The paper's Table 1 (comparison.benchmark_rows) against a split-by-split oracle.

The oracle is the way the evaluate launcher computed the table before it moved
into the library: per split, the softmax in NumPy, then the public single-metric
functions of ``baselines``, ``metrics`` and ``toplabel`` on the test part.
"""

import types

import numpy as np
import pytest

from top1_jax.core import events, metrics, scores
from top1_jax.estimators import toplabel
from top1_jax.evaluation import baselines, crossval
from top1_jax.io import predictions
from top1_jax.io.examples import load_example
from top1_jax.sweep import comparison, runner


def _split_metrics(log_probs, labels, variant, test, ece_bins, compare_bins):
  """One split's metrics of one variant, one public call at a time."""
  log_probs = np.asarray(log_probs)
  temperature = 1.0
  if variant == "temperature":
    temperature = float(baselines.fit_temperature(log_probs[~test], labels[~test]))
    log_probs = np.asarray(baselines.apply_temperature(log_probs, temperature))
  probs = np.exp(log_probs - log_probs.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  pmax, predicted = probs.max(1), probs.argmax(1)
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


def _oracle_rows(log_probs, labels, splits, variants, ece_bins, compare_bins):
  rows = []
  for variant in variants:
    per_split = [
      _split_metrics(log_probs, labels, variant, splits.test_mask(f), ece_bins, compare_bins)
      for f in range(splits.num_splits)
    ]
    rows.append({k: float(np.mean([p[k] for p in per_split])) for k in per_split[0]})
  return rows


def _real(name, num):
  data = load_example(name)
  return scores.log_probs_from_probs(data.probs[:num]), data.labels[:num]


def _synthetic(num, num_classes=3):
  """Overconfident logits (three times the true ones) of a few well-filled classes."""
  rng = np.random.default_rng(5)
  z = rng.normal(size=(num, num_classes)).astype(np.float32)
  return 3 * z, np.argmax(z + rng.gumbel(size=z.shape), axis=-1)


@pytest.mark.parametrize(
  "data, compare_bins, own_bins",
  [
    (lambda: _real("densenet-bc-100-cifar-100", 2000), 5, 0),
    (lambda: _synthetic(2000), 5, 3),
  ],
  ids=["densenet", "synthetic"],
)
def test_benchmark_rows_match_the_split_by_split_oracle(data, compare_bins, own_bins):
  log_probs, labels = data()
  splits = crossval.make_splits(labels.shape[0], 2, seed=1)
  rows = comparison.benchmark_rows(
    log_probs, labels, splits, single_model=True, compare_bins=compare_bins, ece_bins=15
  )
  expected = _oracle_rows(log_probs, labels, splits, comparison.VARIANTS, 15, compare_bins)
  assert [r["variant"] for r in rows] == list(comparison.VARIANTS)
  for row, want in zip(rows, expected, strict=True):
    assert set(row) == {"variant", *want}
    for key, value in want.items():
      # float32 sums in another order (the oracle's ECE is itself ~2e-6 off the float64
      # value on DenseNet); top-label bins also see ties of saturated pmax round apart.
      tolerance = 1e-4 if key.startswith("toplabel") else 1e-5
      assert row[key] == pytest.approx(value, rel=1e-5, abs=tolerance), (row["variant"], key)
  raw, scaled, binned = rows
  assert scaled["temperature"] > 1.2 and scaled["confidence_ece"] < raw["confidence_ece"] / 2
  assert binned["toplabel_classes_with_own_bins"] == own_bins
  assert binned["toplabel_ece"] < raw["confidence_ece"] / 2
  # A model with samples (MC dropout, an ensemble): the raw row only, the same numbers.
  assert rows[:1] == comparison.benchmark_rows(
    log_probs, labels, splits, single_model=False, compare_bins=compare_bins, ece_bins=15
  )
  # The label terms handed over (as runner.Source does from its scoring pass): the same rows.
  given = events.label_terms(log_probs, labels)
  assert rows == comparison.benchmark_rows(
    log_probs, labels, splits, single_model=True, compare_bins=compare_bins, ece_bins=15,
    label_terms=given,
  )  # fmt: skip


def test_table_row_puts_each_variant_beside_its_binned_cells():
  top1 = {"n_bins": 10, "brier": 0.1, "ece": 0.02}
  raw = {"variant": "raw", "multiclass_brier": 0.5, "confidence_ece": 0.1, "raw_top1_brier": 0.2}
  raw["temperature"] = 1.0
  row = comparison.table_row(raw, top1)
  assert row == {
    **raw,
    "top1_estimator": "bins",
    "top1_binned_brier": 0.1,
    "top1_binned_ece": 0.02,
  }
  binned = {**raw, "variant": "toplabel", "toplabel_brier": 0.15, "toplabel_ece": 0.03}
  binned["toplabel_classes_with_own_bins"] = 7.0
  row = comparison.table_row(binned, top1)
  assert row["top1_estimator"] == "toplabel" and row["multiclass_brier"] is None
  assert (row["top1_binned_brier"], row["top1_binned_ece"]) == (0.15, 0.03)
  assert "toplabel_brier" not in row and row["toplabel_classes_with_own_bins"] == 7.0
  assert "toplabel_brier" in binned  # the input is left alone


LOG_PROBS = np.log(np.full((20, 3), 1 / 3, np.float32))
LABELS = np.arange(20) % 3
SPLITS = crossval.make_splits(20, 2)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"log_probs": LOG_PROBS[:, :1]}, "log_probs: expected at least 2 classes"),
    ({"labels": LABELS + 1}, r"labels: labels out of range \[0, 3\)"),
    ({"splits": crossval.make_splits(21, 2)}, "splits: made for 21 examples, log_probs has 20"),
    ({"splits": "halves"}, "splits: expected crossval.Splits"),
    ({"compare_bins": 11}, "compare_bins: expected at least 1, at most 10, got 11"),
    ({"ece_bins": 0}, "ece_bins: expected at least 1, got 0"),
    ({"label_terms": (1, 2)}, "label_terms: expected events.LabelTerms, got tuple"),
    (
      {"label_terms": events.label_terms(LOG_PROBS[:10], LABELS[:10])},
      r"label_terms: expected \[20\] arrays, got shapes \[\(10,\), \(10,\), \(10,\)\]",
    ),
  ],
)
def test_bad_input_gets_a_one_line_value_error(kwargs, message):
  args = {"log_probs": LOG_PROBS, "labels": LABELS, "splits": SPLITS, "compare_bins": 5}
  args.update(kwargs)
  with pytest.raises(ValueError, match=message) as info:
    comparison.benchmark_rows(
      args.pop("log_probs"), args.pop("labels"), args.pop("splits"), single_model=True, **args
    )
  assert "\n" not in str(info.value)
  with pytest.raises(ValueError, match="row: expected a variant"):
    comparison.table_row({"variant": "histogram"}, {"brier": 0.1, "ece": 0.1})


def test_sweep_table1_from_benchmarks_computed_beside_the_sweep(tmp_path):
  # top1_jax.launch.evaluate computes runner.benchmarks in a thread while runner.run runs.
  log_probs, labels = _synthetic(600)
  path = predictions.save_predictions(
    tmp_path / "p.npz", predictions.Predictions(labels=labels, logits=log_probs)
  )
  s = types.SimpleNamespace(
    n_bins=(5, 10), topk=(1,), n_folds=2, scheme="halves", seeds=(0,), scores=("all",),
    estimators=("bins",), compare_bins=5, ece_bins=15, selective_targets=(0.9,),
    selective_delta=0.1,
  )  # fmt: skip
  sources = runner.load_sources([("model", path)], s)
  records = runner.run(s, sources, tmp_path / "sweep", log=lambda line: None)
  benchmarked = runner.benchmarks(s, sources)
  assert list(benchmarked) == ["model"]
  table = runner.table1(s, sources, records, benchmarked)
  assert table == runner.table1(s, sources, records)
  assert [row["variant"] for row in table] == list(comparison.VARIANTS)
  # No Top-1 point in the sweep: no Table 1, and nothing computed for it.
  s.topk = (2,)
  assert runner.benchmarks(s, sources) == {}
  assert runner.table1(s, sources, runner.run(s, sources, tmp_path / "k2", log=print)) == []
