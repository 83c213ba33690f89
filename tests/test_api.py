"""The package's face: ``top1_jax.__all__`` is the maths, importable without the heavy stack."""

import subprocess
import sys

import numpy as np

import top1_jax as t1


def test_every_public_name_resolves():
  assert len(t1.__all__) == len(set(t1.__all__))
  for name in t1.__all__:
    assert getattr(t1, name) is not None, name


def test_importing_the_package_pulls_in_no_models_files_or_plots():
  heavy = (
    "flax",
    "optax",
    "orbax",
    "matplotlib",
    "tensorflow_datasets",
    "absl",
    "top1_jax.engine.mc",
  )
  code = f"import sys, top1_jax; print([m for m in {heavy!r} if m in sys.modules])"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_the_docstring_example_runs():
  rng = np.random.default_rng(0)
  logits = (3 * rng.normal(size=(2000, 10))).astype(np.float32)
  labels = rng.integers(0, 10, 2000)
  correct = t1.topk_correct(logits, labels, k=1)
  u = t1.neg_log_pmax(logits)
  bins = t1.fit_bins(u[:1000], correct[:1000], n_bins=20)
  p = np.asarray(t1.predict_bins(bins, u[1000:]))
  assert p.shape == (1000,) and np.all((p > 0) & (p < 1))
  cv = t1.cross_validate(u, correct, n_bins=(10, 20))
  assert cv.n_bins == (10, 20) and set(cv.mean) == set(t1.METRICS)
