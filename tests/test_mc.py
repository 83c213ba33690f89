"""Tests for top1_jax.engine.mc: vmapped samples against loops, streaming, devices."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import processes
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from top1_jax.core import scores
from top1_jax.engine import mc, models

_TESTS = pathlib.Path(__file__).resolve().parent
_ROOT = _TESTS.parent
_SUBPROCESS_TIMEOUT_S = 240


def _load_worker():
  spec = importlib.util.spec_from_file_location("mc_device_worker", _TESTS / "mc_device_worker.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def mlp():
  model = models.MLP(num_classes=6, hidden_sizes=(32, 16))
  x = jax.random.normal(jax.random.key(0), (9, 12))
  return models.make_apply_fn(model), models.init(model, jax.random.key(1), x), x


@pytest.fixture(scope="module")
def cnn():
  model = models.CNN(num_classes=5, features=(4, 8), dense_size=16)
  x = jax.random.normal(jax.random.key(0), (7, 28, 28, 1))
  return models.make_apply_fn(model), models.init(model, jax.random.key(1), x[:1]), x


def _per_example_loop(apply_fn, variables, x, key, num_samples, rate):
  """[S, B, K] by a plain loop: one jitted call per sample s and example i.

  Each call uses the key ``fold_in(split(key, S)[s], i)``.
  """
  forward = jax.jit(apply_fn)  # one jitted call per key: the loop being replaced
  return np.stack(
    [
      np.concatenate(
        [forward(variables, x[i : i + 1], jax.random.fold_in(k, i), rate) for i in range(len(x))]
      )
      for k in jax.random.split(key, num_samples)
    ]
  )


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp", "cnn"])
def test_mc_dropout_equals_python_loop_over_the_same_keys(case, request):
  apply_fn, variables, x = request.getfixturevalue(case)
  key = jax.random.key(3)
  samples = mc.mc_dropout_logits(apply_fn, variables, x, key, num_samples=5, rate=0.25)
  loop = _per_example_loop(apply_fn, variables, x, key, 5, 0.25)
  assert samples.shape == (5, x.shape[0], loop.shape[-1])
  np.testing.assert_allclose(samples, loop, rtol=1e-5, atol=1e-6)
  # The samples really differ (dropout acted, each with its own key).
  assert not np.allclose(samples[0], samples[1])


@settings(max_examples=4)
@given(
  num_samples=st.integers(1, 4),
  batch=st.integers(1, 5),
  rate=st.floats(0.0, 0.9),
  seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
def test_mc_dropout_loop_property(mlp, num_samples, batch, rate, seed):
  apply_fn, variables, x = mlp
  key = jax.random.key(seed)
  samples = mc.mc_dropout_logits(
    apply_fn, variables, x[:batch], key, num_samples=num_samples, rate=rate
  )
  loop = _per_example_loop(apply_fn, variables, x[:batch], key, num_samples, rate)
  np.testing.assert_allclose(samples, loop, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp", "cnn"])
def test_mc_dropout_logits_equal_predict_samples(case, request):
  # One key scheme: the same samples from the batch function and the streamed one,
  # whatever the chunking (only float rounding of other batch shapes may differ).
  apply_fn, variables, x = request.getfixturevalue(case)
  key = jax.random.key(7)
  samples = mc.mc_dropout_logits(apply_fn, variables, x, key, num_samples=4, rate=0.3)
  for chunk_size in (None, 3):
    predicted = mc.predict(
      apply_fn,
      variables,
      np.asarray(x),
      key=key,
      num_samples=4,
      rate=0.3,
      chunk_size=chunk_size,
      keep_samples=True,
    )
    assert isinstance(predicted, mc.SampleSummary)
    np.testing.assert_allclose(predicted.logits, samples, rtol=1e-6, atol=1e-6)


def test_rate_zero_gives_identical_samples(cnn):
  apply_fn, variables, x = cnn
  samples = np.asarray(
    mc.mc_dropout_logits(apply_fn, variables, x, jax.random.key(0), num_samples=5, rate=0.0)
  )
  for s in range(1, 5):
    np.testing.assert_array_equal(samples[s], samples[0])
  np.testing.assert_allclose(samples[0], apply_fn(variables, x), rtol=1e-5, atol=1e-6)


def test_rate_zero_predict_has_zero_spread(mlp):
  apply_fn, variables, x = mlp
  predictions = mc.predict(
    apply_fn, variables, x, key=jax.random.key(0), num_samples=4, keep_samples=True
  )
  np.testing.assert_array_equal(
    predictions.logits, np.broadcast_to(predictions.logits[0], (4,) + predictions.logits.shape[1:])
  )
  np.testing.assert_array_equal(predictions.scores["covariance_norm_logits"], 0.0)


def _stack_members(model, sample, num_members, seed):
  members = [
    models.init(model, k, sample) for k in jax.random.split(jax.random.key(seed), num_members)
  ]
  return members, jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *members)


@pytest.mark.parametrize("strategy", ["vmap", "loop"])
def test_ensemble_logits_equal_each_member(cnn, strategy):
  apply_fn, _, x = cnn
  members, stacked = _stack_members(apply_fn.model, x[:1], 3, seed=5)
  logits = mc.ensemble_logits(apply_fn, stacked, x, strategy=strategy)
  expected = np.stack([np.asarray(apply_fn(m, x)) for m in members])
  assert logits.shape == (3, x.shape[0], 5)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_predict_mc_matches_per_example_keys_and_scores(mlp):
  apply_fn, variables, x = mlp
  x = x[:7]
  key = jax.random.key(11)
  progress = []
  predictions = mc.predict(
    apply_fn,
    variables,
    x,
    key=key,
    num_samples=3,
    rate=0.3,
    chunk_size=4,
    keep_samples=True,
    progress=lambda done, total: progress.append((done, total)),
  )
  assert progress == [(4, 7), (7, 7)]
  expected = _per_example_loop(apply_fn, variables, x, key, 3, 0.3)
  np.testing.assert_allclose(predictions.logits, expected, rtol=1e-5, atol=1e-6)

  log_probs = jax.nn.log_softmax(expected, axis=-1)
  mean_log_probs = jax.nn.logsumexp(log_probs, axis=0) - np.log(3)
  np.testing.assert_allclose(predictions.mean_log_probs, mean_log_probs, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(predictions.mean_probs.sum(-1), 1.0, rtol=1e-5)
  want = {
    "neg_log_pmax": scores.neg_log_pmax(mean_log_probs),
    "entropy": scores.entropy(mean_log_probs),
    "margin": scores.margin(mean_log_probs),
    "covariance_norm_probs": scores.covariance_norm(jnp.exp(log_probs)),
    "covariance_norm_logits": scores.covariance_norm(expected),
  }
  assert set(predictions.scores) == set(want)
  for name, value in want.items():
    np.testing.assert_allclose(predictions.scores[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_predict_does_not_depend_on_chunk_size(mlp):
  apply_fn, variables, x = mlp
  runs = [
    mc.predict(
      apply_fn,
      variables,
      x,
      key=jax.random.key(4),
      num_samples=3,
      rate=0.2,
      chunk_size=chunk,
      keep_samples=True,
    )
    for chunk in (2, 5, 64)
  ]
  for other in runs[1:]:
    np.testing.assert_allclose(other.logits, runs[0].logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(other.mean_log_probs, runs[0].mean_log_probs, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_predict_ensemble_matches_ensemble_logits(cnn):
  apply_fn, _, x = cnn
  _, stacked = _stack_members(apply_fn.model, x[:1], 4, seed=8)
  predictions = mc.predict(apply_fn, stacked, x, ensemble=True, chunk_size=3, keep_samples=True)
  expected = mc.ensemble_logits(apply_fn, stacked, x)
  np.testing.assert_allclose(predictions.logits, expected, rtol=1e-5, atol=1e-6)
  no_samples = mc.predict(apply_fn, stacked, x, ensemble=True, chunk_size=3)
  assert no_samples.logits is None
  np.testing.assert_allclose(no_samples.mean_log_probs, predictions.mean_log_probs, rtol=1e-6)


def test_plain_predict_has_no_covariance(mlp):
  apply_fn, variables, x = mlp
  predictions = mc.predict(apply_fn, variables, x)
  assert set(predictions.scores) == {"neg_log_pmax", "entropy", "margin"}
  np.testing.assert_allclose(
    predictions.mean_log_probs, jax.nn.log_softmax(apply_fn(variables, x)), rtol=1e-5, atol=1e-6
  )


def test_pick_strategy():
  assert mc.pick_strategy("auto", "cpu") == "loop"
  assert mc.pick_strategy("auto", "gpu") == "vmap"
  assert mc.pick_strategy("auto", "tpu") == "vmap"
  assert mc.pick_strategy("vmap", "cpu") == "vmap"
  assert mc.pick_strategy("loop", "tpu") == "loop"
  assert mc.pick_strategy() == ("vmap" if jax.default_backend() in ("gpu", "tpu") else "loop")
  with pytest.raises(ValueError, match="strategy"):
    mc.pick_strategy("pmap")


def test_key_and_ensemble_size_helpers():
  key = jax.random.key(5)
  assert mc.as_prng_key(key) is key
  raw = jax.random.PRNGKey(5)
  np.testing.assert_array_equal(jax.random.key_data(mc.as_prng_key(raw)), raw)
  for bad in (5, jax.random.split(key, 2), np.zeros(3, np.uint32)):
    with pytest.raises(ValueError, match="key"):
      mc.as_prng_key(bad)
  assert mc.ensemble_size({"a": jnp.ones((3, 2)), "b": [jnp.ones(3)]}) == 3
  for bad in ({}, {"a": jnp.ones((2, 3)), "b": jnp.ones((3, 3))}, {"a": jnp.float32(1)}):
    with pytest.raises(ValueError, match="stacked_params"):
      mc.ensemble_size(bad)


def test_bad_inputs_raise_naming_the_argument(mlp):
  apply_fn, variables, x = mlp
  key = jax.random.key(0)
  call = lambda **kw: mc.mc_dropout_logits(
    apply_fn,
    variables,
    kw.pop("x", x),
    kw.pop("key", key),
    num_samples=kw.pop("num_samples", 2),
    rate=kw.pop("rate", 0.1),
  )
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="num_samples"):
      call(num_samples=bad)
  for bad in (1.0, -0.1, 1.5, float("nan"), True, np.ones(2) * 0.1):
    with pytest.raises(ValueError, match="rate"):
      call(rate=bad)
  with pytest.raises(ValueError, match="x"):
    call(x=np.ones(12))
  with pytest.raises(ValueError, match="x"):
    call(x=np.ones((0, 12)))
  with pytest.raises(ValueError, match="x"):
    call(x=np.full((2, 12), np.nan))
  with pytest.raises(ValueError, match="key"):
    call(key=0)
  with pytest.raises(ValueError, match="key"):
    call(key=jax.random.split(key, 2))
  with pytest.raises(ValueError, match="apply_fn"):
    mc.mc_dropout_logits(
      lambda p, x, k, r: jnp.ones((3,)), variables, x, key, num_samples=2, rate=0.1
    )

  with pytest.raises(ValueError, match="stacked_params"):
    mc.ensemble_logits(apply_fn, {"a": jnp.ones((2, 3)), "b": jnp.ones((3, 3))}, x)
  with pytest.raises(ValueError, match="apply_fn"):
    mc.ensemble_logits(lambda p, x: jnp.sum(x * p["a"], -1), {"a": jnp.ones((2, 12))}, x)

  with pytest.raises(ValueError, match="chunk_size"):
    mc.predict(apply_fn, variables, x, chunk_size=0)
  with pytest.raises(ValueError, match="key"):
    mc.predict(apply_fn, variables, x, num_samples=3, rate=0.1)
  with pytest.raises(ValueError, match="rate"):
    mc.predict(apply_fn, variables, x, key=key, rate=1.0)
  with pytest.raises(ValueError, match="num_samples and rate"):
    mc.predict(apply_fn, variables, x, ensemble=True, rate=0.1)
  with pytest.raises(ValueError, match="x"):
    mc.predict(apply_fn, variables, np.ones((3, 12), bool))
  with pytest.raises(ValueError, match="mesh"):
    mc.predict(apply_fn, variables, x, mesh="devices")
  with pytest.raises(ValueError, match="apply_fn"):
    mc.predict(lambda p, x, k, r: jnp.ones((3,)), variables, x)


_DEADLOCK_CHECK = """
import jax, numpy as np
from top1_jax.engine import mc, models
model = models.MLP(num_classes=10, hidden_sizes=(32,))
x = np.random.default_rng(0).normal(size=(1024, 20)).astype(np.float32)
variables = models.init(model, jax.random.key(0), x[:1])
for seed in range(3):
  p = mc.predict(models.make_apply_fn(model), variables, x, key=jax.random.key(seed),
                 num_samples=16, rate=0.1, chunk_size=256)
  assert np.all(np.isfinite(p.scores["covariance_norm_probs"]))
print("finished")
"""


@pytest.mark.slow
def test_predict_does_not_deadlock_the_cpu_thread_pool():
  # Batched eigh calls large enough to be split over jaxlib's CPU thread pool,
  # two per program (probs and logits): this hung forever on 2 cores before the
  # covariance norms were computed one example per call. Run apart, with a timeout.
  result = subprocess.run(
    [sys.executable, "-c", _DEADLOCK_CHECK],
    env=_worker_env(),
    capture_output=True,
    text=True,
    timeout=90,  # far beyond a working run
  )
  assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-3000:]


def _worker_env(**extra) -> dict[str, str]:
  env = {**os.environ, "XLA_FLAGS": processes.xla_flags(), "JAX_PLATFORMS": "cpu"}
  env.update(PYTHONPATH=str(_ROOT), **extra)
  return env


@pytest.fixture(scope="module")
def reference_predictions():
  """The device-test case on this process's devices (one CPU device here)."""
  return _load_worker().predictions_of_case()


@pytest.mark.slow
def test_sharded_on_8_fake_devices_equals_single_device(tmp_path, reference_predictions):
  out = tmp_path / "sharded.npz"
  env = _worker_env(XLA_FLAGS=processes.xla_flags(8))
  result = subprocess.run(
    [sys.executable, str(_TESTS / "mc_device_worker.py"), "sharded", str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=_SUBPROCESS_TIMEOUT_S,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  data = np.load(out)
  assert int(data["device_count"]) == 8
  for name, expected in reference_predictions.items():
    np.testing.assert_allclose(data[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_two_processes_with_jax_distributed_equal_single_process(tmp_path, reference_predictions):
  port = processes.free_port()
  outputs = [tmp_path / f"process{i}.npz" for i in range(2)]
  commands = [
    [str(_TESTS / "mc_device_worker.py"), "distributed", str(outputs[i]), str(port), str(i)]
    for i in range(2)
  ]
  processes.wait(processes.start(commands, _worker_env()), _SUBPROCESS_TIMEOUT_S)
  for out in outputs:
    data = np.load(out)
    assert int(data["process_count"]) == 2 and int(data["device_count"]) == 4
    names = [name for name in reference_predictions if name.startswith("mc_")]
    assert len(names) == 7  # samples, mean log-probs and five scores
    for name in names:
      np.testing.assert_allclose(
        data[name], reference_predictions[name], rtol=1e-5, atol=1e-6, err_msg=name
      )
