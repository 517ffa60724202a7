"""The investigation notebooks in notebooks/: stored clean, written against the public API, and
executed here with nbclient on the recorded data (LIVE=False), so that a conclusion whose data
changed fails its assertion instead of going stale."""
from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.resultgen import STEPS, write_waterfall

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
RESULTS = ROOT / "benchmarks" / "results"
# The slowest cell compiles four kernel variants from cold: a minute or two on two cores.
CELL_TIMEOUT_S = 900


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _parameters(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "one cell tagged 'parameters'"
    return cells[0]


def set_parameters(nb, **values):
    """Rewrite ``NAME = ...`` lines of the parameters cell, as papermill would inject them."""
    cell = _parameters(nb)
    for name, value in values.items():
        cell.source, n = re.subn(rf"(?m)^{name} = .*$", f"{name} = {value!r}", cell.source)
        assert n == 1, f"no single-line parameter {name} in {cell.source!r}"
    return nb


def kernel_env() -> dict[str, str]:
    """The kernel's environment: this checkout first on its path, so the notebooks run against the
    code under test and not whichever jfa_prof happens to be installed."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def execute(path: Path, **params):
    """The notebook run top to bottom in its own directory, as Jupyter would; the executed copy."""
    nb = set_parameters(_read(path), LIVE=False, **params)
    nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute(env=kernel_env())
    return nb


def markdown_outputs(nb) -> str:
    return "\n".join(o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if "text/markdown" in o.get("data", {}))


def test_notebooks_run_against_this_checkout():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import jfa_prof; print(jfa_prof.__file__)")])
    nbclient.NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
                            ).execute(env=kernel_env())
    assert nb.cells[0].outputs[0]["text"].strip() == str(ROOT / "jfa_prof" / "__init__.py")


def test_there_are_four_investigations():
    assert [p.stem for p in NOTEBOOKS] == ["01_load_imbalance", "02_registers_and_spills", "03_time_breakdown",
                                           "04_vs_flashattention4"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = _read(path)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs stored"
    assert re.search(r"(?m)^LIVE = None\b", _parameters(nb).source), "live when a GPU is present, by default"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_ends_with_its_conclusions(path):
    nb = _read(path)
    *_, before, last = nb.cells
    if last.cell_type == "markdown":  # conclusions that need no number
        assert last.source.startswith("## What this means")
    else:  # or a heading, then the conclusions computed from the numbers above
        assert before.cell_type == "markdown" and before.source.startswith("## What this means")
        assert "Markdown(" in last.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_uses_only_the_public_library_api(path):
    for cell in _read(path).cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for m in modules:
                    assert not any(part.startswith("_") for part in m.split(".")), f"{path.name}: imports {m}"
                    # Command modules are CLI wiring; notebooks call the library they wire.
                    assert not m.startswith("jfa_prof.commands"), f"{path.name}: imports {m}"
                if isinstance(node, ast.ImportFrom):
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    assert not private, f"{path.name}: imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                raise AssertionError(f"{path.name}: uses the private attribute .{node.attr}")


PLOTLY_JSON = "application/vnd.plotly.v1+json"


def figure_outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if PLOTLY_JSON in o.get("data", {})]


def assert_figures_survive_html_export(nb, name: str) -> None:
    """nbconvert's HTML export drops plotly's JSON mime type: each figure must carry HTML too,
    drawn by one inline copy of plotly.js (nothing fetched: the page works offline)."""
    from nbconvert import HTMLExporter

    figures = figure_outputs(nb)
    for o in figures:
        assert "text/html" in o["data"], f"{name}: a figure stored as plotly JSON only"
        assert '"responsive": true' in o["data"]["text/html"]
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert page.count("Plotly.newPlot(") == len(figures), f"{name}: figures lost in the HTML export"
    if figures:
        assert page.count("* plotly.js v") == 1, f"{name}: plotly.js inlined more than once, or not at all"
    assert not re.search(r"<script[^>]+src=\"[^\"]*plotly", page), "plotly.js from a CDN"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_recorded_data(path):
    nb = execute(path)
    conclusions = markdown_outputs(nb)
    assert conclusions, f"{path.name} printed no computed conclusion"
    assert "**" in conclusions
    assert_figures_survive_html_export(nb, path.name)


def _results_copy(tmp_path: Path, *patterns: str) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    for pattern in patterns:
        for f in RESULTS.rglob(pattern):  # every study folder; superseded runs are left out
            if "superseded" in f.relative_to(RESULTS).parts:
                continue
            shutil.copy(f, d / f.name)
    return d


def test_time_breakdown_says_when_no_waterfall_is_recorded(tmp_path):
    results = _results_copy(tmp_path, "profile_overhead_*.json", "launch_overhead_*.json")
    text = markdown_outputs(execute(NOTEBOOK_DIR / "03_time_breakdown.ipynb", RESULTS_DIR=str(results)))
    assert "No waterfall recording is available" in text
    assert "In the kernel, tile records cost" in text  # the other sections still ran


def test_time_breakdown_reads_the_newest_waterfall(tmp_path):
    results = _results_copy(tmp_path, "profile_overhead_*.json", "launch_overhead_*.json")
    # no_mask (the masks) saves less than the noise (0.0021 ms) here, so the notebook must say so.
    steps = STEPS[:3] + (("no_mask", 0.0004, 0.372), )
    write_waterfall(results / "waterfall_h200_old.json", date="2026-11-01T00:00:00+00:00", baseline=2.0, steps=steps)
    write_waterfall(results / "waterfall_h200_new.json", date="2026-12-01T00:00:00+00:00", baseline=1.2898,
                    steps=steps)
    text = markdown_outputs(execute(NOTEBOOK_DIR / "03_time_breakdown.ipynb", RESULTS_DIR=str(results)))
    assert "No waterfall recording" not in text
    assert "baseline 1.2898 ms" in text
    assert "The largest is **K/V loads**" in text  # reuse_kv, by the name the chart gives it
    assert "Within the noise: masks." in text
