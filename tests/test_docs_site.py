"""Adoptable beyond a clone: the documentation site builds offline with warnings as errors,
the README renders on a package index, and CITATION.cff is valid CFF 1.2.0."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPO = "https://github.com/top1-jax/top1_jax"


@pytest.mark.slow
def test_the_site_builds_offline_with_warnings_as_errors(tmp_path):
  """Every page of the nav, every docstring the API reference renders (Google style) and
  every link between them: a warning of any of them fails the build."""
  pytest.importorskip("mkdocstrings_handlers.python")  # requirements-dev.txt pins the tools
  site = tmp_path / "site"
  done = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", ROOT / "mkdocs.yml"]
    + ["--site-dir", site],
    capture_output=True,
    text=True,
    cwd=tmp_path,
  )
  warnings = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
  assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
  home = (site / "index.html").read_text()
  assert "Calibrate your model in ten lines" in home  # the README is the home page
  assert 'href="architecture/"' in home and 'src="images/' in home  # its links are the site's
  for page, names in {
    "top1_jax": ("calibrator.Calibrator.predict_proba", "set_predictor.SetPredictor.fit"),
    "core": ("scores.neg_log_pmax", "binning.fit", "metrics.ece"),
    "estimators": ("base.Estimator", "temperature.fit_splits"),
    "evaluation": ("protocol.evaluate", "crossval.cross_validate", "sets.evaluate_sets"),
    "pipeline": ("settings.Settings", "settings.parse", "sweep.run"),
  }.items():
    html = (site / f"reference/{page}/index.html").read_text()
    package = "top1_jax." if page == "top1_jax" else f"top1_jax.{page}."
    for name in names:
      assert f'id="{package}{name}"' in html, (page, name)
  assert (site / "sets/index.html").exists() and (site / "figures/sets_difficulty.png").exists()


# Markdown link or image targets, and HTML src/href attributes.
_TARGETS = re.compile(r"\]\(\s*<?([^)\s>]+)|\b(?:src|href)\s*=\s*[\"']([^\"']+)")


def test_the_readme_links_and_images_are_absolute():
  """A package index renders the README away from the repository: every link and image
  points at the repository by URL (images at their raw files, so that they show)."""
  text = (ROOT / "README.md").read_text()
  targets = [a or b for a, b in _TARGETS.findall(text)]
  assert len(targets) > 10  # the pattern sees the README's links
  relative = [t for t in targets if not re.match(r"(https?://|mailto:|#)", t)]
  assert not relative, f"relative links in README.md: {relative} (use {REPO}/blob/main/...)"
  images = re.findall(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)|<img[^>]*\bsrc\s*=\s*[\"']([^\"']+)", text)
  for image in [a or b for a, b in images]:
    assert image.startswith("https://raw.githubusercontent.com/top1-jax/top1_jax/main/"), image
    path = ROOT / image.split("/main/", 1)[1]
    assert path.is_file(), f"{image}: no {path.relative_to(ROOT)} in the repository"
  for link in targets:  # a repository link names a file or folder that exists
    if link.startswith(f"{REPO}/blob/main/") or link.startswith(f"{REPO}/tree/main/"):
      path = link.split("/main/", 1)[1].split("#")[0]
      assert (ROOT / path).exists(), link


def test_the_citation_is_valid_cff_and_names_the_paper_and_this_version():
  """CITATION.cff against the CFF 1.2.0 schema (cffconvert); the software's version is the
  package's, and the preferred citation is the paper with its four authors."""
  import yaml  # PyYAML: flax, ml_collections and mkdocs need it

  text = (ROOT / "CITATION.cff").read_text()
  cff = yaml.safe_load(text)
  version = re.search(r'__version__ = "(.+)"', (ROOT / "top1_jax/version.py").read_text())
  assert cff["cff-version"] == "1.2.0" and cff["version"] == version[1]  # no jax import
  assert cff["license"] == "Apache-2.0" and cff["type"] == "software"
  paper = cff["preferred-citation"]
  assert paper["title"].startswith("Calibrated Top-1 Uncertainty estimates for classification")
  assert [a["family-names"] for a in paper["authors"]] == [
    "Oberman",
    "Finlay",
    "Iannantuono",
    "Salvador",
  ]
  cffconvert = pytest.importorskip("cffconvert")  # requirements-dev.txt pins it
  cffconvert.Citation(text).validate()  # raises jsonschema's ValidationError
