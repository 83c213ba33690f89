"""engine.optimizers' schedules at their ends, as their docstrings state them."""

import math

import pytest

from top1_jax.engine import optimizers


@pytest.mark.parametrize("warmup_epochs", [0, 2])
def test_cosine_reaches_zero_one_step_after_the_last(warmup_epochs):
  steps = dict(num_steps=100, steps_per_epoch=10)
  cosine = optimizers.schedule(0.1, "cosine", warmup_epochs=warmup_epochs, **steps)
  decay = 100 - 10 * warmup_epochs  # the cosine's own steps, after the warmup
  last = 0.1 * (1 + math.cos(math.pi * (decay - 1) / decay)) / 2
  assert last > 0
  assert float(cosine(99)) == pytest.approx(last, rel=1e-4)  # the last update still moves
  assert float(cosine(100)) == 0.0  # one step after the last
  assert optimizers.make("sgd", cosine).learning_rate(99) == pytest.approx(last, rel=1e-4)
  first = 0.0 if warmup_epochs else 0.1
  assert float(cosine(0)) == pytest.approx(first)
