"""The covariance 2-norm of MC samples against the machine's own matmul rate, in one process.

``scores.covariance_norm`` of [S, N, K] samples (S = 32, N = 10,000) as a FLOP rate
next to the rate of a plain jitted 2048 x 2048 float32 matmul (full float32
precision). FLOPs are those of the Gram / covariance matmul: 2 m^2 max(S, K) per
example, m = min(S, K).

1. K = 1000 (the S x S Gram route) and K = 10 (the K x K route), each against the
   previous implementation (one LAPACK ``eigvalsh`` per example on the CPU, one
   batched call elsewhere), after checking both against float64 NumPy on 256
   examples; ``covariance.covariance_norm`` is what ``mc.predict`` runs on device,
   ``scores.covariance_norm`` the checked public entry point around it;
2. at K = 1000, its two halves on the same samples: the Gram matmuls alone (one
   [S, K] x [K, S] matmul per example, the ceiling of the CPU route), and the
   eigenvalue step alone on the 10,000 Gram matrices: ``covariance.top_eigenvalue``
   (batched Lanczos on the CPU) vs one ``eigvalsh`` per matrix vs one batched
   ``eigvalsh``.

3. at both K, the kernel on all of the host's JAX CPU devices at once (one per core,
   ``--cpu_devices``, as the evaluate stage sets them), a share of the examples
   each: XLA runs the small matmuls of one device on one core.

Times are the best of ``--repeats`` warm runs (compiled, ``block_until_ready``); the
matmul rate is the better of a run before and one after.

  python benchmarks/bench_covariance.py [--quick] [--repeats=5]
"""

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax.core import scores
from top1_jax.kernels import covariance


class Row(NamedTuple):
  case: str
  seconds: float
  gflops: float | None = None  # GFLOP/s, where a FLOP count is meaningful
  baseline_seconds: float | None = None  # the same work done the previous / naive way
  note: str = ""


def _best(fn: Callable[[], object], repeats: int) -> float:
  """Best wall time of ``repeats`` runs after one warm-up run (compilation)."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def _matmul_gflops(repeats: int, size: int = 2048) -> float:
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
  product = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
  return 2 * size**3 / _best(lambda: product(a, b), repeats) / 1e9


@jax.jit
def _previous_covariance_norm(samples: jax.Array) -> jax.Array:
  """The implementation being replaced: batched products, then on the CPU one ``eigvalsh`` per
  example (its batched form could deadlock there), elsewhere one batched ``eigvalsh``."""
  num_samples, _, num_classes = samples.shape
  per_example = jnp.transpose(samples, (1, 0, 2))
  centred = per_example - jnp.mean(per_example, axis=1, keepdims=True)
  scale = jnp.max(jnp.abs(centred), axis=(1, 2))
  scale = jnp.where(scale > 0, scale, 1.0)
  centred = centred / scale[:, None, None]
  if num_samples < num_classes:
    gram = centred @ jnp.swapaxes(centred, 1, 2)
  else:
    gram = jnp.swapaxes(centred, 1, 2) @ centred
  gram = gram / (num_samples - 1)
  if jax.default_backend() == "cpu":
    top = jax.lax.map(lambda matrix: jnp.linalg.eigvalsh(matrix)[-1], gram)
  else:
    top = jnp.linalg.eigvalsh(gram)[:, -1]
  return jnp.maximum(top, 0.0) * scale**2


def _float64_norms(samples: np.ndarray) -> np.ndarray:
  x = np.asarray(samples, np.float64)
  x = x - x.mean(axis=0)
  pattern = "snk,tnk->nst" if x.shape[0] < x.shape[2] else "snk,snl->nkl"
  return np.linalg.eigvalsh(np.einsum(pattern, x, x) / (x.shape[0] - 1))[:, -1]


def _samples(num_samples: int, num_examples: int, num_classes: int) -> jax.Array:
  """Logit-like samples: a per-example mean plus a per-sample perturbation."""
  key_mean, key_noise = jax.random.split(jax.random.key(0))
  mean = 3 * jax.random.normal(key_mean, (1, num_examples, num_classes), jnp.float32)
  noise = jax.random.normal(key_noise, (num_samples, num_examples, num_classes), jnp.float32)
  return jax.block_until_ready(mean + 0.5 * noise)


def _checked(samples: jax.Array, count: int = 256) -> str:
  head = samples[:, :count]
  want = _float64_norms(np.asarray(head))
  errors = {
    name: float(np.max(np.abs(np.asarray(fn(head)) - want) / want))
    for name, fn in (("new", scores.covariance_norm), ("previous", _previous_covariance_norm))
  }
  if errors["new"] > 1e-4:
    raise SystemExit(f"covariance_norm disagrees with float64 NumPy: {errors['new']:.1e}")
  return f"max rel err {errors['new']:.0e} (previous {errors['previous']:.0e})"


def covariance_rows(args: argparse.Namespace) -> list[Row]:
  return _route_rows(1000, args) + _route_rows(10, args)


def _route_rows(num_classes: int, args: argparse.Namespace) -> list[Row]:
  num_samples, num_examples = 32, args.num_examples
  samples = _samples(num_samples, num_examples, num_classes)
  size = min(num_samples, num_classes)
  gflop = 2 * size**2 * max(num_samples, num_classes) * num_examples / 1e9
  check = _checked(samples)
  previous = _best(lambda: _previous_covariance_norm(samples), max(1, args.repeats // 3))
  kernel = _best(lambda: covariance.covariance_norm(samples), args.repeats)
  checked = _best(lambda: scores.covariance_norm(samples), args.repeats)
  case = f"S={num_samples} K={num_classes} N={num_examples:,}"
  rows = [
    Row(f"covariance.covariance_norm {case}", kernel, gflop / kernel, previous, check),
    Row(
      "  scores.covariance_norm: the same, as the checked public entry point",
      checked,
      gflop / checked,
      previous,
    ),
  ]
  rows += _over_cpu_devices(samples, gflop, args.repeats)
  if num_samples < num_classes:
    rows += _halves(samples, gflop, args.repeats)
  return rows


def _over_cpu_devices(samples: jax.Array, gflop: float, repeats: int) -> list[Row]:
  """The kernel on every CPU device at once, a share of the examples each.

  As the evaluate stage runs it: one JAX CPU device per core, each scoring
  its own chunks of the file. Placing the shares is not timed (chunks are read
  from the file straight onto their device).
  """
  devices = jax.local_devices()
  if len(devices) < 2 or devices[0].platform != "cpu":
    return []
  shares = np.array_split(np.arange(samples.shape[1]), len(devices))
  placed = [
    jax.device_put(samples[:, share[0] : share[-1] + 1], device)
    for share, device in zip(shares, devices, strict=True)
  ]
  seconds = _best(lambda: [covariance.covariance_norm(part) for part in placed], repeats)
  case = f"  the same on {len(devices)} CPU devices at once, a share of the examples each"
  return [Row(case, seconds, gflop / seconds)]


def _halves(samples: jax.Array, gflop: float, repeats: int) -> list[Row]:
  """The Gram route's two steps apart: the Gram matmuls, then the top eigenvalues."""
  num_samples, num_examples, num_classes = samples.shape

  @jax.jit
  def grams(samples):
    def one(index):
      example = jax.lax.dynamic_index_in_dim(samples, index, axis=1, keepdims=False)
      return example @ example.T

    return jax.lax.map(one, jnp.arange(num_examples)) / (num_samples - 1)

  seconds = _best(lambda: grams(samples), repeats)
  shape = f"[{num_samples},{num_classes}]x[{num_classes},{num_samples}]"
  rows = [Row(f"  Gram matmuls alone: {num_examples:,} x {shape}", seconds, gflop / seconds)]
  matrices = jax.block_until_ready(grams(samples - jnp.mean(samples, axis=0)))
  per_matrix = jax.jit(lambda m: jax.lax.map(lambda one: jnp.linalg.eigvalsh(one)[-1], m))
  batched = jax.jit(lambda m: jnp.linalg.eigvalsh(m)[:, -1])
  want = np.asarray(per_matrix(matrices))
  error = float(np.max(np.abs(np.asarray(covariance.top_eigenvalue(matrices)) - want) / want))
  for name, fn, note in (
    ("covariance.top_eigenvalue", covariance.top_eigenvalue, f"max rel err {error:.0e}"),
    ("one eigvalsh per matrix (lax.map)", per_matrix, ""),
    ("one batched eigvalsh call", batched, "risks the CPU thread-pool deadlock"),
  ):
    seconds = _best(lambda fn=fn: fn(matrices), max(1, repeats // 2))
    rows.append(Row(f"  top eigenvalue of {num_examples:,} Grams: {name}", seconds, note=note))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="N = 1,000 (a smoke run)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument(
    "--cpu_devices", type=int, default=min(os.cpu_count() or 1, 8),
    help="JAX CPU devices (one per core by default, as the evaluate stage sets)",
  )  # fmt: skip
  args = parser.parse_args()
  args.num_examples = 1_000 if args.quick else 10_000
  jax.config.update("jax_num_cpu_devices", args.cpu_devices)  # before JAX starts
  print(
    f"# {platform.processor() or platform.machine()}, {jax.devices()[0].device_kind}, "
    f"jax {jax.__version__}, numpy {np.__version__}"
  )
  before = _matmul_gflops(args.repeats)
  rows = covariance_rows(args)
  matmul = max(before, _matmul_gflops(args.repeats))
  print(f"plain jitted 2048x2048 float32 matmul: {matmul:.1f} GFLOP/s\n")
  print(f"| {'case':<84} | time (s) | GFLOP/s | % of matmul | vs previous | note |")
  print(f"|{'-' * 86}|---------:|--------:|------------:|------------:|------|")
  for row in rows:
    rate = f"{row.gflops:.1f}" if row.gflops else ""
    share = f"{100 * row.gflops / matmul:.1f} %" if row.gflops else ""
    speedup = f"{row.baseline_seconds / row.seconds:.1f}x" if row.baseline_seconds else ""
    print(
      f"| {row.case:<84} | {row.seconds:8.4f} | {rate:>7} | {share:>11} "
      f"| {speedup:>11} | {row.note} |"
    )


if __name__ == "__main__":
  main()
