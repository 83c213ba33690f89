"""Training curves as TensorBoard event files (through tensorboardX, imported only when used),
written to a local folder, ``gs://`` or ``s3://``, and read back from any ``epath``."""

import contextlib
import itertools
import os
import re
import secrets
import struct
import time
from collections.abc import Iterator, Mapping

import numpy as np
from absl import logging

from top1_jax.io import files

INSTALL_TENSORBOARDX = (
  "pip install 'top1_jax[nn]' (from a clone: pip install '.[nn]'), or pip install tensorboardX"
)
MAX_RECORD_BYTES = 64 << 20
"""The longest record read: a longer length is refused before any allocation."""
FLUSH_SECONDS = 30.0
"""The longest time written events wait in the file buffer (a killed run loses them)."""
TAG_PATTERN = re.compile(r"[\w.\-][\w.\-/]*")
"""The tags TensorBoard keeps as written (tensorboardX renames others)."""
WRITER_SCHEMES = ("gs", "s3")

_HEADER = struct.Struct("<QI")  # length, masked CRC32C of the length's 8 bytes
_FOOTER = struct.Struct("<I")  # masked CRC32C of the data
_FLOAT_TYPES = {1: np.float32, 2: np.float64}  # DT_FLOAT, DT_DOUBLE: tensorflow's types.proto


def _import_tensorboardx():
  try:
    from tensorboardX import event_file_writer, record_writer
    from tensorboardX.proto import event_pb2, summary_pb2
  except ImportError as e:
    raise ModuleNotFoundError(
      f"TensorBoard event files need tensorboardX ({e}): {INSTALL_TENSORBOARDX}",
      name="tensorboardX",
    ) from None
  return event_file_writer, record_writer, event_pb2, summary_pb2


def _check_path(logdir) -> str:
  if not isinstance(logdir, (str, os.PathLike)) or not os.fspath(logdir):
    raise ValueError(f"logdir: expected a folder (str or os.PathLike), got {logdir!r:.80}")
  return os.fspath(logdir)


def _check_scalars(step, scalars) -> tuple[int, dict[str, float]]:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"step: expected an int >= 0, got {step!r}")
  if not isinstance(scalars, Mapping):
    raise ValueError(f"scalars: expected a mapping of tag to number, got {type(scalars).__name__}")
  checked = {}
  for tag, value in scalars.items():
    if not isinstance(tag, str) or not TAG_PATTERN.fullmatch(tag):
      raise ValueError(
        f"scalars: expected tags of letters, digits, '_', '-', '.', '/' (not first), got {tag!r}"
      )
    array = np.asarray(value)
    if array.size != 1 or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
      raise ValueError(
        f"scalars[{tag!r}]: expected one real number, got {array.dtype} shape {array.shape}"
      )
    checked[tag] = float(array.reshape(()))
  return int(step), checked


class MetricWriter(contextlib.AbstractContextManager):
  """Scalars per step to a TensorBoard event file and the absl log.

  Writes are synchronous, so ``flush()`` means on disk; the file is also flushed every
  ``FLUSH_SECONDS``. Each writer's file name has the time, host, process id and a random
  token, so two writers in one ``logdir`` never overwrite each other. Use as a context
  manager, or call ``close()``.

  Args:
    logdir: the folder of the event files (created when missing).
    enabled: False writes no file and creates no folder (processes other than the
      writer); still logs.

  Raises:
    ValueError: ``logdir`` is not a path, or a URL other than gs:// and s3://.
    ModuleNotFoundError: tensorboardX is missing (one line naming the extra).
  """

  def __init__(self, logdir, *, enabled: bool = True):
    self.logdir = _check_path(logdir)
    if not files.is_local(self.logdir) and self.logdir.split("://", 1)[0] not in WRITER_SCHEMES:
      raise ValueError(f"logdir: expected a local folder, gs:// or s3://, got {self.logdir!r}")
    self.enabled = bool(enabled)
    self._events, self._closed, self._last_flush = None, False, time.monotonic()
    if self.enabled:
      event_file_writer, record_writer, self._event_pb2, self._summary_pb2 = _import_tensorboardx()
      record_writer.directory_check(self.logdir)
      suffix = f".{os.getpid()}.{secrets.token_hex(4)}"
      self._events = event_file_writer.EventsWriter(
        os.path.join(self.logdir, "events"), filename_suffix=suffix
      )

  @property
  def path(self) -> str | None:
    """This writer's event file (None when disabled)."""
    # EventsWriter makes the name (time, host, our suffix) and keeps it only here.
    return self._events._file_name if self._events is not None else None

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """Writes ``scalars`` (tag -> a number or one-element array) at ``step`` as float32,
    and logs them in one line; an empty mapping writes and logs nothing.

    Raises:
      ValueError: ``step`` not an int >= 0, a tag TensorBoard would rename, a value
        that is not one real number, or a closed writer.
    """
    if self._closed:
      raise ValueError(f"write_scalars: the MetricWriter of {self.logdir} is closed")
    step, checked = _check_scalars(step, scalars)
    if not checked:
      return
    logging.info("step %d: %s", step, ", ".join(f"{t}={v:.6g}" for t, v in checked.items()))
    if self._events is None:
      return
    values = [self._summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in checked.items()]
    summary = self._summary_pb2.Summary(value=values)
    event = self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
    self._events.write_event(event)
    if time.monotonic() - self._last_flush > FLUSH_SECONDS:
      self.flush()

  def flush(self) -> None:
    """Puts every written event on disk (file flushed and fsynced)."""
    if self._events is not None and not self._closed:
      self._events.flush()
    self._last_flush = time.monotonic()

  def close(self) -> None:
    """Flushes and closes the file; later calls do nothing."""
    if self._events is not None and not self._closed:
      self._events.close()
    self._closed = True

  def __exit__(self, *exc_info) -> None:
    self.close()


def _records(path, masked_crc32c) -> Iterator[bytes]:
  """The data of each whole TFRecord of ``path``; a truncated last record ends it."""
  with files.open_regular(path) as stream:  # not a FIFO or a device
    for index in itertools.count():
      header = stream.read(_HEADER.size)
      if len(header) < _HEADER.size:
        return
      length, length_crc = _HEADER.unpack(header)
      if masked_crc32c(header[:8]) != length_crc:
        raise ValueError(f"{path}: record {index}: corrupt length (CRC32C mismatch)")
      if length > MAX_RECORD_BYTES:
        raise ValueError(
          f"{path}: record {index}: expected at most {MAX_RECORD_BYTES} bytes, got {length}"
        )
      data = stream.read(length)
      footer = stream.read(_FOOTER.size)
      if len(data) < length or len(footer) < _FOOTER.size:
        return
      if masked_crc32c(data) != _FOOTER.unpack(footer)[0]:
        raise ValueError(f"{path}: record {index}: corrupt data (CRC32C mismatch)")
      yield data


def _scalar_value(value) -> float | None:
  """A ``Summary.Value``'s scalar, or None for images, histograms and other tensors."""
  kind = value.WhichOneof("value")
  if kind == "simple_value":
    return float(value.simple_value)
  if kind != "tensor" or value.metadata.plugin_data.plugin_name != "scalars":
    return None
  tensor = value.tensor
  dtype = _FLOAT_TYPES.get(tensor.dtype)
  if dtype is None:
    return None
  if tensor.tensor_content:
    numbers = np.frombuffer(tensor.tensor_content, dtype=np.dtype(dtype).newbyteorder("<"))
  else:
    numbers = np.asarray(tensor.float_val if dtype is np.float32 else tensor.double_val, dtype)
  return float(numbers[0]) if numbers.size == 1 else None


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """Every scalar tag (``simple_value``s and ``scalars``-plugin tensors) of the event files
  in ``logdir``, not its subfolders: ``{tag: [(step, value), ...]}`` in step order, tags
  sorted ({} without event files). A truncated last record (a run killed mid-write) ends
  its file quietly; of two values of one tag and step (a resumed run) the latest written
  wins (by wall time, then file name, then place in the file).

  Raises:
    ValueError: ``logdir`` is not a folder, a CRC mismatch, an oversized record, or a
      record that is not an ``Event`` (one line naming the file and record).
    ModuleNotFoundError: tensorboardX is missing (one line naming the extra).
  """
  _, record_writer, event_pb2, _ = _import_tensorboardx()
  from google.protobuf import message  # installed with tensorboardX

  folder = files.as_path(_check_path(logdir))
  if not folder.is_dir():
    raise ValueError(f"logdir: expected a folder of event files, got {os.fspath(logdir)!r}")
  paths = sorted(p for p in folder.iterdir() if "tfevents" in p.name and not p.is_dir())
  latest: dict[tuple[str, int], tuple[tuple[float, int, int], float]] = {}
  for rank, path in enumerate(paths):
    for index, data in enumerate(_records(path, record_writer.masked_crc32c)):
      try:
        event = event_pb2.Event.FromString(data)
      except message.DecodeError:
        raise ValueError(f"{path}: record {index}: not a TensorBoard Event") from None
      order = (event.wall_time, rank, index)
      for value in event.summary.value:
        number = _scalar_value(value)
        key = (value.tag, int(event.step))
        if number is not None and (key not in latest or latest[key][0] <= order):
          latest[key] = (order, number)
  curves: dict[str, list[tuple[int, float]]] = {}
  for tag, step in sorted(latest):
    curves.setdefault(tag, []).append((step, latest[tag, step][1]))
  return curves
