"""A run's results page: one static ``index.html`` that opens from disk, rendered through the
package's autoescaped Jinja template (``templates/page.html``): the answer first, the details
folded. Figures are linked by relative paths, so the folder can be moved as a whole."""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from top1_jax.core import validation
from top1_jax.io import files
from top1_jax.plots import results

if TYPE_CHECKING:  # etils only for a URL (io.files): the plots extra is matplotlib alone
  from etils import epath

PAGE_NAME = "index.html"

_NUMBER = re.compile(r"^[-−+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?(%|/\d+)?( ± .*| →.*| \(.*| †)?$")


class Table(NamedTuple):
  """A table of the page, its cells already text (the page escapes them); ``note`` is a
  sentence under the heading."""

  title: str
  header: Sequence[str]
  rows: Sequence[Sequence[str]]
  note: str = ""


def _numeric(table: Table) -> list[bool]:
  """Columns whose cells all read as numbers ("–" for none): right-aligned."""
  return [
    any(cell != "–" for cell in column)
    and all(cell == "–" or _NUMBER.match(cell) for cell in column)
    for column in zip(*table.rows, strict=True)
  ] or [False] * len(table.header)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """Nested mappings as (dotted key, leaf value) pairs, in their order."""
  if isinstance(value, Mapping) and value:
    pairs = []
    for key, inner in value.items():
      pairs += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    return pairs
  return [(prefix, value)]


def _text(value: Any) -> str:
  return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _seconds(value: Any) -> str:
  return f"{value:.2f}" if isinstance(value, (int, float)) else _text(value)


@functools.cache
def _template():
  import jinja2  # the plots and cli extras; a figure alone needs matplotlib only

  text = importlib.resources.files(__package__).joinpath("templates/page.html").read_text("utf-8")
  environment = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
  )
  environment.filters["url"] = lambda path: urllib.parse.quote(path.replace(os.sep, "/"))
  environment.filters["numeric"] = _numeric
  return environment.from_string(text)


def results_page(
  title: str,
  *,
  intro: str = "",
  answer: Sequence[Table] = (),
  findings: Sequence[str] = (),
  key_figure: str | None = None,
  details: Sequence[Table] = (),
  figures: Sequence[str] = (),
  config: Mapping[str, Any] | None = None,
  timings: Mapping[str, Any] | None = None,
  links: Sequence[str] = (),
) -> str:
  """A static HTML page of a run (no scripts, no external resources): the answer first.

  Args:
    answer: the tables that answer the run's question, shown open with ``findings`` (sentences)
      and ``key_figure``; ``details`` (the other tables) are folded.
    figures: image paths relative to the page, folded by kind (``results.figure_groups``).
    config: the settings of the run; nested dicts (here and in ``timings``, seconds per
      stage) become dotted keys.
    links: the run's files to link, relative to the page (``results.csv``).

  Raises:
    ValueError: a title that is not a string, a table that is not a ``Table``,
      ``figures`` not a list of paths, or ``config`` / ``timings`` not a dict.
  """
  validation.instance("title", title, str, "a string")
  for table in [*answer, *details]:
    validation.instance("tables", table, Table, "plots.page.Table values")
  if isinstance(figures, (str, bytes)) or not isinstance(figures, Sequence):
    raise ValueError(
      f"figures: expected a list of paths relative to the page, got {type(figures).__name__}"
    )
  for name, value in (("config", config), ("timings", timings)):
    if value is not None:
      validation.instance(name, value, Mapping, "a dict or None")
  return _template().render(
    title=title, intro=intro, answer=list(answer), findings=[line for line in findings if line],
    key_figure=key_figure, details=list(details), links=list(links),
    groups=results.figure_groups([os.fspath(f) for f in figures]),
    config=[(key, _text(value)) for key, value in _flatten(config)] if config else [],
    timings=[(key, _seconds(value)) for key, value in _flatten(timings)] if timings else [],
  )  # fmt: skip


def write_results_page(
  out_dir: epath.PathLike,
  title: str,
  *,
  figures: Sequence[epath.PathLike] | None = None,
  key_figure: str | None = None,
  **content,
):
  """Writes ``results_page`` as ``out_dir/index.html`` (atomically); returns its path.

  Args:
    out_dir: the work dir (local path or URL).
    figures: images inside ``out_dir`` or relative to it; default every PNG under
      ``out_dir/figures`` by name (one left by an earlier sweep is shown too).
    key_figure: default ``results.key_figure(figures)``.
    **content: ``results_page``'s other arguments.

  Raises:
    ValueError: as ``results_page``, or a figure outside ``out_dir``.
  """
  out_dir = files.as_path(out_dir)
  if figures is None:
    folder = out_dir / "figures"
    figures = sorted(folder.glob("*.png"), key=lambda p: p.name) if folder.is_dir() else []
  if isinstance(figures, (str, bytes)):
    raise ValueError(f"figures: expected a list of paths, got {type(figures).__name__}")
  relative = []
  for path in map(files.as_path, figures):
    if path.is_absolute():
      try:
        path = path.relative_to(out_dir)
      except ValueError:
        raise ValueError(
          f"figures: {path} is outside {out_dir}; the page links figures by relative paths, "
          "so they move with it: save them under the work dir"
        ) from None
    relative.append(os.fspath(path))
  key_figure = results.key_figure(relative) if key_figure is None else key_figure
  text = results_page(title, figures=relative, key_figure=key_figure, **content)
  return files.write_bytes(out_dir / PAGE_NAME, text.encode("utf-8"))
