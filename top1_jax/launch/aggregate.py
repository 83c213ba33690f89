"""Merges runs of one sweep (one work dir per seed): metrics as mean ± std across runs.

  python -m top1_jax.launch.aggregate --workdir=runs/merged --workdirs='runs/seed*'

Each input work dir holds a finished ``top1_jax.launch.evaluate`` (results.csv and
results.json); runs must share the cross-validation (``n_folds``, ``scheme``).
Writes into --workdir: aggregate.csv (one tidy row per sweep point: the key
columns, seeds, num_runs, each metric's mean and std across runs), aggregate.md,
aggregate.json (inputs, their configs, the rows), when MC dropout was swept
figures/dropout_rate_top<k>.png, and index.html (all of them on one page).
"""

from absl import flags, logging

from top1_jax.io import files, results
from top1_jax.launch import common
from top1_jax.sweep import aggregate

WORKDIRS = flags.DEFINE_list(
  "workdirs", None, "Work dirs of the runs to merge, comma-separated; globs (runs/seed*) expand."
)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise common.ExperimentError(f"unexpected arguments: {' '.join(argv[1:])}")
  out = common.workdir()
  names = results.expand_workdirs(WORKDIRS.value or [], exclude=out)
  if not names:
    raise common.ExperimentError(
      f"--workdirs: {','.join(WORKDIRS.value or []) or '(empty)'} names no work dir"
    )
  runs, configs = [], []
  for name in names:
    rows, config = results.read_results(name)
    logging.info("read %d rows from %s", len(rows), name)
    runs.append(rows)
    configs.append(config)
  merged = aggregate.merge_runs(runs, names=names, configs=configs)
  logging.info("merged %d runs into %d rows", len(names), len(merged))
  text = aggregate.markdown(merged)
  inputs = {"inputs": names, "configs": dict(zip(names, configs, strict=True))}
  written = [
    files.write_csv(out / "aggregate.csv", merged),
    files.write_bytes(out / "aggregate.md", text.encode()),
    files.write_json(out / "aggregate.json", {**inputs, "rows": merged}),
  ]
  from top1_jax import plots  # matplotlib: 0.5 s of import that a refused run skips

  figures = plots.write_dropout_rate_figures(out, merged, {row["topk"] for row in merged})
  title = f"Merged runs ({len(names)}): metrics as mean ± std across runs"
  written += [*figures, plots.write_results_page(out, text, figures, config=inputs, title=title)]
  print(f"merged {len(names)} runs into {len(merged)} rows: {', '.join(map(str, written))}")


if __name__ == "__main__":
  common.run(main)
