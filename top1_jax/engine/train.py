"""Training with optax: one network, or a deep ensemble trained together.

``fit`` runs up to ``steps_per_call`` steps per jitted call (``lax.scan``), data-parallel
over all devices; the host reads the summed loss only at a report. The ``name as name``
imports re-export the rest of the training API (``train_state``, ``network_metrics``).
"""

import functools
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.engine import batches, mc, parallel, train_state
from top1_jax.engine.batches import TrainingData as TrainingData
from top1_jax.engine.network_metrics import evaluate as evaluate
from top1_jax.engine.network_metrics import evaluate_ensemble as evaluate_ensemble
from top1_jax.engine.train_state import TrainState as TrainState
from top1_jax.engine.train_state import create_train_state as create_train_state
from top1_jax.engine.train_state import ensemble_train_step as ensemble_train_step
from top1_jax.engine.train_state import init_ensemble as init_ensemble
from top1_jax.engine.train_state import member as member
from top1_jax.engine.train_state import train_step as train_step

Callback = Callable[[dict[str, Any]], None]

MAX_LOSS = 1e3  # a mean training loss (nats; chance is log K) above it: diverged


class DivergedError(ValueError):
  """The mean loss up to ``step`` (1-based) is not finite, or above ``MAX_LOSS``."""

  def __init__(self, step: int, loss: float, member: int | None):
    self.step, self.loss = step, loss
    who = "" if member is None else f" (member {member})"
    super().__init__(
      f"training diverged by step {step}{who}: loss {loss:.3g}, not finite or above "
      f"{MAX_LOSS:g}; a smaller learning rate usually fixes it"
    )


STEPS_PER_CALL = 100


@functools.lru_cache(maxsize=64)
def slow_in_cpu_loops(model: nn.Module, example_shape: tuple[int, ...]) -> bool:
  """Whether XLA:CPU runs this model's step much slower inside ``lax.scan``: with a
  convolution or a half-precision compute."""
  sample = jax.ShapeDtypeStruct((1, *example_shape), jnp.float32)
  forward = jax.make_jaxpr(lambda x: model.init_with_output(jax.random.key(0), x)[0])(sample)
  half = batches.input_dtype(model) != jnp.float32
  return half or "conv_general_dilated" in str(forward)


def pick_steps_per_call(
  steps_per_call: int | None = None, backend: str | None = None, *, slow_in_loops: bool = False
) -> int:
  """Training steps per jitted call: ``steps_per_call`` if not None, else by backend (any
  value gives the same numbers up to float rounding)."""
  if steps_per_call is not None:
    return validation.positive_int("steps_per_call", steps_per_call)
  backend = jax.default_backend() if backend is None else backend
  return 1 if backend == "cpu" and slow_in_loops else STEPS_PER_CALL


class _Progress:
  """Reads the device sums every ``log_every`` steps, checks the loss, calls ``callback``."""

  def __init__(self, callback, begin, end, log_every, examples_per_step, member_index):
    self._callback = callback
    self._begin, self.end, self._log_every = begin, end, log_every
    self._examples_per_step, self._member = examples_per_step, member_index
    self._last, self._start = begin, time.perf_counter()

  def next_report(self, step: int) -> int:
    window = (step - self._begin) // self._log_every + 1
    return min(self._begin + window * self._log_every, self.end)

  def report(self, done: int, totals: dict[str, jax.Array]) -> None:
    count, self._last = done - self._last, done
    means = {name: np.asarray(parallel.to_local(total)) / count for name, total in totals.items()}
    losses = np.nan_to_num(np.reshape(means["loss"], -1), nan=np.inf)  # [M] for a vmapped ensemble
    if losses.max() > MAX_LOSS:  # once per report, on the host: the sync is paid for already
      worst = int(np.argmax(losses))
      member = self._member if losses.size == 1 else worst
      raise DivergedError(done, float(np.reshape(means["loss"], -1)[worst]), member)
    if self._callback is None:
      return
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    info = {"step": done, "num_steps": self.end, "member": self._member}
    info |= {name: float(mean) if mean.ndim == 0 else mean for name, mean in means.items()}
    self._callback(info | {"examples_per_second": count * self._examples_per_step / elapsed})
    self._start = time.perf_counter()


@functools.cache
def _program(mesh, num_steps, steps_per_epoch, batch_size, ensemble, streamed, dtype, impl):
  """``num_steps`` steps as one jitted call; ``orders`` holds a permutation per epoch it
  touches, or, ``streamed``, ``images`` are the call's own batches [n, (M,) B, ...]."""
  step_fn = train_state.ensemble_step if ensemble else train_state.apply_step
  fold_in = jax.vmap(jax.random.fold_in, in_axes=(0, None)) if ensemble else jax.random.fold_in

  def call(state, totals, images, labels, orders, key_data, first):
    key = jax.random.wrap_key_data(key_data, impl=impl)
    steps = first + jnp.arange(num_steps, dtype=jnp.int32)
    num_examples = orders[0].shape[-1] if orders else None
    orders = jnp.concatenate(orders, axis=-1) if orders else None  # [(M,) E * N]

    def body(carry, xs):
      state, totals = carry
      step, batch = xs
      if not streamed:
        epoch, position = jnp.divmod(step, steps_per_epoch)
        start = (epoch - first // steps_per_epoch) * num_examples + position * batch_size
        rows = jax.lax.dynamic_slice_in_dim(orders, start, batch_size, axis=-1)
        batch = parallel.gather_rows((images, labels), rows, mesh)
      state, metrics = step_fn(state, batch, fold_in(key, step))
      return (state, jax.tree_util.tree_map(jnp.add, totals, metrics)), None

    xs = (steps, (images.astype(dtype), labels) if streamed else None)
    if num_steps == 1:  # a plain call: XLA:CPU runs convolutions inside loops slowly
      return body((state, totals), jax.tree_util.tree_map(lambda x: x[0], xs))[0]
    return jax.lax.scan(body, (state, totals), xs)[0]

  return jax.jit(call, out_shardings=NamedSharding(mesh, P()))


def training_data(model: nn.Module, images: ArrayLike, labels: ArrayLike) -> TrainingData:
  """A training set checked and placed once, for many ``fit(state, data, None, ...)`` calls."""
  return batches.training_data(model, images, labels, mc.default_mesh())


def fit(
  state: TrainState,
  images: ArrayLike | TrainingData,
  labels: ArrayLike | None,
  key: jax.Array,
  *,
  num_steps: int,
  batch_size: int,
  log_every: int = 100,
  callback: Callback | None = None,
  steps_per_call: int | None = None,
) -> TrainState:
  """Trains one network for ``num_steps`` mini-batch steps.
  With ``shuffle_key, dropout_key = split(key)``, step t (from ``state.step``) takes the
  batch at position t of ``batches.EpochOrder(shuffle_key)`` and the dropout key
  ``fold_in(dropout_key, t)``. Every ``log_every`` steps ``callback`` gets the loss and
  accuracy averaged since its last call. ``batch_size``: a multiple of the device count."""
  key = mc.as_prng_key(key)
  data, *plan = _checked(
    state.model, state.variables, images, labels, num_steps, batch_size, log_every, steps_per_call
  )
  return _fit(state, data, key, *plan, callback, None)


def _checked(model, variables, images, labels, num_steps, batch_size, log_every, steps_per_call):
  """``fit``'s data, step count, batch size, log interval and steps per call, checked."""
  data = batches.for_fit(model, variables, images, labels, mc.default_mesh())
  num_steps = validation.positive_int("num_steps", num_steps)
  batch_size = validation.positive_int("batch_size", batch_size, maximum=data.num_examples)
  log_every = validation.positive_int("log_every", log_every)
  parallel.check_global_batch("batch_size", batch_size)
  slow = steps_per_call is None and jax.default_backend() == "cpu"
  slow = slow and slow_in_cpu_loops(model, tuple(data.images.shape[1:]))
  steps_per_call = pick_steps_per_call(steps_per_call, slow_in_loops=slow)
  return data, num_steps, batch_size, log_every, steps_per_call


def _fit(state, data, key, num_steps, batch_size, log_every, steps_per_call, callback, index):
  """``fit`` of one network (``key`` []) or of a vmapped ensemble (``key`` [M]): its shuffling
  and dropout keys are ``split(key)``, per member; step t's is ``fold_in(dropout key, t)``."""
  keys = jax.vmap(jax.random.split)(key) if key.ndim else jax.random.split(key)
  order = batches.EpochOrder(keys[..., 0], data, batch_size)
  begin = int(np.asarray(state.step).reshape(-1)[0])
  progress = _Progress(callback, begin, begin + num_steps, log_every, order.rows_per_step, index)
  mesh, shape, impl = data.mesh, key.shape, jax.random.key_impl(key)
  zeros = {name: np.zeros(shape, np.float32) for name in ("loss", "accuracy")}
  key_data, zeros = parallel.replicate((jax.random.key_data(keys[..., 1]), zeros), mesh)
  if not data.on_device:
    steps_per_call = batches.streamed_steps(data, order, steps_per_call)
  calls, first = [], begin  # (first step, steps) of each call, cut at every report
  while first < progress.end:
    calls.append((first, min(steps_per_call, progress.next_report(first) - first)))
    first += calls[-1][1]
  blocks = None if data.on_device else batches.streamed(data, order, calls)
  static = (order.steps_per_epoch, order.batch_size, bool(shape), blocks is not None)
  state, totals, pending = parallel.replicate(state, mesh), zeros, None
  for first, steps in calls:
    if data.on_device:
      inputs = (data.images, data.labels, order.device_orders(first, steps))
    else:
      inputs = (*next(blocks), ())
    program = _program(mesh, steps, *static, data.dtype, impl)
    state, totals = program(state, totals, *inputs, key_data, np.int32(first))
    if pending is not None:
      progress.report(*pending)
      pending = None
    if first + steps == progress.next_report(first):  # read after the next call starts
      pending, totals = (first + steps, totals), zeros
  if pending is not None:
    progress.report(*pending)
  return parallel.to_local(state)


def fit_ensemble(
  states: TrainState,
  images: ArrayLike | TrainingData,
  labels: ArrayLike | None,
  key: jax.Array,
  *,
  num_steps: int,
  batch_size: int,
  strategy: str = "auto",
  log_every: int = 100,
  callback: Callback | None = None,
  steps_per_call: int | None = None,
) -> TrainState:
  """Trains every member of an ensemble; member m as ``fit`` with ``split(key, M)[m]``.
  ``strategy`` ``"vmap"`` and ``"loop"`` give the same members up to float rounding; the
  ``callback`` gets each member's floats with ``"loop"``, [M] arrays with vmap."""
  size = mc.ensemble_size(states.params)
  strategy = mc.pick_strategy(strategy)
  member_keys = jax.random.split(mc.as_prng_key(key), size)
  steps = np.asarray(states.step).reshape(-1)
  if np.any(steps != steps[0]):
    raise ValueError(f"states: members are at different steps {steps.tolist()}")
  variables = member(states, 0).variables
  data, *plan = _checked(
    states.model, variables, images, labels, num_steps, batch_size, log_every, steps_per_call
  )
  if strategy == "vmap":  # one vmapped step: member m's keys are those of the loop's
    return _fit(states, data, member_keys, *plan, callback, None)
  members = [_fit(member(states, m), data, member_keys[m], *plan, callback, m) for m in range(size)]
  return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *members)
