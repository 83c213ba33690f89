"""Training with optax: one network, or a deep ensemble trained together.

* ``train_step(state, batch, key)``: one jitted, pure SGD step (cross-entropy), with
  the state's augmentation of the batch (``augment``; its key split from the step's
  key) and float16's dynamic loss scaling (``train_state.loss_scale``) when set.
* ``fit``: ``num_steps`` steps over shuffled mini-batches; deterministic for a
  given key on CPU. Step t (counted from ``state.step``, so a restored run goes
  on with fresh keys and the next batches) uses the batch at position t of the
  epoch permutations ``permutation(fold_in(shuffle_key, epoch), N)`` and the
  dropout key ``fold_in(dropout_key, t)``, where
  ``shuffle_key, dropout_key = split(key)``.
* Deep ensembles: ``init_ensemble`` initialises M members with ``jax.vmap`` over
  ``split(key, M)``; ``fit_ensemble`` trains member m exactly as
  ``fit(member_m, ..., key=split(key, M)[m])`` would (its own shuffling and
  dropout keys), either by one vmapped step for all members (``"vmap"``, the
  accelerator path) or member after member (``"loop"``, faster on CPU where
  convolutions under vmap are slow). ``mc.pick_strategy`` chooses per backend.
* ``evaluate`` / ``evaluate_ensemble``: loss and accuracy (``network_metrics``).

The state and its creation (``TrainState``, ``create_train_state``,
``init_ensemble``, ``member``) live in ``train_state``, the checked data and batch
order in ``batches``; all are re-exported here.

With several devices or processes (``parallel.initialize``) each step is
data-parallel over all of them (``parallel.data_parallel_steps``): every process
calls ``fit`` alike, with the whole host data, and gets the one-device result up
to float rounding; ``batch_size`` must be a multiple of the device count.

Checkpoints of a ``TrainState`` are in ``top1_jax.io.checkpoints``.

Progress goes to an optional ``callback(info: dict)``; nothing here prints. A loss
that is not finite or above ``MAX_LOSS`` stops training with ``DivergedError``,
checked on the host once per report (every ``log_every`` steps), not in the step.
"""

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.engine import batches, mc, parallel, train_state
from top1_jax.engine.network_metrics import evaluate, evaluate_ensemble
from top1_jax.engine.train_state import TrainState, create_train_state, init_ensemble, member

__all__ = [
  "TrainState",
  "create_train_state",
  "init_ensemble",
  "train_step",
  "ensemble_train_step",
  "fit",
  "fit_ensemble",
  "evaluate",
  "evaluate_ensemble",
  "member",
  "DivergedError",
  "MAX_LOSS",
]

Callback = Callable[[dict[str, Any]], None]


def _loss_and_updates(state: TrainState, params, images, labels, key):
  mutable = list(state.model_state)
  outputs = state.model.apply(
    {"params": params, **state.model_state},
    images,
    train=True,
    dropout_rate=state.dropout_rate,
    rngs={"dropout": key},
    mutable=mutable or False,
  )
  logits, new_model_state = outputs if mutable else (outputs, {})
  loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
  return loss, (logits, dict(new_model_state))


def _train_step(state: TrainState, batch, key):
  images, labels = batch
  if state.augmentation:  # its own key; without augmentation the dropout key is unchanged
    key, augment_key = jax.random.split(key)
    images = state.augmentation(augment_key, images)

  def loss_fn(params):
    return _loss_and_updates(state, params, images, labels, key)

  if state.dynamic_scale is None:
    (loss, (logits, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  else:
    scale, finite, (loss, (logits, model_state)), grads = state.dynamic_scale.value_and_grad(
      loss_fn, has_aux=True
    )(state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(
    step=state.step + 1,
    params=optax.apply_updates(state.params, updates),
    model_state=model_state,
    opt_state=opt_state,
  )
  if state.dynamic_scale is not None:  # a step with non-finite gradients changes only the scale
    kept = jax.tree_util.tree_map(
      functools.partial(jnp.where, finite),
      (new_state.params, new_state.model_state, new_state.opt_state),
      (state.params, state.model_state, state.opt_state),
    )
    new_state = new_state.replace(
      params=kept[0], model_state=kept[1], opt_state=kept[2], dynamic_scale=scale
    )
  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
  return new_state, {"loss": loss, "accuracy": accuracy}


_ensemble_step = jax.vmap(_train_step)
_train_step_jit = jax.jit(_train_step)
_ensemble_train_step_jit = jax.jit(_ensemble_step)


def _check_batch(batch: Any, member_axis: bool) -> tuple[jax.Array, jax.Array]:
  if not isinstance(batch, (tuple, list)) or len(batch) != 2:
    raise ValueError("batch: expected a pair (images, labels)")
  lead = 1 if member_axis else 0
  images = validation.as_array("batch images", batch[0], range(2 + lead, 6 + lead))
  labels = validation.as_array("batch labels", batch[1], 1 + lead)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"batch labels: expected integer labels, got dtype {labels.dtype}")
  if images.shape[: lead + 1] != labels.shape:
    raise ValueError(
      f"batch: images {images.shape} and labels {labels.shape} disagree on the"
      f" {'member and ' if member_axis else ''}batch axes"
    )
  return images, labels


def train_step(
  state: TrainState, batch: tuple[ArrayLike, ArrayLike], key: jax.Array
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on the mean softmax cross-entropy (jitted, pure).

  Label values are not range-checked here (that would sync with the device every
  step); ``fit`` checks them once.

  Args:
    state: the current ``TrainState``.
    batch: ``(images [B, ...] float, labels [B] int)``.
    key: PRNG key for this step's dropout masks (use a fresh one every step).

  Returns:
    ``(new_state, {"loss": [], "accuracy": []})`` (metrics of this batch, before
    the update).
  """
  return _train_step_jit(state, _check_batch(batch, False), mc.as_prng_key(key))


def ensemble_train_step(
  states: TrainState, batch: tuple[ArrayLike, ArrayLike], keys: jax.Array
) -> tuple[TrainState, dict[str, jax.Array]]:
  """``train_step`` of every member at once, by ``jax.vmap`` (jitted, pure).

  Args:
    states: an ensemble ``TrainState`` (leaves with a leading [M] axis).
    batch: ``(images [M, B, ...], labels [M, B])``: one batch per member.
    keys: [M] PRNG keys, one per member.

  Returns:
    ``(new_states, {"loss": [M], "accuracy": [M]})``.
  """
  size = mc.ensemble_size(states.params)
  images, labels = _check_batch(batch, True)
  if images.shape[0] != size:
    raise ValueError(f"batch: expected {size} member batches, got {images.shape[0]}")
  if (
    not isinstance(keys, jax.Array)
    or not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    or keys.shape != (size,)
  ):
    raise ValueError(f"keys: expected [{size}] PRNG keys from jax.random.split")
  return _ensemble_train_step_jit(states, (images, labels), keys)


MAX_LOSS = 1e3
"""A mean training loss (cross-entropy, nats; chance is log K) above this means training
diverged: ``fit`` stops with ``DivergedError``."""


class DivergedError(ValueError):
  """Training diverged: the loss is not finite, or above ``MAX_LOSS``.

  Attributes:
    step: the last step (1-based) of the steps whose loss was checked.
    loss: their mean loss (the largest over an ensemble's members).
  """

  def __init__(self, step: int, loss: float, member: int | None):
    self.step, self.loss = step, loss
    who = "" if member is None else f" (member {member})"
    super().__init__(
      f"training diverged by step {step}{who}: loss {loss:.3g}, not finite or above "
      f"{MAX_LOSS:g}; a smaller learning rate usually fixes it"
    )


class _Progress:
  """Sums the step metrics on device; every ``log_every`` steps checks their mean loss on the
  host (``DivergedError``) and reports the means.

  Without a callback only the last step's metrics are kept (no device work per step),
  and its loss is checked.
  """

  def __init__(self, callback, begin, end, log_every, examples_per_step, member_index):
    self._callback = callback
    self._begin, self.end, self._log_every = begin, end, log_every
    self._examples_per_step, self._member = examples_per_step, member_index
    self._reset()

  def _reset(self):
    self._running, self._count, self._start = None, 0, time.perf_counter()

  def update(self, step: int, metrics: dict[str, jax.Array]) -> None:
    """Records the metrics of ``step`` (0-based); checks and reports when due."""
    summing = self._callback is not None and self._running is not None
    self._running = jax.tree_util.tree_map(jnp.add, self._running, metrics) if summing else metrics
    self._count = self._count + 1 if summing else 1
    done = step + 1
    if (done - self._begin) % self._log_every and done != self.end:
      return
    means = {name: np.asarray(total) / self._count for name, total in self._running.items()}
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
    self._callback(info | {"examples_per_second": self._count * self._examples_per_step / elapsed})
    self._reset()


def fit(
  state: TrainState,
  images: ArrayLike,
  labels: ArrayLike,
  key: jax.Array,
  *,
  num_steps: int,
  batch_size: int,
  log_every: int = 100,
  callback: Callback | None = None,
) -> TrainState:
  """Trains one network for ``num_steps`` mini-batch steps.

  Epochs are fresh permutations of the N examples; the last N mod batch_size
  examples of each permutation are skipped. See the module docstring for how
  ``key`` determines the batches and dropout masks.

  Args:
    state: the ``TrainState`` to start from (step 0 or restored).
    images: [N, ...] float inputs (host arrays; integers are cast to float32).
    labels: [N] int labels in [0, K).
    key: PRNG key of this run.
    num_steps: steps to take, >= 1.
    batch_size: examples per step, 1 <= batch_size <= N, a multiple of the device count.
    log_every: call ``callback`` every this many steps (and after the last).
    callback: receives ``{"step", "num_steps", "loss", "accuracy",
      "examples_per_second", "member"}`` (loss and accuracy averaged over the
      steps since the previous call; ``member`` is None here).

  Returns:
    The trained ``TrainState``.

  Raises:
    DivergedError: the mean loss of the steps since the last report (the last
      step's loss without a callback) is not finite or above ``MAX_LOSS``.
  """
  key = mc.as_prng_key(key)
  images, labels = batches.checked_dataset(state.model, state.variables, images, labels)
  num_steps, batch_size, log_every = batches.checked_schedule(
    num_steps, batch_size, images.shape[0], log_every
  )
  return _fit_one(state, images, labels, key, num_steps, batch_size, log_every, callback, None)


def _fit_one(state, images, labels, key, num_steps, batch_size, log_every, callback, index):
  shuffle_key, dropout_key = jax.random.split(key)
  order = batches.EpochBatches(shuffle_key, images.shape[0], batch_size)
  begin = int(state.step)
  progress = _Progress(callback, begin, begin + num_steps, log_every, batch_size, index)
  return _steps(state, images, labels, order.indices, dropout_key, begin, progress)


def _steps(state, images, labels, indices, dropout_key, begin, progress):
  """Steps ``begin`` to ``progress.end``, on one device or data-parallel over all.

  Step t trains on rows ``indices(t)`` [B] (or [M, B]) with the dropout key
  ``fold_in(dropout_key, t)`` (per member for [M] keys)."""
  ensemble = dropout_key.ndim == 1
  fold_in = jax.vmap(jax.random.fold_in, in_axes=(0, None)) if ensemble else jax.random.fold_in
  if jax.device_count() > 1:
    return parallel.data_parallel_steps(
      _ensemble_step if ensemble else _train_step,
      state,
      (images, labels),
      indices,
      lambda step: fold_in(dropout_key, step),
      range(begin, progress.end),
      progress.update,
      mesh=mc.default_mesh(),
      axis=1 if ensemble else 0,
    )
  step_fn = _ensemble_train_step_jit if ensemble else _train_step_jit
  for step in range(begin, progress.end):
    idx = indices(step)
    state, metrics = step_fn(state, (images[idx], labels[idx]), fold_in(dropout_key, step))
    progress.update(step, metrics)
  return state


def fit_ensemble(
  states: TrainState,
  images: ArrayLike,
  labels: ArrayLike,
  key: jax.Array,
  *,
  num_steps: int,
  batch_size: int,
  strategy: str = "auto",
  log_every: int = 100,
  callback: Callback | None = None,
) -> TrainState:
  """Trains every member of an ensemble; member m as ``fit`` with ``split(key, M)[m]``.

  Args:
    states: an ensemble ``TrainState`` (from ``init_ensemble``), all members at
      the same step.
    images, labels, num_steps, batch_size, log_every: as ``fit``.
    key: PRNG key of this run, split into one key per member.
    strategy: ``"vmap"`` (one vmapped step trains all members), ``"loop"``
      (member after member) or ``"auto"`` (``mc.pick_strategy``: vmap on gpu/tpu,
      loop on cpu). Both give the same members up to float rounding.
    callback: as ``fit``; with ``"loop"`` ``member`` is the member's index and
      loss/accuracy are floats, with ``"vmap"`` ``member`` is None and loss /
      accuracy are [M] arrays.

  Returns:
    The trained ensemble ``TrainState``.

  Raises:
    DivergedError: as ``fit``, for any member.
  """
  size = mc.ensemble_size(states.params)
  strategy = mc.pick_strategy(strategy)
  member_keys = jax.random.split(mc.as_prng_key(key), size)
  steps = np.asarray(states.step).reshape(-1)
  if np.any(steps != steps[0]):
    raise ValueError(f"states: members are at different steps {steps.tolist()}")
  variables = member(states, 0).variables
  images, labels = batches.checked_dataset(states.model, variables, images, labels)
  schedule = batches.checked_schedule(num_steps, batch_size, images.shape[0], log_every)
  if strategy == "loop":
    return train_state.stack_members(
      [
        _fit_one(member(states, m), images, labels, member_keys[m], *schedule, callback, m)
        for m in range(size)
      ]
    )
  return _fit_vmapped(states, images, labels, member_keys, *schedule, callback)


def _fit_vmapped(states, images, labels, member_keys, num_steps, batch_size, log_every, callback):
  """``fit_ensemble`` by one vmapped step: the same keys and batches as ``_fit_one``."""
  size = len(member_keys)
  split_keys = [jax.random.split(k) for k in member_keys]
  member_batches = [batches.EpochBatches(k[0], images.shape[0], batch_size) for k in split_keys]
  dropout_keys = jnp.stack([k[1] for k in split_keys])
  begin = int(np.asarray(states.step).reshape(-1)[0])
  progress = _Progress(callback, begin, begin + num_steps, log_every, batch_size * size, None)

  def indices(step):
    return np.stack([order.indices(step) for order in member_batches])

  return _steps(states, images, labels, indices, dropout_keys, begin, progress)
