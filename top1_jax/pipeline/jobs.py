"""What a sweep asks for: *training points* (model, train dropout rate, seed), each a base
network and an ensemble, and their *prediction jobs* (the plain network, MC dropout at every
rate, the ensemble). A job's values go to its file's meta; its name is never parsed back.
"""

import dataclasses
import itertools

from top1_jax.pipeline.settings import Settings
from top1_jax.version import __version__

STAGES = ("base", "ensemble")
"""What a training point trains, in order."""

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
"""The recipe's fields at the values that train as before they existed."""


@dataclasses.dataclass(frozen=True)
class TrainingPoint:
  """One network (and ensemble) of the sweep, and where its files go."""

  model: str
  train_dropout_rate: float
  seed: int

  @property
  def name(self) -> str:
    return f"{self.model}_tdr{self.train_dropout_rate:g}_seed{self.seed}"


@dataclasses.dataclass(frozen=True)
class PredictionJob:
  """One predictions file of a training point: ``method`` "deterministic" (one forward
  pass), "mc_dropout" or "ensemble"; ``key_index``: its rate's index in ``dropout_rates``,
  which MC-dropout key it draws."""

  point: TrainingPoint
  method: str
  dropout_rate: float = 0.0
  num_samples: int = 1
  key_index: int = 0
  ensemble_size: int = 0

  @property
  def kind(self) -> str:
    """The file's stem: ``deterministic``, ``dropout_0.05`` (the rate's repr), ``ensemble``."""
    return f"dropout_{self.dropout_rate!r}" if self.method == "mc_dropout" else self.method

  @property
  def name(self) -> str:
    """``<point>/<kind>``: the file's place under ``predictions/`` (and its rows' source)."""
    return f"{self.point.name}/{self.kind}"

  @property
  def stage(self) -> str:
    return "ensemble" if self.method == "ensemble" else "base"

  def meta(self, settings: Settings) -> dict:
    """Its file's meta: the tidy results' columns, and what ``predict`` checks a file by."""
    meta = {
      "dataset": settings.dataset,
      "split": "test",
      "limit_test": settings.limit_test,
      "model": self.point.model,
      "train_dropout_rate": self.point.train_dropout_rate,
      "seed": self.point.seed,
      "method": self.method,
      "dropout_rate": self.dropout_rate,
      "num_samples": self.num_samples,
      "epochs": settings.num_epochs,  # the key from before num_epochs: older files stay current
      "version": __version__,
    }
    return meta | ({"ensemble_size": self.ensemble_size} if self.method == "ensemble" else {})


def training_points(settings: Settings) -> list[TrainingPoint]:
  """Every (model, train dropout rate, seed) of the sweep, in the order tasks share them."""
  grid = itertools.product(settings.models, settings.train_dropout_rates, settings.seeds)
  return [TrainingPoint(*point) for point in grid]


def prediction_jobs(settings: Settings, point: TrainingPoint) -> list[PredictionJob]:
  """The files predict writes for a training point, in the sweep's order."""
  jobs = [PredictionJob(point, "deterministic")]
  jobs += [
    PredictionJob(point, "mc_dropout", rate, settings.num_samples, index)
    for index, rate in enumerate(settings.dropout_rates)
  ]
  if settings.ensemble_size >= 1:
    jobs.append(PredictionJob(point, "ensemble", ensemble_size=settings.ensemble_size))
  return jobs


def training_config(settings: Settings, point: TrainingPoint, stage: str) -> dict:
  """What a trained stage depends on (a stage trained with another is not resumed or
  reused); recipe fields only where used and not at their ``RECIPE_DEFAULTS``, so a stage
  trained before they existed keeps its record."""
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
  unused = set() if settings.optimizer == "sgd" else {"momentum", "nesterov"}
  unused |= set() if settings.lr_schedule == "step" else {"lr_boundaries", "lr_factor"}
  unused |= set() if "crop" in settings.augment else {"crop_padding"}
  for field, default in RECIPE_DEFAULTS.items():
    value = getattr(settings, field)
    if field not in unused and value != default:
      config[field] = list(value) if isinstance(value, tuple) else value  # as JSON reads it
  return {**config, "ensemble_size": settings.ensemble_size} if stage == "ensemble" else config


def task_share(items: list, task: tuple[int, int]) -> list:
  """This task's share of ``items`` (the same order in every task): ``task`` is (task index,
  number of tasks), the shares disjoint and complete."""
  index, count = task
  return items[index::count]
