"""Runs ``mc.predict`` on one fixed case in a fresh process; writes the results.

The device set-up has to happen before jax initialises its backend, hence a
separate process:

  python tests/mc_device_worker.py sharded OUT.npz
      8 fake CPU devices (the parent sets XLA_FLAGS), an explicit 1-D mesh.
  python tests/mc_device_worker.py distributed OUT.npz PORT PROCESS_ID
      one of two processes (2 CPU devices each) joined with
      jax.distributed.initialize on 127.0.0.1:PORT; the default mesh spans all 4
      (MC dropout only).

The test module imports ``predictions_of_case`` to compute the reference in
its own (single-device) process.
"""

import os
import pathlib
import sys

import numpy as np

NUM_EXAMPLES = 37  # not a multiple of any device count: the last chunk is padded
CHUNK_SIZE = 16


def predictions_of_case(mesh=None, with_ensemble: bool = True) -> dict[str, np.ndarray]:
  """MC-dropout (and ensemble) predictions of a small fixed case."""
  import jax
  import jax.numpy as jnp

  from top1_jax.engine import mc, models

  # An MLP keeps the compile time of the worker processes low; the sharding code
  # path does not depend on the layer types.
  model = models.MLP(num_classes=5, hidden_sizes=(16, 8))
  apply_fn = models.make_apply_fn(model)
  sample = jnp.zeros((1, 28, 28, 1))
  variables = models.init(model, jax.random.key(0), sample)
  x = np.random.default_rng(0).normal(size=(NUM_EXAMPLES, 28, 28, 1))
  x = x.astype(np.float32)

  mc_pred = mc.predict(
    apply_fn,
    variables,
    x,
    key=jax.random.key(2),
    num_samples=4,
    rate=0.2,
    chunk_size=CHUNK_SIZE,
    keep_samples=True,
    mesh=mesh,
  )
  out = {"mc_logits": mc_pred.logits, "mc_mean_log_probs": mc_pred.mean_log_probs}
  out.update({f"mc_score_{k}": v for k, v in mc_pred.scores.items()})
  if with_ensemble:
    stacked = jax.vmap(lambda k: models.init(model, k, sample))(
      jax.random.split(jax.random.key(1), 3)
    )
    ens_pred = mc.predict(
      apply_fn,
      stacked,
      x,
      ensemble=True,
      chunk_size=CHUNK_SIZE,
      keep_samples=True,
      mesh=mesh,
      strategy="vmap",
    )
    out["ens_logits"] = ens_pred.logits
    out["ens_mean_log_probs"] = ens_pred.mean_log_probs
    out.update({f"ens_score_{k}": v for k, v in ens_pred.scores.items()})
  return out


def main(argv: list[str]) -> None:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
  mode, out_path = argv[1], argv[2]
  import jax

  if mode == "sharded":
    from jax.sharding import Mesh

    if jax.device_count() != 8:
      raise SystemExit(f"expected 8 fake devices, got {jax.device_count()}")
    results = predictions_of_case(Mesh(np.asarray(jax.devices()), ("batch",)))
    results["device_count"] = np.asarray(jax.device_count())
  elif mode == "distributed":
    port, process_id = int(argv[3]), int(argv[4])
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(
      coordinator_address=f"127.0.0.1:{port}",
      num_processes=2,
      process_id=process_id,
      initialization_timeout=60,
    )
    # MC dropout only: each extra compile costs both processes.
    results = predictions_of_case(with_ensemble=False)
    results["device_count"] = np.asarray(jax.device_count())
    results["process_count"] = np.asarray(jax.process_count())
  else:
    raise SystemExit(f"unknown mode {mode!r}")
  np.savez(out_path, **results)
  if mode == "distributed":
    jax.distributed.shutdown()


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main(sys.argv)
