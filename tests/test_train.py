"""Tests for top1_jax.engine.train: steps, the loop against the step-by-step oracle (many
steps per call, data on the devices or streamed, 8 devices), ensembles (vmap = loop),
resuming, real data."""

import gzip
import os
import pathlib
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import processes
import pytest
from toy_data import gaussian_blobs

from top1_jax.engine import mc, models, parallel, train
from top1_jax.io import checkpoints

_TESTS = pathlib.Path(__file__).resolve().parent

_FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")


def _read_idx(path: pathlib.Path, magic: int, count: int) -> np.ndarray:
  """The first ``count`` records of a gzipped big-endian IDX file."""
  with gzip.open(path, "rb") as f:
    got_magic, num_items = struct.unpack(">II", f.read(8))
    if got_magic != magic:
      raise ValueError(f"{path}: magic {got_magic}, expected {magic}")
    dims = struct.unpack(">II", f.read(8)) if magic == 2051 else ()
    count = min(count, num_items)
    record = int(np.prod(dims)) if dims else 1
    data = np.frombuffer(f.read(count * record), np.uint8)
  return data.reshape((count, *dims))


def _fashion_mnist(split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
  images = _read_idx(_FASHION_MNIST / f"{split}-images-idx3-ubyte.gz", 2051, count)
  labels = _read_idx(_FASHION_MNIST / f"{split}-labels-idx1-ubyte.gz", 2049, count)
  return images.astype(np.float32) / 255.0, labels.astype(np.int32)


def _max_abs_diff(a, b) -> float:
  # NumPy on purpose: eager jnp ops would compile once per leaf shape.
  diffs = jax.tree_util.tree_map(
    lambda p, q: float(np.max(np.abs(np.asarray(p) - np.asarray(q)), initial=0.0)), a, b
  )
  return max(jax.tree_util.tree_leaves(diffs), default=0.0)


def _assert_trees_equal(a, b):
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


_MLP = models.MLP(num_classes=4, hidden_sizes=(16,))
_TX = optax.adam(1e-2)


def test_train_step_is_pure_and_learns():
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1], dropout_rate=0.1)
  batch = (images[:32], labels[:32])
  key = jax.random.key(1)
  first, metrics = train.train_step(state, batch, key)
  again, _ = train.train_step(state, batch, key)
  _assert_trees_equal(first.params, again.params)  # same inputs, same outputs
  assert int(state.step) == 0 and int(first.step) == 1  # input state untouched
  assert _max_abs_diff(first.params, state.params) > 0
  other_key, _ = train.train_step(state, batch, jax.random.key(2))
  assert _max_abs_diff(first.params, other_key.params) > 0  # dropout used the key
  assert metrics["loss"].shape == () and 0 <= float(metrics["accuracy"]) <= 1

  trained = train.fit(state, images, labels, jax.random.key(3), num_steps=60, batch_size=32)
  before, after = train.evaluate(state, images, labels), train.evaluate(trained, images, labels)
  assert after["loss"] < before["loss"] and after["accuracy"] > 0.9
  assert after["num_examples"] == 96


@pytest.mark.slow
def test_fit_is_deterministic_and_resumes_with_fresh_keys(tmp_path):
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1], dropout_rate=0.2)
  fit = lambda s, n, seed=7: train.fit(
    s, images, labels, jax.random.key(seed), num_steps=n, batch_size=20
  )
  straight = fit(state, 9)  # 4 steps per epoch: crosses two epoch boundaries
  _assert_trees_equal(straight.params, fit(state, 9).params)
  assert _max_abs_diff(straight.params, fit(state, 9, seed=8).params) > 0

  # 4 steps, checkpoint, restore into a fresh template, 5 more == 9 straight.
  halfway = fit(state, 4)
  with checkpoints.RunCheckpoints(tmp_path / "ckpt") as run:
    run.save(1, halfway)
  template = train.create_train_state(_MLP, _TX, jax.random.key(99), images[:1], dropout_rate=0.2)
  with checkpoints.RunCheckpoints(tmp_path / "ckpt") as run:
    epoch, restored = run.latest(template)
  assert epoch == 1 and int(restored.step) == 4
  _assert_trees_equal(restored.params, halfway.params)
  _assert_trees_equal(restored.opt_state, halfway.opt_state)
  resumed = fit(restored, 5)
  assert int(resumed.step) == 9
  assert _max_abs_diff(resumed.params, straight.params) == 0.0


def test_init_ensemble_members_equal_single_inits():
  images, _ = gaussian_blobs()
  ensemble = train.init_ensemble(_MLP, _TX, jax.random.key(4), images[:1], ensemble_size=3)
  keys = jax.random.split(jax.random.key(4), 3)
  for m in range(3):
    single = train.create_train_state(_MLP, _TX, keys[m], images[:1])
    assert _max_abs_diff(train.member(ensemble, m).params, single.params) < 1e-6
  assert _max_abs_diff(train.member(ensemble, 0).params, train.member(ensemble, 1).params) > 0


@pytest.mark.slow
def test_vmapped_ensemble_training_equals_separate_training():
  # A small ResNet: convolutions (grouped under vmap), BatchNorm state and dropout.
  model = models.ResNet(num_classes=4, blocks_per_stage=(1,), widths=(4,))
  rng = np.random.default_rng(1)
  images = rng.normal(size=(40, 8, 8, 3)).astype(np.float32)
  labels = rng.integers(0, 4, 40).astype(np.int32)
  tx = optax.sgd(0.05, momentum=0.9)
  ensemble = train.init_ensemble(
    model, tx, jax.random.key(5), images[:1], ensemble_size=3, dropout_rate=0.1
  )
  key = jax.random.key(6)
  kwargs = dict(num_steps=5, batch_size=16)  # 2 steps per epoch: reshuffles twice
  by_vmap = train.fit_ensemble(ensemble, images, labels, key, strategy="vmap", **kwargs)
  by_loop = train.fit_ensemble(ensemble, images, labels, key, strategy="loop", **kwargs)
  member_keys = jax.random.split(key, 3)
  for m in range(3):
    alone = train.fit(train.member(ensemble, m), images, labels, member_keys[m], **kwargs)
    for trained in (by_vmap, by_loop):
      got = train.member(trained, m)
      assert _max_abs_diff(got.params, alone.params) < 1e-5
      assert _max_abs_diff(got.model_state, alone.model_state) < 1e-5
  assert np.all(np.asarray(by_vmap.step) == 5)
  # Members differ from each other: their own init, shuffling and dropout.
  assert _max_abs_diff(train.member(by_vmap, 0).params, train.member(by_vmap, 1).params) > 1e-3


@pytest.mark.slow
def test_each_member_sees_its_own_shuffling():
  images, labels = gaussian_blobs(num_examples=64)
  ensemble = train.init_ensemble(
    _MLP, optax.sgd(0.0), jax.random.key(0), images[:1], ensemble_size=2
  )
  # lr 0 and both members given member 0's weights: the per-member losses of a
  # step differ only if the members drew different batches.
  same_params = jax.tree_util.tree_map(lambda leaf: jnp.stack([leaf[0], leaf[0]]), ensemble)
  seen_same = []
  train.fit_ensemble(
    same_params,
    images,
    labels,
    jax.random.key(1),
    num_steps=1,
    batch_size=8,
    strategy="vmap",
    callback=seen_same.append,
  )
  loss = seen_same[0]["loss"]
  assert loss.shape == (2,) and loss[0] != loss[1]  # same weights, different batches
  assert seen_same[0]["member"] is None and seen_same[0]["step"] == 1


def test_callback_reports_progress_and_nothing_is_printed(capsys):
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  reports = []
  train.fit(
    state,
    images,
    labels,
    jax.random.key(1),
    num_steps=7,
    batch_size=16,
    log_every=3,
    callback=reports.append,
  )
  assert [r["step"] for r in reports] == [3, 6, 7]
  assert all(r["num_steps"] == 7 and r["member"] is None for r in reports)
  assert all(isinstance(r["loss"], float) and r["examples_per_second"] > 0 for r in reports)
  ensemble = train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=2)
  member_reports = []
  train.fit_ensemble(
    ensemble,
    images,
    labels,
    jax.random.key(1),
    num_steps=2,
    batch_size=16,
    strategy="loop",
    callback=member_reports.append,
  )
  assert [(r["member"], r["step"]) for r in member_reports] == [(0, 2), (1, 2)]
  captured = capsys.readouterr()
  assert captured.out == ""


def test_a_diverging_training_stops_at_its_first_report_naming_the_learning_rate():
  # Adam at 1e6 took the quick job to a loss of 4e19; it then failed only at the
  # covariance scores, naming nothing. Each report (every log_every steps) checks the loss.
  images, labels = gaussian_blobs()
  wild = optax.adam(1e6)
  state = train.create_train_state(_MLP, wild, jax.random.key(0), images[:1])
  kwargs = dict(num_steps=12, batch_size=16, log_every=4)
  for callback in (None, lambda info: None):  # the loss is checked with or without reports
    for steps_per_call in (1, 3):  # 3: calls of 3 and 1 steps, read at the report
      with pytest.raises(train.DivergedError, match="smaller learning rate") as info:
        train.fit(
          state, images, labels, jax.random.key(1), callback=callback,
          steps_per_call=steps_per_call, **kwargs,
        )  # fmt: skip
      assert info.value.step == 4 and not info.value.loss <= train.MAX_LOSS  # huge, or NaN
  ensemble = train.init_ensemble(_MLP, wild, jax.random.key(0), images[:1], ensemble_size=2)
  for strategy in ("vmap", "loop"):
    with pytest.raises(train.DivergedError, match=r"by step 4 \(member \d\)"):
      train.fit_ensemble(ensemble, images, labels, jax.random.key(1), strategy=strategy, **kwargs)


def test_bad_inputs_raise_naming_the_argument():
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  fit = lambda **kw: train.fit(
    state,
    kw.pop("images", images),
    kw.pop("labels", labels),
    kw.pop("key", jax.random.key(0)),
    num_steps=kw.pop("num_steps", 2),
    batch_size=kw.pop("batch_size", 8),
  )
  with pytest.raises(ValueError, match="labels"):
    fit(labels=np.full(96, 4))
  with pytest.raises(ValueError, match="length mismatch"):
    fit(labels=labels[:50])
  with pytest.raises(ValueError, match="images"):
    fit(images=np.full_like(images, np.nan))
  with pytest.raises(ValueError, match="batch_size"):
    fit(batch_size=97)
  with pytest.raises(ValueError, match="num_steps"):
    fit(num_steps=0)
  with pytest.raises(ValueError, match="key"):
    fit(key=3)
  with pytest.raises(ValueError, match="steps_per_call"):
    train.fit(state, images, labels, jax.random.key(0), num_steps=2, batch_size=8, steps_per_call=0)
  for rate in (1.0, -0.5, "0.1"):
    with pytest.raises(ValueError, match="dropout_rate"):
      train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1], dropout_rate=rate)
  with pytest.raises(ValueError, match="model"):
    train.create_train_state("mlp", _TX, jax.random.key(0), images[:1])
  with pytest.raises(ValueError, match="tx"):
    train.create_train_state(_MLP, 0.1, jax.random.key(0), images[:1])
  with pytest.raises(ValueError, match="ensemble_size"):
    train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=0)
  with pytest.raises(ValueError, match="batch"):
    train.train_step(state, (images[:4], labels[:3]), jax.random.key(0))
  with pytest.raises(ValueError, match="batch labels"):
    train.train_step(state, (images[:4], labels[:4].astype(np.float32)), jax.random.key(0))
  ensemble = train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=2)
  with pytest.raises(ValueError, match="keys"):
    train.ensemble_train_step(
      ensemble, (images[None, :4].repeat(2, 0), labels[None, :4].repeat(2, 0)), jax.random.key(0)
    )
  with pytest.raises(ValueError, match="strategy"):
    train.fit_ensemble(
      ensemble, images, labels, jax.random.key(0), num_steps=1, batch_size=8, strategy="x"
    )


@pytest.mark.slow
@pytest.mark.skipif(
  not (_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").exists(),
  reason=f"Fashion-MNIST IDX files not found in {_FASHION_MNIST}",
)
def test_short_real_training_on_fashion_mnist():
  train_images, train_labels = _fashion_mnist("train", 12000)
  test_images, test_labels = _fashion_mnist("t10k", 2000)
  model = models.MLP(num_classes=10, hidden_sizes=(256, 128))
  state = train.create_train_state(
    model, optax.adam(1e-3), jax.random.key(0), train_images[:1], dropout_rate=0.1
  )
  state = train.fit(
    state, train_images, train_labels, jax.random.key(1), num_steps=300, batch_size=128
  )
  metrics = train.evaluate(state, test_images, test_labels)
  assert metrics["accuracy"] > 0.8, metrics  # chance is 0.1

  # MC dropout on the trained network: as accurate, and more uncertain where wrong.
  predictions = mc.predict(
    models.make_apply_fn(model),
    state.variables,
    test_images,
    key=jax.random.key(2),
    num_samples=8,
    rate=0.1,
    chunk_size=500,
  )
  correct = np.argmax(predictions.mean_log_probs, axis=1) == test_labels
  assert correct.mean() > 0.8
  for name in ("neg_log_pmax", "covariance_norm_probs"):
    score = predictions.scores[name]
    assert score[~correct].mean() > 2 * score[correct].mean(), name


# ----------------------------------------------------------------------------
# The loop against the step-by-step oracle: many steps per call, data on the devices or
# streamed from the host, resumed mid-epoch, on 8 devices.


def step_by_step(state, images, labels, key, num_steps, batch_size):
  """The oracle: ``fit``'s contract as a plain loop (the loop it ran before), one jitted
  step at a time, each batch gathered on the host from the epoch's permutation."""
  shuffle_key, dropout_key = jax.random.split(key)
  steps_per_epoch = images.shape[0] // batch_size
  for step in range(int(state.step), int(state.step) + num_steps):
    epoch, position = divmod(step, steps_per_epoch)
    order = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), images.shape[0])
    rows = np.asarray(order)[position * batch_size : (position + 1) * batch_size]
    batch = (images[rows], labels[rows])
    state, _ = train.train_step(state, batch, jax.random.fold_in(dropout_key, step))
  return state


_NETWORKS = {
  "mlp": (models.MLP(num_classes=4, hidden_sizes=(16,)), (6, 6)),
  "mlp_bfloat16": (models.MLP(num_classes=4, hidden_sizes=(16,), dtype=jnp.bfloat16), (6, 6)),
  "cnn": (models.CNN(num_classes=4, features=(4, 8), dense_size=16), (8, 8)),
  "resnet": (models.ResNet(num_classes=4, blocks_per_stage=(1,), widths=(4,)), (8, 8, 3)),
}


def _network_case(name: str):
  model, shape = _NETWORKS[name]
  rng = np.random.default_rng(2)
  images = rng.normal(size=(100, *shape)).astype(np.float32)
  labels = rng.integers(0, 4, 100).astype(np.int32)
  state = train.create_train_state(
    model, optax.adam(1e-2), jax.random.key(0), images[:1], dropout_rate=0.1
  )
  return state, images, labels


@pytest.mark.slow
@pytest.mark.parametrize("name", _NETWORKS)
def test_fit_equals_the_step_by_step_loop(name, monkeypatch):
  state, images, labels = _network_case(name)
  key = jax.random.key(3)
  # 100 examples in batches of 24: 4 steps an epoch, so 11 steps cross two epochs.
  expected = step_by_step(state, images, labels, key, 11, 24)
  fit = lambda s, n, **kw: train.fit(s, images, labels, key, num_steps=n, batch_size=24, **kw)
  tolerance = 1e-5  # one step per call is bit-identical here; a scan rounds a few sums apart
  # Calls of 4 steps, cut at the reports (every 5 steps): 4 + 1 + 4 + 1 + 1, across epochs.
  for steps_per_call in (1, 4):
    got = fit(state, 11, steps_per_call=steps_per_call, log_every=5)
    assert int(got.step) == 11
    assert _max_abs_diff(got.params, expected.params) < tolerance, steps_per_call
    assert _max_abs_diff(got.model_state, expected.model_state) < tolerance
  # Restored mid-epoch (step 3), on with calls of 4; and the data streamed from the host.
  resumed = fit(fit(state, 3, steps_per_call=4), 8, steps_per_call=4)
  assert _max_abs_diff(resumed.params, expected.params) < tolerance
  monkeypatch.setattr(parallel, "HOST_DEVICE_DATA_BYTES", 0)
  streamed = fit(state, 11, steps_per_call=4, log_every=5)
  assert _max_abs_diff(streamed.params, expected.params) < tolerance


def test_steps_per_call_by_backend_and_model_and_forced():
  many = train.STEPS_PER_CALL
  assert many > 1
  assert train.pick_steps_per_call(backend="cpu") == many
  assert train.pick_steps_per_call(backend="cpu", slow_in_loops=True) == 1
  assert train.pick_steps_per_call(backend="gpu", slow_in_loops=True) == many
  assert train.pick_steps_per_call(backend="tpu") == many
  assert train.pick_steps_per_call(7, backend="cpu", slow_in_loops=True) == 7
  for bad in (0, 2.5, "3"):
    with pytest.raises(ValueError, match="steps_per_call"):
      train.pick_steps_per_call(bad)
  # Convolutions and half precisions run slowly in XLA:CPU's loops; a float32 MLP does not.
  assert not train.slow_in_cpu_loops(models.MLP(), (28, 28))
  assert train.slow_in_cpu_loops(models.MLP(dtype=jnp.bfloat16), (28, 28))
  assert train.slow_in_cpu_loops(models.CNN(), (28, 28))
  assert train.slow_in_cpu_loops(models.ResNet(blocks_per_stage=(1,), widths=(4,)), (8, 8, 3))


def test_reports_and_their_means_do_not_depend_on_steps_per_call():
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1], dropout_rate=0.1)
  runs = {}
  for steps_per_call in (1, 2, 5):  # 2: calls end at the reports (3, 6) and the last step
    reports = []
    train.fit(
      state, images, labels, jax.random.key(1), num_steps=7, batch_size=16, log_every=3,
      callback=reports.append, steps_per_call=steps_per_call,
    )  # fmt: skip
    assert [r["step"] for r in reports] == [3, 6, 7]
    runs[steps_per_call] = [(r["loss"], r["accuracy"]) for r in reports]
  np.testing.assert_allclose(runs[2], runs[1], rtol=1e-6)
  np.testing.assert_allclose(runs[5], runs[1], rtol=1e-6)


def test_training_data_is_checked_once_and_placed_for_many_fits():
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1], dropout_rate=0.1)
  data = train.training_data(_MLP, images, labels)
  assert data.on_device and data.num_examples == 96 and data.num_classes == 4
  assert isinstance(data.images, jax.Array) and data.dtype == jnp.float32
  kwargs = dict(num_steps=3, batch_size=16)
  # Epoch by epoch from one TrainingData, as from the host arrays.
  from_data = train.fit(train.fit(state, data, None, jax.random.key(1), **kwargs), data, None,
                        jax.random.key(1), **kwargs)  # fmt: skip
  from_arrays = train.fit(train.fit(state, images, labels, jax.random.key(1), **kwargs), images,
                          labels, jax.random.key(1), **kwargs)  # fmt: skip
  _assert_trees_equal(from_data.params, from_arrays.params)
  with pytest.raises(ValueError, match="labels: expected None"):
    train.fit(state, data, labels, jax.random.key(1), **kwargs)
  other = models.MLP(num_classes=6, hidden_sizes=(16,))
  other_state = train.create_train_state(other, _TX, jax.random.key(0), images[:1])
  with pytest.raises(ValueError, match="images: a TrainingData checked for 4 classes"):
    train.fit(other_state, data, None, jax.random.key(1), **kwargs)
  half = train.training_data(models.MLP(num_classes=4, dtype=jnp.bfloat16), images, labels)
  assert half.dtype == jnp.bfloat16 and half.images.dtype == jnp.bfloat16  # cast once, there


def _flat_params(tree) -> np.ndarray:
  return np.concatenate([np.ravel(leaf) for leaf in jax.tree_util.tree_leaves(tree)])


def device_case() -> dict[str, np.ndarray]:
  """A small ResNet and a 2-member ensemble (vmap) trained by calls of 1 and 3 steps,
  from data on the devices and streamed: the parameters, flat. Each program compiles for
  seconds, so five cases: each path (device, host) and each call length for each trainer."""
  state, images, labels = _network_case("resnet")
  ensemble = train.init_ensemble(
    _NETWORKS["resnet"][0], optax.adam(1e-2), jax.random.key(1), images[:1], ensemble_size=2,
    dropout_rate=0.1,
  )  # fmt: skip
  kwargs = dict(num_steps=7, batch_size=24, log_every=5)
  out, limit = {}, parallel.HOST_DEVICE_DATA_BYTES
  cases = (("fit", "device", 1), ("fit", "device", 3), ("fit", "host", 3),
           ("ensemble", "device", 3), ("ensemble", "host", 1))  # fmt: skip
  try:
    for trainer, where, k in cases:
      parallel.HOST_DEVICE_DATA_BYTES = limit if where == "device" else 0
      if trainer == "fit":
        fit = train.fit(state, images, labels, jax.random.key(3), steps_per_call=k, **kwargs)
        out[f"fit_{where}_{k}"] = _flat_params(fit.params)
      else:
        members = train.fit_ensemble(
          ensemble, images, labels, jax.random.key(3), strategy="vmap", steps_per_call=k, **kwargs
        )
        out[f"ensemble_{where}_{k}"] = _flat_params(members.params)
  finally:
    parallel.HOST_DEVICE_DATA_BYTES = limit
  return out


_DEVICE_CASE = f"""
import sys
import numpy as np
import jax
sys.path[:0] = [{str(_TESTS.parent)!r}, {str(_TESTS)!r}]
import test_train
assert jax.device_count() == 8
np.savez(sys.argv[1], **test_train.device_case())
"""


@pytest.mark.slow
def test_data_parallel_on_8_fake_devices_equals_one_device(tmp_path):
  out = tmp_path / "eight.npz"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": processes.xla_flags(8)}
  child = subprocess.Popen(
    [sys.executable, "-c", _DEVICE_CASE, str(out)], env=env, stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT, text=True,
  )  # fmt: skip
  try:  # the reference, in this one-device process while the child runs
    expected = device_case()
  finally:
    output = child.communicate(timeout=300)[0]
  assert child.returncode == 0, output[-3000:]
  got = np.load(out)
  for name, value in expected.items():  # batch 24 over 8 devices: 3 rows each
    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
