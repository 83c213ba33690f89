r"""A Fashion-MNIST training recipe a 2-core CPU runs in minutes: momentum SGD, cosine, shifts.
Time and accuracy: docs/results.md ("Training recipes").

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
