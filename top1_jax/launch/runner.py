"""The command line's shared runner. Every main runs ``runner.run(main)``: flags parsed,
processes joined, the work dir checked and locked, any failure printed as one line (exit
status 1); Ctrl-C and SIGTERM stop the run with one line, the lock released (130, 143)."""

import contextlib
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from absl import app, flags, logging

from top1_jax import configs, launch
from top1_jax.core import validation
from top1_jax.engine import parallel
from top1_jax.io import datasets, files, lock
from top1_jax.launch import usage

WORKDIR = flags.DEFINE_string("workdir", None, "Directory or URL (gs://...) for this run's files.")
COORDINATOR = flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0, for a run over several processes."
)
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes of a multi-process run.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
TASK_INDEX = flags.DEFINE_integer(
  "task_index", 0, "This task's index when --num_tasks tasks share a sweep (a job array)."
)
NUM_TASKS = flags.DEFINE_integer(
  "num_tasks", 1, "Tasks that split the sweep's points between them."
)

EXTRAS = {"train": "all", "predict": "all", "reproduce": "all", "shift": "all"}  # others: cli
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
  """The imports of ``launcher``: a missing package is one line (``install_hint``), exit 2;
  nested, the outermost names the launcher the user ran."""
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


class ExperimentError(ValueError):
  """A problem the user can fix (bad setting, missing file): printed as one line."""


def workdir():
  """``--workdir`` as a path (``pathlib`` when local, ``epath`` for a URL)."""
  if WORKDIR.value is not None and not WORKDIR.value.strip():  # --workdir= (an unset variable)
    raise ExperimentError("--workdir: empty; give a directory or URL for this run's files")
  if not WORKDIR.value:
    raise ExperimentError("--workdir: required (a directory or URL for this run's files)")
  return files.as_path(os.path.expanduser(WORKDIR.value))


def no_arguments(argv: list[str]) -> None:
  """A main takes flags only: a stray word (a path without its flag) is refused, not ignored."""
  if len(argv) > 1:
    raise ExperimentError(
      f"unexpected argument(s): {' '.join(argv[1:])}; every setting is a flag "
      "(--config.<field>=..., --workdir=...; --help lists them)"
    )


def command() -> str:
  """The command line that started this run, for its record (config.json)."""
  return " ".join(["python", *sys.argv] if sys.argv[0].endswith(".py") else sys.argv)


def tasks() -> tuple[int, int]:
  """(task index, number of tasks), checked."""
  if NUM_TASKS.value < 1 or not 0 <= TASK_INDEX.value < NUM_TASKS.value:
    raise ExperimentError(
      f"--task_index: expected 0 <= --task_index < --num_tasks, got {TASK_INDEX.value} of "
      f"{NUM_TASKS.value}"
    )
  return TASK_INDEX.value, NUM_TASKS.value


# ValueError: ExperimentError and the library's SettingError too; OSError: an unusable work dir.
_USER_ERRORS = (ValueError, OSError, datasets.DataUnavailableError, lock.WorkdirBusyError)


def one_line(error: BaseException) -> str:
  text = " ".join(str(error).split()) or type(error).__name__
  if isinstance(error, validation.SettingError):  # the library names the field: a flag here
    return f"--config.{text}"
  root = WORKDIR.value if flags.FLAGS.is_parsed() else None
  if root and files.is_local(root) and (full := files.disk_full(error, root)):  # or a quota
    way_out = "free some space or give another --workdir, then rerun the same command to resume"
    return f"--workdir: {full}; {way_out}"
  if isinstance(error, ModuleNotFoundError) and error.name and "top1_jax" not in error.name:
    launcher = os.path.basename(sys.argv[0]).removeprefix("top1-").removesuffix(".py")
    return install_hint(launcher.replace("-", "_"), error.name.split(".")[0])
  if isinstance(error, _USER_ERRORS):
    return text
  # Anything else (Flax, orbax, XLA): its type and first words, the rest with TOP1_DEBUG=1.
  return f"{type(error).__name__}: {text[:300]} (TOP1_DEBUG=1 shows the traceback)"


def fail(error: BaseException, joined: bool = True) -> None:
  """Prints ``error`` as one line and exits 1 (``joined``: processes may have been joined)."""
  if os.environ.get("TOP1_DEBUG"):
    traceback.print_exc()
  print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
  if joined and parallel.process_count() > 1:
    # Not at JAX's shutdown barrier: the coordinator sees this process gone, stops the others.
    os._exit(1)
  sys.exit(1)


PACKAGED_CONFIGS = os.path.dirname(os.path.abspath(configs.__file__))  # top1_jax/configs


def _config_path(arg: str) -> str:
  """--config=NAME (a packaged config) or a path; a missing path naming a packaged config
  (configs/quick.py) is that config, from any folder."""
  if not arg.startswith("--config="):
    return arg
  value, colon, rest = arg[len("--config=") :].partition(":")
  if os.path.exists(value):
    return arg
  name = os.path.basename(value)
  packaged = os.path.join(PACKAGED_CONFIGS, name if name.endswith(".py") else f"{name}.py")
  return f"--config={packaged}{colon}{rest}" if os.path.exists(packaged) else arg


def packaged_names() -> str:
  """The packaged configs' names, comma-separated (what ``--config=<name>`` accepts)."""
  return ", ".join(sorted(n[:-3] for n in os.listdir(PACKAGED_CONFIGS) if n[0].isalpha()))


def check_config_file(value: str) -> None:
  """``--config``'s file (before a colon): ExperimentError if missing, a folder or binary."""
  path = value.split(":", 1)[0]
  if problem := files.not_text(path):
    way_out = f"give a packaged config by name ({packaged_names()}) or a Python config file"
    raise ExperimentError(f"--config: {path}: {problem}; {way_out}")


def _parse_flags(argv: list[str], doc: str | None = None) -> list[str]:
  """absl's parsing, with a bad flag or config override as one line (not a traceback)."""
  argv = [_config_path(arg) for arg in argv]
  given = next((a.removeprefix("--config=") for a in argv[::-1] if a.startswith("--config=")), None)
  asked = [usage.HELP_FLAGS[arg] for arg in argv if arg in usage.HELP_FLAGS]
  refuse = functools.partial(fail, joined=False)  # no process is joined before the flags
  try:
    if given is not None:
      check_config_file(given)
    parsed = flags.FLAGS([arg for arg in argv if arg not in usage.HELP_FLAGS])
  except flags.UnrecognizedFlagError as e:
    refuse(ExperimentError(usage.unknown_flag(e.flagname, flags.FLAGS)))
  except flags.Error as e:
    refuse(ValueError(f"{e} (--help lists every flag)"))
  except SyntaxError as e:  # a config file that is not Python
    refuse(ExperimentError(f"--config: {given}: not Python ({e.msg}, line {e.lineno})"))
  except (AttributeError, KeyError) as e:  # --config.<no such field>
    if "get_config" in str(e):
      refuse(ExperimentError(f"--config: {given} defines no get_config() (see configs/quick.py)"))
    refuse(ExperimentError(usage.unknown_field(argv)))
  except Exception as e:  # noqa: BLE001 -- a config file that does not load, among others
    if given is not None:  # its own error (a raise, a RecursionError): the file named
      e = ExperimentError(f"--config: {given}: {type(e).__name__}: {' '.join(str(e).split())}")
    refuse(e)
  if asked:
    print(usage.help_text(flags.FLAGS, doc, full=any(asked)))
    sys.exit(0)
  return parsed


def _ours_or_warning(record) -> bool:
  if "raised an exception" in str(record.msg) and f"{os.sep}orbax{os.sep}" in record.pathname:
    return False  # a save's worker thread failed: the save raises it, printed as one line
  ours = f"{os.sep}top1_jax{os.sep}" in record.pathname
  return ours or record.levelno >= logging.converter.STANDARD_WARNING


def _quiet_others(verbosity: int) -> None:
  """At the default verbosity, only this project's progress and everyone's warnings: JAX's
  and orbax's INFO lines drown the progress (``-v 1`` shows them)."""
  import logging as python_logging

  if verbosity < 1 and not os.environ.get("TOP1_DEBUG"):
    python_logging.getLogger("jax").setLevel(python_logging.WARNING)
    logging.get_absl_handler().addFilter(_ours_or_warning)
    # A failed checkpoint save leaves tensorstore callbacks for an asyncio loop that orbax
    # has closed, each a "RuntimeError: Event loop is closed" traceback. Others are shown.
    shown = sys.unraisablehook
    sys.unraisablehook = lambda error: "loop is closed" in str(error.exc_value) or shown(error)


_CACHE = os.path.expanduser(os.path.join("~", ".cache", "top1_jax", "xla"))  # XLA's compile cache

_HELD = []  # the lock this process holds, for a stop that cannot wait for the unwinding


@contextlib.contextmanager
def _holding_workdir():
  """The work dir's lock (per task when tasks share it), held by the writing process."""
  if not WORKDIR.value or not parallel.is_writer():  # demo writes files only when given one
    yield
    return
  path = workdir()
  files.check_usable(path, "--workdir")
  index, count = tasks()
  name = lock.LOCK_NAME if count == 1 else f"{lock.LOCK_NAME}.task{index}of{count}"
  with lock.hold(path, say=logging.warning, name=name) as held:
    _HELD.append(held)
    try:
      yield
    finally:
      _HELD.remove(held)


STOP_GRACE_SECONDS = 10.0  # how long a stopped run may unwind (temporary files, the lock)


class Stopped(KeyboardInterrupt):
  """SIGINT or SIGTERM, raised in the main thread: the run unwinds, then exits. A
  ``KeyboardInterrupt``, so code that cleans up after Ctrl-C does it for SIGTERM too."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _exit_stopped(signum: int) -> None:
  """The stop's line and exit status, without Python's shutdown (``os._exit``): tearing
  down the interpreter under XLA compiling in another thread can crash."""
  for held in list(_HELD):
    lock.release(held)
  status, line = launch.STOPS[signum]
  with contextlib.suppress(Exception):
    sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  os._exit(status)


def _on_signal(signum: int, frame) -> None:
  if parallel.in_garbage_collection(frame):  # what a gc callback raises is dropped: later
    threading.Timer(0.01, signal.raise_signal, (signum,)).start()
    return
  if stopping:  # a second signal: do not wait
    _exit_stopped(stopping[0])
  stopping.append(signum)
  # Should the exception be lost (raised in a gc callback, which Python ignores), it ends anyway.
  timer = threading.Timer(STOP_GRACE_SECONDS, _exit_stopped, (signum,))
  timer.daemon = True  # a run that fails on its way out exits 1 at once
  timer.start()
  raise Stopped(signum)


stopping: list[int] = []  # the signals received; the run stops at the first


def run(
  main: Callable[[list[str]], None],
  default_workdir: Callable[[], str] | None = None,
  *,
  cpu_device_per_core: bool = False,
  doc: str | None = None,
):
  """``app.run`` with one-line failures, the process group joined and the work dir held.
  ``default_workdir`` names the work dir without --workdir; ``cpu_device_per_core`` gives JAX
  one CPU device per core; ``doc`` is what ``--help`` says first (default: the module's)."""

  def wrapped(argv):
    _quiet_others(logging.get_verbosity())
    parallel.use_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR") or _CACHE)
    cores, xla_flags = os.cpu_count() or 1, os.environ.get("XLA_FLAGS", "")
    if cpu_device_per_core and not parallel.one_cpu_device_per_core(cores, xla_flags):
      logging.info("evaluate: JAX already started; its CPU devices stay as they are")
    if default_workdir is not None and WORKDIR.value is None:
      flags.FLAGS.workdir = default_workdir()
    try:
      if WORKDIR.value is not None:
        workdir()  # --workdir= (empty): refused before any work
      # Its ValueErrors name the flag: one line like any other.
      parallel.initialize(
        COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value, environ=os.environ
      )
      with _holding_workdir():
        main(argv)
      parallel.barrier("top1_jax: launcher done")  # others wait for process 0's writes
    except Exception as e:  # noqa: BLE001 -- every failure becomes one line
      fail(e)
    if stopping:  # a stop whose exception was lost: the run went on to its end
      raise Stopped(stopping[0])

  launch.catch_stops(_on_signal)
  try:
    doc = doc or sys.modules[main.__module__].__doc__  # --help shows it
    app.run(wrapped, flags_parser=lambda argv: _parse_flags(argv, doc))
  except KeyboardInterrupt as e:  # Stopped, or Ctrl-C before the handlers were set
    if os.environ.get("TOP1_DEBUG"):
      traceback.print_exc()
    _exit_stopped(getattr(e, "signum", signal.SIGINT))
