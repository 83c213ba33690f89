"""Console scripts: ``top1-<launcher>`` runs ``python -m top1_jax.launch.<launcher>``.

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


def _launch(name: str) -> None:
  with requiring(name):
    module = importlib.import_module(f"top1_jax.launch.{name}")
  per_core = getattr(module, "CPU_DEVICE_PER_CORE", False)  # each launcher has common: its runner
  module.common.run(
    module.main, getattr(module, "default_workdir", None), cpu_device_per_core=per_core
  )


# One callable per console script (pyproject.toml's [project.scripts] name them).
reproduce = functools.partial(_launch, "reproduce")
train = functools.partial(_launch, "train")
predict = functools.partial(_launch, "predict")
evaluate = functools.partial(_launch, "evaluate")
find_mislabeled = functools.partial(_launch, "find_mislabeled")
demo = functools.partial(_launch, "demo")
aggregate = functools.partial(_launch, "aggregate")
shift = functools.partial(_launch, "shift")
