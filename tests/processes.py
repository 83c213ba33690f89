"""Launchers and several Python processes at once, as the tests start them (one place)."""

import os
import pathlib
import socket
import subprocess
import sys


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now (for a coordinator)."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def start(commands: list[list[str]], env: dict, cwd=None) -> list[subprocess.Popen]:
  """``python <command>`` for each command, all at once, stdout and stderr together."""
  return [
    subprocess.Popen(
      [sys.executable, *command],
      cwd=cwd,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for command in commands
  ]


def wait(processes: list[subprocess.Popen], timeout: float) -> list[str]:
  """Their outputs; each must exit 0. One that fails leaves the others waiting: all are
  killed on the way out."""
  outputs = []
  try:
    for process in processes:
      outputs.append(process.communicate(timeout=timeout)[0])
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
  for process, output in zip(processes, outputs, strict=True):
    assert process.returncode == 0, output[-3000:]
  return outputs


def xla_flags(device_count: int | None = None) -> str:
  """This process's XLA_FLAGS with ``device_count`` fake CPU devices (None: the child picks
  its own count): the child compiles as this process does (conftest's backend level), so
  their numbers compare bit for bit and it compiles no slower than the tests here."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
  if device_count is not None:
    flags.append(f"--xla_force_host_platform_device_count={device_count}")
  return " ".join(flags)


ROOT = pathlib.Path(__file__).resolve().parent.parent
LAUNCHER_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}


def script(name: str) -> str:
  """The path of ``experiments/<name>.py``, a stage's (or tool's) main."""
  return str(ROOT / "experiments" / f"{name}.py")


def launcher(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  """``python experiments/<module>.py <args>`` from the clone's root, as a user runs it."""
  return subprocess.run(
    [sys.executable, script(module), *args],
    cwd=ROOT,
    env=LAUNCHER_ENV,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
