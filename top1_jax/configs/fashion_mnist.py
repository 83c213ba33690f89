r"""The main job, and every field of a config with its meaning.

A CNN, MC dropout at six rates and a deep ensemble on Fashion-MNIST; about five
minutes offline on a 2-core CPU (the Debian Fashion-MNIST package or TFDS).

  python -m top1_jax.launch.reproduce --config=top1_jax/configs/fashion_mnist.py
  python -m top1_jax.launch.reproduce --config=top1_jax/configs/fashion_mnist.py \
      '--config.dropout_rates=(0.05,)' '--config.seeds=(0,1,2)' --workdir=runs/seeds

The other configs start from this one. ``top1_jax/launch/settings.py`` checks every
field before any work.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.dataset = "fashion_mnist"  # fashion_mnist / mnist (IDX or TFDS), or any TFDS name
  c.data_dir = config_dict.placeholder(str)  # IDX files or a TFDS data dir
  c.limit_train = config_dict.placeholder(int)  # the first N training examples only
  c.limit_test = config_dict.placeholder(int)
  # Training: one base network (and ensemble) per (model, train dropout rate, seed).
  c.models = ("cnn",)  # mlp, cnn, resnet
  c.train_dropout_rates = (0.1,)
  c.seeds = (0,)  # initialisation, batches, dropout and the calibration/test splits
  c.epochs = 3
  c.batch_size = 128
  c.learning_rate = 1e-3
  c.ensemble_size = 5  # 0: no ensemble
  c.ensemble_strategy = "auto"  # auto (vmap on GPU/TPU, loop on CPU), vmap, loop
  # Prediction: the plain model, MC dropout at each rate, the ensemble.
  c.dropout_rates = (0.002, 0.005, 0.01, 0.02, 0.05, 0.2)
  c.num_samples = 32
  c.chunk_size = config_dict.placeholder(int)  # examples per device step (default: tuned)
  c.keep_samples = False  # store all [S, N, K] MC-dropout logits
  # Evaluation. Instead of training: predictions files (comma-separated, globs), or
  # .npy arrays of logits or probabilities with labels.
  c.predictions = ""
  c.logits = ""
  c.probs = ""
  c.labels = ""
  c.scores = ("all",)
  c.n_bins = (10, 20, 100)
  c.topk = (1, 2)
  c.estimators = ("bins",)  # bins (the paper), isotonic, kde
  c.n_folds = 10
  c.scheme = "halves"  # halves (the paper) or kfold
  c.figure_bins = 20  # at most a split's calibration examples (fewer if there are fewer)
  c.compare_bins = config_dict.placeholder(int)  # Table 1's bins: one of n_bins (20 if there)
  c.ece_bins = 15  # equal-width bins of the benchmark's confidence ECE
  c.selective_targets = (0.9, 0.95, 0.99)
  c.selective_delta = 0.05
  c.figures = True  # figures/ after the tables (False: tables only, faster)
  return c
