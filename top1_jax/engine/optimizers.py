"""The optimizer and learning-rate schedule of a training run, from its settings (optax).

``make(...)`` returns an ``Optimizer``: the optax transformation and the learning
rate as a function of the step (the schedule the transformation follows, for
logging). Steps count optimizer updates from 0; epochs are converted with
``steps_per_epoch``.

* ``optimizer``: ``"adam"`` (``optax.adam``) or ``"sgd"`` (``optax.sgd`` with
  ``momentum``, Nesterov's when ``nesterov``).
* ``lr_schedule``: ``"constant"``; ``"cosine"`` (Loshchilov & Hutter 2017): step t of
  T = ``num_steps`` takes ``lr (1 + cos(pi t / T)) / 2``, from the peak rate at step 0
  to 0 at step T, one step *after* the last, so the last update (t = T - 1) still
  moves, at ``lr (1 + cos(pi (T - 1) / T)) / 2`` (about ``lr pi^2 / (4 T^2)``): optax's
  ``cosine_decay_schedule`` over the run, as the Flax ImageNet example and He et al.
  2019 ("Bag of Tricks") count it; ``"step"`` (multiplied by ``lr_factor`` at each
  epoch of ``lr_boundaries``, He et al. 2016, Zagoruyko & Komodakis 2016).
  ``warmup_epochs`` > 0 prepends a linear warmup from 0 (Goyal et al. 2017); the
  schedule after it is then shifted by the warmup.
* ``weight_decay``: L2 regularisation of the kernels (every parameter with 2 or
  more axes: conv and dense weights, not biases nor BatchNorm scales), *coupled*:
  ``weight_decay * w`` is added to the gradient before the optimizer, as in He et
  al. and Zagoruyko & Komodakis (SGD's ``weight_decay`` in Torch and PyTorch);
  it equals a loss term ``weight_decay / 2 * ||w||^2``. With Adam this is
  L2-regularised Adam, not AdamW's decoupled decay.

A constant rate without warmup or weight decay gives exactly ``optax.adam(lr)`` /
``optax.sgd(lr, ...)`` (same optimizer state as before these settings existed, so
older checkpoints restore).
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import optax

__all__ = ["OPTIMIZERS", "SCHEDULES", "Optimizer", "make", "schedule", "kernel_mask"]

OPTIMIZERS = ("adam", "sgd")
"""The optimizers by name."""

SCHEDULES = ("constant", "cosine", "step")
"""The learning-rate schedules by name."""


class Optimizer(NamedTuple):
  """A run's optimizer.

  Attributes:
    tx: the optax transformation.
    learning_rate: ``learning_rate(step) -> float``, the rate of update ``step``
      (0-based), as the transformation applies it.
  """

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

  Args:
    learning_rate: the peak rate, > 0.
    lr_schedule: one of ``SCHEDULES``.
    num_steps: the run's total number of steps, >= 1 (cosine reaches 0 at this step,
      one after the last).
    steps_per_epoch: steps of one epoch, >= 1.
    lr_boundaries: epochs after which ``"step"`` multiplies the rate by ``lr_factor``,
      increasing, each in (0, num_epochs).
    lr_factor: the step schedule's factor, > 0.
    warmup_epochs: epochs of linear warmup from 0, >= 0.
  """
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
  """The optax transformation of ``optimizer`` at ``learning_rate`` (see the module).

  Args:
    optimizer: one of ``OPTIMIZERS``.
    learning_rate: a float, or a schedule from ``schedule``.
    momentum: SGD's momentum in [0, 1) (0: plain SGD); unused by Adam.
    nesterov: Nesterov momentum for SGD.
    weight_decay: coupled L2 on the kernels, >= 0 (0: none).

  Returns:
    The ``Optimizer`` (transformation and ``learning_rate(step)``).
  """
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
