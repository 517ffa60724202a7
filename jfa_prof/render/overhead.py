"""What instrumentation adds to the kernel and to the call (``benchmarks/profile_overhead.py``),
as one chart: schedule as hue, instrumentation level as shade, the whole call and the kernel
alone side by side on one percentage scale, so the two panels compare at a glance."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["COLUMNS", "overhead_figure"]

# The long frame the chart reads: a row per (workload, schedule, level, timing).
COLUMNS = ("workload", "schedule", "level", "timing", "pct", "noise_pct")
# Level 1 lighter, level 2 full: more instrumentation, a darker bar.
_LEVEL_OPACITY = {1: 0.45, 2: 1.0}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"


def overhead_figure(frame: pd.DataFrame, *, title: str | None = None) -> "go.Figure":
    """Bars of the overhead over level 0 (%), a panel per timing (in the frame's order), a bar per
    workload × schedule × level, error bars the level-0 noise of that timing."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    missing = [c for c in COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"overhead frame lacks {missing}")
    if frame.empty:
        raise ValueError("no overheads to draw")
    timings = list(dict.fromkeys(frame["timing"]))
    schedules = list(dict.fromkeys(frame["schedule"]))
    levels = sorted(dict.fromkeys(int(v) for v in frame["level"]))
    colors = {s: qualitative.D3[i % len(qualitative.D3)] for i, s in enumerate(schedules)}
    fig = make_subplots(rows=1, cols=len(timings), shared_yaxes=True, subplot_titles=timings,
                        horizontal_spacing=0.04)
    for col, timing in enumerate(timings, start=1):
        panel = frame[frame["timing"] == timing]
        for s in schedules:
            for lvl in levels:
                d = panel[(panel["schedule"] == s) & (panel["level"] == lvl)]
                if d.empty:
                    continue
                name = f"{s} · level {lvl}"
                fig.add_trace(go.Bar(
                    x=d["workload"].tolist(), y=d["pct"].tolist(), name=name, legendgroup=name,
                    showlegend=col == 1, offsetgroup=name,
                    marker={"color": _rgba(colors[s], _LEVEL_OPACITY.get(lvl, 1.0)),
                            "line": {"color": colors[s], "width": 1}},
                    error_y={"type": "data", "array": d["noise_pct"].tolist(), "thickness": 1},
                    hovertemplate="%{x}<br>" + name + ": %{y:+.1f}%<extra>" + timing + "</extra>"),
                    row=1, col=col)
    fig.update_yaxes(title_text="overhead over level 0 (%)", row=1, col=1)
    fig.update_layout(
        title=title or "instrumentation overhead (error bars: the level-0 noise)", barmode="group",
        template="plotly_white", autosize=True, height=480,
        legend={"title": {"text": "schedule · level"}}, margin={"l": 60, "r": 30, "t": 80, "b": 60})
    return fig
