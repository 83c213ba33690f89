"""Figures (paper Figs. 1 and 2, reliability diagrams, sweeps, dataset shift, risk-coverage,
image grids) and a run's results page. Figures have their own Agg canvas, made without
pyplot: importing this package never switches the user's backend or opens a window."""

import importlib

_HOMES = {
  "bins": ("BAR_ORDERS", "BOUNDS", "bin_figure", "refinement_figure"),
  "figures": ("rendering", "save_figure"),
  "images": ("image_grid",),
  "page": ("Table", "results_page", "write_results_page"),
  "reliability": ("reliability_diagram",),
  "results": (
    "write_dropout_rate_figures", "write_figures", "write_risk_coverage_figures",
    "write_shift_figures",
  ),
  "risk": ("OperatingPoint", "risk_coverage_figure"),
  "shift_figures": ("corruption_boxes", "ood_histograms", "shift_curves"),
  "sweeps": ("ablation_figure", "dropout_rate_figure"),
}  # fmt: skip
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
  # Lazy: a figure worker (``figures.serve``) and a run without figures never import JAX.
  if name not in _HOME:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_HOME))
