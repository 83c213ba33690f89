"""A run's results page: one static ``index.html`` that opens from disk, no server.

``results_page`` turns a run's tables (its Markdown: ``results.md`` or
``aggregate.md``, Table 1 and the selective rows included), its figures (paths
relative to the page), its config and its timings into HTML text; every string
that comes from the run is escaped. ``write_results_page`` writes that text as
``index.html`` in the work dir through ``io.files.atomic_write``; ``write_run_page``
reads a finished evaluate's ``results.md`` and ``config.json`` for it. Figures are
linked by relative paths, so the folder can be moved or copied as a whole and the
page still shows them.

The Markdown read is the subset the tables are written in (``sweep.tables``,
``sweep.aggregate``): ``#`` headings, paragraphs, pipe tables whose ``---:``
columns are right-aligned, and inline ```code``` and ``*emphasis*``.
"""

from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from top1_jax.io import files

if TYPE_CHECKING:  # etils only for a URL (io.files): the plots extra is matplotlib alone
  from etils import epath

PAGE_NAME = "index.html"

_STYLE = """
body { font-family: system-ui, sans-serif; color: #222; max-width: 1180px;
       margin: 1.5em auto; padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; } h3 { font-size: 1.1em; }
nav ul { columns: 2; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.4em 0 1.2em; font-size: 0.85em; }
th, td { border: 1px solid #c8ced6; padding: 2px 7px; vertical-align: top; }
th { background: #e8eff7; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #f6f8fa; }
code { background: #f0f2f4; padding: 0 3px; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #dde; }
figcaption { font-size: 0.85em; color: #555; }
"""

_INLINE = (
  (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
  (re.compile(r"\*([^*\s][^*]*)\*"), r"<em>\1</em>"),
)


def _inline(text: str) -> str:
  """Escaped text with `code` and *emphasis*: markup is added only after escaping."""
  text = html.escape(text.strip(), quote=True)
  for pattern, replacement in _INLINE:
    text = pattern.sub(replacement, text)
  return text


def _cells(line: str) -> list[str]:
  return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> str:
  """A pipe table: header, alignment row (``---:`` right-aligned), body rows."""
  header = _cells(lines[0])
  rule = _cells(lines[1]) if len(lines) > 1 and set(lines[1]) <= set("|-: ") else None
  right = [bool(rule) and i < len(rule) and rule[i].endswith(":") for i in range(len(header))]
  body = lines[2:] if rule is not None else lines[1:]

  def row(cells: list[str], tag: str) -> str:
    parts = []
    for i, cell in enumerate(cells):
      align = ' class="num"' if i < len(right) and right[i] else ""
      parts.append(f"<{tag}{align}>{_inline(cell)}</{tag}>")
    return "<tr>" + "".join(parts) + "</tr>"

  rows = "\n".join(row(_cells(line), "td") for line in body)
  return f"<table>\n<thead>{row(header, 'th')}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>"


def _markdown(text: str) -> tuple[str, list[tuple[str, str]]]:
  """(HTML of the tables' Markdown, [(anchor, heading)] of its ## and ### headings)."""
  out, contents, block = [], [], []
  lines = text.splitlines() + [""]
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("|"):
      table = []
      while i < len(lines) and lines[i].startswith("|"):
        table.append(lines[i])
        i += 1
      out.append(_table(table))
      continue
    heading = re.match(r"(#{1,6}) (.*)", line)
    if heading or not line.strip():
      if block:
        out.append(f"<p>{_inline(' '.join(block))}</p>")
        block = []
    if heading:
      level, title = len(heading.group(1)), heading.group(2)
      anchor = f"section-{len(contents) + 1}"
      if level in (2, 3):  # the tables' headings (### in aggregate.md)
        contents.append((anchor, title))
      ident = f' id="{anchor}"' if level in (2, 3) else ""
      out.append(f"<h{level}{ident}>{_inline(title)}</h{level}>")
    elif line.strip():
      block.append(line)
    i += 1
  return "\n".join(out), contents


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """Nested mappings as (dotted key, leaf value) pairs, in their order."""
  if isinstance(value, Mapping) and value:
    pairs = []
    for key, inner in value.items():
      pairs += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    return pairs
  return [(prefix, value)]


def _key_value_table(pairs: list[tuple[str, str]], headers: tuple[str, str], right: bool) -> str:
  align = ' class="num"' if right else ""
  rows = "\n".join(
    f"<tr><td>{html.escape(key)}</td><td{align}>{html.escape(value)}</td></tr>"
    for key, value in pairs
  )
  head = f"<tr><th>{html.escape(headers[0])}</th><th{align}>{html.escape(headers[1])}</th></tr>"
  return f"<table>\n<thead>{head}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>"


def _text(value: Any) -> str:
  return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _seconds(value: Any) -> str:
  return f"{value:.2f}" if isinstance(value, (int, float)) else _text(value)


def _figure(path: str) -> str:
  src = html.escape(urllib.parse.quote(path.replace(os.sep, "/")), quote=True)
  name = html.escape(os.path.basename(path))
  return (
    f'<figure><a href="{src}"><img src="{src}" alt="{name}"></a>'
    f"<figcaption>{name}</figcaption></figure>"
  )


def _check(markdown, figures, config, timings) -> None:
  if not isinstance(markdown, str):
    raise ValueError(f"markdown: expected the tables' Markdown text, got {type(markdown).__name__}")
  if isinstance(figures, (str, bytes)) or not isinstance(figures, Sequence):
    raise ValueError(
      f"figures: expected a list of paths relative to the page, got {type(figures).__name__}"
    )
  for name, value in (("config", config), ("timings", timings)):
    if value is not None and not isinstance(value, Mapping):
      raise ValueError(f"{name}: expected a dict or None, got {type(value).__name__}")


def results_page(
  markdown: str,
  *,
  figures: Sequence[str] = (),
  config: Mapping[str, Any] | None = None,
  timings: Mapping[str, Any] | None = None,
  title: str | None = None,
) -> str:
  """A static HTML page of a run: its tables, figures, config and timings.

  Args:
    markdown: the run's tables as Markdown (``results.md``, ``aggregate.md``).
    figures: image paths relative to the page (``figures/ablation_top1.png``),
      shown in this order, each linked to its full-size file.
    config: the run's settings (``config.json``); nested dicts become dotted keys.
    timings: seconds per stage (``timings.json``); nested dicts become dotted keys.
    title: the page's title; default the Markdown's first ``#`` heading.

  Returns:
    The page's HTML text (UTF-8, no scripts, no external resources).

  Raises:
    ValueError: ``markdown`` not a string, ``figures`` not a list of paths, or
      ``config`` / ``timings`` not a dict.
  """
  _check(markdown, figures, config, timings)
  first = re.search(r"^# (.*)$", markdown, re.MULTILINE)
  title = title or (first.group(1) if first else "Results")
  body, contents = _markdown(markdown)
  sections = list(contents)
  parts = [] if first else [f"<h1>{_inline(title)}</h1>"]
  parts.append(body)
  if figures:
    sections.append(("figures", "Figures"))
    parts.append('<h2 id="figures">Figures</h2>')
    parts += [_figure(os.fspath(path)) for path in figures]
  if config:
    sections.append(("config", "Config"))
    pairs = [(key, _text(value)) for key, value in _flatten(config)]
    parts += ['<h2 id="config">Config</h2>', _key_value_table(pairs, ("field", "value"), False)]
  if timings:
    sections.append(("timings", "Timings"))
    pairs = [(key, _seconds(value)) for key, value in _flatten(timings)]
    parts += ['<h2 id="timings">Timings</h2>', _key_value_table(pairs, ("stage", "seconds"), True)]
  links = "".join(f'<li><a href="#{a}">{_inline(h)}</a></li>' for a, h in sections)
  nav = f"<nav><ul>{links}</ul></nav>" if sections else ""
  if first:  # the contents go under the Markdown's own title, before its text
    parts[0] = parts[0].replace("</h1>", f"</h1>\n{nav}", 1)
  else:
    parts.insert(1, nav)
  return (
    '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    f"<title>{html.escape(title.replace('`', ''))}</title>\n<style>{_STYLE}</style>\n"
    "</head>\n<body>\n" + "\n".join(parts) + "\n</body>\n</html>\n"
  )


def write_results_page(
  out_dir: epath.PathLike,
  markdown: str,
  figures: Sequence[epath.PathLike] | None = None,
  *,
  config: Mapping[str, Any] | None = None,
  timings: Mapping[str, Any] | None = None,
  title: str | None = None,
):
  """Writes ``results_page`` as ``out_dir/index.html`` (atomically); returns its path.

  Args:
    out_dir: the work dir (local path or URL).
    markdown: the run's tables as Markdown.
    figures: paths of the images to show, inside ``out_dir`` or relative to it;
      default every PNG under ``out_dir/figures``, sorted by name (a figure left
      there by an earlier sweep of another config is shown too).
    config: the run's settings.
    timings: seconds per stage.
    title: the page's title; default the Markdown's first ``#`` heading.

  Returns:
    The page's path (``pathlib.Path`` or ``epath.Path``).

  Raises:
    ValueError: as ``results_page``, or a figure outside ``out_dir``.
  """
  out_dir = files.as_path(out_dir)
  if figures is None:
    folder = out_dir / "figures"
    figures = sorted(folder.glob("*.png"), key=lambda p: p.name) if folder.is_dir() else []
  relative = []
  for path in figures:
    path = files.as_path(path)
    if path.is_absolute():
      try:
        path = path.relative_to(out_dir)
      except ValueError:
        raise ValueError(
          f"figures: {path} is outside {out_dir}; the page links figures by relative paths, "
          "so they move with it: save them under the work dir"
        ) from None
    relative.append(os.fspath(path))
  text = results_page(markdown, figures=relative, config=config, timings=timings, title=title)
  return files.write_bytes(out_dir / PAGE_NAME, text.encode("utf-8"))


def write_run_page(
  workdir: epath.PathLike,
  timings: Mapping[str, Any] | None = None,
  *,
  figures: Sequence[epath.PathLike] | None = None,
):
  """``write_results_page`` of a finished ``top1_jax.launch.evaluate`` work dir.

  Its tables from ``results.md``, its settings from ``config.json``.

  Args:
    workdir: the work dir (local path or URL).
    timings: seconds per stage (what ``timings.json`` holds).
    figures: as ``write_results_page`` (default every PNG under ``figures/``).

  Returns:
    The page's path.
  """
  workdir = files.as_path(workdir)
  markdown = files.read_text(workdir / "results.md")
  config = files.read_json(workdir / "config.json")
  return write_results_page(workdir, markdown, figures, config=config, timings=timings)
