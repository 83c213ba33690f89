"""The ``--config`` flag (ml_collections) of the stages' mains, and its settings parsed once:
a packaged config's name (``--config=quick``) or a path; ``--config.<field>=<value>``
overrides a field."""

import collections
import os
import re
import sys

from absl import flags, logging
from ml_collections import config_flags

from top1_jax.core.validation import SettingError
from top1_jax.launch import runner, usage
from top1_jax.pipeline import settings as settings_lib


def config_name() -> str:
  """The config file's name without .py (the default work dir is runs/<it>)."""
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  return os.path.splitext(os.path.basename(path.split(":")[0]))[0]


def config_argument() -> str | None:
  """The argument after a colon in ``--config=<file>:<argument>`` (``shift:cifar10``)."""
  given = [arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--config=")]
  return given[-1].partition(":")[2] or None if given else None


def _given_twice(argv: list[str]) -> None:
  """Refuses a tuple field given twice: ml_collections would merge both overrides."""
  names = [m[1] for m in map(re.compile(r"--config\.(\w+)=").match, argv) if m]
  tuples = [n for n in names if isinstance(CONFIG.value.get(n), tuple)]  # others: the last wins
  twice = [name for name, count in collections.Counter(tuples).items() if count > 1]
  if twice:
    raise SettingError(
      f"{twice[0]}: given twice on the command line; give it once (a tuple as one value, "
      f"quoted for the shell: '--config.{twice[0]}=(a,b)')"
    )


def settings() -> settings_lib.Settings:
  """The --config, parsed and checked before anything is read or written.

  With ``inputs`` (a user's files), ``dataset`` is unset unless given on the command line
  (the config's is its training data's), and data fields given there are said unused."""
  _given_twice(sys.argv)
  parsed = settings_lib.parse(CONFIG.value)
  if not parsed.inputs:
    return parsed
  if ignored := sorted(given() & {"data_dir", "limit_train", "limit_test"}):
    # Only those given on the command line: a sweep's own (quick's limit_test) made its files.
    named = ", ".join(f"--config.{name}" for name in ignored)
    logging.warning("evaluate: %s: for train and predict; evaluate reads files", named)
  if "dataset" in given():
    return parsed
  parsed.config.dataset = None  # in the run's record (config.json) too
  return parsed.replace(dataset=None)


def given() -> set[str]:
  """The fields set on the command line (``--config.<field>=...``), not by a config file."""
  return {name.split(".")[0] for name in config_flags.get_override_values(flags.FLAGS["config"])}


def define(default: str = "default"):
  """Defines ``--config`` with a packaged default (once per process)."""
  global CONFIG
  try:
    CONFIG = config_flags.DEFINE_config_file(
      "config",
      os.path.join(runner.PACKAGED_CONFIGS, f"{default}.py"),
      f"A config: a packaged one by name ({runner.packaged_names()}) or a path; "
      "--config.<field>=<value> sets one field (--help lists every field).",
    )
  except (AttributeError, KeyError):  # without --config=, overrides are applied here, on import
    runner.fail(runner.ExperimentError(usage.unknown_field(sys.argv)), joined=False)
  return CONFIG


CONFIG = None
