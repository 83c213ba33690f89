r"""Trains each (model, train dropout rate, seed) of the config: a base network and a deep ensemble.

  python experiments/train.py --config=default --workdir=runs/default

Data-parallel over all processes' devices; checkpoints after every epoch, so a killed run
resumes; a finished stage is skipped, and a larger num_epochs trains on from the last
checkpoint (``top1_jax.pipeline.training``).
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import config_flag, runner  # noqa: E402

with runner.requiring("train"):  # a missing package: one line naming its extra
  from top1_jax.pipeline import training

config_flag.define("default")


def main(argv):
  runner.no_arguments(argv)
  training.run(config_flag.settings(), runner.workdir(), runner.tasks())


if __name__ == "__main__":
  runner.run(main)
