"""The one protocol every estimator of P(correct) follows, the evidence it is fitted on, and
the checked reading of saved states. An ``Estimator`` is a frozen dataclass of plain
functions, not a base class: a new estimator (or a test's toy) is one constructor call.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from top1_jax.core import validation


class Evidence(NamedTuple):
  """What an estimator is fitted on, or predicts for (checked by its caller).

  Attributes:
    u: [N] float host scores.
    correct: [N] bool Top-k events; None when predicting.
    log_probs: [N, K] log-probabilities (or logits: every estimator is shift-invariant
      per row); None where only the scores are known.
    k: the event is "the true label is among the k top classes".
    labels: [N] int true classes when fitting on the log-probabilities, else None.
  """

  u: np.ndarray
  correct: np.ndarray | None = None
  log_probs: jax.Array | np.ndarray | None = None
  k: int = 1
  labels: np.ndarray | None = None


class SplitFit(NamedTuple):
  """Every split's fit at once (``Estimator.fit_splits``), read split by split.

  Attributes:
    split: ``split(f) -> (p, per_example)``: [N] P(correct) of every example under split
      f's fit, and more [N] results by name (averaged over split f's test part).
    extras: more results by name, [F]: one value per split.
  """

  split: Callable[[int], tuple[Any, Mapping[str, Any]]]
  extras: Mapping[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Estimator:
  """An estimator of P(correct) by name: its functions and what it needs.

  Attributes:
    name: the registry key.
    needs: "scores" (fitted on (U, correct) alone) or "log_probs" (also needs
      ``Evidence.log_probs``).
    fit: ``fit(evidence, **options) -> state``, a pytree or NamedTuple of arrays.
    predict: ``predict(state, evidence) -> [N]`` P(correct) in [0, 1].
    to_dict: ``to_dict(state) -> dict`` of JSON values.
    from_dict: ``from_dict(d, source) -> state``, every value checked; a bad one is a
      one-line ValueError starting with ``source`` and naming the field.
    options: the keyword options ``fit`` accepts.
    option_checks: option name -> a check of its value, so an option ``fit`` would refuse
      is refused before fitting and when a saved calibrator is read.
    predict_interval: ``(state, evidence, delta) -> (lower, upper)``, pointwise
      1 - delta intervals; None when the estimator gives none.
    cross_validate: optional fast path of ``evaluation.protocol`` for a scores-only
      estimator: ``(u, correct, n_bins, splits, **options) -> CrossValidation``.
    fit_splits: optional fast path for a log-probabilities estimator:
      ``(evidence, calibration [F, N] bool, **options) -> SplitFit``, or None where it has
      none. Either path gives the generic loop's numbers up to rounding.
  """

  name: str
  needs: str
  fit: Callable[..., Any]
  predict: Callable[[Any, Evidence], Any]
  to_dict: Callable[[Any], dict]
  from_dict: Callable[[Mapping, str], Any]
  options: tuple[str, ...] = ()
  option_checks: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
  predict_interval: Callable[[Any, Evidence, float], tuple[Any, Any]] | None = None
  cross_validate: Callable[..., Any] | None = None
  fit_splits: Callable[..., "SplitFit | None"] | None = None

  @property
  def scores_only(self) -> bool:
    return self.needs == "scores"

  def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a dict, if ``fit`` accepts every name and value (else a ValueError)."""
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      accepted = ", ".join(self.options) or "none"
      raise ValueError(
        f"{unknown[0]}: not an option of estimator {self.name!r} (it accepts: {accepted})"
      )
    for name, value in options.items():
      if name in self.option_checks:
        self.option_checks[name](value)
    return dict(options)

  def check_evidence(self, evidence: Evidence) -> Evidence:
    """``evidence`` if it holds what this estimator needs, else a one-line ValueError."""
    if self.needs == "log_probs" and evidence.log_probs is None:
      raise ValueError(
        f"estimator: {self.name!r} needs the model's log-probabilities, not only the scores"
        " U (use it through Calibrator, or pick a scores-only estimator)"
      )
    return evidence


def checked_bool(name: str, value) -> bool:
  """An option that must be a bool (NumPy's included), else a one-line ValueError."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name}: expected a bool, got {value!r}")
  return bool(value)


def host_scores(fitter: str, u, correct) -> tuple[np.ndarray, np.ndarray]:
  """Checked host [N] (u, correct) for ``fitter`` (e.g. "kde.fit"), which runs on the host;
  u in the dtype predict sees."""
  for name, value in (("u", u), ("correct", correct)):
    if validation.is_traced(value):
      raise ValueError(
        f"{name}: {fitter} needs concrete arrays (it runs on the host), got a tracer"
      )
  u, correct = validation.score_and_event("u", u, correct, host=True)
  return validation.in_device_dtype(u), correct


class OptionParams:
  """scikit-learn's ``get_params``/``set_params`` for a class whose constructor takes the
  names in ``PARAMS`` and any other keyword as a method option (kept in ``self.options``)."""

  PARAMS: tuple[str, ...] = ()

  def get_params(self, deep: bool = True) -> dict[str, Any]:
    """The constructor's arguments by name, the method's options included."""
    del deep  # no parameter is itself an estimator
    return {**{name: getattr(self, name) for name in self.PARAMS}, **self.options}

  def set_params(self, **params):
    """Sets constructor arguments or method options; returns ``self``."""
    for name, value in params.items():
      if name in self.PARAMS:
        setattr(self, name, value)
      else:
        self.options[name] = value
    return self


INT32_MAX = int(np.iinfo(np.int32).max)
"""The largest integer a saved field may hold (counts, bin and class counts are int32)."""


def saved_version(state: Any, source: str, fmt: str, what: str, versions: tuple[int, ...]) -> int:
  """The version of a saved ``what`` (e.g. "calibrator"): ``"format": fmt``, one of ``versions``."""
  if not isinstance(state, dict) or state.get("format") != fmt:
    raise ValueError(f'{source}: not a top1_jax {what} (no "format": "{fmt}")')
  version = state.get("version")
  if type(version) is not int or version not in versions:  # true == 1 == 1.0 in Python
    reads = " and ".join(map(str, versions))
    raise ValueError(f"{source}: {what} version {version!r}, this top1_jax reads {reads}")
  return version


def field(d: Mapping, name: str, source: str) -> Any:
  """``d[name]``, or a one-line ValueError naming the source and the missing field."""
  if not isinstance(d, Mapping):
    raise ValueError(f"{source}: expected an object of fields, got {type(d).__name__}")
  if name not in d:
    raise ValueError(f"{source}: field {name!r} is missing")
  return d[name]


_INT32 = np.iinfo(np.int32)
_FLOAT32 = np.finfo(np.float32)


def _holds_bool(value: Any) -> bool:
  """Whether a JSON list (of lists) holds a boolean, which NumPy would take for 0 or 1."""
  if not isinstance(value, list) or not value:
    return isinstance(value, bool)
  if isinstance(value[0], list):
    return any(_holds_bool(row) for row in value)
  return bool in map(type, value)


_NONE_FOUND = object()


def _first_not(value: Any, kinds: tuple[type, ...]) -> Any:
  """The first value of a JSON list (of lists) not of ``kinds`` (a bool never is)."""
  for item in value if isinstance(value, list) else [value]:
    if isinstance(item, list):
      bad = _first_not(item, kinds)
      if bad is not _NONE_FOUND:
        return bad
    elif isinstance(item, bool) or not isinstance(item, kinds):
      return item
  return _NONE_FOUND


def _not_held(value: Any, kind: str) -> str:
  """What a saved field holds instead of the JSON numbers of ``kind`` ("i" or "f")."""
  bad = _first_not(value, (int,) if kind == "i" else (int, float))
  if isinstance(bad, bool):
    return f"a boolean ({str(bad).lower()})"
  if isinstance(bad, float):
    return f"a number that is not an integer ({bad!r})"
  if isinstance(bad, str):
    return f"the string {bad!r:.40}"
  return "null" if bad is None else f"an object ({type(bad).__name__})"


def _check_float32(values: np.ndarray, what: str) -> None:
  """Refuses values that float32, their stored dtype, turns into an infinity or into 0."""
  big = np.abs(values) > _FLOAT32.max
  tiny = (values != 0) & (np.abs(values) < _FLOAT32.smallest_subnormal)
  for bad, problem in ((big, "overflows float32"), (tiny, "float32 rounds to 0")):
    if np.any(bad):
      value = values.reshape(-1)[np.argmax(bad.reshape(-1))]
      raise ValueError(
        f"{what} holds {value:g}, which {problem} (values are stored as float32, magnitudes"
        f" {_FLOAT32.smallest_subnormal:.3g} to {_FLOAT32.max:.3g}, or 0)"
      )


def read_array(
  d: Mapping, name: str, source: str, kind: str, ndim: int | Sequence[int] = 1
) -> np.ndarray:
  """A saved array field of rank ``ndim``: ``kind`` "f" (finite numbers float32 holds, as
  float64) or "i" (integers int32 holds, as int64); anything else is refused, not converted."""
  value = field(d, name, source)
  what = f"{source}: field {name!r}"
  try:
    arr = np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what} is not an array of numbers ({e})") from None
  ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
  if arr.ndim not in ndims:
    raise ValueError(f"{what} must have rank {ndims}, got shape {arr.shape}")
  kinds = "iu" if kind == "i" else "iuf"
  if arr.size and (arr.dtype.kind not in kinds or _holds_bool(value)):
    if kind == "i" and _first_not(value, (int,)) is _NONE_FOUND:  # integers beyond int64 and uint64
      arr = np.asarray(value, object)
    else:
      want = "integers" if kind == "i" else "numbers"
      raise ValueError(f"{what} must hold {want}, got {_not_held(value, kind)}")
  if kind == "i":
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
      bad = arr.min() if arr.min() < _INT32.min else arr.max()
      raise ValueError(f"{what} holds {bad}, outside the int32 range its values are stored in")
    return arr.astype(np.int64)
  arr = arr.astype(np.float64)
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{what} must hold finite numbers")
  _check_float32(arr, what)
  return arr


def read_number(d: Mapping, name: str, source: str, low: float, high: float) -> float:
  """A saved number in [low, high] that float32 holds, or a one-line ValueError naming the field."""
  value = field(d, name, source)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"{source}: field {name!r} must be a number, got {value!r}")
  if not low <= value <= high:  # compared as given: float() of a huge int overflows
    raise ValueError(f"{source}: field {name!r} must lie in [{low:g}, {high:g}], got {value!r}")
  if isinstance(value, int) and abs(value) > float(_FLOAT32.max):  # float() could overflow
    raise ValueError(f"{source}: field {name!r} overflows float32, its stored dtype")
  _check_float32(np.float64(value), f"{source}: field {name!r}")
  return float(value)


def read_int(d: Mapping, name: str, source: str, minimum: int = 1, maximum: int = INT32_MAX) -> int:
  """A saved integer in [``minimum``, ``maximum``], or a one-line ValueError naming it."""
  value = field(d, name, source)
  if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
    raise ValueError(
      f"{source}: field {name!r} must be an integer in [{minimum}, {maximum}], got {value!r}"
    )
  return value


def read_accuracy(d: Mapping, source: str, counts: np.ndarray, hits: np.ndarray) -> float:
  """The saved ``prior``, which must be the counts' float32 accuracy to float32 rounding."""
  prior = read_number(d, "prior", source, 0.0, 1.0)
  accuracy = np.float32(np.sum(hits)) / np.float32(np.sum(counts))
  if not abs(prior - accuracy) <= _ACCURACY_ROUNDING:
    raise ValueError(
      f"{source}: field 'prior' is {prior!r}, not the accuracy {float(accuracy):.8g} of the"
      " saved hits and counts it must be"
    )
  return prior


_ACCURACY_ROUNDING = 2.0**-20  # float32 rounding of an accuracy, written out and read back


def check_classes(state: Any, num_classes: int, source: str) -> None:
  """A saved state kept per class (with a ``num_classes``) must have the calibrator's."""
  saved = getattr(state, "num_classes", num_classes)
  if saved != num_classes:
    raise ValueError(
      f"{source}: field 'state' holds bins of {saved} classes, field 'num_classes' is"
      f" {num_classes}; a calibrator keeps one entry per class"
    )


def counts_problem(counts: np.ndarray, num_edges: int, ranks: np.ndarray) -> str | None:
  """Why saved ``counts`` [n_bins] cannot be the bin counts of data whose ``num_edges``
  distinct edges were cut at the 1-based ``ranks`` [n_bins - 1]; None if they can.

  The cumulative count C_j up to distinct edge j has r_b <= C_j < r_(b+1) for its last rank
  b; those b rise with j, the last is the last rank, and later bins are empty.
  """
  beyond = np.flatnonzero(counts[num_edges + 1 :])
  if beyond.size:
    first = num_edges + 1 + beyond[0]
    return f"{num_edges} edges make {num_edges + 1} bins, but bin {first} holds examples"
  last_rank = np.searchsorted(ranks, np.cumsum(counts[:num_edges]), side="right")
  if num_edges and (
    last_rank[0] < 1 or np.any(np.diff(last_rank) < 1) or last_rank[-1] != ranks.shape[0]
  ):
    return (
      f"the counts {counts.tolist()!r:.120} do not split {int(counts.sum())} examples at the"
      f" {num_edges} saved edges as the rank rule does"
    )
  return None


def read_bin_table(d: Mapping, source: str, num_bins: int):
  """A saved table of ``num_bins`` equal-count bins, checked: (edges, counts, hits), with
  at most num_bins - 1 strictly ascending edges and 0 <= hits <= counts."""
  edges = read_array(d, "edges", source, "f")
  counts = read_array(d, "counts", source, "i")
  hits = read_array(d, "hits", source, "i")
  if counts.shape != (num_bins,) or hits.shape != (num_bins,):
    raise ValueError(f"{source}: counts and hits must be {num_bins} integers each")
  validation.hits_within_counts(source, hits, counts)
  if edges.shape[0] > num_bins - 1 or np.any(np.diff(edges) <= 0):
    raise ValueError(f"{source}: edges must be at most {num_bins - 1} strictly ascending numbers")
  return edges, counts, hits
