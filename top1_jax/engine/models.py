"""Flax (linen) classifiers whose dropout rate is a call-time argument (maybe traced).

``model.apply(variables, x, train=..., dropout_rate=..., rngs={"dropout": key})`` gives
float32 logits [B, K]. ``train`` switches BatchNorm only; dropout acts whenever the rate is
not the Python number 0 (MC dropout), with ``dropout_placement="head"`` only before the head.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax.core import validation

Variables = Any  # {"params": ...} plus {"batch_stats": ...} for BatchNorm models

_MASK_LEVELS = 1 << 16  # 16 random bits per mask entry


def dropout_mask(key: jax.Array, keep: jax.Array, shape: Sequence[int]) -> jax.Array:
  """A boolean mask, True with probability ``keep`` (in (0, 1]) rounded to 2^-16: 16 random
  bits per entry, cheaper on CPU than ``jax.random.bernoulli``."""
  size = math.prod(shape)
  # Non-partitionable threefry: about half the cost per word of the (default) partitionable.
  with jax.threefry_partitionable(False):
    words = jax.random.bits(key, (-(-size // 2),), jnp.uint32)
  halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:size]
  # uint32 comparison: keep = 1 gives threshold 2^16, above every 16-bit value.
  return (halves.astype(jnp.uint32) < _threshold(keep)).reshape(shape)


def _threshold(keep: jax.Array) -> jax.Array:
  """round(keep * 2^16), at least 1 so that a kept entry is never divided by 0."""
  return jnp.clip(jnp.round(keep * _MASK_LEVELS), 1, _MASK_LEVELS).astype(jnp.uint32)


def kept_fraction(keep: jax.Array) -> jax.Array:
  """The exact keep probability of ``dropout_mask``: ``keep`` rounded to 2^-16."""
  return _threshold(keep).astype(jnp.float32) / _MASK_LEVELS


class Dropout(nn.Module):
  """Inverted dropout with the rate (in [0, 1), maybe traced) given at call time."""

  @nn.compact
  def __call__(self, x: jax.Array, rate: ArrayLike) -> jax.Array:
    if isinstance(rate, (int, float)) and rate == 0:
      return x
    keep = 1.0 - jnp.asarray(rate, jnp.float32)
    # A traced rate of 0 is an exact identity too: every entry is kept and x / 1 == x.
    mask = dropout_mask(self.make_rng("dropout"), keep, x.shape)
    scale = kept_fraction(keep).astype(x.dtype)
    return jnp.where(mask, x / scale, jnp.zeros_like(x))


PLACEMENTS = ("all", "head")


def _network(body: Callable) -> Callable:
  """A network's ``__call__(x, *, train=False, dropout_rate=0.0)``: [B, ...] inputs ->
  float32 [B, K] logits; ``train`` uses batch statistics, ``dropout_rate`` may be traced."""

  def __call__(self, x: jax.Array, *, train: bool = False, dropout_rate: ArrayLike = 0.0):
    placement = self.dropout_placement
    if placement not in PLACEMENTS:
      raise ValueError(f"dropout_placement: expected one of {PLACEMENTS}, got {placement!r}")
    return body(self, x, train, dropout_rate)

  return nn.compact(__call__)


def _hidden_dropout(placement: str, x: jax.Array, rate: ArrayLike) -> jax.Array:
  return Dropout()(x, rate) if placement == "all" else x


def _with_channels(x: jax.Array) -> jax.Array:
  """[B, H, W] grayscale images get a channel axis: [B, H, W, 1]."""
  return x[..., None] if x.ndim == 3 else x


def _head(features, hidden_size, dropout_rate, num_classes, dtype) -> jax.Array:
  """[B, D] features -> [ReLU(Dense(hidden_size)) ->] dropout -> float32 [B, K] logits."""
  if hidden_size is not None:
    features = nn.relu(nn.Dense(hidden_size, dtype=dtype)(features))
  features = Dropout()(features, dropout_rate)
  return nn.Dense(num_classes, dtype=dtype)(features).astype(jnp.float32)


class MLP(nn.Module):
  """Multi-layer perceptron on flattened inputs; dropout after every hidden ReLU."""

  num_classes: int = 10
  hidden_sizes: Sequence[int] = (512, 256)
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @_network
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    del train
    if not self.hidden_sizes:
      raise ValueError("hidden_sizes: expected at least one hidden layer, got ()")
    x = x.reshape((x.shape[0], -1)).astype(jnp.float32)
    for width in self.hidden_sizes[:-1]:
      x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
      x = _hidden_dropout(self.dropout_placement, x, dropout_rate)
    return _head(x, self.hidden_sizes[-1], dropout_rate, self.num_classes, self.dtype)


class CNN(nn.Module):
  """Small CNN for 28x28 images: 3x3 convs, then a hidden dense layer (stride-2 convs by
  default: a max-pool's backward pass dominates a CPU training step)."""

  num_classes: int = 10
  features: Sequence[int] = (32, 64)
  dense_size: int = 128
  downsample: str = "stride"
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @_network
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    del train
    if self.downsample not in ("stride", "max_pool"):
      raise ValueError(f"downsample: expected 'stride' or 'max_pool', got {self.downsample!r}")
    x = _with_channels(x).astype(jnp.float32)
    strides = (2, 2) if self.downsample == "stride" else (1, 1)
    for width in self.features:
      x = nn.relu(nn.Conv(width, (3, 3), strides=strides, padding="SAME", dtype=self.dtype)(x))
      if self.downsample == "max_pool":
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
      x = _hidden_dropout(self.dropout_placement, x, dropout_rate)
    features = x.reshape((x.shape[0], -1))
    return _head(features, self.dense_size, dropout_rate, self.num_classes, self.dtype)


def _batch_norm(train: bool, dtype: Any) -> nn.BatchNorm:
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=dtype)


class _Block(nn.Module):
  width: int
  stride: int
  dropout_placement: str
  dtype: Any = jnp.float32


class _ResidualBlock(_Block):
  """conv3x3-BN-ReLU-dropout-conv3x3-BN plus a (projected) shortcut, then ReLU."""

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    norm = functools.partial(_batch_norm, train, self.dtype)
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    y = conv(self.width, (3, 3), (self.stride, self.stride))(x)
    y = nn.relu(norm()(y))
    y = _hidden_dropout(self.dropout_placement, y, dropout_rate)
    y = conv(self.width, (3, 3))(y)
    y = norm()(y)
    if x.shape != y.shape:
      x = conv(self.width, (1, 1), (self.stride, self.stride))(x)
      x = norm()(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """CIFAR ResNet (He et al. 2016, section 4.2), ResNet-20 by default, 1x1 projection shortcuts."""

  num_classes: int = 10
  blocks_per_stage: Sequence[int] = (3, 3, 3)
  widths: Sequence[int] = (16, 32, 64)
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @_network
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    if len(self.blocks_per_stage) != len(self.widths):
      raise ValueError(
        "blocks_per_stage and widths: expected the same length, got"
        f" {len(self.blocks_per_stage)} and {len(self.widths)}"
      )
    x = _with_channels(x).astype(jnp.float32)
    x = nn.Conv(self.widths[0], (3, 3), use_bias=False, dtype=self.dtype)(x)
    x = nn.relu(_batch_norm(train, self.dtype)(x))
    for stage, width in enumerate(self.widths):
      for block in range(self.blocks_per_stage[stage]):
        stride = 2 if stage > 0 and block == 0 else 1
        block_fn = _ResidualBlock(width, stride, self.dropout_placement, self.dtype)
        x = block_fn(x, train, dropout_rate)
    return _head(jnp.mean(x, axis=(1, 2)), None, dropout_rate, self.num_classes, self.dtype)


# He et al.'s initialisation (fan out), as in Zagoruyko & Komodakis's code.
_HE_NORMAL = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class _WideBlock(_Block):
  """Pre-activation block: BN-ReLU-conv3x3-BN-ReLU-dropout-conv3x3 plus the shortcut."""

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    norm = functools.partial(_batch_norm, train, self.dtype)
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=_HE_NORMAL)
    activated = nn.relu(norm()(x))
    y = conv(self.width, (3, 3), (self.stride, self.stride))(activated)
    y = nn.relu(norm()(y))
    y = _hidden_dropout(self.dropout_placement, y, dropout_rate)
    y = conv(self.width, (3, 3))(y)
    if x.shape[-1] != self.width or self.stride != 1:
      x = conv(self.width, (1, 1), (self.stride, self.stride))(activated)
    return x + y


class WideResNet(nn.Module):
  """Wide ResNet WRN-d-k (Zagoruyko & Komodakis 2016) for 32x32 images; dropout acts
  between the two convolutions of each block (the paper's place)."""

  num_classes: int = 10
  depth: int = 16
  widen_factor: int = 4
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @_network
  def __call__(self, x: jax.Array, train: bool, dropout_rate: ArrayLike) -> jax.Array:
    if self.depth < 10 or (self.depth - 4) % 6:
      raise ValueError(f"depth: expected 6 n + 4 with n >= 1 (10, 16, 28...), got {self.depth}")
    if self.widen_factor < 1:
      raise ValueError(f"widen_factor: expected an integer >= 1, got {self.widen_factor}")
    x = _with_channels(x).astype(jnp.float32)
    x = nn.Conv(16, (3, 3), use_bias=False, dtype=self.dtype, kernel_init=_HE_NORMAL)(x)
    for stage in range(3):
      width = 16 * self.widen_factor * 2**stage
      for block in range((self.depth - 4) // 6):
        stride = 2 if stage > 0 and block == 0 else 1
        x = _WideBlock(width, stride, self.dropout_placement, self.dtype)(x, train, dropout_rate)
    x = nn.relu(_batch_norm(train, self.dtype)(x))
    features = jnp.mean(x, axis=(1, 2))
    if self.dropout_placement == "head":  # with "all", the blocks' dropout only (the paper's)
      features = Dropout()(features, dropout_rate)
    return nn.Dense(self.num_classes, dtype=self.dtype)(features).astype(jnp.float32)


MODELS = {
  "mlp": MLP,
  "cnn": CNN,
  "cnn_wide": functools.partial(CNN, features=(64, 128), dense_size=256, dropout_placement="head"),
  "resnet": ResNet,
  "wrn16_4": functools.partial(WideResNet, depth=16, widen_factor=4),
  "wrn16_8": functools.partial(WideResNet, depth=16, widen_factor=8),
  "wrn28_10": functools.partial(WideResNet, depth=28, widen_factor=10),
}
"""Model classes by name, for experiment flags: ``MODELS[name](num_classes=K)``."""


def architecture(model: nn.Module) -> dict[str, Any]:
  """A JSON-able description, ``{"class": "CNN", "num_classes": 10, ...}``; equal ones build
  the same parameters, so placement and ``dtype`` are left out."""
  validation.instance("model", model, nn.Module, "a flax.linen.Module")
  description: dict[str, Any] = {"class": type(model).__name__}
  for field in dataclasses.fields(model):
    if field.name not in ("parent", "name", "dropout_placement", "dtype"):
      value = getattr(model, field.name)
      description[field.name] = list(value) if isinstance(value, tuple) else value
  return description


def init(model: nn.Module, key: jax.Array, sample_input: ArrayLike) -> Variables:
  """A model's variables; only the shape and dtype of ``sample_input`` [B, ...] matter."""
  return _init(model, key, jnp.asarray(sample_input))


# Jitted: op by op, initialisation dispatches one small program per operation.
_init = jax.jit(lambda model, key, x: model.init(key, x, train=False), static_argnums=0)


@dataclasses.dataclass(frozen=True)
class ApplyFn:
  """``apply_fn(variables, x, key=None, rate=0.0) -> [B, K]``, in evaluation mode; equal
  models give equal, equally hashed objects (a static argument compiles once)."""

  model: nn.Module

  def __call__(
    self, variables: Variables, x: jax.Array, key: jax.Array | None = None, rate: ArrayLike = 0.0
  ) -> jax.Array:
    if key is None:
      if not (isinstance(rate, (int, float)) and rate == 0):
        raise ValueError("key: a PRNG key is required when the dropout rate is not 0")
      return self.model.apply(variables, x, train=False)
    return self.model.apply(variables, x, train=False, dropout_rate=rate, rngs={"dropout": key})


def make_apply_fn(model: nn.Module) -> Callable[..., jax.Array]:
  """The evaluation-mode apply function of ``model`` (see ``ApplyFn``)."""
  return ApplyFn(validation.instance("model", model, nn.Module, "a flax.linen.Module"))
