"""Shared pytest set-up: CPU only, deterministic, no network."""

import atexit
import collections
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One CPU device, also in the launchers the tests start (evaluate would take one per
# core, a longer start-up per run; tests/test_scale.py checks those devices' scores).
# And XLA's backend optimisation level 0 with its older loop emitters (not the fusion
# emitters): the suite compiles hundreds of programs over tiny arrays, where compiling a
# program costs more than running it (the emitters: pytest 656 -> 517-588 s, fresh clone).
# Results agree to float32 rounding, and every assertion is a tolerance or compares
# programs compiled alike; the one bit-for-bit claim across array shapes is checked
# with XLA's fusion emitters (tests/test_sets.py, in a child process).
# Processes the tests start keep these flags (tests/processes.xla_flags), with their own
# device counts.
os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0"
  " --xla_cpu_use_fusion_emitters=false",
)
# JAX's persistent compilation cache (the launchers turn it on: top1_jax.launch.runner) in
# a folder of this test process, inherited by the launchers it starts: later launcher
# runs reuse earlier ones' programs, as a user's reruns do, and the home folder is left
# alone.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="top1-test-xla-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# jit compiles on first call, so the first example of a property test is slow.
settings.register_profile("default", deadline=None, max_examples=60, print_blob=True)
settings.load_profile("default")


# Fixtures of the top1_jax.io tests. Their imports are inside, as TFDS is slow to import.


@pytest.fixture
def no_system_fmnist(monkeypatch, tmp_path):
  """Points the Debian Fashion-MNIST directory at an empty folder."""
  from top1_jax.io import idx

  empty = tmp_path / "no-system-fashion-mnist"
  empty.mkdir()
  monkeypatch.setattr(idx, "FASHION_MNIST_DIR", empty)
  return empty


@pytest.fixture
def offline(monkeypatch):
  """No TensorFlow, no network, and TFDS must never try to download."""
  import tensorflow_datasets as tfds

  from top1_jax.io import tfds as tfds_lib

  monkeypatch.setattr(tfds_lib, "tensorflow_available", lambda: False)
  monkeypatch.setattr(tfds_lib, "network_available", lambda *a, **k: False)

  def forbidden(*args, **kwargs):
    pytest.fail("download_and_prepare must not be called when data cannot be fetched")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", forbidden)


# Files that hold the most slow tests (``@pytest.mark.slow``: launchers end to end,
# training, several processes) run first: with one file per xdist worker (test.sh), the
# workers then end within a few seconds of each other instead of one waiting out the
# end-to-end tests alone. The order is derived from the marks, so marking a test slow
# is all it takes; files without slow tests keep their collection order after them.


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the fast tier keeps the same order
def pytest_collection_modifyitems(items):
  slow_tests = collections.Counter(
    item.path.name for item in items if item.get_closest_marker("slow") is not None
  )
  items.sort(key=lambda item: -slow_tests[item.path.name])  # stable: a file keeps its order


@pytest.fixture
def compiles():
  """A list that gets one entry per program XLA compiles (or loads from the cache)
  while the test runs, from JAX's own event."""
  from jax import monitoring

  seen, listening = [], [True]

  def count(event: str, seconds: float, **_) -> None:
    if listening[0] and event == "/jax/core/compile/backend_compile_duration":
      seen.append(seconds)

  monitoring.register_event_duration_secs_listener(count)
  yield seen
  listening[0] = False  # JAX keeps its listeners; this one stops counting
