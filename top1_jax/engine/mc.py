"""MC-dropout samples and deep-ensemble members, vectorized and sharded.

* ``mc_dropout_logits``: S forward passes of one network under dropout, by
  ``jax.vmap`` over S split keys (and over the examples, each with its own key)
  with the parameters broadcast -> [S, B, K].
* ``ensemble_logits``: one forward pass per member of an ensemble whose
  parameters are stacked on a leading axis -> [M, B, K].
* ``predict``: either of the above over a whole dataset, a chunk of examples at
  a time, sharded over the batch axis of a device mesh (all devices of all
  processes by default). The scores are computed on the devices
  (``scores.sample_summary``), so only ``[N, K]`` mean probabilities and ``[N]``
  scores reach the host unless the samples are asked for.

One key scheme: sample s of example i uses ``fold_in(split(key, S)[s], i)``, with
i the example's index in ``x``. ``mc_dropout_logits`` and ``predict`` give the same
samples, and ``predict``'s do not depend on the chunk size or the devices.

``apply_fn`` is ``apply_fn(params, x, key, rate) -> [B, K]`` logits in evaluation
mode, as ``models.make_apply_fn(model)`` returns; ``ensemble_logits`` calls it as
``apply_fn(params, x)``. It is a static argument of the jitted code: pass the same
object (or an equal one) to avoid recompiling.
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

ApplyFn = Callable[..., jax.Array]
Progress = Callable[[int, int], None]
STRATEGIES = ("auto", "vmap", "loop")
SAMPLE_PASSES_PER_STEP = {"cpu": 512, "default": 8192}
"""``predict``'s default work per device and step (S x examples forward passes).

Small on CPU, where larger steps ran slower and memory grows with the step;
larger on accelerators, short of the steps where a ResNet-20 pays much memory for
little speed. Measurements and the commands that repeat them: docs/performance.md.
"""


def as_prng_key(key: Any) -> jax.Array:
  """Checks a PRNG key argument and returns it as a typed key.

  Args:
    key: a typed key from ``jax.random.key(seed)`` (shape ``()``), or a raw
      uint32 [2] key from ``jax.random.PRNGKey(seed)``.

  Returns:
    A typed PRNG key of shape ().

  Raises:
    ValueError: naming ``key`` for anything else (an int, a batch of keys).
  """
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
  """M, the leading (member) axis that every leaf of stacked parameters shares.

  Args:
    stacked_params: a pytree of arrays, each with a leading [M] axis (as
      ``jax.vmap(init)`` over M keys returns them).

  Returns:
    M >= 1.

  Raises:
    ValueError: naming ``stacked_params`` if it has no leaves, or leaves whose
      leading sizes differ (or are 0, or scalars).
  """
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


def default_mesh() -> Mesh:
  """A 1-D mesh over every device of every process, axis ``"batch"``."""
  return Mesh(np.asarray(jax.devices()), ("batch",))


def _default_chunk_size(num_samples: int, mesh: Mesh) -> int:
  platform = mesh.devices.flat[0].platform
  passes = SAMPLE_PASSES_PER_STEP.get(platform, SAMPLE_PASSES_PER_STEP["default"])
  return mesh.devices.size * max(1, passes // num_samples)


def default_chunk_size(num_samples: int, mesh: Mesh | None = None) -> int:
  """``predict``'s default ``chunk_size``: examples per step over all devices.

  Args:
    num_samples: S (samples or ensemble members per example).
    mesh: the mesh ``predict`` runs on; default ``default_mesh()``.

  Returns:
    ``num_devices * max(1, SAMPLE_PASSES_PER_STEP[platform] // S)``.
  """
  num_samples = validation.positive_int("num_samples", num_samples)
  return _default_chunk_size(num_samples, default_mesh() if mesh is None else mesh)


def pick_strategy(strategy: str = "auto", backend: str | None = None) -> str:
  """How to vectorize over ensemble members: ``"vmap"`` or ``"loop"``.

  ``jax.vmap`` over stacked parameters turns each convolution into a grouped
  convolution; accelerators run that well, but on CPU it is several times slower
  than plain convolutions (docs/performance.md), so an unrolled loop over members
  wins there. Both strategies give the same numbers (up to float rounding).

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


def _host_inputs(x: ArrayLike) -> np.ndarray:
  """``predict``'s x: a finite float32 host array [N, ...] with N >= 1."""
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
  return x


def _check_one_example(apply_fn, params, x, key, rate) -> None:
  """MC dropout applies ``apply_fn`` to one example at a time: it must give [1, K]."""
  try:
    out = jax.eval_shape(apply_fn, params, x[:1], key, rate)
  except (TypeError, ValueError) as e:
    raise ValueError(f"apply_fn: cannot be applied to one example of x ({e})") from e
  if out.ndim != 2 or out.shape[0] != 1:
    raise ValueError(f"apply_fn: expected logits [B, K] for B = 1 inputs, got {out.shape}")


def _check_logits(logits: jax.Array, batch: int) -> None:
  if logits.ndim != 3 or logits.shape[1] != batch:
    raise ValueError(
      f"apply_fn: expected logits [B, K] with B = {batch} per call, got"
      f" {logits.shape[1:]} (stacked: {logits.shape})"
    )


def _sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples):
  """[S, B, K]: sample s of example b under ``fold_in(split(key, S)[s], example_ids[b])``.

  Keying each example by its index in the dataset, not its place in a batch,
  makes the samples independent of chunking, padding and devices.
  """

  def one_sample(sample_key):
    def one_example(example, example_id):
      example_key = jax.random.fold_in(sample_key, example_id)
      return apply_fn(params, example[None], example_key, rate)[0]

    return jax.vmap(one_example)(x, example_ids)

  return jax.vmap(one_sample)(jax.random.split(key, num_samples))


def _member(stacked_params, index: int):
  return jax.tree_util.tree_map(lambda leaf: leaf[index], stacked_params)


def _ensemble(apply_fn, stacked_params, x, strategy: str):
  if strategy == "vmap":
    return jax.vmap(lambda params: apply_fn(params, x))(stacked_params)
  # An unrolled loop inside one jit: plain (non-grouped) convolutions per member.
  size = jax.tree_util.tree_leaves(stacked_params)[0].shape[0]
  return jnp.stack([apply_fn(_member(stacked_params, m), x) for m in range(size)])


@functools.partial(jax.jit, static_argnames=("apply_fn", "num_samples"))
def _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples):
  example_ids = jnp.arange(x.shape[0], dtype=jnp.int32)
  return _sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples)


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

  Sample s of example i uses the key ``fold_in(split(key, num_samples)[s], i)``,
  i the example's index in ``x``, so the result equals ``predict(apply_fn, params,
  x, key=key, num_samples=S, rate=rate, keep_samples=True).logits`` and
  ``apply_fn(params, x[i:i+1], that_key, rate)`` called on its own.

  Args:
    apply_fn: ``apply_fn(params, x, key, rate) -> [B, K]``; it must accept B = 1.
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
  key = as_prng_key(key)
  x = _inputs("x", x)
  _check_one_example(apply_fn, params, x, key, rate)
  return _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples)


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
  ensemble_size(stacked_params)
  x = _inputs("x", x)
  logits = _ensemble_logits(apply_fn, stacked_params, x, strategy)
  _check_logits(logits, x.shape[0])
  return logits


class SampleSummary(NamedTuple):
  """What ``predict`` returns (host numpy arrays).

  Attributes:
    mean_log_probs: [N, K] log of the sample-mean of the softmax probabilities,
      ``logsumexp_s(log_softmax(logits_s)) - log S``.
    scores: name -> [N] score computed on device (``scores.sample_summary``):
      ``neg_log_pmax``, ``entropy`` and ``margin`` of the mean probabilities and,
      when S >= 2, ``covariance_norm_probs`` / ``covariance_norm_logits``: the
      covariance 2-norm of the S probability / logit vectors.
    logits: [S, N, K] samples, or None unless ``keep_samples``.
  """

  mean_log_probs: np.ndarray
  scores: dict[str, np.ndarray]
  logits: np.ndarray | None

  @property
  def mean_probs(self) -> np.ndarray:
    """[N, K] sample-mean softmax probabilities."""
    return np.exp(self.mean_log_probs)


_CHUNK_STATIC = ("apply_fn", "mode", "num_samples", "strategy", "keep_samples", "mesh", "impl")


@functools.partial(jax.jit, static_argnames=_CHUNK_STATIC)
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
      logits = _sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples)
    else:
      logits = _ensemble(apply_fn, params, x, strategy)
    mean_log_probs, values = scores.sample_summary(logits)
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


class _Plan(NamedTuple):
  """``predict``'s arguments, checked and completed."""

  x: np.ndarray  # [N, ...] float32, finite
  mode: str  # "mc_dropout" or "ensemble"
  num_samples: int  # S, or M for an ensemble
  strategy: str  # "vmap" or "loop"
  key: jax.Array  # a typed key (unused by an ensemble)
  rate: jax.Array  # float32 scalar
  mesh: Mesh
  chunk: int  # examples per step, a multiple of the mesh size


def _plan(apply_fn, params, x, key, num_samples, rate, ensemble, chunk_size, mesh, strategy):
  """Checks ``predict``'s arguments once; internal code trusts the ``_Plan``."""
  x = _host_inputs(x)
  if chunk_size is not None:
    chunk_size = validation.positive_int("chunk_size", chunk_size)
  num_samples = validation.positive_int("num_samples", num_samples)
  rate = _dropout_rate(rate)
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
  _check_one_example(apply_fn, _member(params, 0) if ensemble else params, x, key, rate)
  if chunk_size is None:
    chunk_size = _default_chunk_size(num_samples, mesh)
  num_devices = mesh.devices.size
  chunk = -(-chunk_size // num_devices) * num_devices
  return _Plan(x, mode, num_samples, strategy, key, rate, mesh, chunk)


def _global(host_array: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array that every process holds in full."""
  return jax.make_array_from_callback(host_array.shape, sharding, lambda index: host_array[index])


def _chunk_runner(apply_fn, params, plan: _Plan, keep_samples: bool):
  """Puts the replicated arguments on the mesh once; returns ``run(x_chunk, ids)``.

  ``run`` takes a host chunk [chunk, ...] and its example ids [chunk] and
  dispatches the sharded step without waiting for it.
  """
  (axis,) = plan.mesh.axis_names
  replicated = NamedSharding(plan.mesh, P())
  by_example = NamedSharding(plan.mesh, P(axis))
  params_global = jax.tree_util.tree_map(lambda leaf: _global(np.asarray(leaf), replicated), params)
  key_global = _global(np.asarray(jax.random.key_data(plan.key)), replicated)
  rate_global = _global(np.asarray(plan.rate), replicated)
  step = functools.partial(
    _predict_chunk,
    apply_fn,
    mode=plan.mode,
    num_samples=plan.num_samples,
    strategy=plan.strategy,
    keep_samples=keep_samples,
    mesh=plan.mesh,
    impl=jax.random.key_impl(plan.key),
  )

  def run(x_chunk: np.ndarray, ids: np.ndarray) -> Any:
    x_global, ids_global = _global(x_chunk, by_example), _global(ids, by_example)
    return step(params_global, x_global, ids_global, key_global, rate_global)

  return run


def _to_host(tree: Any) -> Any:
  if jax.process_count() > 1:
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.tree_util.tree_map(np.asarray, tree)


def _fetch(valid: int, out: Any) -> dict[str, Any]:
  """The first ``valid`` examples of a chunk's outputs, on the host."""
  host = _to_host(out)
  return {
    "mean_log_probs": host["mean_log_probs"][:valid],
    "scores": {name: value[:valid] for name, value in host["scores"].items()},
    **({"logits": host["logits"][:, :valid]} if "logits" in host else {}),
  }


def _stream(run, x: np.ndarray, chunk: int, progress: Progress | None) -> list[dict[str, Any]]:
  """Runs every chunk of ``x`` (the last one padded); returns the host pieces.

  The next chunk is dispatched before the previous one is fetched, so the
  transfers overlap the compute.
  """
  num_examples = x.shape[0]
  pieces: list[dict[str, Any]] = []

  def collect(valid: int, out: Any, stop: int) -> None:
    pieces.append(_fetch(valid, out))
    if progress is not None:
      progress(stop, num_examples)

  pending: tuple[int, Any, int] | None = None
  for start in range(0, num_examples, chunk):
    stop = min(start + chunk, num_examples)
    x_chunk = x[start:stop]
    if stop - start < chunk:
      padding = np.zeros((chunk - (stop - start),) + x.shape[1:], np.float32)
      x_chunk = np.concatenate([x_chunk, padding])
    out = run(x_chunk, np.arange(start, start + chunk, dtype=np.int32))
    if pending is not None:
      collect(*pending)
    pending = (stop - start, out, stop)
  collect(*pending)
  return pieces


def _concatenate(pieces: list[dict[str, Any]]) -> SampleSummary:
  mean_log_probs = np.concatenate([p["mean_log_probs"] for p in pieces])
  names = pieces[0]["scores"]
  values = {name: np.concatenate([p["scores"][name] for p in pieces]) for name in names}
  keep_samples = "logits" in pieces[0]
  logits = np.concatenate([p["logits"] for p in pieces], axis=1) if keep_samples else None
  return SampleSummary(mean_log_probs, values, logits)


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

  The dataset is cut into chunks of ``chunk_size`` examples (rounded up to a
  multiple of the mesh size; the last chunk is padded and the padding dropped),
  each sharded over the mesh's one axis (``jax.shard_map``, no communication).
  The [S, chunk, K] samples are reduced to mean log-probabilities and scores on
  the devices and only those come back (plus the samples with ``keep_samples``).

  MC dropout keys sample s of example i by ``fold_in(split(key, S)[s], i)``, i
  the index in ``x``, as ``mc_dropout_logits`` does; the result does not depend on
  ``chunk_size``, the padding or the number of devices or processes.

  Several processes (``jax.distributed.initialize``): call ``predict`` in every
  process with the same arguments and the full ``x``; each process feeds its own
  devices' slices of the default mesh, and every process gets the full result.

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
    chunk_size: examples per step, all devices together; peak memory grows with
      ``chunk_size * S``. Default ``default_chunk_size(S, mesh)``.
    keep_samples: also return the [S, N, K] logits.
    mesh: a 1-D ``jax.sharding.Mesh``; default ``default_mesh()``.
    strategy: ensembles only, see ``pick_strategy``.
    progress: called as ``progress(examples_done, num_examples)`` after each chunk.

  Returns:
    ``SampleSummary``: [N, K] mean log-probabilities, [N] scores and optionally
    [S, N, K] logits.
  """
  plan = _plan(apply_fn, params, x, key, num_samples, rate, ensemble, chunk_size, mesh, strategy)
  run = _chunk_runner(apply_fn, params, plan, keep_samples)
  return _concatenate(_stream(run, plan.x, plan.chunk, progress))
