"""Memory and hangs: what a hostile file or argument would make the library allocate or
wait for, bounded, and refused in one line naming it.

Peak memory is measured with ``tracemalloc`` (NumPy and Python buffers are traced), on
files whose payload is far larger than the bound asserted, so a reader that inflates or
allocates what the file declares fails the test without the machine filling up.
"""

import gzip
import io
import struct
import tracemalloc
import zipfile
import zlib

import io_testing
import numpy as np
import pytest

from top1_jax import Calibrator
from top1_jax.core import binning, validation
from top1_jax.io import datasets, idx, stream

_MIB = 1 << 20


def _peak_bytes(call):
  """(call()'s value or the exception it raised, the peak of traced memory meanwhile)."""
  tracemalloc.start()
  try:
    try:
      outcome = call()
    except Exception as e:  # noqa: BLE001 -- handed to the test
      outcome = e
    return outcome, tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


def _gzip_bomb(prefix: bytes, zeros: int) -> bytes:
  """A gzip stream of ``prefix`` then ``zeros`` zero bytes, compressed a block at a time
  (the test never holds the inflated bytes)."""
  packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
  parts, block = [packer.compress(prefix)], bytes(_MIB)
  for _ in range(zeros // _MIB):
    parts.append(packer.compress(block))
  return b"".join(parts) + packer.flush()


def _idx_header(*shape: int) -> bytes:
  return bytes([0, 0, 0x08, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)


def test_a_gzip_bomb_as_an_idx_file_is_refused_after_the_bytes_its_header_declares(
  tmp_path, no_system_fmnist
):
  # 3.2 MB of gzip inflating to 3.5 GB had been inflated whole (read_idx and data_dir).
  labels = _gzip_bomb(_idx_header(10) + bytes(range(10)), 256 * _MIB)
  images = gzip.compress(_idx_header(10, 28, 28) + bytes(10 * 28 * 28))
  (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(labels)
  (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(images)
  for read in (
    lambda: idx.read_idx(tmp_path / "t10k-labels-idx1-ubyte.gz"),
    lambda: datasets.load_dataset("fashion_mnist", "test", data_dir=tmp_path),
  ):
    error, peak = _peak_bytes(read)
    assert isinstance(error, ValueError), error
    text = io_testing.assert_one_clean_line(error)
    assert text.startswith(f"{tmp_path / 't10k-labels-idx1-ubyte.gz'}: has trailing bytes")
    assert peak < 4 * _MIB, peak  # the 256 MiB it inflates to were never held


def test_an_idx_header_declaring_more_than_the_cap_is_refused_before_allocating(tmp_path):
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(_idx_header(60000, 28, 28 * 1000) + bytes(100))
  error, peak = _peak_bytes(lambda: idx.read_idx(path))
  assert str(error) == (
    f"{path}: header says shape (60000, 28, 28000) (47040000000 data bytes), over the"
    f" {idx.MAX_IDX_BYTES} an IDX file may hold (idx.MAX_IDX_BYTES); not read"
  )
  assert peak < _MIB


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_an_idx_file_that_is_not_a_regular_file_is_refused(tmp_path, kind):
  # A FIFO had hung the IDX reader; a link to /dev/zero had been read without end.
  path = io_testing.not_regular_files(tmp_path)[kind]
  for read in (idx.read_idx, idx.read_idx_shape):
    error = io_testing.returns_without_a_writer(lambda read=read: read(path), tmp_path / "fifo")
    assert isinstance(error, ValueError), error
    assert io_testing.assert_one_clean_line(error).startswith(f"{path}: a {kind}")


def test_calibrator_load_of_a_fifo_is_refused_not_waited_on(tmp_path):
  path = io_testing.not_regular_files(tmp_path)["FIFO"]
  error = io_testing.returns_without_a_writer(lambda: Calibrator.load(path), path)
  assert isinstance(error, ValueError), error
  assert str(error) == f"{path}: a FIFO (named pipe), not a regular file; give the path of a file"


def test_a_bin_count_over_the_cap_is_refused_before_allocating():
  # quantile_edge_ranks(10**6, 10**9) had allocated 3 GB of ranks.
  for call in (
    lambda: binning.quantile_edge_ranks(10**6, 10**9),
    lambda: binning.quantile_edge_ranks(10**12, binning.MAX_BINS + 1),
  ):
    error, peak = _peak_bytes(call)
    assert isinstance(error, ValueError) and f"at most {binning.MAX_BINS}" in str(error)
    assert peak < _MIB


def test_the_streaming_reader_holds_a_chunk_of_a_zip_bomb_not_the_bomb(tmp_path):
  # 256 MiB of zero logits in a 0.3 MB member: inflated into a temporary file (its declared
  # size, no more), then read a chunk at a time. evaluate's working memory beyond the
  # reader (the [N, K] log-probabilities it keeps) is the engine's, not measured here.
  num, classes = 1 << 20, 64
  path = tmp_path / "bomb.npz"
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
    with archive.open("logits.npy", "w") as member:
      header = {"descr": "<f4", "fortran_order": False, "shape": (1, num, classes)}
      np.lib.format.write_array_header_1_0(member, header)
      for _ in range(num * classes * 4 // _MIB):
        member.write(bytes(_MIB))
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(num, np.int32))
    archive.writestr("labels.npy", buffer.getvalue())
  assert path.stat().st_size < _MIB

  def read():
    with stream.PredictionsReader(path) as reader:
      return sum(chunk.num_examples for _, chunk in reader.chunks(1 << 16))

  count, peak = _peak_bytes(read)
  assert count == num
  assert peak < 64 * _MIB, peak  # 16 MiB chunks and the copy's blocks, not 256 MiB


def test_an_event_file_that_is_a_fifo_is_refused(tmp_path):
  pytest.importorskip("tensorboardX")
  from top1_jax.io import metric_writer

  fifo = io_testing.not_regular_files(tmp_path / "kinds")["FIFO"]
  logdir = tmp_path / "tensorboard"
  logdir.mkdir()
  events = logdir / "events.out.tfevents.1.host"
  fifo.rename(events)
  error = io_testing.returns_without_a_writer(lambda: metric_writer.read_scalars(logdir), events)
  assert isinstance(error, ValueError), error
  assert str(error).startswith(f"{events}: a FIFO (named pipe), not a regular file")


def test_a_fifo_named_as_an_idx_file_in_data_dir_is_refused_not_passed_over(
  tmp_path, no_system_fmnist
):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  labels = data_dir / "t10k-labels-idx1-ubyte"
  io_testing.not_regular_files(tmp_path / "kinds")["FIFO"].rename(labels)
  (data_dir / "t10k-images-idx3-ubyte").write_bytes(_idx_header(1, 2, 2) + bytes(4))
  for read in (
    lambda: datasets.load_dataset("fashion_mnist", "test", data_dir=data_dir, fallback=False),
    lambda: datasets.split_info("fashion_mnist", "test", data_dir=data_dir, fallback=False),
  ):
    error = io_testing.returns_without_a_writer(read, labels)
    assert isinstance(error, ValueError), error
    assert str(error).startswith(f"{labels}: a FIFO (named pipe), not a regular file")


def test_the_finiteness_check_of_a_host_array_holds_a_block_not_an_array_of_its_size():
  """np.isfinite(x).all() would hold a bool array of x's size (300 MB for [3M, 100]
  logits, the prediction sets' check); the check reads a block of rows at a time."""
  logits = np.zeros((8000, 1000), np.float32)  # 32 MB: a whole-array bool is 8 MB
  outcome, peak = _peak_bytes(lambda: validation.check_finite("logits", logits))
  assert outcome is None and peak < 2 * _MIB
  logits[7999, 999] = np.nan  # the last block is read too
  outcome, _ = _peak_bytes(lambda: validation.check_finite("logits", logits))
  assert isinstance(outcome, ValueError) and "logits: 1 non-finite value" in str(outcome)
