"""``Calibrator``: fit a calibrated P(Top-k correct) on one model's outputs, save it, apply it.

``x`` is ``[N, K]`` logits or probabilities, or ``[S, N, K]`` MC-dropout samples or ensemble
members, anything with ``__array__``. scikit-learn's conventions, without scikit-learn.
"""

import dataclasses
import inspect
import json
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, events, scores, validation
from top1_jax.estimators import base, registry
from top1_jax.evaluation import accuracy_estimates, protocol, recalibration

FORMAT = "top1_jax.Calibrator"
VERSION = 2
"""Version 2 saves any method; version 1 (the bins' fields at the top) is still read."""
MAX_FILE_BYTES = 1 << 28
"""``load`` refuses a larger file (256 MiB) before reading it: a real one is a few MB."""


class Calibrator(base.OptionParams):
  """Calibrated P(Top-k prediction is correct) from one score (or the log-probabilities).

  Args:
    method: a name of ``estimators.registry.REGISTRY``; "bins" is the paper's.
    score: a name of ``scores.REGISTRY``, or a callable ``score(x) -> [N]`` (not saveable).
    n_bins: the bin count of "bins", or ``"cv"``: chosen from ``bin_count.DEFAULT_GRID`` by
      nested cross-validation (seed 0). Other methods are evaluated in that many bins.
    k: the event is "the true label is among the k top classes".
    inputs: ``"auto"`` (probabilities when every row lies in [0, 1] and sums to 1, logits
      when none does; a mix is refused), ``"logits"`` or ``"probs"``; decided at ``fit``.
    **options: the method's own options (e.g. kde's ``bandwidth``; isotonic's
      ``increasing`` defaults to the score's direction).

  Fitted attributes:
    state_: the estimator's fitted state; bins_: it when it is ``binning.Bins``, else None.
    n_bins_, num_classes_, inputs_, calibration_accuracy_, estimator_: the fit's bin count,
      K, input kind, Top-k accuracy and registry entry.
  """

  PARAMS = ("method", "score", "n_bins", "k", "inputs")

  def __init__(
    self,
    method: str = "bins",
    score: str | Callable[[np.ndarray], ArrayLike] = "neg_log_pmax",
    n_bins: int | str = 20,
    k: int = 1,
    inputs: str = "auto",
    **options,
  ):
    self.method = method
    self.score = score
    self.n_bins = n_bins
    self.k = k
    self.inputs = inputs
    self.options = options

  def __repr__(self) -> str:
    score = self.score if isinstance(self.score, str) else getattr(self.score, "__name__", "")
    params = {**self.get_params(), "score": score or "callable"}
    settings = ", ".join(f"{name}={value!r}" for name, value in params.items())
    return f"Calibrator({settings}; {'fitted' if hasattr(self, 'state_') else 'unfitted'})"

  def _checked(self) -> tuple[base.Estimator, dict[str, Any]]:
    """The registry entry and the options its ``fit`` gets."""
    names = registry.names()
    if self.method not in names:
      raise ValueError(f"method: expected one of {', '.join(names)}, got {self.method!r}")
    entry = registry.lookup(self.method)
    if self.inputs not in scores.INPUTS:
      raise ValueError(f"inputs: expected one of {scores.INPUTS}, got {self.inputs!r}")
    if not callable(self.score):
      found = scores.lookup(self.score) if isinstance(self.score, str) else None
      if found is None:
        raise ValueError(
          f"score: expected a callable or one of {', '.join(scores.REGISTRY)}, got {self.score!r}"
        )
      if found.inputs in ("human_probs", "labels"):
        raise ValueError(
          f"score: {self.score!r} needs {found.inputs}, which a Calibrator is not given"
        )
    if isinstance(self.n_bins, str) and self.n_bins != "cv":
      raise ValueError(f'n_bins: expected an integer or "cv", got {self.n_bins!r}')
    if self.n_bins == "cv" and "n_bins" not in entry.options:
      raise ValueError(f'n_bins: "cv" chooses a bin count; method {self.method!r} takes an integer')
    if self.n_bins != "cv":
      validation.positive_int("n_bins", self.n_bins)
    validation.positive_int("k", self.k)
    options = dict(self.options)
    if "n_bins" in entry.options:
      options["n_bins"] = self.n_bins
    if "increasing" in entry.options:
      high = not callable(self.score) and scores.lookup(self.score).confident_when_high
      options.setdefault("increasing", high)
    return entry, entry.check_options(options)

  def _score_and_log_probs(self, x: ArrayLike, num_classes: int | None, kind: str | None = None):
    """([N] host scores, [N, K] log-probabilities) of ``x`` read as ``kind`` (or ``inputs_``)."""
    arr = scores.as_log_probs(x, kind or getattr(self, "inputs_", self.inputs), name="x")
    validation.check_nonempty("x", arr, axis=-2)
    if arr.ndim == 3:
      validation.check_samples("x", arr)
    if num_classes is not None and arr.shape[-1] != num_classes:
      raise ValueError(
        f"x: expected {num_classes} classes like the calibration data, got shape {arr.shape}"
      )
    log_probs = scores.mean_log_probs(arr) if arr.ndim == 3 else jnp.asarray(arr)
    if callable(self.score):
      u = validation.float_array("score(x)", self.score(np.asarray(x)), 1, host=True)
      validation.same_length(**{"score(x)": u, "x": np.asarray(log_probs)})
      return u, log_probs
    samples = jnp.asarray(arr) if arr.ndim == 3 else None
    if scores.lookup(self.score).per_k:
      validation.positive_int("k", self.k, maximum=arr.shape[-1])
    name = scores.for_event(self.score, self.k)
    return np.asarray(scores.compute_one(name, log_probs, samples)), log_probs

  def _evidence(self, x: ArrayLike, labels: ArrayLike | None = None, *, kind: str | None = None):
    """The checked ``base.Evidence`` of ``x``: of the fitted K, or fitting as ``kind``."""
    num_classes = None if kind else getattr(self, "num_classes_", None)
    u, log_probs = self._score_and_log_probs(x, num_classes, kind)
    if labels is None:
      return base.Evidence(u, None, log_probs, self.k)
    validation.positive_int("k", self.k, maximum=log_probs.shape[-1])
    correct = np.asarray(events.topk_correct(log_probs, labels, self.k))
    labels = validation.labels_array("labels", labels, log_probs.shape[-1], host=True)
    return base.Evidence(u, correct, log_probs, self.k, labels)

  def _fitted(self) -> base.Estimator:
    if not hasattr(self, "state_"):
      raise ValueError("Calibrator: not fitted; call fit(x, labels) or Calibrator.load(path) first")
    return self.estimator_

  def _set_fitted(self, entry, state, n_bins: int, num_classes: int, accuracy: float) -> None:
    self.estimator_, self.state_ = entry, state
    self.bins_ = state if isinstance(state, binning.Bins) else None
    self.n_bins_ = int(n_bins) if self.bins_ is None else self.bins_.n_bins
    self.num_classes_ = num_classes
    self.calibration_accuracy_ = accuracy

  def fit(self, x: ArrayLike, labels: ArrayLike) -> "Calibrator":
    """Fits on ``x`` and [N] int ``labels``; a refused fit leaves the calibrator as it was."""
    entry, options = self._checked()
    if labels is None:
      raise ValueError("labels: expected [N] integer classes of x's examples, got None")
    kind = self.inputs
    if kind == "auto":
      kind = scores.input_kind("x", validation.float_array("x", x, (2, 3), host=True))
    evidence = self._evidence(x, labels, kind=kind)
    state = entry.fit(evidence, **options)
    num_classes = int(evidence.log_probs.shape[-1])
    self._set_fitted(entry, state, self.n_bins, num_classes, _accuracy(evidence.correct))
    self.inputs_ = kind
    self._fitted_on_clean(evidence)
    return self

  def scores_of(self, x: ArrayLike) -> np.ndarray:
    """[N] the uncertainty score of each example of ``x`` (what the bins cut)."""
    return self._score_and_log_probs(x, getattr(self, "num_classes_", None))[0]

  def predict_confidence(self, x: ArrayLike) -> np.ndarray:
    """[N] float32: P(the Top-k prediction is correct) for each example of ``x``."""
    entry = self._fitted()
    return np.asarray(entry.predict(self.state_, self._evidence(x)), np.float32)

  def predict_proba(self, x: ArrayLike) -> np.ndarray:
    """[N, 2] float32: (P(wrong), P(correct)) of each example's Top-k prediction, in
    scikit-learn's binary layout (``classes_ = [False, True]``)."""
    p = self.predict_confidence(x)
    return np.stack([1.0 - p, p], axis=-1)

  classes_ = np.array([False, True])

  def predict_interval(self, x: ArrayLike, delta: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper), each [N] float32: a 1 - delta interval of each example's P(correct).
    "bins": Clopper–Pearson's of the bin accuracy; "kde": Wilson's; others: a ValueError."""
    entry = self._fitted()
    if entry.predict_interval is None:
      giving = [name for name, e in registry.REGISTRY.items() if e.predict_interval is not None]
      raise ValueError(
        f"predict_interval: method {entry.name!r} gives no interval (these do: {', '.join(giving)})"
      )
    delta = validation.probability("delta", delta)
    lower, upper = entry.predict_interval(self.state_, self._evidence(x), delta)
    return np.asarray(lower, np.float32), np.asarray(upper, np.float32)

  def evaluate(self, x: ArrayLike, labels: ArrayLike) -> dict[str, float | int | None]:
    """The metrics of ``evaluation.protocol`` on held-out data, plus accuracy and num_examples.

    The bins are scored in their own bins, other methods in ``n_bins_`` equal-count bins of
    their predictions. An undefined metric (AUROC of one class, say) is None.
    """
    entry = self._fitted()
    if labels is None:
      raise ValueError("labels: evaluate scores predictions against [N] true classes, got None")
    evidence = self._evidence(x, labels)
    correct = evidence.correct
    p = np.asarray(entry.predict(self.state_, evidence), np.float32)
    if self.bins_ is not None:
      fitted, u, prior = self.bins_, evidence.u, float(self.bins_.prior)
    else:
      fitted = binning.fit(p, correct, min(self.n_bins_, correct.shape[0]))
      u, prior = p, self.calibration_accuracy_
    held = protocol.counted_in([fitted], u[None], correct[None], prior)
    scored = protocol.split_metrics([protocol.binned_predictions(held, p)])
    out: dict[str, float | int | None] = {"num_examples": int(correct.shape[0])}
    for name, value in scored.items():
      value = float(value.reshape(-1)[0])
      out[name] = value if np.isfinite(value) else None
    out["accuracy"] = int(np.sum(correct)) / correct.shape[0]
    out["num_effective_bins"] = int(out["num_effective_bins"])
    return out

  def estimate_accuracy(self, x: ArrayLike, method: str = "atc", score: str | None = None) -> float:
    """The Top-k accuracy to expect on unlabelled inputs (``evaluation.accuracy_estimates``).

    Args:
      x: [N, K] (or [S, N, K]) unlabelled inputs, as ``fit`` takes.
      method: "atc" (Garg et al. 2022), "doc" (Guillory et al. 2021),
        "average_confidence", or "calibrated" (the mean of ``predict_confidence``).
      score: ATC's score: None (this calibrator's own), or one of ``ATC_SCORES``.
    """
    entry = self._fitted()
    chosen = accuracy_estimates.lookup(method)
    reference = getattr(self, "reference_", None)
    if reference is None:
      raise ValueError(
        "estimate_accuracy: this calibrator keeps no calibration reference (saved before "
        "it was kept); fit it again"
      )
    own = self.score if isinstance(self.score, str) else OWN_SCORE
    name = own if score is None else score
    if score is not None and (not chosen.on_score or method == "calibrated") and score != own:
      raise ValueError(
        f"score: method {method!r} reads no score of choice (its own: the model's confidence "
        "or this calibrator's P(correct)); leave score=None"
      )
    if chosen.on_score and name not in reference.thresholds:
      raise ValueError(
        f"score: expected one of {', '.join(reference.thresholds)} (the scores whose "
        f"threshold fit kept), got {score!r}"
      )
    evidence = self._evidence(x)
    views = accuracy_estimates.Views(_confidence(evidence))
    if chosen.on_score:
      u = evidence.u if name == own else _score_of(name, evidence)
      p = np.asarray(entry.predict(self.state_, evidence)) if method == "calibrated" else None
      views = views._replace(score=name, u=u, p_correct=p)
    return accuracy_estimates.predicted_accuracy(method, reference, views)

  def update(
    self, x: ArrayLike, labels: ArrayLike, prior_strength: float | None = None
  ) -> "Calibrator":
    """Takes labelled examples of shifted data ``x``, ``labels`` in; returns ``self``.

    Each bin's probability becomes ``(s p_b + h_b) / (s + n_b)``: the clean fit's p_b worth
    ``prior_strength`` s pseudo-counts (None: chosen by leave-one-out likelihood) plus the
    bin's h_b hits of n_b new examples. Other methods are refitted on the new examples alone.
    """
    entry = self._fitted()
    number = isinstance(prior_strength, (int, float)) and not isinstance(prior_strength, bool)
    if prior_strength is not None and not (number and prior_strength > 0):
      raise ValueError(f"prior_strength: expected a number > 0 or None, got {prior_strength!r}")
    evidence = self._evidence(x, labels)
    if isinstance(self.state_, binning.Bins):
      clean = getattr(self, "clean_bins_", self.state_)
      update = recalibration.bin_update(clean, evidence, prior_strength)
      self._apply_update(clean, update)
      return self
    _, options = self._checked()
    state = entry.fit(evidence, **options)
    self._set_fitted(entry, state, self.n_bins_, self.num_classes_, _accuracy(evidence.correct))
    return self

  def _apply_update(self, clean: binning.Bins, update: "recalibration.BinUpdate") -> None:
    self.clean_bins_, self.update_ = clean, update
    self.state_ = self.bins_ = recalibration.applied(clean, update)
    self.estimator_ = dataclasses.replace(
      registry.lookup(self.estimator_.name),
      predict_interval=lambda state, evidence, delta: recalibration.update_interval(
        update, clean, evidence, delta
      ),
    )

  def _fitted_on_clean(self, evidence: base.Evidence) -> None:
    """Keeps what ``estimate_accuracy`` needs (``reference_``); forgets an earlier update."""
    for name in ("clean_bins_", "update_"):
      self.__dict__.pop(name, None)
    own = self.score if isinstance(self.score, str) else OWN_SCORE
    u = {own: evidence.u}
    for name in ATC_SCORES:
      u.setdefault(name, _score_of(name, evidence))
    self.reference_ = accuracy_estimates.reference(evidence.correct, _confidence(evidence), u)

  def to_dict(self) -> dict[str, Any]:
    """The fitted calibrator as plain JSON-able values (``from_dict`` reads it back)."""
    entry = self._fitted()
    if callable(self.score):
      raise ValueError("score: a callable score cannot be saved; use a registered score name")
    try:
      json.dumps(self.options, allow_nan=False)
    except (TypeError, ValueError):
      raise ValueError(f"options: only JSON values can be saved, got {self.options!r}") from None
    requested = {"n_bins_requested": "cv"} if self.n_bins == "cv" else {}
    return {
      "format": FORMAT,
      "version": VERSION,
      "method": entry.name,
      "score": self.score,
      "n_bins": self.n_bins_,  # the count used, also when chosen by "cv"
      **requested,
      "k": self.k,
      "inputs": self.inputs_,
      "num_classes": self.num_classes_,
      "calibration_accuracy": self.calibration_accuracy_,
      "options": dict(self.options),
      "state": entry.to_dict(getattr(self, "clean_bins_", self.state_)),
      **_reference_dict(self),
    }

  @classmethod
  def from_dict(cls, state: Any, source: str = "state") -> "Calibrator":
    """A fitted calibrator from ``to_dict``'s values (version 2, or 1), each checked."""
    version = base.saved_version(state, source, FORMAT, "calibrator", (1, VERSION))
    if version == 1:  # the bins' fields at the top, into version 2's layout
      fields = ("edges", "counts", "hits", "prior", "prob")
      bins = {"n_bins": state.get("n_bins"), **{f: state[f] for f in fields if f in state}}
      state = {**state, "method": "bins", "options": {}, "state": bins}
    try:
      options = state["options"]
      if not isinstance(options, dict):
        raise ValueError(f"options: expected an object, got {options!r}")
      requested = "cv" if state.get("n_bins_requested") == "cv" else state["n_bins"]
      settings = {name: state[name] for name in ("method", "score", "k", "inputs")}
      cal = cls(**settings, n_bins=requested, **options)
      entry, _ = cal._checked()
      _check_option_types(entry, options)
      n_bins = validation.positive_int("n_bins", state["n_bins"], maximum=base.INT32_MAX)
      num_classes = validation.positive_int(
        "num_classes", state["num_classes"], minimum=2, maximum=base.INT32_MAX
      )
      validation.positive_int("k", cal.k, maximum=num_classes)
    except KeyError as e:
      raise ValueError(f"{source}: calibrator field {e} is missing") from None
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: bad calibrator field ({e})") from None
    fitted = entry.from_dict(base.field(state, "state", source), source)
    base.check_classes(fitted, num_classes, source)
    if isinstance(fitted, binning.Bins) and fitted.n_bins != n_bins:
      raise ValueError(f"{source}: n_bins is {n_bins}, the saved bins have {fitted.n_bins}")
    if version == 1:  # the bins' prior is the calibration accuracy
      accuracy = float(fitted.prior)
    else:
      accuracy = base.read_number(state, "calibration_accuracy", source, 0.0, 1.0)
    cal._set_fitted(entry, fitted, n_bins, num_classes, accuracy)
    cal.inputs_ = cal.inputs
    _read_reference(cal, state, source)
    return cal

  def save(self, path) -> None:
    """Writes the fitted calibrator as versioned JSON (atomically; local or a URL)."""
    from top1_jax.io import files  # the I/O layer, imported only when a file is written

    files.write_json(path, self.to_dict())

  @classmethod
  def load(cls, path) -> "Calibrator":
    """Reads a calibrator written by ``save``; a corrupt or hostile file is a one-line
    ValueError naming the file and field."""
    from top1_jax.io import files  # the I/O layer, imported only when a file is read

    state = files.read_strict_json(path, MAX_FILE_BYTES, "a top1_jax calibrator")
    return cls.from_dict(state, str(path))


def _accuracy(correct: np.ndarray) -> float:
  return float(np.float32(np.sum(correct)) / np.float32(correct.shape[0]))


ATC_SCORES = ("neg_log_pmax", "entropy")
"""The scores whose ATC threshold ``fit`` keeps beside its own (Garg et al.'s two)."""
OWN_SCORE = "score"  # how ``reference_`` names a callable score's threshold


def _confidence(evidence: base.Evidence) -> np.ndarray:
  """[N] the model's own P(Top-k correct): the ``raw`` method's prediction."""
  return np.asarray(registry.lookup("raw").predict(None, evidence), np.float64)


def _score_of(name: str, evidence: base.Evidence) -> np.ndarray:
  return np.asarray(scores.compute_one(scores.for_event(name, evidence.k), evidence.log_probs))


def _reference_dict(cal: Calibrator) -> dict:
  """``to_dict``'s fields of the reference and of an update, where there are any."""
  out = {}
  reference = getattr(cal, "reference_", None)
  if reference is not None:
    thresholds = {k: list(v) for k, v in reference.thresholds.items()}
    out["reference"] = {**reference._asdict(), "thresholds": thresholds}
  update = getattr(cal, "update_", None)
  if update is not None:
    strength = update.prior_strength
    out["update"] = {
      "counts": update.counts.tolist(),
      "hits": update.hits.tolist(),
      "prior_strength": strength if np.isfinite(strength) else None,
    }
  return out


def _read_reference(cal: Calibrator, state: dict, source: str) -> None:
  """The reference and update ``_reference_dict`` wrote, each field checked."""
  if "reference" in state:
    saved = base.field(state, "reference", source)
    thresholds = base.field(saved, "thresholds", source)
    if not isinstance(thresholds, dict):
      raise ValueError(f"{source}: field 'thresholds' must be an object of score -> [t, w]")
    kept = {}
    for name, value in thresholds.items():
      if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"{source}: threshold {name!r} must be [value, tie weight]")
      pair = dict(zip(("value", "tie_weight"), value, strict=True))
      kept[name] = accuracy_estimates.Threshold(
        base.read_number(pair, "value", source, -np.inf, np.inf),
        base.read_number(pair, "tie_weight", source, 0, 1),
      )
    cal.reference_ = accuracy_estimates.Reference(
      base.read_number(saved, "accuracy", source, 0.0, 1.0),
      base.read_number(saved, "confidence", source, 0.0, 1.0),
      kept,
    )
  if "update" in state:
    saved = base.field(state, "update", source)
    if not isinstance(cal.state_, binning.Bins):
      raise ValueError(f"{source}: field 'update' goes with the bins, not {cal.method!r}")
    counts = base.read_array(saved, "counts", source, "i")
    hits = base.read_array(saved, "hits", source, "i")
    if counts.shape != (cal.state_.n_bins,) or hits.shape != counts.shape:
      raise ValueError(f"{source}: the update's counts and hits must be {cal.state_.n_bins} each")
    if np.any(hits < 0) or np.any(hits > counts):
      raise ValueError(f"{source}: the update needs 0 <= hits <= counts in every bin")
    strength = np.inf  # saved as null
    if base.field(saved, "prior_strength", source) is not None:
      strength = base.read_number(saved, "prior_strength", source, 0.0, np.inf)
      if strength == 0:
        raise ValueError(f"{source}: field 'prior_strength' must be > 0 or null, got 0")
    cal._apply_update(cal.state_, recalibration.BinUpdate(counts, hits, strength))


def _check_option_types(entry: base.Estimator, options: dict) -> None:
  """Each saved option must have the JSON type of ``fit``'s default for it."""
  parameters = inspect.signature(entry.fit).parameters
  for name, value in options.items():
    default = parameters[name].default if name in parameters else None
    if default is None or default is inspect.Parameter.empty:
      continue
    number = isinstance(default, (int, float)) and not isinstance(default, bool)
    kinds = ((int,) if isinstance(default, int) else (int, float)) if number else (type(default),)
    if not isinstance(value, kinds) or (number and isinstance(value, bool)):
      want = type(default).__name__
      raise ValueError(
        f"options: {name} must be a {want} (like its default {default!r}), got {value!r}"
      )
