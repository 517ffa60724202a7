"""Bench charts and tables on the committed H200 results."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from jfa_prof.bench import load_results
from jfa_prof.render.bench import bench_table, facets, impl_order, summary_table, tflops_figure

H200 = Path(__file__).resolve().parents[1] / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json"


@pytest.fixture(scope="module")
def frame():
    return load_results(H200).frame()


def test_facets_and_order(frame):
    assert facets(frame) == ([128, 256], [1024, 2048, 4096])
    assert impl_order(frame)[-2:] == ["torch-varlen", "fa4"]
    assert impl_order(frame, ["fa4"]) == ["fa4"]


def test_tflops_figure(frame):
    fig = tflops_figure(frame, title="fwd", subtitle="recorded on NVIDIA H200 on 2026-11-30")
    d = fig.to_dict()
    # 6 panels × 8 implementations, 3 sparsities each.
    assert len(d["data"]) == 48 and all(list(t["x"]) == [0.1, 0.5, 0.9] for t in d["data"])
    assert [t["name"] for t in d["data"] if t["showlegend"]] == impl_order(frame)
    titles = [a["text"] for a in d["layout"]["annotations"]]
    assert titles == [f"Lq={lq} · max_kv={m}" for lq in (128, 256) for m in (1024, 2048, 4096)]
    # Panel (Lq=256, max_kv=2048) is row 2, column 2: the 5th axis pair.
    fa4 = next(t for t in d["data"] if t["name"] == "fa4" and t["xaxis"] == "x5")
    assert [round(v) for v in fa4["y"]] == [279, 447, 497]
    assert fa4["line"]["dash"] == "dash"
    ours = next(t for t in d["data"] if t["name"] == "jfa-lpt-planned" and t["xaxis"] == "x5")
    assert ours["line"]["dash"] == "solid" and [round(v) for v in ours["y"]] == [260, 437, 451]
    # One colour per implementation across panels.
    assert len({t["line"]["color"] for t in d["data"] if t["name"] == "fa4"}) == 1
    assert "recorded on NVIDIA H200 on 2026-11-30" in d["layout"]["title"]["text"]


def test_tflops_figure_skips_failed_points(frame):
    f = frame.copy()
    f.loc[(f["impl"] == "fa4") & (f["sparsity"] == 0.1), ["tflops", "error"]] = [float("nan"), "boom"]
    d = tflops_figure(f).to_dict()
    assert all(list(t["x"]) == [0.5, 0.9] for t in d["data"] if t["name"] == "fa4")
    with pytest.raises(ValueError):
        tflops_figure(frame.iloc[0:0])


def test_tables(frame):
    buf = io.StringIO()
    console = Console(file=buf, width=100, highlight=False)
    point = frame[frame["label"] == "hsp Lq=256 max=2048 s=0.1"]
    bench_table(point, console, title="t")
    summary_table(frame, console, ours="jfa-lpt-planned")
    out = buf.getvalue()
    fa4 = next(line for line in out.splitlines() if line.strip().startswith("fa4"))
    # ÷fa4, then host µs and GPU µs: this file is older than those figures.
    assert fa4.split()[:6] == ["fa4", "0.3959", "279", "1.00", "–", "–"]
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("hsp ")]
    assert len(rows) == 1 + 18  # the point's section, then one summary row per point
    assert rows[1 + 12][:4] == ["hsp", "Lq=256", "max=2048", "s=0.1"]
    assert rows[1 + 12][4:] == ["260", "279", "0.93", "–", "fa4", "279", "0.93"]  # one round: none to count
    # Both tables show the ratio of whole calls, and say so: ÷fa4 alone was also used for GPU time.
    assert "÷fa4 call" in out and "÷best call" in out  # the footnote
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("implementation"))
    assert lines[header - 1].split() == ["÷fa4", "host", "GPU"] and lines[header].split()[3:6] == ["call", "µs", "µs"]
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("workload"))
    assert lines[header - 1].split() == ["÷fa4", "rounds", "÷best"]
    assert lines[header].split()[3:] == ["call", "ahead", "best", "peer", "call"]


def test_the_summary_counts_the_rounds_ours_was_ahead_of_fa4():
    # A file timed in alternated rounds (H100, 2026-12-06): at Lq=128 max=1024 s=0.5 FA4 was faster in
    # every round, at Lq=128 max=1024 s=0.1 ours was.
    f = Path(__file__).resolve().parents[1] / "benchmarks/results/bench/superseded/bench_fwd_hsp_h100_2026-12-06b.json"
    buf = io.StringIO()
    summary_table(load_results(f).frame(), Console(file=buf, width=120, highlight=False), ours="jfa-dynamic")
    rows = {" ".join(line.split()[:4]): line.split()[4:] for line in buf.getvalue().splitlines()
            if line.strip().startswith("hsp ")}
    assert rows["hsp Lq=128 max=1024 s=0.5"][2:4] == ["0.97", "0/3"]
    assert rows["hsp Lq=128 max=1024 s=0.1"][2:4] == ["1.17", "3/3"]
    assert "rounds ahead: the rounds" in buf.getvalue()


def test_the_two_ratios_to_fa4_are_named_apart():
    from jfa_prof.analyses.limits import FitSums, TimeSplit, point_limit
    from jfa_prof.render.bench import limits_figure, limits_table

    split = TimeSplit(n_ctas=1, makespan_ns=1_000.0, n_tiles=10, n_blocks=10, busy_ns=900.0, a_ns=20.0, b_ns=70.0,
                      r2=1.0, sums=FitSums())
    for timer, name in (("gpu_ms", "÷fa4 GPU"), ("ms", "÷fa4 call")):
        lim = point_limit(split, 1.0, 1.22, 1.5, timer=timer)
        buf = io.StringIO()
        limits_table(["a"], [lim], [split], Console(file=buf, width=120, highlight=False))
        lines = buf.getvalue().splitlines()
        i = next(i for i, line in enumerate(lines) if "workload" in line)
        assert lines[i - 1].split() == ["÷fa4"] and lines[i].split()[1] == name.split()[1]
        hover = limits_figure(["a"], [lim]).to_dict()["data"][0]
        assert hover["customdata"][0][3] == name and "%{customdata[3]}" in hover["hovertemplate"]


def test_tflops_hover_names_the_call_ratio(frame):
    d = tflops_figure(frame).to_dict()
    assert all("÷fa4 call" in t["hovertemplate"] and "vs FA4" not in t["hovertemplate"] for t in d["data"])


def test_table_shows_failures(frame):
    f = frame[frame["label"] == "hsp Lq=256 max=2048 s=0.1"].copy()
    f.loc[f["impl"] == "torch-varlen", ["ms", "tflops", "error"]] = [float("nan"), float("nan"), "OutOfMemoryError"]
    buf = io.StringIO()
    bench_table(f, Console(file=buf, width=100, highlight=False))
    out = buf.getvalue()
    assert next(line for line in out.splitlines() if "torch-varlen" in line).split() == ["torch-varlen", "failed"]
    assert "hsp Lq=256 max=2048 s=0.1 · torch-varlen: OutOfMemoryError" in out


def test_limits_figure_stacks_the_split_in_units_of_the_allowed_time():
    from jfa_prof.analyses.limits import FitSums, TimeSplit, point_limit
    from jfa_prof.render.bench import limits_figure

    split = TimeSplit(n_ctas=1, makespan_ns=1_000.0, n_tiles=10, n_blocks=10, busy_ns=900.0, a_ns=20.0, b_ns=70.0,
                      r2=1.0, sums=FitSums())  # blocks 70%, tile 20%, idle 10%
    lims = [point_limit(split, 1.0, 1.15, 1.15), None, point_limit(split, 2.0, 1.15, 1.15)]
    fig = limits_figure(["a", "b", "c"], lims, subtitle="H200")
    d = fig.to_dict()
    bars = {t["name"]: t for t in d["data"]}
    assert list(bars) == ["blocks", "per tile", "idle"] and list(bars["blocks"]["y"]) == ["a", "c"]
    assert list(bars["blocks"]["x"]) == pytest.approx([0.7, 1.4]) and list(bars["idle"]["x"]) == pytest.approx([0.1, 0.2])
    assert [c[1] for c in bars["idle"]["customdata"]] == ["met", "blocks"]
    assert d["layout"]["shapes"][0]["x0"] == 1.0 and "H200" in d["layout"]["title"]["text"]
    with pytest.raises(ValueError, match="no point"):
        limits_figure(["a"], [None])


def test_vs_fa4_figure_sets_the_ratio_beside_the_memory():
    from jfa_prof.render.bench import vs_fa4_figure

    d = vs_fa4_figure(["a", "b"], [0.9, 1.3], [100.0, 200.0], [150.0, 400.0], target=1.5, subtitle="H200").to_dict()
    ratio, ours, fa4 = d["data"]
    assert list(ratio["y"]) == ["a", "b"] and list(ratio["x"]) == [0.9, 1.3] and ratio["xaxis"] == "x"
    assert (ours["name"], list(ours["x"]), ours["xaxis"]) == ("ours", [100.0, 200.0], "x2")
    assert list(fa4["x"]) == [150.0, 400.0]
    assert [s["x0"] for s in d["layout"]["shapes"]] == [1.0, 1.5]
    assert "÷fa4 call" in d["layout"]["annotations"][0]["text"] and "width" not in d["layout"]
    with pytest.raises(ValueError, match="one ratio"):
        vs_fa4_figure(["a"], [1.0, 2.0], [1.0], [1.0])
