"""``SetPredictor``: sets of labels that hold the true one with probability >= 1 - alpha.

The guarantee is split conformal's: on average over exchangeable calibration and new
examples, not per example (docs/sets.md). scikit-learn's conventions, as ``Calibrator``.
"""

import math
from typing import Any

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import scores, validation
from top1_jax.estimators import base
from top1_jax.evaluation import conformal, sets

FORMAT = "top1_jax.SetPredictor"
VERSION = 1
MAX_FILE_BYTES = 1 << 28
"""``load`` refuses a larger file (256 MiB) before reading it."""


class SetPredictor(base.OptionParams):
  """Prediction sets with a split-conformal coverage guarantee.

  Args:
    method: a name of ``evaluation.sets.METHODS``: "lac", "aps", "raps" or "topk" (the
      paper's calibrated P(label in Top-k)).
    inputs: what ``x`` [N, K] holds: ``"auto"`` (decided once at ``fit``, as
      ``Calibrator`` does), ``"logits"`` or ``"probs"``.
    seed: of the random draws (the randomized methods' u, raps' and topk's tuning part):
      the same inputs get the same sets.
    **options: the method's options. ``randomized`` (aps, raps: True; topk: False): True
      reaches 1 - alpha exactly and a set may be empty; False always includes the top
      label. raps: ``k_reg``, ``lam`` (None: its paper's rule on a random
      ``tune_fraction`` = 0.3, for ``tune_alpha`` = 0.1). topk: ``n_bins`` (20, for each k)
      and ``tune_fraction`` (0.5: the bins' share of the data).

  Fitted attributes:
    method_: the fitted ``evaluation.sets.SetMethod``; options_: its checked options.
    params_: None (lac, aps), ``(k_reg, lam)`` (raps), the stacked ``Bins`` of every k (topk).
    calibration_scores_: [n] float32, ascending, the conformal part's scores.
    num_classes_: K of the calibration data; seed_: the fit's seed, used by predictions too.
  """

  PARAMS = ("method", "inputs", "seed")

  def __init__(self, method: str = "aps", inputs: str = "auto", seed: int = 0, **options):
    self.method = method
    self.inputs = inputs
    self.seed = seed
    self.options = options

  def __repr__(self) -> str:
    settings = ", ".join(f"{name}={value!r}" for name, value in self.get_params().items())
    fitted = "fitted" if hasattr(self, "calibration_scores_") else "unfitted"
    return f"SetPredictor({settings}; {fitted})"

  def _checked(self) -> tuple[sets.SetMethod, dict[str, Any], int]:
    """The method, its checked options and the seed."""
    method = sets.lookup(self.method)
    if self.inputs not in scores.INPUTS:
      raise ValueError(f"inputs: expected one of {scores.INPUTS}, got {self.inputs!r}")
    seed = validation.positive_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
    return method, sets.checked_options(method, self.options), seed

  def _logits(self, x: ArrayLike, num_classes: int | None, kind: str | None = None):
    """``x`` as checked host [N, K] float32 logits, read as ``kind`` (default ``inputs_``)."""
    arr = scores.as_log_probs(x, kind or getattr(self, "inputs_", self.inputs), name="x", ndim=2)
    validation.check_nonempty("x", arr)
    if num_classes is not None and arr.shape[-1] != num_classes:
      raise ValueError(
        f"x: expected {num_classes} classes like the calibration data, got shape {arr.shape}"
      )
    return arr

  def _fitted(self) -> sets.SetMethod:
    if not hasattr(self, "calibration_scores_"):
      raise ValueError(
        "SetPredictor: not fitted; call fit(x, labels) or SetPredictor.load(path) first"
      )
    return self.method_

  def _set_fitted(self, method, options, seed: int, fitted: sets.Calibrated, num_classes, inputs):
    self.method_, self.options_, self.seed_ = method, options, seed
    self.params_, self.calibration_scores_ = fitted.params, fitted.scores
    self.num_classes_, self.inputs_ = num_classes, inputs

  def fit(self, x: ArrayLike, labels: ArrayLike) -> "SetPredictor":
    """Fits the method on [N, K] ``x`` and [N] int ``labels``; returns ``self``. A refused
    fit leaves the predictor as it was."""
    method, options, seed = self._checked()
    kind = self.inputs
    if kind == "auto":
      kind = scores.input_kind("x", validation.float_array("x", x, 2, host=True))
    logits = self._logits(x, None, kind)
    labels = validation.labels_array("labels", labels, logits.shape[-1], host=True)
    validation.same_length(x=logits, labels=labels)
    sets.check_sizes(method, options, logits.shape[0], "x")
    u, tuning = sets.fit_draws(method, seed, logits.shape[0], options)
    fitted = sets.calibrate(method, conformal.ranked(logits, labels), u, tuning, options)
    self._set_fitted(method, options, seed, fitted, logits.shape[-1], kind)
    return self

  def threshold(self, alpha: float = 0.1) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest calibration score; +inf (every set full)
    when alpha < 1 / (n + 1)."""
    self._fitted()
    return conformal.threshold(self.calibration_scores_, validation.probability("alpha", alpha))

  def _sizes(self, data: conformal.Ranked, alpha: float) -> np.ndarray:
    fitted = sets.Calibrated(self.params_, self.calibration_scores_)
    return sets.predict_sizes(self.method_, fitted, data, [alpha], self.seed_, self.options_)[0]

  def predict_set(self, x: ArrayLike, alpha: float = 0.1) -> np.ndarray:
    """[N, K] bool: each example's set of labels at miscoverage level ``alpha`` in (0, 1),
    nested in alpha; below 1 / (n + 1), for n calibration scores, every set is full."""
    self._fitted()
    alpha = validation.probability("alpha", alpha)
    logits = self._logits(x, self.num_classes_)
    data = conformal.ranked(logits)
    size = conformal.bucket(data.num)
    lengths = conformal.pad_rows(self._sizes(data, alpha), size)
    order = conformal.sorted_rows(data, size)
    mask = conformal.prefix_mask(conformal.pad_rows(logits, size), order, lengths)
    return np.asarray(mask)[: data.num]

  def evaluate(self, x: ArrayLike, labels: ArrayLike, alpha: float = 0.1) -> dict[str, Any]:
    """The sets of held-out data at level ``alpha`` scored by ``conformal.set_metrics``
    (None for an empty stratum), plus num_examples."""
    self._fitted()
    alpha = validation.probability("alpha", alpha)
    logits = self._logits(x, self.num_classes_)
    labels = validation.labels_array("labels", labels, self.num_classes_, host=True)
    validation.same_length(x=logits, labels=labels)
    data = conformal.ranked(logits, labels)
    metrics = conformal.set_metrics(self._sizes(data, alpha), data.rank, alpha)
    defined = {name: None if math.isnan(value) else value for name, value in metrics.items()}
    return {"num_examples": int(labels.shape[0]), **defined}

  def to_dict(self) -> dict[str, Any]:
    """The fitted predictor as plain JSON-able values (``from_dict`` reads it back)."""
    method = self._fitted()
    return {
      "format": FORMAT,
      "version": VERSION,
      "method": method.name,
      "inputs": self.inputs_,
      "seed": self.seed_,
      "options": {name: self.options_[name] for name in self.options},  # the checked values
      "num_classes": self.num_classes_,
      "calibration_scores": self.calibration_scores_.astype(np.float64).tolist(),
      "params": method.to_dict(self.params_),
    }

  @classmethod
  def from_dict(cls, state: Any, source: str = "state") -> "SetPredictor":
    """A fitted predictor from ``to_dict``'s values, each checked."""
    base.saved_version(state, source, FORMAT, "set predictor", (VERSION,))
    try:
      options = state["options"]
      if not isinstance(options, dict):
        raise ValueError(f"options: expected an object, got {options!r}")
      predictor = cls(**{name: state[name] for name in cls.PARAMS}, **options)
      method, checked, seed = predictor._checked()
      num_classes = validation.positive_int(
        "num_classes", state["num_classes"], minimum=2, maximum=base.INT32_MAX
      )
    except KeyError as e:
      raise ValueError(f"{source}: set predictor field {e} is missing") from None
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: bad set predictor field ({e})") from None
    calibration = base.read_array(state, "calibration_scores", source, "f")
    if calibration.size == 0:
      raise ValueError(f"{source}: field 'calibration_scores' is empty; fit on some data")
    params = method.from_dict(base.field(state, "params", source), source, num_classes)
    fitted = sets.Calibrated(params, np.sort(calibration.astype(np.float32)))
    predictor._set_fitted(method, checked, seed, fitted, num_classes, predictor.inputs)
    return predictor

  def save(self, path) -> None:
    """Writes the fitted predictor as versioned JSON (atomically; local or a URL)."""
    from top1_jax.io import files  # the I/O layer, imported only when a file is written

    files.write_json(path, self.to_dict())

  @classmethod
  def load(cls, path) -> "SetPredictor":
    """Reads a predictor written by ``save``; a corrupt or hostile file is a one-line
    ValueError naming the file and field."""
    from top1_jax.io import files  # the I/O layer, imported only when a file is read

    state = files.read_strict_json(path, MAX_FILE_BYTES, "a top1_jax set predictor")
    return cls.from_dict(state, str(path))
