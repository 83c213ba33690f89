"""top1_jax: calibrated Top-1 (and Top-k) uncertainty by binning a scalar score.

Oberman, Finlay, Iannantuono & Salvador, "Calibrated Top-1 Uncertainty estimates
for classification by score based models".
"""

__version__ = "0.1.0"
