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
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from top1_jax import events, scores

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


def _collect(out: dict, size: int, chunk_log_probs, chunk_scores, chunk_terms, device) -> None:
  """A scored chunk's log-probabilities kept on ``device`` (where the file's are joined),
  its first ``size`` scores and label terms copied to the host (which waits for it)."""
  for name, value in chunk_scores.items():
    out["values"].setdefault(name, []).append(np.asarray(value)[:size])
  if chunk_terms is not None:
    out["terms"].append([np.asarray(value)[:size] for value in chunk_terms])
  on_device = chunk_log_probs if device is None else jax.device_put(chunk_log_probs, device)
  out["log_probs"].append(on_device)


@functools.partial(jax.jit, static_argnames=("num_examples",))
def _joined(parts, neg_log_pmax, num_examples: int):
  """The chunks' [B, K] log-probabilities as one [N, K] array: one copy (only the last
  chunk is padded). On the host and back would be two, ~0.4 s at 50,000 x 1,000.
  And pmax from all N ``neg_log_pmax`` (None: none)."""
  pmax = None if neg_log_pmax is None else jnp.exp(-neg_log_pmax)
  return jnp.concatenate(parts)[:num_examples], pmax


def from_chunks(
  chunks: Iterable[tuple[int, Any]],
  num_examples: int,
  *,
  topk: Sequence[int] = (),
  with_labels: bool = True,
) -> tuple[jax.Array, dict[str, np.ndarray], events.LabelTerms | None]:
  """``scores.from_predictions`` of a whole file, from its chunks of examples.

  Args:
    chunks: (start, chunk) in order, covering [0, num_examples) without gaps; a
      chunk has the fields of ``io.predictions.Predictions`` (``labels`` [B],
      ``logits`` [S, B, K] or None, ``mean_probs`` [B, K] or None, ``scores``
      {name: [B]}, ``human_probs`` [B, K] or None), e.g. the chunks of
      ``io.stream.PredictionsReader``. Every chunk but the last has the first's B.
    num_examples: N.
    topk: Top-k events whose ``neg_log_top{k}_mass`` to add.
    with_labels: add the oracle score ``oracle_loss`` and the label terms (they need
      the labels).

  Returns:
    ([N, K] float32 log-probabilities as a jax array, name -> [N] NumPy scores,
    ``events.LabelTerms`` of NumPy arrays or None without labels), equal to
    ``scores.from_predictions(..., label_terms=True)`` on the whole arrays.
  """
  # Chunk i of MC samples is scored on the host's CPU device i % D, D - 1 chunks ahead
  # of the one being collected: with one JAX CPU device per core (experiments.evaluate
  # sets that), each core scores its own chunk (XLA runs the covariance norms' small
  # matmuls on one core per device). Without samples, one device: XLA's own threads
  # keep both cores as busy, and a second device would compile everything twice.
  devices = None
  out = {"log_probs": [], "values": {}, "terms": []}
  pending, rows, expected, stored = collections.deque(), None, 0, ()
  for index, (start, chunk) in enumerate(chunks):
    stored = tuple(chunk.scores)
    size = int(chunk.labels.shape[0])
    if start != expected or (rows is not None and size > rows):
      raise ValueError(f"chunks: expected a chunk at {expected} of at most {rows}, got {start}")
    rows = size if rows is None else rows
    if devices is None:
      samples = chunk.logits is not None and chunk.logits.shape[0] >= 2
      devices = _cpu_devices() if samples else [None]
    inputs = _chunk_inputs(chunk, rows)
    if not with_labels:
      inputs["labels"] = None
    with _on(devices[index % len(devices)]):
      log_probs, values, *terms = scores.from_predictions(
        **inputs, topk=topk, as_numpy=False, label_terms=with_labels
      )
    pending.append((size, log_probs, values, terms[0] if terms else None, devices[0]))
    if len(pending) == len(devices):
      _collect(out, *pending.popleft())
    expected = start + size
  while pending:
    _collect(out, *pending.popleft())
  if expected != num_examples:
    raise ValueError(f"chunks: expected {num_examples} examples, got {expected}")
  values = {name: np.concatenate(parts) for name, parts in out["values"].items()}
  terms = None
  if out["terms"]:
    terms = events.LabelTerms(*map(np.concatenate, zip(*out["terms"], strict=True)))
  # pmax is an element-wise exp, whose last bit depends on an element's place in the
  # SIMD lanes of its batch: redone on all N it equals the whole-file one.
  recompute = "neg_log_pmax" not in stored and "pmax" in values
  log_probs, pmax = _joined(
    tuple(out["log_probs"]), values["neg_log_pmax"] if recompute else None, num_examples
  )
  if recompute:
    values["pmax"] = np.asarray(pmax)
  return log_probs, values, terms
