"""Figure creation and saving. Under ``rendering()`` a saved figure is handed to worker
processes: the caller goes on drawing the next one while they write the files."""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from top1_jax.io import files

if TYPE_CHECKING:  # etils only for a URL (io.files): the plots extra is matplotlib alone
  from etils import epath

# The widest figure, in inches: at the results page's ~1,150 px, "small" (8.3 pt) text is 12 px.
PAGE_WIDTH = 11.0


def new_figure(figsize: tuple[float, float]) -> Figure:
  """A constrained-layout ``Figure`` of ``figsize`` inches with its own Agg canvas (no pyplot:
  the user's backend is never switched, and pyplot's registry keeps no figure alive)."""
  fig = Figure(figsize=figsize, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def panel_row(num_panels: int) -> tuple[Figure, list]:
  """A figure of ``num_panels`` axes side by side, 3.6 inches each up to the page's width."""
  fig = new_figure((min(3.6 * num_panels, PAGE_WIDTH), 4.4))
  return fig, fig.subplots(1, num_panels, squeeze=False)[0]


def legend_below(fig: Figure, handles: list, labels: list[str], **options) -> None:
  """A figure legend under the panels, in as many columns as fit the page (at most 5)."""
  longest = max((len(label) for label in labels), default=1)
  # A "small" character is ~4.6 pt wide (8.3 pt text); each entry adds its handle, ~40 pt.
  columns = max(1, min(len(labels), 5, int(72 * PAGE_WIDTH // (4.6 * longest + 40))))
  options = {"loc": "outside lower center", "ncols": columns, "fontsize": "small", **options}
  fig.legend(handles, labels, **options)


def save_figure(fig: Figure, path: epath.PathLike, *, dpi: int = 150) -> pathlib.Path | epath.Path:
  """Writes ``fig`` atomically (``io.files.atomic_write``, parents created) with a tight
  bounding box; returns ``path`` as a Path. ``path`` may be a URL (``gs://``); its suffix
  picks the format. A figure made through pyplot is closed there (the object stays usable).

  Raises:
    ValueError: not a Figure, or a suffix matplotlib cannot write.
  """
  if not isinstance(fig, Figure):
    raise ValueError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
  path = files.as_path(path)
  fmt = path.suffix[1:].lower()
  supported = FigureCanvasAgg.get_supported_filetypes()
  # Checked before writing: atomic_write creates the parent folders first.
  if fmt not in supported:
    raise ValueError(
      f"path: expected a suffix among {sorted('.' + s for s in supported)}, got {path.name!r}"
    )
  options = {"format": fmt, "dpi": dpi, "bbox_inches": "tight", "pad_inches": 0.08}
  try:
    if _renderers is not None and _renderers.submit(fig, path, options):
      return path
    return files.atomic_write(path, lambda file: fig.savefig(file, **options))
  finally:
    if "matplotlib.pyplot" in sys.modules:
      sys.modules["matplotlib.pyplot"].close(fig)


class _Renderers:
  """Worker processes that write pickled figures, started on the first figure.

  Fresh interpreters, not ``multiprocessing``: a fork of a process that runs JAX's threads
  is unsafe, and spawn would import the caller's main module (and JAX) again.
  """

  def __init__(self, workers: int):
    self.workers, self.jobs, self.errors = workers, queue.Queue(), []
    self.procs: list[subprocess.Popen] = []
    self.threads: list[threading.Thread] = []

  def submit(self, fig: Figure, path, options: dict) -> bool:
    """Queues ``fig``; False if it does not pickle: save it here."""
    try:
      payload = pickle.dumps((fig, str(path), options), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
      return False
    if not self.procs:
      self._start()
    self.jobs.put((payload, path))
    return True

  def _start(self) -> None:
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-c", "from top1_jax.plots import figures; figures.serve()"]
    for _ in range(self.workers):
      proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": python_path, "MPLBACKEND": "agg"},
      )  # fmt: skip
      self.procs.append(proc)
      self.threads.append(threading.Thread(target=self._feed, args=(proc,), daemon=True))
      self.threads[-1].start()

  def _feed(self, proc: subprocess.Popen) -> None:
    while (job := self.jobs.get()) is not None:
      payload, path = job
      try:
        proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
        proc.stdin.flush()
        reply = proc.stdout.readline().decode(errors="replace").strip()
      except OSError as e:
        reply = f"the worker stopped ({e})"
      if reply != "ok":
        self.errors.append(f"{path}: {reply or f'the worker exited ({proc.wait()})'}")

  def close(self, *, wait: bool) -> None:
    """Waits for every queued figure (``wait``) or drops them, then ends the workers."""
    if not wait:
      for proc in self.procs:
        proc.kill()
    for _ in self.threads:
      self.jobs.put(None)
    for thread in self.threads:
      thread.join()
    for proc in self.procs:
      with contextlib.suppress(OSError):
        proc.stdin.close()
      proc.wait()


_renderers: _Renderers | None = None


@contextlib.contextmanager
def rendering(workers: int | None = None) -> Iterator[None]:
  """Within it, ``save_figure`` hands figures to ``workers`` processes (default: the CPU
  count, at most 8) and returns at once; on leaving, every figure has been written, or a
  RuntimeError names the first that could not be."""
  global _renderers
  if _renderers is not None:  # nested: the outer pool serves
    yield
    return
  _renderers = pool = _Renderers(workers or min(8, os.cpu_count() or 1))
  finished = False
  try:
    yield
    finished = True
  finally:
    _renderers = None
    pool.close(wait=finished)
  if pool.errors:
    more = f" (and {len(pool.errors) - 1} more)" if len(pool.errors) > 1 else ""
    raise RuntimeError(f"figure not written: {pool.errors[0]}{more}")


def serve() -> None:
  """A worker's loop: (length, pickled figure) frames from stdin (from our own process only)
  in, one line ("ok" or the error) per figure out."""
  stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
  while header := stdin.read(8):
    payload = stdin.read(int.from_bytes(header, "little"))
    try:
      fig, path, options = pickle.loads(payload)
      files.atomic_write(files.as_path(path), functools.partial(fig.savefig, **options))
      reply = "ok"
    except Exception as e:  # noqa: BLE001  (any failure is the parent's one-line error)
      reply = f"{type(e).__name__}: {e}".replace("\n", " ")
    stdout.write(reply.encode() + b"\n")
    stdout.flush()
