"""A run's record of itself in its work dir: ``config.json`` (the command, the resolved
config, the versions) and ``manifest.json`` (the files a sweep asks for, so that a later
sweep of another config says what it replaces).
"""

import json
import sys

from absl import logging

from top1_jax.engine import parallel
from top1_jax.io import files
from top1_jax.pipeline.settings import Settings
from top1_jax.version import __version__


class RunError(ValueError):
  """A work dir problem the user can fix (another sweep's files, a missing stage)."""


is_writer = parallel.is_writer
"""Whether this process writes files: process 0 of a multi-process run."""


def versions() -> dict[str, str]:
  import jax
  import numpy

  return {
    "top1_jax": __version__,
    "jax": jax.__version__,
    "numpy": numpy.__version__,
    "python": sys.version.split()[0],
    "backend": jax.default_backend(),
    "devices": str(len(jax.devices())),
    "processes": str(jax.process_count()),
  }


def config_json(settings: Settings) -> dict:
  """The resolved config as JSON reads it back (tuples are lists)."""
  return json.loads(settings.config.to_json())


def record(settings: Settings, command: str) -> dict:
  """config.json's contents: the command, the resolved config and the versions."""
  return {"command": command, "config": config_json(settings), "versions": versions()}


def record_sweep(settings: Settings, workdir, names: list[str], command: str, tasks) -> None:
  """config.json and manifest.json: what this sweep asks for, and a warning on what it
  replaces (left on disk, never reported); a sweep's tasks must share one config."""
  manifest = {"config": config_json(settings), "files": names}
  before = files.read_json(workdir / "manifest.json")
  if before is not None and before != manifest:
    if tasks[1] > 1:
      raise RunError(
        f"--task_index: {workdir} holds a sweep of another config; all tasks of a sweep share "
        "one config (use a new --workdir for another sweep)"
      )
    dropped = sorted(set(before.get("files", [])) - set(names))
    before_config = before.get("config", {})
    changed = sorted(k for k, v in manifest["config"].items() if before_config.get(k) != v)
    listed = f": {', '.join(dropped)}" if dropped else ""
    logging.warning(
      "evaluate: %s held a sweep of another config (changed: %s); its %d file(s) not asked for "
      "now stay on disk and are not reported%s",
      workdir, ", ".join(changed) or "none", len(dropped), listed,
    )  # fmt: skip
  if is_writer():
    files.write_json(workdir / "manifest.json", manifest)
    files.write_json(workdir / "config.json", record(settings, command))
