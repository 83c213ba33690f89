r"""Shows the wrong predictions in the most confident bins: mislabelled or ambiguous images.

  python -m experiments.find_mislabeled --workdir=runs/fmnist
  python -m experiments.find_mislabeled --workdir=runs/fmnist \
      --predictions=runs/fmnist/predictions/ensemble.npz --score=neg_log_pmax --top_bins=2

The paper's supplement ("Finding mislabelled images"): bin a score of the test
examples into equal-count bins, take the bins with the highest P(correct) and
look at the examples in them that the model gets wrong. Writes, under
``<workdir>/mislabeled/``:

  mislabeled.csv   every such example, most confident first: index, given and
                   predicted label and class name, bin, bin probability, score
  mislabeled.png   the first --max_images of them, given vs predicted label and
                   the bin's probability
  mislabeled.json  the settings and the searched bins (count, correct, probability)

The images are the test split of the dataset named in the predictions file
(meta ``dataset``, first ``limit_test`` examples); its labels must equal the
file's labels, so a file of another dataset or example order is refused.
"""

import csv
import io
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import common
from top1_jax import binning, events, mislabeled, plots, scores
from top1_jax.io import datasets, files
from top1_jax.io import predictions as predictions_lib

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

COLUMNS = (
  "rank",
  "index",
  "given_label",
  "given_name",
  "predicted_label",
  "predicted_name",
  "bin",
  "bin_prob",
  "score",
)


def _predictions_path() -> pathlib.Path:
  if PREDICTIONS.value:
    path = pathlib.Path(PREDICTIONS.value).expanduser()
  else:
    path = common.workdir() / "predictions" / "deterministic.npz"
  if not path.is_file():
    hint = "" if PREDICTIONS.value else "; run experiments.predict first or pass --predictions"
    raise common.ExperimentError(f"--predictions: no such file: {path}{hint}")
  return path


def _score(
  predictions: predictions_lib.Predictions, name: str, k: int
) -> tuple[jax.Array, np.ndarray]:
  """The classifier's log-probabilities and the requested score (stored or computed)."""
  name = scores.for_event(name, k)
  log_probs, available = scores.from_predictions(
    logits=predictions.logits,
    mean_probs=predictions.mean_probs,
    stored_scores=predictions.scores,
    human_probs=predictions.human_probs,
    topk=(k,),
  )
  if name not in available:
    known = scores.lookup(name)
    needs = {
      "samples": " (needs MC-dropout or ensemble logits)",
      "human_probs": " (needs human labels)",
    }
    needs = needs.get(known.inputs, "") if known else ""
    raise common.ExperimentError(
      f"--score: {name!r} is not available for this file{needs}; available: "
      + ", ".join(sorted(available))
    )
  return log_probs, np.asarray(available[name], np.float32)


def _images(path: pathlib.Path, predictions: predictions_lib.Predictions) -> datasets.DatasetSplit:
  """The images the predictions were made on, checked label for label."""
  meta = predictions.meta
  dataset = meta.get("dataset")
  if flags.FLAGS["dataset"].present:
    if dataset is not None and dataset != common.DATASET.value:
      raise common.ExperimentError(
        f"--dataset: {path.name} is of dataset {dataset!r}, not {common.DATASET.value!r}"
      )
    dataset = common.DATASET.value
  if not dataset:
    raise common.ExperimentError(
      f"--dataset: {path.name} names no dataset in its meta; pass --dataset (and --data_dir)"
    )
  split = meta.get("split") or "test"
  limit = meta.get("limit_test") or predictions.num_examples
  # An explicit --data_dir is the only place read: the system copy never stands in for it.
  images = datasets.load_dataset(dataset, split, data_dir=_data_dir(), limit=limit, fallback=False)
  labels = np.asarray(images.labels)
  if labels.shape != predictions.labels.shape:
    problem = f"{predictions.num_examples} predictions vs {labels.shape[0]} images"
  elif images.num_classes != predictions.num_classes:
    problem = f"{predictions.num_classes} classes vs {images.num_classes}"
  else:
    differ = np.flatnonzero(labels != predictions.labels)
    if not differ.size:
      return images
    problem = f"labels differ at {differ.size} examples, the first at index {differ[0]}"
  raise common.ExperimentError(
    f"--predictions: {path.name} does not match the {dataset} {split} split ({problem}): "
    "the file is of another dataset or example order"
  )


def _write_csv(path: pathlib.Path, rows: list[dict]) -> None:
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
  writer.writeheader()
  writer.writerows(rows)
  common.atomic_write_bytes(path, buffer.getvalue().encode())


def _data_dir() -> str | None:
  data_dir = common.DATA_DIR.value or None
  return os.path.expanduser(data_dir) if data_dir and files.is_local(data_dir) else data_dir


def check_settings() -> pathlib.Path:
  """Every flag that needs no file read, before any work; returns the predictions file."""
  for flag in (N_BINS, TOP_BINS, MAX_IMAGES, TOPK):
    if flag.value < 1:
      raise common.ExperimentError(f"--{flag.name}: expected an integer >= 1, got {flag.value}")
  if TOP_BINS.value > N_BINS.value:
    raise common.ExperimentError(
      f"--top_bins: expected at most --n_bins={N_BINS.value}, got {TOP_BINS.value}"
    )
  data_dir = _data_dir()
  if data_dir and files.is_local(data_dir) and not os.path.isdir(data_dir):
    raise common.ExperimentError(f"--data_dir: no such directory: {common.DATA_DIR.value}")
  return _predictions_path()


def run_stage() -> dict:
  """Finds the confident errors and writes the CSV, JSON and figure; returns the summary."""
  out_dir = common.workdir() / "mislabeled"
  path = check_settings()
  predictions = predictions_lib.load_predictions(path)
  num, num_classes = predictions.num_examples, predictions.num_classes
  if not 1 <= TOPK.value <= num_classes:
    raise common.ExperimentError(
      f"--topk: expected 1 <= k <= {num_classes} (the classes of {path.name}), got {TOPK.value}"
    )
  if N_BINS.value > num:
    raise common.ExperimentError(
      f"--n_bins: {N_BINS.value} bins need at least that many examples; {path.name} has {num}"
    )
  log_probs, u = _score(predictions, SCORE.value, TOPK.value)
  correct = np.asarray(events.topk_correct(log_probs, predictions.labels, k=TOPK.value))
  images = _images(path, predictions)
  common.say(
    f"find_mislabeled: {path.name} ({images.name} {images.split}, {num:,} examples, "
    f"Top-{TOPK.value} accuracy {correct.mean():.1%}), {SCORE.value} in {N_BINS.value} bins"
  )

  found = mislabeled.confident_errors(u, correct, n_bins=N_BINS.value, top_bins=TOP_BINS.value)
  predicted = np.asarray(jnp.argmax(log_probs, axis=-1))
  given = predictions.labels
  names = images.class_names
  rows = [
    {
      "rank": rank,
      "index": int(i),
      "given_label": int(given[i]),
      "given_name": names[given[i]],
      "predicted_label": int(predicted[i]),
      "predicted_name": names[predicted[i]],
      "bin": int(b),
      "bin_prob": f"{p:.6f}",
      "score": f"{u[i]:.9g}",
    }
    for rank, (i, b, p) in enumerate(zip(found.index, found.bin, found.prob, strict=True), 1)
  ]
  csv_path = out_dir / "mislabeled.csv"
  _write_csv(csv_path, rows)

  bins = found.bins
  searched = []
  for b in found.selected_bins.tolist():
    in_bin = u[np.asarray(binning.assign(bins.edges, u)) == b]
    searched.append(
      {
        "bin": b,
        "count": int(bins.counts[b]),
        "correct": int(bins.hits[b]),
        "prob": float(bins.prob[b]),
        "score_min": float(in_bin.min()),
        "score_max": float(in_bin.max()),
      }
    )
    common.say(
      f"  bin {b}: {SCORE.value} in [{in_bin.min():.6g}, {in_bin.max():.6g}], "
      f"{int(bins.counts[b])} examples, {int(bins.hits[b])} correct, "
      f"P(correct) {float(bins.prob[b]):.4f}"
    )
  summary = {
    "predictions": str(path),
    "dataset": images.name,
    "split": images.split,
    "score": SCORE.value,
    "topk": TOPK.value,
    "n_bins": N_BINS.value,
    "top_bins": TOP_BINS.value,
    "num_examples": num,
    "accuracy": float(correct.mean()),
    "direction": "higher is more confident"
    if found.direction > 0
    else ("lower is more confident" if found.direction < 0 else "no trend"),
    "searched_bins": searched,
    "num_found": len(rows),
  }
  common.write_json(out_dir / "mislabeled.json", summary)

  png_path = out_dir / "mislabeled.png"
  if not rows:
    png_path.unlink(missing_ok=True)  # a stale figure would show another run's examples
    common.say(
      f"find_mislabeled: no wrong predictions in the top {TOP_BINS.value} bin(s); "
      f"try --top_bins={min(TOP_BINS.value + 1, N_BINS.value)}. Wrote {csv_path}"
    )
    return summary
  shown = found.index[: MAX_IMAGES.value]
  fig = plots.image_grid(
    images.images[shown],
    given[shown],
    predicted[shown],
    found.prob[: MAX_IMAGES.value],
    names,
    title=f"{path.stem}: wrong in the top {TOP_BINS.value} of {N_BINS.value} {SCORE.value} bins"
    f" ({len(shown)} of {len(rows)}; p = the bin's P(correct))",
  )
  plots.save_figure(fig, png_path)
  for row in rows[:5]:
    common.say(
      f"  #{row['index']}: given {row['given_name']}, predicted {row['predicted_name']}, "
      f"p={float(row['bin_prob']):.4f}, {SCORE.value}={row['score']}"
    )
  common.say(
    f"find_mislabeled: {len(rows)} confident error(s); wrote {csv_path} and {png_path} "
    f"({len(shown)} image(s))"
  )
  return summary


def main(argv):
  del argv
  run_stage()


if __name__ == "__main__":
  common.run(main)
