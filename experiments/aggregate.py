r"""Merges runs of one sweep (one work dir per seed): metrics as mean ± std across runs.

  python experiments/aggregate.py --workdir=runs/merged --workdirs='runs/seed*'

Writes aggregate.{csv,md,json}, Table 1's and the selective rows' merges, the dropout-rate
figures and index.html into --workdir (``top1_jax.pipeline.aggregation``).
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import aggregate, runner  # noqa: E402

if __name__ == "__main__":
  runner.run(aggregate.main)
