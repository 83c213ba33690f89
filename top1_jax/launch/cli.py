"""Console scripts: ``top1-<launcher>`` runs ``python -m experiments.<launcher>`` from anywhere.

pip installs one script per launcher (setup.py). The launchers need the full stack
(``pip install 'top1_jax[all]'``); a core-only install gets one line saying so.
"""

import importlib
import sys


def _launch(name: str) -> None:
  try:
    module = importlib.import_module(f"top1_jax.launch.{name}")
    from top1_jax.launch import common
  except ModuleNotFoundError as e:
    sys.exit(
      f"error: top1-{name.replace('_', '-')} needs the package {e.name!r}, which is not"
      " installed: pip install '.[all]' in a top1_jax clone"
    )
  per_core = getattr(module, "CPU_DEVICE_PER_CORE", False)
  common.run(module.main, getattr(module, "default_workdir", None), cpu_device_per_core=per_core)


def reproduce() -> None:
  _launch("reproduce")


def train() -> None:
  _launch("train")


def predict() -> None:
  _launch("predict")


def evaluate() -> None:
  _launch("evaluate")


def find_mislabeled() -> None:
  _launch("find_mislabeled")


def demo() -> None:
  _launch("demo")


def aggregate() -> None:
  _launch("aggregate")
