"""The library's layout rules, checked on the source (see docs/architecture.md).

* no library file over 600 lines, no function over 100 lines;
* no module reaches into another module's ``_private`` names;
* the maths imports no models, files, flags or plotting;
* the library never imports ``experiments``;
* only the I/O package and the plots touch files;
* the launchers (experiments/) stay under 1,200 lines.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "top1_jax"
MATHS = ("baselines", "binning", "crossval", "events", "metrics", "mislabeled", "scores")
MATHS += ("isotonic", "kde")
MATHS += ("selective", "toplabel")
MATHS += ("bincount",)
MATHS += ("comparison", "temperature")
MATHS += ("chunked",)
MATHS += ("covariance", "rowblocks", "order", "jitting")
MATHS += ("aggregate", "tables")
MATHS_MAY_IMPORT = {"jax", "numpy", "fractions", "functools", "re", "math", "collections", "typing"}
MATHS_MAY_IMPORT |= {"statistics"}  # the standard library's, e.g. a normal quantile on the host
MATHS_MAY_IMPORT |= {"contextlib"}
MATHS_MAY_IMPORT |= {"scipy"}  # installed with jax, which depends on it
FILE_TOUCHERS = ("io", "plots")
FILE_APIS = {"open", "os", "pathlib", "shutil", "tempfile", "etils", "orbax", "glob"}


def _python_files(*folders: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for folder in folders for p in folder.rglob("*.py"))


def _tree(path: pathlib.Path) -> ast.Module:
  return ast.parse(path.read_text(), filename=str(path))


def _imported_modules(tree: ast.Module) -> set[str]:
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names |= {f"{node.module}.{alias.name}" for alias in node.names}
  return names


def _library_module(path: pathlib.Path) -> str:
  return ".".join(path.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", _python_files(LIBRARY), ids=_library_module)
def test_library_files_and_functions_are_small(path):
  lines = len(path.read_text().splitlines())
  assert lines <= 600, f"{path.name}: {lines} lines"
  for node in ast.walk(_tree(path)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = node.end_lineno - node.lineno + 1
      assert length <= 100, f"{path.name}:{node.lineno} {node.name}: {length} lines"


def _private_reach_ins(path: pathlib.Path) -> list[str]:
  """``module._name`` where ``module`` is a top1_jax module imported by this file."""
  tree = _tree(path)
  aliases = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("top1_jax"):
      aliases |= {alias.asname or alias.name for alias in node.names}
      if any(a.name.startswith("_") and not a.name.startswith("__") for a in node.names):
        return [f"from {node.module} import a private name"]
    elif isinstance(node, ast.Import):
      aliases |= {a.asname or a.name for a in node.names if a.name.startswith("top1_jax")}
  return [
    f"{path.name}:{node.lineno} {node.value.id}.{node.attr}"
    for node in ast.walk(tree)
    if isinstance(node, ast.Attribute)
    and isinstance(node.value, ast.Name)
    and node.value.id in aliases
    and node.attr.startswith("_")
    and not node.attr.startswith("__")
  ]


@pytest.mark.parametrize(
  "path",
  _python_files(LIBRARY, ROOT / "experiments", ROOT / "benchmarks"),
  ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_reach_ins_into_private_names(path):
  assert _private_reach_ins(path) == []


@pytest.mark.parametrize("name", MATHS)
def test_maths_imports_only_arrays(name):
  imported = _imported_modules(_tree(LIBRARY / f"{name}.py"))
  outside = {
    module
    for module in imported
    if module.split(".")[0] not in MATHS_MAY_IMPORT and module.split(".")[0] != "top1_jax"
  }
  assert outside == set(), f"{name} imports {sorted(outside)}"
  library = {m.split(".")[1] for m in imported if m.startswith("top1_jax.")}
  assert library <= set(MATHS) | {"validation"}, f"{name} imports {sorted(library)}"


@pytest.mark.parametrize("path", _python_files(LIBRARY), ids=_library_module)
def test_library_never_imports_experiments(path):
  assert not any(m.split(".")[0] == "experiments" for m in _imported_modules(_tree(path)))


@pytest.mark.parametrize("path", _python_files(LIBRARY), ids=_library_module)
def test_only_io_and_plots_touch_files(path):
  if path.relative_to(LIBRARY).parts[0] in FILE_TOUCHERS:
    return
  tree = _tree(path)
  imported = {m.split(".")[0] for m in _imported_modules(tree)}
  calls_open = any(
    isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
    for node in ast.walk(tree)
  )
  assert not (imported & FILE_APIS) and not calls_open, sorted(imported & FILE_APIS)


def test_launchers_stay_thin():
  # The launchers parse settings, log and call the library; what they compute lives there.
  lines = sum(len(p.read_text().splitlines()) for p in _python_files(ROOT / "experiments"))
  assert lines < 1200, f"experiments/: {lines} lines"
