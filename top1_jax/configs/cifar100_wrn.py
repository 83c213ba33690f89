r"""Wide ResNets on CIFAR-100 (TFDS) as Zagoruyko & Komodakis trained them: Top-1 and Top-5.

``cifar10_wrn``'s recipe (Zagoruyko & Komodakis 2016: SGD with Nesterov momentum
0.9, learning rate 0.1 at batch 128 times 0.2 at epochs 60, 120 and 160 of 200,
weight decay 5e-4, crops of 4 pixels and flips, dropout 0.3 between the
convolutions) on CIFAR-100. Published test accuracy with dropout:
WRN-16-4 76.09 % (23.91 % error), WRN-28-10 81.15 % (18.85 % error).

  python experiments/reproduce.py --config=cifar100_wrn --config.models=wrn28_10 \
      --workdir=gs://bucket/cifar100_wrn28_10
"""

from top1_jax.configs import cifar10_wrn


def get_config():
  """``cifar10_wrn``'s job on CIFAR-100, with Top-5."""
  config = cifar10_wrn.get_config()
  config.dataset = "cifar100"
  config.topk = (1, 5)
  return config
