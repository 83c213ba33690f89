r"""Shows the wrong predictions in the most confident bins: mislabelled or ambiguous images.

  python experiments/find_mislabeled.py --workdir=runs/default --score=neg_log_pmax --top_bins=2

Writes ``<workdir>/mislabeled/``: mislabeled.csv (the wrong examples of the --top_bins most
confident bins), mislabeled.png (given vs predicted label) and mislabeled.json.
"""

import os
import pathlib

from absl import flags, logging

from top1_jax.core import scores
from top1_jax.core.validation import SettingError
from top1_jax.evaluation import mislabeled
from top1_jax.io import files, mislabeled_report
from top1_jax.launch import runner

PREDICTIONS = flags.DEFINE_string(
  "predictions", None, "Predictions file (.npz); default: <workdir>/predictions/deterministic.npz."
)
SCORE = flags.DEFINE_string(
  "score",
  "pmax",
  "Score to bin: " + ", ".join(scores.REGISTRY) + " or a stored score_<name>; "
  "confidences and uncertainties both work (the direction is read from the bins).",
)
N_BINS = flags.DEFINE_integer("n_bins", 20, "Equal-count bins of the score.")
TOP_BINS = flags.DEFINE_integer("top_bins", 1, "How many of the most confident bins to search.")
MAX_IMAGES = flags.DEFINE_integer("max_images", 64, "Images in the figure (the CSV lists all).")
TOPK = flags.DEFINE_integer("topk", 1, "Event: the Top-k prediction is correct.")
DATASET = flags.DEFINE_string("dataset", None, "The images' dataset, if the file names none.")
DATA_DIR = flags.DEFINE_string("data_dir", None, "IDX files or a TFDS data dir of the images.")


def _predictions_path() -> pathlib.Path:
  if PREDICTIONS.value:
    path = pathlib.Path(PREDICTIONS.value).expanduser()
  else:  # the sweep's first plain model
    asked = (files.read_json(runner.workdir() / "manifest.json") or {}).get("files", [])
    name = next((n for n in asked if n.endswith("deterministic")), "deterministic")
    path = runner.workdir() / "predictions" / f"{name}.npz"
  if not path.is_file():
    hint = "" if PREDICTIONS.value else "; run top1_jax.launch.predict first or pass --predictions"
    raise runner.ExperimentError(f"--predictions: no such file: {path}{hint}")
  return path


def check_settings() -> tuple[pathlib.Path, str | None]:
  """Every flag that needs no file read, before any work: (predictions file, data dir)."""
  for flag in (N_BINS, TOP_BINS, MAX_IMAGES, TOPK):
    if flag.value < 1:
      raise runner.ExperimentError(f"--{flag.name}: expected an integer >= 1, got {flag.value}")
  if TOP_BINS.value > N_BINS.value:
    raise runner.ExperimentError(
      f"--top_bins: expected at most --n_bins={N_BINS.value}, got {TOP_BINS.value}"
    )
  data_dir = DATA_DIR.value or None
  if data_dir and files.is_local(data_dir):
    data_dir = os.path.expanduser(data_dir)
    if not os.path.isdir(data_dir):
      raise runner.ExperimentError(f"--data_dir: no such directory: {DATA_DIR.value}")
  return _predictions_path(), data_dir


def main(argv) -> None:
  """Finds the confident errors and writes the CSV, JSON and figure."""
  runner.no_arguments(argv)
  (path, data_dir), out_dir = check_settings(), runner.workdir() / "mislabeled"
  score, k, n_bins, top = SCORE.value, TOPK.value, N_BINS.value, TOP_BINS.value
  try:
    inputs = mislabeled_report.load_inputs(
      path, score=score, topk=k, n_bins=n_bins, dataset=DATASET.value, data_dir=data_dir
    )
  except SettingError as e:  # the library names the setting: here a flag
    raise runner.ExperimentError(f"--{e}") from None
  images, given, predicted = inputs.images, inputs.predictions.labels, inputs.predicted
  logging.info(
    f"find_mislabeled: {path.name} ({images.name} {images.split}, {len(given):,} examples, "
    f"Top-{k} accuracy {inputs.correct.mean():.1%}), {score} in {n_bins} bins"
  )
  found = mislabeled.report(
    inputs.u, inputs.correct, predicted, given, images.class_names, n_bins=n_bins, top_bins=top
  )
  for b in found.searched_bins:
    logging.info(
      f"  bin {b['bin']}: {score} in [{b['score_min']:.6g}, {b['score_max']:.6g}], "
      f"{b['count']} examples, {b['correct']} correct, P(correct) {b['prob']:.4f}"
    )
  summary = dict(predictions=str(path), dataset=images.name, split=images.split, score=score)
  summary.update(topk=k, n_bins=n_bins, top_bins=top, **found.summary())
  csv_path, _ = mislabeled_report.write_report(out_dir, found, summary)
  png_path, rows = out_dir / "mislabeled.png", found.rows
  if not rows:
    png_path.unlink(missing_ok=True)  # a stale figure would show another run's examples
    logging.info(
      f"find_mislabeled: no wrong predictions in the top {top} bin(s); "
      f"try --top_bins={min(top + 1, n_bins)}. Wrote {csv_path}"
    )
    return
  shown, probs = found.errors.index[: MAX_IMAGES.value], found.errors.prob[: MAX_IMAGES.value]
  title = f"{path.stem}: wrong in the top {top} of {n_bins} {score} bins"
  title += f" ({len(shown)} of {len(rows)}; p = the bin's P(correct))"
  tiles = images.images[shown], given[shown], predicted[shown], probs, images.class_names
  from top1_jax import plots  # matplotlib: 0.5 s of import that refused runs skip

  plots.save_figure(plots.image_grid(*tiles, title=title), png_path)
  for row in rows[:5]:
    logging.info(
      f"  #{row['index']}: given {row['given_name']}, predicted {row['predicted_name']}, "
      f"p={float(row['bin_prob']):.4f}, {score}={row['score']}"
    )
  logging.info(
    f"find_mislabeled: {len(rows)} confident error(s); wrote {csv_path} and {png_path} "
    f"({len(shown)} image(s))"
  )
