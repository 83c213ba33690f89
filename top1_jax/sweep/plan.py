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
from typing import Any

from top1_jax.core import scores
from top1_jax.estimators import registry
from top1_jax.evaluation import crossval
from top1_jax.sweep.fields import at_least as _at_least
from top1_jax.sweep.fields import fail as _fail
from top1_jax.sweep.fields import finite as _finite
from top1_jax.sweep.fields import items as _items
from top1_jax.sweep.fields import numbers as _numbers
from top1_jax.version import __version__

MAX_FOLDS = 127  # crossval.make_splits stores a split's fold in an int8
INPUT_KINDS = ("predictions", "logits", "probs")
"""What ``config.inputs`` holds: predictions files, or one .npy array of logits or probs."""


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


def field_items(settings: "Settings", field: str) -> tuple:
  """A tuple field's items as ``check`` read them: ``(a,b)`` given on the command line
  arrives as one string, split here (numbers stay strings there: convert them)."""
  return _items(settings.config, field)


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
  _check_recipe(config)


RECIPE_DEFAULTS = {
  "optimizer": "adam",
  "momentum": 0.9,
  "nesterov": False,
  "lr_schedule": "constant",
  "lr_boundaries": (),
  "lr_factor": 0.1,
  "warmup_epochs": 0.0,
  "weight_decay": 0.0,
  "augment": (),
  "crop_padding": 4,
  "half_precision": "none",
}
"""The training recipe's fields (``configs/default.py``) at the values that train as before
they existed: Adam at a constant rate, no weight decay, no augmentation, float32."""
OPTIMIZERS = ("adam", "sgd")  # engine.optimizers.OPTIMIZERS (that module needs optax)
SCHEDULES = ("constant", "cosine", "step")  # engine.optimizers.SCHEDULES
AUGMENTATIONS = ("crop", "flip")  # engine.augment.AUGMENTATIONS
HALF_PRECISIONS = ("none", "bfloat16", "float16")  # engine.train_state.HALF_PRECISIONS


def _one_of(config, field: str, names: tuple[str, ...]) -> str:
  if config[field] not in names:
    _fail(field, f"expected one of {', '.join(names)}, got {config[field]!r}")
  return config[field]


def _check_recipe(config) -> None:
  """The optimizer, schedule, augmentation, precision and logging fields."""
  _one_of(config, "optimizer", OPTIMIZERS)
  _one_of(config, "lr_schedule", SCHEDULES)
  _one_of(config, "half_precision", HALF_PRECISIONS)
  if not isinstance(config.momentum, (int, float)) or not 0 <= config.momentum < 1:
    _fail("momentum", f"expected a number in [0, 1), got {config.momentum!r}")
  for field in ("nesterov",):
    if not isinstance(config[field], bool):
      _fail(field, f"expected True or False, got {config[field]!r}")
  for field in ("weight_decay", "warmup_epochs"):
    if not isinstance(config[field], (int, float)) or config[field] < 0:
      _fail(field, f"expected a number >= 0, got {config[field]!r}")
  if not isinstance(config.lr_factor, (int, float)) or not config.lr_factor > 0:
    _fail("lr_factor", f"expected a number > 0, got {config.lr_factor!r}")
  if config.warmup_epochs >= config.num_epochs:
    _fail("warmup_epochs", f"expected fewer than num_epochs={config.num_epochs}, got "
          f"{config.warmup_epochs}")  # fmt: skip
  boundaries = _numbers(config, "lr_boundaries", float, allow_empty=True)
  if config.lr_schedule == "step" and not boundaries:
    _fail("lr_boundaries", "lr_schedule=step needs the epochs where the rate drops, got ()")
  if config.lr_schedule == "step" and (
    list(boundaries) != sorted(boundaries) or any(not 0 < b < config.num_epochs for b in boundaries)
  ):
    _fail(
      "lr_boundaries",
      f"expected increasing epochs in (0, num_epochs={config.num_epochs}), got {boundaries}",
    )
  names = _items(config, "augment")
  if names not in ((), ("none",)) and any(n not in AUGMENTATIONS for n in names):
    _fail("augment", f"expected none or names among {', '.join(AUGMENTATIONS)}, got {names}")
  low = 1 if "crop" in names else 0
  if isinstance(config.crop_padding, bool) or not isinstance(config.crop_padding, int):
    _fail("crop_padding", f"expected an integer >= {low}, got {config.crop_padding!r}")
  _at_least(config, "crop_padding", low)
  _at_least(config, "log_every_steps", 1)
  _at_least(config, "eval_every_epochs", 0)


def recipe(settings) -> dict[str, Any]:
  """The training recipe of checked settings: every field of ``RECIPE_DEFAULTS``, tuples
  parsed (``augment``: () for none)."""
  values = {field: settings.config[field] for field in RECIPE_DEFAULTS}
  values["lr_boundaries"] = _numbers(settings.config, "lr_boundaries", float, allow_empty=True)
  names = _items(settings.config, "augment")
  values["augment"] = () if names == ("none",) else tuple(dict.fromkeys(names))
  return values


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
  _check_shift(config)
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


def _check_shift(config) -> None:
  """The ``shift_*`` fields (the shift config; other jobs ignore them)."""
  from top1_jax.engine import corruptions  # jax only
  from top1_jax.io import ood_sets

  _at_least(config, "shift_examples", 1)
  rotations = _numbers(config, "shift_rotations", float, allow_empty=True)
  if any(not 0 < r <= 360 for r in rotations):
    _fail("shift_rotations", f"expected degrees in (0, 360], got {rotations}")
  _numbers(config, "shift_translations", int, low=1, allow_empty=True)
  named = {
    "shift_corruptions": (corruptions.names(), True),
    "shift_ood": (ood_sets.names(), False),
    "shift_estimators": (registry.names(), False),
  }
  for field, (known, all_allowed) in named.items():
    given = _items(config, field)
    if all_allowed and given == ("all",):
      continue
    if any(name not in known for name in given) or (field == "shift_estimators" and not given):
      _fail(field, f"expected names among {', '.join(known)}, got {given}")
  if _items(config, "shift_inputs") and (
    not _items(config, "inputs") or config.input_kind != "predictions"
  ):
    _fail("shift_inputs", "goes with inputs: the clean predictions files they are calibrated on")
  severities = _numbers(config, "shift_severities", int, low=1, allow_empty=True)
  if any(s > corruptions.SEVERITIES for s in severities):
    _fail("shift_severities", f"expected 1 to {corruptions.SEVERITIES}, got {severities}")


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
  refuses to resume or reuse a stage trained with other settings.

  The recipe's fields (``RECIPE_DEFAULTS``) are recorded only where they differ from
  their defaults (SGD's ``momentum`` and ``nesterov`` with SGD, ``lr_boundaries`` and
  ``lr_factor`` with the step schedule, ``crop_padding`` with crops), so a stage
  trained before they existed keeps its record and is reused."""
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
  values = recipe(settings)
  unused = set()
  if values["optimizer"] != "sgd":
    unused |= {"momentum", "nesterov"}
  if values["lr_schedule"] != "step":
    unused |= {"lr_boundaries", "lr_factor"}
  if "crop" not in values["augment"]:
    unused.add("crop_padding")
  for field, default in RECIPE_DEFAULTS.items():
    if field not in unused and values[field] != default:
      value = values[field]
      config[field] = list(value) if isinstance(value, tuple) else value  # as JSON reads it
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
