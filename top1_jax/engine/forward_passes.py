"""Forward passes of MC-dropout samples and ensemble members, and their arguments' checks.

``apply_fn(params, x, key, rate) -> [B, K]`` (``models.make_apply_fn``) is a static argument
of the jitted code: pass the same (or an equal) object to avoid recompiling.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import validation

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
  """How to vectorize over ensemble members: ``"vmap"`` on gpu/tpu, else ``"loop"``.

  vmap makes grouped convolutions, several times slower on CPU (docs/performance.md)."""
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
