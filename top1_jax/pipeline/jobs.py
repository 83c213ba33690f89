"""What a sweep asks for, as typed jobs made once: networks to train, predictions to write.

A *training point* is one (model, train dropout rate, seed): a base network and a deep
ensemble. Each point's *prediction jobs* are the plain network, MC dropout at every rate
and the ensemble. A job carries its values (method, rate, samples, the key it draws
from) to the stages that run it and to its file's meta; its file name is for people and
is never parsed back. ``task_share`` is the part of a sweep one task of a job array runs.
"""

import dataclasses

from top1_jax.pipeline.settings import Settings
from top1_jax.version import __version__

STAGES = ("base", "ensemble")
"""What a training point trains: the base network, then the ensemble."""

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
"""The training recipe's fields at the values that train as before they existed: Adam at a
constant rate, no weight decay, no augmentation, float32."""


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
  """One predictions file of a training point.

  Attributes:
    point: the trained network (and ensemble) it samples.
    method: "deterministic" (one forward pass), "mc_dropout" or "ensemble".
    dropout_rate: MC dropout's test-time rate (0 otherwise).
    num_samples: MC dropout's samples (1 otherwise).
    key_index: which MC-dropout key it draws (the rate's position in ``dropout_rates``).
    ensemble_size: the ensemble's members (0 otherwise).
  """

  point: TrainingPoint
  method: str
  dropout_rate: float = 0.0
  num_samples: int = 1
  key_index: int = 0
  ensemble_size: int = 0

  @property
  def kind(self) -> str:
    """The file's stem: ``deterministic``, ``dropout_0.05``, ``ensemble``. A rate is
    written as Python's shortest repr of the float, so distinct rates never share one."""
    if self.method == "mc_dropout":
      return f"dropout_{self.dropout_rate!r}"
    return self.method

  @property
  def name(self) -> str:
    """``<point>/<kind>``: the file's place under ``predictions/`` (and its rows' source)."""
    return f"{self.point.name}/{self.kind}"

  @property
  def stage(self) -> str:
    """The trained stage it samples."""
    return "ensemble" if self.method == "ensemble" else "base"

  def meta(self, settings: Settings) -> dict:
    """What its file records (its ``meta``): the tidy results' columns come from here, and
    ``predict`` rewrites a file whose meta differs."""
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
  return [
    TrainingPoint(m, r, seed)
    for m in settings.models
    for r in settings.train_dropout_rates
    for seed in settings.seeds
  ]


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


def all_jobs(settings: Settings) -> list[PredictionJob]:
  """Every training point's prediction jobs."""
  return [job for point in training_points(settings) for job in prediction_jobs(settings, point)]


def training_config(settings: Settings, point: TrainingPoint, stage: str) -> dict:
  """What a trained stage (``base`` or ``ensemble``) depends on: training records it and
  refuses to resume or reuse a stage trained with other settings.

  The recipe's fields (``RECIPE_DEFAULTS``) are recorded only where they differ from
  their defaults (SGD's ``momentum`` and ``nesterov`` with SGD, ``lr_boundaries`` and
  ``lr_factor`` with the step schedule, ``crop_padding`` with crops), so a stage trained
  before they existed keeps its record and is reused."""
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
  unused = set()
  if settings.optimizer != "sgd":
    unused |= {"momentum", "nesterov"}
  if settings.lr_schedule != "step":
    unused |= {"lr_boundaries", "lr_factor"}
  if "crop" not in settings.augment:
    unused.add("crop_padding")
  for field, default in RECIPE_DEFAULTS.items():
    value = getattr(settings, field)
    if field not in unused and value != default:
      config[field] = list(value) if isinstance(value, tuple) else value  # as JSON reads it
  return {**config, "ensemble_size": settings.ensemble_size} if stage == "ensemble" else config


def task_share(items: list, task: tuple[int, int]) -> list:
  """This task's share of a sweep's units (training points or files) in a job array.

  Args:
    items: all of the sweep's units, in the same order in every task.
    task: (task index, number of tasks), e.g. ``(SLURM_ARRAY_TASK_ID, 3)``.

  Returns:
    every ``number of tasks``-th unit, from the task's index: the tasks split ``items``
    without overlap, and none is left out.
  """
  index, count = task
  return items[index::count]
