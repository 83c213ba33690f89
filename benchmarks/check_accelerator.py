"""Does the accelerator give the CPU's numbers? MC dropout, ensembles, training.

Runs on the default backend (a GPU or TPU when jax has one) and again on the
host CPU backend of the same process, and compares:

1. ``mc.predict`` MC dropout (CNN, S = 8, rate 0.05): the masks come from the
   same keys on both backends, so only float rounding may differ;
2. ``mc.predict`` of a stacked 3-member ensemble with the strategy each backend
   picks (``vmap`` on an accelerator, ``loop`` on CPU);
3. ``train.fit_ensemble`` for a few steps by one vmapped step vs member after
   member, on the accelerator: with SGD in full float32 precision (and, for
   information, with Adam and at the backend's default precision).

Accelerators may multiply float32 in reduced precision (TF32 on NVIDIA GPUs)
unless told otherwise, so each comparison prints its largest difference and
checks it against a tolerance meant for that, plus exact agreement of the
predicted classes on nearly all examples. Exits 1 when a check fails.

  python benchmarks/check_accelerator.py
"""

import sys
import time

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from top1_jax.engine import mc, models, train


def _report(name: str, ok: bool, detail: str) -> bool:
  print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
  return ok


def _relative_diff(a: np.ndarray, b: np.ndarray) -> float:
  """max |a - b| relative to max |b|."""
  return float(np.max(np.abs(a - b)) / max(1e-12, float(np.max(np.abs(b)))))


def _compare(name: str, a: mc.SampleSummary, b: mc.SampleSummary, *, atol: float) -> bool:
  probs_diff = float(np.max(np.abs(a.mean_probs - b.mean_probs)))
  same_class = float(np.mean(a.mean_probs.argmax(1) == b.mean_probs.argmax(1)))
  score_diffs = {k: _relative_diff(a.scores[k], b.scores[k]) for k in b.scores}
  worst = max(score_diffs, key=score_diffs.get)
  ok = probs_diff <= atol and same_class >= 0.99 and score_diffs[worst] <= 50 * atol
  return _report(
    name,
    ok,
    f"max |mean prob diff| {probs_diff:.2e}, same class {same_class:.4f},"
    f" worst score {worst} rel. diff {score_diffs[worst]:.2e}",
  )


def main() -> int:
  backend = jax.default_backend()
  print(f"jax {jax.__version__}; default backend {backend}: {jax.devices()}")
  if backend == "cpu":
    print("no accelerator: comparing the CPU with itself")
  accel = Mesh(np.asarray(jax.devices()), ("batch",))
  host = Mesh(np.asarray(jax.devices("cpu")[:1]), ("batch",))
  print(f"ensemble strategy picked here: {mc.pick_strategy()}")

  rng = np.random.default_rng(0)
  x = rng.random((1000, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 10, 1000).astype(np.int32)
  model = models.CNN()
  apply_fn = models.make_apply_fn(model)
  # A few steps of training so that the logits are not all near zero.
  state = train.create_train_state(model, optax.adam(1e-3), jax.random.key(1), x[:1])
  state = train.fit(state, x, y, jax.random.key(2), num_steps=20, batch_size=100)
  variables = state.variables
  atol = 2e-3  # float32 with TF32 products on one side

  ok = True
  kwargs = dict(key=jax.random.key(3), num_samples=8, rate=0.05)
  start = time.perf_counter()
  on_accel = mc.predict(apply_fn, variables, x, mesh=accel, **kwargs)
  accel_s = time.perf_counter() - start
  on_host = mc.predict(apply_fn, variables, x, mesh=host, **kwargs)
  ok &= _compare(f"MC dropout S=8 ({accel_s:.1f} s incl. compile)", on_accel, on_host, atol=atol)

  members = train.init_ensemble(model, optax.adam(1e-3), jax.random.key(4), x[:1], ensemble_size=3)
  stacked = members.variables
  ens_accel = mc.predict(apply_fn, stacked, x, ensemble=True, mesh=accel)
  ens_host = mc.predict(apply_fn, stacked, x, ensemble=True, mesh=host, strategy="loop")
  ok &= _compare("ensemble of 3", ens_accel, ens_host, atol=atol)

  # Adam divides by the gradient's running RMS, so rounding differences in
  # near-zero gradients can move a parameter by up to the learning rate per step
  # (shown for information); plain SGD is linear in the gradients, so in full
  # float32 the two strategies must agree closely.
  for optimizer, precision, tolerance in (
    ("adam", "default", None),
    ("sgd", "default", None),
    ("sgd", "float32", 1e-5),
  ):
    tx = optax.adam(1e-3) if optimizer == "adam" else optax.sgd(0.05)
    members = train.init_ensemble(model, tx, jax.random.key(4), x[:1], ensemble_size=3)
    with jax.default_matmul_precision(None if precision == "default" else precision):
      fitted = {
        strategy: train.fit_ensemble(
          members, x, y, jax.random.key(5), num_steps=5, batch_size=100, strategy=strategy
        ).params
        for strategy in ("vmap", "loop")
      }
    diffs = jax.tree_util.tree_map(
      lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
      fitted["vmap"],
      fitted["loop"],
    )
    worst = max(jax.tree_util.tree_leaves(diffs))
    name = f"fit_ensemble vmap vs loop, 5 {optimizer} steps, {precision} precision"
    if tolerance is None:
      print(f"info {name}: max |param diff| {worst:.2e}")
    else:
      ok &= _report(name, worst <= tolerance, f"max |param diff| {worst:.2e}")
  print("all checks passed" if ok else "SOME CHECKS FAILED")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
