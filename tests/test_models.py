"""Tests for top1_jax.engine.models: shapes, call-time dropout, apply functions."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from top1_jax.engine import models


def _param_count(variables) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(variables["params"]))


@pytest.mark.parametrize(
  "model, input_shape",
  [
    (models.MLP(num_classes=7, hidden_sizes=(16, 8)), (3, 28, 28)),
    (models.CNN(num_classes=7, features=(4, 8), dense_size=16), (3, 28, 28, 1)),
    (models.CNN(num_classes=7, features=(4, 8), downsample="max_pool"), (3, 28, 28)),
    (models.ResNet(num_classes=7, blocks_per_stage=(1,), widths=(4,)), (3, 32, 32, 3)),
  ],
)
def test_logit_shapes_with_and_without_dropout(model, input_shape):
  x = jax.random.normal(jax.random.key(0), input_shape)
  variables = jax.jit(lambda: models.init(model, jax.random.key(1), x[:1]))()
  plain = jax.jit(model.apply)(variables, x)
  assert plain.shape == (3, 7)
  dropped = jax.jit(lambda v, x, k: model.apply(v, x, dropout_rate=0.5, rngs={"dropout": k}))(
    variables, x, jax.random.key(2)
  )
  assert dropped.shape == (3, 7)
  assert not np.allclose(plain, dropped)


def test_resnet_defaults_are_resnet20():
  model = models.ResNet()
  shapes = jax.eval_shape(lambda: models.init(model, jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  kernels = [
    leaf.shape
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes["params"])[0]
    if "kernel" in jax.tree_util.keystr(path)
  ]
  convs = [s for s in kernels if len(s) == 4 and s[:2] == (3, 3)]
  dense = [s for s in kernels if len(s) == 2]
  # 19 3x3 conv layers + 1 dense = 20 weighted layers (1x1 projections aside).
  assert len(convs) == 19 and dense == [(64, 10)]
  assert 0.26e6 < _param_count(shapes) < 0.29e6  # ResNet-20 has ~0.27M parameters
  assert "batch_stats" in shapes


def _kernel_shapes(shapes) -> list[tuple[int, ...]]:
  return [
    leaf.shape
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes["params"])[0]
    if "kernel" in jax.tree_util.keystr(path)
  ]


@pytest.mark.parametrize(
  "name, depth, width, published",
  [("wrn16_4", 16, 4, 2.7e6), ("wrn28_10", 28, 10, 36.5e6)],
)
def test_wide_resnets_are_zagoruyko_and_komodakis(name, depth, width, published):
  model = models.MODELS[name](num_classes=10)
  shapes = jax.eval_shape(lambda: models.init(model, jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  kernels = _kernel_shapes(shapes)
  blocks = (depth - 4) // 6
  convs = [s for s in kernels if len(s) == 4 and s[:2] == (3, 3)]
  # The stem, then two 3x3 convs per block; the last stage has 64k channels.
  assert len(convs) == 1 + 6 * blocks and convs[-1] == (3, 3, 64 * width, 64 * width)
  assert [s for s in kernels if len(s) == 2] == [(64 * width, 10)]
  assert abs(_param_count(shapes) - published) / published < 0.02  # their table's counts
  assert "batch_stats" in shapes


def test_cnn_downsamples_to_7x7_by_strides_by_default():
  model = models.CNN(features=(4, 8), dense_size=16)
  shapes = jax.eval_shape(lambda: models.init(model, jax.random.key(0), jnp.zeros((1, 28, 28, 1))))
  assert shapes["params"]["Dense_0"]["kernel"].shape == (7 * 7 * 8, 16)


def test_dropout_drops_at_rate_and_rescales():
  rate = 0.3
  ones = jnp.ones((20000,))
  out = models.Dropout().apply({}, ones, rate, rngs={"dropout": jax.random.key(0)})
  dropped = float(jnp.mean(out == 0))
  # 4 standard deviations of a Binomial(20000, 0.3) fraction.
  assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / ones.size)
  # Kept entries are divided by the keep probability actually used: 0.7 rounded to 2^-16.
  kept = round(0.7 * 2**16) / 2**16
  np.testing.assert_allclose(out[out != 0], 1 / kept, rtol=1e-6)


@pytest.mark.parametrize("rate", [0.002, 0.05, 0.5, 0.9])
def test_dropout_mask_keeps_at_the_rounded_rate(rate):
  # An odd size: the last 32-bit word's second half is cut off.
  shape = (3, 66667)
  mask = models.dropout_mask(jax.random.key(3), jnp.float32(1 - rate), shape)
  assert mask.shape == shape and mask.dtype == jnp.bool_
  keep = float(models.kept_fraction(jnp.float32(1 - rate)))
  assert abs(keep - (1 - rate)) <= 2**-17
  n = mask.size
  assert abs(float(jnp.mean(mask)) - keep) < 5 * np.sqrt(keep * (1 - keep) / n)
  # Rows come from different bits: no two rows share a mask.
  assert not np.array_equal(mask[0], mask[1]) and not np.array_equal(mask[1], mask[2])


def test_dropout_mask_extremes():
  key = jax.random.key(0)
  assert bool(jnp.all(models.dropout_mask(key, jnp.float32(1.0), (1000,))))
  # A rate below 2^-17 rounds to keep everything; a keep of ~0 still keeps 1 in 2^16.
  assert bool(jnp.all(models.dropout_mask(key, jnp.float32(1 - 2**-19), (1000,))))
  assert float(models.kept_fraction(jnp.float32(0.0))) == 2**-16


def test_traced_zero_rate_is_identity():
  x = jax.random.normal(jax.random.key(0), (64, 32))
  drop = jax.jit(
    lambda rate: models.Dropout().apply({}, x, rate, rngs={"dropout": jax.random.key(1)})
  )
  np.testing.assert_array_equal(drop(jnp.float32(0.0)), x)
  assert float(jnp.mean(drop(jnp.float32(0.5)) == 0)) > 0.3

  # Through a model: the same up to float rounding (a different XLA program).
  model = models.MLP(hidden_sizes=(32, 32))
  x = jax.random.normal(jax.random.key(0), (4, 10))
  variables = models.init(model, jax.random.key(1), x)

  @jax.jit
  def with_rate(rate):
    return model.apply(variables, x, dropout_rate=rate, rngs={"dropout": jax.random.key(2)})

  deterministic = jax.jit(lambda: model.apply(variables, x))()
  np.testing.assert_allclose(with_rate(jnp.float32(0.0)), deterministic, rtol=1e-5, atol=1e-6)
  assert not np.allclose(with_rate(jnp.float32(0.1)), deterministic)


def test_resnet_train_mode_updates_batch_stats_and_eval_uses_them():
  model = models.ResNet(num_classes=3, blocks_per_stage=(1,), widths=(4,))
  x = jax.random.normal(jax.random.key(0), (8, 8, 8, 3)) * 3 + 1
  variables = jax.jit(lambda: models.init(model, jax.random.key(1), x))()
  train_apply = jax.jit(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]))
  _, updated = train_apply(variables)
  before = variables["batch_stats"]["BatchNorm_0"]["mean"]
  after = updated["batch_stats"]["BatchNorm_0"]["mean"]
  assert not np.allclose(before, after)
  eval_apply = jax.jit(lambda v: model.apply(v, x))
  eval_old = eval_apply(variables)
  eval_new = eval_apply({"params": variables["params"], **updated})
  assert not np.allclose(eval_old, eval_new)


def test_apply_fn_equality_and_key_requirement():
  model = models.MLP(hidden_sizes=(8,))
  fn = models.make_apply_fn(model)
  assert fn == models.make_apply_fn(models.MLP(hidden_sizes=(8,)))
  assert hash(fn) == hash(models.make_apply_fn(models.MLP(hidden_sizes=(8,))))
  assert fn != models.make_apply_fn(models.MLP(hidden_sizes=(9,)))
  x = jnp.ones((2, 5))
  variables = models.init(model, jax.random.key(0), x)
  np.testing.assert_array_equal(fn(variables, x), model.apply(variables, x))
  with pytest.raises(ValueError, match="key"):
    fn(variables, x, None, 0.1)
  with pytest.raises(ValueError, match="model"):
    models.make_apply_fn(lambda v, x: x)


def test_architecture_is_json_and_distinguishes_models():
  description = models.architecture(models.CNN(features=(4, 8)))
  assert json.loads(json.dumps(description)) == description
  assert description["class"] == "CNN" and description["features"] == [4, 8]
  assert description != models.architecture(models.CNN(features=(4, 9)))
  assert description != models.architecture(models.MLP())


def test_bad_configuration_raises_naming_the_field():
  x = jnp.zeros((1, 28, 28, 1))
  with pytest.raises(ValueError, match="downsample"):
    models.init(models.CNN(downsample="avg"), jax.random.key(0), x)
  with pytest.raises(ValueError, match="blocks_per_stage"):
    models.init(models.ResNet(blocks_per_stage=(1, 1), widths=(4,)), jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"depth: expected 6 n \+ 4 with n >= 1"):
    models.init(models.WideResNet(depth=12), jax.random.key(0), x)
  with pytest.raises(ValueError, match="widen_factor: expected an integer >= 1, got 0"):
    models.init(models.WideResNet(widen_factor=0), jax.random.key(0), x)


def test_dtype_changes_neither_the_parameters_nor_the_architecture():
  x = jnp.zeros((1, 32, 32, 3))
  for make in (models.ResNet, models.WideResNet, models.CNN, models.MLP):
    half = make(dtype=jnp.bfloat16)
    shapes = jax.eval_shape(lambda m=half: models.init(m, jax.random.key(0), x))
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(shapes)} == {jnp.dtype("float32")}
    assert models.architecture(half) == models.architecture(make())
    logits = jax.eval_shape(lambda v, m=half: m.apply(v, x), shapes)
    assert logits.dtype == jnp.float32  # softmax and scores in float32


@pytest.mark.slow
def test_mc_dropout_samples_a_wide_resnet_in_bfloat16():
  from top1_jax.engine import mc

  model = models.WideResNet(num_classes=5, depth=10, widen_factor=1, dtype=jnp.bfloat16)
  x = jax.random.uniform(jax.random.key(0), (6, 8, 8, 3))
  variables = models.init(model, jax.random.key(1), x[:1])
  apply_fn = models.make_apply_fn(model)
  sampled = mc.predict(
    apply_fn, variables, x, key=jax.random.key(2), num_samples=4, rate=0.3, keep_samples=True
  )
  assert sampled.logits.shape == (4, 6, 5) and sampled.logits.dtype == np.float32
  assert not np.allclose(sampled.logits[0], sampled.logits[1])  # the blocks' dropout acts
  np.testing.assert_allclose(np.exp(sampled.mean_log_probs).sum(-1), 1.0, rtol=1e-5)
  assert all(np.all(np.isfinite(score)) for score in sampled.scores.values())
  plain = mc.predict(apply_fn, variables, x)
  direct = jax.nn.log_softmax(apply_fn(variables, x))
  np.testing.assert_allclose(plain.mean_log_probs, direct, atol=1e-2)  # bfloat16's rounding


def _dropout_sites(model, variables, x) -> int:
  """How many Dropout layers a forward pass with rate > 0 goes through."""
  _, state = jax.jit(
    lambda v: model.apply(
      v,
      x,
      dropout_rate=0.5,
      rngs={"dropout": jax.random.key(1)},
      capture_intermediates=lambda module, _: isinstance(module, models.Dropout),
      mutable=["intermediates"],
    )
  )(variables)
  return len(jax.tree_util.tree_leaves(state["intermediates"]))


@pytest.mark.parametrize(
  "make, x, all_sites",
  [
    (lambda p: models.MLP(hidden_sizes=(8, 8, 8), dropout_placement=p), jnp.ones((2, 5)), 3),
    (
      lambda p: models.CNN(features=(4, 8), dense_size=8, dropout_placement=p),
      jnp.ones((2, 28, 28)),
      3,
    ),
    (
      lambda p: models.ResNet(blocks_per_stage=(1,), widths=(4,), dropout_placement=p),
      jnp.ones((2, 8, 8, 3)),
      2,
    ),
    (
      lambda p: models.WideResNet(depth=10, widen_factor=1, dropout_placement=p),
      jnp.ones((2, 8, 8, 3)),
      3,  # between the convolutions of each block, not on the pooled features
    ),
  ],
  ids=["mlp", "cnn", "resnet", "wide_resnet"],
)
def test_dropout_placement_all_vs_head(make, x, all_sites):
  # Same parameters either way: a trained network can be sampled with either.
  shapes = lambda m: jax.eval_shape(lambda: models.init(m, jax.random.key(0), x))
  assert shapes(make("all")) == shapes(make("head"))
  variables = models.init(make("all"), jax.random.key(0), x)
  assert _dropout_sites(make("all"), variables, x) == all_sites
  assert _dropout_sites(make("head"), variables, x) == 1
  assert models.architecture(make("all")) == models.architecture(make("head"))
  with pytest.raises(ValueError, match="dropout_placement"):
    models.init(make("input"), jax.random.key(0), x)
