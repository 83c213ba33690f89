r"""ResNet-20 on CIFAR-100 (TFDS): Top-1 and Top-5 events, where binning helps most.

``cifar10``'s recipe (He et al. 2016: SGD momentum 0.9, learning rate 0.1 at batch
128 divided by 10 at epochs 82 and 123 of 164, weight decay 1e-4, crops of 4 pixels
and flips) on CIFAR-100. He et al. report CIFAR-10 only; ResNet-20 trained so on
CIFAR-100 is commonly reported near 68-69 % test accuracy (not a published number of
the paper: compare with ``cifar100_wrn`` for Zagoruyko & Komodakis's).

python experiments/reproduce.py --config=cifar100 --workdir=gs://bucket/cifar100
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
