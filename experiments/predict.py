r"""Writes each training point's predictions files: plain network, MC dropout, ensemble.

  python experiments/predict.py --config=default --workdir=runs/default

One file per prediction job under ``predictions/<point>/``; a file that exists and
matches its job is skipped (``top1_jax.pipeline.prediction``).
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import config_flag, runner  # noqa: E402

with runner.requiring("predict"):  # a missing package: one line naming its extra
  from top1_jax.pipeline import prediction

config_flag.define("default")


def main(argv):
  runner.no_arguments(argv)
  prediction.run(config_flag.settings(), runner.workdir(), runner.tasks())


if __name__ == "__main__":
  runner.run(main)
