r"""ResNet-20 on CIFAR-100 (TFDS): ``cifar10``'s recipe, Top-1 and Top-5 events.

python experiments/reproduce.py --config=cifar100 --workdir=gs://bucket/cifar100
"""

from top1_jax.configs import cifar10


def get_config():
  """``cifar10``'s job on CIFAR-100, with Top-5."""
  config = cifar10.get_config()
  config.dataset = "cifar100"
  config.topk = (1, 5)
  return config
