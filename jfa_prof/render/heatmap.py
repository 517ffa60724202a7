"""SM × time heatmaps and the imbalance figures under them.

Figures take :class:`~jfa_prof.analyses.occupancy.Occupancy` results; several panels (clc off
and on, predicted and measured) share one colour scale and one time axis length, so the same
colour and the same width mean the same thing in every panel.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof.analyses.imbalance import Imbalance
from jfa_prof.analyses.occupancy import Occupancy
from jfa_prof.analyses.predict import CostModel, PredictionComparison
from jfa_prof.files import write_atomic

__all__ = ["LEVEL_NAMES", "busy_figure", "comparison_table", "contrast_line", "heatmap_figure", "heatmap_panels", "hover_text",
           "level_name", "panel_caption", "summary_table", "tail_details", "write_html"]

COLORSCALE = "Viridis"  # idle is dark, so a tail of idle SMs reads as a dark wedge
TAIL_COLOR = "rgba(255, 255, 255, 0.18)"  # the tail window, light over the dark idle cells it covers

# What each instrumentation level records. The level changes the kernel's timing (notebook 3),
# so a chart without it cannot be read against another.
LEVEL_NAMES = {0: "uninstrumented", 1: "level 1 (tile records)", 2: "level 2 (tiles + barrier waits)"}


def level_name(level: int | None) -> str:
    """How a chart names the instrumentation level a recording was made at (None: a simulation)."""
    if level is None:
        return "simulated"
    return LEVEL_NAMES.get(int(level), f"level {level}")


def panel_caption(im: Imbalance, level: int | None = None) -> str:
    """The imbalance figures a panel carries under its title (plotly HTML, two lines)."""
    return (f"makespan {_us(im.makespan_ns)} · mean finish {_us(im.mean_finish_ns)}<br>"
            f"tail {_us(im.tail_ns)} · idle {_pct(im.idle_fraction)} · {level_name(level)}")
_HOVER = "SM %{y} · %{x:.1f} µs<br>busy %{z:.0%}<br>%{text}<extra>%{fullData.name}</extra>"


def hover_text(occ: Occupancy) -> np.ndarray:
    """Per cell, the tile that dominates it (tile, batch, head, kv_len), or "" where none does."""
    dom = occ.dominant
    text = np.full(dom.shape, "", dtype=object)
    has = dom >= 0
    if not has.any():
        return text
    used, inverse = np.unique(dom[has], return_inverse=True)
    t = occ.tiles
    cols = {c: t[c].to_numpy()[used].astype(str) for c in ("tile", "batch", "head", "kv_len")}
    labels = np.char.add(np.char.add(np.char.add("tile ", cols["tile"]), np.char.add(" · batch ", cols["batch"])),
                         np.char.add(np.char.add(" · head ", cols["head"]), np.char.add(" · kv_len ", cols["kv_len"])))
    text[has] = labels.astype(object)[inverse]
    return text


def heatmap_panels(panels: Sequence[tuple[str, Occupancy]], *, title: str | None = None,
                   cols: int | None = None, imbalances: Sequence[Imbalance | None] | None = None,
                   levels: Sequence[int | None] | None = None) -> go.Figure:
    """One heatmap per (label, occupancy), laid out ``cols`` per row (default: all in one row).

    With ``imbalances`` (one per panel, or None), each panel is captioned with its makespan, mean
    finish, tail and idle fraction, and the instrumentation level of ``levels`` it was recorded
    at; its tail window (mean finish to makespan) is shaded."""
    if not panels:
        raise ValueError("no panels to draw")
    imbalances = list(imbalances) if imbalances is not None else [None] * len(panels)
    levels = list(levels) if levels is not None else [None] * len(panels)
    if len(imbalances) != len(panels) or len(levels) != len(panels):
        raise ValueError("one imbalance and one level per panel")
    cols = cols or len(panels)
    rows = math.ceil(len(panels) / cols)
    titles = [f"<b>{label}</b><br><sup>{panel_caption(im, lv)}</sup>" if im is not None else label
              for (label, _), im, lv in zip(panels, imbalances, levels)]
    captioned = any(im is not None for im in imbalances)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=titles,
                        horizontal_spacing=0.03 if cols > 1 else 0.0, vertical_spacing=0.14 if captioned else 0.08)
    n_sms = max(occ.n_sms for _, occ in panels)
    t_end_us = max(float(occ.edges_ns[-1]) for _, occ in panels) / 1e3
    for i, (label, occ) in enumerate(panels):
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(
            z=occ.busy, x0=occ.centers_ns[0] / 1e3, dx=occ.bin_ns / 1e3, y0=0, dy=1,
            text=hover_text(occ), hovertemplate=_HOVER, name=label, coloraxis="coloraxis",
        ), row=r + 1, col=c + 1)
        fig.update_xaxes(range=[0, t_end_us], title_text="time since first tile (µs)" if r == rows - 1 else None,
                         row=r + 1, col=c + 1)
        fig.update_yaxes(range=[n_sms - 0.5, -0.5], title_text="SM" if c == 0 else None, row=r + 1, col=c + 1)
        im = imbalances[i]
        if im is not None and not math.isnan(im.mean_finish_ns) and im.tail_ns > 0:
            fig.add_vrect(x0=im.mean_finish_ns / 1e3, x1=im.makespan_ns / 1e3, fillcolor=TAIL_COLOR, line_width=0,
                          layer="above", row=r + 1, col=c + 1)
    fig.update_layout(
        title=title,
        coloraxis={"colorscale": COLORSCALE, "cmin": 0.0, "cmax": 1.0,
                   "colorbar": {"title": {"text": "busy"}, "tickformat": ".0%"}},
        height=max(420, rows * (150 + 3 * n_sms)),
        autosize=True,  # no fixed width: the panels share whatever width the page gives them
        margin={"l": 60, "r": 30, "t": 120 if captioned else 80, "b": 50},
    )
    return fig


def heatmap_figure(occ: Occupancy, *, label: str = "", title: str | None = None) -> go.Figure:
    return heatmap_panels([(label, occ)], title=title)


def busy_figure(results: Sequence[tuple[str, Imbalance]], *, title: str | None = None) -> go.Figure:
    """Every SM's busy time, busiest first, a line per result, its mean dashed in the same colour:
    a balanced schedule is a flat line on its mean; max/mean busy is the left end over the dash."""
    from plotly.colors import qualitative

    if not results:
        raise ValueError("no results to draw")
    fig = go.Figure()
    for i, (label, im) in enumerate(results):
        color = qualitative.D3[i % len(qualitative.D3)]
        busy = im.per_sm["busy_ns"].to_numpy(np.float64)
        order = np.argsort(-busy, kind="stable")
        fig.add_trace(go.Scatter(
            x=np.arange(len(order)).tolist(), y=(busy[order] / 1e3).tolist(), mode="lines", name=label,
            line={"color": color}, customdata=im.per_sm.index.to_numpy()[order].tolist(), legendgroup=label,
            hovertemplate="SM %{customdata}<br>busy %{y:.1f} µs<extra>%{fullData.name}</extra>"))
        fig.add_hline(y=im.mean_busy_ns / 1e3, line={"color": color, "dash": "dash", "width": 1})
    fig.update_layout(
        title=title or "SM busy time, busiest first (dashed: each schedule's mean)",
        xaxis={"title": {"text": "SMs, by busy time"}}, yaxis={"title": {"text": "busy (µs)"}, "rangemode": "tozero"},
        height=380, autosize=True, legend={"title": {"text": "schedule"}}, template="plotly_white",
        margin={"l": 60, "r": 30, "t": 60, "b": 50})
    return fig


def write_html(fig: go.Figure, path: str | os.PathLike) -> Path:
    """A self-contained page (plotly.js inlined), so it opens offline and can be attached anywhere;
    the figure fills the window and follows its resizes. Written aside and moved in (`write_atomic`)."""
    from jfa_prof.render.figures import CONFIG

    return write_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True, config=CONFIG, default_width="100%"))


# ---------------------------------------------------------------------------------------------
# terminal
# ---------------------------------------------------------------------------------------------

def _us(ns: float) -> str:
    return "–" if ns is None or (isinstance(ns, float) and math.isnan(ns)) else f"{ns / 1e3:,.1f} µs"


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _ratio(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.3f}"


def summary_table(results: Sequence[tuple[str, Imbalance]], console: Console, *,
                  title: str = "SM imbalance") -> None:
    """The imbalance figures, one column per result, after a loud line for any dropped records."""
    for label, im in results:
        if im.dropped:
            console.print(f"[bold red]WARNING {escape(label)}: {im.dropped} tile record(s) dropped "
                          f"(record buffer full) — figures below miss those tiles[/]")
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for label, _ in results:
        table.add_column(escape(label), justify="right")
    rows = [
        ("makespan", lambda m: _us(m.makespan_ns)),
        ("mean SM busy", lambda m: _us(m.mean_busy_ns)),
        ("max SM busy", lambda m: _us(m.max_busy_ns)),
        ("max / mean busy", lambda m: _ratio(m.max_over_mean)),
        ("tail (makespan − mean finish)", lambda m: _us(m.tail_ns)),
        ("idle fraction", lambda m: _pct(m.idle_fraction)),
        ("tiles", lambda m: f"{m.n_tiles:,}"),
        ("SMs (idle)", lambda m: f"{m.n_sms} ({m.n_idle_sms})"),
        ("dropped records", lambda m: f"[bold red]{m.dropped:,}[/]" if m.dropped else "0"),
    ]
    for name, fmt in rows:
        table.add_row(name, *[fmt(m) for _, m in results])
    console.print(table)


def contrast_line(off: Imbalance, on: Imbalance, *, names: tuple[str, str] = ("off", "on")) -> str:
    """One sentence on what the second schedule changed against the first (``names``: what
    each is, e.g. ``("static", "dynamic (clc on)")``)."""
    change = (on.makespan_ns - off.makespan_ns) / off.makespan_ns if off.makespan_ns else math.nan
    lead = "clc on vs off" if names == ("off", "on") else f"{names[1]} vs {names[0]}"
    return (f"{lead}: makespan {'–' if math.isnan(change) else f'{100 * change:+.1f}%'}, "
            f"tail {_us(off.tail_ns)} → {_us(on.tail_ns)}, "
            f"idle {_pct(off.idle_fraction)} → {_pct(on.idle_fraction)}")


def tail_details(results: Sequence[tuple[str, Imbalance]], console: Console, *, n_last: int = 5) -> None:
    """Per result, the SMs still running after the mean finish time, and the tiles that end last."""
    for label, im in results:
        if len(im.critical_sms):
            sms = ", ".join(f"{int(r.smid)} (+{r.over_mean_ns / 1e3:.1f} µs)"
                            for r in im.critical_sms.itertuples())
            console.print(f"[bold]{escape(label)}[/] SMs on the tail (finish after the mean): {sms}", soft_wrap=False)
        if len(im.last_tiles):
            last = Table(title=f"{label}: tiles that end last", title_justify="left")
            for c in ("smid", "tile", "batch", "head", "kv_len", "start", "end"):
                last.add_column(c, justify="right")
            for r in im.last_tiles.head(n_last).itertuples():
                last.add_row(str(r.smid), str(r.tile), str(r.batch), str(r.head), str(r.kv_len),
                             _us(r.start_ns), _us(r.end_ns))
            console.print(last)


def comparison_table(results: Sequence[tuple[str, PredictionComparison, CostModel]], console: Console) -> None:
    """Predicted against measured, one column per schedule."""
    table = Table(title="prediction vs measurement", title_justify="left")
    table.add_column("")
    for label, _, _ in results:
        table.add_column(escape(label), justify="right")
    rows = [
        ("makespan predicted", lambda c, m: _us(c.makespan_pred_ns)),
        ("makespan measured", lambda c, m: _us(c.makespan_meas_ns)),
        ("makespan error", lambda c, m: "–" if math.isnan(c.makespan_error) else f"{100 * c.makespan_error:+.1f}%"),
        ("per-CTA busy correlation", lambda c, m: _ratio(c.busy_corr)),
        ("tiles on the measured CTA", lambda c, m: _pct(c.cta_agreement)),
        ("cost model", lambda c, m: f"{m.a_ns:,.0f} + {m.b_ns:,.0f}·n_blocks ns"),
        ("cost model R² (" + (results[0][2].basis if results else "") + ")", lambda c, m: _ratio(m.r2)),
    ]
    for name, fmt in rows:
        table.add_row(name, *[fmt(c, m) for _, c, m in results])
    console.print(table)
