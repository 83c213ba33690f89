r"""A Fashion-MNIST training recipe a 2-core CPU runs in minutes: momentum SGD, cosine, shifts.

The recipe machinery of the CIFAR configs on Fashion-MNIST: ``cnn_wide`` (the main
job's CNN with 64 and 128 channels and a 256-wide dense layer, where MC dropout acts;
stride-2 convolutions, no max-pool, whose backward pass is slow on CPU; trained
without dropout),
SGD with Nesterov momentum 0.9 at a learning rate of 0.05 for batches of 128, cosine
decay to 0 over 30 epochs, weight decay 5e-4 (coupled L2), random crops of the image
zero-padded by 1 pixel and horizontal flips on device, test accuracy every epoch in
the curves. The measured time and accuracy are in docs/results.md ("Training
recipes"). No ensemble by default (``--config.ensemble_size=5`` trains five more
networks, five times the time).

  python experiments/train.py --config=fashion_mnist_recipe --workdir=runs/fmnist_recipe
  python experiments/reproduce.py --config=fashion_mnist_recipe --workdir=runs/fmnist_recipe
"""

from top1_jax.configs import default


def get_config():
  """``default`` with the recipe: ``cnn_wide``, SGD + Nesterov, cosine, crops and flips."""
  config = default.get_config()
  config.models = ("cnn_wide",)
  config.train_dropout_rates = (0.0,)
  config.num_epochs = 30
  config.batch_size = 128
  config.optimizer = "sgd"
  config.momentum = 0.9
  config.nesterov = True
  config.learning_rate = 0.05
  config.lr_schedule = "cosine"
  config.weight_decay = 5e-4
  config.augment = ("crop", "flip")
  config.crop_padding = 1
  config.eval_every_epochs = 1
  config.ensemble_size = 0
  return config
