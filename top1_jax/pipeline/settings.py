"""A run's settings: ``parse`` turns a config into a frozen ``Settings``, each field checked
once by its ``Rule``, then by the rules tying fields together (``_TOGETHER``).
"""

import dataclasses
import importlib
import itertools
import math
import re
from collections.abc import Callable
from typing import Any

from top1_jax.core import binning, equal_width, scores
from top1_jax.core.splits import SCHEMES
from top1_jax.core.validation import SettingError
from top1_jax.estimators import registry
from top1_jax.evaluation.recalibration import MIN_LABELS
from top1_jax.io import files

MAX_FOLDS = 127  # core.splits stores a split's fold in an int8
INPUT_KINDS = ("auto", "predictions", "logits", "probs")
"""What ``inputs`` holds; "auto": .npz files are predictions files, a .npy array's rows say."""
OPTIMIZERS = ("adam", "sgd")  # engine.optimizers (that module needs optax)
SCHEDULES = ("constant", "cosine", "step")  # engine.optimizers
AUGMENTATIONS = ("crop", "flip")  # engine.augment
HALF_PRECISIONS = ("none", "bfloat16", "float16")  # engine.train_state
STRATEGIES = ("auto", "vmap", "loop")  # engine.mc.pick_strategy


def fail(field: str, message: str):
  """A setting that cannot work: one line naming the field."""
  raise SettingError(f"{field}: {message}")


def _names_of(source) -> tuple[str, ...] | None:
  return None if source is None else tuple(source() if callable(source) else source)


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one field may hold: a ``kind`` (int, float, str, bool; of each item when ``many``)
  between ``low`` (inclusive unless ``above``) and ``high`` (exclusive unless ``up_to``), or
  among ``names`` (or a function giving them). ``many``: a tuple, ``empty`` if it may be;
  ``every``: ``("all",)`` allowed; ``what``: what messages call the values ("splits").
  """

  kind: type
  low: float | None = None
  high: float | None = None
  above: bool = False
  up_to: bool = False
  names: tuple | Callable | None = None
  many: bool = False
  empty: bool = False
  optional: bool = False
  every: bool = False
  paths: bool = False
  what: str = ""

  def parse(self, field: str, value: Any) -> Any:
    if value is None and self.optional:
      return None
    if self.paths:
      return paths(field, value)
    if self.many:
      return self._many(field, value)
    if self.kind is bool:
      if not isinstance(value, bool):
        fail(field, f"expected True or False, got {value!r}")
      return value
    if self.kind is str:
      return self._name(field, value)
    wanted = self._noun()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      fail(field, f"expected {wanted}, got {value!r}")
    if not math.isfinite(value):
      fail(field, f"expected a finite number, got {value}")
    if (self.kind is int and value != int(value)) or not self._within(value):
      fail(field, f"expected {wanted}, got {value!r}")
    return self.kind(value)

  def _noun(self) -> str:
    """ "an integer >= 1", "a number in [0, 1)", "2 to 127 splits"."""
    if self.what and self.kind is int and self.up_to and not self.above:
      return f"{_number(self.low)} to {_number(self.high)} {self.what}"
    noun = self.what or ("an integer" if self.kind is int else "a number")
    return f"{noun} {self._bounds()}".strip()

  def _bounds(self) -> str:
    """ ">= 1", "in [0, 1)", "in (0, 360]", or ""."""
    if self.low is None:
      return ""
    if self.high is None:
      return f"{'>' if self.above else '>='} {_number(self.low)}"
    left, right = "(" if self.above else "[", "]" if self.up_to else ")"
    return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"

  def _within(self, value) -> bool:
    if self.low is not None and (value < self.low or (self.above and value == self.low)):
      return False
    return self.high is None or value < self.high or (self.up_to and value == self.high)

  def _name(self, field: str, value) -> str:
    if not isinstance(value, str):
      fail(field, f"expected a string, got {value!r}")
    names = _names_of(self.names)
    if names is not None and value not in names:
      fail(field, f"expected one of {', '.join(names)}, got {value!r}")
    return value

  def _many(self, field: str, value) -> tuple:
    values = _items(field, value)
    if not values and not self.empty:
      fail(field, "expected at least one value, got ()")
    if self.kind is str:
      names = _names_of(self.names)
      if self.every and values == ("all",):
        return values
      if names is not None and any(v not in names for v in values):
        fail(field, f"expected names among {', '.join(names)}, got {values}")
      return tuple(dict.fromkeys(values))
    try:
      parsed = tuple(self.kind(float(v)) for v in values)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
      fail(field, f"expected {self.kind.__name__} values, got {values}")
    if not all(math.isfinite(float(v)) for v in values):  # "nan" in a tuple parses
      fail(field, f"expected finite numbers, got {values}")
    if self.kind is int and any(float(v) != int(float(v)) for v in values):
      fail(field, f"expected integers, got {values}")
    if not all(self._within(v) for v in parsed):
      fail(field, f"expected {self.what or 'values'} {self._bounds()}, got {values}")
    return tuple(dict.fromkeys(parsed))  # a value given twice (90 and 90.0) is one


def _number(value: float) -> str:
  """A bound as a reader writes it: 1048576, 0.5, 360."""
  return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _items(field: str, value) -> tuple:
  """A tuple field's items, a command line's ``(a,b)`` split; unpaired parentheses are refused
  (ml_collections keeps such an override as text: ``(0.1`` would run as 0.1)."""
  out = []
  for item in value if isinstance(value, (tuple, list)) else (value,):
    if isinstance(item, str):
      depths = list(itertools.accumulate({"(": 1, ")": -1}.get(char, 0) for char in item))
      if depths and (min(depths) < 0 or depths[-1]):  # a ")" before its "(", or one left open
        fail(
          field,
          f"malformed value {item!r}: its parentheses do not pair up; write (a,b) or (a,), "
          f"quoted for the shell: '--config.{field}=(a,b)'",
        )
      out += [part for part in re.split(r"[,\s()]+", item) if part]
    else:
      out.append(item)
  return tuple(out)


def paths(field: str, value) -> tuple[str, ...]:
  """Paths or globs: a tuple from a config file, or one string (``files.split_paths``)."""
  if isinstance(value, (tuple, list)):
    return tuple(str(v) for v in value)
  if value is None:  # unset where a config requires it (evaluate_files' inputs)
    fail(
      field,
      f"required: the files to evaluate, e.g. --config.{field}=predictions.npz (predictions "
      f"files or globs, comma-separated), or --config.{field}=logits.npy "
      "--config.input_kind=logits --config.labels=labels.npy",
    )
  if not isinstance(value, str):
    fail(field, f"expected paths, got {value!r}")
  return files.split_paths(value)


def _rule(kind: type, **rule) -> Any:
  return dataclasses.field(metadata={"rule": Rule(kind, **rule)})


@dataclasses.dataclass(frozen=True)
class Settings:
  """A parsed config (``configs/default.py`` explains every field)."""

  # The data.
  dataset: str | None = _rule(str, optional=True)
  data_dir: str | None = _rule(str, optional=True)
  limit_train: int | None = _rule(int, low=1, optional=True)
  limit_test: int | None = _rule(int, low=1, optional=True)
  # Training: one base network (and ensemble) per (model, train dropout rate, seed).
  models: tuple[str, ...] = _rule(str, many=True)  # names: _models_exist
  train_dropout_rates: tuple[float, ...] = _rule(float, low=0.0, high=1.0, many=True)
  seeds: tuple[int, ...] = _rule(int, low=0, many=True)
  num_epochs: int = _rule(int, low=1)
  batch_size: int = _rule(int, low=1)
  learning_rate: float = _rule(float, low=0.0, above=True)
  ensemble_size: int = _rule(int, low=0)
  ensemble_strategy: str = _rule(str, names=STRATEGIES)
  # The training recipe.
  optimizer: str = _rule(str, names=OPTIMIZERS)
  momentum: float = _rule(float, low=0.0, high=1.0)
  nesterov: bool = _rule(bool)
  lr_schedule: str = _rule(str, names=SCHEDULES)
  lr_boundaries: tuple[float, ...] = _rule(float, many=True, empty=True)
  lr_factor: float = _rule(float, low=0.0, above=True)
  warmup_epochs: float = _rule(float, low=0.0)
  weight_decay: float = _rule(float, low=0.0)
  augment: tuple[str, ...] = _rule(str, names=("none", *AUGMENTATIONS), many=True)
  crop_padding: int = _rule(int, low=0)
  half_precision: str = _rule(str, names=HALF_PRECISIONS)
  log_every_steps: int = _rule(int, low=1)
  steps_per_call: int | None = _rule(int, low=1, optional=True)
  eval_every_epochs: int = _rule(int, low=0)
  # Prediction.
  dropout_rates: tuple[float, ...] = _rule(float, low=0.0, high=1.0, many=True, empty=True)
  num_samples: int = _rule(int, low=1)
  chunk_size: int | None = _rule(int, low=1, optional=True)
  keep_samples: bool = _rule(bool)
  # Evaluating given files instead of training.
  inputs: tuple[str, ...] = _rule(str, paths=True)
  input_kind: str = _rule(str, names=INPUT_KINDS)
  labels: str = _rule(str)
  # The sweep.
  scores: tuple[str, ...] = _rule(str, many=True)  # names: _known_scores
  n_bins: tuple[int, ...] = _rule(int, low=1, high=binning.MAX_BINS, up_to=True, many=True)
  topk: tuple[int, ...] = _rule(int, low=1, many=True)
  estimators: tuple[str, ...] = _rule(
    str, names=lambda: registry.names(scores_only=True), many=True
  )
  n_folds: int = _rule(int, low=2, high=MAX_FOLDS, up_to=True, what="splits")
  scheme: str = _rule(str, names=SCHEMES)
  figure_bins: int = _rule(int, low=1)
  compare_bins: int | None = _rule(int, low=1, high=binning.MAX_BINS, up_to=True, optional=True)
  ece_bins: int = _rule(int, low=1, high=equal_width.MAX_EQUAL_WIDTH_BINS, up_to=True)
  selective_targets: tuple[float, ...] = _rule(float, low=0.0, high=1.0, many=True)
  selective_delta: float = _rule(float, low=0.0, high=0.5, above=True, what="a probability")
  set_methods: tuple[str, ...] = _rule(
    str, names=lambda: tuple(_lazy("evaluation.sets").METHODS), many=True, empty=True
  )
  set_alphas: tuple[float, ...] = _rule(float, low=0.0, high=1.0, above=True, many=True)
  figures: bool = _rule(bool)
  # Dataset shift.
  shift_examples: int | None = _rule(int, low=1, optional=True)
  shift_rotation: str = _rule(str, names=("rotate_cubic", "rotate"))
  shift_translation: str = _rule(str, names=("roll", "translate"))
  shift_rotations: tuple[float, ...] = _rule(
    float, low=0.0, high=360.0, above=True, up_to=True, many=True, empty=True, what="degrees"
  )
  shift_translations: tuple[int, ...] = _rule(int, low=1, many=True, empty=True)
  shift_corruptions: tuple[str, ...] = _rule(
    str, names=lambda: _lazy("engine.corruptions").names(), many=True, empty=True, every=True
  )
  shift_severities: tuple[int, ...] = _rule(int, low=1, high=5, up_to=True, many=True, empty=True)
  shift_ood: tuple[str, ...] = _rule(
    str, names=lambda: _lazy("io.ood_sets").names(), many=True, empty=True
  )
  shift_estimators: tuple[str, ...] = _rule(str, names=registry.names, many=True)
  shift_num_labels: tuple[int, ...] = _rule(int, low=0, many=True, empty=True)
  shift_label_draws: int = _rule(int, low=1)
  shift_prior_strength: float | None = _rule(float, low=0.0, above=True, optional=True)
  shift_recalibrate_samples: bool = _rule(bool)
  shift_recalibration_scores: tuple[str, ...] = _rule(str, many=True, empty=True)
  shift_accuracy_scores: tuple[str, ...] = _rule(str, many=True, empty=True)
  shift_inputs: tuple[str, ...] = _rule(str, paths=True)
  # The config as given, for the run's record (config.json); not a setting.
  config: Any = dataclasses.field(default=None, compare=False, repr=False)

  def replace(self, **changes) -> "Settings":
    return dataclasses.replace(self, **changes)

  @property
  def single_input(self) -> bool:
    """``inputs`` is one .npy array (of ``input_kind``), not predictions files."""
    if self.input_kind == "auto":
      return any(path.endswith(".npy") for path in self.inputs)
    return self.input_kind != "predictions"


def _lazy(module: str):
  """``top1_jax.<module>``, imported (with jax) only when a rule reads its names."""
  return importlib.import_module(f"top1_jax.{module}")


def parse(config: Any) -> Settings:
  """Every field of ``config`` (``configs/default.py``'s fields, any item-access mapping)
  parsed by its rule, then the rules that tie fields together.

  Raises ``SettingError``: one line starting with the field's name.
  """
  values = {}
  for field in dataclasses.fields(Settings):
    if field.name == "config":
      continue
    try:
      given = config[field.name]
    except (KeyError, AttributeError):
      fail(field.name, "missing from the config; a config starts from configs/default.py")
    values[field.name] = field.metadata["rule"].parse(field.name, given)
  settings = Settings(**values, config=config)
  for together in _TOGETHER:
    settings = together(settings) or settings
  return settings


# Rules that tie fields together; each returns None or the settings completed.


def _recipe(s: Settings) -> Settings:
  if s.warmup_epochs >= s.num_epochs:
    fail("warmup_epochs", f"expected fewer than num_epochs={s.num_epochs}, got {s.warmup_epochs}")
  boundaries = s.lr_boundaries
  if s.lr_schedule == "step" and not boundaries:
    fail("lr_boundaries", "lr_schedule=step needs the epochs where the rate drops, got ()")
  ordered = list(boundaries) == sorted(boundaries) and all(0 < b < s.num_epochs for b in boundaries)
  if s.lr_schedule == "step" and not ordered:
    fail(
      "lr_boundaries",
      f"expected increasing epochs in (0, num_epochs={s.num_epochs}), got {boundaries}",
    )
  augment = s.augment
  if "none" in augment and augment != ("none",):
    fail("augment", f"expected none or names among {', '.join(AUGMENTATIONS)}, got {augment}")
  augment = () if augment == ("none",) else augment
  if "crop" in augment:
    Rule(int, low=1).parse("crop_padding", s.crop_padding)
  return s.replace(augment=augment)


def _models_exist(s: Settings) -> None:
  """``models`` among ``engine.models.MODELS``, checked only for a config that trains."""
  if s.inputs:
    return
  from top1_jax.engine import models  # Flax: evaluating files ([cli] extra) runs without it

  if any(m not in models.MODELS for m in s.models):
    fail("models", f"expected names among {', '.join(sorted(models.MODELS))}, got {s.models}")


def _sampling(s: Settings) -> None:
  if s.dropout_rates and s.num_samples < 2:
    fail("num_samples", f"need >= 2 for MC dropout, got {s.num_samples}")


def _evaluation(s: Settings) -> Settings:
  if s.compare_bins is not None and s.compare_bins not in s.n_bins:
    fail(
      "compare_bins",
      f"{s.compare_bins} is not one of n_bins={s.n_bins}; the comparison reuses the sweep's bins",
    )
  if min(s.selective_targets) <= 0:
    fail("selective_targets", f"expected accuracies in (0, 1), got {s.selective_targets}")
  compare = s.compare_bins
  if compare is None:  # Table 1's bins: 20 when swept, else the sweep's first
    compare = 20 if 20 in s.n_bins else s.n_bins[0]
  return s.replace(compare_bins=compare, selective_targets=tuple(sorted(s.selective_targets)))


def _known_scores(s: Settings) -> None:
  names = s.scores
  if "all" in names and names != ("all",):
    fail("scores", f"expected ('all',) or score names, got {names}")
  if names == ("all",) or s.inputs:  # a user's files may store scores of their own
    return
  unknown = [n for n in names if scores.lookup(n) is None]
  if unknown:
    fail("scores", f"unknown score(s) {', '.join(unknown)}; known: {', '.join(scores.REGISTRY)}")
  for name in names:
    known = scores.lookup(name)
    if known.inputs == "human_probs":
      fail("scores", f"{name} needs human label frequencies, which trained models do not have")
    if known.inputs == "samples" and not s.dropout_rates and s.ensemble_size < 2:
      fail(
        "scores",
        f"{name} needs MC-dropout samples or an ensemble of 2 or more, but dropout_rates is "
        f"empty and ensemble_size={s.ensemble_size}",
      )


def _inputs(s: Settings) -> None:
  kind = s.input_kind
  if not s.single_input:  # predictions files
    if s.labels:
      fail(
        "labels", "goes with a .npy array of logits or probs (a predictions file holds its labels)"
      )
    arrays = [path for path in s.inputs if path.endswith(".npy")]
    if arrays:
      fail(
        "input_kind", f"{arrays[0]} is an array: give input_kind=auto, logits or probs, and labels"
      )
    return
  what = "logits or probs" if kind == "auto" else kind
  if not s.inputs:
    fail("inputs", f"required with input_kind={kind} (a .npy of [N, K] or [S, N, K] {what})")
  if len(s.inputs) > 1:
    fail("inputs", f"an array input reads one .npy array, got {len(s.inputs)}: {s.inputs}")
  if not s.labels:
    fail("labels", "required with a .npy array of logits or probs (a .npy of [N] integer labels)")


def _shift(s: Settings) -> Settings:
  if s.shift_inputs and (not s.inputs or s.single_input):
    fail("shift_inputs", "goes with inputs: the clean predictions files they are calibrated on")
  labels = s.shift_num_labels
  if any(0 < m < MIN_LABELS for m in labels):
    fail(
      "shift_num_labels",
      f"expected 0 or at least {MIN_LABELS} labelled examples (the bins' count is "
      f"cross-validated on them), got {labels}",
    )
  for field in ("shift_recalibration_scores", "shift_accuracy_scores"):
    unknown = [n for n in getattr(s, field) if scores.lookup(n) is None]
    if unknown and not s.inputs:  # a user's files may store scores of their own
      fail(field, f"unknown score(s) {', '.join(unknown)}; known: {', '.join(scores.REGISTRY)}")
  s = s.replace(shift_num_labels=tuple(sorted(labels)))
  if s.shift_corruptions == ("all",):
    return s.replace(shift_corruptions=_lazy("engine.corruptions").names())
  return s


_TOGETHER = (_recipe, _models_exist, _sampling, _evaluation, _known_scores, _inputs, _shift)


def smallest_calibration(settings: Settings, num_examples: int) -> int:
  """The fewest calibration examples of any split of ``num_examples`` (``make_splits``)."""
  folds = 2 if settings.scheme == "halves" else settings.n_folds
  return num_examples - -(-num_examples // folds)


def check_examples(settings: Settings, num_examples: int, num_classes: int, what: str) -> int:
  """The bins, splits and events against N examples of K classes (``what``: the examples'
  name in messages); returns the figures' bins."""
  if settings.n_folds > num_examples:
    fail(
      "n_folds",
      f"{settings.n_folds} splits need at least that many examples; there are "
      f"{num_examples} {what}",
    )
  smallest = smallest_calibration(settings, num_examples)
  if max(settings.n_bins) > smallest:
    fail(
      "n_bins",
      f"{max(settings.n_bins)} bins need at least that many calibration examples; a split has "
      f"{smallest} of the {num_examples} {what}",
    )
  if max(settings.topk) > num_classes:
    fail("topk", f"{max(settings.topk)} exceeds the {num_classes} classes of {settings.dataset}")
  return min(settings.figure_bins, smallest)


def check_test_examples(settings: Settings, num_examples: int, num_classes: int) -> None:
  """``check_examples`` of N test examples (named with the limit that cut them to N)."""
  limited = settings.limit_test == num_examples
  what = f"test examples (limit_test={settings.limit_test})" if limited else "test examples"
  check_examples(settings, num_examples, num_classes, what)


def refuse_inputs(settings: Settings) -> None:
  """The stages that train evaluate the predictions they write, not a user's files."""
  if settings.inputs:
    fail(
      "inputs",
      "reproduce and shift evaluate the predictions they write; for other files run the "
      "evaluate stage (shifted ones: with shift_inputs)",
    )
