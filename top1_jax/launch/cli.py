"""Console scripts: ``top1-<launcher>`` runs ``python -m top1_jax.launch.<launcher>``.

pip installs one script per launcher (setup.py). The launchers need the full stack
(``pip install 'top1_jax[all]'``); a core-only install gets one line saying so.
"""

import functools
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


# One callable per console script (setup.py's console_scripts name them).
reproduce = functools.partial(_launch, "reproduce")
train = functools.partial(_launch, "train")
predict = functools.partial(_launch, "predict")
evaluate = functools.partial(_launch, "evaluate")
find_mislabeled = functools.partial(_launch, "find_mislabeled")
demo = functools.partial(_launch, "demo")
aggregate = functools.partial(_launch, "aggregate")
