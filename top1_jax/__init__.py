"""top1_jax: calibrated Top-1 (and Top-k) uncertainty by binning a scalar score.

Oberman, Finlay, Iannantuono & Salvador, "Calibrated Top-1 Uncertainty estimates
for classification by score based models".

The package's face is the paper's maths, which needs only jax and numpy:

```python
  import top1_jax as t1
  cal = t1.Calibrator(score="neg_log_pmax", n_bins=20).fit(logits_cal, labels_cal)
  p = cal.predict_confidence(logits_new)       # calibrated P(Top-1 correct)
  iso = t1.Calibrator(method="isotonic").fit(logits_cal, labels_cal)  # any estimator:
  sorted(t1.ESTIMATOR_REGISTRY)                # bins, isotonic, kde, temperature, toplabel

  # or the pieces:
  correct = t1.topk_correct(logits, labels, k=1)
  u = t1.neg_log_pmax(logits)
  bins = t1.fit_bins(u[:5000], correct[:5000], n_bins=20)
  p = t1.predict_bins(bins, u[5000:])          # calibrated P(correct)
  cv = t1.cross_validate(u, correct, n_bins=(10, 20, 100))
```

Every name is imported on first use (PEP 562), so ``import top1_jax`` is instant and a
command line installs its signal handlers before JAX loads. The rest by module:
``top1_jax.engine.models`` / ``mc`` / ``train`` (Flax models, MC dropout and ensembles),
``top1_jax.io`` (datasets, predictions files, writing files), ``top1_jax.plots``.
docs/architecture.md describes the layers.
"""

import importlib

from top1_jax.version import __version__  # noqa: F401  (the public version)

_EXPORTS = {
  "Calibrator": ("top1_jax.calibrator", "Calibrator"),
  "binning": ("top1_jax.core", "binning"),
  "events": ("top1_jax.core", "events"),
  "metrics": ("top1_jax.core", "metrics"),
  "scores": ("top1_jax.core", "scores"),
  "Bins": ("top1_jax.core.binning", "Bins"),
  "assign": ("top1_jax.core.binning", "assign"),
  "calibrated_prob": ("top1_jax.core.binning", "calibrated_prob"),
  "clopper_pearson": ("top1_jax.core.binning", "clopper_pearson"),
  "confidence_bounds": ("top1_jax.core.binning", "confidence_bounds"),
  "hoeffding_halfwidth": ("top1_jax.core.binning", "hoeffding_halfwidth"),
  "quantile_edge_ranks": ("top1_jax.core.binning", "quantile_edge_ranks"),
  "fit_bins": ("top1_jax.core.binning", "fit"),
  "predict_bins": ("top1_jax.core.binning", "predict"),
  "refit_bins": ("top1_jax.core.binning", "refit"),
  "topk_correct": ("top1_jax.core.events", "topk_correct"),
  "Decomposition": ("top1_jax.core.metrics", "Decomposition"),
  "auroc": ("top1_jax.core.metrics", "auroc"),
  "binned_ece": ("top1_jax.core.metrics", "binned_ece"),
  "brier": ("top1_jax.core.metrics", "brier"),
  "brier_decomposition": ("top1_jax.core.metrics", "brier_decomposition"),
  "ece": ("top1_jax.core.metrics", "ece"),
  "eor": ("top1_jax.core.metrics", "eor"),
  "nll": ("top1_jax.core.metrics", "nll"),
  "nll_decomposition": ("top1_jax.core.metrics", "nll_decomposition"),
  "REGISTRY": ("top1_jax.core.scores", "REGISTRY"),
  "Score": ("top1_jax.core.scores", "Score"),
  "covariance_norm": ("top1_jax.core.scores", "covariance_norm"),
  "entropy": ("top1_jax.core.scores", "entropy"),
  "human_entropy": ("top1_jax.core.scores", "human_entropy"),
  "margin": ("top1_jax.core.scores", "margin"),
  "mean_log_probs": ("top1_jax.core.scores", "mean_log_probs"),
  "neg_log_pmax": ("top1_jax.core.scores", "neg_log_pmax"),
  "neg_log_topk_mass": ("top1_jax.core.scores", "neg_log_topk_mass"),
  "pmax": ("top1_jax.core.scores", "pmax"),
  "bin_count": ("top1_jax.estimators", "bin_count"),
  "isotonic": ("top1_jax.estimators", "isotonic"),
  "kde": ("top1_jax.estimators", "kde"),
  "temperature": ("top1_jax.estimators", "temperature"),
  "toplabel": ("top1_jax.estimators", "toplabel"),
  "Estimator": ("top1_jax.estimators.base", "Estimator"),
  "Evidence": ("top1_jax.estimators.base", "Evidence"),
  "ESTIMATOR_REGISTRY": ("top1_jax.estimators.registry", "REGISTRY"),
  "baselines": ("top1_jax.evaluation", "baselines"),
  "comparison": ("top1_jax.evaluation", "comparison"),
  "crossval": ("top1_jax.evaluation", "crossval"),
  "mislabeled": ("top1_jax.evaluation", "mislabeled"),
  "selective": ("top1_jax.evaluation", "selective"),
  "METRICS": ("top1_jax.evaluation.crossval", "METRICS"),
  "CrossValidation": ("top1_jax.evaluation.crossval", "CrossValidation"),
  "Splits": ("top1_jax.evaluation.crossval", "Splits"),
  "cross_validate": ("top1_jax.evaluation.crossval", "cross_validate"),
  "make_splits": ("top1_jax.evaluation.crossval", "make_splits"),
  "ConfidentErrors": ("top1_jax.evaluation.mislabeled", "ConfidentErrors"),
  "confident_errors": ("top1_jax.evaluation.mislabeled", "confident_errors"),
  "load_example": ("top1_jax.io.examples", "load_example"),
  "SetPredictor": ("top1_jax.set_predictor", "SetPredictor"),
}
"""Each public name: (its module, its name there); a module's own name is the module."""


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'top1_jax' has no attribute {name!r}")
  module, attr = _EXPORTS[name]
  try:  # a module of a package (top1_jax.core's binning)
    value = importlib.import_module(f"{module}.{attr}")
  except ModuleNotFoundError as e:
    if e.name != f"{module}.{attr}":
      raise
    value = getattr(importlib.import_module(module), attr)  # a name in a module
  globals()[name] = value  # found directly from now on
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
  # the practitioner's calibrator, and the estimators it (and cross-validation) looks up
  "Calibrator",
  "ESTIMATOR_REGISTRY",
  "SetPredictor",
  "Estimator",
  "Evidence",
  # modules of the maths
  "baselines",
  "bin_count",
  "binning",
  "comparison",
  "crossval",
  "events",
  "isotonic",
  "kde",
  "metrics",
  "mislabeled",
  "scores",
  "selective",
  "temperature",
  "toplabel",
  # scores: U(x) from logits or samples, and their registry
  "REGISTRY",
  "Score",
  "covariance_norm",
  "entropy",
  "human_entropy",
  "margin",
  "mean_log_probs",
  "neg_log_pmax",
  "neg_log_topk_mass",
  "pmax",
  # the event
  "topk_correct",
  # equal-count bins and their bounds
  "Bins",
  "assign",
  "calibrated_prob",
  "clopper_pearson",
  "confidence_bounds",
  "fit_bins",
  "hoeffding_halfwidth",
  "predict_bins",
  "quantile_edge_ranks",
  "refit_bins",
  # metrics
  "Decomposition",
  "auroc",
  "binned_ece",
  "brier",
  "brier_decomposition",
  "ece",
  "eor",
  "nll",
  "nll_decomposition",
  # cross-validation
  "METRICS",
  "CrossValidation",
  "Splits",
  "cross_validate",
  "make_splits",
  # the supplement's mislabelled-image search
  "ConfidentErrors",
  "confident_errors",
  # example data: two real networks' CIFAR test-set probabilities and labels
  "load_example",
]
