r"""Wide ResNets on CIFAR-100 (TFDS): ``cifar10_wrn``'s recipe, Top-1 and Top-5 events.

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
