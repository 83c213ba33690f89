"""The CRC-32 of a zip member read in pieces out of byte order (``stream.PredictionsReader``):
one CRC-32 per sample of [S, N, K], joined as zlib's ``crc32_combine`` (not in Python) does.
crc32(a + b) is crc32(a) run over len(b) zero bytes, a GF(2) 32 x 32 matrix, XOR crc32(b).
"""

import zlib


def _times(matrix: list[int], vector: int) -> int:
  """``matrix`` (column i: the image of bit i) times ``vector``, over GF(2)."""
  total, bit = 0, 0
  while vector:
    if vector & 1:
      total ^= matrix[bit]
    vector, bit = vector >> 1, bit + 1
  return total


def zeros_operator(num_bytes: int) -> list[int]:
  """The GF(2) matrix that runs a CRC-32 register over ``num_bytes`` zero bytes."""
  power = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit (reflected polynomial)
  for _ in range(3):  # one zero byte
    power = [_times(power, column) for column in power]
  result = [1 << n for n in range(32)]
  while num_bytes:
    if num_bytes & 1:  # powers of one operator commute
      result = [_times(power, column) for column in result]
    num_bytes >>= 1
    if num_bytes:
      power = [_times(power, column) for column in power]
  return result


def combine(first: int, second: int, operator: list[int]) -> int:
  """crc32(a + b) from ``first`` = crc32(a), ``second`` = crc32(b) and
  ``operator`` = ``zeros_operator(len(b))``."""
  return _times(operator, first) ^ second


class RunningCrc:
  """A stored member's CRC-32, taken as its examples are read in order: ``expected`` (the
  zip directory's), ``header_crc`` (its ``.npy`` header's), ``running`` (one CRC-32 per
  sample of what was read; None when not read in order) and ``next_row`` (where the next
  read must start to keep the order)."""

  def __init__(self, expected: int, header_crc: int):
    self.expected, self.header_crc = expected, header_crc
    self.running: list[int] | None = None
    self.next_row = 0

  def restart(self, num_samples: int) -> None:
    self.running, self.next_row = [0] * num_samples, 0

  def value(self, sample_bytes: int) -> int | None:
    """The member's CRC-32 from what was read (each sample ``sample_bytes`` long), or
    None when it was not read in order."""
    if self.running is None:
      return None
    total, operator = self.header_crc, zeros_operator(sample_bytes)
    for sample in self.running:
      total = combine(total, sample, operator)
    return total


def update(queued: list) -> None:
  """Runs queued ``(running, index, bytes)``: running[index] = crc32(bytes, running[index]);
  zlib lets go of the GIL over large buffers, so a thread can run them beside the reading."""
  for running, index, data in queued:
    running[index] = zlib.crc32(data, running[index])
