"""Tests for data on the devices: the one rule (``parallel.fits_on_devices``), the rows
put there and gathered there, the prefetching of streamed batches, and ``mc.predict``
with its dataset on the devices or streamed. The several-device paths run on 8 fake
CPU devices in tests/test_train.py and tests/test_mc.py, and in two processes in
tests/test_multihost.py."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from top1_jax.engine import batches, mc, models, parallel


class _Device:
  def __init__(self, bytes_limit):
    self._stats = None if bytes_limit is None else {"bytes_limit": bytes_limit}

  def memory_stats(self):
    return self._stats


def _mesh(num_devices: int, bytes_limit):
  """What ``fits_on_devices`` reads of a mesh: its size and its local devices."""
  devices = [_Device(bytes_limit) for _ in range(num_devices)]
  return types.SimpleNamespace(devices=np.asarray(devices), local_devices=devices)


def test_data_fits_by_one_rule_a_share_of_the_device_memory():
  gib = 1 << 30
  fraction = parallel.DEVICE_DATA_FRACTION
  # 80 GiB accelerators: a quarter of each, the data split over them.
  assert parallel.fits_on_devices(int(fraction * 80 * gib), _mesh(1, 80 * gib))
  assert not parallel.fits_on_devices(int(fraction * 80 * gib) + 8, _mesh(1, 80 * gib))
  assert parallel.fits_on_devices(int(fraction * 80 * gib) * 8, _mesh(8, 80 * gib))
  # Devices that report no memory (XLA:CPU): a fixed share.
  host = parallel.HOST_DEVICE_DATA_BYTES
  assert parallel.fits_on_devices(host, _mesh(1, None))
  assert not parallel.fits_on_devices(host + 1, _mesh(1, None))
  assert parallel.fits_on_devices(2 * host, _mesh(2, None))


def test_rows_put_on_the_devices_and_gathered_there():
  mesh = mc.default_mesh()
  data = np.arange(30, dtype=np.float32).reshape(10, 3)
  placed = parallel.put_rows(data, mesh, jnp.bfloat16)
  assert placed.dtype == jnp.bfloat16 and placed.shape[0] % mesh.devices.size == 0
  rows = jnp.asarray([[9, 0, 4, 4], [1, 2, 3, 8]])
  got = jax.jit(lambda d, r: parallel.gather_rows(d, r, mesh))({"x": placed}, rows)["x"]
  np.testing.assert_array_equal(np.asarray(got, np.float32), data[np.asarray(rows)])


def test_prefetch_makes_items_ahead_in_order():
  made = []

  def items():
    for i in range(5):
      made.append(i)
      yield i

  handed = []
  for item in parallel.prefetch(items(), 2):
    handed.append((item, len(made)))
  # Item i is handed out once i + 2 are made (all at the end).
  assert handed == [(0, 3), (1, 4), (2, 5), (3, 5), (4, 5)]


def test_input_dtype_is_the_models_for_mixed_precision_only():
  assert batches.input_dtype(models.MLP(dtype=jnp.bfloat16)) == jnp.bfloat16
  assert batches.input_dtype(models.CNN(dtype=jnp.float16)) == jnp.float16
  assert batches.input_dtype(models.CNN()) == jnp.float32


@pytest.mark.slow
def test_predict_on_the_devices_equals_predict_streamed(monkeypatch):
  model = models.MLP(num_classes=5, hidden_sizes=(16,))
  apply_fn = models.make_apply_fn(model)
  x = np.random.default_rng(0).normal(size=(37, 6, 6)).astype(np.float32)
  variables = models.init(model, jax.random.key(0), x[:1])
  predict = lambda: mc.predict(  # noqa: E731
    apply_fn, variables, x, key=jax.random.key(1), num_samples=4, rate=0.2, chunk_size=16,
    keep_samples=True,
  )  # fmt: skip
  placed = predict()
  monkeypatch.setattr(parallel, "HOST_DEVICE_DATA_BYTES", 0)  # nothing fits: chunks sent
  streamed = predict()
  np.testing.assert_array_equal(placed.logits, streamed.logits)
  np.testing.assert_array_equal(placed.mean_log_probs, streamed.mean_log_probs)
  for name, values in placed.scores.items():
    np.testing.assert_array_equal(values, streamed.scores[name], err_msg=name)
  one_by_one = mc.mc_dropout_logits(
    apply_fn, variables, x, jax.random.key(1), num_samples=4, rate=0.2
  )
  np.testing.assert_allclose(placed.logits, one_by_one, rtol=1e-5, atol=1e-6)


def test_streamed_calls_take_at_most_their_bytes(monkeypatch):
  images = np.zeros((100, 10), np.float32)  # 40 bytes a row
  data = batches.TrainingData(images, np.zeros(100, np.int32), 100, 4, False, jnp.float32, None)
  order = types.SimpleNamespace(rows_per_step=24)  # e.g. 2 members of 12
  monkeypatch.setattr(batches, "STREAMED_CALL_BYTES", 24 * 40 * 3)
  assert batches.streamed_steps(data, order, 100) == 3
  assert batches.streamed_steps(data, order, 2) == 2
  monkeypatch.setattr(batches, "STREAMED_CALL_BYTES", 1)
  assert batches.streamed_steps(data, order, 100) == 1  # one step, whatever its bytes
