"""Speed of the shift protocol (``evaluation.protocol.evaluate_shifts``) at the shift config's size.

Synthetic: N clean examples (K = 10) and S shifted sets of the same examples (logits
shrunk and noised more and more), ``--scores`` scores each (noisy transforms of
-log pmax), every method on 10 halves splits, bins (10, 20, 100); then the OOD report
of two OOD sets. Prints the wall time of each call, the first (with compilation) and a
second one.

  python benchmarks/bench_shift.py [--num 1000] [--sets 70] [--scores 8]
"""

import argparse
import time

import jax
import numpy as np

from top1_jax.evaluation import crossval, ood, protocol

ESTIMATORS = ("raw", "bins", "isotonic", "kde", "temperature", "toplabel")


def _inputs(logits, labels, num_scores, rng):
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float32)
  base = -log_probs.max(axis=1)
  scores = {"neg_log_pmax": base}
  for i in range(1, num_scores):
    scores[f"score_{i}"] = (base + 0.1 * i * rng.random(base.shape)).astype(np.float32)
  return protocol.Inputs(log_probs, labels, scores)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num", type=int, default=1000, help="clean examples N")
  parser.add_argument("--sets", type=int, default=70, help="shifted sets S")
  parser.add_argument("--scores", type=int, default=8, help="scores per set")
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, args.num)
  logits = rng.normal(size=(args.num, 10)).astype(np.float32)
  logits[np.arange(args.num), labels] += rng.gamma(2.0, 1.0, args.num).astype(np.float32)
  logits *= 3
  clean = _inputs(logits, labels, args.scores, rng)
  shifted = {}
  for s in range(args.sets):
    level = s / max(args.sets - 1, 1)
    noisy = logits * (1 - 0.5 * level) + 3 * level * rng.normal(size=logits.shape)
    shifted[f"set_{s}"] = _inputs(noisy.astype(np.float32), labels, args.scores, rng)
  ood_sets = {
    f"ood_{o}": _inputs(
      3 * rng.normal(size=(args.num, 10)).astype(np.float32), None, args.scores, rng
    )
    for o in range(2)
  }
  splits = crossval.make_splits(args.num, 10, 0)
  names = list(clean.scores)
  kwargs = dict(scores=names, estimators=ESTIMATORS, log_probs_score="neg_log_pmax")
  print(f"N = {args.num}, S = {args.sets} sets, {len(names)} scores, {ESTIMATORS}, 10 splits")
  for attempt in ("first", "second"):
    tic = time.perf_counter()
    results = protocol.evaluate_shifts(clean, shifted, splits, n_bins=(10, 20, 100), **kwargs)
    middle = time.perf_counter()
    report = ood.ood_report(clean, ood_sets, splits, **kwargs)
    end = time.perf_counter()
    print(
      f"{attempt}: evaluate_shifts {middle - tic:.2f} s ({len(results)} results), "
      f"ood_report {end - middle:.2f} s ({len(report)} results)"
    )


if __name__ == "__main__":
  main()
