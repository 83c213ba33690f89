r"""The main job: train, sample, sweep, and write the paper-style tables and figures.

  python -m experiments.reproduce                      # offline Fashion-MNIST, 2-core CPU
  python -m experiments.reproduce --quick              # a small slice, under a minute
  python -m experiments.reproduce --dataset=cifar10 --model=resnet --epochs=100 \
      --batch_size=128 --workdir=runs/cifar10          # on a GPU/TPU

Stages, each skipped when its outputs exist (so a killed run resumes):
  1. train a base network and a deep ensemble        (experiments.train)
  2. predict: the plain model, MC dropout at every --dropout_rates, the ensemble
                                                       (experiments.predict)
  3. sweep every score x --n_bins x --topk with --n_folds calibration/test splits,
     then write results.{json,csv,md} and figures/     (experiments.evaluate)

Every flag of those three experiments applies here too (see --helpfull), and all
of them are checked, against each other and the test split's size, before stage 1.
"""

import sys
import time

from absl import flags

from experiments import common
from experiments import evaluate as evaluate_exp
from experiments import predict as predict_exp
from experiments import train as train_exp
from top1_jax import scores

QUICK = flags.DEFINE_bool(
  "quick", False, "Small preset for smoke tests: an MLP, 1 epoch, slices of the data."
)

PRESETS = {
  "full": {
    "workdir": "runs/{dataset}",
  },
  "quick": {
    "workdir": "runs/{dataset}_quick",
    "model": "mlp",
    "epochs": 1,
    "ensemble_size": 2,
    "limit_train": 5000,
    "limit_test": 2000,
    "dropout_rates": ["0.01", "0.2"],
    "num_samples": 8,
    "n_bins": ["5", "10", "20"],
    "n_folds": 4,
  },
}
"""Flag values for each preset; a flag given on the command line always wins."""


def apply_preset(name: str) -> None:
  for flag, value in PRESETS[name].items():
    if not flags.FLAGS[flag].present:
      if isinstance(value, str):
        value = value.format(dataset=common.DATASET.value)
      flags.FLAGS[flag].value = value


# evaluate's inputs: reproduce evaluates the predictions it writes, nothing else.
EVALUATE_INPUTS = ("predictions", "logits", "probs", "labels")


def _check_scores(rates: tuple[float, ...]) -> None:
  """--scores against what the predict stage will write (the files are not there yet)."""
  if evaluate_exp.SCORES.value == ["all"]:
    return
  unknown = [n for n in evaluate_exp.SCORES.value if scores.lookup(n) is None]
  if unknown:
    raise common.ExperimentError(
      f"--scores: unknown score(s) {', '.join(unknown)}; known: {', '.join(scores.REGISTRY)}"
    )
  has_samples = bool(rates) or train_exp.ENSEMBLE_SIZE.value >= 2
  for name in evaluate_exp.SCORES.value:
    needs = scores.lookup(name).inputs
    if needs == "human_probs":
      raise common.ExperimentError(
        f"--scores: {name} needs human label frequencies, which the predictions of "
        "reproduce do not have"
      )
    if needs == "samples" and not has_samples:
      raise common.ExperimentError(
        f"--scores: {name} needs MC-dropout samples or an ensemble of 2 or more, but "
        f"--dropout_rates is empty and --ensemble_size={train_exp.ENSEMBLE_SIZE.value}"
      )


def _check_test_split(checked: evaluate_exp.Settings, num_examples: int, num_classes: int) -> None:
  """The evaluate settings against the test split that predict and evaluate will use."""
  limit = common.LIMIT_TEST.value
  what = f" test examples (--limit_test={limit})" if limit == num_examples else " test examples"
  evaluate_exp.check_examples(checked, num_examples, what)
  evaluate_exp.check_classes(checked, num_classes, common.DATASET.value)


def check_settings() -> evaluate_exp.Settings:
  """Every stage's settings and how they fit together, before anything is written.

  Reads no data: the test split's size and classes come from the IDX headers.
  For TFDS they are known only once loaded, and ``main`` checks them then,
  still before training.
  """
  for name in EVALUATE_INPUTS:
    if flags.FLAGS[name].value:
      raise common.ExperimentError(
        f"--{name}: reproduce evaluates the predictions it writes; for other files run "
        "experiments.evaluate"
      )
  train_exp.check_settings()
  rates = predict_exp.check_settings()
  checked = evaluate_exp.check_settings()
  _check_scores(rates)
  test = train_exp.check_data()["test"]
  if test.num_examples is not None:
    _check_test_split(checked, test.num_examples, test.num_classes)
  return checked


def main(argv):
  del argv
  apply_preset("quick" if QUICK.value else "full")
  checked = check_settings()
  timings = {}
  start = tic = time.perf_counter()
  # The data is loaded and checked before anything is written: a refused run leaves
  # the work dir as it was.
  train_split, test_split = train_exp.load_data()
  _check_test_split(checked, len(test_split.labels), test_split.num_classes)
  timings["data"] = time.perf_counter() - tic
  workdir = common.workdir()
  workdir.mkdir(parents=True, exist_ok=True)
  command = " ".join(["python -m experiments.reproduce", *sys.argv[1:]])
  config = {
    "command": command,
    "flags": {
      flag.name: flag.value
      for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
      if "experiments" in module
      for flag in module_flags
    },
    "versions": common.versions(),
  }
  common.write_json(workdir / "config.json", config)
  common.say(f"reproduce: work dir {workdir} ({'quick' if QUICK.value else 'full'} preset)")
  common.say(
    f"data: {common.DATASET.value}: {len(train_split.labels):,} train / "
    f"{len(test_split.labels):,} test images {train_split.images.shape[1:]} "
    f"from {train_split.source}"
  )
  tic = time.perf_counter()
  for stage in train_exp.STAGES:
    train_exp.run_stage(stage, train_split, test_split)
  timings["train"] = time.perf_counter() - tic

  tic = time.perf_counter()
  predict_exp.run_stage(test_split)
  timings["predict"] = time.perf_counter() - tic

  tic = time.perf_counter()
  evaluate_exp.run_stage(checked)
  timings["evaluate"] = time.perf_counter() - tic

  timings["total"] = time.perf_counter() - start
  common.write_json(workdir / "timings.json", timings)
  common.say(
    "reproduce: done in "
    + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    + f"; tables in {workdir / 'results.md'}, figures in {workdir / 'figures'}"
  )


if __name__ == "__main__":
  common.run(main)
