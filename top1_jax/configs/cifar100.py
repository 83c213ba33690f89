r"""ResNet-20 on CIFAR-100 (TFDS): Top-1 and Top-5 events, where binning helps most.

python -m top1_jax.launch.reproduce --config=cifar100 --workdir=gs://bucket/cifar100
"""

from top1_jax.configs import cifar10


def get_config():
  """``cifar10``'s job on CIFAR-100, with Top-5.

  It starts from ``cifar10`` (itself ``default`` overridden), so the ResNet's training
  settings are written once.
  """
  config = cifar10.get_config()
  config.dataset = "cifar100"
  config.topk = (1, 5)
  return config
