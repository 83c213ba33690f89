"""Hostile and corrupt files: each refused in one line naming the file and the field.

Calibrator files (version 1 and 2) and the estimators' saved states; predictions files
(``load_predictions`` and the streaming reader); IDX data dirs.
"""

import gzip
import json
import struct

import numpy as np
import pytest

from top1_jax import Calibrator, calibrator
from top1_jax.estimators import registry
from top1_jax.io import datasets, idx


def _version_2():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 300)
  logits = rng.normal(size=(300, 10)).astype(np.float32)
  logits[np.arange(300), labels] += 2.0
  return Calibrator(n_bins=4).fit(logits, labels).to_dict()


def _version_1():
  return {
    "format": "top1_jax.Calibrator",
    "version": 1,
    "score": "neg_log_pmax",
    "n_bins": 4,
    "k": 1,
    "inputs": "logits",
    "num_classes": 10,
    "edges": [0.25, 0.5, 1.5],
    "counts": [25, 25, 25, 25],
    "hits": [24, 20, 12, 3],
    "prior": 0.59,
    "prob": [0.9458, 0.7919, 0.4842, 0.1381],
  }


def _changed(layout: int, **fields):
  """A saved bins calibrator of version ``layout`` with its bins' ``fields`` changed."""
  if layout == 1:
    return {**_version_1(), **fields}
  state = _version_2()
  bins = {**state["state"], **{k: v for k, v in fields.items() if k in state["state"]}}
  top = {k: v for k, v in fields.items() if k not in state["state"] or k == "n_bins"}
  return {**state, **top, "state": bins}


def _load(tmp_path, state) -> Calibrator:
  path = tmp_path / "cal.json"
  path.write_text(json.dumps(state))
  return Calibrator.load(path)


def _refused(call, message: str, path=None):
  with pytest.raises(ValueError, match=message) as info:
    call()
  text = str(info.value)
  assert "\n" not in text
  if path is not None:
    assert text.startswith(f"{path}: ")
  return text


# counts of 2**32 + 400 had wrapped to 400 in int32; edges of 1e300 had become inf and
# 1e-50 had become 0 (moving the predictions); "version": true had passed for 1.
_BAD_BINS = [
  ({"counts": [2**32 + 400] * 4}, "field 'counts' holds 4294967696, outside the int32 range"),
  ({"hits": [-(2**31) - 1, 0, 0, 0]}, "field 'hits' holds -2147483649, outside the int32"),
  ({"edges": [0.25, 0.5, 1e300]}, r"field 'edges' holds 1e\+300, which overflows float32"),
  ({"edges": [1e-50, 0.5, 1.5]}, "field 'edges' holds 1e-50, which float32 rounds to 0"),
  ({"edges": ["0.25", 0.5, 1.5]}, "field 'edges' must hold numbers, got <U"),
  ({"counts": [True, 25, 25, 25]}, "field 'counts' must hold integers, got booleans"),
  ({"prior": 1e-50}, "field 'prior' holds 1e-50, which float32 rounds to 0"),
  ({"version": True}, "calibrator version True, this top1_jax reads 1 and 2"),
  ({"version": 2.0}, "calibrator version 2.0"),
  ({"n_bins": 2**40}, "n_bins: expected at least 1, at most 2147483647"),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("fields, message", _BAD_BINS)
def test_values_that_do_not_survive_their_dtype_are_refused(tmp_path, version, fields, message):
  state = _changed(version, **fields)
  _refused(lambda: _load(tmp_path, state), message, tmp_path / "cal.json")


@pytest.mark.parametrize("version", [1, 2])
def test_more_bins_than_calibration_examples_are_refused(tmp_path, version):
  # fit makes at most one bin per example; these bins count 100 examples in 5000 bins.
  counts = [0] * 4996 + [25] * 4
  state = _changed(version, n_bins=5000, counts=counts, hits=[0] * 4996 + [24, 20, 12, 3])
  _refused(lambda: _load(tmp_path, state), "field 'n_bins' is 5000, more than the 100 calibr")


def test_an_option_of_the_wrong_type_is_refused(tmp_path):
  rng = np.random.default_rng(1)
  logits, labels = rng.normal(size=(200, 4)).astype(np.float32), rng.integers(0, 4, 200)
  state = Calibrator(method="isotonic").fit(logits, labels).to_dict()
  for value in ("0.5", 1, None):
    state["options"] = {"prior": value}
    _refused(lambda: _load(tmp_path, state), "options: prior must be a bool")
  state["options"] = {"prior": False}
  assert _load(tmp_path, state).get_params()["prior"] is False


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
  "text, message",
  [
    (lambda s: s.replace('"format"', '"x": ' + "[" * 100000 + "]" * 100000 + ', "format"'),
     "JSON nested too deeply"),
    (lambda s: s.replace('"k": 1', '"k": 1, "k": 2'), "field 'k' is given twice in one object"),
    (lambda s: s.replace('"num_classes": 10', '"num_classes": NaN'), "NaN is not strict JSON"),
    (lambda s: s.replace('"k": 1', '"k": 1' + "0" * 5000), "not a top1_jax calibrator"),
  ],
)  # fmt: skip
def test_hostile_json_is_one_line_naming_the_file(tmp_path, version, text, message):
  path = tmp_path / "cal.json"
  path.write_text(text(json.dumps(_version_1() if version == 1 else _version_2())))
  _refused(lambda: Calibrator.load(path), message, path)


def test_a_utf16_or_oversized_file_is_refused_before_parsing(tmp_path, monkeypatch):
  path = tmp_path / "cal.json"
  path.write_text(json.dumps(_version_2()), encoding="utf-16")
  _refused(lambda: Calibrator.load(path), "not a top1_jax calibrator .not UTF-8 text", path)
  path.write_text(json.dumps(_version_2()))
  assert Calibrator.load(path).n_bins_ == 4
  monkeypatch.setattr(calibrator, "MAX_FILE_BYTES", 100)
  size = path.stat().st_size
  _refused(lambda: Calibrator.load(path), f"not a top1_jax calibrator .{size} bytes, over the 100")
  _refused(lambda: Calibrator.load(None), "path: expected a file path")


@pytest.mark.parametrize(
  "name, field, value, message",
  [
    ("isotonic", "knots", 1e-50, "which float32 rounds to 0"),
    ("isotonic", "counts", 2**31, "outside the int32 range"),
    ("kde", "bandwidth", 1e300, r"field 'bandwidth' holds 1e\+300, which overflows float32"),
    ("kde", "bandwidth", 10**400, "field 'bandwidth' overflows float32"),
    ("kde", "prob", True, "field 'prob' must hold numbers, got booleans"),
    ("temperature", "temperature", True, "field 'temperature' must be a number"),
  ],
)
def test_estimator_states_refuse_values_their_dtype_cannot_hold(name, field, value, message):
  entry = registry.lookup(name)
  rng = np.random.default_rng(2)
  logits, labels = rng.normal(size=(300, 4)).astype(np.float32), rng.integers(0, 4, 300)
  state = Calibrator(method=name).fit(logits, labels).to_dict()["state"]
  if isinstance(state[field], list):
    state[field] = [value] + state[field][1:]
  else:
    state[field] = value
  _refused(lambda: entry.from_dict(state, "saved.json"), f"^saved.json: .*{message}")


# ----------------------------------------------------------------------------
# IDX data dirs


def _idx_bytes(array: np.ndarray) -> bytes:
  header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  return header + array.astype(np.uint8).tobytes()


def test_a_gz_file_and_its_raw_twin_are_used_when_equal_and_refused_when_not(
  tmp_path, no_system_fmnist
):
  # The .gz had been read silently, whatever the raw file beside it held.
  rng = np.random.default_rng(3)
  images, labels = rng.integers(0, 256, (6, 4, 4)), np.arange(6) % 10
  for stem, array in (("t10k-images-idx3-ubyte", images), ("t10k-labels-idx1-ubyte", labels)):
    (tmp_path / f"{stem}.gz").write_bytes(gzip.compress(_idx_bytes(array)))
    (tmp_path / stem).write_bytes(_idx_bytes(array))
  split = datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path)
  np.testing.assert_array_equal(split.labels, labels)
  for raw in (_idx_bytes(labels[::-1]), _idx_bytes(labels[:5]), b""):
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(raw)
    message = "t10k-labels-idx1-ubyte.gz and t10k-labels-idx1-ubyte hold different data"
    _refused(lambda: idx.find_idx_files(tmp_path, "test"), message, tmp_path)
    _refused(lambda: datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path), message)
  # A raw twin that is itself gzipped is compared by its data too.
  (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(gzip.compress(_idx_bytes(labels), 1))
  assert idx.find_idx_files(tmp_path, "test")[1].name == "t10k-labels-idx1-ubyte.gz"
