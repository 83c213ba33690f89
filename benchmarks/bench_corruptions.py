"""Time of the shifted test sets: each corruption, rotation and translation on N images.

Random ``[N, 28, 28, 1]`` images in [0, 1] (Fashion-MNIST's shape; ``--size=32
--channels=3`` for CIFAR's), one severity. Each program is compiled and run once first,
then timed over ``--repeats`` runs (the best is reported, with images/s).

  python benchmarks/bench_corruptions.py [--num_images=10000] [--severity=3]
"""

import argparse
import time

import jax
import jax.numpy as jnp

from top1_jax.engine import corruptions, shifts


def _best_time(fun, repeats: int) -> tuple[float, float]:
  """(seconds of the first call, compilation included; best of ``repeats`` later calls)."""
  start = time.perf_counter()
  jax.block_until_ready(fun())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fun())
    times.append(time.perf_counter() - start)
  return first, min(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num_images", type=int, default=10_000)
  parser.add_argument("--size", type=int, default=28)
  parser.add_argument("--channels", type=int, default=1)
  parser.add_argument("--severity", type=int, default=3)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  shape = (args.num_images, args.size, args.size, args.channels)
  images = jax.random.uniform(jax.random.key(0), shape, jnp.float32)
  key = jax.random.key(1)
  jobs = {
    name: (lambda name=name: corruptions.corrupt(name, images, key, args.severity))
    for name in corruptions.names()
  }
  jobs["rotate 45°"] = lambda: shifts.rotate(images, 45)
  jobs["translate 7 px"] = lambda: shifts.translate(images, 7)
  device = jax.devices()[0]
  print(f"{shape} float32, severity {args.severity}, on {device.platform} ({device.device_kind})")
  print(f"{'shift':<16} {'first s':>9} {'best s':>9} {'images/s':>12}")
  for name, fun in jobs.items():
    first, best = _best_time(fun, args.repeats)
    print(f"{name:<16} {first:9.3f} {best:9.4f} {args.num_images / best:12,.0f}")


if __name__ == "__main__":
  main()
