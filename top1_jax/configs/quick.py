"""A 30-second smoke test of the main job: an MLP, one epoch, slices of Fashion-MNIST."""

from top1_jax.configs import default


def get_config():
  """``default`` made small: one MLP epoch on 5,000 / 2,000 images, two dropout rates."""
  config = default.get_config()
  config.models = ("mlp",)
  config.num_epochs = 1
  config.ensemble_size = 2
  config.limit_train = 5000
  config.limit_test = 2000
  config.dropout_rates = (0.01, 0.2)
  config.num_samples = 8
  config.n_bins = (5, 10, 20)
  config.n_folds = 4
  return config
