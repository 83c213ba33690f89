"""Merges runs of one sweep (one work dir per seed): metrics as mean ± std across runs.

  python experiments/aggregate.py --workdir=runs/merged --workdirs='runs/seed*'

Each work dir holds a finished evaluate stage; runs must share ``n_folds`` and ``scheme``.
"""

from absl import flags

from top1_jax.launch import runner
from top1_jax.pipeline import aggregation

WORKDIRS = flags.DEFINE_list(
  "workdirs", None, "Work dirs of the runs to merge, comma-separated; globs (runs/seed*) expand."
)


def main(argv: list[str]) -> None:
  runner.no_arguments(argv)
  print(aggregation.run(WORKDIRS.value, runner.workdir()))
