r"""The main job: train, sample, sweep, and write the paper-style tables and figures.

  python experiments/reproduce.py                        # the default config, into runs/default
  python experiments/reproduce.py --config=quick         # under a minute, into runs/quick
  python experiments/reproduce.py --config=cifar10 --workdir=gs://bucket/c10
  python experiments/reproduce.py --config=my_config.py  # a config of your own, by path
  python experiments/reproduce.py --config=quick '--config.seeds=(0,1,2)' \
      --task_index=$SLURM_ARRAY_TASK_ID --num_tasks=3 --workdir=runs/seeds

Stages, each skipped when its outputs exist (so a killed run resumes): train each
(model, train dropout rate, seed), predict (the plain network, MC dropout at every
rate, the ensemble), evaluate (every score x bin count x Top-k over calibration/test
splits), then results.{json,csv,md}, figures/, timings.json and index.html. Every
setting is checked, against the others and the test split's size, before any work.
With --num_tasks each task runs its share of the training points; a final run without
--task_index (or experiments/evaluate.py) writes the tables.
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import config_flag, runner  # noqa: E402

with runner.requiring("reproduce"):  # a missing package: one line naming its extra
  from top1_jax.pipeline import reproduce

config_flag.define("default")


def main(argv):
  runner.no_arguments(argv)
  settings = config_flag.settings()
  reproduce.run(settings, runner.workdir(), runner.tasks(), runner.command())


if __name__ == "__main__":
  runner.run(main, default_workdir=lambda: f"runs/{config_flag.config_name()}")
