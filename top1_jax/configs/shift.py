r"""Calibration under dataset shift on Fashion-MNIST (Ovadia et al. 2019), after the main job.

  python -m top1_jax.launch.shift --config=shift --workdir=runs/default

Reuses the networks the main job trained in the same work dir (training fields are
the default's; it trains them when they are missing) and writes under
``<workdir>/shift/``: each shifted set's predictions, ``results.csv`` (with
``shift`` and ``severity``), ``ood.csv``, ``results.md`` and figures.

The defaults fit a 2-core CPU in a few minutes: 12 rotations, 14 translations, 8
corruptions x 5 intensities and 2 out-of-distribution sets are 68 sets beside the
clean one, each predicted by the network, MC dropout and the 5-member ensemble. So
each set is the first 1,000 test examples (500 per test half: the ECE of 20 bins
then rests on ~25 examples a bin), MC dropout runs at one rate (0.05, in the main
job's sweep) with 16 samples (the main job's 32 halved: the covariance norm's
ranking changes little past 16), Top-1 only and 20 bins. On a GPU, scale up by
overrides: ``--config.shift_examples=10000 --config.num_samples=32
'--config.dropout_rates=(0.01,0.05,0.2)'``.
"""

from top1_jax.configs import default


def under_shift(config):
  """A training config evaluated under shift: one MC-dropout rate, Top-1, 20 bins (above)."""
  config.dropout_rates = (0.05,)
  config.num_samples = 16
  config.topk = (1,)
  config.n_bins = (20,)
  config.shift_examples = 1000
  return config


def get_config():
  """``default`` (the main job's networks) under shift."""
  return under_shift(default.get_config())
