"""The barrier-wait table and its JSON."""
from __future__ import annotations

import json
from io import StringIO

import numpy as np
from rich.console import Console

import tracegen
from jfa_prof.analyses.barriers import barrier_attribution
from jfa_prof.render.barriers import barriers_table, to_json


def _attr():
    waits = np.zeros((2, 2, 2, 2), dtype=np.int64)
    waits[0, 1, 0] = (300, 3)
    waits[1, 1, 0] = (100, 1)
    waits[0, 0, 1] = (50, 5)
    spans = [{"cta": c, "role": r, "start": 0, "end": 500, "cycles": 1000} for c in (0, 1) for r in (0, 1)]
    tr = tracegen.hand_trace([], n_sms=2, n_ctas=2, spans=spans, waits=waits,
                             roles=("producer", "consumer"), sites=("full", "empty"))
    return barrier_attribution(tr.waits, tr.spans)


def _render(attr, **kw):
    c = Console(file=StringIO(), width=160, highlight=False, color_system=None)
    barriers_table(attr, c, **kw)
    return c.file.getvalue()


def test_table_ranked_by_cycles():
    out = _render(_attr())
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("full", "empty"))]
    assert len(rows) == 2
    assert rows[0] == ["full", "consumer", "400", "4", "100", "10.00%", "20.00%", "2", "0"]
    assert rows[1][:2] == ["empty", "producer"] and "1.25%" in rows[1] and "2.50%" in rows[1]
    assert "all waits: 450 cycles = 11.25% of warp-role time" in out
    assert "span in cycles" in out  # the share is defined where it is shown


def test_top_limits_rows():
    out = _render(_attr(), top=1)
    assert sum(ln.strip().startswith(("full", "empty")) for ln in out.splitlines()) == 1
    assert "1 more row(s)" in out


def test_big_counts_stay_narrow():
    from jfa_prof.render.barriers import _count

    assert [_count(x) for x in (999, 9_999, 12_345, 4_567_890, 7.891e9)] == ["999", "9,999", "12.3K", "4.57M", "7.89G"]


def test_json():
    d = json.loads(to_json(_attr(), source="x"))
    assert d["source"] == "x" and d["share_basis"] == "role spans"
    assert d["total_cycles"] == 4000 and d["wait_cycles"] == 450
    assert d["sites"][0] == {"site": "full", "role": "consumer", "cycles": 400, "count": 4, "mean_wait_cycles": 100.0,
                             "share": 0.1, "share_of_role": 0.2, "n_ctas": 2, "worst_cta": 0, "worst_cta_cycles": 300}


def test_figure_ranks_sites_by_their_largest_share_one_colour_per_recording():
    import pytest

    from jfa_prof.render.barriers import barriers_figure

    attr = _attr()
    d = barriers_figure([("a", attr), ("b", attr)], top=1).to_dict()
    assert [t["name"] for t in d["data"]] == ["a", "b"]
    top = attr.table.iloc[0]
    assert list(d["data"][0]["y"]) == [f"{top.site} · {top.role}"]
    assert d["data"][1]["x"][0] == pytest.approx(100 * top.share)
    assert "width" not in d["layout"]
    with pytest.raises(ValueError, match="no barrier waits"):
        barriers_figure([])
