"""What a sweep asks for: its checked settings, training points, files, and a task's share.

A config (``top1_jax/configs/default.py`` names every field) holds every setting;
its lists sweep: ``models``,
``train_dropout_rates`` and ``seeds`` train one network (and ensemble) each, a
*training point*; ``dropout_rates``, ``scores``, ``topk``, ``n_bins`` and
``estimators`` multiply the evaluation. ``check`` turns a config into
``Settings`` (or a ``SettingError`` naming the field), ``check_examples`` checks
it against the test examples once they are known, and ``training_points`` /
``predictions_names`` say what the sweep will write; ``task_share`` is the part of
a sweep's units one task of a job array runs.
"""

import dataclasses
import math
import re
from typing import Any

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.estimators import registry
from top1_jax.evaluation import crossval
from top1_jax.version import __version__

MAX_FOLDS = 127  # crossval.make_splits stores a split's fold in an int8
INPUT_KINDS = ("predictions", "logits", "probs")
"""What ``config.inputs`` holds: predictions files, or one .npy array of logits or probs."""


def _fail(field: str, message: str):
  """A setting that cannot work: one line naming the field."""
  raise SettingError(f"{field}: {message}")


def _items(config, field: str) -> tuple:
  """A tuple field, also when given unquoted on the command line: (a,b) arrives as "(a,b)".

  ml_collections keeps an override it cannot parse as one string: a typo such as
  ``(0.1`` (a parenthesis missing) would otherwise run as the value 0.1 and be recorded
  as ``["(0.1"]``, so parentheses that do not pair up are refused.
  """
  value = config[field]
  if isinstance(value, str):
    value = (value,)
  out = []
  for item in value if isinstance(value, (tuple, list)) else (value,):
    if isinstance(item, str):
      _check_parentheses(field, item)
      out += [part for part in re.split(r"[,\s()]+", item) if part]
    else:
      out.append(item)
  return tuple(out)


def _check_parentheses(field: str, item: str) -> None:
  """Parentheses that pair up: ``(a,b)`` and ``a,b``, not ``(a`` or ``a)``."""
  depth = 0
  for char in item:
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth < 0:
      break
  if depth:
    _fail(
      field,
      f"malformed value {item!r}: its parentheses do not pair up; write (a,b) or (a,), "
      f"quoted for the shell: '--config.{field}=(a,b)'",
    )


def _finite(config) -> None:
  """Every float of the config (a field, or an item of a tuple field) is a finite number."""
  for field, value in config.items() if hasattr(config, "items") else ():
    values = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
      _fail(
        field, f"expected {'finite numbers' if values is value else 'a finite number'}, got {value}"
      )


def _numbers(config, field: str, kind, low=None, high=None, allow_empty=False) -> tuple:
  values = _items(config, field)
  try:
    parsed = tuple(kind(v) for v in values)
  except (TypeError, ValueError, OverflowError):  # OverflowError: int("inf")
    _fail(field, f"expected {kind.__name__} values, got {values}")
  if not all(math.isfinite(v) for v in parsed):  # "nan" in an unquoted tuple parses
    _fail(field, f"expected finite numbers, got {values}")
  if not parsed and not allow_empty:
    _fail(field, "expected at least one value, got ()")
  if kind is int and any(float(v) != int(v) for v in values):
    _fail(field, f"expected integers, got {values}")
  if low is not None and any(v < low for v in parsed):
    _fail(field, f"expected values >= {low}, got {values}")
  if high is not None and any(v >= high for v in parsed):
    _fail(field, f"expected values in [{low}, {high}), got {values}")
  return tuple(dict.fromkeys(parsed))


def _at_least(config, field: str, low, kind=int):
  value = config[field]
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
  inputs: tuple[str, ...]  # given instead of training (``input_kind`` says what), or ()

  def __getattr__(self, name):  # every other field as given
    if name.startswith("_") or name == "config":
      raise AttributeError(name)
    return self.config[name]


def _check_training(config) -> None:
  for field in ("num_epochs", "batch_size"):
    _at_least(config, field, 1)
  _at_least(config, "ensemble_size", 0)
  for field in ("limit_train", "limit_test", "chunk_size"):
    _at_least(config, field, 1)
  if not config.learning_rate > 0:
    _fail("learning_rate", f"expected > 0, got {config.learning_rate}")
  if config.ensemble_strategy not in ("auto", "vmap", "loop"):
    _fail("ensemble_strategy", f"expected auto, vmap or loop, got {config.ensemble_strategy!r}")


def _check_evaluation(config, n_bins) -> None:
  if not 2 <= config.n_folds <= MAX_FOLDS:
    _fail("n_folds", f"expected 2 to {MAX_FOLDS} splits, got {config.n_folds}")
  if config.scheme not in crossval.SCHEMES:
    _fail("scheme", f"expected one of {', '.join(crossval.SCHEMES)}, got {config.scheme!r}")
  for field in ("figure_bins", "ece_bins"):
    _at_least(config, field, 1)
  if config.compare_bins is not None and config.compare_bins not in n_bins:
    _fail(
      "compare_bins",
      f"{config.compare_bins} is not one of n_bins={n_bins}; the comparison reuses the "
      "sweep's bins",
    )
  if not isinstance(config.figures, bool):
    _fail("figures", f"expected True or False, got {config.figures!r}")
  if not 0.0 < config.selective_delta < 0.5:
    _fail("selective_delta", f"expected a probability in (0, 0.5), got {config.selective_delta}")


def _check_scores(config, has_samples: bool) -> tuple[str, ...]:
  names = _items(config, "scores")
  if not names or ("all" in names and names != ("all",)):
    _fail("scores", f"expected ('all',) or score names, got {names}")
  if names == ("all",):
    return names
  given = bool(_items(config, "inputs"))  # a user's files may store scores of their own
  unknown = [n for n in names if scores.lookup(n) is None and not given]
  if unknown:
    _fail("scores", f"unknown score(s) {', '.join(unknown)}; known: {', '.join(scores.REGISTRY)}")
  for name in names:
    known = scores.lookup(name)
    if known is not None and not given and known.inputs == "human_probs":
      _fail("scores", f"{name} needs human label frequencies, which trained models do not have")
    if known is not None and not given and known.inputs == "samples" and not has_samples:
      _fail(
        "scores",
        f"{name} needs MC-dropout samples or an ensemble of 2 or more, but dropout_rates is "
        f"empty and ensemble_size={config.ensemble_size}",
      )
  return names


def _check_models(config) -> None:
  """``models``: names in ``engine.models.MODELS``, looked up only for a config that trains.

  Evaluating given files (``inputs``) trains nothing, and must run without Flax
  (``pip install 'top1_jax[cli]'``), which ``engine.models`` imports.
  """
  if config.models == ():
    _fail("models", "expected one or more model names, got ()")
  if _items(config, "inputs"):
    return
  from top1_jax.engine import models  # Flax: only a config that trains needs it

  if any(m not in models.MODELS for m in _items(config, "models")):
    _fail("models", f"expected names among {', '.join(sorted(models.MODELS))}, got {config.models}")


def check(config: Any) -> Settings:
  """Every setting of a config that can be checked without data.

  Args:
    config: a config (``top1_jax/configs/default.py``): an ``ml_collections.ConfigDict``
      or anything with the same fields (item access).

  Raises:
    SettingError: one line starting with the field's name.
  """
  _finite(config)  # first: learning_rate=inf would pass "> 0"
  _check_training(config)
  _check_models(config)
  seeds = _numbers(config, "seeds", int, low=0)
  train_rates = _numbers(config, "train_dropout_rates", float, 0.0, 1.0)
  rates = _numbers(config, "dropout_rates", float, 0.0, 1.0, allow_empty=True)
  if rates and config.num_samples < 2:
    _fail("num_samples", f"need >= 2 for MC dropout, got {config.num_samples}")
  n_bins = _numbers(config, "n_bins", int, low=1)
  topk = _numbers(config, "topk", int, low=1)
  estimators = _items(config, "estimators")
  known = registry.names(scores_only=True)  # a sweep cross-validates a score alone
  if not estimators or any(e not in known for e in estimators):
    _fail("estimators", f"expected names among {', '.join(known)}, got {estimators}")
  _check_evaluation(config, n_bins)
  targets = _numbers(config, "selective_targets", float, 0.0, 1.0)
  if min(targets) <= 0:
    _fail("selective_targets", f"expected accuracies in (0, 1), got {targets}")
  names = _check_scores(config, bool(rates) or config.ensemble_size >= 2)
  inputs = _check_inputs(config)
  compare = config.compare_bins
  if compare is None:  # Table 1's bins: 20 when swept, else the sweep's first
    compare = 20 if 20 in n_bins else n_bins[0]
  return Settings(
    config,
    tuple(dict.fromkeys(_items(config, "models"))),
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


def _check_inputs(config) -> tuple[str, ...]:
  """``inputs``, ``input_kind`` and ``labels`` together (``configs/default.py``)."""
  inputs, kind = _items(config, "inputs"), config.input_kind
  if kind not in INPUT_KINDS:
    _fail("input_kind", f"expected one of {', '.join(INPUT_KINDS)}, got {kind!r}")
  if kind == "predictions":
    if config.labels:
      _fail("labels", "goes with input_kind=logits or probs (a predictions file holds its labels)")
    arrays = [path for path in inputs if path.endswith(".npy")]
    if arrays:
      _fail("input_kind", f"{arrays[0]} is an array: give input_kind=logits or probs, and labels")
    return inputs
  if not inputs:
    _fail("inputs", f"required with input_kind={kind} (a .npy of [N, K] or [S, N, K] {kind})")
  if len(inputs) > 1:
    _fail("inputs", f"input_kind={kind} reads one .npy array, got {len(inputs)}: {inputs}")
  if not config.labels:
    _fail("labels", f"required with input_kind={kind} (a .npy of [N] integer labels)")
  return inputs


def smallest_calibration(settings: Settings, num_examples: int) -> int:
  """The fewest calibration examples of any split of ``num_examples`` (crossval.make_splits)."""
  folds = 2 if settings.scheme == "halves" else settings.n_folds
  return num_examples - -(-num_examples // folds)


def check_examples(settings: Settings, num_examples: int, num_classes: int, what: str) -> int:
  """The bins, splits and events against N examples of K classes; returns the figures' bins.

  ``what`` says where N comes from (e.g. ``test examples (limit_test=30)``).
  """
  if settings.n_folds > num_examples:
    _fail(
      "n_folds",
      f"{settings.n_folds} splits need at least that many examples; there are "
      f"{num_examples} {what}",
    )
  smallest = smallest_calibration(settings, num_examples)
  if max(settings.n_bins) > smallest:
    _fail(
      "n_bins",
      f"{max(settings.n_bins)} bins need at least that many calibration examples; a split has "
      f"{smallest} of the {num_examples} {what}",
    )
  if max(settings.topk) > num_classes:
    _fail("topk", f"{max(settings.topk)} exceeds the {num_classes} classes of {settings.dataset}")
  return min(settings.figure_bins, smallest)


@dataclasses.dataclass(frozen=True)
class TrainingPoint:
  """One network (and ensemble) of the sweep, and where its files go."""

  model: str
  train_dropout_rate: float
  seed: int

  @property
  def name(self) -> str:
    return f"{self.model}_tdr{self.train_dropout_rate:g}_seed{self.seed}"


def training_points(settings: Settings) -> list[TrainingPoint]:
  """Every (model, train dropout rate, seed) of the sweep, in the order tasks share them."""
  return [
    TrainingPoint(m, r, seed)
    for m in settings.models
    for r in settings.train_dropout_rates
    for seed in settings.seeds
  ]


def predictions_names(settings: Settings, point: TrainingPoint) -> list[str]:
  """The files predict writes for a training point, relative to predictions/, no suffix."""
  names = [f"{point.name}/deterministic"]
  names += [f"{point.name}/dropout_{rate:g}" for rate in settings.dropout_rates]
  if settings.ensemble_size >= 1:
    names.append(f"{point.name}/ensemble")
  return names


def training_config(settings: Settings, point: TrainingPoint, stage: str) -> dict:
  """What a trained stage (``base`` or ``ensemble``) depends on: ``train`` records it and
  refuses to resume or reuse a stage trained with other settings."""
  config = {
    "dataset": settings.dataset,
    "limit_train": settings.limit_train,
    "model": point.model,
    "train_dropout_rate": point.train_dropout_rate,
    "epochs": settings.num_epochs,  # the key from before num_epochs: older runs resume
    "batch_size": settings.batch_size,
    "learning_rate": settings.learning_rate,
    "seed": point.seed,
  }
  return {**config, "ensemble_size": settings.ensemble_size} if stage == "ensemble" else config


def predictions_meta(settings: Settings, point: TrainingPoint, name: str) -> dict:
  """What a predictions file of ``predictions_names`` records (its ``meta``): the tidy
  results' columns come from here, and ``predict`` rewrites a file whose meta differs."""
  kind = name.rsplit("/", 1)[1]
  method = "deterministic" if kind == "deterministic" else kind.split("_")[0]
  method = "mc_dropout" if method == "dropout" else method
  rate = float(kind.split("_", 1)[1]) if method == "mc_dropout" else 0.0
  return {
    "dataset": settings.dataset,
    "split": "test",
    "limit_test": settings.limit_test,
    "model": point.model,
    "train_dropout_rate": point.train_dropout_rate,
    "seed": point.seed,
    "method": method,
    "dropout_rate": rate,
    "num_samples": settings.num_samples if method == "mc_dropout" else 1,
    "epochs": settings.num_epochs,  # the key from before num_epochs: older files stay current
    "version": __version__,
    **({"ensemble_size": settings.ensemble_size} if method == "ensemble" else {}),
  }


def task_share(items: list, task: tuple[int, int]) -> list:
  """This task's share of a sweep's units (training points or files) in a job array.

  Args:
    items: all of the sweep's units, in the same order in every task.
    task: (task index, number of tasks), e.g. ``(SLURM_ARRAY_TASK_ID, 3)``.

  Returns:
    every ``number of tasks``-th unit, from the task's index: the tasks split
    ``items`` without overlap, and none is left out.
  """
  index, count = task
  return items[index::count]
