"""Fitting and applying quantile bins, against the calibration libraries people use.

At each N (default 1e4, 1e6, 1e8) the same float32 scores u ~ U(0, 1), with
correct ~ Bernoulli(u), go through:

* ``np.sort(u)``: the unit; every row is also given as a multiple of it;
* ``binning.fit(u, correct, 20)`` and ``binning.predict(bins, u)``, alone and
  together, on the default path and forced onto the jitted one;
* netcal's ``HistogramBinning(bins=20)``: fit + transform;
* scikit-learn's ``IsotonicRegression``: fit + predict;
* ``sklearn.calibration.calibration_curve(strategy="quantile", n_bins=20)``: a fit
  only (it returns the bins' accuracies and has no apply step);
* relplot's ``estimators.Binning(20)`` (equal-width bins): fit + predict.

Each call is run once to warm up (jit compilation, page faults) and then timed
best-of ``--repeats`` (fewer once a call has used ``--budget_s``), one call at a
time, all in this one process. The peers are benchmark-only dependencies
(``pip install -r requirements-bench.txt``); a missing one is skipped with a hint.
At N above ``--peer_max_size`` (default 1e6) the peers and the jitted path are
skipped, as they need minutes and gigabytes there; relplot's estimator loops in
Python over the examples and is never run above 1e6.

  python benchmarks/bench_peers.py [--sizes 1e4,1e6,1e8] [--repeats 5] [--peer_max_size 1e8]
"""

import argparse
import dataclasses
import gc
import importlib.metadata
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable

import jax
import numpy as np

from top1_jax.core import binning

N_BINS = 20
RELPLOT_MAX_SIZE = 10**6  # a Python loop per example


@dataclasses.dataclass(frozen=True)
class Call:
  """One timed row: ``make(u, correct)`` returns the zero-argument call to time."""

  name: str
  make: Callable
  package: str | None = None  # the peer's distribution, if this row needs one
  peer: bool = False  # skipped above --peer_max_size
  max_size: int | None = None  # never run above this N


def _netcal(u, correct):
  from netcal.binning import HistogramBinning

  return lambda: HistogramBinning(bins=N_BINS).fit(u, correct).transform(u)


def _isotonic(u, correct):
  from sklearn.isotonic import IsotonicRegression

  return lambda: IsotonicRegression(out_of_bounds="clip").fit(u, correct).predict(u)


def _calibration_curve(u, correct):
  from sklearn.calibration import calibration_curve

  return lambda: calibration_curve(correct, u, n_bins=N_BINS, strategy="quantile")


def _relplot(u, correct):
  from relplot.estimators import Binning

  column = u[:, None]
  return lambda: Binning(N_BINS).fit(column, correct).predict(column)


def _ours(implementation=None, fit=True, predict=True):
  def make(u, correct):
    fit_now = lambda: binning.fit(u, correct, N_BINS, implementation=implementation)
    fitted = None if fit else fit_now()

    def call():
      bins = fit_now() if fit else fitted
      return binning.predict(bins, u) if predict else bins

    return call

  return make


CALLS = (
  Call("np.sort(u)", lambda u, correct: lambda: np.sort(u)),
  Call("binning.fit", _ours(predict=False)),
  Call("binning.predict", _ours(fit=False)),
  Call("binning.fit + predict", _ours()),
  Call("binning.fit + predict, implementation='jit'", _ours("jit"), peer=True),
  Call("netcal HistogramBinning(20) fit + transform", _netcal, "netcal", peer=True),
  Call("sklearn IsotonicRegression fit + predict", _isotonic, "scikit-learn", peer=True),
  Call(
    "sklearn calibration_curve(quantile, 20), fit only",
    _calibration_curve,
    "scikit-learn",
    peer=True,
  ),
  Call(
    "relplot Binning(20) fit + predict", _relplot, "relplot", peer=True, max_size=RELPLOT_MAX_SIZE
  ),
)


def _best_of(call: Callable, repeats: int, budget_s: float) -> float:
  jax.block_until_ready(call())  # warm-up
  best, spent = float("inf"), 0.0
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    elapsed = time.perf_counter() - start
    best, spent = min(best, elapsed), spent + elapsed
    if spent > budget_s:
      break
  return best


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1e4,1e6,1e8", help="comma-separated N")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per call (best of)")
  parser.add_argument("--budget_s", type=float, default=30.0, help="stop repeating after this")
  parser.add_argument(
    "--peer_max_size", type=float, default=1e6, help="largest N for the peers and the jitted path"
  )
  args = parser.parse_args()
  sizes = [int(float(s)) for s in args.sizes.split(",")]
  warnings.filterwarnings("ignore")  # the peers' deprecation chatter

  versions = {p: _version(p) for p in ("netcal", "scikit-learn", "relplot")}
  for package, version in versions.items():
    if version is None:
      print(
        f"{package} not installed: skipping its rows (pip install -r requirements-bench.txt)",
        file=sys.stderr,
      )
  print(
    f"{os.cpu_count()} CPU core(s) ({_cpu_model()}), jax {jax.__version__} backend"
    f" {jax.default_backend()}, numpy {np.__version__}, Python {platform.python_version()}, "
    + ", ".join(f"{p} {v}" for p, v in versions.items() if v)
  )
  print(f"best of {args.repeats} after a warm-up; {N_BINS} bins; float32 scores\n")
  print("| N | call | seconds | × np.sort |")
  print("|---|---|---:|---:|")
  skipped = []
  for num in sizes:
    rng = np.random.default_rng(0)
    u = rng.random(num, dtype=np.float32)
    correct = rng.random(num, dtype=np.float32) < u
    sort_s = None
    for call in CALLS:
      if call.package and versions[call.package] is None:
        continue
      if call.max_size is not None and num > call.max_size:
        skipped.append(f"N={num:.0e}: {call.name} (loops in Python per example)")
        continue
      if call.peer and num > args.peer_max_size:
        skipped.append(f"N={num:.0e}: {call.name} (above --peer_max_size)")
        continue
      seconds = _best_of(call.make(u, correct), args.repeats, args.budget_s)
      sort_s = sort_s or seconds  # np.sort is the first row
      print(f"| {num:.0e} | {call.name} | {seconds:.4g} | {seconds / sort_s:.2f} |", flush=True)
      gc.collect()
    del u, correct
  for line in skipped:
    print(f"skipped {line}")


if __name__ == "__main__":
  main()
