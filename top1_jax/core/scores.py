"""Scalar uncertainty scores U(x) and their one registry.

``REGISTRY`` lists every score once: its name, label, inputs (log-probabilities,
samples or human labels), which direction is confident, and whether ``mc.predict``
computes it on the devices. Evaluation, MC prediction, the demo, the report and the
mislabelled finder all read it; adding a score is one entry.

Every score is computed from logits in log space. A float32 softmax saturates at
exactly 1.0 once the top logit leads by ~17, and even ``logsumexp(l) - max(l)``
rounds ``20 + log1p(1e-8)`` to 20; both create ties that collapse quantile bins.
So each score is written in terms of ``s = sum_{j != argmax} exp(l_j - l_max)``
(and similar tail sums), which keeps full relative precision when it is tiny;
``order`` computes them without an arg-max or a sort.

The public functions take a batch, ``logits: [N, K]`` (or ``samples: [S, N, K]``),
check it, and return ``[N]``.
"""

import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import events, validation
from top1_jax.kernels import covariance, row_blocks, top_entries


def _logits(logits: ArrayLike) -> jax.Array:
  arr = validation.float_array("logits", logits, 2)
  if arr.shape[-1] < 2:
    raise ValueError(f"logits: expected at least 2 classes, got shape {arr.shape}")
  return arr


@jax.jit
def _neg_log_pmax(logits: jax.Array) -> jax.Array:
  _, tail = top_entries.shifted(logits)
  return jnp.log1p(tail)


def neg_log_pmax(logits: ArrayLike) -> jax.Array:
  """-log max_k softmax(l)_k = log1p(sum_{j != argmax} exp(l_j - l_max)).

  Args:
    logits: [N, K] float.

  Returns:
    [N] float, >= 0; distinct for logits [20, 0, ...] and [26, 0, ...] in float32.
  """
  return _neg_log_pmax(_logits(logits))


def pmax(logits: ArrayLike) -> jax.Array:
  """Max softmax probability ("Vanilla", Hendrycks & Gimpel).

  Saturates at 1.0 in float32 for confident examples; bin ``neg_log_pmax`` (the
  same ordering without the ties) when that matters.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float in (0, 1].
  """
  return jnp.exp(-neg_log_pmax(logits))


@jax.jit
def _entropy(logits: jax.Array) -> jax.Array:
  # H = log Z - sum_j p_j z_j with z = l - l_max, Z = 1 + tail. The top entry has
  # z = 0, so both terms are small sums over the tail: no cancellation near 0.
  z, tail = top_entries.shifted(logits)
  weighted = jnp.sum(jnp.exp(z) * z, axis=-1)  # the top entries add 0
  return jnp.log1p(tail) - weighted / (1.0 + tail)


def entropy(logits: ArrayLike) -> jax.Array:
  """Entropy of softmax(logits) in nats, accurate when the softmax saturates.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float in [0, log K].
  """
  return _entropy(_logits(logits))


@functools.partial(jax.jit, static_argnames=("k",))
def _neg_log_topk_mass(logits: jax.Array, k: int) -> jax.Array:
  # With t the k-th largest, the top k are the entries above t and enough of t's
  # ties; the rest are those below t and t's other ties. Both sums without a sort.
  z = logits - jnp.max(logits, axis=-1, keepdims=True)
  threshold = top_entries.kth_largest(z, k)[:, None]
  ez, at_threshold = jnp.exp(z), jnp.exp(threshold[:, 0])
  above = z > threshold
  top_mass = (
    jnp.sum(jnp.where(above, ez, 0.0), axis=-1) + (k - top_entries.count(above)) * at_threshold
  )
  rest = jnp.sum(jnp.where(z < threshold, ez, 0.0), axis=-1)
  rest += (top_entries.count(z >= threshold) - k) * at_threshold
  return jnp.log1p(rest / top_mass)  # top_mass >= 1: the top entry is exp(0)


def neg_log_topk_mass(logits: ArrayLike, k: int = 5) -> jax.Array:
  """-log of the softmax mass of the k largest logits (the Top-k analogue of -log pmax).

  Args:
    logits: [N, K] float.
    k: how many top classes, 1 <= k <= K; k = 1 equals ``neg_log_pmax``.

  Returns:
    [N] float, >= 0.
  """
  arr = _logits(logits)
  k = validation.positive_int("k", k, maximum=arr.shape[-1])
  return _neg_log_topk_mass(arr, k)


@jax.jit
def _margin(logits: jax.Array) -> jax.Array:
  z = logits - jnp.max(logits, axis=-1, keepdims=True)
  second = jnp.max(jnp.where(z < 0, z, -jnp.inf), axis=-1)
  return jnp.where(top_entries.count(z == 0) >= 2, 0.0, -second)  # a tie at the top: margin 0


def margin(logits: ArrayLike) -> jax.Array:
  """Gap between the two largest logits, l_(1) - l_(2) (a confidence).

  This is log(p_(1) / p_(2)): the probability ratio of the top two classes, which
  unlike the probability difference does not saturate.

  Args:
    logits: [N, K] float.

  Returns:
    [N] float, >= 0.
  """
  return _margin(_logits(logits))


def covariance_norm(samples: ArrayLike) -> jax.Array:
  """Matrix 2-norm of the sample covariance of each example's S vectors.

  ``||Cov_s(v_s)||_2`` with the unbiased (S-1) normalisation, as ``np.cov``. A pure
  function of the vectors as given: pass logits, probabilities or log-probabilities.
  Computed through the S x S Gram matrix of the centred samples when S < K, with a
  batched eigenvalue step (``covariance.covariance_norm``).

  Args:
    samples: [S, N, K] float, S >= 2 MC-dropout samples or ensemble members.

  Returns:
    [N] float, >= 0 (larger = the samples disagree more).
  """
  arr = validation.as_array("samples", samples, 3)
  if arr.dtype.kind != "f":
    arr = validation.float_array("samples", arr, 3)  # integers and booleans
  if arr.shape[0] < 2:
    raise ValueError(
      f"samples: need at least 2 samples on axis 0 for a covariance, got shape {arr.shape}"
    )
  norm = covariance.covariance_norm(arr)
  if not validation.is_traced(norm) and not bool(jnp.all(jnp.isfinite(norm))):
    # Non-finite samples give NaN norms, so the samples are only checked here (a
    # whole pass over them, as long as the covariance itself): name the first bad
    # value, or else the norm itself left the float range.
    validation.check_finite("samples", arr)
    raise ValueError(
      "samples: the covariance norm exceeds the float32 range (spread beyond ~1e19);"
      " rescale the samples"
    )
  return norm


@jax.jit
def _oracle_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  true_class = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  return jax.nn.logsumexp(logits, axis=-1) - true_class


def oracle_loss(logits: ArrayLike, labels: ArrayLike) -> jax.Array:
  """The true class's cross-entropy, logsumexp(l) - l_label: an oracle, not a method.

  It uses the labels, so it is not available at prediction time; binned, it bounds
  the resolution any score of this classifier could reach (the paper's supplement).

  Args:
    logits: [N, K] float.
    labels: [N] int in [0, K).

  Returns:
    [N] float, >= 0.
  """
  logits = _logits(logits)
  labels = validation.labels_array("labels", labels, logits.shape[-1])
  validation.same_length(logits=logits, labels=labels)
  return _oracle_loss(logits, labels)


@jax.jit
def _human_entropy(probs: jax.Array) -> jax.Array:
  return -jnp.sum(
    jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0),
    axis=-1,
  )


def human_entropy(probs: ArrayLike) -> jax.Array:
  """Entropy of per-example label distributions (e.g. CIFAR-10H), 0 log 0 = 0.

  Args:
    probs: [N, K] float, rows in [0, 1] summing to 1.

  Returns:
    [N] float in [0, log K]; many exact ties (unanimous annotators give 0).
  """
  return _human_entropy(validation.probability_array("probs", probs, 2, sums_to_one=True))


# log(0) for a probability that underflowed: far below any float32 log-probability
# (the log of the smallest subnormal is -103), so it never outranks a real value.
_LOG_ZERO = -1000.0


def log_probs_from_probs(probs: ArrayLike) -> np.ndarray:
  """Log-probabilities of probabilities [..., K], safe for real networks' underflow.

  Taken in float64 on the host, so the 1e-37 tails of real networks' softmax keep
  their values (and the scores computed from them stay tie-free); an exact 0 gives
  -1000. No checks: pass probabilities.

  Returns:
    float32 array shaped like ``probs``, usable wherever logits are.
  """
  with np.errstate(divide="ignore"):
    log_probs = np.log(np.asarray(probs, np.float64))
  return np.maximum(log_probs, _LOG_ZERO).astype(np.float32)


_UNROLLED_SAMPLES = 128
"""Up to this many samples, ``_mean_log_probs`` sums them as separate terms on a CPU."""


@jax.jit
def _mean_log_probs(samples: jax.Array) -> jax.Array:
  log_probs = jax.nn.log_softmax(samples, axis=-1)
  num_samples = samples.shape[0]
  if num_samples > _UNROLLED_SAMPLES or jax.default_backend() != "cpu":
    return jax.nn.logsumexp(log_probs, axis=0) - math.log(num_samples)
  # logsumexp over the samples as S element-wise terms, which XLA fuses into one pass:
  # its reduction over the leading axis took 7x as long on the CPU (100 ms vs 14.5 ms
  # for a [32, 262, 1000] chunk). Not on a GPU: there that fusion took ~17 s to compile
  # (an H100, S = 32), and the reduction is fast.
  per_sample = [log_probs[s] for s in range(num_samples)]
  top = functools.reduce(jnp.maximum, per_sample)
  total = functools.reduce(jnp.add, [jnp.exp(term - top) for term in per_sample])
  return top + jnp.log(total) - math.log(num_samples)


def mean_log_probs(samples: ArrayLike) -> jax.Array:
  """Log of the sample-mean softmax, in log space: logsumexp_s(log_softmax) - log S.

  Args:
    samples: [S, N, K] logits (S = 1 for a plain model).

  Returns:
    [N, K] log-probabilities (valid logits for every score here).
  """
  return _mean_log_probs(validation.float_array("samples", samples, 3))


def _pmax(log_probs: jax.Array) -> jax.Array:
  return jnp.exp(-_neg_log_pmax(log_probs))


def _covariance_norm_probs(samples: jax.Array) -> jax.Array:
  return covariance.covariance_norm(jnp.exp(jax.nn.log_softmax(samples, axis=-1)))


class Score(NamedTuple):
  """One uncertainty score of the registry.

  Attributes:
    name: the key in ``REGISTRY``, in predictions files (``score_<name>``) and tables.
    label: how tables and figures name it.
    inputs: what ``fn`` takes: ``"log_probs"`` ([N, K] logits or log-probabilities),
      ``"samples"`` ([S, N, K] logits, S >= 2), ``"human_probs"`` ([N, K]) or
      ``"labels"`` (log-probs and the [N] true labels: an oracle, for comparison only).
    confident_when_high: True for confidences (larger = more likely correct),
      False for uncertainties. Binning does not care; a raw-score AUROC does.
    fn: the unchecked array function, ``fn(x)`` (``fn(x, k)`` when ``per_k``); jittable.
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
    Score("pmax", "pmax (Vanilla)", "log_probs", True, _pmax),
    Score("entropy", "entropy", "log_probs", False, _entropy, on_device=True),
    Score("neg_log_pmax", "−log pmax", "log_probs", False, _neg_log_pmax, on_device=True),
    Score(
      "neg_log_topk_mass", "−log top-k mass", "log_probs", False, _neg_log_topk_mass, per_k=True
    ),
    Score("margin", "logit margin", "log_probs", True, _margin, on_device=True),
    Score(
      "covariance_norm_probs",
      "cov. 2-norm (probs)",
      "samples",
      False,
      _covariance_norm_probs,
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
    Score("human_entropy", "human entropy", "human_probs", False, _human_entropy),
    Score("oracle_loss", "oracle: true-class loss", "labels", False, _oracle_loss),
  )
}
"""Every score by name, in the order sweeps and tables list them. Adding a score is one entry."""

ORDER_TWINS = (("pmax", "neg_log_pmax"),)
"""Scores of one ranking (one a monotone function of the other), as (the one that ties
in float32, the tie-free one). Their bins hold the same calibration examples; the right-
closed bins' edges sit at neighbouring points (held-out metrics differ slightly).
Figures show one line for a pair."""

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
  if _TOPK_NAME.match(name):
    return REGISTRY["neg_log_topk_mass"]
  return REGISTRY.get(name)


def label(name: str) -> str:
  """Display label of a score name (a stored score unknown to the registry: its name)."""
  match = _TOPK_NAME.match(name)
  if match:
    return f"−log top-{match.group(1)} mass"
  score = REGISTRY.get(name)
  return name if score is None else score.label


def same_order_as(name: str) -> str | None:
  """The other score of ``name``'s ``ORDER_TWINS`` pair, or None."""
  for pair in ORDER_TWINS:
    if name in pair:
      return pair[1 - pair.index(name)]
  return None


def is_tied_twin(name: str) -> bool:
  """Whether ``name`` is the tie-prone member of an ``ORDER_TWINS`` pair."""
  return any(name == pair[0] for pair in ORDER_TWINS)


def headline(available: Iterable[str]) -> str | None:
  """The first ``HEADLINE`` score among ``available``, else the first available one."""
  available = list(available)
  return next((name for name in HEADLINE if name in available), next(iter(available), None))


def compute_one(
  name: str,
  log_probs: jax.Array,
  samples: jax.Array | None = None,
  human_probs=None,
  labels=None,
) -> jax.Array:
  """One score by name (``neg_log_top<k>_mass`` included), from checked arrays.

  Raises:
    ValueError: an unknown name, or a score whose input was not given.
  """
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
  """What ``score.fn`` takes, by its input kind; None when that input was not given."""
  if score.inputs == "log_probs":
    return (log_probs,)
  if score.inputs == "samples":
    return None if samples is None or samples.shape[0] < 2 else (samples,)
  if score.inputs == "human_probs":
    return None if human_probs is None else (human_probs,)
  return None if labels is None else (log_probs, labels)


@functools.partial(jax.jit, static_argnames=("topk", "label_terms"))
def _log_prob_scores(log_probs, labels, topk: tuple[int, ...], label_terms: bool = False):
  """Every score of the log-probabilities (each k's top-k mass too, and with ``labels``
  the oracle's), one program; with ``label_terms`` also ``events.LabelTerms`` (else None).

  By cache-sized blocks of examples (``rowblocks``): each score's pass over a
  block reads it from cache, not the whole [N, K] array from memory (at K = 1,000,
  ~4x faster than one jitted pass per score).
  """
  names = [s.name for s in REGISTRY.values() if s.inputs == "log_probs" and not s.per_k]
  oracles = [s.name for s in REGISTRY.values() if s.inputs == "labels"]
  with_labels = [] if labels is None else oracles
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

  rows = row_blocks.block_rows(log_probs.shape[-1])
  arrays = (log_probs,) if labels is None else (log_probs, labels)
  values = row_blocks.map_row_blocks(block_scores, arrays, rows)
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
  """Every registered score that the given predictions support, by name.

  Args:
    log_probs: [N, K] (mean) log-probabilities or logits of the classifier.
    samples: optional [S, N, K] logits of MC-dropout samples or ensemble members;
      with S >= 2 adds the covariance norms of their probabilities and logits.
    human_probs: optional [N, K] annotator label frequencies: ``human_entropy``.
    topk: adds ``neg_log_top{k}_mass`` for each k >= 2 (k = 1 is ``neg_log_pmax``).
    labels: optional [N] true labels: adds the oracle ``oracle_loss``.

  Returns:
    name -> [N] float, in registry order.
  """
  log_probs = _logits(log_probs)
  if samples is not None:
    samples = validation.float_array("samples", samples, 3)
  topk, human_probs, labels = _checked_extras(log_probs, topk, human_probs, labels)
  return _compute(log_probs, samples, human_probs, topk, labels)[0]


def _checked_extras(log_probs, topk, human_probs, labels) -> tuple:
  """``compute``'s topk, human_probs and labels, checked against the [N, K] log_probs."""
  num_classes = log_probs.shape[-1]
  topk = tuple(validation.positive_int("topk", k, maximum=num_classes) for k in topk)
  if human_probs is not None:
    human_probs = validation.probability_array("human_probs", human_probs, 2, sums_to_one=True)
  if labels is not None:
    labels = validation.labels_array("labels", labels, num_classes)
    validation.same_length(log_probs=log_probs, labels=labels)
  return topk, human_probs, labels


@functools.partial(jax.jit, static_argnames=("topk", "label_terms"))
def of_samples(samples, human_probs, labels, topk: tuple, label_terms: bool) -> tuple:
  """[S, N, K] logits -> ([N, K] mean log-probs, every score, ``LabelTerms`` or None), one
  program: XLA fuses the log-softmax into the scores' passes, and it compiles once.
  Unchecked (``from_predictions`` checks, then runs it); traceable."""
  log_probs = _mean_log_probs(samples)
  with_samples = samples if samples.shape[0] >= 2 else None
  return log_probs, *_compute(log_probs, with_samples, human_probs, topk, labels, label_terms)


def sample_summary(samples: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """[S, B, K] logits -> ([B, K] mean log-probs, the ``on_device`` scores), unchecked.

  What ``mc.predict`` computes on the devices (inside ``jit`` and ``shard_map``):
  the scores of the mean probabilities and, with S >= 2, of the samples.
  """
  log_probs = _mean_log_probs(samples)
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
) -> tuple:
  """The classifier's log-probabilities and every score, from a predictions file's fields.

  Args:
    logits: [S, N, K] samples (S = 1 for a plain model), or None.
    mean_probs: [N, K] mean probabilities, used when ``logits`` is None.
    stored_scores: precomputed name -> [N] scores, which replace recomputed ones
      (``stored_values``; ``mc.predict`` computes them on device in log space, more
      precisely than float32 ``mean_probs`` allow).
    human_probs: optional [N, K] annotator frequencies.
    topk: Top-k events whose ``neg_log_top{k}_mass`` to add.
    labels: optional [N] true labels, for the oracle row ``oracle_loss``.
    as_numpy: False leaves the recomputed scores as JAX arrays, maybe still running.
    label_terms: also return each example's ``events.LabelTerms`` (JAX arrays; needs
      ``labels``), from the scores' own pass over the log-probabilities.

  Returns:
    ([N, K] log-probabilities, name -> [N] NumPy scores[, ``events.LabelTerms``]).
  """
  if label_terms and labels is None:
    raise ValueError("labels: label_terms=True needs the labels, got None")
  if logits is not None:
    samples = validation.float_array("samples", logits, 3)
    # The [N, K] mean log-probabilities' shape, for compute's checks (not computed yet).
    log_probs = jax.ShapeDtypeStruct(samples.shape[1:], samples.dtype)
    if samples.shape[-1] < 2:
      raise ValueError(f"logits: expected at least 2 classes, got shape {log_probs.shape}")
    topk, human_probs, labels = _checked_extras(log_probs, topk, human_probs, labels)
    log_probs, values, terms = of_samples(samples, human_probs, labels, topk, label_terms)
  elif mean_probs is not None:
    log_probs = jnp.asarray(log_probs_from_probs(mean_probs))
    values = compute(log_probs, human_probs=human_probs, topk=topk, labels=labels)
    terms = events.label_terms(log_probs, labels) if label_terms else None
  else:
    raise ValueError("logits, mean_probs: expected at least one of them, got neither")
  values.update(stored_values(stored_scores))
  if as_numpy:
    values = {name: np.asarray(value) for name, value in values.items()}
  return (log_probs, values, terms) if label_terms else (log_probs, values)
