"""Training data: host arrays checked once, and each network's mini-batch order.

Step t of a network trained with shuffle key k takes the rows at position t of the
epoch permutations ``permutation(fold_in(k, epoch), N)``; the last N mod B rows of
each permutation are skipped.
"""

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from top1_jax.core import validation
from top1_jax.engine import forward_passes, parallel


def _num_classes(model: nn.Module, variables: Any, images: np.ndarray) -> int:
  shape = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, images[:1])
  return int(shape.shape[-1])


def checked_dataset(model, variables, images, labels) -> tuple[np.ndarray, np.ndarray]:
  """Host float32 images [N, ...] and int32 labels [N] in [0, K) (K: the model's
  logits), checked once for a whole run."""
  images = forward_passes.host_inputs("images", images)
  num_classes = _num_classes(model, variables, images)
  labels = validation.labels_array("labels", labels, num_classes, host=True)
  validation.same_length(images=images, labels=labels)
  return images, labels


class EpochBatches:
  """Mini-batch indices of one network (or member): a fresh permutation every epoch."""

  def __init__(self, shuffle_key: jax.Array, num_examples: int, batch_size: int):
    self._key = shuffle_key
    self._num_examples = num_examples
    self._batch_size = batch_size
    self._steps_per_epoch = num_examples // batch_size
    self._epoch = -1
    self._order = np.empty(0, np.int64)

  def indices(self, step: int) -> np.ndarray:
    """[batch_size] rows of step ``step``: position ``step`` of the epoch permutations."""
    epoch, position = divmod(step, self._steps_per_epoch)
    if epoch != self._epoch:
      epoch_key = jax.random.fold_in(self._key, epoch)
      self._order = np.asarray(jax.random.permutation(epoch_key, self._num_examples))
      self._epoch = epoch
    start = position * self._batch_size
    return self._order[start : start + self._batch_size]


def checked_schedule(num_steps, batch_size, num_examples, log_every) -> tuple[int, int, int]:
  """``fit``'s step count, batch size (a multiple of the device count) and log interval."""
  num_steps = validation.positive_int("num_steps", num_steps)
  batch_size = validation.positive_int("batch_size", batch_size, maximum=num_examples)
  log_every = validation.positive_int("log_every", log_every)
  parallel.check_global_batch("batch_size", batch_size)
  return num_steps, batch_size, log_every
