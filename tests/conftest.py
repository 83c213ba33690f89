"""Shared pytest set-up: CPU only, deterministic, no network."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

# jit compiles on first call, so the first example of a property test is slow.
settings.register_profile("default", deadline=None, max_examples=60, print_blob=True)
settings.load_profile("default")
