"""Flax (linen) classifiers whose dropout rate is a call-time argument.

One trained network can be sampled at test time with any dropout rate (the paper
sweeps .002-.2 on networks not necessarily trained with dropout), so the rate is
an argument of ``__call__``, not a module attribute. It may be a traced scalar:
``mc.predict`` passes it as an array, so sweeping rates does not recompile.

Every model is called as ``model.apply(variables, x, train=..., dropout_rate=...,
rngs={"dropout": key})`` and returns logits ``[B, K]``.

* ``train`` switches BatchNorm (ResNet, WideResNet) between batch statistics (True) and
  running averages (False). It does not switch dropout.
* Dropout is active whenever ``dropout_rate`` is not the Python number 0, in
  training and at test time alike (that is MC dropout), and then needs a
  ``"dropout"`` key. A rate of exactly 0 (even traced) returns the input unchanged.

Where dropout acts (never on the input pixels, never on the logits), with the
default ``dropout_placement="all"``:

* ``MLP``: after the ReLU of every hidden layer.
* ``CNN``: after the ReLU of every conv layer (after the pool with
  ``downsample="max_pool"``) and after the ReLU of the hidden dense layer.
* ``ResNet``: inside every residual block between its two convolutions (after the
  first BN + ReLU, as in Wide ResNets), and on the pooled features before the
  classifier.
* ``WideResNet``: between the two convolutions of every block only (Zagoruyko &
  Komodakis 2016, section 2.4), not on the pooled features.

With ``dropout_placement="head"`` only the last of these acts: on the features
that feed the classifier. Everything below it does not depend on the dropout key,
so under ``jax.vmap`` over keys (``mc``) it is computed once for all S samples.
The placement does not change the parameters: ``model.clone(dropout_placement=
"head")`` samples a network trained with the default placement.

Every model has a ``dtype``, the dtype of its computation (as in the Flax
ImageNet example): ``jnp.bfloat16`` or ``jnp.float16`` for mixed precision, the
parameters staying float32. The logits are float32 whatever the ``dtype``, so
softmax, losses and scores are computed in float32. Like the placement, ``dtype``
does not change the parameters (``architecture`` leaves it out).
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

Variables = Any
"""A model's variables: ``{"params": ...}`` plus ``{"batch_stats": ...}`` for BN."""


_MASK_BITS = 16
_MASK_LEVELS = 1 << _MASK_BITS


def dropout_mask(key: jax.Array, keep: jax.Array, shape: Sequence[int]) -> jax.Array:
  """A boolean mask, True with probability ``keep`` rounded to a multiple of 2^-16.

  Each entry compares 16 random bits with ``round(keep * 2^16)``; the bits come
  two to a 32-bit word of the key's generator, drawn with non-partitionable
  threefry. That is several times cheaper on CPU than ``jax.random.bernoulli``
  (one 32-bit float per entry from jax's default partitionable threefry), whose
  draws dominated an MC-dropout forward pass (docs/performance.md).
  The rounding moves a rate by at most 2^-17 (rate .002 becomes .0019989); a
  rate below 2^-17 drops nothing, and at least one entry in 2^16 is kept.

  Args:
    key: a PRNG key (any implementation; threefry keys are the fast case).
    keep: keep probability in (0, 1], a float32 scalar (may be traced).
    shape: the mask's shape.

  Returns:
    bool array of ``shape``.
  """
  size = math.prod(shape)
  # Non-partitionable threefry fills words from one counter; partitionable (the
  # default) computes each word from its index, at about twice the cost per word.
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
  """Inverted dropout with the rate given at call time.

  Each call site draws its own mask from ``make_rng("dropout")``, which folds in
  the module path, so two layers never share a mask. Masks come from
  ``dropout_mask`` (the rate rounded to a multiple of 2^-16); kept entries are
  divided by the exact keep probability, so the expected output is ``x``.
  """

  @nn.compact
  def __call__(self, x: jax.Array, rate: ArrayLike) -> jax.Array:
    """Drops entries of ``x`` with probability ``rate`` and rescales the rest.

    Args:
      x: activations, any shape.
      rate: drop probability in [0, 1), a Python float or a (traced) scalar.

    Returns:
      Same shape and dtype as ``x``.
    """
    if isinstance(rate, (int, float)) and rate == 0:
      return x
    keep = 1.0 - jnp.asarray(rate, jnp.float32)
    # A traced rate of 0 is an exact identity too: the threshold 2^16 keeps every
    # entry and x / 1 == x.
    mask = dropout_mask(self.make_rng("dropout"), keep, x.shape)
    scale = kept_fraction(keep).astype(x.dtype)
    return jnp.where(mask, x / scale, jnp.zeros_like(x))


PLACEMENTS = ("all", "head")


def _check_placement(placement: str) -> None:
  if placement not in PLACEMENTS:
    raise ValueError(f"dropout_placement: expected one of {PLACEMENTS}, got {placement!r}")


def _hidden_dropout(placement: str, x: jax.Array, rate: ArrayLike) -> jax.Array:
  """Dropout on a hidden activation below the head (only with placement "all")."""
  return Dropout()(x, rate) if placement == "all" else x


def _with_channels(x: jax.Array) -> jax.Array:
  """[B, H, W] grayscale images get a channel axis: [B, H, W, 1]."""
  return x[..., None] if x.ndim == 3 else x


def _head(
  features: jax.Array,
  hidden_size: int | None,
  dropout_rate: ArrayLike,
  num_classes: int,
  dtype: Any = jnp.float32,
) -> jax.Array:
  """The classifier on [B, D] features: [ReLU(Dense(hidden_size)) ->] dropout -> [B, K] logits.

  The one place where the dropout of every placement acts. Called inside a model's
  compact ``__call__``: its layers are the model's, named in the order they are made.
  The logits are float32 whatever the compute ``dtype`` (softmax and scores in float32).
  """
  if hidden_size is not None:
    features = nn.relu(nn.Dense(hidden_size, dtype=dtype)(features))
  features = Dropout()(features, dropout_rate)
  return nn.Dense(num_classes, dtype=dtype)(features).astype(jnp.float32)


class MLP(nn.Module):
  """Multi-layer perceptron on flattened inputs.

  Attributes:
    num_classes: K, the number of logits.
    hidden_sizes: widths of the hidden ReLU layers (at least one).
    dropout_placement: ``"all"`` hidden layers or only the ``"head"`` (the last).
    dtype: the computation's dtype (parameters are float32).
  """

  num_classes: int = 10
  hidden_sizes: Sequence[int] = (512, 256)
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool = False, dropout_rate: ArrayLike = 0.0
  ) -> jax.Array:
    """Args: x: [B, ...] float. Returns: [B, K] logits. (``train`` is unused.)"""
    del train
    _check_placement(self.dropout_placement)
    if not self.hidden_sizes:
      raise ValueError("hidden_sizes: expected at least one hidden layer, got ()")
    x = x.reshape((x.shape[0], -1)).astype(jnp.float32)
    for width in self.hidden_sizes[:-1]:
      x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
      x = _hidden_dropout(self.dropout_placement, x, dropout_rate)
    return _head(x, self.hidden_sizes[-1], dropout_rate, self.num_classes, self.dtype)


class CNN(nn.Module):
  """Small CNN for 28x28 images (MNIST, Fashion-MNIST).

  Two 3x3 conv layers then a hidden dense layer. By default each conv has stride
  2 (28 -> 14 -> 7) instead of being followed by a max-pool, whose backward pass
  dominates a training step on CPU and buys about one point of accuracy
  (docs/performance.md).

  Attributes:
    num_classes: K.
    features: channels of the conv layers.
    dense_size: width of the hidden dense layer.
    downsample: ``"stride"`` (stride-2 convs) or ``"max_pool"`` (stride-1 convs
      each followed by a 2x2 max-pool).
    dropout_placement: ``"all"`` layers or only the ``"head"`` (hidden dense).
    dtype: the computation's dtype (parameters are float32).
  """

  num_classes: int = 10
  features: Sequence[int] = (32, 64)
  dense_size: int = 128
  downsample: str = "stride"
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool = False, dropout_rate: ArrayLike = 0.0
  ) -> jax.Array:
    """Args: x: [B, H, W, C] or [B, H, W] float. Returns: [B, K] logits."""
    del train
    _check_placement(self.dropout_placement)
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
  """BatchNorm with momentum 0.9 (statistics kept in float32 whatever ``dtype``)."""
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=dtype)


class _ResidualBlock(nn.Module):
  """conv3x3-BN-ReLU-dropout-conv3x3-BN plus a (projected) shortcut, then ReLU."""

  width: int
  stride: int
  dropout_placement: str
  dtype: Any = jnp.float32

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
  """CIFAR ResNet (He et al. 2016, section 4.2); the defaults are ResNet-20.

  Depth is ``6 n + 2`` with ``n`` blocks per stage: n = 3 gives ResNet-20, 5
  ResNet-32, 9 ResNet-56: a 3x3 conv with 16 channels, then three stages of n
  post-activation blocks with 16, 32 and 64 channels (the 2nd and 3rd halve the
  image), global average pooling and the classifier. Shortcuts that change shape
  are 1x1 projections (He et al.'s option B; their CIFAR networks use option A,
  zero-padded identities, without parameters: 0.272 M parameters here, 0.27 M theirs).

  Attributes:
    num_classes: K.
    blocks_per_stage: residual blocks in each stage (the stages halve the spatial
      size and use the matching ``widths``).
    widths: channels of each stage.
    dropout_placement: ``"all"`` blocks or only the ``"head"`` (pooled features).
    dtype: the computation's dtype (parameters are float32).
  """

  num_classes: int = 10
  blocks_per_stage: Sequence[int] = (3, 3, 3)
  widths: Sequence[int] = (16, 32, 64)
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool = False, dropout_rate: ArrayLike = 0.0
  ) -> jax.Array:
    """Args: x: [B, 32, 32, 3] float (any H, W). Returns: [B, K] logits."""
    _check_placement(self.dropout_placement)
    if len(self.blocks_per_stage) != len(self.widths):
      raise ValueError(
        "blocks_per_stage and widths: expected the same length, got"
        f" {len(self.blocks_per_stage)} and {len(self.widths)}"
      )
    x = _with_channels(x).astype(jnp.float32)
    x = nn.Conv(self.widths[0], (3, 3), use_bias=False, dtype=self.dtype)(x)
    x = nn.relu(_batch_norm(train, self.dtype)(x))
    for stage, (num_blocks, width) in enumerate(
      zip(self.blocks_per_stage, self.widths, strict=True)
    ):
      for block in range(num_blocks):
        stride = 2 if stage > 0 and block == 0 else 1
        block_fn = _ResidualBlock(width, stride, self.dropout_placement, self.dtype)
        x = block_fn(x, train, dropout_rate)
    return _head(jnp.mean(x, axis=(1, 2)), None, dropout_rate, self.num_classes, self.dtype)


# He et al.'s initialisation (fan out), as in Zagoruyko & Komodakis's code.
_HE_NORMAL = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class _WideBlock(nn.Module):
  """Pre-activation block: BN-ReLU-conv3x3-BN-ReLU-dropout-conv3x3, plus the input (through
  a 1x1 conv of the activated input where the shape changes)."""

  width: int
  stride: int
  dropout_placement: str
  dtype: Any = jnp.float32

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
  """Wide ResNet WRN-d-k (Zagoruyko & Komodakis 2016) for 32x32 images.

  A 3x3 conv with 16 channels, three stages of ``(d - 4) / 6`` pre-activation
  blocks with 16k, 32k and 64k channels (the 2nd and 3rd halve the image), BN +
  ReLU, global average pooling and the classifier. Dropout acts between the two
  convolutions of each block (the paper's place; ``dropout_placement="all"``), or
  only on the pooled features with ``"head"``. The paper trains with rate 0.3.

  Attributes:
    num_classes: K.
    depth: d, with d - 4 a positive multiple of 6 (10, 16, 22, 28, 40...).
    widen_factor: k >= 1.
    dropout_placement: ``"all"`` (the blocks) or ``"head"`` (pooled features).
    dtype: the computation's dtype (parameters are float32).
  """

  num_classes: int = 10
  depth: int = 16
  widen_factor: int = 4
  dropout_placement: str = "all"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(
    self, x: jax.Array, *, train: bool = False, dropout_rate: ArrayLike = 0.0
  ) -> jax.Array:
    """Args: x: [B, 32, 32, 3] float (any H, W). Returns: [B, K] logits."""
    _check_placement(self.dropout_placement)
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
        block_fn = _WideBlock(width, stride, self.dropout_placement, self.dtype)
        x = block_fn(x, train, dropout_rate)
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
"""Model classes (or classes with some attributes set) by name, for experiment flags:
``MODELS[name](num_classes=K)``. ``cnn_wide`` is the CNN with twice the channels, a
256-wide dense layer and dropout on it only; ``resnet`` is ResNet-20; ``wrn<d>_<k>`` is
WRN-d-k."""


def architecture(model: nn.Module) -> dict[str, Any]:
  """A JSON-able description of a model: its class name and its attributes.

  Two models with equal descriptions build the same parameter tree; checkpoints
  store it so that restoring into another architecture can be refused.
  ``dropout_placement`` and ``dtype`` are left out: they change how a network is
  computed, not its parameters.

  Args:
    model: an unbound Flax module.

  Returns:
    ``{"class": "CNN", "num_classes": 10, "features": [32, 64], ...}``.
  """
  if not isinstance(model, nn.Module):
    raise ValueError(f"model: expected a flax.linen.Module, got {type(model).__name__}")
  description: dict[str, Any] = {"class": type(model).__name__}
  for field in dataclasses.fields(model):
    if field.name in ("parent", "name", "dropout_placement", "dtype"):
      continue
    value = getattr(model, field.name)
    description[field.name] = list(value) if isinstance(value, tuple) else value
  return description


def init(model: nn.Module, key: jax.Array, sample_input: ArrayLike) -> Variables:
  """Initialises a model's variables.

  Args:
    model: one of this module's classes (or any module with the same call
      signature).
    key: a PRNG key.
    sample_input: [B, ...] an example batch (only its shape and dtype matter).

  Returns:
    ``{"params": ...}``, plus ``{"batch_stats": ...}`` for BatchNorm models.
  """
  return _init(model, key, jnp.asarray(sample_input))


@functools.partial(jax.jit, static_argnums=0)
def _init(model: nn.Module, key: jax.Array, sample_input: jax.Array) -> Variables:
  # Jitted: op by op, initialisation dispatches one small program per operation.
  return model.init(key, sample_input, train=False)


@dataclasses.dataclass(frozen=True)
class ApplyFn:
  """``apply_fn(variables, x, key=None, rate=0.0) -> [B, K]`` for ``mc``.

  Evaluation mode (BatchNorm running averages) with dropout at ``rate``. Equal
  models give equal (and equally hashed) ``ApplyFn`` objects, so jitted callers
  that take it as a static argument compile once per architecture.

  Attributes:
    model: the Flax module.
  """

  model: nn.Module

  def __call__(
    self,
    variables: Variables,
    x: jax.Array,
    key: jax.Array | None = None,
    rate: ArrayLike = 0.0,
  ) -> jax.Array:
    """Args: variables; x: [B, ...]; key: PRNG key (needed when rate != 0);
    rate: dropout rate. Returns: [B, K] logits."""
    if key is None:
      if not (isinstance(rate, (int, float)) and rate == 0):
        raise ValueError("key: a PRNG key is required when the dropout rate is not 0")
      return self.model.apply(variables, x, train=False)
    return self.model.apply(variables, x, train=False, dropout_rate=rate, rngs={"dropout": key})


def make_apply_fn(model: nn.Module) -> Callable[..., jax.Array]:
  """The evaluation-mode apply function of ``model`` (see ``ApplyFn``)."""
  if not isinstance(model, nn.Module):
    raise ValueError(f"model: expected a flax.linen.Module, got {type(model).__name__}")
  return ApplyFn(model)
