r"""Demo of the core on synthetic logits: calibrated Top-1 bins for several scores.

Cross-validates Top-1 binning of every single-model score of an over-confident synthetic
classifier; prints the table (with --workdir, also results.json and results.md).

  python experiments/demo.py --num_examples=20000 --workdir=/tmp/top1_demo
"""

import os
import time

import numpy as np
from absl import flags

from top1_jax.core import events, metrics, scores
from top1_jax.evaluation import crossval
from top1_jax.io import files
from top1_jax.launch import runner
from top1_jax.version import __version__

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 20_000, "Synthetic test-set size.")
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 10, "Number of classes.")
_OVERCONFIDENCE = flags.DEFINE_float(
  "overconfidence", 3.0, "Logits are multiplied by this: > 1 makes softmax over-confident."
)
_N_BINS = flags.DEFINE_list("n_bins", ["10", "20", "100"], "Bin counts to compare.")
_N_FOLDS = flags.DEFINE_integer("n_folds", 10, "Number of calibration/test splits.")
_SCHEME = flags.DEFINE_enum("scheme", "halves", crossval.SCHEMES, "How splits are drawn.")
_SEED = flags.DEFINE_integer("seed", 0, "Draws the synthetic data and the splits.")


def _bin_counts() -> list[int]:
  """--n_bins as integers >= 1, or one line naming the flag."""
  try:
    n_bins = [int(value) for value in _N_BINS.value]
  except ValueError:
    n_bins = []
  if not n_bins or min(n_bins) < 1:
    raise runner.ExperimentError(f"--n_bins: expected integers >= 1, got {_N_BINS.value}")
  return n_bins


def synthetic_logits(num_examples, num_classes, overconfidence, seed):
  """Logits of a classifier whose evidence for the true class varies per example."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, num_examples)
  evidence = rng.gamma(2.0, 1.0, num_examples)  # easy and hard examples
  logits = rng.normal(size=(num_examples, num_classes))
  logits[np.arange(num_examples), labels] += evidence
  return (overconfidence * logits).astype(np.float32), labels


def main(argv):
  runner.no_arguments(argv)
  n_bins = _bin_counts()
  logits, labels = synthetic_logits(
    _NUM_EXAMPLES.value, _NUM_CLASSES.value, _OVERCONFIDENCE.value, _SEED.value
  )
  correct = events.topk_correct(logits, labels, k=1)
  print(
    f"synthetic data: {len(labels):,} examples, {_NUM_CLASSES.value} classes, "
    f"Top-1 accuracy {float(correct.mean()):.4f}"
  )
  raw_pmax = scores.pmax(logits)
  print(
    f"raw max-softmax used as P(correct): Brier {float(metrics.brier(raw_pmax, correct)):.4f}, "
    f"NLL {float(metrics.nll(raw_pmax, correct)):.4f}"
  )
  score_values = scores.compute(logits, topk=(2,))  # every single-model score
  splits = crossval.make_splits(len(labels), _N_FOLDS.value, _SEED.value, _SCHEME.value)
  rows = []
  ece = metrics.ece_name("N", "equal-mass", calibration=True)
  header = f"| score | bins | Brier | NLL | {ece} | EOR | {metrics.BINNED_AUROC_NAME} |"
  lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
  for name, u in score_values.items():
    start = time.perf_counter()
    cv = crossval.cross_validate(u, correct, n_bins, splits=splits)
    elapsed = time.perf_counter() - start
    for row in cv.rows():
      rows.append({"score": name, **row})
      lines.append(
        f"| {name} | {row['n_bins']} | {row['brier']:.4f} | {row['nll']:.4f} "
        f"| {row['ece']:.4f} ± {row['ece_std']:.4f} | {row['eor']:.2f} ± {row['eor_std']:.2f} "
        f"| {row['auroc']:.4f} |"
      )
    print(f"  {name}: {len(n_bins)} bin counts x {_N_FOLDS.value} splits in {elapsed:.2f} s")
  table = "\n".join(lines)
  print(table)
  if runner.WORKDIR.value:
    os.makedirs(runner.WORKDIR.value, exist_ok=True)
    config = {
      name: flags.FLAGS[name].value
      for name in ("num_examples", "num_classes", "overconfidence", "n_folds", "scheme", "seed")
    }
    result = {"config": {**config, "n_bins": n_bins}, "version": __version__, "results": rows}
    files.write_json(os.path.join(runner.WORKDIR.value, "results.json"), result)
    files.write_bytes(os.path.join(runner.WORKDIR.value, "results.md"), (table + "\n").encode())
    print(f"wrote {runner.WORKDIR.value}/results.json and results.md")
