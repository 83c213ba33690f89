"""Install top1_jax: `pip install -e .` (add `[dev]` for tests, `[tf]` to build TFDS datasets)."""

import pathlib
import re

import setuptools

_HERE = pathlib.Path(__file__).parent


def _requirements(name: str) -> list[str]:
  lines = (_HERE / name).read_text().splitlines()
  return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "-r"))]


_VERSION = re.search(
  r'__version__ = "([^"]+)"', (_HERE / "top1_jax" / "__init__.py").read_text()
).group(1)

setuptools.setup(
  name="top1_jax",
  version=_VERSION,
  description="Calibrated Top-1 uncertainty for classifiers by binning a score (JAX).",
  long_description=(_HERE / "README.md").read_text(),
  long_description_content_type="text/markdown",
  packages=setuptools.find_packages(include=["top1_jax", "top1_jax.*"]),
  python_requires=">=3.10",
  install_requires=_requirements("requirements.txt"),
  extras_require={
    "dev": _requirements("requirements-dev.txt"),
    # Building (download_and_prepare) a TFDS dataset needs TensorFlow;
    # reading an already prepared one does not.
    "tf": ["tensorflow-cpu"],
  },
)
