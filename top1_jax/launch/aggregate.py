"""Merges runs of one sweep (one work dir per seed): metrics as mean ± std across runs.

  python -m top1_jax.launch.aggregate --workdir=runs/merged --workdirs='runs/seed*'

Each input work dir holds a finished ``top1_jax.launch.evaluate`` (results.csv and
results.json); runs must share the cross-validation (``n_folds``, ``scheme``).
Writes into --workdir: aggregate.csv (one tidy row per sweep point: the key
columns, seeds, num_runs, each metric's mean and std across runs),
aggregate_comparison.csv and aggregate_selective.csv (Table 1 and the
selective-prediction rows, the same way, where the runs hold them), aggregate.md
(all the tables), aggregate.json (inputs, their configs, the rows of all three),
when MC dropout was swept figures/dropout_rate_top<k>.png, and index.html (all
of them on one page). A work dir of a seed sweep holds one run per seed.
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
  runs, configs, tables = [], [], []
  for name in names:
    rows, config = results.read_results(name)
    logging.info("read %d rows from %s", len(rows), name)
    runs.append(rows)
    configs.append(config)
    tables.append(results.read_tables(name))  # Table 1 and the selective rows
  merged = aggregate.merge_runs(runs, names=names, configs=configs)
  tables = aggregate.merge_tables(runs, tables, names=names)
  what = aggregate.describe_runs(runs)  # a work dir of a seed sweep holds several runs
  logging.info("merged %s into %d rows", what, len(merged))
  text = aggregate.markdown(merged, **tables)
  inputs = {"inputs": names, "num_runs": aggregate.count_runs(runs)}
  inputs["configs"] = dict(zip(names, configs, strict=True))
  written = [
    files.write_csv(out / "aggregate.csv", merged),
    *(files.write_csv(out / f"aggregate_{k}.csv", v) for k, v in tables.items() if v),
    files.write_bytes(out / "aggregate.md", text.encode()),
    files.write_json(out / "aggregate.json", {**inputs, "rows": merged, **tables}),
  ]
  from top1_jax import plots  # matplotlib: 0.5 s of import that a refused run skips

  figures = plots.write_dropout_rate_figures(out, merged, {row["topk"] for row in merged})
  title = f"Merged runs ({what}): metrics as mean ± std across runs"
  written += [*figures, plots.write_results_page(out, text, figures, config=inputs, title=title)]
  print(f"merged {what} into {len(merged)} rows: {', '.join(map(str, written))}")


if __name__ == "__main__":
  common.run(main)
