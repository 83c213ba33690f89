"""top1_jax: calibrated Top-1 (and Top-k) uncertainty by binning a scalar score.

Oberman, Finlay, Iannantuono & Salvador, "Calibrated Top-1 Uncertainty estimates
for classification by score based models".

The package's face is the paper's maths, which needs only jax and numpy:

```python
  import top1_jax as t1
  cal = t1.Calibrator(score="neg_log_pmax", n_bins=20).fit(logits_cal, labels_cal)
  p = cal.predict_proba(logits_new)            # calibrated P(Top-1 correct)
  iso = t1.Calibrator(method="isotonic").fit(logits_cal, labels_cal)  # any estimator:
  sorted(t1.ESTIMATOR_REGISTRY)                # bins, isotonic, kde, temperature, toplabel

  # or the pieces:
  correct = t1.topk_correct(logits, labels, k=1)
  u = t1.neg_log_pmax(logits)
  bins = t1.fit_bins(u[:5000], correct[:5000], n_bins=20)
  p = t1.predict_bins(bins, u[5000:])          # calibrated P(correct)
  cv = t1.cross_validate(u, correct, n_bins=(10, 20, 100))
```

The rest is imported by name, so ``import top1_jax`` stays light:
``top1_jax.engine.models`` / ``mc`` / ``train`` (Flax models, MC dropout and ensembles),
``top1_jax.io`` (datasets, predictions files, writing files), ``top1_jax.plots``.
docs/architecture.md describes the layers.
"""

from top1_jax.calibrator import Calibrator
from top1_jax.core import binning, events, metrics, scores
from top1_jax.core.binning import (
  Bins,
  assign,
  calibrated_prob,
  clopper_pearson,
  confidence_bounds,
  hoeffding_halfwidth,
  quantile_edge_ranks,
)
from top1_jax.core.binning import fit as fit_bins
from top1_jax.core.binning import predict as predict_bins
from top1_jax.core.binning import refit as refit_bins
from top1_jax.core.events import topk_correct
from top1_jax.core.metrics import (
  Decomposition,
  auroc,
  binned_ece,
  brier,
  brier_decomposition,
  ece,
  eor,
  nll,
  nll_decomposition,
)
from top1_jax.core.scores import (
  REGISTRY,
  Score,
  covariance_norm,
  entropy,
  human_entropy,
  margin,
  mean_log_probs,
  neg_log_pmax,
  neg_log_topk_mass,
  pmax,
)
from top1_jax.estimators import bin_count, isotonic, kde, temperature, toplabel
from top1_jax.estimators.base import Estimator, Evidence
from top1_jax.estimators.registry import REGISTRY as ESTIMATOR_REGISTRY
from top1_jax.evaluation import baselines, comparison, crossval, mislabeled, selective
from top1_jax.evaluation.crossval import (
  METRICS,
  CrossValidation,
  Splits,
  cross_validate,
  make_splits,
)
from top1_jax.evaluation.mislabeled import ConfidentErrors, confident_errors
from top1_jax.io.examples import load_example
from top1_jax.set_predictor import SetPredictor
from top1_jax.version import __version__  # noqa: F401  (the public version)

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
