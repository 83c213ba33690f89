"""The README's examples run as written, and print what the README says."""

import contextlib
import io
import pathlib
import re

import pytest

from top1_jax.io import idx

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _tested_blocks():
  text = README.read_text()
  return re.findall(r"<!-- tested -->\n```python\n(.*?)```", text, flags=re.S)


def test_readme_marks_its_runnable_examples():
  assert len(_tested_blocks()) == 4


@pytest.mark.parametrize("index", range(4))
def test_readme_example_runs(index, tmp_path, monkeypatch):
  block = _tested_blocks()[index]
  if "load_dataset" in block and not (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists():
    pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
  monkeypatch.chdir(tmp_path)  # examples that write files write them here
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(block, f"README block {index}", "exec"), {})
  if "cross_validate" in block:
    printed = out.getvalue().splitlines()
    promised = README.read_text().split("prints (the test suite runs this block):\n\n```\n")[1]
    promised = promised.split("```")[0].splitlines()
    # Every line but the decomposition (whose Array reprs the README abbreviates).
    keep = [i for i, line in enumerate(promised) if not line.startswith("Decomposition")]
    assert [printed[i] for i in keep] == [promised[i] for i in keep]
