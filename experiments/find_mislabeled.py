r"""Shows the wrong predictions in the most confident bins: mislabelled or ambiguous images.

  python experiments/find_mislabeled.py --workdir=runs/default --score=neg_log_pmax --top_bins=2

The paper's supplement (``top1_jax.evaluation.mislabeled``); its flags and files:
``top1_jax.launch.find_mislabeled``.
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import find_mislabeled, runner  # noqa: E402

if __name__ == "__main__":
  runner.run(find_mislabeled.main)
