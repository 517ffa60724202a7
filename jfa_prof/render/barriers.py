"""Barrier waits ranked by cycles: a rich table, or JSON for scripts."""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof.analyses.barriers import BarrierAttribution

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["barriers_figure", "barriers_table", "to_dict", "to_json"]


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def _count(n: float) -> str:
    """Short counts so the table fits 80 columns: 9,999 then 12.3K, 4.56M, 7.89G."""
    if abs(n) < 10_000:
        return f"{n:,.0f}"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:,.0f}"


def barriers_table(attr: BarrierAttribution, console: Console, *, top: int | None = None,
                   title: str = "barrier waits") -> None:
    """Sites ranked by cycles. "% kernel" is ``share``, "% role" is ``share_of_role``; the
    worst CTA's own cycles are in the JSON."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("site", "left"), ("role", "left"), ("cycles", "right"), ("waits", "right"),
                          ("mean", "right"), ("% kernel", "right"), ("% role", "right"),
                          ("CTAs", "right"), ("worst", "right")):
        table.add_column(name, justify=justify, no_wrap=True, min_width=len(name))
    rows = attr.table if top is None else attr.table.head(top)
    for r in rows.itertuples(index=False):
        table.add_row(escape(str(r.site)), escape(str(r.role)), _count(r.cycles), _count(r.count),
                      "–" if math.isnan(r.mean_wait_cycles) else _count(r.mean_wait_cycles),
                      _pct(r.share), _pct(r.share_of_role), str(int(r.n_ctas)),
                      str(int(r.worst_cta)))
    console.print(table)
    if len(attr.table) == 0:
        console.print("no barrier waits were recorded")
    hidden = len(attr.table) - len(rows)
    if hidden > 0:
        console.print(f"[dim]{hidden} more row(s); --top 0 shows all[/]")
    basis = {
        "role spans": "% kernel = cycles / Σ over (CTA, role) of the role's span in cycles; "
                      "% role = cycles / that role's spans; mean = cycles per wait; CTAs = CTAs that waited "
                      "there; worst = the CTA that waited longest",
        "kernel time": "% kernel = cycles / (kernel cycles × CTAs × roles): no role spans were recorded",
        "none": "no role spans and no kernel time: shares unknown",
    }[attr.basis]
    console.print(f"[dim]{escape(basis)}[/]", soft_wrap=False)
    console.print(f"all waits: {attr.wait_cycles:,.0f} cycles = {_pct(attr.wait_fraction)} of warp-role time")


def barriers_figure(results: Sequence[tuple[str, BarrierAttribution]], *, top: int = 10,
                    title: str = "barrier waits") -> "go.Figure":
    """The sites that hold the most cycles, as bars of their share of the kernel's warp-role
    time ("% kernel"), one colour per recording: the ``top`` sites by their largest share in any
    of them, largest first."""
    import plotly.graph_objects as go

    from jfa_prof.render.figures import ranked_bars_layout

    results = [(label, attr) for label, attr in results if len(attr.table)]
    if not results:
        raise ValueError("no barrier waits to draw")
    best: dict[tuple[str, str], float] = {}
    for _, attr in results:
        for r in attr.table.itertuples(index=False):
            key = (str(r.site), str(r.role))
            best[key] = max(best.get(key, 0.0), float(r.share) if not math.isnan(r.share) else 0.0)
    keys = sorted(best, key=lambda k: -best[k])[:top]
    names = [f"{site} · {role}" for site, role in keys]
    fig = go.Figure()
    for label, attr in results:
        by = {(str(r.site), str(r.role)): r for r in attr.table.itertuples(index=False)}
        rows = [by.get(k) for k in keys]
        fig.add_trace(go.Bar(
            y=names, x=[100 * float(r.share) if r is not None else 0.0 for r in rows], name=label, orientation="h",
            customdata=[[_count(r.cycles), _count(r.count), int(r.n_ctas)] if r is not None else ["–", "–", 0]
                        for r in rows],
            hovertemplate="%{y}<br>%{x:.2f}% of warp-role time<br>%{customdata[0]} cycles in %{customdata[1]} waits"
                          "<br>%{customdata[2]} CTAs<extra>%{fullData.name}</extra>"))
    return ranked_bars_layout(fig, title=title, n_rows=len(names), n_groups=len(results),
                              x_title="% of warp-role time spent waiting there", legend_title="recording")


def to_dict(attr: BarrierAttribution) -> dict[str, Any]:
    return attr.to_dict()


def to_json(attr: BarrierAttribution, **extra: Any) -> str:
    return json.dumps({**extra, **attr.to_dict()}, indent=2)
