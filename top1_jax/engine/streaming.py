"""A predictions file's log-probabilities and every score, a chunk of examples at a time.

Peak memory is the [N, K] and [N] results plus one chunk, not the [S, N, K] logits. Each
chunk goes through ``scores.from_predictions`` (so the values are a whole file's), padded
to one shape so that each jitted score compiles once.
"""

import collections
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from top1_jax.core import events, scores, validation

_AXIS = "chunks"  # the devices' mesh axis: chunk d of a group on device d

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


def _chunk_inputs(chunk: Any, rows: int, with_labels: bool) -> dict[str, Any]:
  """``scores.from_predictions``'s keyword arguments for one chunk, padded to ``rows``."""
  logits = chunk.logits
  return {
    "logits": None if logits is None else _padded(logits, rows, logits.ndim - 2),
    "mean_probs": None if logits is not None else _padded(chunk.mean_probs, rows, 0),
    "stored_scores": {name: _padded(v, rows, 0) for name, v in chunk.scores.items()},
    "human_probs": _padded(chunk.human_probs, rows, 0),
    "labels": _padded(chunk.labels, rows, 0) if with_labels else None,
  }


def _local_scores(samples, human_probs, labels, *, topk, label_terms):
  """One device's chunk, as [1, ...] blocks inside ``shard_map``: a lone chunk's program."""
  first = [None if x is None else x[0] for x in (samples, human_probs, labels)]
  return jax.tree.map(lambda x: x[None], scores.of_samples(*first, topk, label_terms))


@functools.lru_cache(maxsize=8)
def _program_over(devices: tuple, topk: tuple, label_terms: bool):
  """Scores D chunks at once, chunk d on device d: one SPMD program, compiled once (a jit
  per device would compile it D times)."""
  mesh = Mesh(np.asarray(devices), (_AXIS,))
  local = functools.partial(_local_scores, topk=topk, label_terms=label_terms)
  sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(_AXIS),) * 3, out_specs=P(_AXIS))
  return jax.jit(sharded), NamedSharding(mesh, P(_AXIS))


def _score_group(group: list[dict], devices: list, topk: tuple, with_labels: bool) -> tuple:
  """A group's (log-probabilities, scores, label terms or None), not waited for: one
  device, ``scores.from_predictions`` of its one chunk; D devices, the D chunks (a short
  group repeats its last) checked as it checks them and scored by ``_program_over``, each
  result with a leading axis of D. Stored scores are left to ``_collect``."""
  if len(devices) == 1:
    inputs = {**group[0], "stored_scores": None}
    return scores.from_predictions(**inputs, topk=topk, as_numpy=False, label_terms=with_labels)
  group = group + group[-1:] * (len(devices) - len(group))
  # Stacked where device_put keeps each chunk's slice (an unaligned stack is copied again).
  stacked = validation.aligned_empty((len(group), *group[0]["logits"].shape), np.float32)
  np.stack([g["logits"] for g in group], out=stacked)
  samples = validation.float_array("samples", stacked, 4, host=True)
  if samples.shape[-1] < 2:
    raise ValueError(f"logits: expected at least 2 classes, got shape {samples.shape[1:]}")
  human, labels = (None if group[0][name] is None else np.stack([g[name] for g in group])
                   for name in ("human_probs", "labels"))  # fmt: skip
  if human is not None:
    human = validation.probability_array("human_probs", human, 3, sums_to_one=True, host=True)
  if labels is not None:
    checked = validation.labels_array("labels", labels.reshape(-1), samples.shape[-1], host=True)
    labels = checked.reshape(labels.shape)
  program, by_chunk = _program_over(tuple(devices), topk, with_labels)
  return program(*jax.device_put((samples, human, labels), by_chunk))


def _collect(out: dict, sizes: list[int], stored: list[dict], scored: tuple) -> None:
  """A scored group's rows copied into the host's [N, K] log-probabilities, [N] scores and
  label terms (the stored scores replacing the computed ones); waits for the group."""
  log_probs, values, terms = scored
  count = log_probs.shape[0] if log_probs.ndim == 3 else 1  # chunks the program scored
  log_probs = np.asarray(log_probs).reshape(count, -1, log_probs.shape[-1])
  values = {name: np.asarray(value).reshape(count, -1) for name, value in values.items()}
  terms = None if terms is None else [np.asarray(value).reshape(count, -1) for value in terms]
  if out["log_probs"] is None:  # filled in place: the file's [N, K] is held once
    shape = (out["num_examples"], log_probs.shape[-1])
    out["log_probs"] = validation.aligned_empty(shape, log_probs.dtype)
  for index, size in enumerate(sizes):
    start = out["filled"]
    out["log_probs"][start : start + size] = log_probs[index, :size]
    out["filled"] += size
    chunk_values = {name: value[index, :size] for name, value in values.items()}
    chunk_values.update({name: v[:size] for name, v in scores.stored_values(stored[index]).items()})
    for name, value in chunk_values.items():
      out["values"].setdefault(name, []).append(value)
    if terms is not None:
      out["terms"].append([value[index, :size] for value in terms])


@jax.jit
def _pmax(neg_log_pmax):
  return jnp.exp(-neg_log_pmax)


def from_chunks(
  chunks: Iterable[tuple[int, Any]],
  num_examples: int,
  *,
  topk: Sequence[int] = (),
  with_labels: bool = True,
) -> scores.ScoredPredictions:
  """``scores.from_predictions(..., label_terms=True)`` of a whole file, from its chunks.

  ``chunks``: (start, chunk) in order, covering [0, num_examples) without gaps, each with
  the fields of ``io.predictions.Predictions`` (e.g. ``io.stream.PredictionsReader``'s);
  every chunk but the last has the first's B. ``topk``: the ``neg_log_top{k}_mass`` to add;
  ``with_labels``: add ``oracle_loss`` and the label terms. Returns [N, K] float32
  log-probabilities (a jax array), name -> [N] NumPy scores, and ``events.LabelTerms`` of
  NumPy arrays (None without labels)."""
  # MC samples on several CPU devices (one core each): groups of D chunks, chunk d on device
  # d, one group in flight while the next is read. Otherwise one device, one chunk at a time.
  devices, in_flight = None, collections.deque()
  out = {"log_probs": None, "filled": 0, "num_examples": num_examples, "values": {}, "terms": []}
  group, rows, expected, stored = [], None, 0, ()
  for start, chunk in chunks:
    stored = tuple(chunk.scores)
    size = int(chunk.labels.shape[0])
    if start != expected or (rows is not None and size > rows):
      raise ValueError(f"chunks: expected a chunk at {expected} of at most {rows}, got {start}")
    rows = size if rows is None else rows
    if devices is None:
      samples = chunk.logits is not None and chunk.logits.shape[0] >= 2
      local = jax.local_devices()
      several_cpus = len(local) > 1 and local[0].platform == "cpu"
      devices = local if samples and several_cpus else [None]
      ahead = 1 if len(devices) > 1 else 0  # groups left in flight while the next is read
      classes = (chunk.logits if chunk.logits is not None else chunk.mean_probs).shape[-1]
      topk = tuple(validation.positive_int("topk", k, maximum=classes) for k in topk)
    group.append((size, _chunk_inputs(chunk, rows, with_labels)))
    expected = start + size
    if expected > num_examples:
      raise ValueError(f"chunks: expected {num_examples} examples, got more")
    if len(group) == len(devices) or expected >= num_examples:
      sizes, group_inputs = zip(*group, strict=True)
      scored = _score_group(list(group_inputs), devices, topk, with_labels)
      in_flight.append((list(sizes), [g["stored_scores"] for g in group_inputs], scored))
      group = []
      if len(in_flight) > ahead:
        _collect(out, *in_flight.popleft())
  while in_flight:
    _collect(out, *in_flight.popleft())
  if expected != num_examples:
    raise ValueError(f"chunks: expected {num_examples} examples, got {expected}")
  values = {name: np.concatenate(parts) for name, parts in out["values"].items()}
  columns = zip(*out["terms"], strict=True)
  terms = events.LabelTerms(*map(np.concatenate, columns)) if out["terms"] else None
  # pmax redone on all N: an exp's last bit depends on the element's SIMD lane.
  if "neg_log_pmax" not in stored and "pmax" in values:
    values["pmax"] = np.asarray(_pmax(values["neg_log_pmax"]))
  # The host buffer becomes the jax array (aligned: device_put keeps it on a CPU).
  return scores.ScoredPredictions(jax.device_put(out["log_probs"]), values, terms)
