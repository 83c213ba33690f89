"""What a sweep asks for: its checked settings, training points, files, and a task's share.

A config (``configs/*.py``) holds every setting; its lists sweep: ``models``,
``train_dropout_rates`` and ``seeds`` train one network (and ensemble) each, a
*training point*; ``dropout_rates``, ``scores``, ``topk``, ``n_bins`` and
``estimators`` multiply the evaluation. ``check`` turns a config into
``Settings`` (or a ``SettingError`` naming the field), ``check_examples`` checks
it against the test examples once they are known, and ``training_points`` /
``predictions_names`` say what the sweep will write.
"""

import dataclasses
import re
from typing import Any

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.engine import models
from top1_jax.evaluation import crossval

MAX_FOLDS = 127  # crossval.make_splits stores a split's fold in an int8


def _fail(field: str, message: str):
  """A setting that cannot work: one line naming the field."""
  raise SettingError(f"{field}: {message}")


def _items(value) -> tuple:
  """A tuple field, also when given unquoted on the command line: (a,b) arrives as "(a,b)"."""
  if isinstance(value, str):
    value = (value,)
  out = []
  for item in value if isinstance(value, (tuple, list)) else (value,):
    if isinstance(item, str):
      out += [part for part in re.split(r"[,\s()]+", item) if part]
    else:
      out.append(item)
  return tuple(out)


def _numbers(c, field: str, kind, low=None, high=None, allow_empty=False) -> tuple:
  values = _items(c[field])
  try:
    parsed = tuple(kind(v) for v in values)
  except (TypeError, ValueError):
    _fail(field, f"expected {kind.__name__} values, got {values}")
  if not parsed and not allow_empty:
    _fail(field, "expected at least one value, got ()")
  if kind is int and any(float(v) != int(v) for v in values):
    _fail(field, f"expected integers, got {values}")
  if low is not None and any(v < low for v in parsed):
    _fail(field, f"expected values >= {low}, got {values}")
  if high is not None and any(v >= high for v in parsed):
    _fail(field, f"expected values in [{low}, {high}), got {values}")
  return tuple(dict.fromkeys(parsed))


def _at_least(c, field: str, low, kind=int):
  value = c[field]
  if value is None:
    return None
  if not isinstance(value, (int, float)) or value < low:
    _fail(field, f"expected {'an integer' if kind is int else 'a number'} >= {low}, got {value}")
  return kind(value)


@dataclasses.dataclass(frozen=True)
class Settings:
  """A checked config."""

  config: Any
  models: tuple[str, ...]
  train_dropout_rates: tuple[float, ...]
  seeds: tuple[int, ...]
  dropout_rates: tuple[float, ...]
  scores: tuple[str, ...]
  n_bins: tuple[int, ...]
  topk: tuple[int, ...]
  estimators: tuple[str, ...]
  compare_bins: int
  selective_targets: tuple[float, ...]
  inputs: tuple[str, ...]  # predictions files given instead of training, or ()

  def __getattr__(self, name):  # every other field as given
    if name.startswith("_") or name == "config":
      raise AttributeError(name)
    return self.config[name]


def _check_training(c) -> None:
  for field in ("epochs", "batch_size"):
    _at_least(c, field, 1)
  _at_least(c, "ensemble_size", 0)
  for field in ("limit_train", "limit_test", "chunk_size"):
    _at_least(c, field, 1)
  if not c.learning_rate > 0:
    _fail("learning_rate", f"expected > 0, got {c.learning_rate}")
  if c.ensemble_strategy not in ("auto", "vmap", "loop"):
    _fail("ensemble_strategy", f"expected auto, vmap or loop, got {c.ensemble_strategy!r}")


def _check_evaluation(c, n_bins) -> None:
  if not 2 <= c.n_folds <= MAX_FOLDS:
    _fail("n_folds", f"expected 2 to {MAX_FOLDS} splits, got {c.n_folds}")
  if c.scheme not in crossval.SCHEMES:
    _fail("scheme", f"expected one of {', '.join(crossval.SCHEMES)}, got {c.scheme!r}")
  for field in ("figure_bins", "ece_bins"):
    _at_least(c, field, 1)
  if c.compare_bins is not None and c.compare_bins not in n_bins:
    _fail(
      "compare_bins",
      f"{c.compare_bins} is not one of n_bins={n_bins}; the comparison reuses the sweep's bins",
    )
  if not isinstance(c.figures, bool):
    _fail("figures", f"expected True or False, got {c.figures!r}")
  if not 0.0 < c.selective_delta < 0.5:
    _fail("selective_delta", f"expected a probability in (0, 0.5), got {c.selective_delta}")


def _check_scores(c, has_samples: bool) -> tuple[str, ...]:
  names = _items(c.scores)
  if not names or ("all" in names and names != ("all",)):
    _fail("scores", f"expected ('all',) or score names, got {names}")
  if names == ("all",):
    return names
  unknown = [n for n in names if scores.lookup(n) is None and not _stored_score(c, n)]
  if unknown:
    _fail("scores", f"unknown score(s) {', '.join(unknown)}; known: {', '.join(scores.REGISTRY)}")
  for name in names:
    known = scores.lookup(name)
    if known is not None and not _inputs(c) and known.inputs == "human_probs":
      _fail("scores", f"{name} needs human label frequencies, which trained models do not have")
    if known is not None and not _inputs(c) and known.inputs == "samples" and not has_samples:
      _fail(
        "scores",
        f"{name} needs MC-dropout samples or an ensemble of 2 or more, but dropout_rates is "
        f"empty and ensemble_size={c.ensemble_size}",
      )
  return names


def _stored_score(c, name: str) -> bool:
  # A score stored in a user's predictions file: known only once the file is read.
  return bool(_inputs(c))


def _inputs(c) -> tuple[str, ...]:
  return tuple(p for p in (_items(c.predictions) + _items(c.logits) + _items(c.probs)) if p)


def check(c: Any) -> Settings:
  """Every setting of a config (``configs/*.py``) that can be checked without data.

  Args:
    c: a config: an ``ml_collections.ConfigDict`` or anything with the same fields
      (item access).

  Raises:
    SettingError: one line starting with the field's name.
  """
  _check_training(c)
  if c.models == () or any(m not in models.MODELS for m in _items(c.models)):
    _fail("models", f"expected names among {', '.join(sorted(models.MODELS))}, got {c.models}")
  seeds = _numbers(c, "seeds", int, low=0)
  train_rates = _numbers(c, "train_dropout_rates", float, 0.0, 1.0)
  rates = _numbers(c, "dropout_rates", float, 0.0, 1.0, allow_empty=True)
  if rates and c.num_samples < 2:
    _fail("num_samples", f"need >= 2 for MC dropout, got {c.num_samples}")
  n_bins = _numbers(c, "n_bins", int, low=1)
  topk = _numbers(c, "topk", int, low=1)
  estimators = _items(c.estimators)
  if not estimators or any(e not in crossval.ESTIMATORS for e in estimators):
    _fail("estimators", f"expected names among {', '.join(crossval.ESTIMATORS)}, got {estimators}")
  _check_evaluation(c, n_bins)
  targets = _numbers(c, "selective_targets", float, 0.0, 1.0)
  if min(targets) <= 0:
    _fail("selective_targets", f"expected accuracies in (0, 1), got {targets}")
  names = _check_scores(c, bool(rates) or c.ensemble_size >= 2)
  inputs = _check_inputs(c)
  compare = c.compare_bins if c.compare_bins is not None else (20 if 20 in n_bins else n_bins[0])
  return Settings(
    c,
    tuple(dict.fromkeys(_items(c.models))),
    train_rates,
    seeds,
    rates,
    names,
    n_bins,
    topk,
    tuple(dict.fromkeys(estimators)),
    compare,
    tuple(sorted(targets)),
    inputs,
  )


def _check_inputs(c) -> tuple[str, ...]:
  arrays = [f for f in ("logits", "probs") if c[f]]
  if len(arrays) == 2:
    _fail("logits", "give logits or probs, not both")
  if arrays and c.predictions:
    _fail("predictions", "give either predictions files or logits/probs with labels")
  if arrays and not c.labels:
    _fail("labels", f"required with {arrays[0]} (a .npy of [N] integer labels)")
  if c.labels and not arrays:
    _fail("labels", "goes with logits or probs")
  return _items(c.predictions)


def smallest_calibration(s: Settings, num_examples: int) -> int:
  """The fewest calibration examples of any split of ``num_examples`` (crossval.make_splits)."""
  folds = 2 if s.scheme == "halves" else s.n_folds
  return num_examples - -(-num_examples // folds)


def check_examples(s: Settings, num_examples: int, num_classes: int, what: str) -> int:
  """The bins, splits and events against N examples of K classes; returns the figures' bins.

  ``what`` says where N comes from (e.g. ``test examples (limit_test=30)``).
  """
  if s.n_folds > num_examples:
    _fail(
      "n_folds",
      f"{s.n_folds} splits need at least that many examples; there are {num_examples} {what}",
    )
  smallest = smallest_calibration(s, num_examples)
  if max(s.n_bins) > smallest:
    _fail(
      "n_bins",
      f"{max(s.n_bins)} bins need at least that many calibration examples; a split has "
      f"{smallest} of the {num_examples} {what}",
    )
  if max(s.topk) > num_classes:
    _fail("topk", f"{max(s.topk)} exceeds the {num_classes} classes of {s.dataset}")
  return min(s.figure_bins, smallest)


@dataclasses.dataclass(frozen=True)
class TrainingPoint:
  """One network (and ensemble) of the sweep, and where its files go."""

  model: str
  train_dropout_rate: float
  seed: int

  @property
  def name(self) -> str:
    return f"{self.model}_tdr{self.train_dropout_rate:g}_seed{self.seed}"


def training_points(s: Settings) -> list[TrainingPoint]:
  return [
    TrainingPoint(m, r, seed) for m in s.models for r in s.train_dropout_rates for seed in s.seeds
  ]


def predictions_names(s: Settings, point: TrainingPoint) -> list[str]:
  """The files predict writes for a training point, relative to predictions/, no suffix."""
  names = [f"{point.name}/deterministic"]
  names += [f"{point.name}/dropout_{rate:g}" for rate in s.dropout_rates]
  if s.ensemble_size >= 1:
    names.append(f"{point.name}/ensemble")
  return names


def mine(items: list, task: tuple[int, int]) -> list:
  """This task's share of a sweep's units: every num_tasks-th, from task_index."""
  index, count = task
  return items[index::count]
