"""Every number and figure of docs/sets.md: prediction sets on the package's example data.

  python benchmarks/sets_report.py [--splits 10] [--figures docs/figures] [--no-timing]

1. Every method on the two example networks (``top1_jax.load_example``: LeNet-5 on CIFAR-10,
   DenseNet-BC-100 on CIFAR-100) at alpha = 0.1 and 0.05, over ``--splits`` random halves
   (``crossval.make_splits``, seed 0): each method at its default and aps, raps and topk
   with the other ``randomized``. Markdown tables of coverage, set size and adaptivity.
2. topk's bin count and tuning fraction on DenseNet-BC-100 at alpha = 0.1.
3. ``sets_difficulty.png``: mean set size and coverage by difficulty (the true label's rank),
   alpha = 0.1, over the same splits; the table behind it.
4. The time of ``SetPredictor.fit`` and ``predict_set`` on N = 50,000, K = 1,000 synthetic
   logits, per method: the first call (with compilation) and the best of two more; and of
   the kernels the speed rests on (sorting rows, running sums), the library's against XLA's.
"""

import argparse
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import top1_jax as t1  # noqa: E402
from top1_jax.core import scores  # noqa: E402
from top1_jax.evaluation import conformal, sets  # noqa: E402

NETWORKS = {
  "lenet-5-cifar-10": "LeNet-5, CIFAR-10",
  "densenet-bc-100-cifar-100": "DenseNet-BC-100, CIFAR-100",
}
ALPHAS = (0.1, 0.05)
VARIANTS = [(name, {}) for name in sets.METHODS] + [
  ("aps", {"randomized": False}),
  ("raps", {"randomized": False}),
  ("topk", {"randomized": True}),
]
COLORS = {"lac": "tab:blue", "aps": "tab:orange", "raps": "tab:green", "topk": "tab:red"}
DIFFICULTY = conformal.STRATUM_NAMES[:-1]  # no label ranks beyond 100 here


def _label(row) -> str:
  randomized = "" if row["method"] == "lac" else (" (rand.)" if row["randomized"] else " (det.)")
  return row["method"] + randomized


def _rows(log_probs, labels, folds) -> list[dict]:
  rows = []
  for method, options in VARIANTS:
    rows += sets.evaluate_sets(
      log_probs, labels, folds, methods=(method,), alphas=ALPHAS, **options
    )
  return rows


def _table(rows) -> str:
  lines = [
    "| method | alpha | coverage | mean size | median | empty | SSCV | k_reg, lam |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in sorted(rows, key=lambda r: r["alpha"], reverse=True):
    tuned = f"{row['k_reg']:g}, {row['lam']:g}" if row["k_reg"] is not None else ""
    lines.append(
      f"| {_label(row)} | {row['alpha']} | {row['coverage']:.4f} ± {row['coverage_std']:.4f}"
      f" | {row['mean_size']:.2f} | {row['median_size']:.1f} | {row['empty_fraction']:.3f}"
      f" | {row['sscv']:.3f} ± {row['sscv_std']:.3f} | {tuned} |"
    )
  return "\n".join(lines)


def _reachable(num_classes: int) -> list[str]:
  """The strata names whose smallest size is at most K."""
  return [
    n for n, (low, _) in zip(DIFFICULTY, conformal.STRATA, strict=False) if low <= num_classes
  ]


def _strata_table(rows, alpha: float, num_classes: int) -> str:
  names = _reachable(num_classes)
  head = " | ".join(f"size {n.replace('_', '-')}" for n in names)
  lines = [f"| method | {head} |", "|---" * (len(names) + 1) + "|"]
  for row in rows:
    if row["alpha"] != alpha:
      continue
    cells = []
    for n in names:
      coverage = row[f"coverage_size_{n}"]
      cells.append(
        f"{row[f'fraction_size_{n}']:.3f} / " + ("–" if coverage is None else f"{coverage:.2f}")
      )
    lines.append(f"| {_label(row)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _difficulty_table(rows, alpha: float, num_classes: int) -> str:
  names = _reachable(num_classes)
  head = " | ".join(f"rank {n.replace('_', '-').replace('0-1', '1')}" for n in names)
  lines = [f"| method | {head} |", "|---" * (len(names) + 1) + "|"]
  for row in rows:
    if row["alpha"] == alpha:
      cells = [
        f"{row[f'size_difficulty_{n}']:.1f} / {row[f'coverage_difficulty_{n}']:.2f}"
        if row[f"size_difficulty_{n}"] is not None
        else "–"
        for n in names
      ]
      lines.append(f"| {_label(row)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _figure(results: dict, path: pathlib.Path, alpha: float) -> None:
  fig, axes = plt.subplots(2, len(results), figsize=(5.2 * len(results), 7), squeeze=False)
  ticks = [n.replace("_", "-").replace("0-1", "1") for n in DIFFICULTY]
  for column, (title, rows) in enumerate(results.items()):
    for row in rows:
      if row["alpha"] != alpha:
        continue
      size = [row[f"size_difficulty_{n}"] for n in DIFFICULTY]
      cover = [row[f"coverage_difficulty_{n}"] for n in DIFFICULTY]
      x = [i for i, v in enumerate(size) if v is not None]
      style = "--" if row["method"] != "lac" and row["randomized"] else "-"
      color = COLORS[row["method"]]
      kwargs = dict(marker="o", linestyle=style, color=color, label=_label(row))
      axes[0, column].plot(x, [size[i] for i in x], **kwargs)
      axes[1, column].plot(x, [cover[i] for i in x], **kwargs)
    axes[0, column].set(title=title, ylabel="mean set size")
    axes[1, column].axhline(1 - alpha, color="gray", linewidth=0.8)
    axes[1, column].set(
      ylabel="coverage", xlabel="difficulty: rank of the true label", ylim=(0, 1.02)
    )
    for ax in axes[:, column]:
      ax.set_xticks(range(len(ticks)), ticks)
  axes[0, 0].legend(fontsize=8)
  fig.suptitle(
    f"Prediction sets at alpha = {alpha} by difficulty, mean over splits (dashed: randomized)"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _tuning(log_probs, labels, folds) -> str:
  lines = ["| topk setting | coverage | mean size | SSCV |", "|---|---|---|---|"]
  for options in (
    {"n_bins": 10},
    {"n_bins": 20},
    {"n_bins": 50},
    {"tune_fraction": 0.3},
    {"tune_fraction": 0.7},
  ):
    (row,) = sets.evaluate_sets(
      log_probs, labels, folds, methods=("topk",), alphas=(0.1,), **options
    )
    setting = ", ".join(f"{k}={v}" for k, v in options.items())
    lines.append(
      f"| {setting} | {row['coverage']:.4f} | {row['mean_size']:.2f} | {row['sscv']:.3f} |"
    )
  return "\n".join(lines)


def _best_of_two(fn, *args) -> float:
  jax.block_until_ready(fn(*args))  # compiles
  times = []
  for _ in range(2):
    tic = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - tic)
  return min(times)


def _kernels(logits: np.ndarray) -> str:
  """The two choices the speed rests on: who sorts, and how running sums are taken."""
  ordered = np.sort(logits, axis=-1)
  probs = jnp.asarray(np.exp(ordered - ordered[:, -1:]))
  rows = [
    ("sort rows, NumPy on the host", _best_of_two(np.sort, logits, -1)),
    ("sort rows, XLA (jnp.sort, jitted)", _best_of_two(jax.jit(jnp.sort), logits)),
    (
      "running sums, XLA (jnp.cumsum, jitted)",
      _best_of_two(jax.jit(jnp.cumsum, static_argnums=1), probs, 1),
    ),
    (
      "running sums, conformal.cumulative_sum (jitted)",
      _best_of_two(jax.jit(conformal.cumulative_sum), probs),
    ),
  ]
  lines = ["| [50 000, 1 000] float32 | best of two |", "|---|---|"]
  return "\n".join(lines + [f"| {name} | {seconds:.2f} s |" for name, seconds in rows])


def _timing() -> str:
  rng = np.random.default_rng(0)
  num, num_classes = 50_000, 1_000
  labels = rng.integers(0, num_classes, num)
  logits = rng.normal(size=(num, num_classes)).astype(np.float32)
  logits[np.arange(num), labels] += 3 * rng.gamma(2.0, 1.0, num).astype(np.float32)
  kernels = _kernels(logits)
  lines = [
    "| method | fit, first | fit | predict_set, first | predict_set | mean size |",
    "|---|---|---|---|---|---|",
  ]
  for method in sets.METHODS:
    times = {"fit": [], "predict": []}
    for _ in range(3):
      predictor = t1.SetPredictor(method)
      tic = time.perf_counter()
      predictor.fit(logits, labels)
      times["fit"].append(time.perf_counter() - tic)
      tic = time.perf_counter()
      mask = predictor.predict_set(logits, alpha=0.1)
      times["predict"].append(time.perf_counter() - tic)
    fit, predict = times["fit"], times["predict"]
    lines.append(
      f"| {method} | {fit[0]:.1f} s | {min(fit[1:]):.1f} s | {predict[0]:.1f} s"
      f" | {min(predict[1:]):.1f} s | {mask.sum(axis=1).mean():.1f} |"
    )
  load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
  cores = f"load average (1, 5, 15 min) after the runs: {load}; {os.cpu_count()} cores"
  return "\n".join(lines) + f"\n\n{kernels}\n\n{cores}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--splits", type=int, default=10, help="random halves (5x2 for 10)")
  parser.add_argument("--figures", default="docs/figures", help="folder of the figure")
  parser.add_argument("--no-timing", action="store_true", help="skip the 50,000 x 1,000 timing")
  parser.add_argument("--timing-only", action="store_true", help="only the timing")
  args = parser.parse_args()
  results = {}
  for name, title in ({} if args.timing_only else NETWORKS).items():
    example = t1.load_example(name)
    log_probs = scores.log_probs_from_probs(example.probs)
    folds = t1.make_splits(log_probs.shape[0], args.splits, seed=0)
    accuracy = np.mean(np.argmax(example.probs, axis=1) == example.labels)
    print(
      f"\n## {title}: N = {log_probs.shape[0]}, K = {example.num_classes}, accuracy {accuracy:.4f}"
    )
    tic = time.perf_counter()
    rows = results[title] = _rows(log_probs, example.labels, folds)
    print(f"({len(rows)} rows in {time.perf_counter() - tic:.1f} s)\n")
    print(_table(rows))
    for alpha in ALPHAS:
      print(f"\nSet-size strata at alpha = {alpha} (fraction of examples / their coverage):\n")
      print(_strata_table(rows, alpha, example.num_classes))
    print("\nBy difficulty at alpha = 0.1 (mean size / coverage):\n")
    print(_difficulty_table(rows, 0.1, example.num_classes))
    if name.startswith("densenet"):
      print("\ntopk's settings, alpha = 0.1:\n")
      print(_tuning(log_probs, example.labels, folds))
  if results:
    figure = pathlib.Path(args.figures) / "sets_difficulty.png"
    _figure(results, figure, 0.1)
    print(f"\nwrote {figure}")
  if not args.no_timing:
    print("\n## Time on N = 50,000, K = 1,000 synthetic logits\n")
    print(_timing())


if __name__ == "__main__":
  main()
