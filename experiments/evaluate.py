r"""Sweeps scores x bin counts x Top-k events over predictions files; writes the results.

  python experiments/evaluate.py --config=default --workdir=runs/default
  python experiments/evaluate.py --config=evaluate_files --workdir=out \
      --config.inputs=a.npz,b.npz '--config.n_bins=(10,20,100)' '--config.topk=(1,5)'
  python experiments/evaluate.py --config=evaluate_files --workdir=out \
      --config.inputs=p.npy --config.input_kind=probs --config.labels=y.npy
  python experiments/evaluate.py --config=evaluate_files --workdir=out \
      --config.inputs=clean.npz '--config.shift_inputs=cifar10c/*.npz'   # under shift

The files are the config's training points' predictions, or ``inputs`` (predictions
files, or one array of ``input_kind`` with ``labels``); ``top1_jax.pipeline.sweep`` says
what is written. A rerun skips the sweep points that are done.
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import config_flag, runner  # noqa: E402

with runner.requiring("evaluate"):  # a missing package: one line naming its extra
  from top1_jax.pipeline import sweep

config_flag.define("default")


def main(argv):
  runner.no_arguments(argv)
  sweep.run(config_flag.settings(), runner.workdir(), runner.tasks(), runner.command())


if __name__ == "__main__":
  runner.run(main, cpu_device_per_core=True)
