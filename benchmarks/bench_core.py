"""Speed of the core against straightforward NumPy, measured in one run.

1. ``scores.covariance_norm`` (S x S Gram, batched, jitted) vs a per-example
   ``np.cov`` + ``eigvalsh`` of the K x K covariance, at S = 32, K = 1000.
2. ``crossval.cross_validate`` (one sort for all splits and bin counts) vs a
   NumPy loop that sorts each calibration split, bins with ``searchsorted`` and
   ``bincount`` and scores every example, at 10 splits x bins (10, 20, 100).

Both pairs are checked to agree before timing. Prints a table of times and
ratios; times are medians of repeated runs after one warm-up (jit compilation).

  python benchmarks/bench_core.py [--quick]
"""

import argparse
import pathlib
import platform
import statistics
import sys
import time

import jax
import numpy as np

from top1_jax.core import binning, scores
from top1_jax.evaluation import crossval

# The plain-loop oracle lives with the tests; it is also this benchmark's naive baseline.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import reference  # noqa: E402


def _time(fn, repeats):
  fn()  # warm-up: compilation, caches
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def numpy_loop_cross_validate(u, correct, n_bins, n_folds, seed=0, scheme="halves"):
  """The straightforward version: per split, sort the calibration part and bin."""
  splits = crossval.make_splits(len(u), n_folds, seed, scheme)
  out = {k: np.zeros((len(n_bins), n_folds)) for k in ("brier", "nll", "ece", "eor", "auroc")}
  for f in range(n_folds):
    test = splits.test_mask(f)
    u_cal, ok_cal, u_test, ok_test = u[~test], correct[~test], u[test], correct[test]
    sorted_cal = np.sort(u_cal)
    prior = ok_cal.mean()
    for b, n in enumerate(n_bins):
      edges = np.unique(sorted_cal[binning.quantile_edge_ranks(len(u_cal), n) - 1])
      cal_bin = np.searchsorted(edges, u_cal, side="left")
      test_bin = np.searchsorted(edges, u_test, side="left")
      counts = np.bincount(cal_bin, minlength=n)
      hits = np.bincount(cal_bin, ok_cal, minlength=n)
      prob = binning.calibrated_prob(hits, counts, prior)
      p = np.clip(prob[test_bin], 2.0**-23, 1 - 2.0**-23)
      test_counts = np.bincount(test_bin, minlength=n)
      test_acc = np.bincount(test_bin, ok_test, minlength=n) / np.maximum(test_counts, 1)
      weight = test_counts / len(u_test)
      odds_gap = np.abs(np.log(prob / (1 - prob)) - np.log(prior / (1 - prior)))
      out["brier"][b, f] = np.mean((p - ok_test) ** 2)
      out["nll"][b, f] = -np.mean(np.where(ok_test, np.log(p), np.log1p(-p)))
      out["ece"][b, f] = np.sum(weight * np.abs(test_acc - prob))
      out["eor"][b, f] = np.sum(weight * np.exp(odds_gap))
      out["auroc"][b, f] = reference.auroc(p, ok_test)
  return out


def bench_covariance(num_examples, num_samples=32, num_classes=1000):
  rng = np.random.default_rng(0)
  samples = rng.normal(size=(num_samples, num_examples, num_classes)).astype(np.float32)
  fast = np.asarray(scores.covariance_norm(samples))
  naive = reference.covariance_norm(samples)
  rel = float(np.max(np.abs(fast - naive) / naive))
  if rel > 1e-4:
    raise SystemExit(f"covariance_norm disagrees with np.cov: max relative error {rel:.2e}")
  t_fast = _time(lambda: scores.covariance_norm(samples), 5)
  t_naive = _time(lambda: reference.covariance_norm(samples), 1)
  return (
    f"covariance_norm S={num_samples} K={num_classes} N={num_examples}",
    t_naive,
    t_fast,
    f"max rel err {rel:.1e}",
  )


def bench_cross_validate(num_examples, repeats):
  rng = np.random.default_rng(1)
  u = rng.random(num_examples).astype(np.float32)
  correct = rng.random(num_examples) < 0.2 + 0.75 * u
  n_bins = (10, 20, 100)
  fast = crossval.cross_validate(u, correct, n_bins, 10)
  naive = numpy_loop_cross_validate(u, correct, n_bins, 10)
  worst = max(
    float(np.max(np.abs(fast.per_fold[k] - v) / np.maximum(np.abs(v), 1e-12)))
    for k, v in naive.items()
  )
  if worst > 1e-3:
    raise SystemExit(
      f"cross_validate disagrees with the NumPy loop: max relative error {worst:.2e}"
    )
  t_fast = _time(lambda: crossval.cross_validate(u, correct, n_bins, 10), repeats)
  t_naive = _time(lambda: numpy_loop_cross_validate(u, correct, n_bins, 10), max(1, repeats // 3))
  return (
    f"cross_validate N={num_examples:,} 10 splits x bins (10,20,100)",
    t_naive,
    t_fast,
    f"max rel diff {worst:.1e}",
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes (for a smoke run)")
  args = parser.parse_args()
  rows = []
  if args.quick:
    rows.append(bench_covariance(16))
    rows.append(bench_cross_validate(50_000, 3))
  else:
    rows.append(bench_covariance(128))
    rows.append(bench_cross_validate(50_000, 9))
    rows.append(bench_cross_validate(1_000_000, 5))
  print(
    f"# {platform.processor() or platform.machine()}, {jax.devices()[0].platform}, "
    f"jax {jax.__version__}, numpy {np.__version__}"
  )
  print(
    f"| {'benchmark':<58} | {'naive (s)':>10} | {'top1_jax (s)':>12} | {'speed-up':>8} | check |"
  )
  print(f"|{'-' * 60}|{'-' * 12}|{'-' * 14}|{'-' * 10}|-------|")
  for name, t_naive, t_fast, check in rows:
    print(
      f"| {name:<58} | {t_naive:>10.4f} | {t_fast:>12.4f} | {t_naive / t_fast:>7.1f}x | {check} |"
    )


if __name__ == "__main__":
  main()
