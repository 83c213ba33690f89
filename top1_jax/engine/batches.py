"""Training data: checked once, on the devices or streamed, and each network's batch order.

Data that fits (``parallel.fits_on_devices``) lives on the devices for the whole run, its
batches gathered there; else each jitted call's batches are gathered on the hosts and sent.
"""

import functools
from collections.abc import Iterable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from top1_jax.core import validation
from top1_jax.engine import mc, parallel, train_state

# Streamed data: calls sent ahead of the one that runs, and the most bytes of a call's
# batches (but one step), small beside the model.
IN_FLIGHT = 2
STREAMED_CALL_BYTES = 1 << 28


@functools.lru_cache(maxsize=64)
def _logits_classes(model: nn.Module, shapes: tuple, treedef: Any, example_shape: tuple) -> int:
  sample = jax.ShapeDtypeStruct((1, *example_shape), jnp.float32)
  if shapes:
    tree = jax.tree_util.tree_unflatten(treedef, shapes)
  else:  # no variables given: the initial ones
    tree = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), sample)
  shape = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), tree, sample)
  return int(shape.shape[-1])


def _num_classes(model: nn.Module, variables: Any, images: Any) -> int:
  """K, the model's logits with ``variables`` (None: initial ones); computed from shapes."""
  leaves, treedef = jax.tree_util.tree_flatten(variables)
  shapes = tuple(jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype) for leaf in leaves)
  return _logits_classes(model, shapes, treedef, tuple(images.shape[1:]))


def checked_dataset(model, variables, images, labels) -> tuple[np.ndarray, np.ndarray, int]:
  """Host float32 images [N, ...], int32 labels [N] in [0, K), and K, the model's logits."""
  images = mc.host_inputs("images", images)
  num_classes = _num_classes(model, variables, images)
  labels = validation.labels_array("labels", labels, num_classes, host=True)
  validation.same_length(images=images, labels=labels)
  return images, labels, num_classes


def input_dtype(model: nn.Module) -> Any:
  """The dtype of training images on the devices: the model's ``dtype`` for mixed precision
  (its first layer computes in it, so the cast changes no number), else float32."""
  dtype = getattr(model, "dtype", jnp.float32)
  return dtype if dtype in tuple(train_state.HALF_PRECISIONS.values()) else jnp.float32


class TrainingData(NamedTuple):
  """A training set checked once and placed for ``fit``; on the devices N is padded."""

  images: Any
  labels: Any
  num_examples: int
  num_classes: int
  on_device: bool
  dtype: Any
  mesh: Mesh


def training_data(model: nn.Module, images, labels, mesh: Mesh, variables=None) -> TrainingData:
  """Host data checked once against ``model`` (``variables`` None: initial) and placed."""
  images, labels, num_classes = checked_dataset(model, variables, images, labels)
  dtype, num_examples = input_dtype(model), images.shape[0]
  row_bytes = images[0].size * np.dtype(dtype).itemsize + 4
  on_device = parallel.fits_on_devices(num_examples * row_bytes, mesh)
  if on_device:
    images, labels = parallel.put_rows(images, mesh, dtype), parallel.put_rows(labels, mesh)
  return TrainingData(images, labels, num_examples, num_classes, on_device, dtype, mesh)


def for_fit(model: nn.Module, variables: Any, images, labels, mesh: Mesh) -> TrainingData:
  """``fit``'s data: a ``TrainingData`` (``labels`` None) checked against the model, or placed."""
  if not isinstance(images, TrainingData):
    return training_data(model, images, labels, mesh, variables)
  if labels is not None:
    raise ValueError("labels: expected None when images is a TrainingData (it holds them)")
  num_classes = _num_classes(model, variables, images.images)
  if num_classes != images.num_classes:
    raise ValueError(
      f"images: a TrainingData checked for {images.num_classes} classes, the model has"
      f" {num_classes}; make it with training_data(model, ...) for this model"
    )
  return images


@functools.cache
def _permutations(num_examples: int, mesh: Mesh, impl: Any):
  """[M, N] permutations of keys [M] (key data) folded with an epoch, replicated."""

  def draw(key_data, epoch):
    keys = jax.random.wrap_key_data(key_data, impl=impl)
    epoch_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, epoch)
    return jax.vmap(lambda key: jax.random.permutation(key, num_examples))(epoch_keys)

  return jax.jit(draw, out_shardings=NamedSharding(mesh, P()))


class EpochOrder:
  """The mini-batch order of one network, or of M members (``shuffle_keys`` [M]).
  Step t takes position t of the permutations ``permutation(fold_in(key, epoch), N)``,
  drawn on the devices; the last N mod B rows of each are skipped."""

  def __init__(self, shuffle_keys: jax.Array, data: TrainingData, batch_size: int):
    self._members = shuffle_keys.ndim == 1
    keys = shuffle_keys if self._members else shuffle_keys[None]
    self._key_data = parallel.replicate(jax.random.key_data(keys), data.mesh)
    self._draw = _permutations(data.num_examples, data.mesh, jax.random.key_impl(keys))
    self.batch_size = batch_size
    self.rows_per_step = batch_size * keys.shape[0]  # all members' rows
    self.steps_per_epoch = data.num_examples // batch_size
    self._on_device: dict[int, jax.Array] = {}
    self._on_host: dict[int, np.ndarray] = {}

  def _epoch(self, epoch: int) -> jax.Array:
    if epoch not in self._on_device:
      orders = self._draw(self._key_data, np.int32(epoch))
      self._on_device[epoch] = orders if self._members else orders[0]
    return self._on_device[epoch]

  def device_orders(self, first_step: int, num_steps: int) -> tuple[jax.Array, ...]:
    """The permutations of the epochs the steps touch, then copies of the last up to the
    most epochs ``num_steps`` steps can touch (a fixed count: one program per length)."""
    first = first_step // self.steps_per_epoch
    last = (first_step + num_steps - 1) // self.steps_per_epoch
    count = (num_steps + self.steps_per_epoch - 2) // self.steps_per_epoch + 1
    self._on_device = {e: v for e, v in self._on_device.items() if e >= first}
    touched = tuple(self._epoch(epoch) for epoch in range(first, last + 1))
    return touched + touched[-1:] * (count - len(touched))

  def host_rows(self, first_step: int, num_steps: int) -> np.ndarray:
    """[num_steps, B] (or [num_steps, M, B]) rows of steps ``first_step`` on."""
    rows = []
    for step in range(first_step, first_step + num_steps):
      epoch, position = divmod(step, self.steps_per_epoch)
      if epoch not in self._on_host:
        self._on_host = {epoch: np.asarray(parallel.to_local(self._epoch(epoch)))}
      start = position * self.batch_size
      rows.append(self._on_host[epoch][..., start : start + self.batch_size])
    return np.stack(rows)


def streamed_steps(data: TrainingData, order: EpochOrder, steps_per_call: int) -> int:
  """``steps_per_call``, fewer where their batches would exceed ``STREAMED_CALL_BYTES``."""
  step_bytes = order.rows_per_step * data.images[0].nbytes
  return max(1, min(steps_per_call, STREAMED_CALL_BYTES // step_bytes))


def streamed(data: TrainingData, order: EpochOrder, calls: Iterable[tuple[int, int]]):
  """Each call's ``(images [n, (M,) B, ...], labels [n, (M,) B])`` split over the mesh along
  B, ``IN_FLIGHT`` calls ahead."""

  def batches(first: int, num_steps: int) -> tuple[jax.Array, jax.Array]:
    rows = order.host_rows(first, num_steps)
    arrays = (data.images, data.labels)
    return tuple(parallel.shard_rows(a, rows, data.mesh, rows.ndim - 1) for a in arrays)

  return parallel.prefetch((batches(*call) for call in calls), IN_FLIGHT)
