"""Hostile and corrupt files: each refused in one line naming the file and the field.

Calibrator files (version 1 and 2) and the estimators' saved states; predictions files
(``load_predictions`` and the streaming reader); IDX data dirs.
"""

import gzip
import io
import json
import struct
import types
import warnings
import zipfile
import zlib

import numpy as np
import pytest
import synthetic

from top1_jax import Calibrator, calibrator
from top1_jax.estimators import base, registry
from top1_jax.io import datasets, idx, prediction_checks, predictions, stream, zip_crc
from top1_jax.pipeline import sources


def _version_2():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 300)
  logits = rng.normal(size=(300, 10)).astype(np.float32)
  logits[np.arange(300), labels] += 2.0
  return Calibrator(n_bins=4).fit(logits, labels).to_dict()


def _version_1():
  return synthetic.version_1_calibrator()


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
  ({"edges": ["0.25", 0.5, 1.5]}, "field 'edges' must hold numbers, got the string '0.25'"),
  ({"counts": [True, 25, 25, 25]}, r"field 'counts' must hold integers, got a boolean \(true\)"),
  # Counts of 1.5 or 2**63 had been called "booleans".
  ({"counts": [1.5, 25, 25, 25]}, r"'counts' must hold integers, got a number that is not an"),
  ({"counts": [2**63, 25, 25, 25]}, "field 'counts' holds 9223372036854775808, outside the int32"),
  ({"hits": [2**63, -1, 0, 0]}, "field 'hits' holds 9223372036854775808, outside the int32"),
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
    # Refused by the estimator's own check of the option (what fit would refuse).
    _refused(lambda: _load(tmp_path, state), r"bad calibrator field \(prior: expected a bool")
  state["options"] = {"prior": False}
  assert _load(tmp_path, state).get_params()["prior"] is False


def _fitted(method: str, num: int = 600, **options) -> dict:
  rng = np.random.default_rng(3)
  labels = rng.integers(0, 4, num)
  logits = rng.normal(size=(num, 4)).astype(np.float32)
  logits[np.arange(num), labels] += 1.0
  return json.loads(json.dumps(Calibrator(method=method, **options).fit(logits, labels).to_dict()))


def _merged(table: dict, first: int) -> dict:
  """A saved table with bin ``first + 1``'s examples counted in bin ``first`` instead
  (every other rule kept: hits <= counts, the same total)."""
  table = dict(table)
  for name in ("counts", "hits"):
    values = list(table[name])
    values[first], values[first + 1] = values[first] + values[first + 1], 0
    table[name] = values
  return table


def _changed_state(change):
  def changed(saved: dict) -> dict:
    saved = json.loads(json.dumps(saved))
    saved["state"] = change(saved["state"])
    return saved

  return changed


def _field(name: str, change):
  return _changed_state(lambda state: {**state, name: change(state[name])})


def _class(index: int, change):
  def changed(state):
    classes = list(state["classes"])
    classes[index] = change(dict(classes[index]))
    return {**state, "classes": classes}

  return _changed_state(changed)


def _one_bin(table: dict) -> dict:
  """A class's bins as one bin of all its examples (a table of its own that is valid)."""
  counts, hits = sum(table["counts"]), sum(table["hits"])
  return {**table, "num_bins": 1, "edges": [], "counts": [counts], "hits": [hits]}


def _moved(table: dict) -> dict:
  """Ten examples (none correct) of bin 0 counted in bin 1: fewer points up to the first
  edge than its rank, which no tie makes (more could be: points tied with the edge)."""
  counts, hits = list(table["counts"]), list(table["hits"])
  take = min(10, counts[0] - hits[0])
  counts[0], counts[1] = counts[0] - take, counts[1] + take
  return {**table, "counts": counts, "hits": hits}


def _options(options: dict):
  return lambda saved: {**json.loads(json.dumps(saved)), "options": options}


# A calibrator file whose parts disagree had loaded and predicted other numbers: one bin
# edge removed changed 40 of 200 predictions. Each is what binning.fit (or toplabel.fit)
# cannot have made, every field valid on its own.
_INCONSISTENT = {
  "bins, an edge removed": (
    "bins",
    _field("edges", lambda e: e[:5] + e[6:]),
    "10 edges make 11 bins, but bin 11 holds",
  ),
  "bins, the last edge removed": (
    "bins",
    _field("edges", lambda e: e[:-1]),
    "10 edges make 11 bins, but bin 11 holds",
  ),
  "bins, examples moved between bins": ("bins", _changed_state(_moved), "do not split 600"),
  "bins, an empty bin": ("bins", _changed_state(lambda t: _merged(t, 3)), "do not split 600"),
  "bins, a prior off the counts": (
    "bins",
    _field("prior", lambda p: p / 2),
    "field 'prior' is .*, not the accuracy",
  ),
  "toplabel, an edge removed": (
    "toplabel",
    _class(1, lambda t: {**t, "edges": t["edges"][1:]}),
    r"\(class 1\): not bins toplabel.fit makes: .* edges make",
  ),
  "toplabel, examples moved between bins": (
    "toplabel",
    _class(2, _moved),
    r"\(class 2\): not bins toplabel.fit makes: the counts",
  ),
  "toplabel, bins no points_per_bin gives": (
    "toplabel",
    _class(3, _one_bin),
    "the classes' bin counts fit no points_per_bin",
  ),
  "toplabel, one class": (
    "toplabel",
    _field("classes", lambda c: c[:1]),
    r"one per class \(2 or more\)",
  ),
  "isotonic, prob out of order": (
    "isotonic",
    _field("prob", lambda p: [p[-1], *p[1:-1], p[0]]),
    "must be monotone",
  ),
  "isotonic, a prior off the counts": (
    "isotonic",
    _field("prior", lambda p: 1 - p),
    "field 'prior' is .*, not the accuracy",
  ),
  "isotonic, an empty block": (
    "isotonic",
    _changed_state(
      lambda t: _merged(t, 0) | {"counts": [0, *t["counts"][1:]], "hits": [0, *t["hits"][1:]]}
    ),
    "one or more examples per block",
  ),  # fmt: skip
  "kde, options bandwidth 'x'": (
    "kde",
    _options({"bandwidth": "x"}),
    "bandwidth: expected a positive number or None, got 'x'",
  ),
  "kde, options bandwidth -1": (
    "kde",
    _options({"bandwidth": -1}),
    "bandwidth: expected a positive number or None, got -1",
  ),
  "toplabel, options points_per_bin 0": (
    "toplabel",
    _options({"points_per_bin": 0}),
    "points_per_bin: expected at least 1, got 0",
  ),
}


@pytest.mark.parametrize("case", sorted(_INCONSISTENT))
def test_a_calibrator_file_whose_parts_disagree_is_refused(tmp_path, case):
  method, change, message = _INCONSISTENT[case]
  options = {"points_per_bin": 20} if method == "toplabel" else {}
  saved = _fitted(method, n_bins=12, **options)
  assert Calibrator.from_dict(saved, "saved.json")  # the file as saved loads
  text = _refused(lambda: _load(tmp_path, change(saved)), message)
  assert text.startswith(f"{tmp_path / 'cal.json'}")  # ": ", or " (class k): " first


def test_top_label_bins_of_fewer_classes_than_the_calibrator_are_refused():
  # A top-label file with the bins of 3 classes of 4 had loaded (the lead's Calibrator
  # calls this check on load: base.check_classes).
  state = _fitted("toplabel", points_per_bin=60)
  fitted = registry.lookup("toplabel").from_dict(state["state"], "saved.json")
  base.check_classes(fitted, 4, "saved.json")
  fewer = registry.lookup("toplabel").from_dict(
    _field("classes", lambda c: c[:3])(state)["state"], "saved.json"
  )
  _refused(
    lambda: base.check_classes(fewer, 4, "saved.json"),
    "^saved.json: field 'state' holds bins of 3 classes, field 'num_classes' is 4",
  )
  base.check_classes(registry.lookup("bins").from_dict(_fitted("bins")["state"], "s"), 4, "s")


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
    ("kde", "prob", True, r"field 'prob' must hold numbers, got a boolean \(true\)"),
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


# ----------------------------------------------------------------------------
# Predictions files


def _predictions(tmp_path, num=400, samples=3):
  rng = np.random.default_rng(4)
  labels = rng.integers(0, 4, num)
  logits = (5 * rng.normal(size=(samples, num, 4))).astype(np.float32)
  scores = {"given": rng.random(num).astype(np.float32)}
  value = predictions.Predictions(labels=labels, logits=logits, scores=scores)
  return predictions.save_predictions(tmp_path / "p.npz", value), value


def _data_offset(path, member: str) -> int:
  """Where the data of a stored member starts in the archive (after its .npy header)."""
  with zipfile.ZipFile(path) as archive:
    info = archive.getinfo(member)
    with archive.open(info) as file:
      prediction_checks.npy_header(file)
      header = file.tell()
  with open(path, "rb") as file:
    file.seek(info.header_offset + 26)
    name, extra = struct.unpack("<2H", file.read(4))
  return info.header_offset + 30 + name + extra + header


def _flip(path, offset: int, mask: int = 0x01, value: bytes | None = None) -> None:
  """XORs the byte at ``offset`` with ``mask``, or writes ``value`` there."""
  data = bytearray(path.read_bytes())
  if value is None:
    data[offset] ^= mask
  else:
    data[offset : offset + len(value)] = value
  path.write_bytes(bytes(data))


def _rewritten(path, out, replace=None, add=(), compression=zipfile.ZIP_STORED):
  """The archive at ``path`` written again to ``out``: members' bytes replaced by
  ``replace`` (name -> bytes), more members ``add`` ((name, bytes)) at the end."""
  with zipfile.ZipFile(path) as archive:
    members = [(name, archive.read(name)) for name in archive.namelist()]
  with zipfile.ZipFile(out, "w", compression) as archive, warnings.catch_warnings():
    warnings.simplefilter("ignore")  # zipfile warns of a name given twice: the point here
    for name, data in [*members, *add]:
      archive.writestr(name, (replace or {}).get(name, data))
  return out


def _npy(array: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  np.save(buffer, array)
  return buffer.getvalue()


def _read_all(path) -> list[int]:
  """The starts of the chunks the streaming reader yields before it stops."""
  seen = []
  with stream.PredictionsReader(path) as reader:
    for start, _ in reader.chunks(250):
      seen.append(start)
  return seen


@pytest.mark.parametrize("length", [0, 1, 7, 4096, 123457])
def test_crc32_of_two_ranges_combines_as_zlibs_of_the_whole(length):
  rng = np.random.default_rng(length)
  first, second = rng.bytes(100), rng.bytes(length)
  joined = zip_crc.combine(zlib.crc32(first), zlib.crc32(second), zip_crc.zeros_operator(length))
  assert joined == zlib.crc32(first + second)


# N = 2000: every member is larger than the 4 kB zipfile reads with a member's header
# (and then checks the CRC-32 of, when that is the whole member).
@pytest.mark.parametrize(
  "member, where",
  [
    ("logits.npy", lambda n: 4 * 4 * (n + 10)),  # sample 1, example 10: an early chunk
    ("logits.npy", lambda n: 3 * 4 * n * 4 - 3),  # the last sample's last example
    ("score_given.npy", lambda n: 4 * 123),
  ],
)
def test_the_streaming_reader_checks_each_members_crc(tmp_path, member, where):
  # A flipped low bit of a float32 stays finite: the reader and top1-evaluate had read
  # it (-15.03 as -4.4e-38 for a flipped high bit) and exited 0.
  path, _ = _predictions(tmp_path, num=2000)
  assert _read_all(path) == list(range(0, 2000, 250))
  _flip(path, _data_offset(path, member) + where(2000))
  _refused(lambda: predictions.load_predictions(path), "Bad CRC-32", path)
  with stream.PredictionsReader(path) as reader:
    seen = []
    message = f"field '{member[:-4]}': Bad CRC-32 .the zip directory says"
    _refused(lambda: seen.extend(start for start, _ in reader.chunks(250)), message, path)
    assert seen == list(range(0, 1750, 250))  # the last chunk is never yielded
  # The sweep reads every chunk (load_sources) before it writes anything: it stops here.
  settings = types.SimpleNamespace(topk=(1,), seeds=(0,))
  _refused(lambda: sources.load_sources([("model", path)], settings), "Bad CRC-32", path)


def test_a_corrupt_value_refused_early_is_named_a_bad_crc(tmp_path):
  path, _ = _predictions(tmp_path, num=2000)
  _flip(path, _data_offset(path, "logits.npy") + 4 * 4 * 30, value=struct.pack("<f", np.nan))
  # Example 30 is in the first chunk: refused there, as corrupt rather than as a NaN.
  _refused(lambda: _read_all(path), "field 'logits': Bad CRC-32", path)


def test_the_labels_crc_is_checked_when_the_reader_opens(tmp_path):
  path, _ = _predictions(tmp_path, num=2000)
  _flip(path, _data_offset(path, "labels.npy") + 8 * 7, 0x01)  # label 0 <-> 1: in range
  _refused(lambda: stream.PredictionsReader(path), "field 'labels': Bad CRC-32", path)
  (tmp_path / "small").mkdir()
  small, _ = _predictions(tmp_path / "small")
  _flip(small, _data_offset(small, "labels.npy") + 8 * 7, 0x01)  # zipfile checks 4 kB
  _refused(lambda: stream.PredictionsReader(small), "field 'labels' cannot be read .Bad CRC-32")


def test_a_field_stored_twice_is_refused(tmp_path):
  # zip readers had let the last labels.npy win.
  path, value = _predictions(tmp_path)
  twice = _rewritten(path, tmp_path / "twice.npz", add=[("labels.npy", _npy(value.labels[::-1]))])
  message = "field 'labels' is stored 2 times .labels.npy, labels.npy.; a predictions file"
  _refused(lambda: predictions.load_predictions(twice), message, twice)
  _refused(lambda: stream.PredictionsReader(twice), message, twice)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
@pytest.mark.parametrize("member", ["labels.npy", "logits.npy"])
def test_a_header_that_declares_more_than_its_member_holds_is_refused(
  tmp_path, compression, member
):
  # Had been "MemoryError: Unable to allocate 3.64 TiB" or "truncated array data
  # ((2000000000,) int32)", naming neither file nor field.
  path, _ = _predictions(tmp_path)
  header = io.BytesIO()
  declared = {"descr": "<i4", "fortran_order": False, "shape": (2000000000,)}
  np.lib.format.write_array_header_1_0(header, declared)
  bomb = _rewritten(
    path, tmp_path / "bomb.npz", {member: header.getvalue() + bytes(16)}, (), compression
  )
  message = (
    f"field '{member[:-4]}': its .npy header declares shape .2000000000,. int32 .8000000000"
    " bytes., the member holds 16 bytes of data"
  )
  _refused(lambda: predictions.load_predictions(bomb), message, bomb)
  _refused(lambda: stream.PredictionsReader(bomb), message, bomb)


def test_a_zip_bomb_is_refused_by_the_whole_file_loader_and_streamed(tmp_path, monkeypatch):
  # The 2.5 MB zip of 2.56 GB of zeros had peaked at 3.2 GB RSS in load_predictions.
  monkeypatch.setattr(prediction_checks, "MAX_INFLATED_BYTES", 1 << 20)
  num = 1 << 16
  value = predictions.Predictions(
    labels=np.zeros(num, int), logits=np.zeros((1, num, 4), np.float32)
  )
  path = predictions.save_predictions(tmp_path / "zeros.npz", value, compress=True)
  message = "field 'logits': [0-9]+ compressed bytes declare 1048704 inflated .over 1 MiB and 20x"
  _refused(lambda: predictions.load_predictions(path), message, path)
  with stream.PredictionsReader(path) as reader:
    assert sum(chunk.num_examples for _, chunk in reader.chunks(4096)) == num
  monkeypatch.setattr(prediction_checks, "MAX_INFLATED_BYTES", 1 << 30)
  assert predictions.load_predictions(path).num_examples == num


def test_a_path_that_is_none_a_number_or_a_directory_is_one_line(tmp_path):
  # Had been os.fspath's TypeError, and an IsADirectoryError naming the temporary file.
  for bad in (None, 123):
    _refused(lambda bad=bad: predictions.load_predictions(bad), "^path: expected a file path")
    _refused(lambda bad=bad: stream.PredictionsReader(bad), "^path: expected a file path")
  _, value = _predictions(tmp_path)
  message = "is a directory; give the path of a file to write there"
  _refused(lambda: predictions.save_predictions(tmp_path, value), message, tmp_path)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz"]
