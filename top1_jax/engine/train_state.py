"""The state a training step reads and writes, for one network or a deep ensemble, and the step.

Mixed precision as in the Flax ImageNet example: parameters stay float32; ``"float16"`` adds
a dynamic loss scale, not checkpointed.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training import dynamic_scale as dynamic_scale_lib
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.engine import augment, mc, models

HALF_PRECISIONS = {"none": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
"""The computation dtype of each ``half_precision`` setting (parameters stay float32)."""


@struct.dataclass
class TrainState:
  """Everything a training step reads and writes (a pytree; leaves [M, ...] for an ensemble).
  ``model_state``: the mutable collections (``{"batch_stats": ...}`` for BatchNorm, or {})."""

  step: jax.Array
  params: Any
  model_state: Any
  opt_state: Any
  model: nn.Module = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  dropout_rate: float = struct.field(pytree_node=False, default=0.0)
  augmentation: augment.Augmentation = struct.field(
    pytree_node=False, default=augment.NO_AUGMENTATION
  )
  dynamic_scale: dynamic_scale_lib.DynamicScale | None = None

  @property
  def variables(self) -> dict[str, Any]:
    """``{"params": ..., **model_state}``, for ``model.apply`` and ``mc``."""
    return {"params": self.params, **self.model_state}


def compute_dtype(half_precision: str) -> Any:
  """The model ``dtype`` of a ``half_precision`` setting."""
  if half_precision not in HALF_PRECISIONS:
    raise ValueError(
      f"half_precision: expected one of {', '.join(HALF_PRECISIONS)}, got {half_precision!r}"
    )
  return HALF_PRECISIONS[half_precision]


def loss_scale(
  half_precision: str, growth_interval: int = 2000
) -> dynamic_scale_lib.DynamicScale | None:
  """float16's dynamic loss scale, else None: from 2^15, halved by a skipped non-finite
  step, doubled after ``growth_interval`` (flax's default 2000) finite steps in a row."""
  compute_dtype(half_precision)
  if half_precision != "float16":
    return None
  growth_interval = validation.positive_int("growth_interval", growth_interval)
  return dynamic_scale_lib.DynamicScale(
    growth_interval=growth_interval,
    fin_steps=jnp.zeros((), jnp.int32),
    scale=jnp.asarray(2.0**15, jnp.float32),
  )


def _checked_create(
  model, tx, key, sample_input, dropout_rate, augmentation, dynamic_scale, ensemble_size=None
) -> TrainState:
  """``create_train_state`` (``ensemble_size`` None) or ``init_ensemble``, arguments checked."""
  validation.instance("model", model, nn.Module, "a flax.linen.Module")
  if not hasattr(tx, "init") or not hasattr(tx, "update"):
    raise ValueError(f"tx: expected an optax GradientTransformation, got {type(tx).__name__}")
  validation.instance(
    "augmentation", augmentation, augment.Augmentation, "an augment.Augmentation (augment.make)"
  )
  if dynamic_scale is not None:
    hint = "None or a flax DynamicScale (loss_scale)"
    validation.instance("dynamic_scale", dynamic_scale, dynamic_scale_lib.DynamicScale, hint)
  sample_input = validation.as_array("sample_input", sample_input, (2, 3, 4, 5))
  key, rate = mc.as_prng_key(key), dropout_rate
  if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating)) or not 0 <= rate < 1:
    raise ValueError(f"dropout_rate: expected a number in [0, 1), got {rate!r}")
  if ensemble_size is not None:
    key = jax.random.split(key, validation.positive_int("ensemble_size", ensemble_size))
  return _create(model, tx, key, sample_input, float(rate), augmentation, dynamic_scale)


# Jitted: op by op, the optimizer state dispatches a small program per leaf and operation.
@functools.partial(jax.jit, static_argnums=(0, 1, 4, 5))
def _create(model, tx, keys, sample_input, dropout_rate, augmentation, scale) -> TrainState:
  """One network's state of a key [], or M members' (leaves [M, ...]) of keys [M]."""

  def create(key):
    variables = models.init(model, key, sample_input)
    params = variables["params"]
    model_state = {name: value for name, value in variables.items() if name != "params"}
    step, opt_state = jnp.zeros((), jnp.int32), tx.init(params)
    return TrainState(
      step, params, model_state, opt_state, model, tx, dropout_rate, augmentation, scale
    )

  return jax.vmap(create)(keys) if keys.ndim else create(keys)


def create_train_state(
  model: nn.Module,
  tx: optax.GradientTransformation,
  key: jax.Array,
  sample_input: ArrayLike,
  *,
  dropout_rate: float = 0.0,
  augmentation: augment.Augmentation = augment.NO_AUGMENTATION,
  dynamic_scale: dynamic_scale_lib.DynamicScale | None = None,
) -> TrainState:
  """A ``TrainState`` at step 0; only the shape and dtype of ``sample_input`` matter."""
  return _checked_create(model, tx, key, sample_input, dropout_rate, augmentation, dynamic_scale)


def init_ensemble(
  model: nn.Module,
  tx: optax.GradientTransformation,
  key: jax.Array,
  sample_input: ArrayLike,
  *,
  ensemble_size: int,
  dropout_rate: float = 0.0,
  augmentation: augment.Augmentation = augment.NO_AUGMENTATION,
  dynamic_scale: dynamic_scale_lib.DynamicScale | None = None,
) -> TrainState:
  """M members, leaves [M, ...]; member m is ``create_train_state`` with ``split(key, M)[m]``."""
  args = (model, tx, key, sample_input, dropout_rate, augmentation, dynamic_scale)
  return _checked_create(*args, ensemble_size)


def member(states: TrainState, index: int) -> TrainState:
  """Member ``index`` of an ensemble ``TrainState`` (leaves ``[index]``)."""
  size = mc.ensemble_size(states.params)
  index = validation.positive_int("index", index, minimum=0, maximum=size - 1)
  return jax.tree_util.tree_map(lambda leaf: leaf[index], states)


def apply_step(state: TrainState, batch, key) -> tuple[TrainState, dict[str, jax.Array]]:
  """``train_step`` unjitted and unchecked (traceable): one network's step."""
  images, labels = batch
  if state.augmentation:  # its own key; without augmentation the dropout key is unchanged
    key, augment_key = jax.random.split(key)
    images = state.augmentation(augment_key, images)

  def loss_fn(params):
    mutable = list(state.model_state) or False
    variables, rngs = {"params": params, **state.model_state}, {"dropout": key}
    outputs = state.model.apply(
      variables, images, train=True, dropout_rate=state.dropout_rate, rngs=rngs, mutable=mutable
    )
    logits, new_model_state = outputs if mutable else (outputs, {})
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    return loss, (logits, dict(new_model_state))

  if state.dynamic_scale is None:
    (loss, (logits, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  else:
    scale, finite, (loss, (logits, model_state)), grads = state.dynamic_scale.value_and_grad(
      loss_fn, has_aux=True
    )(state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  new = (optax.apply_updates(state.params, updates), model_state, opt_state)
  if state.dynamic_scale is not None:  # a step with non-finite gradients changes only the scale
    old = (state.params, state.model_state, state.opt_state)
    new = jax.tree_util.tree_map(functools.partial(jnp.where, finite), new, old)
    state = state.replace(dynamic_scale=scale)
  params, model_state, opt_state = new
  new_state = state.replace(
    step=state.step + 1, params=params, model_state=model_state, opt_state=opt_state
  )
  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
  return new_state, {"loss": loss, "accuracy": accuracy}


ensemble_step = jax.vmap(apply_step)
"""``apply_step`` of every member of an ensemble state: batch [M, B, ...], keys [M]."""
_train_step_jit = jax.jit(apply_step)
_ensemble_train_step_jit = jax.jit(ensemble_step)


def _check_batch(batch: Any, member_axis: bool) -> tuple[jax.Array, jax.Array]:
  if not isinstance(batch, (tuple, list)) or len(batch) != 2:
    raise ValueError("batch: expected a pair (images, labels)")
  lead = 1 if member_axis else 0
  images = validation.as_array("batch images", batch[0], range(2 + lead, 6 + lead))
  labels = validation.as_array("batch labels", batch[1], 1 + lead)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"batch labels: expected integer labels, got dtype {labels.dtype}")
  if images.shape[: lead + 1] != labels.shape:
    raise ValueError(
      f"batch: images {images.shape} and labels {labels.shape} disagree on the"
      f" {'member and ' if member_axis else ''}batch axes"
    )
  return images, labels


def train_step(
  state: TrainState, batch: tuple[ArrayLike, ArrayLike], key: jax.Array
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on the mean softmax cross-entropy (jitted, pure); metrics before it.
  Labels are not range-checked: that would sync every step."""
  return _train_step_jit(state, _check_batch(batch, False), mc.as_prng_key(key))


def ensemble_train_step(
  states: TrainState, batch: tuple[ArrayLike, ArrayLike], keys: jax.Array
) -> tuple[TrainState, dict[str, jax.Array]]:
  """``train_step`` of every member at once: batch ``(images [M, B, ...], labels [M, B])``,
  [M] ``keys``; metrics [M]."""
  size = mc.ensemble_size(states.params)
  images, labels = _check_batch(batch, True)
  if images.shape[0] != size:
    raise ValueError(f"batch: expected {size} member batches, got {images.shape[0]}")
  is_keys = isinstance(keys, jax.Array) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
  if not is_keys or keys.shape != (size,):
    raise ValueError(f"keys: expected [{size}] PRNG keys from jax.random.split")
  return _ensemble_train_step_jit(states, (images, labels), keys)
