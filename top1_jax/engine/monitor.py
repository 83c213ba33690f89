"""What a training run reports: curves per logged step and per epoch, for a metric writer.

Steps are the run's global step counts, so a resumed run goes on where it stopped. An
ensemble's per-step tags are per member (``train/member_<m>/loss``...)."""

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["Monitor", "ScalarWriter"]


class ScalarWriter(Protocol):
  """What ``Monitor`` writes to (``io.metric_writer.MetricWriter`` is one)."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None: ...


TEST_METRICS = ("loss", "accuracy", "brier", "ece")  # the test split's, per evaluated epoch


class Monitor:
  """Turns ``fit``'s progress reports (``callback``) into ``train/*`` scalars for ``writer``,
  and each epoch's (``end_epoch``) into ``epoch/*`` and ``test/*``; ``learning_rate(step)``
  is the rate of 0-based update ``step``."""

  def __init__(self, writer: ScalarWriter, learning_rate: Callable[[int], float]):
    self._writer = writer
    self._learning_rate = learning_rate
    self.start_epoch(0)

  def start_epoch(self, step: int) -> None:
    """Starts an epoch at the run's step count ``step``."""
    self._begin = step
    self._previous: dict[Any, int] = {}  # the last reported step, per member
    self._sums: dict[str, np.ndarray] = {}
    self._start = time.perf_counter()

  def callback(self, info: dict[str, Any]) -> None:
    """``fit``'s / ``fit_ensemble``'s callback."""
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
    for prefix, (loss_i, accuracy_i) in prefixes.items():
      scalars |= {f"{prefix}/loss": float(loss_i), f"{prefix}/accuracy": float(accuracy_i)}
      totals = self._sums.setdefault(prefix, np.zeros(3))
      totals += (steps, steps * float(loss_i), steps * float(accuracy_i))
    scalars |= {"train/learning_rate": rate, "train/examples_per_second": speed}
    self._writer.write_scalars(step, scalars)

  def end_epoch(
    self, epoch: int, step: int, num_examples: int, test: Mapping[str, float] | None = None
  ) -> dict[str, float]:
    """Writes and returns the scalars of the finished (1-based) ``epoch`` at ``step``."""
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
