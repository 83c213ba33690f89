"""Loss and accuracy of a trained network, or of an ensemble and each of its members."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.engine import batches, mc, models, parallel, train_state
from top1_jax.engine.train_state import TrainState


@jax.jit
def _eval_batch(state: TrainState, images, labels, mask):
  logits = state.model.apply(state.variables, images, train=False)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = jnp.argmax(logits, axis=-1) == labels
  return jnp.sum(jnp.where(mask, losses, 0.0)), jnp.sum(correct & mask)


def evaluate(
  state: TrainState, images: ArrayLike, labels: ArrayLike, *, batch_size: int = 1000
) -> dict[str, float]:
  """Mean cross-entropy and accuracy of one network (no dropout, BN averages).

  Args:
    state: a single-network ``TrainState``.
    images: [N, ...] float inputs.
    labels: [N] int labels.
    batch_size: examples per jitted call (the last batch is padded).

  Returns:
    ``{"loss": float, "accuracy": float, "num_examples": int}``.
  """
  images, labels = batches.checked_dataset(state.model, state.variables, images, labels)
  batch_size = validation.positive_int("batch_size", batch_size)
  return _evaluate(parallel.to_local(state), images, labels, batch_size)


def _evaluate(state: TrainState, images, labels, batch_size: int) -> dict[str, float]:
  """``evaluate`` of checked host arrays."""
  num_examples = images.shape[0]
  batch_size = min(batch_size, num_examples)
  loss_sum, correct = 0.0, 0
  for start in range(0, num_examples, batch_size):
    x, y = images[start : start + batch_size], labels[start : start + batch_size]
    valid = x.shape[0]
    if valid < batch_size:
      x = np.concatenate([x, np.zeros((batch_size - valid,) + x.shape[1:], x.dtype)])
      y = np.concatenate([y, np.zeros(batch_size - valid, y.dtype)])
    batch_loss, batch_correct = _eval_batch(state, x, y, np.arange(batch_size) < valid)
    loss_sum += float(batch_loss)
    correct += int(batch_correct)
  return {
    "loss": loss_sum / num_examples,
    "accuracy": correct / num_examples,
    "num_examples": num_examples,
  }


def evaluate_ensemble(
  states: TrainState,
  images: ArrayLike,
  labels: ArrayLike,
  *,
  chunk_size: int = 1000,
  strategy: str = "auto",
) -> dict[str, Any]:
  """The ensemble's accuracy and NLL (of the mean probabilities), and each member's.

  Args:
    states: an ensemble ``TrainState``.
    images: [N, ...] float inputs.
    labels: [N] int labels.
    chunk_size: examples per device step.
    strategy: see ``mc.pick_strategy``.

  Returns:
    ``{"loss": float, "accuracy": float, "member_accuracy": [M] list,
    "num_examples": int}``.
  """
  size, states = mc.ensemble_size(states.params), parallel.to_local(states)
  variables = train_state.member(states, 0).variables
  images, labels = batches.checked_dataset(states.model, variables, images, labels)
  predictions = mc.predict(
    models.make_apply_fn(states.model),
    states.variables,
    images,
    ensemble=True,
    chunk_size=chunk_size,
    strategy=strategy,
  )
  log_probs = predictions.mean_log_probs
  nll = -np.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0]
  member_accuracy = [
    _evaluate(train_state.member(states, m), images, labels, chunk_size)["accuracy"]
    for m in range(size)
  ]
  return {
    "loss": float(np.mean(nll)),
    "accuracy": float(np.mean(np.argmax(log_probs, axis=1) == labels)),
    "member_accuracy": member_accuracy,
    "num_examples": int(labels.shape[0]),
  }
