r"""Wide ResNets on CIFAR-10 (TFDS) as Zagoruyko & Komodakis (BMVC 2016) trained them; the
recipe and its published accuracy: docs/results.md ("Training recipes").

  python experiments/reproduce.py --config=cifar10_wrn --config.models=wrn28_10 \
      --config.half_precision=bfloat16 --workdir=gs://bucket/wrn28_10
"""

from top1_jax.configs import cifar10


def get_config():
  """``cifar10``'s job with WRN-16-4, dropout 0.3 and the WRN paper's schedule."""
  config = cifar10.get_config()
  config.models = ("wrn16_4",)
  config.train_dropout_rates = (0.3,)
  config.num_epochs = 200
  config.nesterov = True
  config.lr_boundaries = (60, 120, 160)
  config.lr_factor = 0.2
  config.weight_decay = 5e-4
  config.dropout_rates = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
  return config
