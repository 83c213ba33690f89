r"""Evaluate given predictions files or arrays of any model (no training); Top-1 and Top-5.

  python experiments/evaluate.py --config=evaluate_files --workdir=runs/resnet50 \
      --config.inputs=resnet50_val.npz                  # predictions files (or globs)
  python experiments/evaluate.py --config=evaluate_files --workdir=runs/resnet50 \
      --config.inputs=logits.npy --config.input_kind=logits --config.labels=labels.npy
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
