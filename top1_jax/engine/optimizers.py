"""The optimizer and learning-rate schedule of a training run, from its settings (optax).

Steps count optimizer updates from 0; epochs are converted with ``steps_per_epoch``. A
constant rate without warmup or weight decay gives exactly ``optax.adam(lr)`` /
``optax.sgd(lr, ...)`` (the same optimizer state, so older checkpoints restore).
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import optax

__all__ = ["OPTIMIZERS", "SCHEDULES", "Optimizer", "make", "schedule", "kernel_mask"]

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "cosine", "step")


class Optimizer(NamedTuple):
  """A run's optax transformation and ``learning_rate(step)``, the rate it applies (logged)."""

  tx: optax.GradientTransformation
  learning_rate: Callable[[int], float]


def _fail(field: str, expected: str, got) -> None:
  raise ValueError(f"{field}: expected {expected}, got {got!r}")


def schedule(
  learning_rate: float,
  lr_schedule: str,
  *,
  num_steps: int,
  steps_per_epoch: int,
  lr_boundaries: Sequence[float] = (),
  lr_factor: float = 0.1,
  warmup_epochs: float = 0.0,
) -> float | optax.Schedule:
  """The learning rate: a float when constant without warmup, else an optax schedule.
  ``"cosine"`` reaches 0 at step ``num_steps``, one *after* the last, so the last update
  still moves (as the Flax ImageNet example). ``"step"`` multiplies the rate by ``lr_factor``
  after each epoch of ``lr_boundaries``. A warmup shifts the schedule after it."""
  if not learning_rate > 0:
    _fail("learning_rate", "a number > 0", learning_rate)
  if lr_schedule not in SCHEDULES:
    _fail("lr_schedule", f"one of {', '.join(SCHEDULES)}", lr_schedule)
  if not warmup_epochs >= 0:
    _fail("warmup_epochs", "a number >= 0", warmup_epochs)
  warmup = round(warmup_epochs * steps_per_epoch)
  if warmup >= num_steps and warmup:
    _fail("warmup_epochs", f"fewer than the run's {num_steps} steps", warmup_epochs)
  if lr_schedule == "constant" and not warmup:
    return float(learning_rate)
  if lr_schedule == "constant":
    main = optax.constant_schedule(learning_rate)
  elif lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(learning_rate, num_steps - warmup)
  else:
    main = _step_schedule(learning_rate, lr_boundaries, lr_factor, steps_per_epoch, num_steps)
  if not warmup:
    return main
  ramp = optax.linear_schedule(0.0, learning_rate, warmup)
  return optax.join_schedules([ramp, main], [warmup])


def _step_schedule(learning_rate, boundaries, factor, steps_per_epoch, num_steps):
  boundaries = tuple(boundaries)
  steps = [round(b * steps_per_epoch) for b in boundaries]
  if not boundaries or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
    _fail("lr_boundaries", "increasing epochs for lr_schedule=step", boundaries)
  if steps[0] <= 0 or steps[-1] >= num_steps:
    _fail(
      "lr_boundaries", f"epochs inside the run (0, {num_steps / steps_per_epoch:g})", boundaries
    )
  if not factor > 0:
    _fail("lr_factor", "a number > 0", factor)
  return optax.piecewise_constant_schedule(learning_rate, {step: factor for step in steps})


def kernel_mask(params) -> object:
  """True for the leaves weight decay applies to: kernels, the leaves with ndim >= 2."""
  return jax.tree_util.tree_map(lambda leaf: leaf.ndim >= 2, params)


def make(
  optimizer: str,
  learning_rate: float | optax.Schedule,
  *,
  momentum: float = 0.9,
  nesterov: bool = False,
  weight_decay: float = 0.0,
) -> Optimizer:
  """``optax.adam`` or ``optax.sgd`` (``momentum`` 0: plain) at ``learning_rate``.
  ``weight_decay`` is *coupled* L2 on the kernels (``kernel_mask``), added to the gradient
  before the optimizer, as PyTorch SGD's; with Adam that is not AdamW's decay."""
  if optimizer not in OPTIMIZERS:
    _fail("optimizer", f"one of {', '.join(OPTIMIZERS)}", optimizer)
  if not 0 <= momentum < 1:
    _fail("momentum", "a number in [0, 1)", momentum)
  if not weight_decay >= 0:
    _fail("weight_decay", "a number >= 0", weight_decay)
  if optimizer == "adam":
    tx = optax.adam(learning_rate)
  else:
    tx = optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov)
  if weight_decay:
    tx = optax.chain(optax.add_decayed_weights(weight_decay, mask=kernel_mask), tx)
  rate = learning_rate if callable(learning_rate) else (lambda step: learning_rate)
  return Optimizer(tx, lambda step: float(rate(step)))
