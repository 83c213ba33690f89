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


def bins_phrase(requested: int, effective: float, kind: str = "") -> str:
  """How many bins a figure shows: requested, and after tied edges merged when fewer.

  ``bins_phrase(15, 15, "equal-mass")`` is "15 equal-mass bins";
  ``bins_phrase(15, 12, "equal-mass")`` is "15 equal-mass bins requested, 12 after ties".
  A mean over splits (a float) is written with up to three digits.

  Args:
    requested: the bin count asked for.
    effective: bins that hold examples (``Bins.num_effective_bins``, or its mean).
    kind: the binning's name ("equal-mass", "equal-width"), or "" for none.

  Returns:
    The phrase.
  """
  kind = f"{kind} " if kind else ""
  if float(effective) >= requested:
    return f"{requested} {kind}bins"
  return f"{requested} {kind}bins requested, {float(effective):.3g} after ties"


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
