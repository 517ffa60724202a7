"""``jfa-prof report``: gathering (jfa_prof.report), the page (jfa_prof.render.report), the command,
and the page rendered by a real browser (headless Chromium; skipped where there is none)."""
from __future__ import annotations

import datetime
import html
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jfa_prof.cli import app
from tests.browser import dump_dom
from tests.resultgen import write_waterfall
from jfa_prof.errors import BadInputError
from jfa_prof.render import report as page
from jfa_prof.report import (SCHEDULE_ORDER, bundled_schedule_traces, gather, newest_result, results_dir)

ROOT = Path(__file__).resolve().parents[1]
NCU = [ROOT / "tests/data/ncu/fwd_lpt.ncu-rep", ROOT / "tests/data/ncu/fwd_dynamic.ncu-rep"]
BENCH = ROOT / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    wf = write_waterfall(tmp_path_factory.mktemp("wf") / "waterfall_h200.json")
    # live=False: these tests are about the bundled recordings, which a GPU machine would not read.
    return gather(ncu=NCU, bench=BENCH, waterfall=wf, live=False)


@pytest.fixture(scope="module")
def full_html(full_report):
    return page.report_html(full_report)


# ---- gathering -------------------------------------------------------------------------------

def test_without_traces_on_a_cpu_the_bundled_recordings_are_used_and_said_to_be(full_report):
    assert full_report.origin == "bundled"
    assert "bundled" in full_report.source and "not live" in full_report.source
    assert [r.trace.schedule for r in full_report.traces] == list(SCHEDULE_ORDER)
    assert full_report.sections() == ["heatmap", "barriers", "ncu", "waterfall", "bench", "environment"]


def test_traces_share_one_time_axis_and_carry_their_analyses(full_report):
    ends = {float(r.occupancy.edges_ns[-1]) for r in full_report.traces}
    assert ends == {max(r.trace.makespan_ns for r in full_report.traces)}
    for r in full_report.traces:
        assert r.imbalance.n_tiles == len(r.trace.tiles)
        assert r.prediction is not None and r.prediction.schedule == r.trace.schedule
        assert r.barriers is not None and len(r.barriers.table)


def test_bundled_traces_filter_by_workload():
    assert {tr.workload_label for tr in bundled_schedule_traces(Lq=256, sparsity=0.1)} == {"hsp Lq=256 max=2048 s=0.1"}
    with pytest.raises(BadInputError, match="Lq=999"):
        bundled_schedule_traces(Lq=999)


def test_given_trace_files_replace_the_bundled_ones():
    files = sorted((ROOT / "tests/data/traces").glob("small_*.jfatrace"))  # the forward recordings
    rep = gather(traces=files, environment=False, predict=False)
    assert rep.origin == "files"
    assert [r.trace.schedule for r in rep.traces] == ["static", "lpt", "dynamic"]
    # The level-1 recording has no barrier waits; the page says so instead of showing a table.
    level1 = next(r for r in rep.traces if r.trace.meta.get("profile_level") == 1)
    assert level1.barriers is None
    assert "level-1 recordings carry tile records only" in page.report_html(rep)


def test_newest_result_goes_by_the_recorded_date_not_the_name(tmp_path):
    write_waterfall(tmp_path / "waterfall_b.json", date="2026-11-29T10:00:00+00:00")
    write_waterfall(tmp_path / "waterfall_a.json", date="2026-12-01T10:00:00+00:00")
    undated = tmp_path / "waterfall_z.json"
    undated.write_text("not json")  # dated by its modification time
    stamp = datetime.datetime(2027, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    os.utime(undated, (stamp, stamp))
    assert newest_result("waterfall_*.json", tmp_path).name == "waterfall_z.json"
    assert newest_result("waterfall_*.json", tmp_path, accept=lambda p: p.name != "waterfall_z.json").name == \
        "waterfall_a.json"
    assert newest_result("bench_*.json", tmp_path) is None
    assert newest_result("*.json", tmp_path / "missing") is None
    # A study's folder is searched too; its superseded runs never are, however recent.
    (tmp_path / "study" / "superseded").mkdir(parents=True)
    (tmp_path / "study" / "waterfall_s.json").write_text('{"meta": {"date": "2026-12-02T00:00:00"}}')
    (tmp_path / "study" / "superseded" / "waterfall_old.json").write_text('{"meta": {"date": "2026-12-09T00:00:00"}}')
    assert newest_result("waterfall_*.json", tmp_path, accept=lambda p: p.name != "waterfall_z.json").name == \
        "waterfall_s.json"
    assert results_dir() == ROOT / "benchmarks" / "results"


# ---- the page ------------------------------------------------------------------------------

def test_plotly_js_is_inlined_once_and_nothing_is_fetched(full_report, full_html):
    names = [n for n, _ in page.figures(full_report)]
    assert names == ["heatmap", "finish", "barriers", "ncu-stalls", "waterfall", "bench-fwd"]
    assert full_html.count("* plotly.js v") == 1
    assert full_html.count("Plotly.newPlot(") == len(names)
    assert full_html.count(f'class="{page.FIGURE_CLASS}"') == len(names)
    assert not re.search(r"<script[^>]+src=", full_html)
    assert not re.search(r'<link[^>]+href="http', full_html)


def test_figures_have_no_fixed_width_and_follow_the_page(full_report, full_html):
    # A fixed 1680 px heatmap was clipped (third panel and colour bar) on a 1600 px screen.
    for name, fig in page.figures(full_report):
        layout = fig.to_dict()["layout"]
        assert "width" not in layout, name
        assert layout.get("autosize") is True, name
    assert full_html.count('"responsive": true') == len(page.figures(full_report))
    divs = re.findall(r'<div id="fig-\d+" class="plotly-graph-div" style="([^"]*)"', full_html)
    assert len(divs) == len(page.figures(full_report)) and all("width:100%" in d for d in divs)


def test_each_section_names_its_workload_and_pass_and_the_environment_comes_last(full_report, full_html):
    sections = re.findall(r'<section id="([a-z]+)"><h2>[^<]*</h2>(?:<p class="scope">([^<]*)</p>)?', full_html)
    assert [k for k, _ in sections] == full_report.sections() and sections[-1][0] == "environment"
    scopes = dict(sections)
    for key in ("heatmap", "barriers"):
        assert "workload hsp Lq=256 max=2048 s=0.1 · pass fwd" in scopes[key]
    assert "pass fwd" in scopes["ncu"] and "fwd_lpt.ncu-rep" in scopes["ncu"]
    assert scopes["waterfall"].startswith("workload hsp Lq=256 max=2048 s=0.5 · pass fwd")
    assert scopes["bench"] == "workloads: the 18 points of the hsp grid · pass fwd"
    assert scopes["environment"] == ""


def test_barrier_waits_and_stall_reasons_are_charted(full_report):
    figs = dict(page.figures(full_report))
    bars = figs["barriers"].to_dict()
    assert [t["name"] for t in bars["data"]] == [r.label for r in full_report.traces]
    top = full_report.traces[0].barriers.table.iloc[0]
    first = bars["data"][0]
    assert first["y"][0] == f"{top.site} · {top.role}" and first["x"][0] == pytest.approx(100 * top.share)
    stalls = figs["ncu-stalls"].to_dict()
    assert [t["name"] for t in stalls["data"]] == ["fwd_lpt.ncu-rep", "fwd_dynamic.ncu-rep"]
    assert stalls["data"][0]["y"][0] == "long scoreboard"
    assert "selected" not in stalls["data"][0]["y"]  # issuing is not a stall


def test_heatmap_panels_carry_their_figures_and_level(full_report):
    heat = dict(page.figures(full_report))["heatmap"].to_dict()["layout"]
    for r, title in zip(full_report.traces, (a["text"] for a in heat["annotations"])):
        assert f"makespan {r.imbalance.makespan_ns / 1e3:,.1f} µs" in title
        assert f"idle {100 * r.imbalance.idle_fraction:.1f}%" in title
        assert r.level == 2 and "level 2" in title


def test_the_page_says_where_its_traces_come_from(full_report, full_html):
    header = full_html[full_html.index("<header>"):full_html.index("</header>")]
    assert 'class="source bundled"' in header and "not live" in header
    for r in full_report.traces:
        assert r.trace.path.name in header


def test_tables_are_html_tables_not_terminal_text(full_html):
    assert "<pre" not in full_html
    captions = re.findall(r'<table class="data"><caption>(.*?)</caption>', full_html)
    assert "SM imbalance" in captions and any(c.startswith("barrier waits") for c in captions)
    assert any("fwd TFLOPS" in c for c in captions)


def test_tables_are_the_ones_the_commands_print(full_report, full_html):
    text = re.sub(r"<[^>]+>", "", full_html)
    for r in full_report.traces:
        im = r.imbalance
        assert f"{im.makespan_ns / 1e3:,.1f} µs" in text
        assert f"{100 * im.idle_fraction:.1f}%" in text
        top = r.barriers.table.iloc[0]
        assert f"barrier waits · {r.label}" in text and str(top.site) in text
    assert "prediction vs measurement" in text
    assert "local loads/thread" in text and "B is 4.2% faster" in text  # ncu: both reports, then B against A
    assert "no_o_store" in text and "noise" in text  # the waterfall table
    assert "fwd TFLOPS" in text and "fa4" in text  # the bench summary
    from jfa_prof.render import doctor

    verdict = doctor.to_dict(full_report.environment)["verdict"]
    assert verdict["summary"] and html.escape(verdict["summary"]) in text  # doctor's verdict


def test_a_bench_file_with_time_splits_adds_what_limits_each_point():
    limits_file = ROOT / "benchmarks/results/limits/limits_bwd_hsp_h200_2026-11-30.json"
    rep = gather(bench=limits_file)
    names = [n for n, _ in page.figures(rep)]
    assert names[-2:] == ["bench-bwd", "bench-limits-bwd"]
    text = re.sub(r"<[^>]+>", "", page.report_html(rep))
    assert "bwd · what limits each point" in text and "target 1.5× FA4 · GPU time per call" in text


def test_finish_figure_sorts_each_trace_latest_first(full_report):
    fig = page.finish_figure(full_report.traces).to_dict()
    assert [t["name"] for t in fig["data"]] == [r.label for r in full_report.traces]
    for trace, r in zip(fig["data"], full_report.traces):
        y = list(trace["y"])
        assert y == sorted(y, reverse=True)
        assert y[0] == pytest.approx(r.trace.makespan_ns / 1e3)


def test_spills_section_compiles_the_named_variants():
    rep = gather(spills=True, variants=["fwd/bcast/bf16/d128/lpt/peel/noprof"], environment=False, predict=False)
    assert list(rep.spills["variant"]) == ["fwd/bcast/bf16/d128/lpt/peel/noprof"]
    html = page.report_html(rep)
    assert "Registers and spills" in html and "fwd/bcast/bf16/d128/lpt/pe" in html
    with pytest.raises(BadInputError, match="unknown kernel variant"):
        gather(spills=True, variants=["fwd/nope"], environment=False, predict=False)


# ---- the command -----------------------------------------------------------------------------

def test_report_command_without_arguments_uses_the_bundled_recordings(tmp_path, monkeypatch):
    monkeypatch.setattr("jfa_prof.report.can_record_live", lambda: False)
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "-o", str(out), "--no-doctor"])
    assert result.exit_code == 0, result.output
    assert "bundled H200 recordings (not live" in result.stdout
    assert f"wrote {out}" in result.stdout
    assert out.read_text().count("Plotly.newPlot(") == 3  # heatmap, finish times, barrier waits


def test_report_command_logs_its_steps_when_stderr_is_no_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr("jfa_prof.report.can_record_live", lambda: False)
    result = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--no-doctor", "--no-predict",
                                 "--json"])
    assert result.exit_code == 0, result.output
    steps = result.stderr.splitlines()
    assert steps[0] == "reading the bundled recordings" and steps[-1] == "writing the page"
    json.loads(result.stdout)


def test_report_command_json(tmp_path):
    out = tmp_path / "r.html"
    wf = write_waterfall(tmp_path / "wf.json")
    result = runner.invoke(app, ["report", "-o", str(out), "--no-doctor", "--no-predict", "--bins", "50",
                                 "--ncu", str(NCU[0]), "--waterfall", str(wf), "--bench", str(BENCH), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["html"] == str(out) and data["origin"] == "bundled"
    assert data["sections"] == ["heatmap", "barriers", "ncu", "waterfall", "bench"]
    assert data["figures"] == ["heatmap", "finish", "barriers", "ncu-stalls", "waterfall", "bench-fwd"]
    assert data["bytes"] == out.stat().st_size


@pytest.mark.parametrize("args, message", [
    (["--ncu", "missing.ncu-rep"], "--ncu missing.ncu-rep: no such file"),
    (["--variant", "fwd/*"], "--variant chooses what --spills compiles"),
    (["--lq", "999"], "no bundled recording for Lq=999"),
])
def test_report_command_rejects_bad_input(tmp_path, args, message):
    result = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--no-doctor", *args])
    assert result.exit_code == BadInputError.exit_code, result.output
    assert message in result.output


def test_a_file_that_is_no_waterfall_is_bad_input(tmp_path):
    bogus = tmp_path / "w.json"
    bogus.write_text("{}")
    result = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--no-doctor", "--waterfall", str(bogus)])
    assert result.exit_code == BadInputError.exit_code
    assert "not a recorded waterfall" in result.output


# ---- in a browser ----------------------------------------------------------------------------

def test_report_renders_in_a_browser(tmp_path, full_report):
    path = page.write_report(full_report, tmp_path / "report.html")
    dom, _ = dump_dom(path, tmp_path / "profile")
    n = len(page.figures(full_report))
    starts = [m.start() for m in re.finditer(r'<div[^>]*id="fig-\d+"', dom)]
    assert len(starts) == n, f"{len(starts)} figure divs in the DOM, expected {n}"
    for i, (a, b) in enumerate(zip(starts, starts[1:] + [len(dom)]), 1):
        # plotly draws each figure as <svg class="main-svg"> layers inside its div.
        assert 'class="main-svg"' in dom[a:b], f"figure {i} was not drawn"
