"""Runs a launcher as one process of a multi-process run, logging every file it writes.

  python tests/multihost_launcher.py <log file> <launcher> --workdir=... --process_id=...

The log (one path per line) shows which process wrote what: process 0 everything,
the others nothing.
"""

import sys

from top1_jax.io import files


def main() -> None:
  log, launcher = sys.argv[1], sys.argv[2]
  sys.argv = [f"{launcher}.py", *sys.argv[3:]]
  write = files.atomic_write

  def logged(path, payload):
    with open(log, "a") as f:
      f.write(f"{path}\n")
    return write(path, payload)

  files.atomic_write = logged
  import runpy

  import processes

  runpy.run_path(processes.script(launcher), run_name="__main__")


if __name__ == "__main__":
  main()
