r"""The main job, and every field of a config with its meaning.

A CNN, MC dropout at six rates and a deep ensemble on Fashion-MNIST; about five
minutes offline on a 2-core CPU (the Debian Fashion-MNIST package or TFDS).

  python -m top1_jax.launch.reproduce --config=default            # into runs/default
  python -m top1_jax.launch.reproduce --config=default \
      '--config.dropout_rates=(0.05,)' '--config.seeds=(0,1,2)' --workdir=runs/seeds

The other configs (``quick``, ``cifar10``, ``cifar100``, ``evaluate_files``)
import this one and override a few fields, as the Flax examples do.
``top1_jax.sweep.plan.check`` checks every field before any work.

Seeds: ``seeds`` is a tuple, not big_vision's single ``seed``, because a seed is a
sweep axis here like ``models`` and ``train_dropout_rates``: one config names the
whole sweep, each (model, train dropout rate, seed) is one training point with its
own files, a job array splits the points between tasks, and ``aggregate`` averages
over them. One seed is ``(0,)``. A seed draws the initialisation, the batches, the
dropout masks and the calibration/test splits; a user's files (``inputs``) take
the first seed for their splits.

Inputs: evaluating files instead of training is one field, ``inputs``
(comma-separated paths or globs), read as ``input_kind`` says:

* ``predictions`` (the default): ``.npz`` predictions files
  (``top1_jax.io.predictions``), each holding its labels;
* ``logits`` or ``probs``: one ``.npy`` array, [N, K] or [S, N, K] (samples of
  MC dropout or an ensemble), with ``labels``, a ``.npy`` of [N] integer labels.

A contradictory combination (``labels`` with predictions files, a ``.npy`` read
as predictions files, an array kind without ``labels``...) is refused in one line
naming the field. ``reproduce`` refuses ``inputs``: it evaluates what it trains.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  """The main job's config: Fashion-MNIST, every field set."""
  config = ml_collections.ConfigDict()
  # What the images are: fashion_mnist / mnist (IDX or TFDS), or any TFDS name; None
  # when only given inputs are evaluated (the results then name no dataset).
  config.dataset = "fashion_mnist"
  config.data_dir = config_dict.placeholder(str)  # IDX files or a TFDS data dir
  config.limit_train = config_dict.placeholder(int)  # the first N training examples only
  config.limit_test = config_dict.placeholder(int)
  # Training: one base network (and ensemble) per (model, train dropout rate, seed).
  config.models = ("cnn",)  # mlp, cnn, resnet
  config.train_dropout_rates = (0.1,)
  config.seeds = (0,)  # a sweep axis (module docstring): init, batches, dropout, splits
  config.num_epochs = 3
  config.batch_size = 128
  config.learning_rate = 1e-3
  config.ensemble_size = 5  # 0: no ensemble
  config.ensemble_strategy = "auto"  # auto (vmap on GPU/TPU, loop on CPU), vmap, loop
  # Prediction: the plain model, MC dropout at each rate, the ensemble.
  config.dropout_rates = (0.002, 0.005, 0.01, 0.02, 0.05, 0.2)
  config.num_samples = 32
  config.chunk_size = config_dict.placeholder(int)  # examples per device step (default: tuned)
  config.keep_samples = False  # store all [S, N, K] MC-dropout logits
  # Evaluation of given files instead of training (module docstring): paths or globs,
  # comma-separated; what they hold (predictions, logits, probs); the arrays' labels.
  config.inputs = ""
  config.input_kind = "predictions"
  config.labels = ""
  # The sweep: every score x Top-k event x estimator, over all bin counts.
  config.scores = ("all",)
  config.n_bins = (10, 20, 100)
  config.topk = (1, 2)
  config.estimators = ("bins",)  # bins (the paper), isotonic, kde
  config.n_folds = 10
  config.scheme = "halves"  # halves (the paper) or kfold
  config.figure_bins = 20  # at most a split's calibration examples (fewer if there are fewer)
  config.compare_bins = config_dict.placeholder(int)  # Table 1's bins: one of n_bins (20 if there)
  config.ece_bins = 15  # equal-width bins of the benchmark's confidence ECE
  config.selective_targets = (0.9, 0.95, 0.99)
  config.selective_delta = 0.05
  config.figures = True  # figures/ after the tables (False: tables only, faster)
  return config
