"""Evaluation of any estimator: cross-validation, selective prediction, the
mislabelled finder, the benchmark's multiclass metrics."""
