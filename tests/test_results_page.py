"""The results page (index.html): its HTML parsed, the launchers' pages, a real browser's view."""

import html.parser
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import processes
import pytest
from matplotlib import image as mpl_image

from top1_jax import plots
from top1_jax.io import predictions as predictions_lib
from top1_jax.pipeline import pages, settings
from top1_jax.plots import page as page_lib

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)
needs_browser = pytest.mark.skipif(
  BROWSER is None,
  reason="no chromium binary found (apt-get install chromium; ./test.sh installs it)",
)
HEADER_RGB = (0xE8, 0xEF, 0xF7)  # the page's table-header background
POINT_RGB = (0x08, 0x51, 0x9C)  # the reliability diagram's points and line

ANSWER = plots.Table(
  "Raw → calibrated: <b>test</b> & co",
  ["classifier", "Top-1 Brier: raw → binned", "ECE % (15 equal-width bins): raw"],
  [["deterministic", "0.1372 → 0.1363", "4.97"], ["<script>alert(1)</script>", "–", "–"]],
  'a note with "quotes"',
)
DETAIL = plots.Table(
  "Top-1: every row", ["method", "N", "Brier"], [["a & b", "5", "0.1356 ± 0.0050"]]
)


class _Page(html.parser.HTMLParser):
  """Tables (rows of (cell text, class)) with their enclosing section or details, every
  tag, images, links, headings, summaries, and whether each table is folded."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.tables, self.tags, self.images, self.links, self.headings = [], [], [], [], []
    self.summaries, self.folded = [], []
    self._cell = self._heading = self._summary = None
    self._open_details = 0

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    self.tags.append(tag)
    if tag == "details":
      self._open_details += 1
    elif tag == "table":
      self.tables.append([])
      self.folded.append(self._open_details > 0)
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
    elif tag == "summary":
      self._summary = []

  def handle_endtag(self, tag):
    if tag in ("td", "th"):
      self.tables[-1][-1].append(("".join(self._cell[0]), self._cell[1]))
      self._cell = None
    elif tag in ("h1", "h2", "h3"):
      self.headings.append("".join(self._heading))
      self._heading = None
    elif tag == "summary":
      self.summaries.append("".join(self._summary).strip())
      self._summary = None
    elif tag == "details":
      self._open_details -= 1

  def handle_data(self, data):
    for part in (self._cell[0] if self._cell else None, self._heading, self._summary):
      if part is not None:
        part.append(data)


def _parse(text: str) -> _Page:
  page = _Page()
  page.feed(text)
  page.close()
  return page


def _cells(table) -> list[list[str]]:
  return [[cell for cell, _ in row] for row in table]


def _reliability_png(path):
  rng = np.random.default_rng(0)
  confidence = rng.uniform(0.3, 1.0, 2000)
  correct = rng.random(2000) < confidence**2
  return plots.save_figure(plots.reliability_diagram(confidence, correct), path)


def test_results_page_leads_with_the_answer_and_folds_the_rest():
  config = {"n_bins": [10, 20], "dataset": "<i>x</i>", "nested": {"a": 1}}
  timings = {"sweep": 1.234, "evaluate": {"figures": 2.5, "total": 3.0}}
  text = plots.results_page(
    "Calibrated <b>bins</b> & co",
    intro="2 files & <em>splits</em>",
    answer=[ANSWER],
    findings=["Best: <u>x</u>", ""],
    key_figure="figures/bins_a_top1.png",
    details=[DETAIL],
    figures=["figures/bins_a_top1.png", "figures/ablation_top1.png", "figures/a b.png"],
    config=config,
    timings=timings,
    links=["results.csv", "results.md"],
  )
  page = _parse(text)
  # Nothing from the run became markup: no script, no bold, no italics, no underline.
  assert not {"script", "b", "i", "em", "u"} & set(page.tags)
  assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
  assert page.headings[0] == "Calibrated <b>bins</b> & co"
  assert "<title>Calibrated &lt;b&gt;bins&lt;/b&gt; &amp; co</title>" in text
  # The answer first and open: its table, the finding (empty ones dropped), the key figure.
  answer, detail, config_table, timings_table = page.tables
  assert page.folded == [False, True, True, True]
  assert _cells(answer) == [ANSWER.header, *ANSWER.rows]
  assert [kind for _, kind in answer[1]] == [None, "num", "num"]  # numbers right-aligned
  assert text.index("Best: &lt;u&gt;x&lt;/u&gt;") < text.index("<details>")
  assert page.images[0] == "figures/bins_a_top1.png"
  assert text.index('src="figures/bins_a_top1.png"') < text.index("<details>")
  # Then folded: the tables, the figures by kind (the key figure in its group too), the run.
  assert _cells(detail) == [DETAIL.header, *DETAIL.rows]
  assert page.summaries[0] == "Top-1: every row (1 rows)"
  groups = [s for s in page.summaries if s.endswith(")") and "rows" not in s]
  assert groups[:3] == [
    "Calibrated bins of each file's headline score (paper Fig. 1) (1)",
    "Metrics against the number of bins (1)",
    "Other figures (1)",
  ]
  assert page.images[1:] == ["figures/bins_a_top1.png", "figures/ablation_top1.png",
                             "figures/a%20b.png"]  # fmt: skip
  assert _cells(config_table)[1:] == [
    ["n_bins", "[10, 20]"],
    ["dataset", "<i>x</i>"],
    ["nested.a", "1"],
  ]
  assert _cells(timings_table) == [
    ["stage", "seconds"],
    ["sweep", "1.23"],
    ["evaluate.figures", "2.50"],
    ["evaluate.total", "3.00"],
  ]
  assert {"results.csv", "results.md"} <= set(page.links)


def test_write_results_page_finds_figures_and_refuses_bad_input(tmp_path):
  _reliability_png(tmp_path / "figures" / "reliability_x_top1.png")
  _reliability_png(tmp_path / "figures" / "bins_x_pmax_top1.png")
  path = plots.write_results_page(tmp_path, "merged runs", details=[DETAIL])
  assert path == tmp_path / "index.html"
  page = _parse(path.read_text(encoding="utf-8"))
  assert page.headings[0] == "merged runs"
  # The key figure (the first file's calibrated Top-1 bins), then every figure by kind.
  assert page.images == [
    "figures/bins_x_pmax_top1.png",
    "figures/bins_x_pmax_top1.png",
    "figures/reliability_x_top1.png",
  ]
  assert all((tmp_path / src).is_file() for src in page.images)
  # Given figures; an absolute path inside the folder becomes relative.
  given = [tmp_path / "figures" / "reliability_x_top1.png"]
  page = _parse(plots.write_results_page(tmp_path, "t", figures=given).read_text())
  assert page.images == ["figures/reliability_x_top1.png"]  # no key figure among them
  assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temp file left
  with pytest.raises(ValueError, match="title: expected a string, got bytes"):
    plots.results_page(b"# x")
  with pytest.raises(ValueError, match="tables: expected plots.page.Table values, got str"):
    plots.results_page("t", details=["| a |"])
  with pytest.raises(ValueError, match="figures: expected a list of paths .* got str"):
    plots.results_page("t", figures="figures/a.png")
  with pytest.raises(ValueError, match="timings: expected a dict or None, got list"):
    plots.results_page("t", timings=[1.0])
  with pytest.raises(ValueError, match=r"figures: .*outside .*relative paths"):
    plots.write_results_page(tmp_path / "sub", "t", figures=[tmp_path / "figures" / "a.png"])


def test_the_template_is_package_data():
  # Read through importlib.resources, as from an installed wheel (pyproject's package-data,
  # which test_packaging checks); a page of a title alone has nothing to fold.
  template = importlib.resources.files(page_lib.__package__) / "templates" / "page.html"
  assert "{{ title }}" in template.read_text("utf-8")
  text = plots.results_page("t")
  assert text.startswith("<!DOCTYPE html>") and "<details>" not in text


def _config(**overrides):
  from top1_jax.configs import evaluate_files, quick

  base = evaluate_files if "inputs" in overrides else quick
  config = base.get_config()
  for key, value in overrides.items():
    setattr(config, key, value)
  return settings.parse(config)


def test_config_fields_are_those_the_run_used(tmp_path):
  inputs = str(_predictions_file(tmp_path / "a.npz"))
  arrays = pages.config_fields(_config(inputs=inputs), "evaluate")
  # An evaluation of a user's files lists none of the ~40 training and prediction fields.
  training = ("num_epochs", "learning_rate", "optimizer", "models", "dropout_rates", "augment")
  assert not set(training) & set(arrays)
  assert {"inputs", "input_kind", "n_bins", "ece_bins", "seeds", "dataset"} <= set(arrays)
  assert "labels" not in arrays and not any(name.startswith("shift_") for name in arrays)
  assert len(arrays) <= 20
  trained = pages.config_fields(_config(), "evaluate")
  assert set(training) <= set(trained) and "inputs" not in trained
  assert not any(name.startswith("shift_") for name in trained)
  shift = pages.config_fields(_config(), "shift")
  assert {"shift_rotations", "shift_corruptions", "num_epochs"} <= set(shift)
  assert "shift_inputs" not in shift and "selective_targets" not in shift


def _screenshot(page_path, out_png, tmp_path, height=2000):
  """A headless Chromium's view of ``page_path`` (1200 x ``height`` pixels), RGB in [0, 1]."""
  command = [
    BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
    f"--user-data-dir={tmp_path / 'browser-profile'}",  # not a profile other tests share
    f"--screenshot={out_png}", f"--window-size=1200,{height}", page_path.resolve().as_uri(),
  ]  # fmt: skip
  result = subprocess.run(command, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert out_png.is_file() and out_png.stat().st_size > 5_000
  pixels = mpl_image.imread(out_png)[..., :3]
  assert pixels.shape[:2] == (height, 1200)
  return pixels


def _has_colour(pixels, rgb, tolerance=3 / 255) -> bool:
  return bool(np.any(np.all(np.abs(pixels - np.asarray(rgb) / 255) <= tolerance, axis=-1)))


def _drawn_height(pixels) -> int:
  """The last row with anything but the white background on it, plus one."""
  return int(np.flatnonzero((pixels < 0.97).any(axis=(1, 2)))[-1]) + 1


@needs_browser
def test_page_renders_in_a_headless_browser_answer_first_and_short(tmp_path):
  key = _reliability_png(tmp_path / "figures" / "reliability.png")
  for index in range(8):
    shutil.copy(key, tmp_path / "figures" / f"bins_{index}_top1.png")
  many_rows = [[f"row {i}", str(i), f"0.{i:04d}"] for i in range(60)]
  details = [plots.Table(f"table {t}", DETAIL.header, many_rows) for t in range(8)]
  path = plots.write_results_page(
    tmp_path, "t", answer=[ANSWER], key_figure="figures/reliability.png", details=details,
    config={"n_bins": [10]}, timings={"total": 1.0},
  )  # fmt: skip
  pixels = _screenshot(path, tmp_path / "screenshot.png", tmp_path, height=3000)
  assert pixels.std() > 0.05  # not blank
  # The answer's table on top (its header background, dark text), then the key figure,
  # loaded from its relative path (the diagram's dark-blue points).
  top = pixels[:400]
  assert _has_colour(top, HEADER_RGB)
  assert np.mean(top.max(axis=-1) < 0.3) > 0.002
  assert _has_colour(pixels[:1500], POINT_RGB, tolerance=12 / 255)
  # 480 table rows and 9 more figures are folded: the page ends within about two screens.
  assert _drawn_height(pixels) < 2200


def _predictions_file(path, num=400, seed=0):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, num)
  logits = rng.normal(size=(num, 10)) + 3 * np.eye(10)[labels]
  meta = {"dataset": "synthetic"}
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta=meta)
  )
  return path


ECE_HEADER = re.compile(r"ECE % \((\d+|N) equal-(width|mass)( calibration-split)? bins\)")


def _check_ece_names(page: _Page) -> None:
  """Every ECE on the page says its binning and bins ("ECE % (15 equal-width bins)")."""
  headers = [cell for table in page.tables for cell, _ in table[0] if "ECE" in cell]
  assert headers and all(ECE_HEADER.search(cell) for cell in headers), headers


@pytest.mark.slow
def test_evaluate_and_aggregate_write_their_pages(tmp_path):
  inputs = _predictions_file(tmp_path / "model.npz")
  run = tmp_path / "runs" / "seed0"
  result = processes.launcher(
    "evaluate", "--config=evaluate_files", f"--workdir={run}", f"--config.inputs={inputs}",
    "--config.n_bins=(5,10)", "--config.topk=(1,2)",
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  # The last line of the log says where the page is.
  assert f"results page {run / 'index.html'}" in result.stderr.strip().splitlines()[-1]
  data = json.loads((run / "results.json").read_text())
  page = _parse((run / "index.html").read_text(encoding="utf-8"))
  tables = [_cells(table) for table in page.tables]
  # The answer (open): Table 1's rows, raw -> binned; then the details (folded).
  assert not page.folded[0] and all(page.folded[1:])
  labels = [row["label"] for row in data["comparison"]]
  assert [row[0].split(" (T = ")[0] for row in tables[0][1:]] == labels
  raw = data["comparison"][0]
  assert tables[0][1][3] == f"{raw['raw_top1_brier']:.4f} → {raw['top1_binned_brier']:.4f}"
  text = (run / "index.html").read_text(encoding="utf-8")
  assert text.index("Best Top-1 Brier of the sweep: model, ") < text.index("<details>")
  # Every row of the sweep, one table per Top-k; Table 1 and the selective rows in full.
  for k in (1, 2):
    (table,) = [t for t, s in zip(tables[1:], page.summaries, strict=False) if f"Top-{k}:" in s]
    assert len(table) - 1 == sum(r["topk"] == k for r in data["results"])
  _check_ece_names(page)
  assert any("AUROC (binned predictions)" in cell for cell in tables[1][0])
  # The config: the command and only the fields an evaluation of files uses.
  config = dict(tables[-2][1:])
  assert config["command"] == json.loads((run / "config.json").read_text())["command"]
  assert "inputs" in config and not {"num_epochs", "learning_rate", "models"} & set(config)
  assert tables[-1][0] == ["stage", "seconds"]
  timings = json.loads((run / "timings.json").read_text())
  assert dict(tables[-1][1:]) == {stage: f"{seconds:.2f}" for stage, seconds in timings.items()}
  # Every figure written is on the page, by a path relative to it (the key figure twice).
  written = sorted(p.relative_to(run).as_posix() for p in (run / "figures").glob("*.png"))
  assert sorted(set(page.images)) == written and len(written) >= 4
  assert page.images[0] == "figures/bins_model_pmax_top1.png"
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
  text = (merged / "index.html").read_text(encoding="utf-8")
  page = _parse(text)
  assert page.headings[0].startswith("Merged runs (1 run from 1 work dir)")
  assert "Raw → calibrated, Top-1" in page.headings  # merged Table 1 rows
  saved = json.loads((merged / "aggregate.json").read_text())
  for title, name in (("Benchmark metrics vs Top-1 binning (paper Table 1)", "comparison"),
                      ("Selective prediction with a guarantee", "selective")):  # fmt: skip
    assert f"{title} ({len(saved[name])} rows)" in page.summaries
  _check_ece_names(page)
  config = dict(_cells(page.tables[-1])[1:])
  assert config == {"inputs": json.dumps([os.fspath(run)]), "num_runs": "1"}
