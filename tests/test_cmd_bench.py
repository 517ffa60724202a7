"""`jfa-prof bench` and `jfa-prof waterfall` end to end on a CPU: recorded files render, live
runs stop with NoGpuError (exit 3) before touching a GPU, bad options exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from jfa_prof.ablations import WaterfallRecord
from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings
from jfa_prof.cli import app

runner = CliRunner()
H200 = Path(__file__).resolve().parents[1] / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json"
POINT = "hsp Lq=256 max=2048 s=0.1"
FA4_FILE = H200.parent / "bench_fwd_hsp_h200_2026-11-30e.json"  # timed beside FA4


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------

def test_bench_recorded_json(tmp_path):
    html = tmp_path / "chart.html"
    d = _json(runner.invoke(app, ["bench", "--results", str(H200), "--json", "--html", str(html)]))
    assert d["origin"] == "recorded" and d["provenance"] == "recorded on NVIDIA H200 on 2026-11-30"
    assert len(d["results"]) == 18 and d["html"] == str(html) and html.stat().st_size > 1_000_000
    r = next(r for r in d["results"] if r["workload"]["label"] == POINT)
    assert r["impls"]["fa4"]["tflops"] == pytest.approx(278.609, abs=1e-3)
    assert r["best_peer"] == "fa4" and r["meta"]["gpu"] == "NVIDIA H200"
    assert "recorded on NVIDIA H200 on 2026-11-30" in html.read_text()
    # One roofline per record, in the records' order.
    roof = d["rooflines"][d["results"].index(r)]
    assert len(d["rooflines"]) == 18 and roof["bound"] == "memory" and roof["floor_ms"] == pytest.approx(0.147, abs=1e-3)
    assert roof["floor_ms"] == max(roof["compute_ms"], roof["memory_ms"])


def test_bench_recorded_tables():
    result = runner.invoke(app, ["bench", "--results", str(H200), "--label", POINT])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "recorded on NVIDIA H200 on 2026-11-30" in out
    # One point: the detailed table, then the summary with jfa-lpt (the baseline of that run).
    assert next(line for line in out.splitlines() if line.strip().startswith("fa4")).split()[:3] == \
        ["fa4", "0.3959", "279"]
    assert "jfa-lpt" in out and "÷fa4" in out
    *_, summary, roof = [line.split() for line in out.splitlines() if line.strip().startswith(POINT)]
    assert summary[-7:] == ["88", "279", "0.32", "–", "fa4", "279", "0.32"]  # one round each: none to count
    # The roofline: this point's unavoidable bytes take 0.147 ms at the H200's 4.8 TB/s; at a
    # memory-bound point each call's TB/s is its roof share of that bandwidth.
    assert roof[-6:] == ["memory", "0.147", "12%", "37%", "0.56", "1.78"]
    assert float(roof[-1]) == pytest.approx(0.37 * 4.8, abs=0.03)
    assert "Ceilings: HBM at the datasheet's 4.8 TB/s; tensor cores at the datasheet's peak" in out.replace("\n", " ")


def test_bench_roofline_at_the_runs_streaming_read(tmp_path):
    # A file with the streaming read and the matrix product measured in its run: the floors are
    # those rates, not the datasheet's, and a memory-bound point's roof is its share of the read.
    doc = json.loads(H200.read_text())
    doc["meta"]["stream_read"] = {"before_tb_s": 4.40, "after_tb_s": 4.45, "tb_s": 4.45, "method": "test"}
    doc["meta"]["matmul_peak"] = {"before_tflops": 790.0, "tflops": 790.0, "method": "test"}
    f = tmp_path / "with_read.json"
    f.write_text(json.dumps(doc))
    d = _json(runner.invoke(app, ["bench", "--results", str(f), "--json"]))
    i = next(i for i, r in enumerate(d["results"]) if r["workload"]["label"] == POINT)
    roof = d["rooflines"][i]
    assert roof["floor_ms"] == pytest.approx(0.147 * 4.8 / 4.45, abs=1e-3)
    assert roof["compute_ms"] == pytest.approx(d["results"][i]["flops"] / 790e12 * 1e3)
    assert d["roofline_ceilings"] == ("HBM at this run's streaming read, 4.45 TB/s; "
                                      "tensor cores at this run's matrix product, 790 TFLOPS")
    result = runner.invoke(app, ["bench", "--results", str(f), "--label", POINT])
    roof = [line.split() for line in result.stdout.splitlines() if line.strip().startswith(POINT)][-1]
    assert roof[-6:] == ["memory", "0.158", "13%", "40%", "0.56", "1.78"]
    assert "streaming read, 4.45 TB/s" in result.stdout.replace("\n", " ")


BWD = H200.with_name("bench_bwd_hsp_h200_2026-11-30.json")


def test_bench_recorded_backward():
    d = _json(runner.invoke(app, ["bench", "--results", str(BWD), "--pass", "bwd", "--json"]))
    assert len(d["results"]) == 18 and all(r["pass"] == "bwd" for r in d["results"])
    for r in d["results"]:
        w = r["workload"]
        # The SPEC's backward convention: 2.5x the forward's 4·H·D·Σ Lq·Lk (no window or causal here).
        assert r["flops"] == pytest.approx(2.5 * 4 * w["H"] * w["D"] * w["Lq"] * w["total_kv"], rel=1e-9)
        ours, fa4 = r["impls"]["jfa-lpt"], r["impls"]["fa4"]
        assert ours["ratio_vs_fa4"] == pytest.approx(fa4["ms"] / ours["ms"])
    # Checked against the fp32 reference's gradients on the first point, before any timing.
    first = d["results"][0]["impls"]
    assert all(e["rel_err_vs_ref"] < 2e-2 for e in first.values())
    result = runner.invoke(app, ["bench", "--results", str(BWD)])
    assert result.exit_code == 2 and "holds no fwd results" in result.output


def test_bench_recorded_filters():
    result = runner.invoke(app, ["bench", "--results", str(H200), "--grid", "jagged"])
    assert result.exit_code == 2 and "holds no fwd results for grid jagged" in result.output
    result = runner.invoke(app, ["bench", "--results", str(H200), "--no-detail"])
    assert result.exit_code == 0 and "implementation" not in result.stdout
    assert sum(line.strip().startswith("hsp ") for line in result.stdout.splitlines()) == 2 * 18  # summary, roofline


def test_bench_recorded_bad_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{}")
    result = runner.invoke(app, ["bench", "--results", str(p)])
    assert result.exit_code == 2 and "not a bench result file" in result.output


def test_bench_without_gpu_exits_3(no_gpu):
    result = runner.invoke(app, ["bench", "--label", POINT])
    assert result.exit_code == 3
    assert "no CUDA GPU is visible: jfa-prof bench needs an sm_90 GPU" in result.stderr
    assert "--results FILE" in result.stderr


def _split_dict(busy_share: float, blocks_part: float, *, variant: str = "fwd/x") -> dict:
    """A recorded time_split (one CTA-second of 132 CTAs, 1320 tiles of 5 and 15 blocks) whose pooled
    fit gives the busy time ``blocks_part`` on the blocks."""
    from jfa_prof.analyses.limits import FitSums

    b = 1_000.0
    a = b * 10 * (1 - blocks_part) / blocks_part  # a·tiles : b·blocks = (1 - part) : part, 10 blocks a tile
    x = np.array([5.0, 15.0] * 660)
    return {"n_ctas": 132, "makespan_ns": 1e6, "n_tiles": 1320, "n_blocks": 13200, "busy_ns": busy_share * 132e6,
            "a_ns": 0.0, "b_ns": 1.0, "r2": None, "sums": FitSums.of(x, a + b * x).__dict__, "variant": variant,
            "schedule": "dynamic", "profile_level": 1}


def test_bench_recorded_limits(tmp_path):
    """Points with a time split get a verdict against FA4 at their grid's target, from our time for
    the recorded schedule; a point whose recording failed says why; the others get none."""
    doc = json.loads(FA4_FILE.read_text())
    rec = doc["results"][1]  # ours 0.97x FA4 there: short of the 1.15x target
    rec["time_split"] = _split_dict(0.95, 0.8 / 0.95)  # blocks 80%, per tile 15%, idle 5%
    doc["results"][0]["time_split"] = {"error": "RuntimeError: 3 tile records dropped"}
    p = tmp_path / "limits.json"
    p.write_text(json.dumps(doc))
    d = _json(runner.invoke(app, ["bench", "--results", str(p), "--json"]))
    lims = d["point_limits"]
    assert lims[0] is None and all(x is None for x in lims[2:])
    lim = lims[1]
    fa4 = rec["impls"]["fa4"]["ms"]
    ours = min(rec["impls"][n]["ms"] for n in ("jfa-dynamic", "jfa-dynamic-planned"))
    assert (lim["ours_ms"], lim["peer_ms"], lim["target"], lim["timer"]) == (ours, fa4, 1.15, "ms")
    assert [lim[k] / ours for k in ("blocks_ms", "tile_ms", "idle_ms")] == pytest.approx([0.8, 0.15, 0.05])
    allowed = fa4 / 1.15
    assert 0.8 * ours < allowed < ours  # the blocks fit; the per-tile work (more than idle) does not
    assert lim["limit"] == "tile"
    assert lim["blocks_speedup_needed"] == pytest.approx(0.8 * ours / (allowed - 0.2 * ours))
    assert d["time_splits"][1]["pooled_over"] == 1 and d["time_splits"][1]["blocks_share"] == pytest.approx(0.8)
    result = runner.invoke(app, ["bench", "--results", str(p)], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "what limits each point" in result.stdout and "target 1.15× FA4 · call medians" in result.stdout
    assert f"{doc['results'][0]['workload']['label']}: no time split: RuntimeError: 3 tile records dropped" \
        in result.stdout


def test_bench_recorded_limits_chart(tmp_path):
    """With time splits, --html also writes what limits each point beside the TFLOPS chart."""
    res_file = H200.parents[2] / "limits" / "limits_fwd_hsp_h200_2026-11-30.json"
    html = tmp_path / "fwd.html"
    d = _json(runner.invoke(app, ["bench", "--results", str(res_file), "--json", "--html", str(html)]))
    page = tmp_path / "fwd-limits.html"
    assert d["limits_html"] == str(page) and page.stat().st_size > 1_000_000
    assert "what limits each point" in page.read_text()
    plain = _json(runner.invoke(app, ["bench", "--results", str(H200), "--json", "--html", str(tmp_path / "x.html")]))
    assert plain["limits_html"] is None and not (tmp_path / "x-limits.html").exists()


def test_bench_limits_pool_over_the_whole_file_whatever_is_shown(tmp_path):
    """Two points of one kernel, each with one tile size: together they separate per tile from per
    block. Showing one of them (--label) must not change its split."""
    from jfa_prof.analyses.limits import FitSums

    doc = json.loads(FA4_FILE.read_text())
    for rec, n in zip(doc["results"][:2], (2.0, 8.0)):
        x = np.full(1320, n)
        rec["time_split"] = {"n_ctas": 132, "makespan_ns": 1e6, "n_tiles": 1320, "n_blocks": int(1320 * n),
                             "busy_ns": float((3_000.0 + 1_000.0 * x).sum()), "a_ns": 0.0, "b_ns": 1.0, "r2": None,
                             "sums": FitSums.of(x, 3_000.0 + 1_000.0 * x).__dict__, "variant": "fwd/x",
                             "schedule": "dynamic"}
    p = tmp_path / "pool.json"
    p.write_text(json.dumps(doc))
    label = doc["results"][0]["workload"]["label"]
    whole = _json(runner.invoke(app, ["bench", "--results", str(p), "--json"]))["time_splits"][0]
    alone = _json(runner.invoke(app, ["bench", "--results", str(p), "--json", "--label", label]))["time_splits"]
    assert len(alone) == 1 and alone[0] == whole
    assert (whole["a_ns"], whole["b_ns"], whole["pooled_over"], whole["separable"]) == pytest.approx(
        (3_000.0, 1_000.0, 2, True))


def test_bench_limits_without_fa4_say_why_there_is_no_verdict(tmp_path):
    doc = json.loads(FA4_FILE.read_text())
    doc["results"][1]["time_split"] = _split_dict(0.95, 0.8 / 0.95)
    for r in doc["results"]:
        r["impls"].pop("fa4")
    p = tmp_path / "nofa4.json"
    p.write_text(json.dumps(doc))
    result = runner.invoke(app, ["bench", "--results", str(p)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "time splits recorded, but no verdict: one needs FA4's time" in result.stdout


def test_bench_limits_compare_gpu_time_where_the_run_took_it(tmp_path):
    """With --limits the run takes each implementation's GPU time per call; the verdict uses it,
    so a short call whose median is the host's launch path is judged by its kernel."""
    doc = json.loads(FA4_FILE.read_text())
    rec = doc["results"][0]
    rec["time_split"] = _split_dict(1.0, 1.0 - 1e-9)  # all busy, (nearly) all on the blocks
    for name, e in rec["impls"].items():
        e["gpu_ms"] = {"fa4": 0.130, "jfa-dynamic": 0.140, "jfa-dynamic-planned": 0.120}.get(name)
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps(doc))
    d = _json(runner.invoke(app, ["bench", "--results", str(p), "--json"]))
    first = d["point_limits"][0]
    assert first["timer"] == "gpu_ms" and (first["ours_ms"], first["peer_ms"]) == (0.120, 0.130)
    assert first["limit"] == "blocks" and first["blocks_ms"] == pytest.approx(0.120)
    assert first["blocks_speedup_needed"] == pytest.approx(0.120 / (0.130 / 1.15), rel=1e-6)
    result = runner.invoke(app, ["bench", "--results", str(p)], terminal_width=120)
    assert "GPU time per call" in result.stdout and "blocks×1.06" in result.stdout


def test_bench_live_keeps_the_points_measured_before_a_failure(tmp_path, monkeypatch):
    """A live run writes each finished point to --out at once; --limits reaches run_bench."""
    from jfa_prof import bench as lib
    from jfa_prof import timing

    recorded = lib.load_results(H200).records
    seen = {}

    def fake_run_bench(workloads, *, on_impl, on_point, limits, rounds, **kw):
        seen["limits"], seen["rounds"] = limits, rounds
        on_impl(workloads[0].label, "jfa-dynamic")
        on_point({k: v for k, v in recorded[0].items() if k != "meta"})
        raise RuntimeError("the GPU fell off the bus")

    monkeypatch.setattr(timing, "require_gpu", lambda *a, **k: None)
    monkeypatch.setattr(timing, "stream_read_tb_s", lambda: 4.4)
    monkeypatch.setattr(timing, "matmul_tflops", lambda: 780.0)
    monkeypatch.setattr(lib, "run_bench", fake_run_bench)
    out = tmp_path / "partial.json"
    result = runner.invoke(app, ["bench", "--peers", "", "--limits", "--out", str(out)])
    assert isinstance(result.exception, RuntimeError) and seen["limits"] is True and seen["rounds"] == 3
    kept = lib.load_results(out)
    assert [r["workload"]["label"] for r in kept.records] == [recorded[0]["workload"]["label"]]
    # The streaming read taken before the points is in the file already; the one after never ran.
    assert kept.meta["stream_read"]["before_tb_s"] == 4.4 and "after_tb_s" not in kept.meta["stream_read"]
    assert kept.stream_tb_s == 4.4 and kept.matmul_tflops == 780.0
    assert kept.records[0]["impls"] == recorded[0]["impls"] and kept.meta["command"].startswith("jfa-prof")
    assert kept.meta["timer"].endswith("median of 3 rounds timing every implementation in turn")


@pytest.mark.parametrize("args, message", [
    (["--peers", "fa4,fa3"], "unknown peer(s): fa3"),
    (["--pass", "dq"], "unknown pass 'dq'"),
    (["--schedule", "lpt,zigzag"], "unknown schedule(s): zigzag"),
    (["--grid", "sparse"], "unknown grid 'sparse'"),
    (["--label", "hsp Lq=64"], "no hsp workload labelled"),
])
def test_bench_bad_options_exit_2_before_the_gpu(no_gpu, args, message):
    result = runner.invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# ---------------------------------------------------------------------------------------------
# waterfall
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def recorded(tmp_path):
    t = WaterfallTimings(1.0, 0.96875, (
        AblationTiming("no_o_store", "skips the output stores", 0.875, 0.875, 1),
        AblationTiming("no_exp", "no exponentials", 0.75, 0.5, 2),
        AblationTiming("reuse_kv", "no K/V loads", 0.984375, 0.25, 4),
    ))
    rec = WaterfallRecord(t, {"label": "hsp Lq=256 max=2048 s=0.5", "grid": "hsp"}, "lpt",
                          {"gpu": "NVIDIA H200", "date": "2026-12-01T08:00:00+00:00"}, flops=4e11)
    p = tmp_path / "wf.json"
    p.write_text(json.dumps(rec.to_dict()))
    return p


def test_waterfall_recorded(tmp_path, recorded):
    html = tmp_path / "wf.html"
    result = runner.invoke(app, ["waterfall", "--results", str(recorded), "--out", str(html)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "hsp Lq=256 max=2048 s=0.5" in out and "recorded on NVIDIA H200 on 2026-12-01" in out
    assert "baseline 400 TFLOPS" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("exponentials"))
    assert row.split() == ["exponentials", "0.7500", "0.2500", "25.0%", "0.5000", "0.3750", "37.5%"]
    assert f"wrote {html}" in out and html.stat().st_size > 1_000_000
    assert "recorded on NVIDIA H200 on 2026-12-01" in html.read_text()


def test_waterfall_recorded_json(tmp_path, recorded):
    d = _json(runner.invoke(app, ["waterfall", "--results", str(recorded), "--out", str(tmp_path / "w.html"),
                                  "--json"]))
    assert d["origin"] == "recorded" and d["kind"] == "jfa-prof waterfall" and d["schedule"] == "lpt"
    wf = d["waterfall"]
    assert wf["basis"] == "cumulative" and wf["noise_ms"] == 0.03125 and wf["remainder_ms"] == 0.25
    assert [c["step_saving_ms"] for c in wf["components"]] == [0.125, 0.375, 0.25]
    assert [c["alone_significant"] for c in wf["components"]] == [True, True, False]
    # The JSON is itself a record: it renders again.
    again = tmp_path / "again.json"
    again.write_text(json.dumps(d))
    result = runner.invoke(app, ["waterfall", "--results", str(again), "--out", str(tmp_path / "w2.html")])
    assert result.exit_code == 0, result.output


def test_waterfall_results_must_be_a_waterfall(tmp_path):
    result = runner.invoke(app, ["waterfall", "--results", str(H200), "--out", str(tmp_path / "w.html")])
    assert result.exit_code == 2 and "not a recorded waterfall" in result.output


def test_waterfall_without_gpu_exits_3(tmp_path, no_gpu):
    result = runner.invoke(app, ["waterfall", "--pass", "fwd", "--cumulative", "--out", str(tmp_path / "w.html")])
    assert result.exit_code == 3
    assert "jfa-prof waterfall needs an sm_90 GPU" in result.stderr and "--results FILE" in result.stderr
    assert not (tmp_path / "w.html").exists()


@pytest.mark.parametrize("args, message", [
    (["--pass", "both"], "unknown pass 'both'"),
    (["--schedule", "zigzag"], "unknown fwd schedule 'zigzag'"),
    (["--pass", "bwd", "--schedule", "lpt"], "unknown bwd schedule 'lpt'"),
    (["--dq", "tma"], "--dq applies to the backward only"),
    (["--pass", "bwd", "--dq", "fast"], "unknown dQ reduction 'fast'"),
    (["--max-kv", "333"], "no hsp workload"),
])
def test_waterfall_bad_options_exit_2(tmp_path, no_gpu, args, message):
    result = runner.invoke(app, ["waterfall", *args, "--out", str(tmp_path / "w.html")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--pass", "bwd", "--no-peel"], "--no-peel applies to the forward only"),
    (["--dq", "tma"], "--dq applies to the backward only"),
    (["--pass", "bwd", "--schedule", "lpt"], "unknown bwd schedule 'lpt'"),
])
def test_record_bad_options_exit_2(tmp_path, no_gpu, args, message):
    result = runner.invoke(app, ["record", *args, "-o", str(tmp_path / "t.jfatrace")])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
