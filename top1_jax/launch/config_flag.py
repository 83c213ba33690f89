"""The sweep launchers' ``--config`` flag (ml_collections) and its checks.

``--config`` names a config file: a packaged one by name (``--config=quick``) or
any path (``common`` resolves both from any folder); ``--config.<field>=<value>``
overrides a field. ``check`` is ``top1_jax.sweep.plan.check`` on the result; the
rest of the plan (training points, files, a task's share) is ``top1_jax.sweep.plan``.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from top1_jax import configs
from top1_jax.launch import common
from top1_jax.sweep import plan


def config_name() -> str:
  """The config file's name without .py (the default work dir is runs/<it>)."""
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  return os.path.splitext(os.path.basename(path.split(":")[0]))[0]


def check() -> plan.Settings:
  """The --config, checked (``plan.check``): before anything is read or written."""
  return plan.check(CONFIG.value)


def given() -> set[str]:
  """The fields set on the command line (``--config.<field>=...``), not by a config file."""
  return {name.split(".")[0] for name in config_flags.get_override_values(flags.FLAGS["config"])}


try:
  CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(common.PACKAGED_CONFIGS, "default.py"),
    f"A config: a packaged one by name ({common.packaged_names()}) or a path; "
    "--config.<field>=<value> sets one field (--help lists every field).",
  )
except (AttributeError, KeyError):  # without --config=, overrides are applied here, on import
  common.fail(common.ExperimentError(configs.unknown_field(sys.argv)), joined=False)
