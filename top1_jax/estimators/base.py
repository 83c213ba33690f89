"""The one protocol every estimator of P(correct) follows, and the evidence it is fitted on.

An ``Estimator`` is a frozen dataclass of a name and plain functions, not a base class
or a ``typing.Protocol`` that each estimator subclasses or implements:

* an entry is a value: ``registry.REGISTRY`` maps names to such values, and a new
  estimator (or a test's toy) is one constructor call, with no class to write;
* the checks every caller needs (which options an estimator accepts, whether the
  evidence holds the inputs it needs) are written once, here, as its methods;
* frozen, so a registered entry cannot be changed in place by accident.

The maths stay in the estimator's module as ordinary functions (``isotonic.fit``,
``kde.predict``, ...); an entry only adapts them to ``Evidence``.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

NEEDS = ("scores", "log_probs")
"""What an estimator is fitted on: the scores U alone, or the model's log-probabilities."""


class Evidence(NamedTuple):
  """What an estimator is fitted on, or predicts for (checked by its caller).

  Attributes:
    u: [N] float, the uncertainty score of each example (host array).
    correct: [N] bool, whether each example's Top-k prediction is correct; None when
      predicting.
    log_probs: [N, K] float, the model's log-probabilities (or logits: every
      estimator here is shift-invariant per row); None where only the scores are
      known (cross-validation of a score).
    k: the event is "the true label is among the k top classes".
    labels: [N] int true classes, when fitting with the log-probabilities (temperature
      scaling minimises the multiclass NLL); None otherwise.
  """

  u: np.ndarray
  correct: np.ndarray | None = None
  log_probs: jax.Array | np.ndarray | None = None
  k: int = 1
  labels: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Estimator:
  """An estimator of P(correct) by name: its functions and what it needs.

  Attributes:
    name: the registry key (``Calibrator(method=name)``, ``cross_validate(estimator=name)``).
    needs: "scores" (fitted on (U, correct) alone: cross-validation of a score can run
      it) or "log_probs" (also needs ``Evidence.log_probs``, e.g. the predicted class).
    fit: ``fit(evidence, **options) -> state``, a pytree or NamedTuple of arrays.
    predict: ``predict(state, evidence) -> [N]`` P(correct) in [0, 1].
    to_dict: ``to_dict(state) -> dict`` of JSON values (lists, numbers, strings).
    from_dict: ``from_dict(d, source) -> state``, every value checked; a bad one is a
      one-line ValueError starting with ``source`` (the file) and naming the field.
    options: the keyword options ``fit`` accepts (their defaults are ``fit``'s own).
    predict_interval: ``predict_interval(state, evidence, delta) -> (lower, upper)``,
      each [N], a pointwise 1 - delta interval; None when the estimator gives none.
    cross_validate: a fast path ``cross_validate(u, correct, n_bins, splits, **options)
      -> splits.CrossValidation`` for checked host arrays, a tuple of bin counts and
      ``splits.Splits`` made for N; None: the generic fit/predict loop of
      ``evaluation.crossval`` (the same numbers up to rounding, one split at a time).
  """

  name: str
  needs: str
  fit: Callable[..., Any]
  predict: Callable[[Any, Evidence], Any]
  to_dict: Callable[[Any], dict]
  from_dict: Callable[[Mapping, str], Any]
  options: tuple[str, ...] = ()
  predict_interval: Callable[[Any, Evidence, float], tuple[Any, Any]] | None = None
  cross_validate: Callable[..., Any] | None = None

  @property
  def scores_only(self) -> bool:
    """Whether it is fitted on (U, correct) alone."""
    return self.needs == "scores"

  def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as a dict, if ``fit`` accepts every name (their values ``fit`` checks)."""
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      accepted = ", ".join(self.options) or "none"
      raise ValueError(
        f"{unknown[0]}: not an option of estimator {self.name!r} (it accepts: {accepted})"
      )
    return dict(options)

  def check_evidence(self, evidence: Evidence) -> Evidence:
    """``evidence`` if it holds what this estimator needs, else a one-line ValueError."""
    if self.needs == "log_probs" and evidence.log_probs is None:
      raise ValueError(
        f"estimator: {self.name!r} needs the model's log-probabilities, not only the scores"
        " U (use it through Calibrator, or pick a scores-only estimator)"
      )
    return evidence


# Reading a saved state: one checked value per field, each failure one line naming it.


def field(d: Mapping, name: str, source: str) -> Any:
  """``d[name]``, or a one-line ValueError naming the source and the missing field."""
  if not isinstance(d, Mapping):
    raise ValueError(f"{source}: expected an object of fields, got {type(d).__name__}")
  if name not in d:
    raise ValueError(f"{source}: field {name!r} is missing")
  return d[name]


def read_array(
  d: Mapping, name: str, source: str, kind: str, ndim: int | Sequence[int] = 1
) -> np.ndarray:
  """A saved array field, checked: ``kind`` "f" (finite floats, as float64) or "i"
  (integers, as int64), of rank ``ndim``."""
  value = field(d, name, source)
  try:
    if kind == "f":
      arr = np.asarray(value, np.float64)
    else:
      arr = np.asarray(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: field {name!r} is not an array of numbers ({e})") from None
  ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
  if arr.ndim not in ndims:
    raise ValueError(f"{source}: field {name!r} must have rank {ndims}, got shape {arr.shape}")
  if kind == "i" and arr.size and arr.dtype.kind not in "iu":
    raise ValueError(f"{source}: field {name!r} must hold integers, got {arr.dtype}")
  if kind == "f" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{source}: field {name!r} must hold finite numbers")
  return arr.astype(np.int64) if kind == "i" else arr


def read_number(d: Mapping, name: str, source: str, low: float, high: float) -> float:
  """A saved number in [low, high], or a one-line ValueError naming the field."""
  value = field(d, name, source)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"{source}: field {name!r} must be a number, got {value!r}")
  if not low <= float(value) <= high:
    raise ValueError(f"{source}: field {name!r} must lie in [{low:g}, {high:g}], got {value!r}")
  return float(value)


def read_int(d: Mapping, name: str, source: str, minimum: int = 1) -> int:
  """A saved integer >= ``minimum``, or a one-line ValueError naming the field."""
  value = field(d, name, source)
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{source}: field {name!r} must be an integer >= {minimum}, got {value!r}")
  return value
