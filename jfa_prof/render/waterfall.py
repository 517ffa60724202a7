"""Ablation waterfalls: a plotly waterfall chart and a rich table of a
:class:`~jfa_prof.analyses.waterfall.Waterfall`."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof.analyses.waterfall import Waterfall

if TYPE_CHECKING:  # plotly is imported where a chart is drawn, so the table works without it
    import plotly.graph_objects as go

__all__ = ["PIECE_NAMES", "bar_labels", "escape_hover", "piece_name", "waterfall_figure", "waterfall_table"]

# Saved time reads as good (green); an ablation that made the kernel slower stands out in red.
SAVED_COLOR = "#2ca02c"
SLOWER_COLOR = "#d62728"
TOTAL_COLOR = "#1f77b4"

# The pieces as a reader names them. The kernels' ablation keys (``no_o_store``, …) stay the
# identifiers in result files, --json and the CLI; only what is drawn or printed uses these.
PIECE_NAMES = {
    "no_o_store": "output store",
    "no_exp": "exponentials",
    "reuse_kv": "K/V loads",
    "no_mask": "masks",
    "no_dq": "dQ",
    "dq_no_reduce": "dQ reduction",
    "no_dkv_store": "dK/dV stores",
}

# One sign convention everywhere: a piece's time is what removing it saved, positive when the
# piece costs time, negative (red) when the kernel ran slower without it.
SIGN_NOTE = "each piece: the time it holds (what removing it saved; negative: the kernel was slower without it)"


def piece_name(key: str) -> str:
    """The display name of an ablation key (the key itself where none is known)."""
    return PIECE_NAMES.get(key, key)


def _num(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.4f}".replace("-", "−") + unit


def _ms(x: float | None, *, sign: bool = False) -> str:
    return (f"{x:+.4f}".replace("-", "−") + " ms") if sign and x is not None and not math.isnan(x) else _num(x, " ms")


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%".replace("-", "−")


def bar_labels(wf: Waterfall) -> list[str]:
    """The text on each bar: baseline, the time each piece holds, remainder."""
    basis_saving = "step_saving_ms" if wf.basis == "cumulative" else "alone_saving_ms"
    basis_sig = "step_significant" if wf.basis == "cumulative" else "alone_significant"
    labels = [_ms(wf.baseline_ms)]
    for c in wf.components:
        saving = getattr(c, basis_saving)
        if saving is None:
            labels.append("not measured")
            continue
        text = f"{_ms(saving)} ({_pct(saving / wf.baseline_ms)})"
        if getattr(c, basis_sig) is False:
            text += " · within noise"
        labels.append(text)
    labels.append(f"{_ms(wf.remainder_ms)} ({_pct(wf.remainder_share)})")
    return labels


def waterfall_figure(wf: Waterfall, *, title: str | None = None, subtitle: str | None = None) -> go.Figure:
    """Baseline on the left, each piece's time stepping down, what is left on the right.

    Bars use ``wf.basis``: cumulative steps (exact, they add up) or savings alone (which can
    overlap, then the remainder is only indicative and the chart says so)."""
    import plotly.graph_objects as go

    names = [piece_name(c.name) for c in wf.components]
    savings = wf.savings()
    x = ["baseline", *names, "remainder" if wf.basis == "cumulative" else "remainder (indicative)"]
    hover = [f"baseline, timed twice: {wf.baseline_ms:.4f} / {wf.baseline_repeat_ms:.4f} ms"]
    hover += [escape_hover(f"{piece_name(c.name)} ({c.name}): {c.removes}") for c in wf.components]
    hover.append("time left with every listed piece removed" if wf.basis == "cumulative"
                 else "baseline minus the savings measured alone")
    fig = go.Figure(go.Waterfall(
        x=x, measure=["absolute", *["relative"] * len(names), "total"],
        # The bars step down by each piece's time; the total bar's value is computed by plotly
        # from the bars before it, 0 is a placeholder.
        y=[wf.baseline_ms, *[-s for s in savings], 0.0],
        text=bar_labels(wf), textposition="outside", hovertext=hover, hoverinfo="text+x",
        decreasing={"marker": {"color": SAVED_COLOR}}, increasing={"marker": {"color": SLOWER_COLOR}},
        totals={"marker": {"color": TOTAL_COLOR}}, connector={"line": {"color": "#888", "dash": "dot"}},
        name=f"{wf.pass_} time",
    ))
    head = title or f"{wf.pass_} kernel time by component"
    sub = [subtitle] if subtitle else []
    sub.append(f"noise ±{wf.noise_ms:.4f} ms ({_pct(wf.noise_frac)}): the gap between two baseline timings; "
               + ("cumulative ablations, in this order" if wf.basis == "cumulative" else "each ablation alone"))
    sub.append(SIGN_NOTE)
    fig.update_layout(
        title={"text": head + "<br><sup>" + "<br>".join(sub) + "</sup>"},
        yaxis={"title": {"text": "kernel time (ms)"}, "rangemode": "tozero"},
        showlegend=False, height=540, autosize=True,
        margin={"l": 60, "r": 30, "t": 130, "b": 60},
    )
    return fig


def escape_hover(text: str) -> str:
    """Plotly hover text is HTML: keep a description's < and > literal."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def waterfall_table(wf: Waterfall, console: Console, *, title: str | None = None) -> None:
    """One row per piece: the kernel's time without it and the time it holds, alone and
    cumulatively when measured; what each removes is listed under the table, which keeps it
    inside 80 columns."""
    has_cum = any(c.cumulative_ms is not None for c in wf.components)
    table = Table(title=title or f"{wf.pass_} ablations", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("piece", no_wrap=True)
    table.add_column("without ms", justify="right", no_wrap=True)
    table.add_column("holds ms", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    if has_cum:
        table.add_column("cumul. ms", justify="right", no_wrap=True)
        table.add_column("step holds", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)

    def flag(sig: bool | None, cell: str) -> str:
        return f"[dim]{cell} ~[/]" if sig is False else cell

    base_row = ["[bold]baseline[/]", _num(wf.baseline_ms), "", "100.0%"]
    if has_cum:
        base_row += [_num(wf.baseline_ms), "", ""]
    table.add_row(*base_row)
    for c in wf.components:
        row = [escape(piece_name(c.name)), _num(c.alone_ms),
               flag(c.alone_significant, _num(c.alone_saving_ms)), flag(c.alone_significant, _pct(c.alone_share))]
        if has_cum:
            row += [_num(c.cumulative_ms), flag(c.step_significant, _num(c.step_saving_ms)),
                    flag(c.step_significant, _pct(c.step_share))]
        table.add_row(*row)
    rem = ["[bold]remainder[/]" if wf.basis == "cumulative" else "[bold]remainder[/] (indicative)",
           _num(wf.remainder_ms), "", _pct(wf.remainder_share)]
    if has_cum:
        rem += ["", "", ""]
    table.add_row(*rem)
    console.print(table)
    console.print(f"[dim]{SIGN_NOTE}[/]")
    for c in wf.components:
        if c.removes:
            console.print(f"[dim]{escape(piece_name(c.name))} ({escape(c.name)}): {escape(c.removes)}[/]")
    console.print(f"noise: ±{wf.noise_ms:.4f} ms ({_pct(wf.noise_frac)}), baseline timed twice "
                  f"({wf.baseline_ms:.4f} / {wf.baseline_repeat_ms:.4f} ms); times marked ~ are within it")
    if wf.overlap_ms is not None:
        console.print(f"overlap: Σ alone − Σ steps = {_ms(wf.overlap_ms, sign=True)} "
                      "(positive: pieces hide each other)")
    for note in wf.notes:
        console.print(f"[dim]{escape(note)}[/]")
