r"""The main job, and every field of a config with its meaning (``HELP``).

A CNN, MC dropout at six rates and a deep ensemble on Fashion-MNIST. The other configs
import this one and override a few fields.

  python experiments/reproduce.py --config=default            # into runs/default
  python experiments/reproduce.py --config=default \
      '--config.dropout_rates=(0.05,)' '--config.seeds=(0,1,2)' --workdir=runs/seeds
"""

import ml_collections
from ml_collections import config_dict

HELP = {
  # The data (train, predict and reproduce read it; evaluate reads files).
  "dataset": "What the images are: fashion_mnist or mnist (IDX files or TFDS), or any TFDS "
  "name; with inputs, the files' dataset, recorded in the results (empty: not given)",
  "data_dir": "Directory of the IDX files or a TFDS data dir; unset: the system copy, then TFDS's",
  "limit_train": "Train on the first N training examples only; unset: all",
  "limit_test": "Predict the first N test examples only; unset: all",
  # Training: one base network (and ensemble) per (model, train dropout rate, seed).
  "models": "Networks to train: mlp, cnn, resnet",
  "train_dropout_rates": "Dropout rates to train each network with",
  "seeds": "Seeds, a sweep axis: each draws the initialisation, batches, dropout masks and "
  "splits; given inputs take the first for their splits",
  "num_epochs": "Training epochs",
  "batch_size": "Training examples per step",
  "learning_rate": "The optimizer's learning rate (the peak of a schedule)",
  "ensemble_size": "Members of the deep ensemble (0: no ensemble)",
  "ensemble_strategy": "How the members train: auto (vmap on GPU/TPU, a loop on CPU), vmap or loop",
  # The training recipe (top1_jax.engine.optimizers, augment).
  "optimizer": "adam, or sgd (with momentum and nesterov)",
  "momentum": "SGD's momentum, in [0, 1) (0: plain SGD; Adam ignores it)",
  "nesterov": "SGD with Nesterov's momentum",
  "lr_schedule": "The learning rate over the run: constant, cosine (to 0, as optax) or step "
  "(times lr_factor at each of lr_boundaries)",
  "lr_boundaries": "Epochs after which the step schedule multiplies the rate by lr_factor, "
  "e.g. (60,120,160)",
  "lr_factor": "The step schedule's factor at each boundary (e.g. 0.1 or 0.2)",
  "warmup_epochs": "Epochs of linear warmup from 0 before the schedule (0: none)",
  "weight_decay": "L2 on the conv and dense kernels, coupled (weight_decay * w added to the "
  "gradient, as He et al.; not AdamW's decay); 0: none",
  "augment": "Training-batch augmentation on device: none, or names among crop (zero-pad by "
  "crop_padding, random crop back) and flip (horizontal), e.g. (crop,flip)",
  "crop_padding": "Pixels of zero padding on each side for crop (4 for CIFAR)",
  "half_precision": "Mixed precision: none (float32), bfloat16 or float16 (with dynamic loss "
  "scaling); parameters, logits and scores stay float32",
  "log_every_steps": "Training steps between curve points (loss, accuracy, learning rate, "
  "examples/s) in the TensorBoard files and the log",
  "steps_per_call": "Training steps per jitted call (a lax.scan on device); unset: 1 on CPU "
  "(XLA:CPU runs convolutions in loops slowly), 100 on GPU/TPU",
  "eval_every_epochs": "Test-split loss and accuracy every N epochs into the curves (and "
  "after the last epoch, always); 0: only after the last",
  # Prediction: the plain model, MC dropout at each rate, the ensemble.
  "dropout_rates": "MC-dropout rates to sample each trained network at (empty: none)",
  "num_samples": "MC-dropout samples per example (at least 2)",
  "chunk_size": "Examples per device step when predicting; unset: tuned to the device",
  "keep_samples": "Store all [S, N, K] MC-dropout logits in the predictions files",
  # Evaluating given files instead of training.
  "inputs": "Files to evaluate instead of training, comma-separated paths or globs: .npz "
  "predictions files, or one .npy array (see input_kind)",
  "input_kind": "What inputs hold: auto (.npz: predictions files; one .npy: logits or probs, "
  "told by its rows), predictions, logits or probs",
  "labels": "A .npy of [N] integer labels, for inputs of kind logits or probs",
  # The sweep: every score x Top-k event x estimator, over all bin counts.
  "scores": "Uncertainty scores to bin (all: every score the inputs allow)",
  "n_bins": "Bin counts to cross-validate",
  "topk": "Top-k events: k=1 is 'the top prediction is right'",
  "estimators": "Estimators of P(correct): bins (the paper), isotonic, kde",
  "n_folds": "Calibration/test splits to average over",
  "scheme": "How the splits are drawn: halves (random halves, the paper) or kfold",
  "figure_bins": "Bins of the reliability figures (fewer if a split has fewer examples)",
  "compare_bins": "Bins of Table 1's comparison, one of n_bins; unset: 20 if there, else the first",
  "ece_bins": "Equal-width bins of the benchmark's confidence ECE",
  "selective_targets": "Accuracies that selective prediction aims at",
  "selective_delta": "Selective prediction's risk of missing its target, in (0, 0.5)",
  "set_methods": "Prediction sets with a coverage guarantee: lac, aps, raps, topk (the "
  "paper's calibrated Top-k); empty: none",
  "set_alphas": "Miscoverage levels: each prediction set holds the label with probability "
  ">= 1 - alpha",
  "figures": "Write figures/ after the tables (False: tables only, faster)",
  # Dataset shift (experiments/shift.py, the shift config; Ovadia et al. 2019).
  "shift_examples": "Test examples every shifted set is made of: the first N of the test "
  "split; unset: all",
  "shift_rotation": "How images are rotated: rotate_cubic (Ovadia et al.'s: SciPy's cubic "
  "spline, canvas enlarged, centre cropped) or rotate (bilinear)",
  "shift_translation": "How images are translated: roll (Ovadia et al.'s: wrapping round) or "
  "translate (zero fill)",
  "shift_rotations": "Rotations to test, degrees counter-clockwise (0 is the clean set)",
  "shift_translations": "Translations to test, pixels along x (0 is the clean set)",
  "shift_corruptions": "Corruptions to test (top1_jax.engine.corruptions; all: every one)",
  "shift_severities": "Intensities of each corruption, 1-5",
  "shift_ood": "Out-of-distribution sets: digits (scikit-learn's 8x8, resized), uniform_noise",
  "shift_estimators": "What turns a model's output into P(correct) under shift: raw (its own "
  "probability), temperature, toplabel, bins, isotonic, kde",
  "shift_num_labels": "Recalibration: labelled examples m of each shifted set (from its "
  "calibration part) the methods are refitted on, each 0 or at least 10; empty: none",
  "shift_label_draws": "Draws of the m labelled examples per calibration/test split",
  "shift_prior_strength": "Pseudo-counts s that each clean bin's probability is worth when the "
  "bins are updated with m shifted labels; unset: chosen per fit by the leave-one-out "
  "likelihood of the m examples",
  "shift_recalibrate_samples": "Also recalibrate MC dropout and the ensemble (slow); False: "
  "models of one network only",
  "shift_recalibration_scores": "Scores the bins and isotonic are refitted on (temperature: "
  "the log-probabilities); a model without one skips it",
  "shift_accuracy_scores": "Scores of the label-free accuracy estimates (ATC and the "
  "calibrated bins); a model without one skips it",
  "shift_inputs": "With inputs (the clean files): predictions files of the same examples "
  "shifted, paths or globs, each meta naming its shift and severity (or ood: true)",
}
"""Every field's meaning: ``--help`` lists them (``top1_jax.launch.usage.describe``)."""


def get_config() -> ml_collections.ConfigDict:
  """The main job's config: Fashion-MNIST, every field set (``HELP`` says what each means)."""
  config = ml_collections.ConfigDict()
  config.dataset = "fashion_mnist"
  config.data_dir = config_dict.placeholder(str)
  config.limit_train = config_dict.placeholder(int)
  config.limit_test = config_dict.placeholder(int)
  config.models = ("cnn",)
  config.train_dropout_rates = (0.1,)
  config.seeds = (0,)
  config.num_epochs = 3
  config.batch_size = 128
  config.learning_rate = 1e-3
  config.ensemble_size = 5
  config.ensemble_strategy = "auto"
  config.optimizer = "adam"
  config.momentum = 0.9
  config.nesterov = False
  config.lr_schedule = "constant"
  config.lr_boundaries = ()
  config.lr_factor = 0.1
  config.warmup_epochs = 0.0
  config.weight_decay = 0.0
  config.augment = ("none",)
  config.crop_padding = 4
  config.half_precision = "none"
  config.log_every_steps = 100
  config.steps_per_call = config_dict.placeholder(int)
  config.eval_every_epochs = 0
  config.dropout_rates = (0.002, 0.005, 0.01, 0.02, 0.05, 0.2)
  config.num_samples = 32
  config.chunk_size = config_dict.placeholder(int)
  config.keep_samples = False
  config.inputs = ""
  config.input_kind = "auto"
  config.labels = ""
  config.scores = ("all",)
  config.n_bins = (10, 20, 100)
  config.topk = (1, 2)
  config.estimators = ("bins",)
  config.n_folds = 10
  config.scheme = "halves"
  config.figure_bins = 20
  config.compare_bins = config_dict.placeholder(int)
  config.ece_bins = 15
  config.selective_targets = (0.9, 0.95, 0.99)
  config.selective_delta = 0.05
  config.set_methods = ("lac", "aps", "raps", "topk")
  config.set_alphas = (0.1, 0.05)
  config.figures = True
  config.shift_examples = config_dict.placeholder(int)
  config.shift_rotation = "rotate_cubic"
  config.shift_translation = "roll"
  config.shift_rotations = tuple(range(15, 181, 15))
  config.shift_translations = tuple(range(2, 27, 2))
  config.shift_corruptions = ("all",)
  config.shift_severities = (1, 2, 3, 4, 5)
  config.shift_ood = ("digits", "uniform_noise")
  config.shift_estimators = ("raw", "temperature", "toplabel", "bins", "isotonic", "kde")
  config.shift_num_labels = (0, 25, 50, 100, 200, 500)
  config.shift_label_draws = 2
  config.shift_prior_strength = config_dict.placeholder(float)
  config.shift_recalibrate_samples = False
  config.shift_recalibration_scores = ("neg_log_pmax",)
  config.shift_accuracy_scores = ("neg_log_pmax", "entropy", "covariance_norm_probs")
  config.shift_inputs = ""
  return config
