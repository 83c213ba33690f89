"""MC-dropout samples and deep-ensemble members, vectorized and sharded.

* ``mc_dropout_logits``: S forward passes of one network under dropout, by
  ``jax.vmap`` over S split keys with the parameters broadcast -> [S, B, K].
* ``ensemble_logits``: one forward pass per member of an ensemble whose
  parameters are stacked on a leading axis -> [M, B, K].
* ``predict``: either of the above over a whole dataset, a chunk of examples at
  a time, sharded over the batch axis of a device mesh (all devices of all
  processes by default). The scores are computed on the devices, so only
  ``[N, K]`` mean probabilities and ``[N]`` scores reach the host unless the
  samples are asked for.

``apply_fn`` is ``apply_fn(params, x, key, rate) -> [B, K]`` logits in evaluation
mode, as ``models.make_apply_fn(model)`` returns; ``ensemble_logits`` calls it as
``apply_fn(params, x)``. It is a static argument of the jitted code: pass the same
object (or an equal one) to avoid recompiling.
"""

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from top1_jax import scores, validation

ApplyFn = Callable[..., jax.Array]
STRATEGIES = ("auto", "vmap", "loop")
SAMPLE_PASSES_PER_STEP = {"cpu": 512, "default": 8192}
"""``predict``'s default work per device and step (S x examples forward passes).

CPU: on this project's 2-core machine (small CNN, S = 32, 10k images) steps of
256-512 passes were the fastest (17.6 s at 512, 21.9 s at 1024, 27-29 s at
8192-16384), and memory grows with the step. Accelerators (one H200, S = 32): 8192
passes per step ran the small CNN at 2.1x a loop of jitted calls and ResNet-20 at
2.3x, with 1.0 and 6.8 GiB of device memory; 32768 passes gave the CNN 5.5x
(3.5 GiB) but ResNet-20 only 2.5x for 27 GiB, so the default stays at 8192 and a
larger ``chunk_size`` pays off for small networks.
"""


def default_chunk_size(num_samples: int, mesh: Mesh | None = None) -> int:
  """``predict``'s default ``chunk_size``: examples per step over all devices.

  Args:
    num_samples: S (samples or ensemble members per example).
    mesh: the mesh ``predict`` runs on; default ``default_mesh()``.

  Returns:
    ``num_devices * max(1, SAMPLE_PASSES_PER_STEP[platform] // S)``.
  """
  num_samples = validation.positive_int("num_samples", num_samples)
  mesh = default_mesh() if mesh is None else mesh
  platform = mesh.devices.flat[0].platform
  passes = SAMPLE_PASSES_PER_STEP.get(platform, SAMPLE_PASSES_PER_STEP["default"])
  return mesh.devices.size * max(1, passes // num_samples)


def pick_strategy(strategy: str = "auto", backend: str | None = None) -> str:
  """How to vectorize over ensemble members: ``"vmap"`` or ``"loop"``.

  ``jax.vmap`` over stacked parameters turns each convolution into a grouped
  convolution; accelerators run that well, but on CPU we measured convolutions
  under ``vmap`` 3-7x slower than plain, so an unrolled loop over members wins
  there. Both strategies give the same numbers (up to float rounding).

  Args:
    strategy: ``"auto"`` (pick by backend), or ``"vmap"`` / ``"loop"`` to force.
    backend: ``"cpu"``, ``"gpu"``, ``"tpu"``, ...; default
      ``jax.default_backend()``.

  Returns:
    ``"vmap"`` on gpu/tpu, ``"loop"`` otherwise, unless forced.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
  if strategy != "auto":
    return strategy
  backend = jax.default_backend() if backend is None else backend
  return "vmap" if backend in ("gpu", "cuda", "rocm", "tpu") else "loop"


def _prng_key(key: Any) -> jax.Array:
  """A typed PRNG key from ``jax.random.key`` (or a raw uint32 [2] key)."""
  if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"key: expected a single PRNG key, got key shape {key.shape}")
    return key
  if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32:
    if key.shape != (2,):
      raise ValueError(f"key: expected a raw uint32 key of shape (2,), got {key.shape}")
    return jax.random.wrap_key_data(key)
  raise ValueError(f"key: expected a PRNG key from jax.random.key(seed), got {type(key).__name__}")


def _dropout_rate(rate: ArrayLike) -> jax.Array:
  """Checks 0 <= rate < 1 (when concrete); returns a float32 scalar."""
  if isinstance(rate, bool):
    raise ValueError(f"rate: expected a number in [0, 1), got {rate!r}")
  if validation.is_traced(rate):
    if jnp.ndim(rate) != 0:
      raise ValueError(f"rate: expected a scalar, got shape {jnp.shape(rate)}")
    return jnp.asarray(rate, jnp.float32)
  try:
    value = np.asarray(rate, dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(f"rate: expected a number in [0, 1), got {rate!r}") from None
  if value.ndim != 0 or not (0.0 <= float(value) < 1.0):
    raise ValueError(f"rate: expected a number in [0, 1), got {rate!r}")
  return jnp.asarray(value, jnp.float32)


def _inputs(name: str, x: ArrayLike) -> jax.Array:
  """A finite [B, ...] input batch with B >= 1."""
  arr = validation.float_array(name, x, (2, 3, 4, 5))
  validation.check_nonempty(name, arr)
  return arr


def _check_logits(logits: jax.Array, batch: int) -> None:
  if logits.ndim != 3 or logits.shape[1] != batch:
    raise ValueError(
      f"apply_fn: expected logits [B, K] with B = {batch} per call, got"
      f" {logits.shape[1:]} (stacked: {logits.shape})"
    )


def _ensemble_size(stacked_params: Any) -> int:
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


def _mc_samples(apply_fn, params, x, keys, rate):
  """[S, B, K]: apply_fn under each of the S keys (params and x broadcast)."""
  return jax.vmap(lambda key: apply_fn(params, x, key, rate))(keys)


def _member(stacked_params, index: int):
  return jax.tree_util.tree_map(lambda leaf: leaf[index], stacked_params)


def _ensemble(apply_fn, stacked_params, x, strategy: str):
  if strategy == "vmap":
    return jax.vmap(lambda params: apply_fn(params, x))(stacked_params)
  # An unrolled loop inside one jit: plain (non-grouped) convolutions per member.
  size = _ensemble_size(stacked_params)
  return jnp.stack([apply_fn(_member(stacked_params, m), x) for m in range(size)])


@functools.partial(jax.jit, static_argnames=("apply_fn", "num_samples"))
def _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples):
  return _mc_samples(apply_fn, params, x, jax.random.split(key, num_samples), rate)


def mc_dropout_logits(
  apply_fn: ApplyFn,
  params: Any,
  x: ArrayLike,
  key: jax.Array,
  *,
  num_samples: int,
  rate: ArrayLike,
) -> jax.Array:
  """MC-dropout logits: S stochastic forward passes of one network.

  Sample s uses ``jax.random.split(key, num_samples)[s]``, so it equals
  ``apply_fn(params, x, keys[s], rate)`` called on its own.

  Args:
    apply_fn: ``apply_fn(params, x, key, rate) -> [B, K]``.
    params: the network's variables (broadcast, not copied, across samples).
    x: [B, ...] float inputs, B >= 1.
    key: a PRNG key (``jax.random.key(seed)``).
    num_samples: S >= 1.
    rate: dropout rate in [0, 1); 0 gives S identical samples.

  Returns:
    [S, B, K] float logits.
  """
  num_samples = validation.positive_int("num_samples", num_samples)
  rate = _dropout_rate(rate)
  key = _prng_key(key)
  x = _inputs("x", x)
  logits = _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples)
  _check_logits(logits, x.shape[0])
  return logits


@functools.partial(jax.jit, static_argnames=("apply_fn", "strategy"))
def _ensemble_logits(apply_fn, stacked_params, x, strategy):
  return _ensemble(apply_fn, stacked_params, x, strategy)


def ensemble_logits(
  apply_fn: ApplyFn, stacked_params: Any, x: ArrayLike, *, strategy: str = "vmap"
) -> jax.Array:
  """Logits of every member of an ensemble with stacked parameters.

  Args:
    apply_fn: ``apply_fn(params, x) -> [B, K]`` (deterministic; ``models``'
      apply functions default to no dropout).
    stacked_params: the members' variables, each leaf with a leading [M] axis
      (as ``jax.vmap(init)`` over M keys returns them).
    x: [B, ...] float inputs, B >= 1.
    strategy: ``"vmap"`` over the member axis (the accelerator path), ``"loop"``
      (unrolled inside one jit; faster for convolutions on CPU) or ``"auto"``
      (``pick_strategy``). Same numbers either way.

  Returns:
    [M, B, K] float logits, member m from ``stacked_params`` leaves ``[m]``.
  """
  strategy = pick_strategy(strategy)
  _ensemble_size(stacked_params)
  x = _inputs("x", x)
  logits = _ensemble_logits(apply_fn, stacked_params, x, strategy)
  _check_logits(logits, x.shape[0])
  return logits


class Predictions(NamedTuple):
  """What ``predict`` returns (host numpy arrays).

  Attributes:
    mean_log_probs: [N, K] log of the sample-mean of the softmax probabilities,
      ``logsumexp_s(log_softmax(logits_s)) - log S``.
    scores: name -> [N] score computed on device: ``neg_log_pmax``, ``entropy``
      and ``margin`` of the mean probabilities and, when S >= 2,
      ``covariance_norm_probs`` / ``covariance_norm_logits``: the covariance
      2-norm of the S probability / logit vectors (``scores.covariance_norm``).
    logits: [S, N, K] samples, or None unless ``keep_samples``.
  """

  mean_log_probs: np.ndarray
  scores: dict[str, np.ndarray]
  logits: np.ndarray | None

  @property
  def mean_probs(self) -> np.ndarray:
    """[N, K] sample-mean softmax probabilities."""
    return np.exp(self.mean_log_probs)


def _summarize(logits: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """[S, B, K] logits -> ([B, K] mean log-probs, name -> [B] scores)."""
  num_samples = logits.shape[0]
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  mean_log_probs = jax.nn.logsumexp(log_probs, axis=0) - math.log(num_samples)
  values = {
    "neg_log_pmax": scores.neg_log_pmax(mean_log_probs),
    "entropy": scores.entropy(mean_log_probs),
    "margin": scores.margin(mean_log_probs),
  }
  if num_samples >= 2:
    # On CPU scores.covariance_norm solves one small eigenproblem per call: jaxlib's
    # batched CPU eigh could deadlock a 2-thread pool when two ran at once.
    values["covariance_norm_probs"] = scores.covariance_norm(jnp.exp(log_probs))
    values["covariance_norm_logits"] = scores.covariance_norm(logits)
  return mean_log_probs, values


def _per_example_mc(apply_fn, params, x, example_ids, key, rate, num_samples):
  """[S, B, K] where sample s of example i uses ``fold_in(keys[s], i)``.

  Keying each example by its index in the dataset makes ``predict`` independent
  of the chunk size, the padding and the number of devices.
  """

  def one_sample(sample_key):
    def one_example(example, example_id):
      example_key = jax.random.fold_in(sample_key, example_id)
      return apply_fn(params, example[None], example_key, rate)[0]

    return jax.vmap(one_example)(x, example_ids)

  return jax.vmap(one_sample)(jax.random.split(key, num_samples))


@functools.partial(
  jax.jit,
  static_argnames=(
    "apply_fn",
    "mode",
    "num_samples",
    "strategy",
    "keep_samples",
    "mesh",
    "impl",
  ),
)
def _predict_chunk(
  apply_fn,
  params,
  x,
  example_ids,
  key_data,
  rate,
  *,
  mode,
  num_samples,
  strategy,
  keep_samples,
  mesh,
  impl,
):
  (axis,) = mesh.axis_names

  # Every example is independent: each device computes its own slice, no
  # communication (shard_map), and the outputs stay sharded over examples.
  def local(params, x, example_ids, key_data, rate):
    if mode == "mc_dropout":
      key = jax.random.wrap_key_data(key_data, impl=impl)
      logits = _per_example_mc(apply_fn, params, x, example_ids, key, rate, num_samples)
    else:
      logits = _ensemble(apply_fn, params, x, strategy)
    mean_log_probs, values = _summarize(logits)
    out = {"mean_log_probs": mean_log_probs, "scores": values}
    if keep_samples:
      out["logits"] = logits
    return out

  out_specs = {"mean_log_probs": P(axis), "scores": P(axis)}
  if keep_samples:
    out_specs["logits"] = P(None, axis)
  return jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(P(), P(axis), P(axis), P(), P()),
    out_specs=out_specs,
  )(params, x, example_ids, key_data, rate)


def _global(host_array: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array that every process holds in full."""
  return jax.make_array_from_callback(host_array.shape, sharding, lambda index: host_array[index])


def _to_host(tree: Any) -> Any:
  if jax.process_count() > 1:
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.tree_util.tree_map(np.asarray, tree)


def default_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis ``"batch"``."""
  return Mesh(np.asarray(jax.devices()), ("batch",))


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
) -> Predictions:
  """Streams a dataset through MC dropout or an ensemble; scores on device.

  The dataset is cut into chunks of ``chunk_size`` examples (rounded up to a
  multiple of the mesh size; the last chunk is padded and the padding dropped).
  Each chunk is sharded over the mesh's one axis, the [S, chunk, K] samples are
  drawn and reduced to mean log-probabilities and scores on the devices, and only
  those come back (plus the samples with ``keep_samples``). Each device works on
  its own examples (``jax.shard_map``, no communication). The next chunk is
  dispatched before the previous one is fetched, so transfers overlap compute.

  MC dropout: sample s of example i uses the key
  ``fold_in(split(key, num_samples)[s], i)`` with i the example's index in
  ``x``, so the result does not depend on ``chunk_size``, the padding or the
  number of devices or processes.

  Several processes (``jax.distributed.initialize``): call ``predict`` in every
  process with the same arguments and the full ``x``; the default mesh spans all
  processes' devices, each process feeds its own devices' slices, and every
  process gets the full result.

  Args:
    apply_fn: ``apply_fn(params, x, key, rate) -> [B, K]`` (e.g.
      ``models.make_apply_fn(model)``); it must accept B = 1.
    params: the variables of one network, or with ``ensemble`` those of M
      members stacked on a leading axis.
    x: [N, ...] inputs (a host array; integers are cast to float32), N >= 1.
    key: PRNG key, required for MC dropout (``rate > 0`` or ``num_samples > 1``).
    num_samples: S, MC-dropout samples per example (1 with ``ensemble``).
    rate: dropout rate in [0, 1) (0 with ``ensemble``).
    ensemble: treat ``params`` as stacked ensemble members; S = M.
    chunk_size: examples per step, all devices together. Peak memory grows with
      ``chunk_size * S``: the small CNN at S = 32 peaked at 1.5 GiB of process
      memory with 512 examples per step on CPU, ResNet-20 at 6.8 GiB of GPU
      memory with 256. Default:
      ``default_chunk_size(S, mesh)`` (16 examples per CPU device at S = 32).
    keep_samples: also return the [S, N, K] logits.
    mesh: a 1-D ``jax.sharding.Mesh``; default ``default_mesh()``.
    strategy: ensembles only, see ``pick_strategy``.
    progress: called as ``progress(examples_done, num_examples)`` after each
      chunk.

  Returns:
    ``Predictions`` with [N, K] mean log-probabilities, [N] scores and optionally
    [S, N, K] logits.
  """
  x = np.asarray(x)
  if x.dtype == np.bool_ or not (
    np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
  ):
    raise ValueError(f"x: expected a real-valued array, got dtype {x.dtype}")
  if x.ndim < 2 or x.shape[0] == 0:
    raise ValueError(f"x: expected [N, ...] inputs with N >= 1, got shape {x.shape}")
  x = x.astype(np.float32, copy=False)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"x: {int(np.sum(~np.isfinite(x)))} non-finite value(s)")
  if chunk_size is not None:
    chunk_size = validation.positive_int("chunk_size", chunk_size)
  num_samples = validation.positive_int("num_samples", num_samples)
  rate_value = _dropout_rate(rate)
  if mesh is None:
    mesh = default_mesh()
  if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
    raise ValueError(f"mesh: expected a 1-D jax.sharding.Mesh, got {mesh!r}")

  if ensemble:
    if num_samples != 1 or float(rate_value) != 0.0:
      raise ValueError(
        "num_samples and rate: an ensemble is deterministic, expected 1 and 0,"
        f" got {num_samples} and {float(rate_value)}"
      )
    mode = "ensemble"
    num_samples = _ensemble_size(params)
    strategy = pick_strategy(strategy)
    key = jax.random.key(0)  # unused; keeps one code path
  else:
    mode = "mc_dropout"
    strategy = "vmap"
    if key is None:
      if num_samples > 1 or float(rate_value) != 0.0:
        raise ValueError("key: a PRNG key is required for MC dropout")
      key = jax.random.key(0)  # unused: rate 0, one sample
    key = _prng_key(key)

  one_network = _member(params, 0) if ensemble else params
  try:
    out_shape = jax.eval_shape(apply_fn, one_network, x[:1], key, rate_value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"apply_fn: cannot be applied to one example of x ({e})") from e
  if out_shape.ndim != 2 or out_shape.shape[0] != 1:
    raise ValueError(f"apply_fn: expected logits [B, K] for B = 1 inputs, got {out_shape.shape}")

  num_devices = mesh.devices.size
  if chunk_size is None:
    chunk_size = default_chunk_size(num_samples, mesh)
  chunk = -(-chunk_size // num_devices) * num_devices
  (axis,) = mesh.axis_names
  replicated = NamedSharding(mesh, P())
  by_example = NamedSharding(mesh, P(axis))
  params_global = jax.tree_util.tree_map(lambda leaf: _global(np.asarray(leaf), replicated), params)
  key_global = _global(np.asarray(jax.random.key_data(key)), replicated)
  rate_global = _global(np.asarray(rate_value), replicated)
  step = functools.partial(
    _predict_chunk,
    apply_fn,
    mode=mode,
    num_samples=num_samples,
    strategy=strategy,
    keep_samples=keep_samples,
    mesh=mesh,
    impl=jax.random.key_impl(key),
  )

  num_examples = x.shape[0]
  pieces: list[Any] = []
  pending: tuple[int, Any] | None = None
  for start in range(0, num_examples, chunk):
    stop = min(start + chunk, num_examples)
    x_chunk = x[start:stop]
    ids = np.arange(start, start + chunk, dtype=np.int32)
    if stop - start < chunk:
      padding = np.zeros((chunk - (stop - start),) + x.shape[1:], np.float32)
      x_chunk = np.concatenate([x_chunk, padding])
    out = step(
      params_global,
      _global(x_chunk, by_example),
      _global(ids, by_example),
      key_global,
      rate_global,
    )
    if pending is not None:
      pieces.append(_fetch(pending, progress, num_examples))
    pending = (stop - start, out, stop)
  pieces.append(_fetch(pending, progress, num_examples))

  first = pieces[0]
  mean_log_probs = np.concatenate([p["mean_log_probs"] for p in pieces])
  values = {name: np.concatenate([p["scores"][name] for p in pieces]) for name in first["scores"]}
  logits = np.concatenate([p["logits"] for p in pieces], axis=1) if keep_samples else None
  return Predictions(mean_log_probs, values, logits)


def _fetch(pending, progress, num_examples) -> dict[str, Any]:
  valid, out, stop = pending
  host = _to_host(out)
  host = {
    "mean_log_probs": host["mean_log_probs"][:valid],
    "scores": {name: value[:valid] for name, value in host["scores"].items()},
    **({"logits": host["logits"][:, :valid]} if "logits" in host else {}),
  }
  if progress is not None:
    progress(stop, num_examples)
  return host
