"""Vectorized Monte Carlo on this machine: MC dropout and deep-ensemble training.

1. MC dropout, S samples (default 32) on the 10k Fashion-MNIST test images
   (random images of the same shape when the IDX files are absent), small CNN
   (``--mc_model=resnet``: ResNet-20 on random CIFAR-shaped images):
     loop/B     a Python loop over samples and batches of B examples of a jitted
                forward pass; the [S, N, K] logits are assembled on the host and
                scored there
     stock/B    the same loop over the same CNN built with ``flax.linen.Dropout``
                (``jax.random.bernoulli`` masks): what one writes without this
                library (small CNN only)
     vmap/C     ``mc.predict``: vmap over samples, chunks of C examples, scores
                on device (what the library does; C = 16 is its CPU default)
   Each strategy runs in a fresh subprocess that reports its peak resident
   memory (``ru_maxrss``) and, on an accelerator, its peak device memory, after
   one warm-up chunk (compilation). One unchunked vmap over all 10k examples is
   not run: it needed 16-20 GiB here. Both with dropout after every layer
   ("all", the default) and only on the classifier's input ("head", where vmap
   computes the trunk once for all samples).
2. A 5-member ensemble trained by ``train.fit_ensemble`` with ``strategy="vmap"``
   (one vmapped step for all members) vs ``"loop"`` (member after member), for
   ``--ensemble_models`` (default the small CNN and an MLP; ``resnet`` on
   CIFAR-shaped images), after a warm-up of 2 steps each.

Prints examples/s, ratios and the strategies ``mc.pick_strategy`` picks here.
The children run on the CPU unless ``JAX_PLATFORMS`` says otherwise.

  python benchmarks/bench_mc.py [--quick]
  JAX_PLATFORMS=cuda python benchmarks/bench_mc.py --chunk_sizes=256,1024 \\
      --loop_batch_sizes=1000,10000 --ensemble_models=cnn,mlp,resnet
"""

import argparse
import gzip
import json
import math
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
_TRAIN_IMAGES = pathlib.Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


def _images(path: pathlib.Path, count: int, seed: int) -> tuple[np.ndarray, str]:
  """[count, 28, 28, 1] float32 in [0, 1]: Fashion-MNIST if present, else noise."""
  if path.exists():
    with gzip.open(path, "rb") as f:
      header = np.frombuffer(f.read(16), ">u4")
      if header[0] != 2051:
        raise ValueError(f"{path}: not an IDX image file")
      count = min(count, int(header[1]))
      pixels = np.frombuffer(f.read(count * 784), np.uint8)
    images = pixels.reshape(count, 28, 28, 1).astype(np.float32) / 255.0
    return images, "Fashion-MNIST"
  rng = np.random.default_rng(seed)
  return rng.random((count, 28, 28, 1), dtype=np.float32), "random"


def _cifar_shaped(count: int, seed: int) -> tuple[np.ndarray, str]:
  """[count, 32, 32, 3] float32 noise: CIFAR-10's shape (no CIFAR files offline)."""
  rng = np.random.default_rng(seed)
  return rng.random((count, 32, 32, 3), dtype=np.float32), "random CIFAR-shaped"


def _model(name: str, placement: str = "all"):
  """The named model with its defaults (resnet is ResNet-20)."""
  from top1_jax.engine import models

  return models.MODELS[name](dropout_placement=placement)


def _inputs_for(model_name: str, path: pathlib.Path, count: int, seed: int):
  if model_name == "resnet":
    return _cifar_shaped(count, seed)
  return _images(path, count, seed)


def _stock_forward(model_name: str, placement: str, rate: float):
  """``forward(variables, x, key, rate)`` of the small CNN with ``flax.linen.Dropout``.

  The network one writes without this library: the same layers and parameters,
  masks from ``jax.random.bernoulli`` (jax's default threefry), the rate fixed.
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  if model_name != "cnn":
    raise ValueError("the flax.linen.Dropout baseline is the small CNN only")

  class StockCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = x.astype(jnp.float32)
      for width in (32, 64):
        x = nn.relu(nn.Conv(width, (3, 3), strides=(2, 2), padding="SAME")(x))
        if placement == "all":
          x = nn.Dropout(rate, deterministic=False)(x)
      x = nn.relu(nn.Dense(128)(x.reshape((x.shape[0], -1))))
      x = nn.Dropout(rate, deterministic=False)(x)
      return nn.Dense(10)(x)

  @jax.jit
  def forward(variables, x, key, unused_rate):
    return StockCNN().apply(variables, x, rngs={"dropout": key})

  return forward


def _peak_device_gib() -> float | None:
  """Peak accelerator memory in use, where the backend reports it (not on CPU)."""
  import jax

  stats = jax.local_devices()[0].memory_stats()
  if not stats or "peak_bytes_in_use" not in stats:
    return None
  return stats["peak_bytes_in_use"] / 2**30


def _peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _child_mc(
  strategy: str,
  chunk_size: int,
  num_samples: int,
  num_examples: int,
  placement: str,
  model_name: str,
  repeats: int,
) -> dict:
  import jax
  import jax.numpy as jnp

  from top1_jax.core import scores
  from top1_jax.engine import mc, models

  images, source = _inputs_for(model_name, _FASHION_MNIST, num_examples, seed=0)
  model = _model(model_name, placement)
  apply_fn = models.make_apply_fn(model)
  variables = models.init(model, jax.random.key(0), images[:1])
  key, rate = jax.random.key(1), 0.1
  rss_before = _peak_rss_gib()

  if strategy in ("loop", "stock"):
    forward = jax.jit(apply_fn)
    if strategy == "stock":
      forward = _stock_forward(model_name, placement, rate)
    summarize = jax.jit(
      lambda logits: {
        "neg_log_pmax": scores.neg_log_pmax(
          jax.nn.logsumexp(jax.nn.log_softmax(logits), 0) - jnp.log(logits.shape[0])
        ),
        "covariance_norm_probs": scores.covariance_norm(jax.nn.softmax(logits)),
      }
    )

    def run(x):
      sample_keys = jax.random.split(key, num_samples)
      logits = np.empty((num_samples, x.shape[0], 10), np.float32)
      for s in range(num_samples):
        for start in range(0, x.shape[0], chunk_size):
          batch = x[start : start + chunk_size]
          logits[s, start : start + chunk_size] = forward(
            variables, batch, jax.random.fold_in(sample_keys[s], start), rate
          )
      return jax.tree_util.tree_map(np.asarray, summarize(logits))

  else:

    def run(x):
      return mc.predict(
        apply_fn, variables, x, key=key, num_samples=num_samples, rate=rate, chunk_size=chunk_size
      ).scores

  warm = time.perf_counter()
  run(images[:chunk_size])  # compiles the full-chunk program
  if strategy == "loop" and num_examples % chunk_size:
    run(images[: num_examples % chunk_size])  # ... and the last partial batch
  compile_s = time.perf_counter() - warm
  seconds = math.inf
  for _ in range(repeats):  # the best of a few runs: short accelerator runs are noisy
    start = time.perf_counter()
    out = run(images)
    seconds = min(seconds, time.perf_counter() - start)
  return {
    "strategy": f"{strategy}/{chunk_size}",
    "placement": placement,
    "chunk_size": chunk_size,
    "seconds": seconds,
    "warmup_seconds": compile_s,
    "examples_per_second": num_examples / seconds,
    "sample_passes_per_second": num_examples * num_samples / seconds,
    "peak_rss_gib": _peak_rss_gib(),
    "peak_device_gib": _peak_device_gib(),
    "rss_before_gib": rss_before,
    "data": source,
    "mean_neg_log_pmax": float(np.mean(out["neg_log_pmax"])),
  }


def _run_child(args: list[str]) -> dict:
  env = dict(os.environ, PYTHONPATH=str(_ROOT))
  env.setdefault("JAX_PLATFORMS", "cpu")  # JAX_PLATFORMS=cuda (or tpu) to time an accelerator
  result = subprocess.run(
    [sys.executable, __file__, "--child", *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
  )
  if result.returncode != 0:
    raise RuntimeError(f"child {args} failed:\n{result.stderr[-3000:]}")
  row = json.loads(result.stdout.strip().splitlines()[-1])
  print(
    f"  done: {row['strategy']} dropout on {row['placement']}: {row['seconds']:.1f} s",
    file=sys.stderr,
    flush=True,
  )
  return row


def _bench_ensemble(model_name: str, num_steps: int, ensemble_size: int, batch_size: int) -> list:
  import jax
  import optax

  from top1_jax.engine import train

  images, _ = _inputs_for(model_name, _TRAIN_IMAGES, 10000, seed=1)
  labels = np.random.default_rng(2).integers(0, 10, images.shape[0]).astype(np.int32)
  model = _model(model_name)
  ensemble = train.init_ensemble(
    model, optax.adam(1e-3), jax.random.key(0), images[:1], ensemble_size=ensemble_size
  )
  rows = []
  for strategy in ("vmap", "loop"):
    fit = lambda states, steps, strategy=strategy: train.fit_ensemble(
      states,
      images,
      labels,
      jax.random.key(1),
      num_steps=steps,
      batch_size=batch_size,
      strategy=strategy,
    )
    jax.block_until_ready(fit(ensemble, 2).params)  # warm-up: compilation
    start = time.perf_counter()
    jax.block_until_ready(fit(ensemble, num_steps).params)
    seconds = time.perf_counter() - start
    rows.append(
      {
        "model": model_name,
        "strategy": strategy,
        "seconds": seconds,
        "examples_per_second": ensemble_size * num_steps * batch_size / seconds,
      }
    )
  return rows


def _table(headers: list[str], rows: list[list]) -> str:
  cells = [headers] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
  lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
  lines.insert(1, "-+-".join("-" * w for w in widths))
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
  parser.add_argument("--num_samples", type=int, default=32)
  parser.add_argument("--num_examples", type=int, default=10000)
  parser.add_argument("--chunk_sizes", default="16,32,64,256,512")
  parser.add_argument("--loop_batch_sizes", default="1000,128")
  parser.add_argument("--ensemble_size", type=int, default=5)
  parser.add_argument("--ensemble_steps", type=int, default=50)
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument(
    "--mc_model", default="cnn", choices=("cnn", "mlp", "resnet"), help="network for MC dropout"
  )
  parser.add_argument(
    "--ensemble_models", default="cnn,mlp", help="comma list of cnn, mlp, resnet; '' skips"
  )
  parser.add_argument(
    "--repeats", type=int, default=1, help="MC runs per strategy; the fastest is reported"
  )
  parser.add_argument(
    "--child", nargs=7, metavar=("STRATEGY", "CHUNK", "S", "N", "PLACEMENT", "MODEL", "REPEATS")
  )
  args = parser.parse_args()
  unknown = set(filter(None, args.ensemble_models.split(","))) - {"cnn", "mlp", "resnet"}
  if unknown:
    parser.error(f"--ensemble_models: expected cnn, mlp or resnet, got {sorted(unknown)}")

  if args.child:
    strategy, chunk, num_samples, num_examples, placement, model_name, repeats = args.child
    result = _child_mc(
      strategy,
      int(chunk),
      int(num_samples),
      int(num_examples),
      placement,
      model_name,
      int(repeats),
    )
    print(json.dumps(result))
    return

  if args.quick:
    args.num_samples, args.num_examples, args.chunk_sizes = 4, 500, "128"
    args.loop_batch_sizes, args.ensemble_steps = "250", 5

  import jax

  from top1_jax.engine import mc

  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s),")
  print(f"{os.cpu_count()} CPU core(s), Python {platform.python_version()}")
  if jax.default_backend() != "cpu":
    print(f"device: {jax.devices()[0].device_kind}")
  default_chunk = mc.default_chunk_size(args.num_samples)
  print(
    f"strategy picked for ensembles on this backend: {mc.pick_strategy()}"
    " (MC dropout always vmaps: params are broadcast, not batched)"
  )
  print(f"predict's default chunk_size at S = {args.num_samples}: {default_chunk}\n")

  sizes = [str(args.num_samples), str(args.num_examples)]
  model_args = [args.mc_model, str(args.repeats)]
  loops = args.loop_batch_sizes.split(",")
  chunks = args.chunk_sizes.split(",")
  mc_rows = [_run_child(["loop", batch, *sizes, "all", *model_args]) for batch in loops]
  if args.mc_model == "cnn":
    mc_rows += [_run_child(["stock", batch, *sizes, "all", *model_args]) for batch in loops]
  mc_rows += [_run_child(["vmap", chunk, *sizes, "all", *model_args]) for chunk in chunks]
  # Dropout only on the classifier's input: under vmap the trunk is computed once
  # per example for all S samples; a loop of forward passes recomputes it.
  mc_rows += [_run_child(["loop", batch, *sizes, "head", *model_args]) for batch in loops]
  mc_rows.append(_run_child(["vmap", str(default_chunk), *sizes, "head", *model_args]))
  best_loop = {
    placement: max(
      r["examples_per_second"]
      for r in mc_rows
      if r["placement"] == placement and r["strategy"].startswith("loop")
    )
    for placement in ("all", "head")
  }
  print(
    f"MC dropout, S = {args.num_samples}, {args.num_examples} {mc_rows[0]['data']}"
    f" images, {args.mc_model}, rate 0.1:"
  )
  print(
    _table(
      [
        "dropout on",
        "strategy",
        "seconds",
        "examples/s",
        "x best loop",
        "peak RSS GiB",
        "peak device GiB",
        "warm-up s",
      ],
      [
        [
          r["placement"],
          r["strategy"],
          r["seconds"],
          r["examples_per_second"],
          r["examples_per_second"] / best_loop[r["placement"]],
          r["peak_rss_gib"],
          "-" if r["peak_device_gib"] is None else r["peak_device_gib"],
          r["warmup_seconds"],
        ]
        for r in mc_rows
      ],
    )
  )
  print(f"(peak RSS includes ~{mc_rows[0]['rss_before_gib']:.2f} GiB of Python, JAX and data)")
  print("x best loop: against the fastest loop over the same network (same masks and work).")
  stock = [r for r in mc_rows if r["strategy"].startswith("stock")]
  if stock:

    def best(prefix: str) -> float:
      rows = [r for r in mc_rows if r["placement"] == "all" and r["strategy"].startswith(prefix)]
      return max(r["examples_per_second"] for r in rows)

    print(
      f"Fastest vmap vs the fastest flax.linen.Dropout loop: {best('vmap') / best('stock'):.2f}x"
      f" (of which the masks: {best('loop') / best('stock'):.2f}x, the vectorising:"
      f" {best('vmap') / best('loop'):.2f}x)"
    )
  print()

  ens_rows = []
  for model_name in filter(None, args.ensemble_models.split(",")):
    ens_rows += _bench_ensemble(
      model_name, args.ensemble_steps, args.ensemble_size, args.batch_size
    )
  if ens_rows:
    print(
      f"Ensemble of {args.ensemble_size} trained for {args.ensemble_steps} steps of"
      f" {args.batch_size} examples per member:"
    )
  table_rows = []
  for row in ens_rows:
    loop = next(r for r in ens_rows if r["model"] == row["model"] and r["strategy"] == "loop")
    table_rows.append(
      [
        row["model"],
        row["strategy"],
        row["seconds"],
        row["examples_per_second"],
        row["examples_per_second"] / loop["examples_per_second"],
      ]
    )
  if table_rows:
    print(_table(["model", "strategy", "seconds", "examples/s", "x loop"], table_rows))


if __name__ == "__main__":
  main()
