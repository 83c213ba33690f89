"""TensorBoard event files: io.metric_writer's writer and its TFRecord reader."""

import logging
import os
import struct
import sys

import numpy as np
import pytest

from top1_jax.io import metric_writer

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2  # noqa: E402
from tensorboardX.record_writer import RecordWriter, masked_crc32c  # noqa: E402


def _f32(value: float) -> float:
  return float(np.float32(value))


def _write(logdir, steps, scale=1.0):
  with metric_writer.MetricWriter(logdir) as writer:
    for step in steps:
      writer.write_scalars(step, {"train/loss": scale / (step + 1), "lr": 0.1 * scale})
  return writer.path


def _record_ends(data: bytes) -> list[int]:
  """The byte offset where each TFRecord of ``data`` ends."""
  ends, start = [], 0
  while start < len(data):
    (length,) = struct.unpack("<Q", data[start : start + 8])
    start += 12 + length + 4
    ends.append(start)
  return ends


def test_written_scalars_read_back_equal(tmp_path, caplog):
  values = {"train/loss": 0.3125, "test/accuracy": 0.9171, "examples_per_second": 1234.5}
  with caplog.at_level(logging.INFO, logger="absl"):
    with metric_writer.MetricWriter(tmp_path / "tb") as writer:
      writer.write_scalars(0, {"train/loss": 2.5})
      writer.write_scalars(np.int64(7), {k: np.float32(v) for k, v in values.items()})
      writer.write_scalars(3, {"train/loss": np.array(1.0)})
  curves = metric_writer.read_scalars(tmp_path / "tb")
  assert list(curves) == sorted(values)
  assert curves["train/loss"] == [(0, 2.5), (3, 1.0), (7, _f32(0.3125))]
  assert curves["test/accuracy"] == [(7, _f32(0.9171))]
  assert curves["examples_per_second"] == [(7, _f32(1234.5))]
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  assert lines[0] == "step 0: train/loss=2.5" and len(lines) == 3
  assert "test/accuracy=0.9171" in lines[1]


def test_two_writers_and_a_resumed_run_read_back_in_step_order(tmp_path):
  first = metric_writer.MetricWriter(tmp_path)
  second = metric_writer.MetricWriter(tmp_path)  # another process's, open at once
  for step in range(5):
    first.write_scalars(step, {"a": step})
    second.write_scalars(step, {"b": -step})
  first.close()
  second.close()
  # A run killed after step 4 resumes from its checkpoint at step 3 with new values.
  _write(tmp_path, range(3, 7), scale=2.0)
  assert len(os.listdir(tmp_path)) == 3 and first.path != second.path
  curves = metric_writer.read_scalars(tmp_path)
  assert curves["a"] == [(s, float(s)) for s in range(5)]
  assert curves["b"] == [(s, float(-s)) for s in range(5)]
  assert [s for s, _ in curves["train/loss"]] == [3, 4, 5, 6]
  assert curves["lr"] == [(s, _f32(0.2)) for s in range(3, 7)]


def test_disabled_writer_writes_nothing_and_still_logs(tmp_path, caplog, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # not even needed
  with caplog.at_level(logging.INFO, logger="absl"):
    with metric_writer.MetricWriter(tmp_path / "tb", enabled=False) as writer:
      writer.write_scalars(1, {"loss": 0.5})
      writer.flush()
  assert not (tmp_path / "tb").exists() and writer.path is None
  assert any(r.getMessage() == "step 1: loss=0.5" for r in caplog.records)


def test_an_empty_folder_reads_empty_and_a_file_is_refused(tmp_path):
  assert metric_writer.read_scalars(tmp_path) == {}
  (tmp_path / "notes.txt").write_text("not events")
  assert metric_writer.read_scalars(tmp_path) == {}
  with pytest.raises(ValueError, match="logdir: expected a folder of event files"):
    metric_writer.read_scalars(tmp_path / "notes.txt")


def test_truncated_tail_is_skipped_at_every_cut(tmp_path):
  path = _write(tmp_path / "full", range(3))
  data = open(path, "rb").read()
  ends = _record_ends(data)
  assert len(ends) == 4 and ends[-1] == len(data)  # the file_version event + 3 steps
  # Every cut inside the last record: its header, its data, its footer.
  for cut in range(ends[2] + 1, ends[3]):
    with open(path, "wb") as stream:
      stream.write(data[:cut])
    assert metric_writer.read_scalars(tmp_path / "full")["train/loss"] == [(0, 1.0), (1, 0.5)]


@pytest.mark.parametrize("where", ["length", "data", "footer"])
def test_a_bad_crc_mid_file_is_refused(tmp_path, where):
  path = _write(tmp_path, range(4))
  data = bytearray(open(path, "rb").read())
  start = _record_ends(bytes(data))[1]  # the second step's record, mid-file
  offset = {"length": start + 2, "data": start + 20, "footer": _record_ends(bytes(data))[2] - 1}
  data[offset[where]] ^= 0x10
  open(path, "wb").write(bytes(data))
  with pytest.raises(ValueError, match=r"record 2: corrupt .*CRC32C mismatch") as raised:
    metric_writer.read_scalars(tmp_path)
  assert "\n" not in str(raised.value) and os.path.basename(path) in str(raised.value)


def test_a_huge_length_is_refused_before_reading(tmp_path):
  length = struct.pack("<Q", 1 << 40)
  header = length + struct.pack("<I", masked_crc32c(length))
  (tmp_path / "events.out.tfevents.0.host").write_bytes(header + b"\0" * 64)
  with pytest.raises(ValueError, match=r"record 0: expected at most 67108864 bytes, got 1099"):
    metric_writer.read_scalars(tmp_path)


def test_a_record_that_is_not_an_event_is_refused(tmp_path):
  writer = RecordWriter(str(tmp_path / "events.out.tfevents.0.host"))
  writer.write(b"\xff\xff\xff not a protobuf")
  writer.close()
  with pytest.raises(ValueError, match="record 0: not a TensorBoard Event"):
    metric_writer.read_scalars(tmp_path)


def test_tensorflow_2_tensor_scalars_are_read_and_images_skipped(tmp_path):
  writer = RecordWriter(str(tmp_path / "events.out.tfevents.0.host"))
  scalars = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
  )
  as_content = tensor_pb2.TensorProto(dtype=1, tensor_content=np.float32(0.75).tobytes())
  as_double = tensor_pb2.TensorProto(dtype=2, double_val=[0.125])
  image = summary_pb2.Summary.Value(tag="image", image=summary_pb2.Summary.Image(height=1))
  for step, tensor in ((2, as_content), (1, as_double)):
    value = summary_pb2.Summary.Value(tag="loss", tensor=tensor, metadata=scalars)
    event = event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[value, image]))
    writer.write(event.SerializeToString())
  writer.close()
  assert metric_writer.read_scalars(tmp_path) == {"loss": [(1, 0.125), (2, 0.75)]}


def test_tensorboard_reads_the_same_curves(tmp_path):
  accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  _write(tmp_path, [0, 5, 10, 15])
  official = accumulator.EventAccumulator(str(tmp_path))
  official.Reload()
  ours = metric_writer.read_scalars(tmp_path)
  assert sorted(official.Tags()["scalars"]) == sorted(ours)
  for tag, curve in ours.items():
    assert [(e.step, e.value) for e in official.Scalars(tag)] == curve


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda w: w.write_scalars(-1, {"a": 1.0}), "step: expected an int >= 0, got -1"),
    (lambda w: w.write_scalars(True, {"a": 1.0}), "step: expected an int >= 0, got True"),
    (lambda w: w.write_scalars(1, [("a", 1.0)]), "scalars: expected a mapping"),
    (lambda w: w.write_scalars(1, {"train loss": 1.0}), "scalars: expected tags of letters"),
    (lambda w: w.write_scalars(1, {"/a": 1.0}), "scalars: expected tags of letters"),
    (lambda w: w.write_scalars(1, {"a": [1.0, 2.0]}), "scalars['a']: expected one real number"),
    (lambda w: w.write_scalars(1, {"a": "high"}), "scalars['a']: expected one real number"),
  ],
)
def test_bad_scalars_are_one_line_errors(tmp_path, call, message):
  with metric_writer.MetricWriter(tmp_path) as writer:
    with pytest.raises(ValueError) as raised:
      call(writer)
  assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
  with pytest.raises(ValueError, match="write_scalars: the MetricWriter of .* is closed"):
    writer.write_scalars(1, {"a": 1.0})


def test_bad_logdirs_and_a_missing_tensorboardx(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match="logdir: expected a folder"):
    metric_writer.MetricWriter(None)
  with pytest.raises(ValueError, match="logdir: expected a folder"):
    metric_writer.read_scalars("")
  with pytest.raises(ValueError, match="logdir: expected a local folder, gs:// or s3://"):
    metric_writer.MetricWriter("http://example.com/tb")
  monkeypatch.setitem(sys.modules, "tensorboardX", None)
  for call in (
    lambda: metric_writer.MetricWriter(tmp_path),
    lambda: metric_writer.read_scalars(tmp_path),
  ):
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'top1_jax\[nn\]'") as raised:
      call()
    assert raised.value.name == "tensorboardX" and "\n" not in str(raised.value)
