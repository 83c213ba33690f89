r"""Evaluate at ImageNet scale: time and peak memory against one NumPy pass over the file.

  python benchmarks/bench_scale.py               # [1, 50000, 1000] and [32, 20000, 1000]
  python benchmarks/bench_scale.py --quick       # [1, 5000, 1000] and [8, 2000, 1000]
  python benchmarks/bench_scale.py --compressed  # the files written by np.savez_compressed

For each synthetic predictions file (float32 logits of a 1,000-class model with
about 40 % Top-1 accuracy, 39.6 % on the single-model file; written to a
temporary folder), in one run: the seconds of one NumPy pass (load + softmax),
then the evaluate stage on it as a subprocess (its peak RSS from the kernel, its
stages from timings.json),
and the ratios the targets are stated in: evaluate without figures over the
NumPy pass (target <= 5), peak RSS over the file's size (target <= 0.5 for
samples files). ``--compressed`` writes the files with ``np.savez_compressed``
(the NumPy pass then inflates them; evaluate's reader inflates each large array
into a temporary file and reads it by chunks).

Evaluate runs three times per file, into fresh work dirs: "cold" with an empty
compilation cache (a first run), then "rerun" with the programs the first one
cached (``top1_jax.launch.runner`` turns JAX's persistent cache on), as a user's
second evaluate of a sweep finds them, and "warm": its stages run three times in
one process, the faster of the last two timed (every program traced and compiled: what the data
itself costs, without the process's fixed costs).

Where a fresh process's fixed costs go: each run also sums JAX's own compile-time
events (``jax.monitoring``) over its programs, figures left out: seconds of
tracing to jaxprs, lowering to MLIR, and compiling or loading from the cache
(XLA's part), and how many programs. They are part of the stages' seconds.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAGES = ("load", "scores", "sweep", "comparison", "sets", "write", "figures")
COMPILE_EVENTS = {
  "trace": "/jax/core/compile/jaxpr_trace_duration",
  "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "compile or load": "/jax/core/compile/backend_compile_duration",
}
"""JAX's compile-time events, by the name of their column."""
COSTS_FILE = "jax_compile.json"  # in the work dir, beside timings.json


def make_file(
  path: pathlib.Path, num_samples: int, num: int, classes: int = 1000, compressed: bool = False
) -> None:
  rng = np.random.default_rng(0)
  labels = rng.integers(0, classes, num)
  base = rng.normal(size=(num, classes)).astype(np.float32)
  base[np.arange(num), labels] += rng.gamma(2.0, 1.5, num).astype(np.float32)
  shape = (num_samples, num, classes)
  noise = 0.3 * rng.standard_normal(shape, dtype=np.float32) if num_samples > 1 else 0.0
  logits = (base[None] + noise).astype(np.float32)
  save = np.savez_compressed if compressed else np.savez
  save(path, labels=labels, logits=logits, meta=np.array(json.dumps({"method": "external"})))


def numpy_pass(path: pathlib.Path) -> float:
  start = time.perf_counter()
  with np.load(path) as data:
    logits = data["logits"]
  z = logits - logits.max(-1, keepdims=True)
  np.exp(z, out=z)
  z /= z.sum(-1, keepdims=True)
  return time.perf_counter() - start


def _compile_costs() -> dict:
  """Seconds per ``COMPILE_EVENTS`` column (and the programs compiled or loaded), summed
  from now on, updated in place, until evaluate starts its figures: like the
  ratio, they leave the figures out."""
  from jax import monitoring  # noqa: PLC0415 (a child only: the parent never imports jax)

  from top1_jax.pipeline import sweep

  costs = dict.fromkeys(COMPILE_EVENTS, 0.0) | {"programs": 0, "figures": False}
  column = {event: name for name, event in COMPILE_EVENTS.items()}

  def listener(event: str, duration: float, **_) -> None:
    if event in column and not costs["figures"]:
      costs[column[event]] += duration
      costs["programs"] += event == COMPILE_EVENTS["compile or load"]

  def write_figures(*args, **kwargs):
    costs["figures"] = True  # the last stage: Table 1's thread is done
    return draw(*args, **kwargs)

  draw, sweep.write_figures = sweep.write_figures, write_figures
  monitoring.register_event_duration_secs_listener(listener)
  return costs


def _write_costs(costs: dict) -> None:
  from top1_jax.launch import runner

  (pathlib.Path(str(runner.workdir())) / COSTS_FILE).write_text(json.dumps(costs))


def _evaluate_once() -> None:
  """The child of a "cold" or "rerun" run: the evaluate stage (``pipeline.sweep``) itself,
  its JAX compile costs written beside its timings.json."""
  sys.path.insert(0, str(ROOT))
  from top1_jax.launch import config_flag, runner
  from top1_jax.pipeline import sweep

  config_flag.define("default")
  costs = _compile_costs()

  def main(argv):
    sweep.run(config_flag.settings(), runner.workdir(), runner.tasks())
    _write_costs(costs)

  runner.run(main, cpu_device_per_core=True)


WARM_RUNS = 3
"""A "warm" child runs evaluate's stages this many times; the fastest after the first counts."""


def _evaluate_warm() -> None:
  """The child of a "warm" run: evaluate's stages ``WARM_RUNS`` times in this process (the
  sweep's saved points removed before each, or a run would reuse them); the stage seconds
  of the fastest run after the first go to timings.json, its compile costs beside them
  (zero: the first run compiled everything)."""
  sys.path.insert(0, str(ROOT))
  from top1_jax.launch import config_flag, runner
  from top1_jax.pipeline import sources, sweep

  config_flag.define("default")
  costs = _compile_costs()

  def main(argv):
    del argv
    settings = config_flag.settings()
    asked = sources.asked_files(settings, runner.workdir())
    fastest, fastest_costs = None, None
    for run in range(WARM_RUNS):
      shutil.rmtree(str(runner.workdir() / "sweep"), ignore_errors=True)
      costs.update(dict.fromkeys(COMPILE_EVENTS, 0.0), programs=0, figures=False)
      start = time.perf_counter()
      timings = sweep.evaluate(settings, runner.workdir(), asked)
      timings["total"] = time.perf_counter() - start
      if run and (fastest is None or timings["total"] < fastest["total"]):
        fastest, fastest_costs = timings, dict(costs)
    (pathlib.Path(str(runner.workdir())) / "timings.json").write_text(json.dumps(fastest))
    _write_costs(fastest_costs)

  runner.run(main, cpu_device_per_core=True)


def evaluate(path: pathlib.Path, workdir: pathlib.Path, cache: pathlib.Path, warm: bool = False):
  """Wall seconds, peak RSS in bytes, timings.json and JAX compile costs of one evaluate
  run (``warm``: of the fastest after the first of ``WARM_RUNS`` in one process)."""
  child = "--evaluate-warm" if warm else "--evaluate-once"
  args = [sys.executable, str(pathlib.Path(__file__).resolve()), child]
  args += ["--config=evaluate_files"]
  args += [f"--workdir={workdir}", f"--config.inputs={path}", "--config.n_bins=(10,20,100)"]
  args += ["--config.topk=(1,5)", "--config.estimators=(bins,)", "--verbosity=-1"]
  # A fresh parent per run: RUSAGE_CHILDREN's peak is the largest child's so far.
  measure = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
  )
  start = time.perf_counter()
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
  out = subprocess.run([sys.executable, "-c", measure, *args], cwd=ROOT, check=True, text=True,
                       capture_output=True, env=env)  # fmt: skip
  wall = time.perf_counter() - start
  peak = int(out.stdout.split()[-1]) * 1024  # kilobytes on Linux
  costs = json.loads((workdir / COSTS_FILE).read_text())
  return wall, peak, json.loads((workdir / "timings.json").read_text()), costs


def main() -> None:
  quick, compressed = "--quick" in sys.argv, "--compressed" in sys.argv
  shapes = [(1, 5000), (8, 2000)] if quick else [(1, 50000), (32, 20000)]
  header = (
    "| file | MB | NumPy pass s | run | "
    + " | ".join(STAGES)
    + " | no figures s | ratio | peak RSS MB | RSS / file | "
    + " | ".join(f"JAX {name} s" for name in COMPILE_EVENTS)
    + " | programs |"
  )
  print(header)
  print("|---" * (header.count("|") - 1) + "|")
  with tempfile.TemporaryDirectory() as folder:
    for num_samples, num in shapes:
      path = pathlib.Path(folder) / f"s{num_samples}_n{num}.npz"
      make_file(path, num_samples, num, compressed=compressed)
      size = path.stat().st_size
      reference = min(numpy_pass(path) for _ in range(2))
      cache = pathlib.Path(folder) / f"xla{num_samples}_{num}"
      for run in ("cold", "rerun", "warm"):
        workdir = pathlib.Path(folder) / f"w{num_samples}_{num}_{run}"
        wall, peak, timings, costs = evaluate(path, workdir, cache, warm=run == "warm")
        work = timings["total"] - timings.get("figures", 0.0)
        cells = " | ".join(f"{timings.get(stage, 0.0):.2f}" for stage in STAGES)
        jax_cells = " | ".join(f"{costs[name]:.2f}" for name in COMPILE_EVENTS)
        print(
          f"| [{num_samples}, {num}, 1000] | {size / 1e6:.0f} | {reference:.2f} | {run} | {cells} "
          f"| {work:.2f} | {work / reference:.1f}x | {peak / 1e6:.0f} | {peak / size:.2f} "
          f"| {jax_cells} | {costs['programs']} |",
          flush=True,
        )
      path.unlink()


if __name__ == "__main__":
  children = {"--evaluate-once": _evaluate_once, "--evaluate-warm": _evaluate_warm}
  child = next((flag for flag in children if flag in sys.argv), None)
  if child is None:
    main()
  else:
    sys.argv.remove(child)
    children[child]()
