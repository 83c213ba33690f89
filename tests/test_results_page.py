"""The results page (index.html): its HTML parsed, the launchers' pages, a real browser's view."""

import html.parser
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import processes
import pytest
from matplotlib import image as mpl_image

from top1_jax import plots
from top1_jax.io import predictions as predictions_lib

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
needs_browser = pytest.mark.skipif(
  BROWSER is None,
  reason="no chromium binary found (apt-get install chromium; ./test.sh installs it)",
)
HEADER_RGB = (0xE8, 0xEF, 0xF7)  # the page's table-header background
POINT_RGB = (0x08, 0x51, 0x9C)  # the reliability diagram's points and line

MARKDOWN = """# Calibrated Top-k bins: <b>test</b> & co

Splits (seed 0); `bins` = bins left after merging, *raw pmax* columns.

## Top-1, 10 bins

| method | score | Brier | ECE (%) |
|---|---|---:|---:|
| model | pmax (Vanilla) | 0.1356 | 1.51 ± 0.22 |
| <script>alert(1)</script> | a & b "quoted" | 0.2 | – |
"""


class _Page(html.parser.HTMLParser):
  """Tables as lists of rows of (cell text, its class), every tag, images, links."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.tables, self.tags, self.images, self.links, self.headings = [], [], [], [], []
    self._cell = self._heading = None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    self.tags.append(tag)
    if tag == "table":
      self.tables.append([])
    elif tag == "tr":
      self.tables[-1].append([])
    elif tag in ("td", "th"):
      self._cell = ([], attrs.get("class"))
    elif tag == "img":
      self.images.append(attrs["src"])
    elif tag == "a":
      self.links.append(attrs["href"])
    elif tag in ("h1", "h2", "h3"):
      self._heading = []

  def handle_endtag(self, tag):
    if tag in ("td", "th"):
      self.tables[-1][-1].append(("".join(self._cell[0]), self._cell[1]))
      self._cell = None
    elif tag in ("h1", "h2", "h3"):
      self.headings.append("".join(self._heading))
      self._heading = None

  def handle_data(self, data):
    for part in (self._cell[0] if self._cell else None, self._heading):
      if part is not None:
        part.append(data)


def _parse(text: str) -> _Page:
  page = _Page()
  page.feed(text)
  page.close()
  return page


def _markdown_tables(markdown: str) -> list[list[list[str]]]:
  """The pipe tables of a Markdown text, less their alignment rows, as cell texts."""
  tables, current = [], None
  for line in markdown.splitlines() + [""]:
    if line.startswith("|"):
      current = [] if current is None else current
      if not set(line) <= set("|-: "):  # not the alignment row
        current.append([cell.strip().replace("`", "") for cell in line.strip("|").split("|")])
    elif current is not None:
      tables.append(current)
      current = None
  return tables


def _reliability_png(path):
  rng = np.random.default_rng(0)
  confidence = rng.uniform(0.3, 1.0, 2000)
  correct = rng.random(2000) < confidence**2
  return plots.save_figure(plots.reliability_diagram(confidence, correct), path)


def test_results_page_tables_are_escaped_and_complete():
  config = {"config": {"n_bins": [10, 20], "dataset": "<i>x</i>"}, "command": "run & go"}
  timings = {"sweep": 1.234, "evaluate": {"figures": 2.5, "total": 3.0}}
  text = plots.results_page(MARKDOWN, figures=["figures/a b.png"], config=config, timings=timings)
  page = _parse(text)
  # Nothing from the run became markup: no script, no bold, no italics from the config.
  assert "script" not in page.tags and "b" not in page.tags and "i" not in page.tags
  assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
  assert page.headings[0] == "Calibrated Top-k bins: <b>test</b> & co"
  assert "<title>Calibrated Top-k bins: &lt;b&gt;test&lt;/b&gt; &amp; co</title>" in text
  # The Markdown table, cell for cell; right-aligned columns are numeric.
  results, config_table, timings_table = page.tables
  assert [[cell for cell, _ in row] for row in results] == _markdown_tables(MARKDOWN)[0]
  assert [kind for _, kind in results[1]] == [None, None, "num", "num"]
  assert results[2][0][0] == "<script>alert(1)</script>" and results[2][1][0] == 'a & b "quoted"'
  # Inline Markdown: code and emphasis, after escaping.
  assert "<code>bins</code>" in text and "<em>raw pmax</em>" in text
  # The config and the timings, nested keys dotted; seconds to two decimals.
  assert ("config.n_bins", None) in [row[0] for row in config_table]
  assert [cell for cell, _ in config_table[2]] == ["config.dataset", "<i>x</i>"]
  assert [[cell for cell, _ in row] for row in timings_table] == [
    ["stage", "seconds"],
    ["sweep", "1.23"],
    ["evaluate.figures", "2.50"],
    ["evaluate.total", "3.00"],
  ]
  # Figures by relative, URL-quoted path; contents link to every section on the page.
  assert page.images == ["figures/a%20b.png"]
  assert {"#section-1", "#figures", "#config", "#timings"} <= set(page.links)


def test_write_results_page_finds_figures_and_refuses_bad_input(tmp_path):
  _reliability_png(tmp_path / "figures" / "reliability.png")
  _reliability_png(tmp_path / "figures" / "ablation.png")
  path = plots.write_results_page(tmp_path, "| a |\n|---|\n| 1 |\n", title="merged runs")
  assert path == tmp_path / "index.html"
  page = _parse(path.read_text(encoding="utf-8"))
  assert page.headings[0] == "merged runs"
  assert page.images == ["figures/ablation.png", "figures/reliability.png"]  # sorted
  assert all((tmp_path / src).is_file() for src in page.images)
  # Given figures, in their order; an absolute path inside the folder becomes relative.
  given = [tmp_path / "figures" / "reliability.png", "figures/ablation.png"]
  page = _parse(plots.write_results_page(tmp_path, "", figures=given).read_text())
  assert page.images == ["figures/reliability.png", "figures/ablation.png"]
  assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temp file left
  with pytest.raises(ValueError, match="markdown: expected the tables' Markdown text, got bytes"):
    plots.results_page(b"# x")
  with pytest.raises(ValueError, match="figures: expected a list of paths .* got str"):
    plots.results_page("", figures="figures/a.png")
  with pytest.raises(ValueError, match="timings: expected a dict or None, got list"):
    plots.results_page("", timings=[1.0])
  with pytest.raises(ValueError, match=r"figures: .*outside .*relative paths"):
    plots.write_results_page(tmp_path / "sub", "", figures=[tmp_path / "figures" / "a.png"])


def _screenshot(page_path, out_png, tmp_path):
  """A headless Chromium's view of ``page_path`` (1200 x 2000 pixels), as RGB in [0, 1]."""
  command = [
    BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
    f"--user-data-dir={tmp_path / 'browser-profile'}",  # not a profile other tests share
    f"--screenshot={out_png}", "--window-size=1200,2000", page_path.resolve().as_uri(),
  ]  # fmt: skip
  result = subprocess.run(command, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert out_png.is_file() and out_png.stat().st_size > 5_000
  pixels = mpl_image.imread(out_png)[..., :3]
  assert pixels.shape[:2] == (2000, 1200)
  return pixels


def _has_colour(pixels, rgb, tolerance=3 / 255) -> bool:
  return bool(np.any(np.all(np.abs(pixels - np.asarray(rgb) / 255) <= tolerance, axis=-1)))


@needs_browser
def test_page_renders_in_a_headless_browser(tmp_path):
  _reliability_png(tmp_path / "figures" / "reliability.png")
  path = plots.write_results_page(
    tmp_path, MARKDOWN, config={"n_bins": [10]}, timings={"total": 1.0}
  )
  pixels = _screenshot(path, tmp_path / "screenshot.png", tmp_path)
  assert pixels.std() > 0.05  # not blank
  # The table is drawn: its header background, and dark text, in the top part.
  top = pixels[:600]
  assert _has_colour(top, HEADER_RGB)
  assert np.mean(top.max(axis=-1) < 0.3) > 0.002
  # The figure loaded from its relative path: the diagram's dark-blue points are shown.
  assert _has_colour(pixels, POINT_RGB, tolerance=12 / 255)


def _predictions_file(path, num=400, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  meta = {"dataset": "synthetic"}
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta=meta)
  )
  return path


@pytest.mark.slow
def test_evaluate_and_aggregate_write_their_pages(tmp_path):
  inputs = _predictions_file(tmp_path / "model.npz")
  run = tmp_path / "runs" / "seed0"
  result = processes.launcher(
    "evaluate", "--config=evaluate_files", f"--workdir={run}", f"--config.inputs={inputs}",
    "--config.n_bins=(5,10)", "--config.topk=(1,)",
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  markdown = (run / "results.md").read_text(encoding="utf-8")
  page = _parse((run / "index.html").read_text(encoding="utf-8"))
  # Every table of results.md (Table 1 included), cell for cell, then the config and timings.
  tables = [[[cell for cell, _ in row] for row in table] for table in page.tables]
  assert tables[:-2] == _markdown_tables(markdown)
  assert any("paper Table 1" in heading for heading in page.headings)
  assert tables[-1][0] == ["stage", "seconds"]
  timings = json.loads((run / "timings.json").read_text())
  assert dict(tables[-1][1:]) == {stage: f"{seconds:.2f}" for stage, seconds in timings.items()}
  assert ["command", json.loads((run / "config.json").read_text())["command"]] in tables[-2]
  # Every figure written is on the page, by a path relative to it.
  written = sorted(p.relative_to(run).as_posix() for p in (run / "figures").glob("*.png"))
  assert sorted(page.images) == written and len(written) >= 4
  if BROWSER is not None:
    pixels = _screenshot(run / "index.html", tmp_path / "evaluate.png", tmp_path)
    assert _has_colour(pixels[:800], HEADER_RGB) and pixels.std() > 0.05

  merged = tmp_path / "merged"
  result = subprocess.run(
    [sys.executable, processes.script("aggregate"), f"--workdir={merged}",
     f"--workdirs={tmp_path / 'runs'}/*"],
    cwd=processes.ROOT, env=processes.LAUNCHER_ENV, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  assert "index.html" in result.stdout.splitlines()[-1]
  page = _parse((merged / "index.html").read_text(encoding="utf-8"))
  tables = [[[cell for cell, _ in row] for row in table] for table in page.tables]
  assert tables[:-1] == _markdown_tables((merged / "aggregate.md").read_text(encoding="utf-8"))
  assert page.headings[0].startswith("Merged runs (1 run from 1 work dir)")
  assert any("paper Table 1" in heading for heading in page.headings)  # merged across runs
  assert "Selective prediction with a guarantee" in page.headings
  assert ["inputs", json.dumps([os.fspath(run)])] in tables[-1]
