"""Benchmark results as charts and tables, from :meth:`jfa_prof.bench.BenchResults.frame`.

The chart is the one a blog post shows: TFLOPS against sparsity, one line per implementation,
one panel per (Lq, max_kv); this project's implementations solid, peers dashed, the same colour
for an implementation in every panel.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["BEST_CALL", "FA4_CALL", "FA4_GPU", "bench_table", "facets", "impl_order", "limits_figure", "limits_table",
           "ratio_name", "roofline_table", "runs_change_table", "summary_table", "tflops_figure", "vs_fa4_figure"]

# Two different ratios to FA4 are shown, and they can differ twofold at one point (0.55 and 1.22):
# over whole calls (``ms``: the host's work in each call included) and over GPU time alone
# (``gpu_ms``, what ``--limits`` takes). Every table and chart names which one it shows.
FA4_CALL = "÷fa4 call"
FA4_GPU = "÷fa4 GPU"
BEST_CALL = "÷best call"


def ratio_name(timer: str = "ms") -> str:
    """The name of the ratio to FA4 measured by ``timer`` (``"ms"`` or ``"gpu_ms"``)."""
    return FA4_GPU if timer == "gpu_ms" else FA4_CALL


def impl_order(frame: pd.DataFrame, impls: Sequence[str] | None = None) -> list[str]:
    """Implementations to show: ``impls`` if given, else ours then the peers, as they appear."""
    if impls:
        return list(impls)
    seen = list(dict.fromkeys(frame["impl"]))
    return sorted(seen, key=lambda n: (frame.loc[frame["impl"] == n, "kind"].iloc[0] != "jfa", seen.index(n)))


def facets(frame: pd.DataFrame) -> tuple[list[int], list[int]]:
    """(row keys, column keys) of the panels: Lq down, max_kv across. Self-attention grids,
    where Lq is max_kv, get one row."""
    if frame.empty:
        return [], []
    cols = sorted(int(v) for v in frame["max_kv"].unique())
    broadcast = bool(frame["broadcast_q"].fillna(True).astype(bool).any())
    rows = sorted(int(v) for v in frame["Lq"].unique()) if broadcast else [0]
    return rows, cols


def _panel_title(lq: int, max_kv: int) -> str:
    return f"Lq={lq} · max_kv={max_kv}" if lq else f"max={max_kv}"


def tflops_figure(frame: pd.DataFrame, *, impls: Sequence[str] | None = None, title: str | None = None,
                  subtitle: str | None = None) -> "go.Figure":
    """TFLOPS vs sparsity, a panel per (Lq, max_kv), a line per implementation. Points that
    failed or were not timed are left out (the table shows why)."""
    # Plotly is imported here, not with the module: the tables need none of it.
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    if frame.empty:
        raise ValueError("no results to draw")
    names = impl_order(frame, impls)
    rows, cols = facets(frame)
    fig = make_subplots(rows=len(rows), cols=len(cols), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[_panel_title(r, c) for r in rows for c in cols],
                        horizontal_spacing=0.04, vertical_spacing=0.1)
    ok = frame[frame["tflops"].notna()]
    palette = qualitative.D3 + qualitative.Set2
    colors = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    for ri, lq in enumerate(rows):
        for ci, mkv in enumerate(cols):
            panel = ok[(ok["max_kv"] == mkv) & ((ok["Lq"] == lq) if lq else True)]
            for name in names:
                d = panel[panel["impl"] == name].sort_values("sparsity")
                if d.empty:
                    continue
                ours = d["kind"].iloc[0] == "jfa"
                fig.add_trace(go.Scatter(
                    x=d["sparsity"].tolist(), y=d["tflops"].tolist(), mode="lines+markers", name=name,
                    legendgroup=name, showlegend=name not in _shown(fig),
                    line={"color": colors[name], "width": 3 if ours else 2, "dash": "solid" if ours else "dash"},
                    marker={"size": 7 if ours else 5},
                    customdata=d[["ms", "ratio_vs_fa4"]].to_numpy().tolist(),
                    hovertemplate=(f"{escape_html(name)}<br>s=%{{x}}<br>%{{y:.0f}} TFLOPS<br>%{{customdata[0]:.4f}} ms"
                                   f"<br>{FA4_CALL} %{{customdata[1]:.2f}}<extra></extra>"),
                ), row=ri + 1, col=ci + 1)
            fig.update_xaxes(title_text="sparsity (mean length / max)" if ri == len(rows) - 1 else None,
                             row=ri + 1, col=ci + 1)
        fig.update_yaxes(title_text="TFLOPS", row=ri + 1, col=1, rangemode="tozero")
    head = title or "attention TFLOPS by sparsity"
    fig.update_layout(
        title={"text": head + (f"<br><sup>{subtitle}</sup>" if subtitle else "")},
        height=max(420, 330 * len(rows) + 120), autosize=True,
        legend={"title": {"text": "implementation"}}, hovermode="closest",
        margin={"l": 60, "r": 30, "t": 100, "b": 60},
    )
    return fig


def _shown(fig: "go.Figure") -> set[str]:
    return {t.name for t in fig.data if t.showlegend}


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


ROOF_NOTE = ("floor: ms; roof: the point's floor (its FLOPs at the tensor cores' rate, or the HBM bytes it cannot "
             "avoid at the bandwidth, both below, whichever is longer) divided by the time. TB/s: those bytes over "
             "the time, the HBM rate a call reached at the least.")


def _num(x, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def _ours(frame: pd.DataFrame, names: Sequence[str], ours: str | None) -> str | None:
    if ours and ours in set(frame["impl"]):
        return ours
    return next((n for n in names if (frame.loc[frame["impl"] == n, "kind"] == "jfa").any()), None)


def bench_table(frame: pd.DataFrame, console: Console, *, impls: Sequence[str] | None = None,
                title: str = "benchmark") -> None:
    """Every implementation at every point, a section per point: median ms, TFLOPS, ratio to
    FA4, host and GPU time per call, peak memory of one call, relative error; failures in red."""
    names = impl_order(frame, impls)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # Headers on two lines and the best peer's ratio left to the summary: the table keeps to 80
    # columns; a narrow terminal wraps the points' labels, never the figures.
    for name, justify in (("implementation", "left"), ("ms", "right"), ("TFLOPS", "right"),
                          (FA4_CALL.replace(" ", "\n"), "right"), ("host\nµs", "right"), ("GPU\nµs", "right"),
                          ("mem MB", "right"), ("rel err", "right")):
        if name == "implementation":
            table.add_column(name, min_width=2 + max(map(len, names), default=0))
        else:
            table.add_column(name, justify=justify, no_wrap=True)
    errors: list[str] = []
    for i, (label, point) in enumerate(frame.groupby("label", sort=False)):
        if i:
            table.add_section()
        table.add_row(f"[bold]{escape(str(label))}[/]")
        by = {r.impl: r for r in point.itertuples(index=False)}
        for n in names:
            r = by.get(n)
            if r is None:
                continue
            if isinstance(r.error, str) and r.error:
                table.add_row(f"  {escape(n)}", "[red]failed[/]")
                errors.append(f"{label} · {n}: {r.error}")
                continue
            table.add_row(f"  {escape(n)}", _num(r.ms, ".4f"), _num(r.tflops, ".0f"), _num(r.ratio_vs_fa4, ".2f"),
                          _num(r.host_us, ".0f"), _num(r.gpu_ms * 1e3, ".0f"),
                          _num(r.peak_mem_mb, ",.0f"), _num(r.rel_err, ".1e"))
    console.print(table)
    console.print("[dim]ms: do_bench median per call (the median round where the implementations were timed in "
                  f"turn over rounds); {FA4_CALL}: that time divided into FA4's (above 1 is "
                  f"faster; the summary has {BEST_CALL}); host µs: host time per call with 50 calls enqueued back to "
                  "back; GPU µs: GPU work per call, host gaps left out (a diagnostic)[/]", soft_wrap=False)
    for e in errors:
        console.print(f"[red]failed[/] {escape(e)}")


def _rounds_ahead(r) -> str:
    """"k/n": ours faster than FA4 in k of the n rounds timed in turn with it; "–" without rounds."""
    k, n = getattr(r, "rounds_faster_than_fa4", None), getattr(r, "rounds", None)
    return f"{int(k)}/{int(n)}" if pd.notna(k) and n else "–"


def summary_table(frame: pd.DataFrame, console: Console, *, ours: str | None = None,
                  title: str = "summary") -> None:
    """A row per point: ``ours`` (default: our first implementation) against FA4 and the best
    peer, in TFLOPS, and in how many of the alternated rounds ours was the faster of the two."""
    names = impl_order(frame)
    ours = _ours(frame, names, ours)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("workload", "left"), (ours or "ours", "right"), ("fa4", "right"),
                          (FA4_CALL.replace(" ", "\n"), "right"), ("rounds\nahead", "right"), ("best peer", "right"),
                          (BEST_CALL.replace(" ", "\n"), "right")):
        table.add_column(escape(name), justify=justify, no_wrap=True)
    for label, point in frame.groupby("label", sort=False):
        by = {r.impl: r for r in point.itertuples(index=False)}
        r, fa4 = by.get(ours), by.get("fa4")
        best = point["best_peer"].iloc[0]
        b = by.get(best) if isinstance(best, str) else None
        failed = r is not None and isinstance(r.error, str) and bool(r.error)
        table.add_row(escape(str(label)),
                      "[red]failed[/]" if failed else _num(getattr(r, "tflops", None), ".0f"),
                      _num(getattr(fa4, "tflops", None), ".0f"),
                      _num(getattr(r, "ratio_vs_fa4", None), ".2f"), _rounds_ahead(r),
                      f"{escape(best)} {_num(b.tflops, '.0f')}" if b is not None else "–",
                      _num(getattr(r, "ratio_vs_best_peer", None), ".2f"))
    console.print(table)
    console.print("[dim]rounds ahead: the rounds (each timing every call in turn) in which ours was faster "
                  "than FA4; a clock that moves between rounds moves both calls of a round alike[/]", soft_wrap=False)


def runs_change_table(change, console: Console, *, title: str = "against an earlier run") -> None:
    """A row per point both runs hold (`analyses.runs.RunsChange`): the op as called in ms before and
    after, the change, and its ratio to FA4 per call before and after; then what keeps the two runs
    from being compared (another GPU, ceilings that moved)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("workload", "left"), ("bound", "left"), ("ms before", "right"), ("ms after", "right"),
                          ("change", "right"), (f"{FA4_CALL}\nbefore", "right"), (f"{FA4_CALL}\nafter", "right"),
                          ("rounds\nahead", "right")):
        table.add_column(escape(name), justify=justify, no_wrap=True)
    for p in change.points:
        delta = p.time_change
        colour = "" if delta is None or abs(delta) < 0.01 else ("green" if delta < 0 else "red")
        ahead = f"{p.ahead_after}/{p.rounds_after}" if p.ahead_after is not None and p.rounds_after else "–"
        table.add_row(escape(p.label), p.bound or "–", _num(p.ms_before, ".3f"), _num(p.ms_after, ".3f"),
                      f"[{colour}]{delta:+.1%}[/]" if colour else _num(delta, "+.1%"),
                      _num(p.fa4_before, ".2f"), _num(p.fa4_after, ".2f"), ahead)
    console.print(table)
    n = len(change.points)
    gb, ga = change.geomean_fa4("before"), change.geomean_fa4("after")
    if gb is not None and ga is not None:
        console.print(f"{FA4_CALL}: geomean {gb:.2f} -> {ga:.2f}; at least FA4's speed at "
                      f"{change.at_least_fa4('before')} -> {change.at_least_fa4('after')} of {n} points")
    console.print(f"[dim]before: {escape(change.before)} ({escape(str(change.ours_before))}); "
                  f"after: {escape(change.after)} ({escape(str(change.ours_after))})[/]", soft_wrap=False)
    for side, labels in (("only in the earlier run", change.only_before), ("only in the later run", change.only_after)):
        if labels:
            console.print(f"[dim]{side}: {escape(', '.join(labels))}[/]", soft_wrap=False)
    for c in change.caveats:
        console.print(f"[yellow]not comparable as it stands: {escape(c)}[/]", soft_wrap=False)


def roofline_table(frame: pd.DataFrame, console: Console, *, ours: str | None = None,
                   title: str = "roofline", ceilings: str | None = None) -> None:
    """A row per point: what bounds it (the tensor cores or HBM), its floor in ms, the share of
    that floor ``ours`` (unprefixed columns) and FA4 reached, and the HBM rate each reached (the
    point's unavoidable bytes over its time). ``ceilings`` says where the two floors' rates come
    from: with the same run's streaming read, a memory-bound point's roof is its share of that read.
    Prints nothing for a GPU the hardware table lacks."""
    if not frame["bound"].notna().any():
        return
    names = impl_order(frame)
    ours = _ours(frame, names, ours)
    table = Table(title=f"{title} · unprefixed: {ours or 'ours'}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for name, justify in (("workload", "left"), ("bound", "left"), ("floor", "right"), ("roof", "right"),
                          ("fa4 roof", "right"), ("TB/s", "right"), ("fa4 TB/s", "right")):
        table.add_column(escape(name), justify=justify, no_wrap=True)
    for label, point in frame.groupby("label", sort=False):
        by = {r.impl: r for r in point.itertuples(index=False)}
        first = point.iloc[0]
        table.add_row(escape(str(label)), first["bound"] if isinstance(first["bound"], str) else "–",
                      _num(first["floor_ms"], ".3f"),
                      *(_pct(getattr(by.get(n), "roof", None)) for n in (ours, "fa4")),
                      *(_num(getattr(by.get(n), "hbm_tb_s", None), ".2f") for n in (ours, "fa4")))
    console.print(table)
    console.print(f"[dim]{ROOF_NOTE}" + (f" Ceilings: {escape(ceilings)}." if ceilings else "") + "[/]",
                  soft_wrap=False)


LIMITS_NOTE = ("From one recording of our kernel per point (tile records only): each tile's start-to-start time on its "
               "CTA, fit as per tile + per block × blocks over the points of one compiled kernel, splits all CTA time "
               "into blocks, per-tile work and idle CTAs (shares shown). limit: blocks = the blocks' share of our "
               "time alone is over what the target allows; blocks×N: how many times faster they must get with the "
               "rest unchanged; busy = the same where the fit could not tell per-tile from per-block time; "
               "tile / idle = the blocks fit, and the larger of the other two stands over the target; – where one "
               "tile size left per-tile and per-block time inseparable")


def limits_table(labels: Sequence[str], limits: Sequence, splits: Sequence, console: Console, *,
                 title: str = "limits") -> None:
    """A row per point with a split: our fastest time against FA4's, the time split
    (`jfa_prof.analyses.limits`), the per-block cost and what keeps the point from the target.
    ``limits``: `PointLimit` or None per label; ``splits``: `TimeSplit` or None per label."""
    shown = [(label, lim, split) for label, lim, split in zip(labels, limits, splits) if lim is not None]
    if not shown:
        return
    targets = " / ".join(f"{t:g}×" for t in dict.fromkeys(lim.target for _, lim, _ in shown))
    timers = " / ".join(dict.fromkeys("GPU time per call" if lim.timer == "gpu_ms" else "call medians"
                                      for _, lim, _ in shown))
    table = Table(title=f"{title} · target {targets} FA4 · {timers}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    # On two lines ("÷fa4" over "GPU"), so the table keeps to 80 columns.
    ratio = "÷fa4\n" + " / ".join(ratio_name(t).removeprefix("÷fa4 ")
                                   for t in dict.fromkeys(lim.timer for _, lim, _ in shown))
    for name in ("workload", ratio, "blocks", "tile", "idle", "µs/blk", "limit"):
        table.add_column(name, justify="left" if name in ("workload", "limit") else "right", no_wrap=True)
    for label, lim, split in shown:
        style = "green" if lim.limit == "met" else "red" if lim.limit in ("blocks", "busy") else "yellow"
        need = lim.blocks_speedup_needed
        verdict = (f"{lim.limit}×{'∞' if math.isinf(need) else format(need, '.2f')}"
                   if lim.limit in ("blocks", "busy") else lim.limit)
        # A fit that could not separate the two puts all busy time on the blocks: no per-tile figure.
        table.add_row(escape(str(label)), _num(lim.ratio, ".2f"), _pct(split.blocks_share),
                      _pct(split.tile_share) if split.separable else "–", _pct(split.idle_share),
                      _num(split.b_ns / 1e3, ".2f") if split.separable else "–", f"[{style}]{verdict}[/]")
    console.print(table)
    console.print(f"[dim]{LIMITS_NOTE}[/]", soft_wrap=False)


_PARTS = (("blocks", "blocks_ms", "#1f77b4"), ("per tile", "tile_ms", "#ff7f0e"), ("idle", "idle_ms", "#7f7f7f"))


def limits_figure(labels: Sequence[str], limits: Sequence, *, title: str = "what limits each point",
                  subtitle: str | None = None) -> "go.Figure":
    """A bar per point with a `PointLimit`: our time split into blocks, per-tile work and idle, in
    units of the time the target allows (the dashed line at 1: a bar past it misses the target;
    its blue part alone past it: only faster blocks can reach it)."""
    import plotly.graph_objects as go

    shown = [(str(label), lim) for label, lim in zip(labels, limits) if lim is not None]
    if not shown:
        raise ValueError("no point has a time split to draw")
    names = [label for label, _ in shown]
    fig = go.Figure()
    for part, attr, color in _PARTS:
        fig.add_trace(go.Bar(y=names, x=[getattr(lim, attr) / lim.allowed_ms for _, lim in shown], name=part,
                             orientation="h", marker_color=color,
                             customdata=[[getattr(lim, attr), lim.limit, lim.ratio, ratio_name(lim.timer)]
                                         for _, lim in shown],
                             hovertemplate="%{y}<br>" + part + ": %{customdata[0]:.3f} ms<br>limit: %{customdata[1]}"
                                           "<br>%{customdata[3]} %{customdata[2]:.2f}<extra></extra>"))
    fig.add_vline(x=1.0, line_dash="dash", line_color="black")
    fig.update_layout(barmode="stack", height=120 + 26 * len(names), template="plotly_white",
                      title=title + (f"<br><sup>{escape_html(subtitle)}</sup>" if subtitle else ""),
                      xaxis_title="our time ÷ the time the target allows", yaxis_autorange="reversed",
                      legend_orientation="h", legend_y=-0.15)
    return fig


def vs_fa4_figure(labels: Sequence[str], ratios: Sequence[float], ours_mb: Sequence[float],
                  fa4_mb: Sequence[float], *, ratio_name: str = FA4_CALL, target: float | None = None,
                  title: str = "against FA4", subtitle: str | None = None) -> "go.Figure":
    """A row per point: our ratio to FA4 (left, the line at 1 is FA4's speed, dashed the target)
    and the peak memory of one call, ours beside FA4's (right)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = [str(x) for x in labels]
    if not labels:
        raise ValueError("no points to draw")
    if not len(labels) == len(ratios) == len(ours_mb) == len(fa4_mb):
        raise ValueError("one ratio and two memory figures per point")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.03, column_widths=[0.5, 0.5],
                        subplot_titles=[f"{ratio_name} (above 1: faster than FA4)", "peak memory of one call (MB)"])
    fig.add_trace(go.Bar(y=labels, x=list(ratios), orientation="h", name=ratio_name, marker_color="#1f77b4",
                         hovertemplate="%{y}<br>" + ratio_name + " %{x:.2f}<extra></extra>", showlegend=False),
                  row=1, col=1)
    fig.add_vline(x=1.0, line={"color": "black", "width": 1}, row=1, col=1)
    if target is not None:
        fig.add_vline(x=target, line={"color": "#d62728", "dash": "dash", "width": 1}, row=1, col=1,
                      annotation_text=f"target {target:g}×", annotation_position="top")
    for name, values, color in (("ours", ours_mb, "#1f77b4"), ("fa4", fa4_mb, "#7f7f7f")):
        fig.add_trace(go.Bar(y=labels, x=list(values), orientation="h", name=name, marker_color=color,
                             hovertemplate="%{y}<br>" + name + " %{x:,.0f} MB<extra></extra>"), row=1, col=2)
    fig.update_layout(
        title=title + (f"<br><sup>{escape_html(subtitle)}</sup>" if subtitle else ""), barmode="group",
        template="plotly_white", autosize=True, height=140 + 28 * len(labels), yaxis={"autorange": "reversed"},
        legend={"orientation": "h", "y": -0.08, "title": {"text": "memory"}}, margin={"l": 200, "r": 30, "t": 90, "b": 60})
    return fig
