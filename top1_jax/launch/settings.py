"""The sweep launchers' ``--config`` flag (ml_collections), and the config's checks.

``check`` is ``top1_jax.sweep.plan.check`` on the ``--config`` file with its
``--config.<field>`` overrides; the rest of the plan (training points, files,
a task's share) is ``top1_jax.sweep.plan``.
"""

import os

from absl import flags
from ml_collections import config_flags

from top1_jax.sweep import plan


def config_name() -> str:
  """The config file's name without .py (the default work dir is runs/<it>)."""
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  return os.path.splitext(os.path.basename(path.split(":")[0]))[0]


def check() -> plan.Settings:
  """The --config, checked (``plan.check``): before anything is read or written."""
  return plan.check(CONFIG.value)


_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
CONFIG = config_flags.DEFINE_config_file(
  "config",
  os.path.join(_CONFIGS, "fashion_mnist.py"),
  "A config file (configs/*.py); --config.<field>=<value> overrides one field.",
)
