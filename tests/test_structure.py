"""The library's layout rules, checked on the source (see docs/architecture.md).

The layers are the folders of ``top1_jax/``; ``MAY_IMPORT`` says which folders each
may import besides itself, and every rule below is derived from it:

* imports only go down the layers, and no circle runs between modules;
* files by concept: no module only re-exports others' names, no module name is used more
  than twice (in the package and ``experiments/``), no function over 80 lines, and each
  experiment main at most 80 lines;
* no module reaches into another module's ``_private`` names (tests too, but for the
  oracle tests that check a private kernel against the plain-loop reference);
* only ``io/`` and ``plots/`` (and the command line, ``launch/``) touch files; nothing
  below the command line imports ``launch``;
* ``import top1_jax`` needs only jax and numpy (``tests/test_api.py``).
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "top1_jax"

_BELOW_CORE = {"kernels", "version"}
_MATHS = {"core", "estimators", "evaluation"} | _BELOW_CORE
MAY_IMPORT = {
  "version": set(),
  "kernels": set(),
  "core": {"kernels", "version"},
  "estimators": {"core"} | _BELOW_CORE,
  "evaluation": {"estimators", "core"} | _BELOW_CORE,
  "engine": {"core"} | _BELOW_CORE,
  "io": {"engine"} | _MATHS,
  "plots": {"io"} | _MATHS,
  "pipeline": {"io", "engine", "plots", "configs"} | _MATHS,
  "calibrator": {"io", "plots"} | _MATHS,
  "set_predictor": {"io"} | _MATHS,
  "configs": set(),
  "launch": {"calibrator", "pipeline", "plots", "io", "engine", "configs"} | _MATHS,
  "__init__": {"calibrator", "set_predictor", "io", "version"} | _MATHS,
}
"""Each layer (a folder, or a module at the top of the package) and what it may import."""

MATHS_MAY_IMPORT = {"jax", "numpy", "scipy", "functools", "math", "collections", "typing"}
MATHS_MAY_IMPORT |= {"statistics", "contextlib", "fractions", "re", "dataclasses", "abc", "types"}
MATHS_MAY_IMPORT |= {"warnings"}
"""What the maths layers (kernels, core, estimators, evaluation) import from outside."""

FILE_TOUCHERS = ("io", "plots")
FILE_APIS = {"open", "os", "pathlib", "shutil", "tempfile", "etils", "orbax", "glob"}

ORACLE_TESTS = {"test_binning.py", "test_baselines.py", "test_metrics.py"}
"""Tests that compare a private kernel with the plain-loop reference (tests/reference.py)."""


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


def _module(path: pathlib.Path) -> str:
  return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _layer(module: str) -> str:
  """``top1_jax.core.binning`` -> core; ``top1_jax.calibrator`` -> calibrator."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def _library_imports(path: pathlib.Path) -> set[str]:
  """The top1_jax modules and packages a file imports (``from top1_jax.core import x``
  -> top1_jax.core.x; ``from top1_jax import __version__`` -> top1_jax)."""
  known = {_module(p).removesuffix(".__init__") for p in _python_files(LIBRARY)}
  found = set()
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("top1_jax"):
      for alias in node.names:
        name = f"{node.module}.{alias.name}"
        found.add(name if name in known else node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("top1_jax")}
  return found


LIBRARY_FILES = _python_files(LIBRARY)


def test_every_folder_is_a_layer():
  folders = {p.name for p in LIBRARY.iterdir() if p.is_dir() and p.name != "__pycache__"}
  modules = {p.stem for p in LIBRARY.glob("*.py")}
  assert folders | modules == set(MAY_IMPORT)


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=_module)
def test_imports_only_go_down(path):
  layer = _layer(_module(path))
  upward = {
    m
    for m in _library_imports(path)
    if m != "top1_jax" and _layer(m) not in MAY_IMPORT[layer] | {layer}
  }
  upward |= {m for m in _library_imports(path) if m == "top1_jax" and layer != "__init__"}
  assert upward == set(), f"{layer} may import {sorted(MAY_IMPORT[layer])}"


def test_no_circles_between_modules():
  graph = {}
  for path in LIBRARY_FILES:
    module = _module(path).removesuffix(".__init__")
    graph[module] = {m for m in _library_imports(path) if m != module}
  done, active, circles = set(), [], []

  def visit(module):
    if module in active:
      circles.append(" -> ".join(active[active.index(module) :] + [module]))
      return
    if module in done:
      return
    active.append(module)
    for target in graph.get(module, ()):
      if not module.startswith(f"{target}."):  # a package's modules import its siblings
        visit(target)
    active.pop()
    done.add(module)

  for module in graph:
    visit(module)
  assert circles == []


EXPERIMENTS = _python_files(ROOT / "experiments")


@pytest.mark.parametrize("path", LIBRARY_FILES + EXPERIMENTS, ids=_module)
def test_functions_are_small(path):
  for node in ast.walk(_tree(path)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = node.end_lineno - node.lineno + 1
      assert length <= 80, f"{path.name}:{node.lineno} {node.name}: {length} lines"


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=_module)
def test_no_module_only_re_exports(path):
  # A module has a job of its own: it defines something (a package's __init__, the
  # public face of its folder, may gather its modules' names).
  if path.name == "__init__.py":
    return
  tree = _tree(path)
  defines = [
    node
    for node in tree.body
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))
    and not (
      isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
    )
  ]
  assert defines, f"{_module(path)} defines nothing: it only re-exports"


def test_no_module_name_is_used_more_than_twice():
  stems = [p.stem for p in LIBRARY_FILES + EXPERIMENTS if p.name != "__init__.py"]
  repeated = {stem: stems.count(stem) for stem in stems if stems.count(stem) > 2}
  assert repeated == {}


def test_experiments_are_short_mains_outside_the_package():
  # Flax's main.py: flags, config, one call into the package; not installed.
  assert EXPERIMENTS, "experiments/ holds the stages' mains"
  for path in EXPERIMENTS:
    lines = len(path.read_text().splitlines())
    assert lines <= 80 and 'if __name__ == "__main__":' in path.read_text(), path.name


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
  [
    p
    for p in _python_files(LIBRARY, ROOT / "benchmarks", ROOT / "tests")
    if p.name not in ORACLE_TESTS
  ],
  ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_reach_ins_into_private_names(path):
  assert _private_reach_ins(path) == []


@pytest.mark.parametrize(
  "path", [p for p in LIBRARY_FILES if _layer(_module(p)) in _MATHS], ids=_module
)
def test_maths_imports_only_arrays(path):
  outside = {
    module
    for module in _imported_modules(_tree(path))
    if module.split(".")[0] not in MATHS_MAY_IMPORT | {"top1_jax"}
  }
  assert outside == set(), f"{_module(path)} imports {sorted(outside)}"


@pytest.mark.parametrize("path", LIBRARY_FILES, ids=_module)
def test_only_io_and_plots_touch_files(path):
  if _layer(_module(path)) in FILE_TOUCHERS + ("launch",):
    return
  tree = _tree(path)
  imported = {m.split(".")[0] for m in _imported_modules(tree)}
  calls_open = any(
    isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
    for node in ast.walk(tree)
  )
  assert not (imported & FILE_APIS) and not calls_open, sorted(imported & FILE_APIS)


LAUNCHER_LINES = 150
"""The most lines of one module of the command line (flags, help, a tool's main); runner.py,
the shared runner with the process plumbing (one-line errors, the lock, Ctrl-C and
SIGTERM, a full disk), may have 400."""


def test_the_command_line_stays_thin():
  # The command line parses flags and settings, logs and calls the pipeline or library.
  for path in _python_files(LIBRARY / "launch"):
    lines = len(path.read_text().splitlines())
    assert lines <= (400 if path.name == "runner.py" else LAUNCHER_LINES), f"{path.name}: {lines}"


def _top_level_names(path: pathlib.Path) -> set[str]:
  """What a module defines or imports at its top level (a static import's targets)."""
  names = set()
  for node in _tree(path).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names |= {(a.asname or a.name).split(".")[0] for a in node.names}
  return names


def _missing_library_names(path: pathlib.Path) -> list[str]:
  """The ``top1_jax`` modules and names ``path`` imports that the library does not have."""
  files = {_module(p).removesuffix(".__init__"): p for p in LIBRARY_FILES}
  missing = []
  for node in ast.walk(_tree(path)):
    if isinstance(node, ast.Import):
      missing += [
        a.name for a in node.names if a.name.startswith("top1_jax.") and a.name not in files
      ]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("top1_jax"):
      if node.module not in files:
        missing.append(node.module)
        continue
      defined = _top_level_names(files[node.module])
      missing += [
        f"{node.module}.{a.name}"
        for a in node.names
        if a.name not in defined and f"{node.module}.{a.name}" not in files
      ]
  return missing


@pytest.mark.parametrize(
  "path",
  _python_files(ROOT / "benchmarks", ROOT / "experiments"),
  ids=lambda p: str(p.relative_to(ROOT)),
)
def test_benchmarks_and_mains_import_what_the_library_has(path):
  # The suite does not run the benchmarks: a module they import must not vanish unnoticed.
  assert _missing_library_names(path) == []
