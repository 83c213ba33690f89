"""Training throughput: ``train.fit`` against the ``lax.scan`` floor of the same step.

For each case (network, batch size, dtype, one network or an ensemble trained by one
vmapped step), images per second (all members' images for an ensemble) of:

  floor      one jitted ``lax.scan`` over the steps of the same step
             (``train_state.apply_step``, or ``ensemble_step``), every batch gathered
             on the device from a permutation drawn there, the data on the device in
             the step's input dtype: no host work at all. Written here, apart from
             ``fit``'s code.
  fit        ``train.fit`` / ``fit_ensemble(strategy="vmap")`` over the same number of
             steps, from a ``train.training_data`` made once (as a run that calls
             ``fit`` once per epoch makes it), a callback every 100 steps, the default
             ``steps_per_call`` (``pick_steps_per_call``: the table's last column).
  fit+data   the same from host arrays: ``fit`` checks and places them on every call.
  host loop  the loop ``fit`` ran before: each step's batch gathered on the host and
             sent, its key folded on the host, its metrics added on the device.

and ``fit / floor``. Each is timed after a warm-up run of the same length
(compilation), best of ``--repeats`` taken in turns. The data are random, of the
datasets' shapes.

  python benchmarks/bench_train.py --quick   # CPU: MLP (hidden 64) and the small CNN
  JAX_PLATFORMS=cuda python benchmarks/bench_train.py   # ResNet-20, WRN-16-4 (the GPU table)
  JAX_PLATFORMS=cuda python benchmarks/bench_train.py --models=resnet20 --batch_sizes=128
"""

import argparse
import functools
import platform
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from top1_jax.engine import augment, batches, models, optimizers, train, train_state

MODELS = {
  # name: (model, image shape, optimizer, train dropout rate, augmentation): the main
  # job's networks as it trains them, and the CIFAR recipe's (configs/cifar10.py).
  "mlp": (lambda dtype: models.MLP(num_classes=10, hidden_sizes=(64,), dtype=dtype), (28, 28)),
  "cnn": (lambda dtype: models.CNN(num_classes=10, dtype=dtype), (28, 28)),
  "resnet20": (lambda dtype: models.ResNet(num_classes=10, dtype=dtype), (32, 32, 3)),
  "wrn16_4": (lambda dtype: models.WideResNet(num_classes=10, dtype=dtype), (32, 32, 3)),
}
_RECIPE = {"mlp": "main", "cnn": "main", "resnet20": "cifar", "wrn16_4": "cifar"}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _state(name: str, dtype, sample, ensemble_size: int):
  model = MODELS[name][0](DTYPES[dtype])
  if _RECIPE[name] == "cifar":
    tx = optimizers.make("sgd", 0.1, momentum=0.9, weight_decay=1e-4).tx
    extras = {"augmentation": augment.make(("crop", "flip"), 4)}
  else:
    tx, extras = optax.adam(1e-3), {"dropout_rate": 0.1}
  if ensemble_size:
    return train.init_ensemble(
      model, tx, jax.random.key(0), sample, ensemble_size=ensemble_size, **extras
    )
  return train.create_train_state(model, tx, jax.random.key(0), sample, **extras)


def _permutations(keys, epochs, num_examples: int):
  """[E, (M,) N]: each epoch's permutation, ``permutation(fold_in(key, epoch), N)``, of
  one key or of [M] member keys."""

  def permute(key, epoch):
    return jax.random.permutation(jax.random.fold_in(key, epoch), num_examples)

  by_member = jax.vmap(permute, in_axes=(0, None)) if keys.ndim else permute
  return jax.vmap(by_member, in_axes=(None, 0))(keys, epochs)


@functools.partial(jax.jit, static_argnames=("num_steps", "batch_size", "ensemble"))
def _floor(state, images, labels, key, *, num_steps, batch_size, ensemble):
  """``num_steps`` steps in one scan, batches gathered on the device from a fresh
  permutation each epoch drawn there (the floor: the same work as ``fit``, no host)."""
  num_examples = images.shape[0]
  steps_per_epoch = num_examples // batch_size
  keys = jax.random.split(key, state.step.shape[0]) if ensemble else key
  epochs = jnp.arange(-(-num_steps // steps_per_epoch))
  orders = _permutations(keys, epochs, num_examples)  # [E, (M,) N]
  step = train_state.ensemble_step if ensemble else train_state.apply_step
  fold_in = jax.vmap(jax.random.fold_in, in_axes=(0, None)) if ensemble else jax.random.fold_in

  def body(state, t):
    epoch, position = jnp.divmod(t, steps_per_epoch)
    order = jax.lax.dynamic_index_in_dim(orders, epoch, keepdims=False)
    rows = jax.lax.dynamic_slice_in_dim(order, position * batch_size, batch_size, axis=-1)
    batch = (jnp.take(images, rows, axis=0), jnp.take(labels, rows, axis=0))
    state, metrics = step(state, batch, fold_in(keys, t))
    return state, metrics["loss"]

  return jax.lax.scan(body, state, jnp.arange(num_steps))[0]


def _host_loop(state, images, labels, key, num_steps, batch_size, ensemble):
  """The loop ``fit`` ran before: each epoch's permutation drawn and brought to the host,
  each batch gathered there and sent, one jitted step and eager key and metric ops each."""
  step = _ENSEMBLE_STEP if ensemble else _STEP
  keys = jax.random.split(key, state.step.shape[0]) if ensemble else key
  fold_in = jax.vmap(jax.random.fold_in, in_axes=(0, None)) if ensemble else jax.random.fold_in
  steps_per_epoch, running, order = images.shape[0] // batch_size, None, None
  for t in range(num_steps):
    epoch, position = divmod(t, steps_per_epoch)
    if position == 0 or order is None:
      order = np.asarray(_EPOCH_ORDERS(keys, jnp.asarray([epoch]), images.shape[0])[0])
    rows = order[..., position * batch_size : (position + 1) * batch_size]
    state, metrics = step(state, (images[rows], labels[rows]), fold_in(keys, t))
    running = metrics if running is None else jax.tree_util.tree_map(jnp.add, running, metrics)
    if (t + 1) % 100 == 0 or t + 1 == num_steps:
      np.asarray(running["loss"])
      running = None
  return state


_EPOCH_ORDERS = jax.jit(_permutations, static_argnums=2)
_STEP = jax.jit(train_state.apply_step)
_ENSEMBLE_STEP = jax.jit(train_state.ensemble_step)


def _best(runs: dict, repeats: int) -> dict[str, float]:
  """Each run's best time after a warm-up (compilation); the runs take turns, so a load
  that comes and goes on a shared machine falls on all of them."""
  for run in runs.values():
    jax.block_until_ready(run())
  times = {way: [] for way in runs}
  for _ in range(repeats):
    for way, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      times[way].append(time.perf_counter() - start)
  return {way: min(seconds) for way, seconds in times.items()}


def _case(name, batch_size, dtype, ensemble_size, num_steps, num_examples, repeats, per_call):
  """images/s of each way for one case."""
  rng = np.random.default_rng(0)
  images = rng.random((num_examples, *MODELS[name][1]), dtype=np.float32)
  labels = rng.integers(0, 10, num_examples).astype(np.int32)
  state = _state(name, dtype, images[:1], ensemble_size)
  key = jax.random.key(1)
  data = train.training_data(state.model, images, labels)
  kwargs = dict(num_steps=num_steps, batch_size=batch_size, steps_per_call=per_call)
  kwargs["callback"] = lambda info: None
  if ensemble_size:
    fit = functools.partial(train.fit_ensemble, strategy="vmap", **kwargs)
  else:
    fit = functools.partial(train.fit, **kwargs)
  device_images = jax.device_put(images.astype(batches.input_dtype(state.model)))
  device_labels = jax.device_put(labels)
  ensemble = bool(ensemble_size)
  runs = {
    "floor": lambda: _floor(
      state, device_images, device_labels, key,
      num_steps=num_steps, batch_size=batch_size, ensemble=ensemble,
    ),
    "fit": lambda: fit(state, data, None, key).params,
    "fit+data": lambda: fit(state, images, labels, key).params,
    "host loop": lambda: _host_loop(
      state, images, labels, key, num_steps, batch_size, ensemble
    ).params,
  }  # fmt: skip
  examples = num_steps * batch_size * max(ensemble_size, 1)
  rates = {way: examples / seconds for way, seconds in _best(runs, repeats).items()}
  slow = train.slow_in_cpu_loops(state.model, images.shape[1:])
  return rates | {"per call": train.pick_steps_per_call(per_call, slow_in_loops=slow)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="the CPU cases (MLP, small CNN)")
  parser.add_argument("--models", default="resnet20,wrn16_4")
  parser.add_argument("--batch_sizes", default="128,512")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--ensemble_size", type=int, default=5, help="members (0: none)")
  parser.add_argument("--ensemble_batch_sizes", default="128", help="ensembles at these only")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--num_examples", type=int, default=50000)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--steps_per_call", type=int, default=None, help="fit's; default: by backend")
  args = parser.parse_args()
  if args.quick:  # MLP: the case; CNN: the main job's, few steps (its scan is slow)
    cases = [("mlp", 128, "float32", 0, 500), ("mlp", 128, "bfloat16", 0, 500)]
    cases += [("mlp", 128, "float32", 4, 200), ("cnn", 128, "float32", 0, 20)]
    num_examples = 60000
  else:
    cases = [
      (name, int(b), dtype, members, args.steps)
      for name in args.models.split(",")
      for b in args.batch_sizes.split(",")
      for dtype in args.dtypes.split(",")
      for members in (0, args.ensemble_size)
      if members == 0 or (members and b in args.ensemble_batch_sizes.split(","))
    ]
    num_examples = args.num_examples
  device = jax.devices()[0]
  print(
    f"# {device.device_kind} ({jax.default_backend()}), {jax.device_count()} device(s);"
    f" jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__},"
    f" python {platform.python_version()}; N = {num_examples}, best of {args.repeats}"
  )
  print("\n| network | batch | dtype | members | steps | floor | fit | fit / floor "
        "| fit+data | host loop | fit's steps per call |")  # fmt: skip
  print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  for name, batch_size, dtype, members, steps in cases:
    rates = _case(
      name, batch_size, dtype, members, steps, num_examples, args.repeats, args.steps_per_call
    )
    print(
      f"| {name} | {batch_size} | {dtype} | {members or 1} | {steps} | {rates['floor']:,.0f}"
      f" | {rates['fit']:,.0f} | {rates['fit'] / rates['floor']:.0%} | {rates['fit+data']:,.0f}"
      f" | {rates['host loop']:,.0f} | {rates['per call']} |",
      flush=True,
    )


if __name__ == "__main__":
  main()
