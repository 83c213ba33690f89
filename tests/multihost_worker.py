"""One process of a two-process training run; the test compares it with one process.

  python tests/multihost_worker.py PORT PROCESS_ID WORKDIR

The parent starts two of these (2 fake CPU devices each, set by XLA_FLAGS) that
join with ``parallel.initialize`` on 127.0.0.1:PORT, train the case of
``train_case`` data-parallel over the 4 devices, save and restore it through
``RunCheckpoints`` in WORKDIR/checkpoints (shared by both), and write their
results to WORKDIR/process{PROCESS_ID}.npz.

The test module imports ``train_case`` to compute the reference in its own
one-device process.
"""

import os
import pathlib
import sys

import numpy as np

BATCH_SIZE = 24  # a multiple of the 4 devices
NUM_STEPS = 6  # 4 steps per epoch of 96 examples: crosses an epoch boundary


def _flat(prefix: str, tree) -> dict[str, np.ndarray]:
  import jax

  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {prefix + jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def train_case() -> tuple[object, dict[str, np.ndarray]]:
  """Trains a tiny MLP, and a 2-member ensemble by the vmapped step, on toy data.

  Returns:
    ``(state, arrays)``: the trained single network and, flattened, both
    trainings' parameters and the evaluation metrics.
  """
  import jax
  import jax.numpy as jnp
  import optax
  from toy_data import gaussian_blobs

  from top1_jax.engine import models, train

  images, labels = gaussian_blobs()
  model, tx = models.MLP(num_classes=4, hidden_sizes=(16,)), optax.adam(1e-2)
  kwargs = dict(num_steps=NUM_STEPS, batch_size=BATCH_SIZE, log_every=NUM_STEPS)
  create = lambda seed: train.create_train_state(
    model, tx, jax.random.key(seed), images[:1], dropout_rate=0.1
  )
  # Two members stacked by hand: init_ensemble's vmapped init would be one more compile.
  ensemble = jax.tree.map(lambda *leaves: jnp.stack(leaves), create(2), create(3))
  losses = []
  state = train.fit(create(0), images, labels, jax.random.key(1), callback=losses.append, **kwargs)
  ensemble = train.fit_ensemble(
    ensemble, images, labels, jax.random.key(4), strategy="vmap", **kwargs
  )
  single = train.evaluate(state, images, labels)
  together = train.evaluate_ensemble(ensemble, images, labels, strategy="vmap")
  arrays = {
    **_flat("fit", state.params),
    **_flat("ensemble", ensemble.params),
    "fit_loss": np.asarray(losses[-1]["loss"]),
    "evaluate": np.asarray([single["loss"], single["accuracy"]]),
    "evaluate_ensemble": np.asarray([together["loss"], together["accuracy"]]),
  }
  return state, arrays


def main(port: int, process_id: int, workdir: pathlib.Path) -> None:
  from top1_jax.engine import parallel

  parallel.initialize(f"127.0.0.1:{port}", 2, process_id)
  import jax
  import jax.numpy as jnp

  from top1_jax.engine import train
  from top1_jax.io import checkpoints

  state, results = train_case()
  results["device_count"] = np.asarray(jax.device_count())
  results["process_count"] = np.asarray(parallel.process_count())
  results["is_writer"] = np.asarray(parallel.is_writer())
  try:  # 10 rows do not split over 4 devices
    train.fit(
      state,
      np.zeros((12, 10), np.float32),
      np.zeros(12, int),
      jax.random.key(0),
      num_steps=1,
      batch_size=10,
    )
    results["batch_error"] = np.asarray("")
  except ValueError as e:
    results["batch_error"] = np.asarray(str(e))
  with checkpoints.RunCheckpoints(workdir / "checkpoints") as run:
    results["epoch_before"] = np.asarray(run.latest(state)[0])
    run.save(1, state)
    run.save(2, state)
    epoch, restored = run.latest(state.replace(params=jax.tree.map(jnp.zeros_like, state.params)))
  results["epoch_after"] = np.asarray(epoch)
  results.update(_flat("restored", restored.params))
  np.savez(workdir / f"process{process_id}.npz", **results)
  parallel.barrier("results written")


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  tests = pathlib.Path(__file__).resolve().parent
  sys.path[:0] = [str(tests.parent), str(tests)]
  main(int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]))
