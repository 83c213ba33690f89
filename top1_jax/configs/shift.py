r"""Calibration under dataset shift (Ovadia et al. 2019), after a training job in the same work dir.

  python experiments/shift.py --config=shift --workdir=runs/default           # Fashion-MNIST
  python experiments/shift.py --config=shift:cifar10 --workdir=runs/cifar10   # any config's

``shift:<config>`` evaluates the networks ``--config=<config>`` trained (its training
fields; the default config's without an argument), reused from the work dir (trained
when missing), and writes under ``<workdir>/shift/``: each shifted set's predictions,
``results.csv`` (with ``shift`` and ``severity``; the prediction sets' coverage beside),
``ood.csv``, ``recalibration.csv`` (refitted on m labelled shifted examples),
``accuracy_estimates.csv`` (accuracy predicted without labels), ``results.md``, figures
and ``index.html``.

The defaults fit a 2-core CPU in a few minutes: 12 rotations, 13 translations, 8
corruptions x 5 intensities and 2 out-of-distribution sets are 67 sets beside the
clean one, each predicted by the network, MC dropout and the 5-member ensemble. So
each set is the first 1,000 test examples (500 per test half: the ECE of 20 bins
then rests on ~25 examples a bin), MC dropout runs at one rate (0.05, in the main
job's sweep) with 16 samples (the main job's 32 halved: the covariance norm's
ranking changes little past 16), Top-1 only and 20 bins. On a GPU, scale up by
overrides: ``--config.shift_examples=10000 --config.num_samples=32
'--config.dropout_rates=(0.01,0.05,0.2)'``.
"""

import importlib


def get_config(base: str | None = None):
  """The training config ``base`` (a packaged name; default: ``default``) under shift: one
  MC-dropout rate, Top-1, 20 bins, 1,000 examples (above)."""
  config = importlib.import_module(f"top1_jax.configs.{base or 'default'}").get_config()
  config.dropout_rates = (0.05,)
  config.num_samples = 16
  config.topk = (1,)
  config.n_bins = (20,)
  config.shift_examples = 1000
  return config
