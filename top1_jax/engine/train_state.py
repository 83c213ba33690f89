"""The state a training step reads and writes, for one network or a deep ensemble.

``create_train_state`` initialises one network and its optimizer state;
``init_ensemble`` initialises M members with ``jax.vmap`` over ``split(key, M)``,
every array leaf with a leading [M] member axis; ``member`` and ``stack_members``
go between the two.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.engine import forward_passes, models


@struct.dataclass
class TrainState:
  """Everything a training step reads and writes (a pytree).

  For an ensemble every array leaf has a leading [M] member axis.

  Attributes:
    step: int32 scalar, steps taken so far.
    params: the model's ``"params"`` collection.
    model_state: the other mutable collections, ``{"batch_stats": ...}`` for
      BatchNorm models, else ``{}``.
    opt_state: the optimizer state.
    model: the Flax module (static).
    tx: the optax transformation (static).
    dropout_rate: dropout rate used in training steps (static; 0 = none).
  """

  step: jax.Array
  params: Any
  model_state: Any
  opt_state: Any
  model: nn.Module = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  dropout_rate: float = struct.field(pytree_node=False, default=0.0)

  @property
  def variables(self) -> dict[str, Any]:
    """``{"params": ..., **model_state}``, what ``model.apply`` and ``mc`` take."""
    return {"params": self.params, **self.model_state}


def _train_dropout_rate(rate: Any) -> float:
  is_number = isinstance(rate, (int, float, np.floating)) and not isinstance(rate, bool)
  if not is_number or not 0.0 <= float(rate) < 1.0:
    raise ValueError(f"dropout_rate: expected a number in [0, 1), got {rate!r}")
  return float(rate)


def _check_model_and_tx(model: Any, tx: Any) -> None:
  if not isinstance(model, nn.Module):
    raise ValueError(f"model: expected a flax.linen.Module, got {type(model).__name__}")
  if not hasattr(tx, "init") or not hasattr(tx, "update"):
    raise ValueError(f"tx: expected an optax GradientTransformation, got {type(tx).__name__}")


def _create(model, tx, key, sample_input, dropout_rate) -> TrainState:
  variables = models.init(model, key, sample_input)
  params = variables["params"]
  model_state = {name: value for name, value in variables.items() if name != "params"}
  step = jnp.zeros((), jnp.int32)
  return TrainState(step, params, model_state, tx.init(params), model, tx, dropout_rate)


# Jitted: created op by op (under vmap, too), the optimizer state dispatches one small
# program per leaf and operation.
@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def _create_jit(model, tx, key, sample_input, dropout_rate) -> TrainState:
  return _create(model, tx, key, sample_input, dropout_rate)


@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def _create_ensemble(model, tx, keys, sample_input, dropout_rate) -> TrainState:
  return jax.vmap(lambda key: _create(model, tx, key, sample_input, dropout_rate))(keys)


def create_train_state(
  model: nn.Module,
  tx: optax.GradientTransformation,
  key: jax.Array,
  sample_input: ArrayLike,
  *,
  dropout_rate: float = 0.0,
) -> TrainState:
  """Initialises one network and its optimizer state.

  Args:
    model: a Flax module from ``models`` (or with the same call signature).
    tx: an optax transformation, e.g. ``optax.adam(1e-3)``.
    key: PRNG key for the initial parameters.
    sample_input: [B, ...] an example batch (only shape and dtype matter).
    dropout_rate: dropout rate during training, in [0, 1).

  Returns:
    A ``TrainState`` at step 0.
  """
  _check_model_and_tx(model, tx)
  sample_input = validation.as_array("sample_input", sample_input, (2, 3, 4, 5))
  return _create_jit(
    model, tx, forward_passes.as_prng_key(key), sample_input, _train_dropout_rate(dropout_rate)
  )


def init_ensemble(
  model: nn.Module,
  tx: optax.GradientTransformation,
  key: jax.Array,
  sample_input: ArrayLike,
  *,
  ensemble_size: int,
  dropout_rate: float = 0.0,
) -> TrainState:
  """Initialises M members by ``jax.vmap`` over ``jax.random.split(key, M)``.

  Member m equals ``create_train_state(model, tx, split(key, M)[m], ...)``.

  Args:
    model, tx, sample_input, dropout_rate: as ``create_train_state``.
    key: PRNG key, split into one key per member.
    ensemble_size: M >= 1.

  Returns:
    A ``TrainState`` whose array leaves have a leading [M] axis.
  """
  _check_model_and_tx(model, tx)
  ensemble_size = validation.positive_int("ensemble_size", ensemble_size)
  sample_input = validation.as_array("sample_input", sample_input, (2, 3, 4, 5))
  dropout_rate = _train_dropout_rate(dropout_rate)
  keys = jax.random.split(forward_passes.as_prng_key(key), ensemble_size)
  return _create_ensemble(model, tx, keys, sample_input, dropout_rate)


def _member(states: TrainState, index: int) -> TrainState:
  return jax.tree_util.tree_map(lambda leaf: leaf[index], states)


def member(states: TrainState, index: int) -> TrainState:
  """Member ``index`` of an ensemble ``TrainState`` (leaves ``[index]``)."""
  size = forward_passes.ensemble_size(states.params)
  return _member(states, validation.positive_int("index", index, minimum=0, maximum=size - 1))


def stack_members(states: list[TrainState]) -> TrainState:
  """One ensemble ``TrainState`` of single-network states (leaves stacked on a new [M] axis)."""
  return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *states)
