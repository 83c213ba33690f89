r"""Wide ResNets on CIFAR-10 (TFDS) as Zagoruyko & Komodakis trained them, with dropout.

The recipe of Zagoruyko & Komodakis, "Wide Residual Networks" (BMVC 2016),
sections 3-4: SGD with Nesterov momentum 0.9, learning rate 0.1 at mini-batches
of 128, multiplied by 0.2 at epochs 60, 120 and 160 of 200, weight decay 5e-4
(coupled L2), random crops of the image zero-padded by 4 pixels and horizontal
flips, dropout 0.3 between the two convolutions of every block
(``models.WideResNet``: the place MC dropout samples). Published test accuracy
with dropout: WRN-16-4 94.76 % (5.24 % error), WRN-28-10 96.11 %
(3.89 % error). The network is chosen by ``models``:

  python experiments/reproduce.py --config=cifar10_wrn --workdir=gs://bucket/wrn16_4
  python experiments/reproduce.py --config=cifar10_wrn --config.models=wrn28_10 \
      --config.half_precision=bfloat16 --workdir=gs://bucket/wrn28_10
"""

from top1_jax.configs import cifar10


def get_config():
  """``cifar10``'s job with WRN-16-4 trained with dropout 0.3 (sampled at up to 0.3), Nesterov
  momentum, 200 epochs and the WRN paper's rate drops and weight decay."""
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
