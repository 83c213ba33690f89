"""Evaluation at scale: streamed reads and chunked scores equal the whole-file path.

``io.stream.PredictionsReader`` + ``streaming.from_chunks`` against
``load_predictions`` + ``scores.from_predictions``, bit for bit, on small files
(samples, a single model, mean_probs with stored scores), with chunk sizes that
do not divide N and with zip-compressed members; and ``binning`` compiling once
per size bucket, not once per example count.
"""

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import io_testing
import numpy as np
import processes
import pytest

from top1_jax.core import binning, events, scores
from top1_jax.engine import streaming
from top1_jax.io import predictions as predictions_lib
from top1_jax.io import stream

NUM, CLASSES, SAMPLES = 23, 6, 3


def _predictions(kind: str) -> predictions_lib.Predictions:
  rng = np.random.default_rng(0)
  labels = rng.integers(0, CLASSES, NUM)
  logits = (3 * rng.normal(size=(SAMPLES, NUM, CLASSES))).astype(np.float32)
  human = rng.dirichlet(np.ones(CLASSES), NUM).astype(np.float32)
  if kind == "samples":
    return predictions_lib.Predictions(labels=labels, logits=logits, human_probs=human)
  if kind == "logits":
    return predictions_lib.Predictions(labels=labels, logits=logits[0], meta={"seed": 3})
  probs = np.exp(np.asarray(scores.mean_log_probs(logits), np.float64))
  stored = {"neg_log_pmax": rng.random(NUM).astype(np.float32)}
  return predictions_lib.Predictions(labels=labels, mean_probs=probs / probs.sum(1, keepdims=True),
                                     scores=stored)  # fmt: skip


def _labels(path):
  return predictions_lib.load_predictions(path).labels


def _whole(path):
  p = predictions_lib.load_predictions(path)
  return scores.from_predictions(
    logits=p.logits, mean_probs=p.mean_probs, stored_scores=p.scores,
    human_probs=p.human_probs, topk=(1, 4), labels=p.labels, label_terms=True,
  )  # fmt: skip


@pytest.mark.parametrize("compress", ["stored", "compressed", "compressed, spilled"])
@pytest.mark.parametrize("kind", ["samples", "logits", "mean_probs"])
def test_streamed_scores_equal_the_whole_file(tmp_path, monkeypatch, kind, compress):
  # "spilled": every compressed member is inflated into a temporary file (as those over
  # IN_MEMORY_BYTES are) and read from there by ranges; each is closed with the reader.
  spills, make_file = [], tempfile.TemporaryFile

  def temporary_file():
    spills.append(make_file())
    return spills[-1]

  if compress == "compressed, spilled":
    monkeypatch.setattr(stream, "IN_MEMORY_BYTES", 0)
  monkeypatch.setattr(tempfile, "TemporaryFile", temporary_file)
  predictions = _predictions(kind)
  path = predictions_lib.save_predictions(
    tmp_path / "p.npz", predictions, compress=compress != "stored"
  )
  log_probs, values, terms = _whole(path)
  for chunk_size in (1, 7, NUM):
    with stream.PredictionsReader(path) as reader:
      # Compressed members are read whole (into memory, or into a temporary file).
      assert bool(reader.read_whole) == (compress != "stored")
      assert reader.num_examples == NUM and reader.num_classes == CLASSES
      streamed, streamed_values, streamed_terms = streaming.from_chunks(
        reader.chunks(chunk_size), reader.num_examples, topk=(1, 4)
      )
    assert all(spill.closed for spill in spills)
    np.testing.assert_array_equal(np.asarray(streamed), np.asarray(log_probs))
    assert list(streamed_values) == list(values)
    for name, value in values.items():
      np.testing.assert_array_equal(streamed_values[name], value, err_msg=f"{name} {chunk_size}")
    # Ranks and classes exactly; the softmax terms' exp may round apart in the last bit.
    for name, value in terms._asdict().items():
      tolerance = 0 if name in ("rank", "top_class") else 1e-6
      got = getattr(streamed_terms, name)
      assert got.shape == (NUM,) and isinstance(got, np.ndarray)
      np.testing.assert_allclose(got, np.asarray(value), rtol=tolerance, atol=tolerance)
  np.testing.assert_array_equal(terms.rank, events.label_rank(log_probs, _labels(path)))
  np.testing.assert_array_equal(terms.top_class, np.argmax(np.asarray(log_probs), axis=-1))
  # Spilled: one temporary file per member (labels and meta too), per reader.
  with np.load(path) as members:
    assert len(spills) == (3 * len(members.files) if compress == "compressed, spilled" else 0)


def _streamed(path, size: int) -> dict[str, np.ndarray]:
  with stream.PredictionsReader(path) as reader:
    log_probs, values, terms = streaming.from_chunks(reader.chunks(size), NUM, topk=(1, 4))
  named_terms = {f"terms_{name}": value for name, value in terms._asdict().items()}
  return {"log_probs": np.asarray(log_probs), **values, **named_terms}


@pytest.mark.slow
def test_chunks_scored_on_two_cpu_devices_at_once_equal_the_whole_file(tmp_path):
  # top1_jax.launch.evaluate gives JAX a CPU device per core; streaming.from_chunks then
  # scores each group of two chunks with one program over both devices (a short last
  # group repeats its chunk). The devices must not change a single bit, and the scores'
  # program compiles once, not once per device (the first size adds pmax's exp over all N). A stored
  # score (as mc.predict writes them) replaces the recomputed one on every device.
  stored = {"covariance_norm_probs": np.random.default_rng(1).random(NUM).astype(np.float32)}
  predictions = dataclasses.replace(_predictions("samples"), scores=stored)
  path = predictions_lib.save_predictions(tmp_path / "p.npz", predictions)
  _, whole, _ = _whole(path)
  np.testing.assert_array_equal(whole["covariance_norm_probs"], stored["covariance_norm_probs"])
  for size in (7, 5):  # groups of 7 + 7, 7 + 2; of 5 + 5, 5 + 5, 3 + a repeat
    one_device = _streamed(path, size)
    for name, value in whole.items():
      np.testing.assert_array_equal(one_device[name], value, err_msg=name)
    np.savez(tmp_path / f"one_device_{size}.npz", **one_device)
  code = f"""
import jax, numpy as np
jax.config.update("jax_num_cpu_devices", 2)
from test_scale import _streamed
assert len(jax.devices()) == 2
compiles = []
def count(event, seconds, **kwargs):
  if event.endswith("backend_compile_duration"):
    compiles.append(seconds)
jax.monitoring.register_event_duration_secs_listener(count)
for size in (7, 5):
  compiles.clear()
  got = _streamed({str(path)!r}, size)
  assert len(compiles) == (2 if size == 7 else 1), compiles  # + pmax's exp, once per N
  one_device = np.load({str(tmp_path)!r} + f"/one_device_{{size}}.npz")
  assert sorted(got) == sorted(one_device.files), (sorted(got), one_device.files)
  for name in one_device.files:
    np.testing.assert_array_equal(got[name], one_device[name], err_msg=name)
print("same")
"""
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": processes.xla_flags(),
  }
  tests = str(pathlib.Path(__file__).parent)
  done = subprocess.run(
    [sys.executable, "-c", code], env=env, cwd=tests, capture_output=True, text=True
  )
  assert done.returncode == 0 and "same" in done.stdout, done.stderr[-2000:]


class _StoreFile:
  """An object store's file object, as TensorFlow's GFile: ``read`` (each size recorded),
  no ``readinto``."""

  def __init__(self, file, sizes: list):
    self._file, self._sizes = file, sizes

  def read(self, size=-1):
    data = self._file.read(size)
    self._sizes.append(len(data))
    return data

  def __getattr__(self, name):  # seek, tell, close, ...: the file's own
    if name == "readinto":
      raise AttributeError(name)
    return getattr(self._file, name)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._file.close()


def test_a_file_in_a_bucket_is_downloaded_once_and_hashed_on_the_way(tmp_path, monkeypatch):
  # Cloud work dirs keep their predictions files in a bucket. A chunk of an [S, N, K]
  # file is S byte ranges (S requests), so the reader copies the file into a temporary
  # one in a single sequential read, takes its SHA-1 on the way, and reads chunks there.
  path = predictions_lib.save_predictions(tmp_path / "p.npz", _predictions("samples"))
  local = _streamed(path, 7)
  (tmp_path / "bucket").mkdir()
  path = path.rename(tmp_path / "bucket" / "p.npz")
  sizes = []
  monkeypatch.setattr(predictions_lib, "load_predictions", lambda *_: pytest.fail("read whole"))
  wrap = lambda file: _StoreFile(file, sizes)  # noqa: E731
  with io_testing.mock_bucket(tmp_path, monkeypatch, wrap_file=wrap) as opened:
    remote = _streamed("gs://bucket/p.npz", 7)
    with stream.PredictionsReader("gs://bucket/p.npz") as reader:
      digest = reader.file_sha1()
      assert reader.read_whole == () and reader.num_samples == SAMPLES
    # Less free space than the file needs: refused before anything is written.
    usage = shutil.disk_usage(tmp_path)._replace(free=10)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage)
    with pytest.raises(OSError, match=r"^gs://bucket/p.npz: downloading it needs 0\.00 GB"):
      stream.PredictionsReader("gs://bucket/p.npz")
  # One read to the end per reader: the SHA-1 is taken on the way, not by a second read.
  assert opened == [("gs://bucket/p.npz", "rb")] * 3
  assert sizes == [path.stat().st_size, 0] * 2
  assert digest == __import__("hashlib").sha1(path.read_bytes()).hexdigest()
  assert sorted(remote) == sorted(local)
  for name, value in local.items():
    np.testing.assert_array_equal(remote[name], value, err_msg=name)


def test_reader_reports_the_file_and_labels(tmp_path):
  predictions = _predictions("samples")
  path = predictions_lib.save_predictions(tmp_path / "p.npz", predictions)
  with stream.PredictionsReader(path) as reader:
    np.testing.assert_array_equal(reader.labels, predictions.labels)
    assert reader.num_samples == SAMPLES and reader.fields == ("logits", "human_probs")
    assert reader.meta["version"]
  assert stream.file_sha1(path) == __import__("hashlib").sha1(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
  "change, message",
  [
    (lambda f: f.update(logits=np.where(np.arange(NUM)[:, None] == 17, np.nan, f["logits"])),
     r"logits: 6 non-finite value.*examples 14-20"),
    (lambda f: f.update(labels=np.where(np.arange(NUM) == 9, CLASSES, f["labels"])),
     r"labels: labels out of range \[0, 6\)"),
    (lambda f: f.update(mean_probs=np.full((NUM, CLASSES), 0.5, np.float32)), r"mean_probs"),
    (lambda f: f.update(logits=f["logits"][:-1]), r"logits: expected N=23"),
    (lambda f: f.update(extra=np.zeros(3)), r"extra: unexpected field"),
    (lambda f: f.pop("labels"), r"labels: missing field"),
    (lambda f: f.update(logits=f["logits"].astype(np.int32)), r"logits: expected a float dtype"),
  ],
)  # fmt: skip
def test_streamed_validation_names_the_file_and_field(tmp_path, change, message):
  fields = {"labels": _predictions("logits").labels, "logits": _predictions("logits").logits[0]}
  change(fields)
  path = tmp_path / "bad.npz"
  np.savez(path, **fields)
  with pytest.raises(ValueError, match=message) as error:
    with stream.PredictionsReader(path) as reader:
      list(reader.chunks(7))
  assert str(path) in str(error.value)


def test_a_full_temporary_folder_is_named_in_one_line(tmp_path, monkeypatch):
  class FullDisk:
    def write(self, data):
      raise OSError(28, "No space left on device")

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      pass

  monkeypatch.setattr(stream, "IN_MEMORY_BYTES", 0)
  monkeypatch.setattr(tempfile, "TemporaryFile", FullDisk)
  path = predictions_lib.save_predictions(tmp_path / "p.npz", _predictions("logits"), compress=True)
  with pytest.raises(
    ValueError, match=r"cannot be read \(inflating it \(0\.00 GB\) failed"
  ) as error:
    stream.PredictionsReader(path)
  text = io_testing.assert_one_clean_line(error.value)
  assert str(path) in text and "No space left on device" in text and "TMPDIR" in text
  # Less free space than the array needs: refused before anything is written.
  usage = shutil.disk_usage(tmp_path)._replace(free=10)
  monkeypatch.setattr(shutil, "disk_usage", lambda _: usage)
  with pytest.raises(
    ValueError, match=r"cannot be read \(inflating it needs 0\.00 GB of disk; free"
  ):
    stream.PredictionsReader(path)


def test_chunks_must_cover_the_examples(tmp_path):
  path = predictions_lib.save_predictions(tmp_path / "p.npz", _predictions("logits"))
  with stream.PredictionsReader(path) as reader:
    chunks = list(reader.chunks(7))
  with pytest.raises(ValueError, match="chunks: expected a chunk at 7"):
    streaming.from_chunks(chunks[:1] + chunks[2:], NUM)
  with pytest.raises(ValueError, match="chunks: expected 23 examples, got 14"):
    streaming.from_chunks(chunks[:2], NUM)


def test_chunk_size_aims_at_a_fixed_number_of_bytes():
  assert streaming.chunk_size(50_000, None, 1000) == streaming.DEFAULT_CHUNK_BYTES // 4000
  assert streaming.chunk_size(50_000, 32, 1000) == streaming.DEFAULT_CHUNK_BYTES // 128_000
  assert streaming.chunk_size(10, 32, 1000) == 10
  assert streaming.chunk_size(10, 10**6, 10**6) == 1


def test_binning_compiles_once_per_size_bucket(compiles):
  rng = np.random.default_rng(1)
  u, correct = rng.random(1000).astype(np.float32), rng.random(1000) < 0.5
  binning.fit(u[:300], correct[:300], 10)  # warm: the bucket of 512
  for num in range(300, 512, 37):
    compiles.clear()
    bins = binning.fit(u[:num], correct[:num], 10)
    assert compiles == []  # every size of the bucket reuses the counting program
    assert int(np.sum(np.asarray(bins.counts))) == num
    binning.predict(bins, u[:num])


def test_fit_groups_equals_fit_per_group():
  rng = np.random.default_rng(2)
  u = np.round(rng.random(700), 2).astype(np.float32)  # ties
  group, correct = rng.integers(0, 5, 700), rng.random(700) < 0.6
  grouped = binning.fit_groups(u, group, correct, 8, 6)  # group 5 is empty
  for g in range(5):
    alone = binning.fit(u[group == g], correct[group == g], 8)
    for field, value in alone._asdict().items():
      np.testing.assert_array_equal(np.asarray(getattr(grouped, field))[g], np.asarray(value))
  assert int(grouped.counts[5].sum()) == 0


def test_replace_keeps_a_reader_chunk_a_predictions(tmp_path):
  path = predictions_lib.save_predictions(tmp_path / "p.npz", _predictions("samples"))
  with stream.PredictionsReader(path) as reader:
    _, chunk = next(reader.chunks(5))
  assert chunk.logits.shape == (SAMPLES, 5, CLASSES)
  assert dataclasses.replace(chunk, meta={}).num_examples == 5


def test_temperature_weights_and_start_give_the_same_fit():
  from top1_jax.estimators import temperature

  rng = np.random.default_rng(3)
  logits = (2 * rng.normal(size=(400, 10))).astype(np.float32)
  labels = rng.integers(0, 10, 400)
  mask = rng.random(400) < 0.5
  alone = float(temperature.fit_temperature(logits[mask], labels[mask]))
  weighted = temperature.fit_temperature(logits, labels, weights=mask.astype(np.float32))
  started = temperature.fit_temperature(
    logits[mask], labels[mask], initial_temperature=alone * 1.02
  )
  assert float(weighted) == pytest.approx(alone, rel=1e-5)
  assert float(started) == pytest.approx(alone, rel=1e-5)
  with pytest.raises(ValueError, match="weights"):
    temperature.fit_temperature(logits, labels, weights=np.zeros(400, np.float32))


def test_temperatures_of_many_splits_in_one_call_equal_one_fit_each():
  from top1_jax.estimators import temperature

  rng = np.random.default_rng(4)
  logits = (3 * rng.normal(size=(600, 10))).astype(np.float32)
  labels = np.argmax(logits / 3 + rng.gumbel(size=logits.shape), axis=-1)
  # Halves, a small part and a nearly separable one: T far apart, so a split cannot
  # pass by starting at its neighbour's T.
  masks = rng.random((4, 600)) < np.array([[0.5], [0.5], [0.05], [0.9]])
  masks[3] &= np.argmax(logits, axis=-1) == labels
  fitted = np.asarray(temperature.fit_temperature(logits, labels, weights=masks))
  alone = [float(temperature.fit_temperature(logits[m], labels[m])) for m in masks]
  assert fitted.shape == (4,)
  np.testing.assert_allclose(fitted, alone, rtol=1e-5)
  assert len(np.unique(np.round(fitted, 3))) == 4
  with pytest.raises(ValueError, match="positive sum"):
    temperature.fit_temperature(logits, labels, weights=np.zeros((2, 600), np.float32))
  with pytest.raises(ValueError, match="600 weights per row"):
    temperature.fit_temperature(logits, labels, weights=masks[:, :10])


def test_temperatures_of_splits_of_a_large_set_start_from_a_subsample_and_agree():
  from top1_jax.estimators import temperature

  rng = np.random.default_rng(6)
  num = 20_000  # > 4 x 4,096: the pooled fit starts from a subsample's fit
  logits = (2 * rng.normal(size=(num, 4))).astype(np.float32)
  labels = np.argmax(logits / 2 + rng.gumbel(size=logits.shape), axis=-1)
  masks = rng.random((3, num)) < 0.5
  fitted = np.asarray(temperature.fit_temperature(logits, labels, weights=masks))
  alone = [float(temperature.fit_temperature(logits[m], labels[m])) for m in masks]
  np.testing.assert_allclose(fitted, alone, rtol=1e-5)


def _softmax_terms_oracle(logits, labels, temperature):
  """Multiclass Brier and pmax of softmax(logits / T) in float64 NumPy."""
  z = logits.astype(np.float64) / temperature
  probs = np.exp(z - z.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  onehot = np.eye(logits.shape[1])[labels]
  return ((probs - onehot) ** 2).sum(-1), probs.max(-1)


@pytest.mark.slow
def test_split_fits_from_cumulants_equal_each_split_fitted_and_scored_exactly(monkeypatch):
  from top1_jax.estimators import temperature

  monkeypatch.setattr(temperature, "_CUMULANTS_FROM", 0)  # this small set takes them too

  rng = np.random.default_rng(7)
  num, classes = 8_000, 50
  logits = (3 * rng.normal(size=(num, classes))).astype(np.float32)
  labels = np.argmax(logits / 3 + rng.gumbel(size=logits.shape), axis=-1)
  masks = rng.random((6, num)) < 0.5  # calibration halves: T within ~1 % of the pool's
  weights = masks.astype(np.float32)
  alone = [float(temperature.fit_temperature(logits[m], labels[m])) for m in masks]

  def exact_route(*args, **kwargs):
    raise AssertionError("fit_splits fell back to the exact route")

  # The cumulants' route (a second try at most), not the exact fallback, gives these.
  with monkeypatch.context() as patch:
    patch.setattr(temperature, "_fit_temperature", exact_route)
    fits = temperature.fit_splits(logits, labels, weights)
  np.testing.assert_allclose(fits.temperature, alone, rtol=1e-5)
  assert np.ptp(alone) > 1e-3  # the splits' own T, not one shared value
  for f, t in enumerate(alone):
    brier, pmax = _softmax_terms_oracle(logits, labels, t)
    got_brier, got_pmax = fits.terms(f)  # split by split: no [F, N] array is made
    np.testing.assert_allclose(got_brier, brier, atol=2e-6)
    np.testing.assert_allclose(got_pmax, pmax, atol=2e-6)


@pytest.mark.skipif(not pathlib.Path("/proc/self/clear_refs").exists(), reason="Linux /proc")
def test_split_fits_hold_no_split_by_example_floats(monkeypatch):
  """40 splits cost ``fit_splits`` and reading every split's terms less than one more
  [F, N] float32 array over 2 splits: the masks stay bool, and the terms are made split
  by split from [N] arrays (before, [F, N] float weights, copies and terms: ~6 arrays)."""
  import jax

  from top1_jax.estimators import temperature

  monkeypatch.setattr(temperature, "_CUMULANTS_FROM", 0)  # the route large inputs take
  rng = np.random.default_rng(3)
  num = 300_000
  logits = rng.normal(size=(num, 10)).astype(np.float32)
  labels = np.argmax(logits + rng.gumbel(size=logits.shape), axis=-1)
  masks = {f: rng.random((f, num)) < 0.5 for f in (2, 40)}

  def fit_and_read(f):
    fits = temperature.fit_splits(logits, labels, masks[f])
    for split in range(f):
      jax.block_until_ready(fits.terms(split))

  def status(key: str) -> int:  # a /proc/self/status field, in kB
    return int(pathlib.Path("/proc/self/status").read_text().split(key + ":")[1].split()[0])

  def peak_growth(f):  # the process's peak RSS over its RSS before, in bytes
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM)
    before = status("VmRSS")
    fit_and_read(f)
    return (status("VmHWM") - before) * 1024

  for f in masks:  # compiled first: the programs' own memory is not counted
    fit_and_read(f)
  assert peak_growth(40) - peak_growth(2) < 4 * 40 * num


def test_split_fits_far_from_the_pool_take_the_exact_route(monkeypatch):
  from top1_jax.estimators import temperature

  monkeypatch.setattr(temperature, "_CUMULANTS_FROM", 0)  # tried first, then refused

  rng = np.random.default_rng(4)
  logits = (3 * rng.normal(size=(600, 10))).astype(np.float32)
  labels = np.argmax(logits / 3 + rng.gumbel(size=logits.shape), axis=-1)
  masks = rng.random((3, 600)) < np.array([[0.5], [0.05], [0.9]])
  masks[2] &= np.argmax(logits, axis=-1) == labels  # nearly separable: T at the bracket's end
  fits = temperature.fit_splits(logits, labels, masks.astype(np.float32))
  exact = temperature.fit_temperature(logits, labels, weights=masks)
  np.testing.assert_array_equal(fits.temperature, exact)
  brier, pmax = temperature.softmax_terms(logits, labels, exact)
  for f in range(3):
    np.testing.assert_array_equal(fits.terms(f)[0], brier[f])
    np.testing.assert_array_equal(fits.terms(f)[1], pmax[f])
  for f, t in enumerate(np.asarray(exact)):
    want_brier, want_pmax = _softmax_terms_oracle(logits, labels, t)
    np.testing.assert_allclose(brier[f], want_brier, atol=2e-6)
    np.testing.assert_allclose(pmax[f], want_pmax, atol=2e-6)
  with pytest.raises(ValueError, match="positive sum"):
    temperature.fit_splits(logits, labels, np.zeros((2, 600), np.float32))
  with pytest.raises(ValueError, match="temperatures"):
    temperature.softmax_terms(logits, labels, [0.0])
