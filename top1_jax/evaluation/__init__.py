"""Evaluation of any estimator: cross-validation, selective prediction, baselines, mislabels."""
