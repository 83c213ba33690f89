"""Tests for top1_jax.io.predictions: the predictions file and human labels."""

import dataclasses
import json
import os
import pathlib
import tempfile

import io_testing
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import top1_jax
from top1_jax.io import predictions as predictions_lib
from top1_jax.io import stream

# ----------------------------------------------------------------------------
# Predictions files


N, K, S = 6, 3, 2


def _softmax(logits):
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _fields(seed: int = 0) -> dict:
  """Every field of a valid predictions file, as an external writer would save it."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(S, N, K)).astype(np.float32)
  return {
    "labels": np.array([0, 1, 2, 0, 1, 2], np.int64),
    "logits": logits,
    "mean_probs": _softmax(logits).mean(0).astype(np.float32),
    "score_entropy": rng.random(N).astype(np.float32),
    "human_probs": rng.dirichlet(np.ones(K), size=N).astype(np.float32),
    "meta": np.array(json.dumps({"dataset": "toy", "split": "test", "seed": 3})),
  }


def _set(key, value):
  def apply(fields):
    fields[key] = value(fields) if callable(value) else value

  return apply


def _drop(*keys):
  def apply(fields):
    for key in keys:
      del fields[key]

  return apply


def _poke(key, index, value):
  def apply(fields):
    fields[key] = fields[key].copy()
    fields[key][index] = value

  return apply


MALFORMED = {
  "missing_labels": (_drop("labels"), "labels: missing field"),
  "no_logits_no_probs": (_drop("logits", "mean_probs"), "logits/mean_probs: expected"),
  "labels_float": (
    _set("labels", lambda f: f["labels"].astype(float)),
    "labels: expected an integer dtype",
  ),
  "labels_2d": (_set("labels", lambda f: f["labels"][:, None]), "labels: expected a 1-D array"),
  "labels_too_big": (_poke("labels", 2, 3), r"labels: labels out of range \[0, 3\): min 0, max 3"),
  "labels_negative": (_poke("labels", 0, -1), r"labels: labels out of range \[0, 3\): min -1"),
  "labels_empty": (
    lambda f: f.update(labels=np.zeros(0, int), logits=np.zeros((1, 0, 3), np.float32)),
    "labels: expected at least one example",
  ),
  "logits_1d": (_set("logits", np.zeros(6, np.float32)), "logits: expected a 2-D or 3-D array"),
  "logits_4d": (
    _set("logits", np.zeros((1, 2, 6, 3), np.float32)),
    "logits: expected a 2-D or 3-D",
  ),
  "logits_wrong_n": (
    _set("logits", lambda f: f["logits"][:, :5]),
    r"logits: expected N=6 .* got shape \(2, 5, 3\)",
  ),
  "logits_int": (
    _set("logits", np.zeros((2, 6, 3), np.int32)),
    "logits: expected a float dtype, got int32",
  ),
  "logits_nan": (
    _poke("logits", (1, 4, 2), np.nan),
    "logits: 1 non-finite value.*flat index 32: nan",
  ),
  "logits_inf": (_poke("logits", (0, 0, 0), -np.inf), "logits: 1 non-finite value.*-inf"),
  "logits_one_class": (
    lambda f: f.update(
      labels=np.zeros(6, int),
      logits=np.zeros((1, 6, 1), np.float32),
      mean_probs=np.ones((6, 1), np.float32),
    ),
    "logits: expected at least 2 classes, got K=1",
  ),
  "logits_no_samples": (
    _set("logits", np.zeros((0, 6, 3), np.float32)),
    "logits: expected at least one sample",
  ),
  "probs_not_summing": (
    _poke("mean_probs", (3, 0), 0.9),
    "mean_probs: each row must sum to 1, row 3 sums to",
  ),
  "probs_negative": (
    _poke("mean_probs", (1, 1), -0.1),
    r"mean_probs: probabilities must lie in \[0, 1\]",
  ),
  "probs_wrong_k": (
    _set("mean_probs", np.full((6, 4), 0.25, np.float32)),
    "mean_probs: expected K=3",
  ),
  "probs_wrong_n": (
    _set("mean_probs", lambda f: f["mean_probs"][:4]),
    "mean_probs: expected 6 rows",
  ),
  "probs_nan": (_poke("mean_probs", (0, 0), np.nan), "mean_probs: 1 non-finite"),
  "probs_3d": (
    _set("mean_probs", lambda f: f["mean_probs"][None]),
    "mean_probs: expected a 2-D array",
  ),
  "score_wrong_length": (
    _set("score_entropy", np.zeros(5, np.float32)),
    r"score_entropy: expected shape \(6,\)",
  ),
  "score_nan": (_poke("score_entropy", 5, np.nan), "score_entropy: 1 non-finite"),
  "score_2d": (
    _set("score_entropy", np.zeros((6, 1), np.float32)),
    "score_entropy: expected a 1-D",
  ),
  "score_strings": (
    _set("score_entropy", np.array(["a"] * 6)),
    "score_entropy: expected a float dtype",
  ),
  "score_empty_name": (_set("score_", np.zeros(6, np.float32)), "score_: score names must be"),
  "score_bad_name": (_set("score_a-b", np.zeros(6, np.float32)), "score_a-b: score names must be"),
  "human_wrong_n": (
    _set("human_probs", lambda f: f["human_probs"][1:]),
    "human_probs: expected 6 rows",
  ),
  "human_not_summing": (
    _poke("human_probs", (2, 2), 0.0),
    "human_probs: each row must sum to 1, row 2",
  ),
  "human_wrong_k": (
    _set("human_probs", np.full((6, 2), 0.5, np.float32)),
    "human_probs: expected K=3",
  ),
  "meta_bad_json": (_set("meta", np.array("{dataset: toy")), "meta: invalid JSON"),
  "meta_not_object": (_set("meta", np.array("[1, 2]")), "meta: expected a JSON object, got list"),
  "meta_not_string": (_set("meta", np.arange(3)), "meta: expected a JSON string"),
  "meta_nan": (_set("meta", np.array('{"seed": 1, "x": NaN}')), "meta: NaN is not strict JSON"),
  # A key given twice had been accepted (the last one won), JSON nested too deeply had
  # ended in a RecursionError.
  "meta_key_twice": (
    _set("meta", np.array('{"seed": 1, "seed": 2}')),
    "meta: field 'seed' is given twice in one object",
  ),
  "meta_nested": (
    _set("meta", np.array('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")),
    "meta: JSON nested too deeply",
  ),
  "meta_dropout_range": (
    _set("meta", np.array('{"dropout_rate": 1.5}')),
    r"meta: dropout_rate must be in \[0, 1\)",
  ),
  "meta_ensemble_type": (
    _set("meta", np.array('{"ensemble_size": "five"}')),
    "meta: ensemble_size must be int",
  ),
  "meta_seed_bool": (_set("meta", np.array('{"seed": true}')), "meta: seed must be int"),
  "unknown_field": (_set("logit", np.zeros(3)), "logit: unexpected field"),
  "pickled_object": (
    _set("logits", lambda f: np.array([object()] * 2, dtype=object)),
    "field 'logits' cannot be read",
  ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_load_rejects_malformed_files(tmp_path, case):
  mutate, message = MALFORMED[case]
  fields = _fields()
  mutate(fields)
  path = tmp_path / "preds.npz"
  np.savez(path, **fields)
  with pytest.raises(ValueError, match=message) as info:
    predictions_lib.load_predictions(path)
  text = str(info.value)
  assert text.startswith(f"{path}: ") and "\n" not in text


def test_save_and_load_roundtrip_all_fields(tmp_path):
  fields = _fields()
  predictions = predictions_lib.Predictions(
    labels=fields["labels"],
    logits=fields["logits"],
    mean_probs=fields["mean_probs"],
    scores={"entropy": fields["score_entropy"]},
    human_probs=fields["human_probs"],
    meta={"dataset": "toy", "seed": np.int64(3), "dropout_rate": 0.1, "tags": ["a"]},
  )
  path = predictions_lib.save_predictions(tmp_path / "out" / "preds.npz", predictions)
  assert path == tmp_path / "out" / "preds.npz" and sorted(os.listdir(path.parent)) == ["preds.npz"]
  loaded = predictions_lib.load_predictions(path)
  assert loaded.labels.dtype == np.int32
  np.testing.assert_array_equal(loaded.labels, fields["labels"])
  for key in ("logits", "mean_probs", "human_probs"):
    assert getattr(loaded, key).dtype == np.float32
    np.testing.assert_array_equal(getattr(loaded, key), fields[key])
  assert list(loaded.scores) == ["entropy"]
  np.testing.assert_array_equal(loaded.scores["entropy"], fields["score_entropy"])
  assert loaded.meta == {
    "dataset": "toy",
    "seed": 3,
    "dropout_rate": 0.1,
    "tags": ["a"],
    "version": top1_jax.__version__,
  }
  assert (loaded.num_examples, loaded.num_classes, loaded.num_samples) == (N, K, S)
  with np.load(path, allow_pickle=False) as raw:  # plain arrays, readable anywhere
    assert sorted(raw.files) == sorted(
      ["labels", "logits", "mean_probs", "score_entropy", "human_probs", "meta"]
    )


def test_roundtrip_mean_probs_only_compressed(tmp_path):
  fields = _fields()
  predictions = predictions_lib.Predictions(
    labels=fields["labels"],
    mean_probs=fields["mean_probs"].astype(np.float64),
    meta={"version": "mine"},
  )
  path = predictions_lib.save_predictions(tmp_path / "p.npz", predictions, compress=True)
  loaded = predictions_lib.load_predictions(path)
  assert loaded.logits is None and loaded.human_probs is None and loaded.scores == {}
  assert loaded.num_samples is None and loaded.num_classes == K
  assert loaded.mean_probs.dtype == np.float32 and loaded.meta == {"version": "mine"}
  np.testing.assert_allclose(loaded.mean_probs, fields["mean_probs"], rtol=1e-6)


def test_external_writer_without_meta_and_2d_logits(tmp_path):
  path = tmp_path / "external.npz"
  logits = np.random.default_rng(1).normal(size=(N, K))  # float64, plain model
  np.savez(path, labels=np.arange(N) % K, logits=logits)
  loaded = predictions_lib.load_predictions(path)
  assert loaded.logits.shape == (1, N, K) and loaded.logits.dtype == np.float32
  assert loaded.meta == {}


@settings(max_examples=25)
@given(
  num_samples=st.integers(1, 4),
  num_examples=st.integers(1, 20),
  num_classes=st.integers(2, 7),
  seed=st.integers(0, 2**16),
  with_probs=st.booleans(),
)
def test_roundtrip_property(num_samples, num_examples, num_classes, seed, with_probs):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(num_samples, num_examples, num_classes)) * 10).astype(np.float32)
  predictions = predictions_lib.Predictions(
    labels=rng.integers(0, num_classes, num_examples),
    logits=logits,
    mean_probs=_softmax(logits).mean(0) if with_probs else None,
    scores={"u": rng.random(num_examples), "v2": -rng.random(num_examples)},
    meta={"seed": seed},
  )
  with tempfile.TemporaryDirectory() as directory:
    loaded = predictions_lib.load_predictions(
      predictions_lib.save_predictions(pathlib.Path(directory) / "p.npz", predictions)
    )
  np.testing.assert_array_equal(loaded.logits, predictions.logits)
  np.testing.assert_array_equal(loaded.labels, predictions.labels)
  assert (loaded.mean_probs is None) == (not with_probs)
  for name in ("u", "v2"):
    np.testing.assert_array_equal(loaded.scores[name], predictions.scores[name])
  assert loaded.meta["seed"] == seed


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"meta": {"model": object()}}, "meta: not JSON-serializable"),
    ({"meta": ["not", "a", "dict"]}, "meta: expected a dict"),
    ({"meta": {1: "x"}}, "meta: keys must be strings"),
    ({"scores": [1, 2]}, "scores: expected a dict"),
    ({"scores": {"u": None}}, "score_u: expected an array, got None"),
    ({"labels": None}, "labels: expected an array, got None"),
  ],
)
def test_constructor_validates(kwargs, message):
  fields = {"labels": [0, 1], "logits": np.zeros((1, 2, 2), np.float32), **kwargs}
  with pytest.raises(ValueError, match=message):
    predictions_lib.Predictions(**fields)


def test_replace_revalidates_and_save_needs_predictions(tmp_path):
  predictions = predictions_lib.Predictions(labels=[0, 1], logits=np.zeros((2, 2), np.float32))
  with pytest.raises(ValueError, match="human_probs: expected 2 rows"):
    dataclasses.replace(predictions, human_probs=np.full((3, 2), 0.5))
  with pytest.raises(
    ValueError, match="predictions: expected a top1_jax.io.predictions.Predictions"
  ):
    predictions_lib.save_predictions(tmp_path / "p.npz", {"labels": [0, 1]})


def test_load_errors_for_files_that_are_not_predictions(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.npz: predictions file not found"):
    predictions_lib.load_predictions(tmp_path / "missing.npz")
  text_file = tmp_path / "notes.npz"
  text_file.write_text("hello")
  with pytest.raises(ValueError, match="notes.npz: not a readable .npz"):
    predictions_lib.load_predictions(text_file)
  single = tmp_path / "single.npy"
  np.save(single, np.zeros(3))
  with pytest.raises(ValueError, match="single.npy: expected an .npz archive"):
    predictions_lib.load_predictions(single)
  good = tmp_path / "good.npz"
  np.savez(good, **_fields())
  truncated = tmp_path / "truncated.npz"
  truncated.write_bytes(good.read_bytes()[:-200])
  with pytest.raises(ValueError, match="truncated.npz"):
    predictions_lib.load_predictions(truncated)


@pytest.mark.parametrize("error", [OSError("No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("exists", [False, True])
def test_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch, error, exists):
  path = tmp_path / "preds.npz"
  fields = _fields()
  predictions = predictions_lib.Predictions(labels=fields["labels"], logits=fields["logits"])
  if exists:
    predictions_lib.save_predictions(path, predictions)
  before = path.read_bytes() if exists else None

  def savez_then_fail(file, **arrays):
    file.write(b"PK\x03\x04 half of an archive")
    raise error

  monkeypatch.setattr(np, "savez", savez_then_fail)
  with pytest.raises(type(error)):
    predictions_lib.save_predictions(path, predictions)
  assert os.listdir(tmp_path) == (["preds.npz"] if exists else [])
  if exists:
    assert path.read_bytes() == before
    monkeypatch.undo()
    np.testing.assert_array_equal(predictions_lib.load_predictions(path).logits, fields["logits"])


# ----------------------------------------------------------------------------
# Human labels


def _saved_without_human_probs(tmp_path, fields):
  plain = predictions_lib.Predictions(labels=fields["labels"], logits=fields["logits"])
  return predictions_lib.save_predictions(tmp_path / "preds.npz", plain)


def test_attach_human_probs(tmp_path):
  fields = _fields()
  preds_path = _saved_without_human_probs(tmp_path, fields)
  human_path = tmp_path / "cifar10h-probs.npy"
  np.save(human_path, fields["human_probs"].astype(np.float64))
  out = predictions_lib.attach_human_probs(
    preds_path, human_path, output_path=tmp_path / "with_human.npz"
  )
  np.testing.assert_allclose(
    predictions_lib.load_predictions(out).human_probs, fields["human_probs"]
  )
  assert predictions_lib.load_predictions(preds_path).human_probs is None  # input untouched
  predictions_lib.attach_human_probs(preds_path, fields["human_probs"])  # in place, from an array
  np.testing.assert_array_equal(
    predictions_lib.load_predictions(preds_path).human_probs, fields["human_probs"]
  )
  assert sorted(os.listdir(tmp_path)) == ["cifar10h-probs.npy", "preds.npz", "with_human.npz"]


def test_attach_human_probs_checks_the_shape(tmp_path):
  fields = _fields()
  preds_path = _saved_without_human_probs(tmp_path, fields)
  human_path = tmp_path / "h.npy"
  np.save(human_path, np.full((N + 1, K), 1 / K))
  with pytest.raises(
    ValueError, match=r"h.npy: human_probs: expected num_examples=6, got shape \(7, 3\)"
  ):
    predictions_lib.attach_human_probs(preds_path, human_path)
  with pytest.raises(ValueError, match="human_probs: expected K=3"):
    predictions_lib.attach_human_probs(preds_path, np.full((N, 2), 0.5))


@pytest.mark.parametrize(
  "array, message",
  [
    (np.array([[30, 21], [0, 51]]), "looks like annotator counts.*divide each row"),
    (np.array([[0.5, np.nan]]), "human_probs: 1 non-finite"),
    (np.array([0.5, 0.5]), "human_probs: expected a 2-D array"),
    (np.array([[0.5, 0.6]]), "human_probs: each row must sum to 1"),
  ],
)
def test_load_human_probs_errors(tmp_path, array, message):
  path = tmp_path / "h.npy"
  np.save(path, array)
  with pytest.raises(ValueError, match=message) as info:
    predictions_lib.load_human_probs(path)
  assert str(info.value).startswith(f"{path}: ")


def test_load_human_probs_one_hot_rows_are_probabilities(tmp_path):
  path = tmp_path / "h.npy"
  np.save(path, np.eye(3))
  probs = predictions_lib.load_human_probs(path, num_examples=3, num_classes=3)
  assert probs.dtype == np.float32
  np.testing.assert_array_equal(probs, np.eye(3))


def test_predictions_and_human_probs_in_a_bucket(tmp_path, monkeypatch):
  fields = _fields()
  predictions = predictions_lib.Predictions(labels=fields["labels"], logits=fields["logits"])
  (tmp_path / "bucket").mkdir()
  np.save(tmp_path / "bucket" / "h.npy", fields["human_probs"])
  with io_testing.mock_bucket(tmp_path, monkeypatch):
    path = predictions_lib.save_predictions("gs://bucket/p.npz", predictions)
    assert str(path) == "gs://bucket/p.npz"
    out = predictions_lib.attach_human_probs(
      path, "gs://bucket/h.npy", output_path="gs://bucket/q.npz"
    )
    loaded = predictions_lib.load_predictions(out)
    with pytest.raises(FileNotFoundError, match="gs://bucket/missing.npz: predictions file"):
      predictions_lib.load_predictions("gs://bucket/missing.npz")
  np.testing.assert_array_equal(loaded.logits, fields["logits"])
  np.testing.assert_array_equal(loaded.human_probs, fields["human_probs"])
  assert sorted(os.listdir(tmp_path / "bucket")) == ["h.npy", "p.npz", "q.npz"]


def test_from_arrays_reads_npy_logits_probs_and_samples(tmp_path):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 6, 4)).astype(np.float32)
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  labels = np.array([0, 1, 2, 3, 0, 1])
  for name, value in {
    "l2": logits[0],
    "l3": logits,
    "p2": probs[0],
    "p3": probs,
    "y": labels,
  }.items():
    np.save(tmp_path / f"{name}.npy", value)
  plain = predictions_lib.from_arrays(labels=tmp_path / "y.npy", logits=tmp_path / "l2.npy")
  assert plain.num_samples == 1 and plain.meta["method"] == "plain"
  samples = predictions_lib.from_arrays(labels=tmp_path / "y.npy", logits=tmp_path / "l3.npy")
  assert samples.num_samples == 2 and samples.meta["method"] == "samples"
  from_probs = predictions_lib.from_arrays(labels=tmp_path / "y.npy", probs=tmp_path / "p2.npy")
  assert from_probs.logits is None
  np.testing.assert_allclose(from_probs.mean_probs, probs[0], rtol=1e-6)
  sample_probs = predictions_lib.from_arrays(
    labels=tmp_path / "y.npy", probs=tmp_path / "p3.npy", meta={"dataset": "toy"}
  )
  np.testing.assert_allclose(sample_probs.logits, np.log(probs), rtol=1e-5, atol=1e-6)
  assert sample_probs.meta == {"method": "samples", "dataset": "toy"}
  with pytest.raises(ValueError, match="logits/probs/array: expected exactly one of them"):
    predictions_lib.from_arrays(labels=tmp_path / "y.npy")
  with pytest.raises(ValueError, match=r"probs: expected a 2-D or 3-D array, got shape \(6,\)"):
    predictions_lib.from_arrays(labels=tmp_path / "y.npy", probs=tmp_path / "y.npy")
  with pytest.raises(FileNotFoundError, match="labels: no such file"):
    predictions_lib.from_arrays(labels=tmp_path / "nope.npy", logits=tmp_path / "l2.npy")


def test_save_refuses_probabilities_as_logits(tmp_path):
  # save_predictions had written probabilities as logits: read back, they were scored as
  # logits (softmax of probabilities), other numbers, silently.
  fields = _fields()
  probs = fields["mean_probs"]
  as_logits = predictions_lib.Predictions(labels=fields["labels"], logits=probs[None])
  with pytest.raises(ValueError) as info:
    predictions_lib.save_predictions(tmp_path / "p.npz", as_logits)
  assert str(info.value) == (
    "logits: these look like probabilities (every row in [0, 1], summing to 1); store them as"
    " mean_probs (or their logarithms as logits)"
  )
  assert not (tmp_path / "p.npz").exists()
  kept = predictions_lib.Predictions(labels=fields["labels"], logits=np.log(probs)[None])
  predictions_lib.save_predictions(tmp_path / "p.npz", kept)  # their logarithms are logits


@pytest.mark.parametrize("kind", ["FIFO", "character device", "directory"])
def test_a_predictions_path_that_is_not_a_regular_file_is_refused(tmp_path, kind):
  path = io_testing.not_regular_files(tmp_path)[kind]
  for read in (
    predictions_lib.load_predictions,
    stream.PredictionsReader,
    lambda p: predictions_lib.from_arrays(labels=p, logits=p),
  ):
    error = io_testing.returns_without_a_writer(lambda read=read: read(path), tmp_path / "fifo")
    assert isinstance(error, ValueError), error
    assert f"{path}: a {kind}" in io_testing.assert_one_clean_line(error)
