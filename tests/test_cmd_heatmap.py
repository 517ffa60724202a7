"""`jfa-prof heatmap`, `timeline` and `barriers` end to end on generated trace files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import tracegen
from jfa_prof import trace as trace_mod
from jfa_prof.cli import app
from jfa_prof.commands import heatmap as heatmap_cmd
from jfa_prof.trace import write_trace

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    lengths = np.random.default_rng(5).integers(1, 17, size=400)
    out = {}
    for schedule in ("lpt", "dynamic"):
        buf, meta, _ = tracegen.persistent_run(lengths, n_ctas=16, n_sms=16, schedule=schedule)
        out[schedule] = write_trace(d / f"{schedule}.jfatrace", buf, {**meta, "kernel_ms": 0.5})
    buf, meta, _ = tracegen.persistent_run(lengths, n_ctas=16, n_sms=16, schedule="dynamic", capacity=300)
    out["full"] = write_trace(d / "full.jfatrace", buf, meta)
    return out


@pytest.fixture
def no_live(monkeypatch):
    """Keep the commands off any GPU the test machine may have: they must use files."""
    monkeypatch.setattr(heatmap_cmd, "_record_live", lambda *a, **k: None)


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_heatmap_off_and_on_from_files(tmp_path, files, no_live):
    html = tmp_path / "h.html"
    result = runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--trace", str(files["dynamic"]),
                                 "--out", str(html)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "clc off: lpt" in out and "clc on: dynamic" in out
    assert "atomic tile counter" in out and "Hopper has no CLC" in out
    assert "SM imbalance" in out and "dynamic (clc on) vs lpt (clc off): makespan" in out
    assert f"wrote {html}" in out and html.stat().st_size > 1_000_000


def test_heatmap_json(tmp_path, files, no_live):
    d = _json(runner.invoke(app, ["heatmap", "--trace", str(files["dynamic"]), "--trace", str(files["lpt"]),
                                  "--out", str(tmp_path / "h.html"), "--json"]))
    assert [p["clc"] for p in d["panels"]] == ["off", "on"]
    off, on = d["panels"]
    assert off["schedule"] == "lpt" and on["schedule"] == "dynamic" and "Hopper has no CLC" in on["mechanism"]
    assert off["origin"] == "file" and off["kernel_ms"] == 0.5 and off["n_sms"] == 16
    assert off["imbalance"]["n_tiles"] == 400 and off["imbalance"]["makespan_ns"] > 0
    assert d["warnings"] == [] and d["html"].endswith("h.html")


def test_heatmap_trace_on_forces_the_dynamic_side(tmp_path, files, no_live):
    d = _json(runner.invoke(app, ["heatmap", "--trace-on", str(files["lpt"]), "--clc", "on",
                                  "--out", str(tmp_path / "h.html"), "--json"]))
    assert [p["clc"] for p in d["panels"]] == ["on"]


def test_heatmap_predict(tmp_path, files, no_live):
    d = _json(runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--predict",
                                  "--out", str(tmp_path / "h.html"), "--json"]))
    assert [(p["clc"], p["kind"]) for p in d["panels"]] == [("off", "measured"), ("off", "predicted")]
    pred = d["panels"][0]["prediction"]
    assert abs(pred["makespan_error"]) < 1e-6 and pred["cta_agreement"] == 1.0
    assert pred["cost_model"]["a_ns"] == pytest.approx(2000) and pred["cost_model"]["b_ns"] == pytest.approx(500)
    assert d["panels"][1]["origin"] == "simulated"


def test_heatmap_predict_tables(tmp_path, files, no_live):
    result = runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--trace", str(files["dynamic"]),
                                 "--predict", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 0, result.output
    assert "prediction vs measurement" in result.stdout and "predicted" in result.stdout


def test_heatmap_reports_dropped_records(tmp_path, files, no_live):
    result = runner.invoke(app, ["heatmap", "--trace", str(files["full"]), "--out", str(tmp_path / "h.html"), "--json"])
    d = _json(result)
    assert d["panels"][0]["dropped"] == 100
    assert any("100 tile record(s) dropped" in w for w in d["warnings"])
    assert "100 tile record(s) dropped" in result.stderr
    result = runner.invoke(app, ["heatmap", "--trace", str(files["full"]), "--out", str(tmp_path / "h.html")])
    assert "WARNING" in result.stdout and "100 tile record(s) dropped" in result.stdout


def test_heatmap_bad_inputs(tmp_path, files, no_live):
    result = runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--clc", "on", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 2 and "needs a clc on" in result.output
    result = runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--trace", str(files["lpt"])])
    assert result.exit_code == 2 and "two --clc off traces" in result.output
    result = runner.invoke(app, ["heatmap", "--trace", str(tmp_path / "missing.jfatrace")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_heatmap_without_gpu_or_bundled_data(tmp_path, monkeypatch, no_live):
    monkeypatch.setattr(trace_mod, "bundled_dir", lambda: tmp_path / "empty")
    result = runner.invoke(app, ["heatmap", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 2
    assert "no bundled" in result.output and "--trace" in result.output


def test_heatmap_uses_bundled_recordings(tmp_path, monkeypatch, files, no_live):
    bundled = tmp_path / "data"
    bundled.mkdir()
    (bundled / "h200_hsp_lq256_kv2048_s0.5_static.jfatrace").write_bytes(files["lpt"].read_bytes())
    (bundled / "h200_hsp_lq256_kv2048_s0.5_dynamic.jfatrace").write_bytes(files["dynamic"].read_bytes())
    monkeypatch.setattr(trace_mod, "bundled_dir", lambda: bundled)
    result = runner.invoke(app, ["heatmap", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("bundled H200 recording (not live)") == 2
    d = _json(runner.invoke(app, ["heatmap", "--clc", "on", "--out", str(tmp_path / "h.html"), "--json"]))
    assert [p["origin"] for p in d["panels"]] == ["bundled"]
    assert d["panels"][0]["source"].startswith("bundled H200 recording (not live)")
    result = runner.invoke(app, ["heatmap", "--max-kv", "4096", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 2 and "max_kv=4096" in result.output


# ---------------------------------------------------------------------------------------------
# timeline and barriers
# ---------------------------------------------------------------------------------------------

def test_timeline(tmp_path, files):
    out, html = tmp_path / "trace.json", tmp_path / "gantt.html"
    result = runner.invoke(app, ["timeline", "--trace", str(files["dynamic"]), "--out", str(out), "--html", str(html),
                                 "--sm-range", "0:4"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert {e["pid"] for e in doc["traceEvents"]} <= {0, 1, 2, 3}
    assert "ui.perfetto.dev" in result.stdout and html.is_file()


def test_timeline_all_sms(tmp_path, files):
    out = tmp_path / "trace.json"
    result = runner.invoke(app, ["timeline", "--trace", str(files["lpt"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert sum(e.get("cat") == "tile" for e in doc["traceEvents"]) == 400
    assert "400 tiles on 16 SMs" in result.stdout


@pytest.mark.parametrize("bad", ["a:b", "5:2", "-1:3"])
def test_timeline_bad_sm_range(tmp_path, files, bad):
    result = runner.invoke(app, ["timeline", "--trace", str(files["lpt"]), f"--sm-range={bad}",
                                 "--out", str(tmp_path / "t.json")])
    assert result.exit_code == 2 and "--sm-range" in result.output


def test_barriers(files):
    result = runner.invoke(app, ["barriers", "--trace", str(files["lpt"]), "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "barrier waits" in result.stdout and "k_full" in result.stdout and "% kernel" in result.stdout


def test_barriers_json(files):
    d = _json(runner.invoke(app, ["barriers", "--trace", str(files["lpt"]), "--json"]))
    assert d["share_basis"] == "role spans" and d["origin"] == "file"
    assert d["sites"][0]["cycles"] == max(s["cycles"] for s in d["sites"])
    assert {s["site"] for s in d["sites"]} == {"k_empty", "v_empty", "k_full", "v_full", "mma_turn"}


def test_barriers_without_any_trace(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_mod, "bundled_dir", lambda: tmp_path)
    result = runner.invoke(app, ["barriers"])
    assert result.exit_code == 2 and "--trace" in result.output


def test_barriers_refuses_a_trace_without_waits(tmp_path):
    """A level-1 recording has no barrier-wait data: say so instead of showing zeros."""
    from typer.testing import CliRunner

    from jfa_prof.cli import app
    from jfa_prof.trace import read_trace, write_trace

    src = read_trace(sorted((Path(__file__).parent / "data" / "traces").glob("small_*.jfatrace"))[0])
    meta = dict(src.meta, profile_level=1)
    path = write_trace(tmp_path / "tiles_only.jfatrace", src.buffer, meta)
    result = CliRunner().invoke(app, ["barriers", "--trace", str(path)])
    assert result.exit_code == 2
    assert "level 1" in result.output


def test_heatmap_of_a_recorded_backward(tmp_path, no_live):
    """A real H200 backward recording (tiles are KV blocks, one role): the same views work."""
    from jfa_prof.trace import read_trace

    path = Path(__file__).parent / "data" / "traces" / "h200_bwd_hsp_lq256_kv2048_s0.5_static.jfatrace"
    tr = read_trace(path)
    assert tr.meta["kernel"]["pass"] == "bwd" and tr.meta["layout"]["roles"] == ["compute"]
    assert len(tr.tiles) == tr.meta["n_work"] and tr.dropped == 0
    assert abs(tr.makespan_ns / 1e6 / tr.meta["kernel_ms"] - 1) < 0.01  # the records span the kernel
    d = _json(runner.invoke(app, ["heatmap", "--trace", str(path), "--out", str(tmp_path / "h.html"), "--json"]))
    (panel, ) = d["panels"]
    assert panel["mechanism"].startswith("persistent CTAs deal the valid (batch, kv head, KV block) tiles")
    assert panel["n_ctas"] == 132 and panel["dropped"] == 0


@pytest.fixture(scope="module")
def random_words(tmp_path_factory, files):
    """A trace whose records are random words (a sound header and metadata)."""
    tr = trace_mod.read_trace(files["lpt"])
    bad = np.random.default_rng(1).integers(-2**62, 2**62, size=tr.buffer.size, dtype=np.int64)
    bad[:8] = tr.buffer[:8]
    return write_trace(tmp_path_factory.mktemp("bad") / "random.jfatrace", bad, tr.meta)


@pytest.mark.parametrize("cmd", [["heatmap", "--trace"], ["timeline", "--trace"], ["barriers", "--trace"],
                                 ["report", "--no-doctor", "--trace"]])
def test_records_of_random_words_are_one_line_and_exit_2(tmp_path, no_live, random_words, cmd):
    out = [] if cmd[0] == "barriers" else ["--out", str(tmp_path / "x.out")]
    result = runner.invoke(app, [*cmd, str(random_words), *out])
    assert result.exit_code == 2, result.output
    # report logs its steps before (stderr is no terminal here); the error is one line, the last
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("reading ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "corrupt" in lines[0], result.output
    assert not (tmp_path / "x.out").exists()


def test_recordings_of_different_workloads_are_not_compared(tmp_path, files, no_live):
    tr = trace_mod.read_trace(files["dynamic"])
    other = write_trace(tmp_path / "other.jfatrace", tr.buffer,
                        {**tr.meta, "workload": {**tr.meta["workload"], "label": "hsp Lq=128 max=2048 s=0.5"}})
    result = runner.invoke(app, ["heatmap", "--trace", str(files["lpt"]), "--trace", str(other),
                                 "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 2, result.output
    assert "different workloads" in result.stderr and "hsp Lq=128 max=2048 s=0.5" in result.stderr
    assert not (tmp_path / "h.html").exists()


def test_bundled_heatmap_shows_static_lpt_and_dynamic_and_says_what_each_is(tmp_path, no_live):
    html = tmp_path / "h.html"
    result = runner.invoke(app, ["heatmap", "--out", str(html)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "static: no tile scheduler, the baseline" in out and "clc off: lpt" in out and "clc on: dynamic" in out
    # every schedule against the static baseline, then the queue against LPT, each named
    assert "lpt (clc off) vs static: makespan +11.6%" in out
    assert "dynamic (clc on) vs static: makespan -7.8%" in out
    assert "dynamic (clc on) vs lpt (clc off): makespan -17.4%" in out
    page = html.read_text()
    assert "bundled H200 recordings, not live" in page
    d = _json(runner.invoke(app, ["heatmap", "--out", str(html), "--json"]))
    assert [p["clc"] for p in d["panels"]] == ["static", "off", "on"]
    assert [p["schedule"] for p in d["panels"]] == ["static", "lpt", "dynamic"]
    assert d["bundled"] is True and all(p["origin"] == "bundled" for p in d["panels"])
    on_only = _json(runner.invoke(app, ["heatmap", "--clc", "on", "--out", str(html), "--json"]))
    assert [p["clc"] for p in on_only["panels"]] == ["on"]


def test_a_static_file_beside_an_lpt_one_is_the_baseline(tmp_path, files, no_live):
    tr = trace_mod.read_trace(files["lpt"])
    static = write_trace(tmp_path / "static.jfatrace", tr.buffer, {**tr.meta, "schedule": "static",
                                                                     "schedule_mechanism": None})
    d = _json(runner.invoke(app, ["heatmap", "--trace", str(static), "--trace", str(files["lpt"]),
                                  "--trace", str(files["dynamic"]), "--out", str(tmp_path / "h.html"), "--json"]))
    assert [(p["clc"], p["schedule"]) for p in d["panels"]] == [("static", "static"), ("off", "lpt"),
                                                                 ("on", "dynamic")]
    assert d["bundled"] is False


def test_timeline_json_and_files_say_they_come_from_bundled_recordings(tmp_path):
    out, html = tmp_path / "t.json", tmp_path / "g.html"
    result = runner.invoke(app, ["timeline", "--out", str(out), "--html", str(html), "--json"])
    d = _json(result)
    assert d["bundled"] is True and d["origin"] == "bundled" and "not live" in d["source"]
    assert d["json"] == str(out) and d["html"] == str(html) and d["tiles"] == 8192 and d["sms"] == 132
    # The default is the level-3 forward recording: every role's every tile, and the hand-offs between them.
    assert d["level"] == 3 and d["events"] == 3 * 8192 and d["roles"] == ["producer", "consumer0", "consumer1"]
    assert d["flows"] == 2 * 8192
    meta = json.loads(out.read_text())["metadata"]
    assert meta["bundled"] is True and "not live" in meta["source"]
    assert "bundled H200 recording, not live" in html.read_text()


def test_timeline_json_from_a_file(tmp_path, files):
    d = _json(runner.invoke(app, ["timeline", "--trace", str(files["lpt"]), "--out", str(tmp_path / "t.json"),
                                  "--sm-range", "0:4", "--json"]))
    assert d["bundled"] is False and d["origin"] == "file" and d["sm_range"] == [0, 4] and d["sms"] == 4
    assert json.loads((tmp_path / "t.json").read_text())["metadata"]["bundled"] is False


def test_heatmap_page_draws_every_panel_within_the_window_in_a_browser(tmp_path):
    # The three panels and the colour scale fit a 1280-pixel window (the figure follows the window's
    # width), and the figures the page states are on the chart.
    import re

    from tests.browser import dump_dom

    out = tmp_path / "heatmap.html"
    result = runner.invoke(app, ["heatmap", "--clc", "both", "--out", str(out)])
    assert result.exit_code == 0, result.output
    dom, _ = dump_dom(out, tmp_path / "profile", window=(1280, 900))
    widths = [float(w) for w in re.findall(r'<svg class="main-svg"[^>]*?width="([\d.]+)"', dom)]
    assert widths and max(widths) <= 1280, widths
    assert "makespan" in dom and "bundled" in dom.lower()
