"""Forward passes of MC-dropout samples and ensemble members, and their arguments' checks.

* ``mc_dropout_logits``: S forward passes of one network under dropout, by
  ``jax.vmap`` over S split keys (and over the examples, each with its own key)
  with the parameters broadcast -> [S, B, K].
* ``ensemble_logits``: one forward pass per member of an ensemble whose
  parameters are stacked on a leading axis -> [M, B, K].

One key scheme: sample s of example i uses ``fold_in(split(key, S)[s], i)``, with
i the example's index in ``x`` (``sample_logits``); ``mc.predict`` runs the same
passes over a whole dataset, sharded, and gives the same samples.

``apply_fn`` is ``apply_fn(params, x, key, rate) -> [B, K]`` logits in evaluation
mode, as ``models.make_apply_fn(model)`` returns; ``ensemble_logits`` calls it as
``apply_fn(params, x)``. It is a static argument of the jitted code: pass the same
object (or an equal one) to avoid recompiling.
"""

import functools
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


def dropout_rate(rate: ArrayLike) -> jax.Array:
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


def batch_inputs(name: str, x: ArrayLike) -> jax.Array:
  """A finite [B, ...] input batch with B >= 1."""
  arr = validation.float_array(name, x, (2, 3, 4, 5))
  validation.check_nonempty(name, arr)
  return arr


def host_inputs(name: str, x: ArrayLike) -> np.ndarray:
  """A finite float32 host array [N, ...] with N >= 1 (integers are cast): ``mc.predict``'s
  ``x``, and the images of training and evaluation."""
  x = np.asarray(x)
  if x.dtype == np.bool_ or not (
    np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
  ):
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


def _check_logits(logits: jax.Array, batch: int) -> None:
  if logits.ndim != 3 or logits.shape[1] != batch:
    raise ValueError(
      f"apply_fn: expected logits [B, K] with B = {batch} per call, got"
      f" {logits.shape[1:]} (stacked: {logits.shape})"
    )


def sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples):
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


@functools.partial(jax.jit, static_argnames=("apply_fn", "num_samples"))
def _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples):
  example_ids = jnp.arange(x.shape[0], dtype=jnp.int32)
  return sample_logits(apply_fn, params, x, example_ids, key, rate, num_samples)


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
  i the example's index in ``x``, so the result equals ``mc.predict(apply_fn, params,
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
  rate = dropout_rate(rate)
  key = as_prng_key(key)
  x = batch_inputs("x", x)
  check_one_example(apply_fn, params, x, key, rate)
  return _mc_dropout_logits(apply_fn, params, x, key, rate, num_samples)


@functools.partial(jax.jit, static_argnames=("apply_fn", "strategy"))
def _ensemble_logits(apply_fn, stacked_params, x, strategy):
  return member_logits(apply_fn, stacked_params, x, strategy)


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
  x = batch_inputs("x", x)
  logits = _ensemble_logits(apply_fn, stacked_params, x, strategy)
  _check_logits(logits, x.shape[0])
  return logits
