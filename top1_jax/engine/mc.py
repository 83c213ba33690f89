"""MC-dropout samples and deep-ensemble members over a whole dataset, sharded.

``predict`` runs a chunk of examples at a time, sharded over a device mesh, and computes
the scores there: only [N, K] mean probabilities and [N] scores reach the host.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from top1_jax.core import scores, validation
from top1_jax.engine import batches, forward_passes, parallel
from top1_jax.engine.forward_passes import (
  STRATEGIES,
  ApplyFn,
  as_prng_key,
  ensemble_logits,
  ensemble_size,
  mc_dropout_logits,
  pick_strategy,
)

__all__ = [
  "SAMPLE_PASSES_PER_STEP",
  "STRATEGIES",
  "ApplyFn",
  "SampleSummary",
  "as_prng_key",
  "default_chunk_size",
  "default_mesh",
  "ensemble_logits",
  "ensemble_size",
  "mc_dropout_logits",
  "pick_strategy",
  "predict",
]

Progress = Callable[[int, int], None]
SAMPLE_PASSES_PER_STEP = {"cpu": 512, "default": 8192}
"""``predict``'s default forward passes (S x examples) per device and step.

Small on CPU, where larger steps ran slower; on accelerators, short of the steps where a
ResNet-20 pays much memory for little speed (docs/performance.md)."""


def default_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis ``"batch"``."""
  return Mesh(np.asarray(jax.devices()), ("batch",))


def default_chunk_size(num_samples: int, mesh: Mesh | None = None) -> int:
  """``predict``'s default ``chunk_size`` (examples per step) for S = ``num_samples``."""
  num_samples = validation.positive_int("num_samples", num_samples)
  mesh = default_mesh() if mesh is None else mesh
  platform = mesh.devices.flat[0].platform
  passes = SAMPLE_PASSES_PER_STEP.get(platform, SAMPLE_PASSES_PER_STEP["default"])
  return mesh.devices.size * max(1, passes // num_samples)


class SampleSummary(NamedTuple):
  """``predict``'s host arrays: [N, K] log of the sample-mean softmax probabilities, name ->
  [N] score (``scores.sample_summary``), and [S, N, K] logits or None."""

  mean_log_probs: np.ndarray
  scores: dict[str, np.ndarray]
  logits: np.ndarray | None

  @property
  def mean_probs(self) -> np.ndarray:
    """[N, K] sample-mean softmax probabilities."""
    return np.exp(self.mean_log_probs)


@functools.partial(jax.jit, static_argnames=("apply_fn", "static"))
def _predict_chunk(apply_fn, params, chunks, slot, start, key_data, rate, static):
  """The summary of chunk ``chunks[slot]`` [C, chunk, ...], whose first example is ``start``.

  ``static`` is ``(mode, num_samples, strategy, keep_samples, mesh, key impl)``."""
  mode, num_samples, strategy, keep_samples, mesh, impl = static
  (axis,) = mesh.axis_names
  x = jax.lax.dynamic_index_in_dim(chunks, slot, keepdims=False)
  example_ids = start + jnp.arange(x.shape[0], dtype=jnp.int32)

  # Every example is independent: each device computes its own slice, no
  # communication (shard_map), and the outputs stay sharded over examples.
  def local(params, x, example_ids, key_data, rate):
    if mode == "mc_dropout":
      key = jax.random.wrap_key_data(key_data, impl=impl)
      logits = forward_passes.sample_logits(
        apply_fn, params, x, example_ids, key, rate, num_samples
      )
    else:
      logits = forward_passes.member_logits(apply_fn, params, x, strategy)
    mean_log_probs, values = scores.sample_summary(logits)
    out = {"mean_log_probs": mean_log_probs, "scores": values}
    return {**out, "logits": logits} if keep_samples else out

  out_specs = {"mean_log_probs": P(axis), "scores": P(axis)}
  out_specs |= {"logits": P(None, axis)} if keep_samples else {}
  in_specs = (P(), P(axis), P(axis), P(), P())
  sharded = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  return sharded(params, x, example_ids, key_data, rate)


class _PredictArgs(NamedTuple):
  x: np.ndarray  # [N, ...] float32, finite
  mode: str  # "mc_dropout" or "ensemble"
  num_samples: int  # S, or M for an ensemble
  strategy: str  # "vmap" or "loop"
  key: jax.Array  # a typed key (unused by an ensemble)
  rate: jax.Array  # float32 scalar
  mesh: Mesh
  chunk: int  # examples per step, a multiple of the mesh size


def _checked_args(
  apply_fn, params, x, key, num_samples, rate, ensemble, chunk_size, mesh, strategy
) -> _PredictArgs:
  """Checks ``predict``'s arguments once; internal code trusts the ``_PredictArgs``."""
  x = forward_passes.host_inputs("x", x)
  if chunk_size is not None:
    chunk_size = validation.positive_int("chunk_size", chunk_size)
  num_samples = validation.positive_int("num_samples", num_samples)
  rate = forward_passes.dropout_rate(rate)
  mesh = default_mesh() if mesh is None else mesh
  if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
    raise ValueError(f"mesh: expected a 1-D jax.sharding.Mesh, got {mesh!r}")
  if ensemble:
    if num_samples != 1 or float(rate) != 0.0:
      raise ValueError(
        "num_samples and rate: an ensemble is deterministic, expected 1 and 0,"
        f" got {num_samples} and {float(rate)}"
      )
    mode, num_samples, strategy = "ensemble", ensemble_size(params), pick_strategy(strategy)
    key = jax.random.key(0)  # unused; keeps one code path
  else:
    mode, strategy = "mc_dropout", "vmap"
    if key is None:
      if num_samples > 1 or float(rate) != 0.0:
        raise ValueError("key: a PRNG key is required for MC dropout")
      key = jax.random.key(0)  # unused: rate 0, one sample
    key = as_prng_key(key)
  one_network = forward_passes.member_params(params, 0) if ensemble else params
  forward_passes.check_one_example(apply_fn, one_network, x, key, rate)
  if chunk_size is None:
    chunk_size = default_chunk_size(num_samples, mesh)
  chunk = -(-chunk_size // mesh.devices.size) * mesh.devices.size
  return _PredictArgs(x, mode, num_samples, strategy, key, rate, mesh, chunk)


def _chunks(x: np.ndarray, first: int, count: int, chunk: int, sharding) -> jax.Array:
  """[count, chunk, ...]: chunks ``first``... of ``x``, padded with its last example."""

  def block(index):
    rows = np.arange(first, first + count)[index[0], None] * chunk + np.arange(chunk)[index[1]]
    return np.take(x, np.minimum(rows, x.shape[0] - 1), axis=0)

  return jax.make_array_from_callback((count, chunk, *x.shape[1:]), sharding, block)


def _chunk_runner(apply_fn, params, args: _PredictArgs, keep_samples: bool):
  """``run(start)`` dispatches the chunk from example ``start``; ``x`` is sent once if it fits."""
  (axis,) = args.mesh.axis_names
  by_example = NamedSharding(args.mesh, P(None, axis))
  replicated = (params, jax.random.key_data(args.key), args.rate)
  params_global, key_global, rate_global = parallel.replicate(replicated, args.mesh)
  impl = jax.random.key_impl(args.key)
  static = (args.mode, args.num_samples, args.strategy, keep_samples, args.mesh, impl)
  step = functools.partial(_predict_chunk, apply_fn, static=static)
  num_chunks = -(-args.x.shape[0] // args.chunk)
  chunk_bytes = args.chunk * args.x[0].nbytes
  placed = None
  if parallel.fits_on_devices(num_chunks * chunk_bytes, args.mesh):
    placed = _chunks(args.x, 0, num_chunks, args.chunk, by_example)

  def run(start: int) -> Any:
    index = start // args.chunk
    if placed is not None:
      chunks, slot = placed, index
    else:
      chunks, slot = _chunks(args.x, index, 1, args.chunk, by_example), 0
    return step(params_global, chunks, np.int32(slot), np.int32(start), key_global, rate_global)

  return run


def _fetch(valid: int, out: Any) -> SampleSummary:
  if jax.process_count() > 1:
    host = multihost_utils.process_allgather(out, tiled=True)
  else:
    host = jax.tree_util.tree_map(np.asarray, out)
  values = {name: value[:valid] for name, value in host["scores"].items()}
  logits = host["logits"][:, :valid] if "logits" in host else None
  return SampleSummary(host["mean_log_probs"][:valid], values, logits)


def _stream(run, num_examples: int, chunk: int, progress: Progress | None) -> SampleSummary:
  """The chunks' host outputs joined; each chunk is dispatched before the previous is fetched."""
  pieces = []
  starts = range(0, num_examples, chunk)
  for start, out in batches.prefetch(((start, run(start)) for start in starts), 1):
    stop = min(start + chunk, num_examples)
    pieces.append(_fetch(stop - start, out))
    if progress is not None:
      progress(stop, num_examples)
  logits = None if pieces[0].logits is None else np.concatenate([p.logits for p in pieces], 1)
  return SampleSummary(
    np.concatenate([p.mean_log_probs for p in pieces]),
    {name: np.concatenate([p.scores[name] for p in pieces]) for name in pieces[0].scores},
    logits,
  )


def predict(
  apply_fn: ApplyFn,
  params: Any,
  x: ArrayLike,
  *,
  key: jax.Array | None = None,
  num_samples: int = 1,
  rate: ArrayLike = 0.0,
  ensemble: bool = False,
  chunk_size: int | None = None,
  keep_samples: bool = False,
  mesh: Mesh | None = None,
  strategy: str = "auto",
  progress: Progress | None = None,
) -> SampleSummary:
  """Streams a dataset through MC dropout or an ensemble; scores on device.

  Sample s of example i uses the key ``fold_in(split(key, S)[s], i)``: the result does not
  depend on ``chunk_size`` or the devices. With ``ensemble``, ``params`` are M members'
  stacked (S = M). Memory grows with ``chunk_size`` (all devices) times S."""
  args = _checked_args(
    apply_fn, params, x, key, num_samples, rate, ensemble, chunk_size, mesh, strategy
  )
  run = _chunk_runner(apply_fn, params, args, keep_samples)
  return _stream(run, args.x.shape[0], args.chunk, progress)
