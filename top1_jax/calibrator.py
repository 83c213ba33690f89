"""``Calibrator``: fit calibrated Top-k bins on one model's outputs, save them, apply them.

The practitioner's face of the paper::

  cal = Calibrator(score="neg_log_pmax", n_bins=20, k=1, inputs="logits").fit(x, labels)
  p = cal.predict_proba(x_new)                  # [N] P(the Top-k prediction is correct)
  lo, hi = cal.predict_interval(x_new, delta=0.05)
  cal.evaluate(x_test, labels_test)             # accuracy, brier, nll, ece, eor, auroc, ...
  cal.save("cal.json"); cal = Calibrator.load("cal.json")

``x`` is ``[N, K]`` logits or probabilities, or ``[S, N, K]`` MC-dropout samples or
ensemble members (then the classifier is their mean in probability space, and the
sample scores such as ``covariance_norm_probs`` become available). Anything with
``__array__`` works: NumPy, JAX, a CPU torch tensor.

Probabilities are turned into log-probabilities in float64 before scoring
(``scores.log_probs_from_probs``): real networks give probabilities that underflow
to 1e-37 or 0, and a score computed from the largest probability alone (1.0 for all
of them) would tie; from the log of the others it stays distinct.
"""

import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, events, metrics, scores, validation
from top1_jax.estimators import bin_count

FORMAT = "top1_jax.Calibrator"
VERSION = 1
INPUTS = ("logits", "probs")


class Calibrator:
  """Calibrated P(Top-k prediction is correct) from equal-count bins of one score.

  Args:
    score: a registered score name (``scores.REGISTRY``; ``neg_log_topk_mass``
      takes ``k``), or a callable ``score(x) -> [N]`` of the raw input (not
      saveable).
    n_bins: equal-count bins fitted on the calibration data, or ``"cv"``: the count
      of ``bin_count.DEFAULT_GRID`` with the lowest held-out NLL in nested
      cross-validation on the calibration data (``bin_count.fit_cv``, seed 0);
      ``n_bins_chosen`` holds the count used once fitted.
    k: the event is "the true label is among the k top classes".
    inputs: ``"logits"`` or ``"probs"``: what ``x`` holds.
  """

  def __init__(
    self,
    score: str | Callable[[np.ndarray], ArrayLike] = "neg_log_pmax",
    n_bins: int | str = 20,
    k: int = 1,
    inputs: str = "logits",
  ):
    if inputs not in INPUTS:
      raise ValueError(f"inputs: expected one of {INPUTS}, got {inputs!r}")
    if not callable(score):
      if not isinstance(score, str) or scores.lookup(score) is None:
        raise ValueError(
          f"score: expected a callable or one of {', '.join(scores.REGISTRY)}, got {score!r}"
        )
      if scores.lookup(score).inputs in ("human_probs", "labels"):
        raise ValueError(
          f"score: {score!r} needs {scores.lookup(score).inputs}, which a Calibrator is not given"
        )
    self.score = score
    if isinstance(n_bins, str) and n_bins != "cv":
      raise ValueError(f'n_bins: expected an integer or "cv", got {n_bins!r}')
    self.n_bins = n_bins if n_bins == "cv" else validation.positive_int("n_bins", n_bins)
    self.n_bins_chosen: int | None = None
    self.k = validation.positive_int("k", k)
    self.inputs = inputs
    self.bins: binning.Bins | None = None
    self.num_classes: int | None = None

  def __repr__(self) -> str:
    name = (
      self.score if isinstance(self.score, str) else getattr(self.score, "__name__", "callable")
    )
    state = (
      "unfitted" if self.bins is None else f"fitted on {int(np.sum(self.bins.counts))} examples"
    )
    settings = f"score={name!r}, n_bins={self.n_bins!r}, k={self.k}, inputs={self.inputs!r}"
    return f"Calibrator({settings}; {state})"

  # The input, scored: the one path every method takes.

  def _log_space(self, x: ArrayLike) -> np.ndarray:
    """``x`` as logits / log-probabilities, [N, K] or [S, N, K] float32, checked."""
    arr = validation.float_array("x", x, (2, 3), host=True)
    if self.inputs == "probs":
      validation.probability_array("x", arr, (2, 3), sums_to_one=True)
      arr = scores.log_probs_from_probs(arr)
    if arr.shape[-1] < 2:
      raise ValueError(f"x: expected at least 2 classes on the last axis, got shape {arr.shape}")
    validation.check_nonempty("x", arr, axis=-2)
    if self.num_classes is not None and arr.shape[-1] != self.num_classes:
      raise ValueError(
        f"x: expected {self.num_classes} classes like the calibration data, got shape {arr.shape}"
      )
    return arr.astype(np.float32)

  def _score_and_log_probs(self, x: ArrayLike) -> tuple[np.ndarray, jnp.ndarray]:
    arr = self._log_space(x)
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

  def _score_and_correct(self, x: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    u, log_probs = self._score_and_log_probs(x)
    validation.positive_int("k", self.k, maximum=log_probs.shape[-1])
    correct = events.topk_correct(log_probs, labels, self.k)
    return u, np.asarray(correct)

  def _fitted(self) -> binning.Bins:
    if self.bins is None:
      raise ValueError("Calibrator: not fitted; call fit(x, labels) or Calibrator.load(path) first")
    return self.bins

  # The interface.

  def fit(self, x: ArrayLike, labels: ArrayLike) -> "Calibrator":
    """Fits the bins on calibration data; returns ``self``.

    Args:
      x: [N, K] logits or probabilities (``inputs``), or [S, N, K] samples.
      labels: [N] int true classes.
    """
    num_classes, self.num_classes = self.num_classes, None  # any K may be fitted anew
    try:
      u, correct = self._score_and_correct(x, labels)
      if self.n_bins == "cv":
        bins, n_bins = bin_count.fit_cv(u, correct)
      else:
        n_bins = validation.positive_int("n_bins", self.n_bins, maximum=u.shape[0])
        bins = binning.fit(u, correct, n_bins)
    except ValueError:
      self.num_classes = num_classes  # a refused fit leaves the calibrator as it was
      raise
    self.bins, self.n_bins_chosen = bins, n_bins
    self.num_classes = int(np.shape(x)[-1])
    return self

  def scores_of(self, x: ArrayLike) -> np.ndarray:
    """[N] the uncertainty score of each example of ``x`` (what the bins cut)."""
    return self._score_and_log_probs(x)[0]

  def predict_proba(self, x: ArrayLike) -> np.ndarray:
    """[N] float32: P(the Top-k prediction is correct) for each example of ``x``."""
    bins = self._fitted()
    u, _ = self._score_and_log_probs(x)
    return np.asarray(binning.predict(bins, u))

  def predict_interval(self, x: ArrayLike, delta: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """The exact (Clopper–Pearson) 1 - delta interval of each example's bin accuracy.

    Returns:
      (lower, upper), each [N] float32 in [0, 1].
    """
    bins = self._fitted()
    lower, upper = binning.clopper_pearson(bins.hits, bins.counts, delta)
    u, _ = self._score_and_log_probs(x)
    index = np.asarray(binning.assign(bins.edges, u))
    return np.asarray(lower)[index], np.asarray(upper)[index]

  def evaluate(self, x: ArrayLike, labels: ArrayLike) -> dict[str, float | int | None]:
    """The calibrated predictions scored on held-out data.

    Returns:
      accuracy (of the Top-k event), brier, nll, ece, eor, auroc, and the Brier and
      NLL decompositions (``*_uncertainty``, ``*_resolution``, ``*_calibration``),
      plus ``num_examples`` and ``num_effective_bins``. AUROC is None when the data
      holds only correct or only wrong predictions, EOR when the calibration data
      did (they are undefined there).
    """
    bins = self._fitted()
    u, correct = self._score_and_correct(x, labels)
    test = binning.refit(bins, u, correct)
    brier = metrics.brier_decomposition(bins, test)
    nll = metrics.nll_decomposition(bins, test)
    num_correct = int(np.sum(correct))
    one_class = num_correct in (0, correct.shape[0])
    prior = float(bins.prior)
    out: dict[str, float | int | None] = {
      "num_examples": int(correct.shape[0]),
      "accuracy": num_correct / correct.shape[0],
      "brier": float(brier.total),
      "nll": float(nll.total),
      "ece": float(metrics.ece(bins, test)),
      # The odds ratio needs a base rate strictly inside (0, 1).
      "eor": float(metrics.eor_from_probs(bins.prob, test.counts, bins.prior))
      if 0.0 < prior < 1.0
      else None,
      "auroc": None
      if one_class
      else float(metrics.auroc_from_counts(bins.prob, test.counts, test.hits)),
      "num_effective_bins": int(bins.num_effective_bins),
    }
    for name, parts in (("brier", brier), ("nll", nll)):
      for part in ("uncertainty", "resolution", "calibration"):
        out[f"{name}_{part}"] = float(getattr(parts, part))
    return out

  # Saving and loading.

  def to_dict(self) -> dict[str, Any]:
    """The fitted calibrator as plain JSON-able values (``from_dict`` reads it back)."""
    bins = self._fitted()
    if callable(self.score):
      raise ValueError("score: a callable score cannot be saved; use a registered score name")
    edges = np.asarray(bins.edges, np.float64)
    requested = {"n_bins_requested": "cv"} if self.n_bins == "cv" else {}
    return {
      "format": FORMAT,
      "version": VERSION,
      "score": self.score,
      "n_bins": int(bins.counts.shape[0]),  # the count used, also when chosen by "cv"
      **requested,
      "k": self.k,
      "inputs": self.inputs,
      "num_classes": self.num_classes,
      "edges": edges[np.isfinite(edges)].tolist(),
      "counts": np.asarray(bins.counts).tolist(),
      "hits": np.asarray(bins.hits).tolist(),
      "prior": float(bins.prior),
      "prob": np.asarray(bins.prob, np.float64).tolist(),
    }

  @classmethod
  def from_dict(cls, state: Any, source: str = "state") -> "Calibrator":
    """A fitted calibrator from ``to_dict``'s values, each checked."""
    return _from_dict(cls, state, source)

  def save(self, path) -> None:
    """Writes the fitted calibrator as versioned JSON (atomically; local or a URL)."""
    from top1_jax.io import files  # the I/O layer, imported only when a file is written

    files.write_json(path, self.to_dict())

  @classmethod
  def load(cls, path) -> "Calibrator":
    """Reads a calibrator written by ``save``; a corrupt or foreign file is a ValueError."""
    from top1_jax.io import files

    try:
      state = json.loads(files.read_text(path))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not a top1_jax calibrator (invalid JSON: {e})") from None
    return cls.from_dict(state, str(path))


def _from_dict(cls, state: Any, source: str) -> Calibrator:
  if not isinstance(state, dict) or state.get("format") != FORMAT:
    raise ValueError(f'{source}: not a top1_jax calibrator (no "format": "{FORMAT}")')
  if state.get("version") != VERSION:
    raise ValueError(
      f"{source}: calibrator version {state.get('version')!r}, this top1_jax reads {VERSION}"
    )
  try:
    cal = cls(score=state["score"], n_bins=state["n_bins"], k=state["k"], inputs=state["inputs"])
    num_classes = validation.positive_int("num_classes", state["num_classes"], minimum=2)
    validation.positive_int("k", cal.k, maximum=num_classes)
    counts = np.asarray(state["counts"])
    hits = np.asarray(state["hits"])
    edges = validation.float_array("edges", np.asarray(state["edges"], np.float64), 1, host=True)
    prior = float(state["prior"])
  except KeyError as e:
    raise ValueError(f"{source}: calibrator field {e} is missing") from None
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: bad calibrator field ({e})") from None
  n = cal.n_bins
  if (
    counts.shape != (n,)
    or hits.shape != (n,)
    or counts.dtype.kind not in "iu"
    or hits.dtype.kind not in "iu"
  ):
    raise ValueError(f"{source}: counts and hits must be {n} integers each")
  if np.any(hits < 0) or np.any(hits > counts):
    raise ValueError(f"{source}: expected 0 <= hits <= counts in every bin")
  if edges.shape[0] > n - 1 or np.any(np.diff(edges) <= 0):
    raise ValueError(f"{source}: edges must be at most {n - 1} strictly ascending numbers")
  if not 0.0 <= prior <= 1.0:
    raise ValueError(f"{source}: prior must lie in [0, 1], got {prior}")
  padded = np.full(n - 1, np.inf, np.float32)
  padded[: edges.shape[0]] = edges
  # On the host in float32, as binning.fit computes them, then moved as they are: jnp
  # conversions and arithmetic would compile a small program each (~20 ms a load).
  counts, hits, prior = counts.astype(np.int32), hits.astype(np.int32), np.float32(prior)
  prob = binning.calibrated_prob(hits.astype(np.float32), counts.astype(np.float32), prior)
  effective = np.int32(np.sum(counts > 0))
  cal.bins = binning.Bins(*jax.device_put((padded, counts, hits, prob, prior, effective)))
  cal.num_classes = num_classes
  cal.n_bins_chosen = n
  if state.get("n_bins_requested") == "cv":
    cal.n_bins = "cv"
  return cal
