r"""Calibration under dataset shift: calibrated on clean test examples, tested on them shifted.

  python experiments/shift.py --workdir=runs/default          # after the main job
  python experiments/shift.py --config=shift:cifar10           # the cifar10 job's networks
  python experiments/shift.py --config.shift_examples=10000 \
      '--config.dropout_rates=(0.01,0.05,0.2)' --config.num_samples=32   # on a GPU

Reuses the networks the main job trained in the same work dir (it trains them when
missing), predicts every shifted and out-of-distribution set, and evaluates every
method calibrated on the clean calibration part (``top1_jax.pipeline.dataset_shift``) into
``<workdir>/shift/``.
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import config_flag, runner  # noqa: E402

with runner.requiring("shift"):  # a missing package: one line naming its extra
  from top1_jax.pipeline import dataset_shift

config_flag.define("shift")


def main(argv):
  runner.no_arguments(argv)
  dataset_shift.run(config_flag.settings(), runner.workdir(), runner.tasks(), runner.command())


if __name__ == "__main__":
  runner.run(main, default_workdir=lambda: f"runs/{config_flag.config_argument() or 'default'}")
