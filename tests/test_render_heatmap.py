"""Heatmap figures (through fig.to_dict()) and the imbalance tables (through a StringIO console)."""
from __future__ import annotations

from io import StringIO

import base64

import numpy as np
import pytest
from rich.console import Console

import tracegen
from jfa_prof.analyses.imbalance import imbalance
from jfa_prof.analyses.occupancy import occupancy_matrix
from jfa_prof.analyses.predict import CostModel, compare_prediction, simulate, work_list_from_tiles
from jfa_prof.render.heatmap import (comparison_table, contrast_line, heatmap_figure, heatmap_panels, hover_text,
                                     summary_table, tail_details, write_html)

# µs-scale tiles so the tables print round numbers. SM 0: 0-100 µs and 100-300 µs; SM 1: 0-200 µs.
ROWS = [
    {"cta": 0, "smid": 0, "start": 0, "end": 100_000, "tile": 7, "batch": 3, "head": 1, "kv_len": 128},
    {"cta": 0, "smid": 0, "start": 100_000, "end": 300_000, "tile": 8, "batch": 4, "head": 2, "kv_len": 2048},
    {"cta": 1, "smid": 1, "start": 0, "end": 200_000, "tile": 9, "batch": 5, "head": 0, "kv_len": 1024},
]


@pytest.fixture
def tr():
    return tracegen.hand_trace(ROWS, n_sms=3)


def _array(value):
    """A figure array as numpy: plotly serializes numpy arrays as base64 typed arrays."""
    if isinstance(value, dict) and "bdata" in value:
        shape = [int(x) for x in str(value.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"])).reshape(shape)
    return np.asarray(value)


def _console():
    return Console(file=StringIO(), width=200, highlight=False, color_system=None)


def test_hover_names_the_dominant_tile(tr):
    occ = occupancy_matrix(tr.tiles, 3, n_bins=3)
    text = hover_text(occ)
    assert text[0, 0] == "tile 7 · batch 3 · head 1 · kv_len 128"
    assert text[0, 2] == "tile 8 · batch 4 · head 2 · kv_len 2048"
    assert text[1, 1] == "tile 9 · batch 5 · head 0 · kv_len 1024"
    assert text[1, 2] == "" and text[2, 0] == ""


def test_single_heatmap(tr):
    occ = occupancy_matrix(tr.tiles, 3, n_bins=3)
    d = heatmap_figure(occ, label="clc off", title="t").to_dict()
    (hm,) = d["data"]
    assert hm["type"] == "heatmap" and hm["name"] == "clc off" and hm["coloraxis"] == "coloraxis"
    np.testing.assert_allclose(_array(hm["z"]), [[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    assert hm["x0"] == 50 and hm["dx"] == 100  # µs
    assert "tile 7" in hm["text"][0][0]
    assert "%{text}" in hm["hovertemplate"]
    assert d["layout"]["coloraxis"]["cmin"] == 0 and d["layout"]["coloraxis"]["cmax"] == 1
    assert d["layout"]["yaxis"]["range"] == [2.5, -0.5]  # SM 0 on top


def test_side_by_side_panels_share_scale_and_axis(tr):
    short = tracegen.hand_trace([{"cta": 0, "smid": 0, "start": 0, "end": 150_000}], n_sms=3)
    t_end = 300_000
    a = occupancy_matrix(tr.tiles, 3, n_bins=3, t_end_ns=t_end)
    b = occupancy_matrix(short.tiles, 3, n_bins=3, t_end_ns=t_end)
    d = heatmap_panels([("clc off · lpt", a), ("clc on · dynamic", b)]).to_dict()
    assert [t["name"] for t in d["data"]] == ["clc off · lpt", "clc on · dynamic"]
    assert {t["coloraxis"] for t in d["data"]} == {"coloraxis"}
    assert d["data"][0]["xaxis"] == "x" and d["data"][1]["xaxis"] == "x2"
    assert d["layout"]["xaxis"]["range"] == d["layout"]["xaxis2"]["range"] == [0, 300]
    assert [a["text"] for a in d["layout"]["annotations"]] == ["clc off · lpt", "clc on · dynamic"]
    np.testing.assert_allclose(_array(d["data"][1]["z"])[0], [1, 0.5, 0])


def test_predicted_vs_measured_grid(tr):
    pred = simulate(work_list_from_tiles(tr.tiles), 2, "static", CostModel(0, 100_000))
    occ_m = occupancy_matrix(tr.tiles, 3, n_bins=3)
    occ_p = occupancy_matrix(pred, 3, n_bins=3)
    d = heatmap_panels([("off", occ_m), ("off predicted", occ_p), ("on", occ_m), ("on predicted", occ_p)],
                       cols=2).to_dict()
    assert [t["xaxis"] for t in d["data"]] == ["x", "x2", "x3", "x4"]
    assert d["layout"]["xaxis3"]["domain"] == d["layout"]["xaxis"]["domain"]  # same column


def test_write_html_is_self_contained(tmp_path, tr):
    fig = heatmap_figure(occupancy_matrix(tr.tiles, 3, n_bins=3))
    path = write_html(fig, tmp_path / "out" / "h.html")
    html = path.read_text()
    assert "<html>" in html[:200].lower() and html.rstrip().endswith("</html>")
    assert 'src="https://cdn.plot.ly' not in html
    assert len(html) > 1_000_000  # plotly.js is inlined
    assert '"responsive": true' in html and "width:100%" in html  # fills the window, follows resizes


def test_panels_carry_their_imbalance_figures_and_level(tr):
    occ = occupancy_matrix(tr.tiles, 3, n_bins=3)
    im = imbalance(tr.tiles, tr.n_sms)  # makespan 300 µs, mean finish 250 µs, tail 50 µs, idle 44.4%
    d = heatmap_panels([("clc off", occ), ("predicted", occ)], imbalances=[im, im], levels=[1, None]).to_dict()
    titles = [a["text"] for a in d["layout"]["annotations"]]
    assert titles[0].startswith("<b>clc off</b>")
    for text in ("makespan 300.0 µs", "mean finish 250.0 µs", "tail 50.0 µs", "idle 44.4%", "level 1 (tile records)"):
        assert text in titles[0], text
    assert "simulated" in titles[1]
    # The tail window, mean finish to makespan, shaded on each panel's own axes.
    tails = [(s["xref"], s["x0"], s["x1"]) for s in d["layout"]["shapes"]]
    assert tails == [("x", 250.0, 300.0), ("x2", 250.0, 300.0)]
    # Without figures: the plain labels, as before.
    plain = heatmap_panels([("clc off", occ)]).to_dict()["layout"]
    assert [a["text"] for a in plain["annotations"]] == ["clc off"] and not plain.get("shapes")
    with pytest.raises(ValueError, match="one imbalance"):
        heatmap_panels([("a", occ)], imbalances=[im, im])


def test_three_panels_take_the_width_they_are_given(tr):
    occ = occupancy_matrix(tr.tiles, 3, n_bins=3)
    layout = heatmap_panels([("a", occ), ("b", occ), ("c", occ)]).to_dict()["layout"]
    assert "width" not in layout and layout["autosize"] is True


def test_summary_table(tr):
    im = imbalance(tr.tiles, tr.n_sms)
    c = _console()
    summary_table([("clc off", im), ("clc on", im)], c)
    out = c.file.getvalue()
    for line in ("makespan", "300.0 µs", "max / mean busy", "1.800", "tail (makespan − mean finish)", "50.0 µs",
                 "idle fraction", "44.4%", "3 (1)", "clc off", "clc on"):
        assert line in out, line
    assert "WARNING" not in out


def test_summary_table_shouts_about_dropped_records(tr):
    im = imbalance(tr.tiles, tr.n_sms, dropped=12)
    c = _console()
    summary_table([("clc on", im)], c)
    out = c.file.getvalue()
    assert "WARNING clc on: 12 tile record(s) dropped" in out
    assert "dropped records" in out


def test_tail_details(tr):
    c = _console()
    tail_details([("clc off", imbalance(tr.tiles, tr.n_sms))], c)
    out = c.file.getvalue()
    assert "SMs on the tail (finish after the mean): 0 (+50.0 µs)" in out
    lines = [ln for ln in out.splitlines() if "µs" in ln and "│" in ln]
    assert "2048" in lines[0] and "300.0 µs" in lines[0]  # the tile that ends last, first


def test_contrast_line(tr):
    off = imbalance(tr.tiles, tr.n_sms)
    on = imbalance(tracegen.hand_trace([{"cta": 0, "smid": 0, "start": 0, "end": 150_000},
                                        {"cta": 1, "smid": 1, "start": 0, "end": 150_000}], n_sms=3).tiles, 3)
    assert contrast_line(off, on) == "clc on vs off: makespan -50.0%, tail 50.0 µs → 0.0 µs, idle 44.4% → 33.3%"


def test_comparison_table(tr):
    model = CostModel(1000.0, 250.0, r2=0.98, basis="pitch")
    pred = simulate(work_list_from_tiles(tr.tiles), 2, "static", model)
    c = _console()
    comparison_table([("clc off", compare_prediction(pred, tr.tiles), model)], c)
    out = c.file.getvalue()
    assert "makespan measured" in out and "300.0 µs" in out
    assert "1,000 + 250·n_blocks ns" in out and "0.980" in out


def test_contrast_line_names_the_schedules_it_compares(tr):
    off = imbalance(tr.tiles, 3)
    line = contrast_line(off, off, names=("static", "dynamic (clc on)"))
    assert line.startswith("dynamic (clc on) vs static: makespan +0.0%")


def test_busy_figure_sorts_each_sm_busiest_first_with_its_mean(tr):
    from jfa_prof.render.heatmap import busy_figure

    im = imbalance(tr.tiles, tr.n_sms)  # SM 0 busy 300 µs, SM 1 200 µs, SM 2 idle
    d = busy_figure([("clc off", im)]).to_dict()
    (line,) = d["data"]
    assert list(line["y"]) == [300.0, 200.0, 0.0] and list(line["customdata"]) == [0, 1, 2]
    (mean,) = d["layout"]["shapes"]
    assert mean["y0"] == pytest.approx(500 / 3) and mean["line"]["dash"] == "dash"
    assert "width" not in d["layout"]
