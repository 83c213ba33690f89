"""The core's tests again with ``jax_enable_x64`` on: its public functions work both ways.

JAX reads ``JAX_ENABLE_X64`` when it is imported, so the tests run in a second pytest
process with it set. Any test file runs so by hand:
``JAX_ENABLE_X64=1 python -m pytest tests/test_scores.py``. Here a chosen few per core
module, those that reach the paths where a default dtype enters (the covariance's
rescaled products, bisection and restart; the log-space scores' counts; bins, metrics
and cross-validation; the Calibrator's fit, save and load), to keep the suite short.
"""

import os
import subprocess
import sys

import processes
import pytest

CORE_TESTS = (
  "tests/test_covariance.py::test_subnormal_and_overflowing_spreads[2-3]",
  "tests/test_covariance.py::test_covariance_whose_top_direction_is_orthogonal_to_the_start_vector",
  "tests/test_scores.py::test_saturated_softmax_does_not_tie",
  "tests/test_scores.py::test_covariance_norm_of_huge_and_tiny_logits_is_scaled_not_nan",
  "tests/test_scores.py::test_covariance_norm_below_the_float_range_is_an_error_not_a_silent_zero",
  "tests/test_scores.py::test_top_k_scores_equal_the_sort_based_definition_with_ties",
  "tests/test_scores.py::test_log_probs_from_probs_keeps_underflowed_tails_apart",
  "tests/test_scores.py::test_oracle_loss_is_the_true_class_cross_entropy_and_stays_an_oracle",
  "tests/test_events.py",
  "tests/test_calibrator.py::test_fit_returns_self_and_matches_the_bins_and_the_oracle",
  "tests/test_calibrator.py::test_save_load_round_trip_is_exact",
  "tests/test_calibrator.py::test_samples_and_sample_scores",
  "tests/test_calibrator.py::test_predict_interval_is_the_bins_exact_interval",
  "tests/test_calibrator.py::test_evaluate_reports_undefined_metrics_as_none",
  "tests/test_metrics.py::test_binned_metrics_match_loop",
  "tests/test_metrics.py::test_per_example_metrics_match_loop",
  "tests/test_metrics.py::test_public_metrics_return_python_floats",
  "tests/test_crossval.py::test_matches_per_split_loop",
  "tests/test_crossval.py::test_equals_fit_and_refit_on_each_split",
)


@pytest.mark.slow
def test_core_tests_pass_with_x64():
  env = {**os.environ, "JAX_ENABLE_X64": "1"}
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CORE_TESTS]
  result = subprocess.run(
    command, cwd=processes.ROOT, env=env, capture_output=True, text=True, timeout=400
  )
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
