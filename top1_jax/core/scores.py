"""The one registry of scalar uncertainty scores U(x), and every score of a batch at once.
A score's arithmetic is in ``log_space``, its checked public function in ``score_functions``.
"""

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import events, log_space, validation
from top1_jax.core.score_functions import (
  INPUTS,
  as_log_probs,
  checked_logits,
  covariance_norm,
  entropy,
  human_entropy,
  input_kind,
  log_probs_from_probs,
  margin,
  mean_log_probs,
  neg_log_pmax,
  neg_log_topk_mass,
  oracle_loss,
  pmax,
)
from top1_jax.kernels import covariance, row_blocks

__all__ = [
  "INPUTS",
  "as_log_probs",
  "input_kind",
  "HEADLINE",
  "RANKING_TWINS",
  "REGISTRY",
  "Score",
  "ScoredPredictions",
  "compute",
  "compute_one",
  "covariance_norm",
  "entropy",
  "for_event",
  "from_predictions",
  "headline",
  "human_entropy",
  "is_tied_twin",
  "label",
  "log_probs_from_probs",
  "lookup",
  "margin",
  "mean_log_probs",
  "neg_log_pmax",
  "neg_log_topk_mass",
  "of_samples",
  "oracle_loss",
  "pmax",
  "same_order_as",
  "sample_summary",
  "stored_values",
  "topk_name",
]


class Score(NamedTuple):
  """One uncertainty score of ``REGISTRY``.

  Attributes:
    name: the key in ``REGISTRY``, in predictions files (``score_<name>``) and tables.
    label: how tables and figures name it.
    inputs: what ``fn`` takes: ``"log_probs"`` ([N, K]), ``"samples"`` ([S, N, K]
      logits, S >= 2), ``"human_probs"`` ([N, K]) or ``"labels"`` (log-probs and the
      [N] true labels: a reference row, never a method).
    confident_when_high: True for confidences, False for uncertainties.
    fn: the unchecked, jittable array function, ``fn(x)`` (``fn(x, k)`` when ``per_k``).
    on_device: ``mc.predict`` computes it on the devices and stores it in its files.
    per_k: takes the Top-k event's k; its name for one k is ``topk_name(k)``.
  """

  name: str
  label: str
  inputs: str
  confident_when_high: bool
  fn: Callable[..., jax.Array]
  on_device: bool = False
  per_k: bool = False


REGISTRY: dict[str, Score] = {
  score.name: score
  for score in (
    Score("pmax", "pmax (Vanilla)", "log_probs", True, log_space.pmax),
    Score("entropy", "entropy", "log_probs", False, log_space.entropy, on_device=True),
    Score("neg_log_pmax", "−log pmax", "log_probs", False, log_space.neg_log_pmax, on_device=True),
    Score(
      "neg_log_topk_mass",
      "−log top-k mass",
      "log_probs",
      False,
      log_space.neg_log_topk_mass,
      per_k=True,
    ),
    Score("margin", "logit margin", "log_probs", True, log_space.margin, on_device=True),
    Score(
      "covariance_norm_probs",
      "cov. 2-norm (probs)",
      "samples",
      False,
      log_space.covariance_norm_probs,
      on_device=True,
    ),
    Score(
      "covariance_norm_logits",
      "cov. 2-norm (logits)",
      "samples",
      False,
      covariance.covariance_norm,
      on_device=True,
    ),
    Score("human_entropy", "human entropy", "human_probs", False, log_space.human_entropy),
    Score("oracle_loss", "oracle: true-class loss", "labels", False, log_space.oracle_loss),
  )
}
"""Every score by name, in the order sweeps and tables list them."""

RANKING_TWINS = (("pmax", "neg_log_pmax"),)
"""(tie-prone, tie-free) scores of one ranking in exact arithmetic, but not in float32
(pmax rounds to 1.0 where -log pmax still resolves the examples; docs/numerics.md)."""

HEADLINE = ("covariance_norm_probs", "pmax", "human_entropy")
"""The score the paper bins for a classifier (Table 1, the figures): the first one available."""

_TOPK_NAME = re.compile(r"^neg_log_top([0-9]+)_mass$")


def topk_name(k: int) -> str:
  """The name of -log top-k mass for one k (``neg_log_pmax`` for k = 1)."""
  return "neg_log_pmax" if k == 1 else f"neg_log_top{k}_mass"


def for_event(name: str, k: int) -> str:
  """The score to bin for the Top-k event: ``neg_log_topk_mass`` takes the event's own k."""
  return topk_name(k) if name == "neg_log_topk_mass" else name


def lookup(name: str) -> Score | None:
  """The registry entry of a name, ``neg_log_top<k>_mass`` included; None if unknown."""
  return REGISTRY["neg_log_topk_mass"] if _TOPK_NAME.match(name) else REGISTRY.get(name)


def needs_labels(name) -> bool:
  """Whether a score is computed from the labels (the oracle): a reference, never a
  compared score; anything not a known score name is not."""
  known = lookup(name) if isinstance(name, str) else None
  return known is not None and known.inputs == "labels"


def label(name: str) -> str:
  """Display label of a score name (a stored score unknown to the registry: its name)."""
  match = _TOPK_NAME.match(name)
  if match:
    return f"−log top-{match.group(1)} mass"
  return REGISTRY[name].label if name in REGISTRY else name


def same_order_as(name: str) -> str | None:
  """The other score of ``name``'s ``RANKING_TWINS`` pair, or None."""
  return next((pair[1 - pair.index(name)] for pair in RANKING_TWINS if name in pair), None)


def is_tied_twin(name: str) -> bool:
  """Whether ``name`` is the tie-prone member of an ``RANKING_TWINS`` pair."""
  return any(name == pair[0] for pair in RANKING_TWINS)


def headline(available: Iterable[str]) -> str | None:
  """The first ``HEADLINE`` score among ``available``, else the first available one."""
  available = list(available)
  return next((name for name in HEADLINE if name in available), next(iter(available), None))


def compute_one(
  name: str, log_probs: jax.Array, samples: jax.Array | None = None, human_probs=None, labels=None
) -> jax.Array:
  """One score by name (``neg_log_top<k>_mass`` included), from checked arrays.
  A ValueError for an unknown name or a score whose input was not given."""
  score = lookup(name)
  if score is None:
    raise ValueError(f"score: unknown {name!r}; known: {', '.join(REGISTRY)}")
  if score.per_k:
    match = _TOPK_NAME.match(name)
    if match is None:
      raise ValueError(f"score: {name!r} takes the event's k; use scores.for_event({name!r}, k)")
    return score.fn(log_probs, int(match.group(1)))
  arguments = _arguments(score, log_probs, samples, human_probs, labels)
  if arguments is None:
    need = "[S, N, K] samples with S >= 2" if score.inputs == "samples" else score.inputs
    raise ValueError(f"score: {name!r} needs {need}")
  return score.fn(*arguments)


def _arguments(score: Score, log_probs, samples, human_probs, labels) -> tuple | None:
  """What ``score.fn`` takes; None when that input was not given."""
  if score.inputs == "log_probs":
    return (log_probs,)
  if score.inputs == "samples":
    return None if samples is None or samples.shape[0] < 2 else (samples,)
  if score.inputs == "human_probs":
    return None if human_probs is None else (human_probs,)
  return None if labels is None else (log_probs, labels)


@functools.partial(jax.jit, static_argnames=("topk", "label_terms"))
def _log_prob_scores(log_probs, labels, topk: tuple[int, ...], label_terms: bool = False):
  """Every score of the log-probabilities (and ``events.LabelTerms``), by cache-sized
  blocks of rows (not the [N, K] array read once per score)."""
  names = [s.name for s in REGISTRY.values() if s.inputs == "log_probs" and not s.per_k]
  with_labels = [] if labels is None else [n for n, s in REGISTRY.items() if s.inputs == "labels"]
  ks = [k for k in topk if k >= 2]

  def block_scores(block, *block_labels):
    per_k = REGISTRY["neg_log_topk_mass"].fn
    terms = tuple(events.block_label_terms(block, *block_labels)) if label_terms else ()
    return (
      tuple(REGISTRY[n].fn(block) for n in names)
      + tuple(per_k(block, k) for k in ks)
      + tuple(REGISTRY[n].fn(block, *block_labels) for n in with_labels)
      + terms
    )

  arrays = (log_probs,) if labels is None else (log_probs, labels)
  values = row_blocks.map_row_blocks(block_scores, arrays)
  keys = names + [topk_name(k) for k in ks] + with_labels
  terms = events.LabelTerms(*values[len(keys) :]) if label_terms else None
  return dict(zip(keys, values[: len(keys)], strict=True)), terms


def _compute(log_probs, samples, human_probs, topk, labels=None, label_terms=False) -> tuple:
  blocked, terms = _log_prob_scores(log_probs, labels, tuple(topk), label_terms)
  out = {}
  for score in REGISTRY.values():
    if score.per_k:
      out.update({topk_name(k): blocked[topk_name(k)] for k in topk if k >= 2})
    elif score.name in blocked:
      out[score.name] = blocked[score.name]
    else:
      arguments = _arguments(score, log_probs, samples, human_probs, labels)
      if arguments is not None:
        out[score.name] = score.fn(*arguments)
  return out, terms


def compute(
  log_probs: ArrayLike,
  *,
  samples: ArrayLike | None = None,
  human_probs: ArrayLike | None = None,
  topk: Sequence[int] = (),
  labels: ArrayLike | None = None,
) -> dict[str, jax.Array]:
  """Every registered score the given predictions support: name -> [N], in registry order.

  Args:
    log_probs: [N, K] (mean) log-probabilities or logits of the classifier.
    samples: [S, N, K] logits of MC-dropout samples or ensemble members; S >= 2 adds
      the covariance norms.
    human_probs: [N, K] annotator label frequencies: ``human_entropy``.
    topk: adds ``neg_log_top{k}_mass`` for each k >= 2 (k = 1 is ``neg_log_pmax``).
    labels: [N] true labels: adds ``oracle_loss``.
  """
  log_probs = checked_logits(log_probs)
  if samples is not None:
    samples = validation.float_array("samples", samples, 3)
  topk, human_probs, labels = _checked_extras(log_probs, topk, human_probs, labels)
  return _compute(log_probs, samples, human_probs, topk, labels)[0]


def _checked_extras(log_probs, topk, human_probs, labels) -> tuple:
  """``compute``'s topk, human_probs and labels, checked against log_probs."""
  num_classes = log_probs.shape[-1]
  topk = tuple(validation.positive_int("topk", k, maximum=num_classes) for k in topk)
  if human_probs is not None:
    human_probs = validation.probability_array("human_probs", human_probs, 2, sums_to_one=True)
  if labels is not None:
    labels = validation.labels_array("labels", labels, num_classes)
    validation.same_length(log_probs=log_probs, labels=labels)
  return topk, human_probs, labels


class ScoredPredictions(NamedTuple):
  """A classifier's [N, K] float32 (mean) log-probabilities and its name -> [N] scores.
  ``label_terms``: each example's ``events.LabelTerms`` when asked for, else None."""

  log_probs: jax.Array
  scores: dict[str, jax.Array | np.ndarray]
  label_terms: events.LabelTerms | None = None


@functools.partial(jax.jit, static_argnames=("topk", "label_terms"))
def of_samples(samples, human_probs, labels, topk: tuple, label_terms: bool) -> ScoredPredictions:
  """[S, N, K] logits -> ``ScoredPredictions`` of their mean, unchecked, in one program."""
  log_probs = log_space.mean_log_probs(samples)
  with_samples = samples if samples.shape[0] >= 2 else None
  values, terms = _compute(log_probs, with_samples, human_probs, topk, labels, label_terms)
  return ScoredPredictions(log_probs, values, terms)


def sample_summary(samples: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """[S, B, K] logits -> ([B, K] mean log-probs, the ``on_device`` scores), unchecked:
  what ``mc.predict`` computes on the devices."""
  log_probs = log_space.mean_log_probs(samples)
  values, _ = _compute(log_probs, samples, None, ())
  return log_probs, {name: values[name] for name in values if REGISTRY[name].on_device}


def stored_values(stored_scores: dict[str, ArrayLike] | None) -> dict[str, np.ndarray]:
  """A file's stored scores, as they replace recomputed ones (pmax from a stored neg_log_pmax)."""
  stored = {name: np.asarray(value) for name, value in (stored_scores or {}).items()}
  if "neg_log_pmax" in stored:
    stored.setdefault("pmax", np.exp(-stored["neg_log_pmax"]))
  return stored


def from_predictions(
  *,
  logits: ArrayLike | None = None,
  mean_probs: ArrayLike | None = None,
  stored_scores: dict[str, ArrayLike] | None = None,
  human_probs: ArrayLike | None = None,
  topk: Sequence[int] = (),
  labels: ArrayLike | None = None,
  as_numpy: bool = True,
  label_terms: bool = False,
) -> ScoredPredictions:
  """The classifier's log-probabilities and every score, from a predictions file's fields.

  Args:
    logits: [S, N, K] samples (S = 1 for a plain model), or None; refused if they look
      like probabilities (pass ``mean_probs``).
    mean_probs: [N, K] mean probabilities, used when ``logits`` is None.
    stored_scores: name -> [N] scores that replace recomputed ones.
    human_probs: [N, K] annotator frequencies, as in ``compute``.
    topk: as in ``compute``.
    labels: [N] true labels, for ``oracle_loss``.
    as_numpy: False leaves the recomputed scores as JAX arrays, maybe still running.
    label_terms: also each example's ``events.LabelTerms`` (needs ``labels``).
  """
  if label_terms and labels is None:
    raise ValueError("labels: label_terms=True needs the labels, got None")
  if logits is not None:
    samples = validation.float_array("samples", logits, 3)
    # The [N, K] mean log-probabilities' shape, for compute's checks (not computed yet).
    log_probs = jax.ShapeDtypeStruct(samples.shape[1:], samples.dtype)
    if samples.shape[-1] < 2:
      raise ValueError(f"logits: expected at least 2 classes, got shape {log_probs.shape}")
    fix = "pass mean_probs=probs, or logits=log(probs) for [S, N, K] samples"
    validation.refuse_probabilities("logits", samples, fix, given=logits)
    topk, human_probs, labels = _checked_extras(log_probs, topk, human_probs, labels)
    log_probs, values, terms = of_samples(samples, human_probs, labels, topk, label_terms)
  elif mean_probs is not None:
    log_probs = jnp.asarray(log_probs_from_probs(mean_probs, name="mean_probs"))
    values = compute(log_probs, human_probs=human_probs, topk=topk, labels=labels)
    terms = events.label_terms(log_probs, labels) if label_terms else None
  else:
    raise ValueError("logits, mean_probs: expected at least one of them, got neither")
  values.update(stored_values(stored_scores))
  if as_numpy:
    values = {name: np.asarray(value) for name, value in values.items()}
  return ScoredPredictions(log_probs, values, terms)
