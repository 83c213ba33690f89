"""The package people install: one top-level name, its configs inside, a licence,
metadata, and a console script per launcher (built offline from pyproject.toml)."""

import email
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
  out = tmp_path_factory.mktemp("dist")
  done = subprocess.run(
    [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
    check=True,
    capture_output=True,
    text=True,
    cwd=tmp_path_factory.mktemp("elsewhere"),
  )
  return {
    "wheel": next(out.glob("*.whl")),
    "sdist": next(out.glob("*.tar.gz")),
    "log": done.stdout + done.stderr,
  }


def test_the_wheel_installs_top1_jax_alone_with_its_configs_and_launchers(built):
  with zipfile.ZipFile(built["wheel"]) as wheel:
    names = wheel.namelist()
    top_level = {
      name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"top1_jax"}
    assert "top1_jax/configs/default.py" in names and "top1_jax/configs/quick.py" in names
    assert "top1_jax/launch/cli.py" in names and "top1_jax/pipeline/reproduce.py" in names
    assert not any(name.startswith("experiments/") for name in names)  # mains of a clone
    # top1_jax.load_example's files, and the README with their source and licence.
    for data in ("README.md", "lenet-5-cifar-10.npz", "densenet-bc-100-cifar-100.npz"):
      assert f"top1_jax/io/example_data/{data}" in names, data
    assert "top1_jax/plots/templates/page.html" in names  # the results page's template
    info = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(wheel.read(info))
    entry_points = wheel.read(info.replace("METADATA", "entry_points.txt")).decode()
    licence = [
      n for n in names if n.endswith(".dist-info/licenses/LICENSE") or n.endswith("/LICENSE")
    ]
  # PEP 639: an SPDX expression and the licence file, no legacy License field or classifier.
  assert metadata["License-Expression"] == "Apache-2.0" and metadata["License"] is None
  assert metadata.get_all("License-File") == ["LICENSE"]
  assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]
  assert licence, "the wheel carries the LICENSE file"
  assert metadata["Requires-Python"] == ">=3.10"
  assert any(url.startswith("Source") for url in metadata.get_all("Project-URL"))
  launchers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  for script, target in launchers.items():
    assert f"{script} = {target}" in entry_points
    module, _, function = target.partition(":")
    assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module
  # The core needs jax and numpy alone; everything else is an extra.
  core = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
  assert sorted(r.split(">")[0] for r in core) == ["jax", "numpy"]
  # top1-evaluate writes the results page: its template engine comes with the [cli] extra.
  assert any(
    r.startswith("jinja2") and 'extra == "cli"' in r for r in metadata.get_all("Requires-Dist")
  )


def test_the_sdist_has_the_licence_changelog_readme_and_citation(built):
  with tarfile.open(built["sdist"]) as sdist:
    names = {pathlib.PurePosixPath(n).name for n in sdist.getnames()}
  assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "CITATION.cff"} <= names


def test_the_build_warns_of_nothing_deprecated(built):
  """setuptools' deprecations (a `project.license` table, licence classifiers) are fixed
  before they become errors."""
  warned = [line for line in built["log"].splitlines() if "deprecat" in line.lower()]
  assert not warned, warned
