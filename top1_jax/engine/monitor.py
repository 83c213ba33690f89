"""What a training run reports: curves per logged step and per epoch, for a metric writer.

``Monitor(writer, learning_rate)`` turns ``fit``'s progress reports (its
``callback``) into scalars written by ``writer.write_scalars(step, scalars)`` (any
object with that method, e.g. ``top1_jax.io.metric_writer.MetricWriter``), and sums
each epoch's training loss and accuracy for ``end_epoch``. Steps are the global
step counts of the run (``TrainState.step`` after the step), so a resumed run goes
on where it stopped.

Tags, for one network:

* every ``log_every`` steps: ``train/loss``, ``train/accuracy`` (means over the
  steps since the previous point), ``train/learning_rate`` (the rate of the last of
  them) and ``train/examples_per_second``;
* every epoch (``end_epoch``): ``epoch/train_loss``, ``epoch/train_accuracy``,
  ``epoch/examples_per_second`` (training and evaluation, the epoch's wall time),
  ``epoch/epoch``, and ``test/loss``, ``test/accuracy`` when the test split was
  evaluated.

For an ensemble the per-step tags are per member (``train/member_<m>/loss``...);
the epoch's training loss and accuracy are the means over the members, and ``test/*``
is the ensemble's (the mean of its members' probabilities).
"""

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["Monitor", "ScalarWriter"]


class ScalarWriter(Protocol):
  """What ``Monitor`` writes to (``io.metric_writer.MetricWriter`` is one)."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None: ...


TEST_METRICS = ("loss", "accuracy", "brier", "ece")
"""The test split's metrics a run's curves hold per evaluation epoch (``network_metrics``)."""


class Monitor:
  """Writes a run's curves (see the module docstring).

  Args:
    writer: receives ``write_scalars(step, {tag: value})``.
    learning_rate: ``learning_rate(step) -> float`` of 0-based update ``step``
      (``optimizers.Optimizer.learning_rate``).
  """

  def __init__(self, writer: ScalarWriter, learning_rate: Callable[[int], float]):
    self._writer = writer
    self._learning_rate = learning_rate
    self.start_epoch(0)

  def start_epoch(self, step: int) -> None:
    """Starts an epoch at the run's step count ``step`` (its time and sums start now)."""
    self._begin = step
    self._previous: dict[Any, int] = {}  # the last reported step, per member
    self._sums: dict[str, np.ndarray] = {}
    self._start = time.perf_counter()

  def callback(self, info: dict[str, Any]) -> None:
    """``fit``'s / ``fit_ensemble``'s callback: writes the step's scalars."""
    step, member = int(info["step"]), info.get("member")
    loss, accuracy = np.asarray(info["loss"]), np.asarray(info["accuracy"])
    steps = max(step - self._previous.get(member, self._begin), 1)
    self._previous[member] = step
    rate = self._learning_rate(step - 1)
    speed = float(info["examples_per_second"])
    if loss.ndim == 0 and member is None:  # one network
      prefixes = {"train": (loss, accuracy)}
    else:  # an ensemble: one member (loop) or all members (vmap, [M] arrays)
      members = [member] if member is not None else range(loss.size)
      losses, accuracies = loss.reshape(-1), accuracy.reshape(-1)
      prefixes = {f"train/member_{m}": (losses[i], accuracies[i]) for i, m in enumerate(members)}
    scalars = {}
    for prefix, (member_loss, member_accuracy) in prefixes.items():
      scalars |= {
        f"{prefix}/loss": float(member_loss),
        f"{prefix}/accuracy": float(member_accuracy),
      }
      self._add(prefix, steps, member_loss, member_accuracy)
    scalars |= {"train/learning_rate": rate, "train/examples_per_second": speed}
    self._writer.write_scalars(step, scalars)

  def _add(self, prefix: str, steps: int, loss, accuracy) -> None:
    totals = self._sums.setdefault(prefix, np.zeros(3))
    totals += (steps, steps * float(loss), steps * float(accuracy))

  def end_epoch(
    self,
    epoch: int,
    step: int,
    num_examples: int,
    test: Mapping[str, float] | None = None,
  ) -> dict[str, float]:
    """Writes the epoch's scalars at ``step`` (``start_epoch`` starts the next).

    Args:
      epoch: the finished epoch (1-based).
      step: the run's step count after it.
      num_examples: training examples the epoch processed (all members together).
      test: ``evaluate``'s or ``evaluate_ensemble``'s dict, or None.

    Returns:
      The scalars written (tag -> value).
    """
    seconds = max(time.perf_counter() - self._start, 1e-9)
    totals = list(self._sums.values())
    scalars = {"epoch/epoch": float(epoch)}
    if totals:
      scalars["epoch/train_loss"] = float(np.mean([t[1] / t[0] for t in totals]))
      scalars["epoch/train_accuracy"] = float(np.mean([t[2] / t[0] for t in totals]))
    scalars["epoch/examples_per_second"] = num_examples / seconds
    if test is not None:  # the NLL (loss), accuracy, and the max-softmax's Brier and ECE
      scalars |= {f"test/{k}": float(test[k]) for k in TEST_METRICS if k in test}
    self._writer.write_scalars(step, scalars)
    return scalars
