"""MC-dropout samples and deep-ensemble members: a batch's forward passes, and a whole
dataset's, sharded, with the scores computed on device (``predict``).

``apply_fn(params, x, key, rate) -> [B, K]`` (``models.make_apply_fn``) is a static argument
of the jitted code: pass the same (or an equal) object to avoid recompiling.
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
from top1_jax.engine import parallel

ApplyFn = Callable[..., jax.Array]
STRATEGIES = ("auto", "vmap", "loop")


def as_prng_key(key: Any) -> jax.Array:
  """A typed key of shape () from ``jax.random.key(seed)`` or a raw ``PRNGKey(seed)``."""
  if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"key: expected a single PRNG key, got key shape {key.shape}")
    return key
  if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32:
    if key.shape != (2,):
      raise ValueError(f"key: expected a raw uint32 key of shape (2,), got {key.shape}")
    return jax.random.wrap_key_data(key)
  raise ValueError(f"key: expected a PRNG key from jax.random.key(seed), got {type(key).__name__}")


def ensemble_size(stacked_params: Any) -> int:
  """M >= 1, the leading (member) axis that every leaf of stacked parameters shares."""
  leaves = jax.tree_util.tree_leaves(stacked_params)
  if not leaves:
    raise ValueError("stacked_params: expected a pytree of arrays, got no leaves")
  sizes = {int(np.shape(leaf)[0]) if np.ndim(leaf) else 0 for leaf in leaves}
  if len(sizes) != 1 or 0 in sizes:
    raise ValueError(
      "stacked_params: every leaf must have the same leading (member) axis of"
      f" size >= 1, got leading sizes {sorted(sizes)}"
    )
  return sizes.pop()


def pick_strategy(strategy: str = "auto", backend: str | None = None) -> str:
  """How to vectorize over ensemble members: ``"vmap"`` on gpu/tpu, else ``"loop"`` (vmap
  makes grouped convolutions, slow on CPU)."""
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
  if strategy != "auto":
    return strategy
  backend = jax.default_backend() if backend is None else backend
  return "vmap" if backend in ("gpu", "cuda", "rocm", "tpu") else "loop"


def dropout_rate(rate: ArrayLike) -> jax.Array:
  """Checks 0 <= rate < 1 (when concrete); returns a float32 scalar."""
  if validation.is_traced(rate):
    if jnp.ndim(rate) != 0:
      raise ValueError(f"rate: expected a scalar, got shape {jnp.shape(rate)}")
    return jnp.asarray(rate, jnp.float32)
  try:
    value = None if isinstance(rate, bool) else np.asarray(rate, dtype=np.float64)
  except (TypeError, ValueError):
    value = None
  if value is None or value.ndim != 0 or not (0.0 <= float(value) < 1.0):
    raise ValueError(f"rate: expected a number in [0, 1), got {rate!r}")
  return jnp.asarray(value, jnp.float32)


def batch_inputs(name: str, x: ArrayLike) -> jax.Array:
  """A finite [B, ...] input batch with B >= 1."""
  arr = validation.float_array(name, x, (2, 3, 4, 5))
  validation.check_nonempty(name, arr)
  return arr


def host_inputs(name: str, x: ArrayLike) -> np.ndarray:
  """A finite float32 host array [N, ...] with N >= 1 (integers are cast)."""
  x = np.asarray(x)
  real = np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
  if x.dtype == np.bool_ or not real:
    raise ValueError(f"{name}: expected a real-valued array, got dtype {x.dtype}")
  if x.ndim < 2 or x.shape[0] == 0:
    raise ValueError(f"{name}: expected [N, ...] inputs with N >= 1, got shape {x.shape}")
  x = x.astype(np.float32, copy=False)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{name}: {int(np.sum(~np.isfinite(x)))} non-finite value(s)")
  return x


def check_one_example(apply_fn, params, x, key, rate) -> None:
  """MC dropout applies ``apply_fn`` to one example at a time: it must give [1, K]."""
  try:
    out = jax.eval_shape(apply_fn, params, x[:1], key, rate)
  except (TypeError, ValueError) as e:
    raise ValueError(f"apply_fn: cannot be applied to one example of x ({e})") from e
  if out.ndim != 2 or out.shape[0] != 1:
    raise ValueError(f"apply_fn: expected logits [B, K] for B = 1 inputs, got {out.shape}")


def sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples):
  """[S, B, K]: sample s of example b under ``fold_in(split(key, S)[s], example_ids[b])``."""

  def one_sample(sample_key):
    def one_example(example, example_id):
      example_key = jax.random.fold_in(sample_key, example_id)
      return apply_fn(params, example[None], example_key, rate)[0]

    return jax.vmap(one_example)(x, example_ids)

  return jax.vmap(one_sample)(jax.random.split(key, num_samples))


def member_params(stacked_params: Any, index: int) -> Any:
  """Member ``index``'s leaves of stacked (ensemble) parameters; unchecked, traceable."""
  return jax.tree_util.tree_map(lambda leaf: leaf[index], stacked_params)


def member_logits(apply_fn, stacked_params, x, strategy: str):
  """[M, B, K]: every member's ``apply_fn(params, x)``, by ``strategy``; unchecked, traceable."""
  if strategy == "vmap":
    return jax.vmap(lambda params: apply_fn(params, x))(stacked_params)
  # An unrolled loop inside one jit: plain (non-grouped) convolutions per member.
  size = jax.tree_util.tree_leaves(stacked_params)[0].shape[0]
  return jnp.stack([apply_fn(member_params(stacked_params, m), x) for m in range(size)])


_sample_logits = jax.jit(sample_logits, static_argnames=("apply_fn", "num_samples"))


def mc_dropout_logits(
  apply_fn: ApplyFn,
  params: Any,
  x: ArrayLike,
  key: jax.Array,
  *,
  num_samples: int,
  rate: ArrayLike,
) -> jax.Array:
  """[S, B, K] MC-dropout logits of ``x`` [B, ...]: S stochastic passes of one network.
  Sample s of example i uses the key ``fold_in(split(key, S)[s], i)``, as ``mc.predict``."""
  num_samples = validation.positive_int("num_samples", num_samples)
  rate = dropout_rate(rate)
  key = as_prng_key(key)
  x = batch_inputs("x", x)
  check_one_example(apply_fn, params, x, key, rate)
  example_ids = jnp.arange(x.shape[0], dtype=jnp.int32)
  return _sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples)


_ensemble_logits = jax.jit(member_logits, static_argnames=("apply_fn", "strategy"))


def ensemble_logits(
  apply_fn: ApplyFn, stacked_params: Any, x: ArrayLike, *, strategy: str = "vmap"
) -> jax.Array:
  """[M, B, K] logits ``apply_fn(params, x)`` of every member, leaves stacked on [M]."""
  strategy = pick_strategy(strategy)
  ensemble_size(stacked_params)
  x = batch_inputs("x", x)
  logits = _ensemble_logits(apply_fn, stacked_params, x, strategy)
  if logits.ndim != 3 or logits.shape[1] != x.shape[0]:
    raise ValueError(
      f"apply_fn: expected logits [B, K] with B = {x.shape[0]} per call, got"
      f" {logits.shape[1:]} (stacked: {logits.shape})"
    )
  return logits


SAMPLE_PASSES_PER_STEP = {"cpu": 512, "default": 8192}
"""``predict``'s default forward passes (S x examples) per device and step."""


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
  """The summary of chunk ``chunks[slot]`` [C, chunk, ...], whose first example is ``start``;
  ``static`` is ``(mode, num_samples, strategy, keep_samples, mesh, key impl)``."""
  mode, num_samples, strategy, keep_samples, mesh, impl = static
  (axis,) = mesh.axis_names
  x = jax.lax.dynamic_index_in_dim(chunks, slot, keepdims=False)
  example_ids = start + jnp.arange(x.shape[0], dtype=jnp.int32)

  # Examples are independent: each device computes its own slice, no communication.
  def local(params, x, example_ids, key_data, rate):
    if mode == "mc_dropout":
      key = jax.random.wrap_key_data(key_data, impl=impl)
      logits = sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples)
    else:
      logits = member_logits(apply_fn, params, x, strategy)
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
  x = host_inputs("x", x)
  if chunk_size is not None:
    chunk_size = validation.positive_int("chunk_size", chunk_size)
  num_samples = validation.positive_int("num_samples", num_samples)
  rate = dropout_rate(rate)
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
  one_network = member_params(params, 0) if ensemble else params
  check_one_example(apply_fn, one_network, x, key, rate)
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
    chunks, slot = placed, start // args.chunk
    if placed is None:
      chunks, slot = _chunks(args.x, slot, 1, args.chunk, by_example), 0
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
  progress: Callable[[int, int], None] | None = None,
) -> SampleSummary:
  """Streams a dataset through MC dropout or an ensemble; scores on device.

  Sample s of example i uses the key ``fold_in(split(key, S)[s], i)``, whatever
  ``chunk_size`` and the devices. With ``ensemble``, ``params`` are M members' stacked
  (S = M). Memory grows with ``chunk_size`` (all devices) times S."""
  args = _checked_args(
    apply_fn, params, x, key, num_samples, rate, ensemble, chunk_size, mesh, strategy
  )
  run = _chunk_runner(apply_fn, params, args, keep_samples)
  num_examples, pieces = args.x.shape[0], []
  starts = range(0, num_examples, args.chunk)  # each dispatched before the previous is fetched
  for start, out in parallel.prefetch(((start, run(start)) for start in starts), 1):
    stop = min(start + args.chunk, num_examples)
    pieces.append(_fetch(stop - start, out))
    if progress is not None:
      progress(stop, num_examples)
  logits = None if pieces[0].logits is None else np.concatenate([p.logits for p in pieces], 1)
  return SampleSummary(
    np.concatenate([p.mean_log_probs for p in pieces]),
    {name: np.concatenate([p.scores[name] for p in pieces]) for name in pieces[0].scores},
    logits,
  )
