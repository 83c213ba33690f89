"""Console scripts: ``top1-<name>`` does what ``python experiments/<name>.py`` does. pip
installs every script with the core package, so one whose packages are missing names the
extra to install in one line and exits 2."""

import functools
import importlib

from top1_jax import launch

launch.catch_stops()  # before JAX loads (runner imports it): Ctrl-C is one line
from top1_jax.launch import runner  # noqa: E402

STAGES = {
  "reproduce": ("reproduce", "default"),
  "train": ("training", "default"),
  "predict": ("prediction", "default"),
  "evaluate": ("sweep", "default"),
  "shift": ("dataset_shift", "shift"),
}
"""Each stage's module of ``top1_jax.pipeline`` and its default config."""
RECORDED = ("reproduce", "evaluate", "shift")
"""The stages that record their command line (config.json)."""


def _launch(name: str) -> None:
  if name not in STAGES:
    with runner.requiring(name):
      module = importlib.import_module(f"top1_jax.launch.{name}")
    runner.run(module.main)
    return
  from top1_jax.launch import config_flag

  module_name, config = STAGES[name]
  config_flag.define(config)
  with runner.requiring(name):
    module = importlib.import_module(f"top1_jax.pipeline.{module_name}")

  def main(argv):  # no positional arguments, the settings parsed once, one call
    runner.no_arguments(argv)
    args = (config_flag.settings(), runner.workdir(), runner.tasks())
    if name in RECORDED:
      args += (runner.command(),)
    module.run(*args)

  # Without --workdir: runs/<config>; for shift, its networks' (runs/cifar10 for shift:cifar10).
  default_workdir = {
    "reproduce": lambda: f"runs/{config_flag.config_name()}",
    "shift": lambda: f"runs/{config_flag.config_argument() or 'default'}",
  }.get(name)
  runner.run(main, default_workdir, cpu_device_per_core=name == "evaluate", doc=module.__doc__)


# One callable per console script (pyproject.toml's [project.scripts] name them).
reproduce = functools.partial(_launch, "reproduce")
train = functools.partial(_launch, "train")
predict = functools.partial(_launch, "predict")
evaluate = functools.partial(_launch, "evaluate")
find_mislabeled = functools.partial(_launch, "find_mislabeled")
demo = functools.partial(_launch, "demo")
aggregate = functools.partial(_launch, "aggregate")
shift = functools.partial(_launch, "shift")
