r"""ResNet-20 on CIFAR-10 (TFDS) as He et al. (CVPR 2016, section 4.2) trained it.

SGD, momentum 0.9, rate 0.1 at batch 128 divided by 10 at epochs 82 and 123 of 164, weight
decay 1e-4, 4-pixel crops and flips, no dropout (MC dropout samples it). Published: 8.75 %
test error (their ResNet-20 has zero-padded identity shortcuts; ours 1x1 projections).

  python experiments/reproduce.py --config=cifar10 --workdir=gs://bucket/cifar10
"""

from top1_jax.configs import default


def get_config():
  """``default`` on CIFAR-10: He et al.'s ResNet-20 recipe, 32 samples, wider bins."""
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
