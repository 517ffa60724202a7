"""The waterfall chart's data and the table, from hand-made timings."""
from __future__ import annotations

import io

from rich.console import Console

from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings, waterfall
from jfa_prof.render.waterfall import bar_labels, waterfall_figure, waterfall_table


def _wf(cumulative=True):
    a = (AblationTiming("no_o_store", "stores <o>", 0.875, 0.875 if cumulative else None, 1),
         AblationTiming("no_exp", "exp", 0.75, 0.5 if cumulative else None, 2),
         AblationTiming("reuse_kv", "loads", 0.984375, 0.25 if cumulative else None, 4))
    return waterfall(WaterfallTimings(1.0, 0.96875, a))


def test_figure_data_cumulative():
    fig = waterfall_figure(_wf(), title="t", subtitle="recorded on NVIDIA H200 on 2026-11-30")
    d = fig.to_dict()
    (trace,) = d["data"]
    assert trace["type"] == "waterfall"
    # Readable names on the chart; the ablation keys stay in the hover.
    assert list(trace["x"]) == ["baseline", "output store", "exponentials", "K/V loads", "remainder"]
    assert list(trace["measure"]) == ["absolute", "relative", "relative", "relative", "total"]
    assert list(trace["y"]) == [1.0, -0.125, -0.375, -0.25, 0.0]
    # One sign convention: a piece's time is positive when it costs time.
    assert list(trace["text"]) == ["1.0000 ms", "0.1250 ms (12.5%)", "0.3750 ms (37.5%)", "0.2500 ms (25.0%)",
                                   "0.2500 ms (25.0%)"]
    assert "output store (no_o_store): stores &lt;o&gt;" in trace["hovertext"]
    title = d["layout"]["title"]["text"]
    assert "recorded on NVIDIA H200 on 2026-11-30" in title and "cumulative ablations" in title
    assert "±0.0312 ms" in title


def test_figure_data_alone_marks_noise():
    wf = _wf(cumulative=False)
    trace = waterfall_figure(wf).to_dict()["data"][0]
    assert list(trace["x"])[-1] == "remainder (indicative)"
    assert list(trace["y"]) == [1.0, -0.125, -0.25, -0.015625, 0.0]
    assert bar_labels(wf)[3] == "0.0156 ms (1.6%) · within noise"
    assert bar_labels(wf)[-1] == "0.6094 ms (60.9%)"


def test_slower_ablation_holds_negative_time_in_the_chart_and_the_table():
    wf = waterfall(WaterfallTimings(1.0, 1.0, (AblationTiming("no_mask", "", 1.25),)))
    assert bar_labels(wf)[1] == "−0.2500 ms (−25.0%)"
    assert waterfall_figure(wf).to_dict()["data"][0]["y"][1] == 0.25  # a red step up
    buf = io.StringIO()
    waterfall_table(wf, Console(file=buf, width=100, highlight=False))
    row = next(line for line in buf.getvalue().splitlines() if line.strip().startswith("masks"))
    assert row.split() == ["masks", "1.2500", "−0.2500", "−25.0%"]


def test_bwd_pieces_have_names_and_unknown_keys_pass_through():
    from jfa_prof.render.waterfall import piece_name

    assert [piece_name(k) for k in ("no_dq", "dq_no_reduce", "no_mask", "new_thing")] == \
        ["dQ", "dQ reduction", "masks", "new_thing"]


def test_table():
    buf = io.StringIO()
    waterfall_table(_wf(), Console(file=buf, width=160, highlight=False))
    out = buf.getvalue()
    lines = out.splitlines()
    assert lines[2].split() == ["piece", "without", "ms", "holds", "ms", "share", "cumul.", "ms", "step", "holds",
                                "share"]
    row = next(line for line in lines if line.strip().startswith("exponentials"))
    assert row.split() == ["exponentials", "0.7500", "0.2500", "25.0%", "0.5000", "0.3750", "37.5%"]
    kv = next(line for line in lines if line.strip().startswith("K/V loads"))
    assert kv.split()[3:5] == ["0.0156", "~"]  # within the noise of 1/32 ms
    assert "noise: ±0.0312 ms (3.1%)" in out
    assert "overlap: Σ alone − Σ steps = −0.3594 ms" in out
    rem = next(line for line in lines if line.strip().startswith("remainder"))
    assert rem.split() == ["remainder", "0.2500", "25.0%"]
    assert "output store (no_o_store): stores <o>" in out
