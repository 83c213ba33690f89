r"""ResNet-20 on CIFAR-10 (TFDS) as He et al. trained it, MC dropout and a deep ensemble.

The recipe of He, Zhang, Ren & Sun, "Deep Residual Learning for Image Recognition"
(CVPR 2016), section 4.2: ResNet-20 (``models.ResNet``), SGD with momentum 0.9 at a
learning rate of 0.1 for mini-batches of 128, divided by 10 at 32k and 48k
iterations and stopped at 64k (epochs 82, 123 and 164 of the 50,000 training
images: 390 steps an epoch), weight decay 1e-4 (coupled L2), random crops of the
image zero-padded by 4 pixels and horizontal flips. Published: 8.75 % test error,
about 91.3 % accuracy (their ResNet-20; this one has 1x1 projection shortcuts where
they used zero-padded identities, see ``models.ResNet``). Trained without dropout,
as He et al.; MC dropout samples it at ``dropout_rates``.

A GPU/TPU job (``--config.half_precision=bfloat16`` there):

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
