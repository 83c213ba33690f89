r"""ResNet-20 on CIFAR-10 (TFDS), MC dropout and a deep ensemble: a GPU/TPU job.

python -m top1_jax.launch.reproduce --config=cifar10 --workdir=gs://bucket/cifar10
"""

from top1_jax.configs import default


def get_config():
  """``default`` on CIFAR-10: a ResNet for 100 epochs, 32 samples, wider bins."""
  config = default.get_config()
  config.dataset = "cifar10"
  config.models = ("resnet",)
  config.num_epochs = 100
  config.batch_size = 128
  config.train_dropout_rates = (0.1,)
  config.dropout_rates = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
  config.num_samples = 32
  config.n_bins = (10, 20, 50, 100)
  return config
