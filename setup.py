"""Install top1_jax.

  pip install .              # the core: scores, bins, metrics, cross-validation, Calibrator
  pip install '.[all]'       # + Flax models, datasets, figures and the top1-* command-line tools
  pip install '.[dev]'       # + the test tools

The exact versions the project is tested with are pinned in requirements.txt (the lock
file that run.sh, test.sh and CI install); the ranges here are what a user's environment
may bring.
"""

import pathlib
import re

import setuptools

_HERE = pathlib.Path(__file__).parent

_VERSION = re.search(
  r'__version__ = "([^"]+)"', (_HERE / "top1_jax" / "version.py").read_text()
).group(1)

_CORE = ["jax>=0.4.30", "numpy>=1.26"]
_EXTRAS = {
  "nn": ["flax>=0.10", "optax>=0.2.3", "orbax-checkpoint>=0.10"],
  "data": ["tensorflow-datasets>=4.9.4", "etils[epath]>=1.7", "importlib_resources>=6"],
  "plots": ["matplotlib>=3.8"],
  "cli": ["absl-py>=2.0", "ml_collections>=0.1.1"],
  # Building (download_and_prepare) a TFDS dataset needs TensorFlow; reading one does not.
  "tf": ["tensorflow-cpu"],
}
_EXTRAS["all"] = sorted({r for name in ("nn", "data", "plots", "cli") for r in _EXTRAS[name]})
_EXTRAS["dev"] = _EXTRAS["all"] + [
  "pytest>=8",
  "pytest-xdist>=3.5",
  "hypothesis>=6.100",
  "scipy>=1.11",
  "ruff>=0.6",
]

_LAUNCHERS = ("reproduce", "train", "predict", "evaluate", "find_mislabeled", "demo", "aggregate")

setuptools.setup(
  name="top1_jax",
  version=_VERSION,
  description="Calibrated Top-1 uncertainty for classifiers by binning a score (JAX).",
  long_description=(_HERE / "README.md").read_text(),
  long_description_content_type="text/markdown",
  packages=setuptools.find_packages(include=["top1_jax", "top1_jax.*"]),
  python_requires=">=3.10",
  install_requires=_CORE,
  extras_require=_EXTRAS,
  entry_points={
    "console_scripts": [
      f"top1-{name.replace('_', '-')} = top1_jax.launch.cli:{name}" for name in _LAUNCHERS
    ]
  },
)
