"""top1_jax: calibrated Top-1 (and Top-k) uncertainty by binning a scalar score.

Oberman, Finlay, Iannantuono & Salvador, "Calibrated Top-1 Uncertainty estimates for
classification by score based models". The maths needs only jax and numpy:

```python
  import top1_jax as t1
  cal = t1.Calibrator(score="neg_log_pmax", n_bins=20).fit(logits_cal, labels_cal)
  p = cal.predict_confidence(logits_new)       # calibrated P(Top-1 correct)

  correct = t1.topk_correct(logits, labels, k=1)  # or the pieces
  u = t1.neg_log_pmax(logits)
  bins = t1.fit_bins(u, correct, n_bins=20)
  cv = t1.cross_validate(u, correct, n_bins=(10, 20, 100))
```

Every name is imported on first use (PEP 562), so ``import top1_jax`` is instant and a
command line installs its signal handlers before JAX loads.
"""

import importlib

from top1_jax.version import __version__  # noqa: F401  (the public version)


def _names(module: str, *names: str) -> dict[str, tuple[str, str]]:
  return {name: (module, name) for name in names}


_EXPORTS = {
  # the practitioner's calibrator, and the estimators it (and cross-validation) looks up
  "Calibrator": ("top1_jax.calibrator", "Calibrator"),
  "ESTIMATOR_REGISTRY": ("top1_jax.estimators.registry", "REGISTRY"),
  "SetPredictor": ("top1_jax.set_predictor", "SetPredictor"),
  **_names("top1_jax.estimators.base", "Estimator", "Evidence"),
  # modules of the maths
  **_names("top1_jax.core", "binning", "events", "metrics", "scores"),
  **_names("top1_jax.estimators", "bin_count", "isotonic", "kde", "temperature", "toplabel"),
  **_names("top1_jax.evaluation", "baselines", "comparison", "crossval", "mislabeled", "selective"),
  # scores: U(x) from logits or samples, and their registry
  **_names("top1_jax.core.scores", "REGISTRY", "Score", "covariance_norm", "entropy"),
  **_names("top1_jax.core.scores", "human_entropy", "margin", "mean_log_probs"),
  **_names("top1_jax.core.scores", "neg_log_pmax", "neg_log_topk_mass", "pmax"),
  # the event
  **_names("top1_jax.core.events", "topk_correct"),
  # equal-count bins and their bounds
  **_names("top1_jax.core.binning", "Bins", "assign", "calibrated_prob", "clopper_pearson"),
  **_names("top1_jax.core.binning", "confidence_bounds", "hoeffding_halfwidth"),
  **_names("top1_jax.core.binning", "quantile_edge_ranks"),
  "fit_bins": ("top1_jax.core.binning", "fit"),
  "predict_bins": ("top1_jax.core.binning", "predict"),
  "refit_bins": ("top1_jax.core.binning", "refit"),
  # metrics
  **_names("top1_jax.core.metrics", "Decomposition", "auroc", "binned_ece", "brier", "ece"),
  **_names("top1_jax.core.metrics", "brier_decomposition", "eor", "nll", "nll_decomposition"),
  # cross-validation
  **_names("top1_jax.evaluation.crossval", "METRICS", "CrossValidation", "Splits"),
  **_names("top1_jax.evaluation.crossval", "cross_validate", "make_splits"),
  # the supplement's mislabelled-image search
  **_names("top1_jax.evaluation.mislabeled", "ConfidentErrors", "confident_errors"),
  # example data: two real networks' CIFAR test-set probabilities and labels
  **_names("top1_jax.io.examples", "load_example"),
}
"""Each public name: (its module, its name there); a module's own name is the module."""

__all__ = list(_EXPORTS)


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
