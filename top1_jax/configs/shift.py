r"""Calibration under dataset shift (Ovadia et al. 2019), after a training job in the same work dir.

  python experiments/shift.py --config=shift --workdir=runs/default           # Fashion-MNIST
  python experiments/shift.py --config=shift:cifar10 --workdir=runs/cifar10   # any config's

Sized for a 2-core CPU; scale up with --config.shift_examples and friends on a GPU.
"""

import importlib


def get_config(base: str | None = None):
  """The packaged training config ``base`` (default: ``default``) sized for the shift job."""
  config = importlib.import_module(f"top1_jax.configs.{base or 'default'}").get_config()
  config.dropout_rates = (0.05,)
  config.num_samples = 16
  config.topk = (1,)
  config.n_bins = (20,)
  config.shift_examples = 1000
  return config
