"""Console scripts: ``top1-<name>`` does what ``python experiments/<name>.py`` does.

The stages' mains (reproduce, train, predict, evaluate, shift) parse ``--config`` and
call one function of ``top1_jax.pipeline``, as ``experiments/`` does from a clone; the
tools' (aggregate, find_mislabeled, demo) are their modules here.

pip installs every script of pyproject.toml's ``[project.scripts]`` with the core
package (it cannot install a script per extra), so a script whose packages are
missing says in one line which extra to install and exits 2 (``requiring``):
top1-train, -predict, -reproduce and -shift need ``top1_jax[all]``, the others ``[cli]``.
"""

import contextlib
import functools
import importlib
import sys

# The others need the cli extra.
EXTRAS = {"train": "all", "predict": "all", "reproduce": "all", "shift": "all"}
CLI_PACKAGES = ("absl", "ml_collections", "etils", "matplotlib")  # the cli extra, imported
ON_PYPI = dict(absl="absl-py", orbax="orbax-checkpoint", tensorflow_datasets="tensorflow-datasets")
MISSING_STATUS = 2  # the exit status of a launcher whose packages are not installed


def install_hint(launcher: str, package: str) -> str:
  """``top1-<launcher>`` needs ``package`` (an import name), and the extra that installs it."""
  extra = EXTRAS.get(launcher, "cli") if package in CLI_PACKAGES else "all"
  return (
    f"top1-{launcher.replace('_', '-')} needs the package {ON_PYPI.get(package, package)!r} "
    f"(pip install 'top1_jax[{extra}]'; from a clone: pip install '.[{extra}]')"
  )


_entered: list[str] = []


@contextlib.contextmanager
def requiring(launcher: str):
  """The imports of ``launcher``: a missing package is one line (``install_hint``), exit 2.

  Nested (reproduce imports train), the outermost names the launcher the user ran.
  """
  _entered.append(launcher)
  try:
    yield
  except ModuleNotFoundError as e:
    package = (e.name or "top1_jax").split(".")[0]
    if len(_entered) > 1 or package == "top1_jax":
      raise
    print(f"error: {install_hint(launcher, package)}", file=sys.stderr, flush=True)
    sys.exit(MISSING_STATUS)
  finally:
    _entered.pop()


STAGES = {
  "reproduce": ("reproduce", "default"),
  "train": ("training", "default"),
  "predict": ("prediction", "default"),
  "evaluate": ("sweep", "default"),
  "shift": ("shift", "shift"),
}
"""Each stage's module of ``top1_jax.pipeline`` and its default config."""
RECORDED = ("reproduce", "evaluate", "shift")
"""The stages that record their command line (config.json)."""


def stage_main(name: str, module):
  """The main of a stage: no positional arguments, the settings parsed once, one call."""
  from top1_jax.launch import config_flag, runner

  def main(argv):
    runner.no_arguments(argv)
    args = (config_flag.settings(), runner.workdir(), runner.tasks())
    if name in RECORDED:
      args += (runner.command(),)
    module.run(*args)

  return main


def default_workdir(name: str):
  """runs/<config> for reproduce; the shift stage's: the work dir of the networks it
  reuses (runs/default for --config=shift, runs/cifar10 for --config=shift:cifar10)."""
  from top1_jax.launch import config_flag

  if name == "reproduce":
    return lambda: f"runs/{config_flag.config_name()}"
  if name == "shift":
    return lambda: f"runs/{config_flag.config_argument() or 'default'}"
  return None


def _launch(name: str) -> None:
  from top1_jax.launch import runner  # its signal handlers first, then the heavy imports

  if name in STAGES:
    from top1_jax.launch import config_flag

    module_name, config = STAGES[name]
    config_flag.define(config)
    with requiring(name):
      module = importlib.import_module(f"top1_jax.pipeline.{module_name}")
    main = stage_main(name, module)
    runner.run(main, default_workdir(name), cpu_device_per_core=name == "evaluate")
    return
  with requiring(name):
    module = importlib.import_module(f"top1_jax.launch.{name}")
  runner.run(module.main)


# One callable per console script (pyproject.toml's [project.scripts] name them).
reproduce = functools.partial(_launch, "reproduce")
train = functools.partial(_launch, "train")
predict = functools.partial(_launch, "predict")
evaluate = functools.partial(_launch, "evaluate")
find_mislabeled = functools.partial(_launch, "find_mislabeled")
demo = functools.partial(_launch, "demo")
aggregate = functools.partial(_launch, "aggregate")
shift = functools.partial(_launch, "shift")
