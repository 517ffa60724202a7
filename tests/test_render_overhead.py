"""The instrumentation-overhead chart, through fig.to_dict()."""
from __future__ import annotations

import pandas as pd
import pytest

from jfa_prof.render.overhead import overhead_figure


def _frame():
    rows = []
    for timing in ("whole call", "kernel only"):
        for s in ("static", "dynamic"):
            for lvl in (1, 2):
                rows.append({"workload": "w", "schedule": s, "level": lvl, "timing": timing,
                             "pct": lvl * (3.0 if timing == "whole call" else 1.0), "noise_pct": 0.5})
    return pd.DataFrame(rows)


def test_one_y_scale_schedule_as_hue_level_as_shade():
    d = overhead_figure(_frame()).to_dict()
    layout = d["layout"]
    assert layout["yaxis2"]["matches"] == "y" and layout["yaxis"]["title"]["text"] == "overhead over level 0 (%)"
    assert [a["text"] for a in layout["annotations"]] == ["whole call", "kernel only"]
    bars = [t for t in d["data"] if t["xaxis"] == "x"]
    assert [t["name"] for t in bars] == ["static · level 1", "static · level 2", "dynamic · level 1", "dynamic · level 2"]
    static1, static2, dyn1, _ = (t["marker"] for t in bars)
    assert static1["line"]["color"] == static2["line"]["color"] != dyn1["line"]["color"]  # hue: the schedule
    assert static1["color"].endswith("0.45)") and static2["color"].endswith("1.0)")  # shade: the level
    assert all(not t["showlegend"] for t in d["data"] if t["xaxis"] == "x2")
    assert "width" not in layout


def test_a_frame_without_the_columns_is_refused():
    with pytest.raises(ValueError, match="lacks"):
        overhead_figure(pd.DataFrame({"workload": []}))
