r"""Evaluate given predictions files or arrays of any model (no training).

  python experiments/evaluate.py --config=evaluate_files --workdir=runs/resnet50 \
      --config.inputs=resnet50_val.npz                  # predictions files (or globs)
  python experiments/evaluate.py --config=evaluate_files --workdir=runs/resnet50 \
      --config.inputs=logits.npy --config.input_kind=logits --config.labels=labels.npy

The inputs: see ``default.py`` (``inputs``, ``input_kind``, ``labels``) and
``top1_jax.io.predictions`` ([N, K] logits or probabilities, or [S, N, K]
MC-dropout / ensemble samples, with [N] labels). Top-1 and Top-5 events, as for
ImageNet-sized label sets.
"""

from ml_collections import config_dict

from top1_jax.configs import default


def get_config():
  """``default`` with no dataset of its own and a wider sweep of bins and events."""
  config = default.get_config()
  # The files say where they come from; a user may name it (--config.dataset=...).
  config.dataset = config_dict.placeholder(str)
  config.inputs = config_dict.placeholder(str)  # required: unset is refused with an example
  config.topk = (1, 5)
  config.n_bins = (10, 20, 50, 100)
  return config
