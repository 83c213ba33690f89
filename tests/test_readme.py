"""The examples of the README, docs/api.md and docs/results.md run as written, and print
what they say.

Every ```python block right after a `<!-- tested -->` line is executed, from a fresh
temporary folder (the example data comes from `top1_jax.load_example`, not the clone).
When the block is followed by "prints (the test suite runs this block):" and a ```
block, the printed lines must equal those.
"""

import contextlib
import io
import pathlib
import re
import subprocess
import sys

import pytest

from top1_jax.io import idx

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Each file with tested blocks, and how many it has (a lost marker is a failure).
EXPECTED = {"README.md": 4, "docs/api.md": 3, "docs/results.md": 1}
PRINTS = "prints (the test suite runs this block):"

_BLOCK = re.compile(
  r"<!-- tested -->\n```python\n(.*?)```\n"
  r"(?:\n" + re.escape(PRINTS) + r"\n\n```\n(.*?)```)?",
  flags=re.S,
)


def _tested_blocks(name):
  return _BLOCK.findall((ROOT / name).read_text())


def _trains(name, index):
  """Whether a block trains a network (docs/api.md's models example): a slow test."""
  blocks = _tested_blocks(name)
  return index < len(blocks) and "train.fit" in blocks[index][0]


CASES = [
  pytest.param(name, i, id=f"{name}:{i}", marks=[pytest.mark.slow] if _trains(name, i) else [])
  for name, count in EXPECTED.items()
  for i in range(count)
]


@pytest.mark.parametrize("name", EXPECTED)
def test_docs_mark_their_runnable_examples(name):
  assert len(_tested_blocks(name)) == EXPECTED[name]


def test_the_readme_promises_printed_output():
  promised = [printed for _, printed in _tested_blocks("README.md") if printed]
  assert len(promised) == 3  # the practitioner's Calibrator, under shift, and cross_validate


@pytest.mark.parametrize(("name", "index"), CASES)
def test_example_runs_and_prints_what_it_says(name, index, tmp_path, monkeypatch):
  block, promised = _tested_blocks(name)[index]
  if "load_dataset" in block and not (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists():
    pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
  monkeypatch.chdir(tmp_path)  # examples that write files write them here
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(block, f"{name} block {index}", "exec"), {})
  if promised:
    printed = out.getvalue().splitlines()
    promised = promised.splitlines()
    assert printed == promised, out.getvalue()


@pytest.mark.slow
def test_the_quick_start_runs_from_a_folder_outside_the_clone(tmp_path):
  # A user's own folder, in a fresh interpreter: nothing of the clone on the path but the
  # installed package, so the example data must come from inside it.
  assert ROOT not in tmp_path.resolve().parents
  block, promised = _tested_blocks("README.md")[0]
  out = subprocess.run(
    [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == promised.splitlines()
  assert (tmp_path / "calibrator.json").is_file()
