r"""ResNet-20 on CIFAR-10 (TFDS) as He et al. (CVPR 2016, section 4.2) trained it; the
recipe and its published accuracy: docs/results.md ("Training recipes").

  python experiments/reproduce.py --config=cifar10 --workdir=gs://bucket/cifar10
"""

from top1_jax.configs import default


def get_config():
  """``default`` with He et al.'s ResNet-20 recipe, 32 samples, wider bins."""
  config = default.get_config()
  config.dataset = "cifar10"
  config.models = ("resnet",)
  config.train_dropout_rates = (0.0,)
  config.num_epochs = 164
  config.batch_size = 128
  config.optimizer = "sgd"
  config.momentum = 0.9
  config.learning_rate = 0.1
  config.lr_schedule = "step"
  config.lr_boundaries = (82, 123)
  config.lr_factor = 0.1
  config.weight_decay = 1e-4
  config.augment = ("crop", "flip")
  config.crop_padding = 4
  config.eval_every_epochs = 1
  config.dropout_rates = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
  config.num_samples = 32
  config.n_bins = (10, 20, 50, 100)
  return config
