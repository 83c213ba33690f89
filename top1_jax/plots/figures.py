"""Figure creation and saving, shared by the figure modules of ``top1_jax.plots``."""

from __future__ import annotations

import pathlib
import sys
from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from top1_jax.io import files

if TYPE_CHECKING:  # etils only for a URL (io.files): the plots extra is matplotlib alone
  from etils import epath


PAGE_WIDTH = 11.0
"""The widest figure, in inches. The results page shows a figure at most ~1,150 px wide:
at 11 in, legend text of matplotlib's "small" size (8.3 pt) stays 12 px there."""


def new_figure(figsize: tuple[float, float]) -> Figure:
  """A constrained-layout ``Figure`` with its own Agg canvas.

  Made without pyplot, so drawing never switches the user's backend or opens a
  window, and the figure is not kept alive by pyplot's registry.

  Args:
    figsize: (width, height) in inches.

  Returns:
    An empty ``Figure``.
  """
  fig = Figure(figsize=figsize, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


def legend_columns(labels: list[str], width: float = PAGE_WIDTH) -> int:
  """Columns of a figure legend in "small" text that fit ``width`` inches: at most 5."""
  longest = max((len(label) for label in labels), default=1)
  # A "small" character is ~4.6 pt wide (8.3 pt text); each entry adds its handle, ~40 pt.
  fit = int(72 * width // (4.6 * longest + 40))
  return max(1, min(len(labels), 5, fit))


def save_figure(fig: Figure, path: epath.PathLike, *, dpi: int = 150) -> pathlib.Path | epath.Path:
  """Writes ``fig`` atomically and closes it.

  The bounding box is tight (legends placed outside axes are kept, also in figures
  made elsewhere). The image is written through ``io.files.atomic_write``: a
  reader never sees a partial file, and a failure leaves any existing file
  untouched. Parent directories are created. ``path`` may be a URL (``gs://``).

  Args:
    fig: the figure.
    path: destination; the suffix picks the format (.png, .pdf, .svg, ...).
    dpi: resolution of raster formats.

  Returns:
    ``path`` as a ``pathlib.Path`` (local) or an ``epath.Path`` (URL). A figure
    made through pyplot is closed (removed from pyplot's registry); the object
    itself stays usable.

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
  try:
    options = {"format": fmt, "dpi": dpi, "bbox_inches": "tight", "pad_inches": 0.08}
    return files.atomic_write(path, lambda file: fig.savefig(file, **options))
  finally:
    # Only figures made through pyplot are registered there; ours are not.
    if "matplotlib.pyplot" in sys.modules:
      sys.modules["matplotlib.pyplot"].close(fig)
