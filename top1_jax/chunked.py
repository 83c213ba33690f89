"""A predictions file's log-probabilities and every score, a chunk of examples at a time.

Why: an ImageNet MC-dropout file holds [S, N, K] = [32, 50000, 1000] float32
logits (6.4 GB), and its evaluation needs only the [N, K] mean log-probabilities
and one [N] array per score. Each chunk of examples goes through
``scores.from_predictions`` (the same functions as a whole file, so the same
values) and is written into the [N, K] and [N] results; peak memory is those
plus one chunk. Every chunk is padded to one shape, so each jitted score
compiles once, not once more for a shorter last chunk.
"""

import collections
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax import scores

DEFAULT_CHUNK_BYTES = 1 << 25
"""``chunk_size`` aims at chunks of about this many bytes of logits (32 MiB)."""


def chunk_size(num_examples: int, num_samples: int | None, num_classes: int) -> int:
  """Examples per chunk: about ``DEFAULT_CHUNK_BYTES`` of float32 [S, chunk, K] logits."""
  row_bytes = 4 * (num_samples or 1) * num_classes
  return int(max(1, min(num_examples, DEFAULT_CHUNK_BYTES // row_bytes)))


def _padded(value, rows: int, axis: int):
  """``value`` with its last example repeated up to ``rows`` (valid inputs for every check)."""
  if value is None or value.shape[axis] == rows:
    return value
  width = [(0, 0)] * value.ndim
  width[axis] = (0, rows - value.shape[axis])
  return np.pad(value, width, mode="edge")


def _chunk_inputs(chunk: Any, rows: int) -> dict[str, Any]:
  """``scores.from_predictions``'s keyword arguments for one chunk, padded to ``rows``."""
  logits = chunk.logits
  return {
    "logits": None if logits is None else _padded(logits, rows, logits.ndim - 2),
    "mean_probs": None if logits is not None else _padded(chunk.mean_probs, rows, 0),
    "stored_scores": {name: _padded(v, rows, 0) for name, v in chunk.scores.items()},
    "human_probs": _padded(chunk.human_probs, rows, 0),
    "labels": _padded(chunk.labels, rows, 0),
  }


def _cpu_devices() -> list:
  """The host's CPU devices when JAX has several (one per core), else [None]."""
  devices = jax.local_devices()
  return devices if len(devices) > 1 and devices[0].platform == "cpu" else [None]


def _on(device):
  return contextlib.nullcontext() if device is None else jax.default_device(device)


def _copy_out(out: dict, num_examples: int, start, size, chunk_log_probs, chunk_scores) -> None:
  """A scored chunk's first ``size`` rows into the whole file's arrays (made at the first)."""
  if out["log_probs"] is None:
    out["log_probs"] = np.empty((num_examples, chunk_log_probs.shape[-1]), np.float32)
    out["values"] = {name: np.empty(num_examples, v.dtype) for name, v in chunk_scores.items()}
  out["log_probs"][start : start + size] = np.asarray(chunk_log_probs)[:size]
  for name, value in chunk_scores.items():
    out["values"][name][start : start + size] = np.asarray(value)[:size]


def from_chunks(
  chunks: Iterable[tuple[int, Any]],
  num_examples: int,
  *,
  topk: Sequence[int] = (),
  with_labels: bool = True,
):
  """``scores.from_predictions`` of a whole file, from its chunks of examples.

  Args:
    chunks: (start, chunk) in order, covering [0, num_examples) without gaps; a
      chunk has the fields of ``io.predictions.Predictions`` (``labels`` [B],
      ``logits`` [S, B, K] or None, ``mean_probs`` [B, K] or None, ``scores``
      {name: [B]}, ``human_probs`` [B, K] or None), e.g. the chunks of
      ``io.stream.PredictionsReader``. Every chunk but the last has the first's B.
    num_examples: N.
    topk: Top-k events whose ``neg_log_top{k}_mass`` to add.
    with_labels: add the oracle score ``oracle_loss`` (it needs the labels).

  Returns:
    ([N, K] float32 log-probabilities as a jax array, name -> [N] NumPy scores),
    equal to ``scores.from_predictions`` on the whole arrays.
  """
  # Chunk i is scored on the host's CPU device i % D, D - 1 chunks ahead of the one
  # being copied out: with one JAX CPU device per core (experiments.evaluate sets
  # that), each core scores its own chunk (XLA runs the covariance norms' small
  # matmuls on one core per device). With one device this is the plain loop.
  devices = _cpu_devices()
  out = {"log_probs": None, "values": {}}
  pending, rows, expected, stored = collections.deque(), None, 0, ()
  for index, (start, chunk) in enumerate(chunks):
    stored = tuple(chunk.scores)
    size = int(chunk.labels.shape[0])
    if start != expected or (rows is not None and size > rows):
      raise ValueError(f"chunks: expected a chunk at {expected} of at most {rows}, got {start}")
    rows = size if rows is None else rows
    inputs = _chunk_inputs(chunk, rows)
    if not with_labels:
      inputs["labels"] = None
    with _on(devices[index % len(devices)]):
      scored = scores.from_predictions(**inputs, topk=topk, as_numpy=False)
    pending.append((start, size, *scored))
    if len(pending) == len(devices):
      _copy_out(out, num_examples, *pending.popleft())
    expected = start + size
  while pending:
    _copy_out(out, num_examples, *pending.popleft())
  log_probs, values = out["log_probs"], out["values"]
  if expected != num_examples:
    raise ValueError(f"chunks: expected {num_examples} examples, got {expected}")
  if "neg_log_pmax" not in stored and "pmax" in values:
    # pmax is an element-wise exp outside jit, whose last bit depends on an element's
    # place in the SIMD lanes of its batch: redone on all N it equals the whole-file one.
    values["pmax"] = np.asarray(jnp.exp(-jnp.asarray(values["neg_log_pmax"])))
  return jnp.asarray(log_probs), values
