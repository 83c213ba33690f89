"""Figures: calibrated Top-1 bins, bin refinement, bin-count ablations, image grids.

* ``bin_figure``: the paper's Figure 1. Calibration and test bins of one score,
  ordered from most to least confident, drawn as bars up or down from the
  model's accuracy, with per-bin confidence intervals and the ECE.
* ``refinement_figure``: the paper's Figure 2. The same score with a coarse and a
  fine binning side by side; the fine panel also traces the coarse predictions.
* ``reliability_diagram(confidence, correct)``: the standard diagram of any
  predicted P(correct) (the raw max-softmax, or a calibrator's ``predict_confidence``):
  accuracy against mean confidence in equal-mass or equal-width bins, the
  diagonal, the bins' counts below and their ECE.
* ``ablation_figure``: Brier, ECE and EOR (mean ± std over splits) against the
  number of bins, one line per score (scores with identical results share one),
  from ``crossval.cross_validate``; the oracle (it needs the labels) is a grey
  reference line that never sets the axis limits.
* ``dropout_rate_figure``: metrics of MC dropout against the test-time dropout
  rate, one line per bin count, the deterministic network as a reference line;
  from a run's tidy results rows or rows merged over seeds (``top1_jax.pipeline.aggregation``).
* ``shift_curves``, ``corruption_boxes``, ``ood_histograms``: calibration under
  dataset shift after Ovadia et al. (metrics against rotation or translation, boxes
  over corruptions per intensity, P(correct) on out-of-distribution inputs).
* ``risk_coverage_figure``: the risk-coverage curve of a score with selective
  prediction's guaranteed operating points (``selective.guaranteed_coverage``).
* ``image_grid``: tiles of images with their given label, predicted label and a
  probability (the supplementary's mislabelled-image finder).
* ``save_figure``: atomic write through ``io.files`` (local path or a URL); within
  ``rendering()``, handed to worker processes that write it while the next is drawn.
* ``results_page`` / ``write_results_page`` (of ``Table`` values): a run's
  ``index.html``, the answer first, then its tables, figures, config and timings
  folded, on one static page that opens from disk (a Jinja template).

Every figure names the ECE it shows by ``core.metrics.ece_name``, as the tables
do: its binning and how many bins, requested and after tied scores merged when
fewer ("ECE (15 equal-width bins)", "ECE (20 equal-mass calibration-split bins
requested, 17 after ties)").

Modules: ``bins`` (Figs. 1 and 2), ``reliability`` (the reliability diagram),
``sweeps`` (the ablation and the dropout-rate sweep), ``risk`` (the risk-coverage
curve), ``images`` (the grid), ``figures`` (figure creation and saving), ``page``
(the results page), ``shift`` (dataset shift), ``results`` (a finished sweep's figures).

Figures are ``matplotlib.figure.Figure`` objects with an Agg canvas, made without
pyplot: importing this package never switches the user's backend or opens a
window, and figures are not kept alive by pyplot's registry.
"""

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
  """Imports a name's module on first use: a figure worker (``figures.serve``) and a
  run without figures never import JAX through ``bins``."""
  if name not in _HOME:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_HOME))
