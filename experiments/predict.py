r"""Writes predictions files from a trained work dir: plain model, MC dropout, ensemble.

  python -m experiments.predict --workdir=runs/fmnist \
      --dropout_rates=0.002,0.005,0.01,0.02,0.05,0.2 --num_samples=32

Outputs ``predictions/deterministic.npz`` (logits, S = 1),
``predictions/dropout_<rate>.npz`` (mean probabilities and the scores computed
on device, or all S samples with --keep_samples) and ``predictions/ensemble.npz``
(the M members' logits). MC dropout samples are drawn on all local devices
(chunked: --chunk_size), so [S, N, K] never has to fit in memory. A file that
exists and matches the flags is skipped.
"""

import pathlib
import time

import jax
from absl import flags

from experiments import common
from experiments import train as train_exp
from top1_jax import __version__, mc, models
from top1_jax.io import predictions as predictions_lib

DROPOUT_RATES = flags.DEFINE_list(
  "dropout_rates",
  ["0.002", "0.005", "0.01", "0.02", "0.05", "0.2"],
  "Test-time MC-dropout rates (empty: none).",
)
NUM_SAMPLES = flags.DEFINE_integer("num_samples", 32, "MC-dropout samples per example.")
CHUNK_SIZE = flags.DEFINE_integer(
  "chunk_size",
  None,
  "Examples per device step while sampling (default: mc.default_chunk_size, tuned per backend).",
)
KEEP_SAMPLES = flags.DEFINE_bool(
  "keep_samples", False, "Store all [S, N, K] MC-dropout logits (large for big datasets)."
)


def predictions_dir() -> pathlib.Path:
  return common.workdir() / "predictions"


def rate_name(rate: float) -> str:
  return f"dropout_{rate:g}"


def _meta(method: str, **extra) -> dict:
  return {
    "dataset": common.DATASET.value,
    "split": "test",
    "limit_test": common.LIMIT_TEST.value,
    "model": train_exp.MODEL.value,
    "method": method,
    "seed": common.SEED.value,
    "version": __version__,
    "training": train_exp.config(),
    **extra,
  }


def _is_current(path: pathlib.Path, meta: dict) -> bool:
  """The file exists, loads cleanly, and was made with the same settings."""
  if not path.exists():
    return False
  try:
    saved = predictions_lib.load_predictions(path).meta
  except ValueError as e:
    common.say(f"  {path.name} is unreadable ({e}); writing it again")
    return False
  return all(saved.get(k) == v for k, v in meta.items() if k != "version")


def _progress(label: str, every_seconds: float = 10.0):
  """A progress callback that prints at most every ``every_seconds`` and at the end."""
  start = time.perf_counter()
  last = start

  def callback(done: int, total: int) -> None:
    nonlocal last
    now = time.perf_counter()
    if done < total and now - last < every_seconds:
      return
    last = now
    rate = done / max(now - start, 1e-9)
    common.say(f"  {label}: {done:,}/{total:,} examples ({rate:,.0f} ex/s)")

  return callback


def check_settings() -> tuple[float, ...]:
  """Every prediction flag, before anything is loaded; returns the MC-dropout rates."""
  common.workdir()  # required
  rates = (
    common.parse_floats("dropout_rates", DROPOUT_RATES.value, 0.0, 1.0)
    if DROPOUT_RATES.value
    else ()
  )
  if NUM_SAMPLES.value < 2 and rates:
    raise common.ExperimentError(
      f"--num_samples: need >= 2 for MC dropout, got {NUM_SAMPLES.value}"
    )
  if CHUNK_SIZE.value is not None and CHUNK_SIZE.value < 1:
    raise common.ExperimentError(f"--chunk_size: expected an integer >= 1, got {CHUNK_SIZE.value}")
  return rates


def run_stage(test_split) -> list[pathlib.Path]:
  """Writes every predictions file that is missing; returns all of them."""
  rates = check_settings()
  x, labels, num_classes = test_split.images, test_split.labels, test_split.num_classes
  key = jax.random.fold_in(jax.random.key(common.SEED.value), 100)
  out = []
  base = None

  def base_state():
    nonlocal base
    if base is None:
      base = train_exp.restore("base", num_classes, x[:1])
    return base

  path = predictions_dir() / "deterministic.npz"
  meta = _meta("deterministic", num_samples=1, dropout_rate=0.0)
  if _is_current(path, meta):
    common.say(f"predict: {path.name} done already, skipping")
  else:
    state = base_state()
    result = mc.predict(
      models.make_apply_fn(state.model),
      state.variables,
      x,
      keep_samples=True,
      chunk_size=CHUNK_SIZE.value,
    )
    predictions_lib.save_predictions(
      path, predictions_lib.Predictions(labels=labels, logits=result.logits, meta=meta)
    )
    common.say(f"predict: wrote {path}")
  out.append(path)

  for index, rate in enumerate(rates):
    path = predictions_dir() / f"{rate_name(rate)}.npz"
    meta = _meta("mc_dropout", num_samples=NUM_SAMPLES.value, dropout_rate=rate)
    if _is_current(path, meta):
      common.say(f"predict: {path.name} done already, skipping")
      out.append(path)
      continue
    state = base_state()
    start = time.perf_counter()
    result = mc.predict(
      models.make_apply_fn(state.model),
      state.variables,
      x,
      key=jax.random.fold_in(key, index),
      num_samples=NUM_SAMPLES.value,
      rate=rate,
      chunk_size=CHUNK_SIZE.value,
      keep_samples=KEEP_SAMPLES.value,
      progress=_progress(f"MC dropout {rate:g} x{NUM_SAMPLES.value}"),
    )
    predictions = predictions_lib.Predictions(
      labels=labels,
      logits=result.logits if KEEP_SAMPLES.value else None,
      mean_probs=result.mean_probs,
      # Scores computed on device in log space: they keep the precision that a
      # float32 mean probability loses when it saturates at 1.
      scores=result.scores,
      meta=meta,
    )
    predictions_lib.save_predictions(path, predictions)
    common.say(f"predict: wrote {path} ({time.perf_counter() - start:.1f} s)")
    out.append(path)

  if train_exp.ENSEMBLE_SIZE.value >= 1:
    path = predictions_dir() / "ensemble.npz"
    meta = _meta("ensemble", ensemble_size=train_exp.ENSEMBLE_SIZE.value, dropout_rate=0.0)
    if _is_current(path, meta):
      common.say(f"predict: {path.name} done already, skipping")
    else:
      states = train_exp.restore("ensemble", num_classes, x[:1])
      result = mc.predict(
        models.make_apply_fn(states.model),
        states.variables,
        x,
        ensemble=True,
        keep_samples=True,
        chunk_size=CHUNK_SIZE.value,
        strategy=train_exp.ENSEMBLE_STRATEGY.value,
      )
      predictions_lib.save_predictions(
        path, predictions_lib.Predictions(labels=labels, logits=result.logits, meta=meta)
      )
      common.say(f"predict: wrote {path}")
    out.append(path)
  return out


def main(argv):
  del argv
  # The training flags name the checkpoints to restore: checked here too.
  train_exp.check_settings()
  check_settings()
  train_exp.check_data(("test",))
  test_split = train_exp.load_split("test")
  devices = jax.devices()
  count = f"{len(test_split.labels):,}"
  common.say(f"predict: {len(devices)} {devices[0].platform} device(s), {count} test images")
  run_stage(test_split)


if __name__ == "__main__":
  common.run(main)
