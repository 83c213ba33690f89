"""Loss, accuracy, Brier and ECE of a trained network, or of an ensemble and its members.

Brier and ECE (15 equal-width bins) are of the max-softmax as P(Top-1 correct)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from top1_jax.core import equal_width, validation
from top1_jax.engine import batches, mc, models, parallel, train_state
from top1_jax.engine.train_state import TrainState


@jax.jit
def _eval_batch(state: TrainState, images, labels, mask):
  logits = state.model.apply(state.variables, images, train=False)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  loss_sum = jnp.sum(jnp.where(mask, losses, 0.0))
  return (loss_sum, *_top1_sums(jax.nn.log_softmax(logits), labels, mask))


def _top1_sums(log_probs, labels, mask):
  """Over the unmasked rows: correct count, max-softmax squared error, and [3, bins] of
  (count, hits, confidence sum)."""
  pmax = jnp.exp(jnp.max(log_probs, axis=-1))
  correct = (jnp.argmax(log_probs, axis=-1) == labels) & mask
  index = equal_width.equal_width_index(pmax, equal_width.DEFAULT_ECE_BINS)
  weight = mask.astype(pmax.dtype)
  bins = [
    jax.ops.segment_sum(x, index, equal_width.DEFAULT_ECE_BINS)
    for x in (weight, correct.astype(pmax.dtype), pmax * weight)
  ]
  return jnp.sum(correct), jnp.sum(weight * (pmax - correct) ** 2), jnp.stack(bins)


def _top1_metrics(correct, squares, bins, num_examples: int) -> dict[str, float]:
  counts, hits, confidence = np.asarray(bins, np.float64)
  return {
    "accuracy": float(correct) / num_examples,
    "brier": float(squares) / num_examples,
    "ece": float(np.sum(np.abs(hits - confidence))) / num_examples,
  }


def evaluate(
  state: TrainState, images: ArrayLike, labels: ArrayLike, *, batch_size: int = 1000
) -> dict[str, float]:
  """One network's mean NLL (``"loss"``), accuracy, Brier and ECE (no dropout, BN averages)."""
  images, labels, _ = batches.checked_dataset(state.model, state.variables, images, labels)
  batch_size = validation.positive_int("batch_size", batch_size)
  return _evaluate(parallel.to_local(state), images, labels, batch_size)


def _evaluate(state: TrainState, images, labels, batch_size: int) -> dict[str, float]:
  num_examples = images.shape[0]
  batch_size = min(batch_size, num_examples)
  sums = None
  for start in range(0, num_examples, batch_size):
    x, y = images[start : start + batch_size], labels[start : start + batch_size]
    valid = x.shape[0]
    if valid < batch_size:  # zero rows, masked out
      x, y = (np.pad(a, [(0, batch_size - valid)] + [(0, 0)] * (a.ndim - 1)) for a in (x, y))
    batch = _eval_batch(state, x, y, np.arange(batch_size) < valid)
    sums = batch if sums is None else jax.tree_util.tree_map(jnp.add, sums, batch)
  loss_sum, *top1 = sums
  metrics = {"loss": float(loss_sum) / num_examples, **_top1_metrics(*top1, num_examples)}
  return {**metrics, "num_examples": num_examples}


def evaluate_ensemble(
  states: TrainState,
  images: ArrayLike,
  labels: ArrayLike,
  *,
  chunk_size: int = 1000,
  strategy: str = "auto",
) -> dict[str, Any]:
  """``evaluate``'s metrics of the ensemble's mean probabilities, and ``"member_accuracy"``."""
  size, states = mc.ensemble_size(states.params), parallel.to_local(states)
  variables = train_state.member(states, 0).variables
  images, labels, _ = batches.checked_dataset(states.model, variables, images, labels)
  apply_fn = models.make_apply_fn(states.model)
  predictions = mc.predict(
    apply_fn, states.variables, images, ensemble=True, chunk_size=chunk_size, strategy=strategy
  )
  log_probs = predictions.mean_log_probs
  nll = -np.take_along_axis(log_probs, labels[:, None], axis=1)[:, 0]
  member_accuracy = [
    _evaluate(train_state.member(states, m), images, labels, chunk_size)["accuracy"]
    for m in range(size)
  ]
  num = int(labels.shape[0])
  top1 = _top1_sums(jnp.asarray(log_probs), jnp.asarray(labels), jnp.ones(num, bool))
  return {
    "loss": float(np.mean(nll)),
    **_top1_metrics(*top1, num),
    "member_accuracy": member_accuracy,
    "num_examples": num,
  }
