"""Renders ncu reports: a metric table and the top stall reasons per kernel, two kernels side by
side with their deltas, or JSON."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof import ncu_metrics
from jfa_prof.analyses.ncu import MetricInfo, NcuComparison, NcuKernel, NcuReport, describe, stall_breakdown

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Display order of the metric groups; a group's rows stay together under one rule.
_GROUPS = ("time", "throughput", "memory", "imbalance", "launch", "stalls")
# ncu's unit -> (shown unit, factor): microseconds read better than six-digit nanoseconds.
_RESCALE = {"ns": ("µs", 1e-3)}
_INTEGRAL_UNITS = {"B", "cycles", "inst", "threads", "CTAs", "threads/CTA", "B/CTA", "reg/thread"}
DEFAULT_TOP = 8
# The slowest SM 5% over the mean costs about what switching schedules saved in the committed
# H200 reports (lpt 1.098 -> dynamic 1.011, 4% faster): worth a look with `jfa-prof heatmap`.
_IMBALANCE_WARN = 1.05


def _console(console: Console | None, file: TextIO | None, width: int | None) -> Console:
    return console if console is not None else Console(file=file, width=width, highlight=False)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _unit(info: MetricInfo) -> str:
    return _RESCALE.get(info.unit, (info.unit, 1.0))[0]


def _number(info: MetricInfo, v: float, *, sign: bool = False) -> str:
    x = v * _RESCALE.get(info.unit, (info.unit, 1.0))[1]
    plus = "+" if sign else ""
    if info.group == "stalls":  # fractions of a cycle per issued instruction
        return f"{x:{plus}.2f}"
    if info.unit == "max/avg":
        return f"{x:{plus}.3f}"
    if info.unit in _INTEGRAL_UNITS:
        return f"{x:{plus},.0f}"
    return f"{x:{plus},.1f}"


def _fmt(info: MetricInfo, v: Any) -> str:
    return "-" if _missing(v) else _number(info, float(v))


def _ordered(shorts: list[str]) -> list[tuple[str, MetricInfo]]:
    """Table metrics and derived ones, grouped; table order inside a group."""
    infos = [(s, describe(s)) for s in shorts]
    return sorted(infos, key=lambda si: _GROUPS.index(si[1].group) if si[1].group in _GROUPS else len(_GROUPS))


def _heading(k: NcuKernel) -> str:
    where = ", ".join(x for x in (k.device, k.arch, f"{k.sm_count} SMs" if k.sm_count else None) if x)
    return f"[bold]{escape(k.name)}[/]  {escape(Path(k.source).name)}" + (f"  [dim]{escape(where)}[/]" if where else "")


def _arch_note(k: NcuKernel) -> str | None:
    if k.arch is None:
        return "the report has no device attributes: only metrics named alike on every architecture were read"
    if not k.arch_known:
        return (f"{k.arch} is not in the metric table: only metrics named alike on every architecture "
                "were read")
    if not k.arch_verified:
        return f"{k.arch}: {ncu_metrics.ARCHS[k.arch].note}"
    return None


def _missing_note(missing: tuple[str, ...]) -> str | None:
    if not missing:
        return None
    stalls = [m for m in missing if ncu_metrics.is_stall(m)]
    others = [m for m in missing if not ncu_metrics.is_stall(m)]
    parts = list(others)
    if stalls:
        parts.append(f"{len(stalls)} stall reasons (collect with --section WarpStateStats)"
                     if len(stalls) > 3 else ", ".join(stalls))
    return "not in the report: " + ", ".join(parts)


def render_kernel(k: NcuKernel, *, top: int = DEFAULT_TOP, console: Console | None = None,
                  file: TextIO | None = None, width: int | None = None) -> None:
    """The metrics (value and unit) of one kernel, then its top stall reasons."""
    out = _console(console, file, width)
    out.print(_heading(k))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    t.add_column("metric")
    t.add_column("value", justify="right", no_wrap=True)
    t.add_column("unit", no_wrap=True)
    rows = [(s, i) for s, i in _ordered(list(k.metrics)) if i.group != "stalls"]
    for n, (short, info) in enumerate(rows):
        v = k.metrics[short]
        cell = _fmt(info, v)
        if short.startswith("local_") and not _missing(v) and v > 0:
            cell = f"[yellow]{cell}[/]"
        if short == "sm_imbalance" and not _missing(v) and v >= _IMBALANCE_WARN:
            cell = f"[yellow]{cell}[/]"
        last = n + 1 == len(rows) or rows[n + 1][1].group != info.group
        t.add_row(escape(info.label), cell, escape(_unit(info)), end_section=last)
    out.print(t)

    stalls = stall_breakdown(k)
    shown = stalls[stalls["stall"]].head(top)
    if len(shown):
        total = k.metrics.get("warp_cycles_per_issue")
        title = "top stall reasons"
        if not _missing(total):
            title += f": warp cycles per issued instruction {total:.2f}"
        issuing = stalls[~stalls["stall"]]
        if len(issuing):
            title += f", {issuing['cycles'].iloc[0]:.2f} of them issuing"
        # A line of its own, not the table's title: a title wraps to the narrow table's width.
        out.print(escape(title))
        s = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        s.add_column("reason")
        s.add_column("cycles", justify="right")
        s.add_column("share", justify="right")
        for row in shown.itertuples(index=False):
            share = "-" if _missing(row.share) else f"{100 * row.share:.1f}%"
            s.add_row(escape(row.reason.replace("_", " ")), f"{row.cycles:.2f}", share)
        out.print(s)

    ld, st = k.metrics.get("local_load_per_thread"), k.metrics.get("local_store_per_thread")
    if not _missing(ld) and not _missing(st) and (ld > 0 or st > 0):
        out.print(f"[yellow]local memory at run time: {ld:.1f} B loaded and {st:.1f} B stored per thread "
                  "(spills or stack); `jfa-prof spills` shows where[/]")
    for note in (_missing_note(k.missing), _arch_note(k)):
        if note:
            out.print(f"[dim]{escape(note)}[/]")


def render_report(report: NcuReport, *, top: int = DEFAULT_TOP, console: Console | None = None,
                  file: TextIO | None = None, width: int | None = None) -> None:
    """Every kernel of a report, one after the other."""
    out = _console(console, file, width)
    for n, k in enumerate(report.kernels):
        if n:
            out.print()
        render_kernel(k, top=top, console=out)


def _change(info: MetricInfo, d) -> tuple[str, str]:
    """(B - A, relative change) cells, green when B is better by the metric's direction."""
    if d.delta is None:
        return "-", "-"
    if d.delta == 0:
        return "0", "0%" if d.relative is not None else "-"
    style = {True: "green", False: "red", None: ""}[d.improved]
    delta = _number(info, d.delta, sign=True)
    rel = "-" if d.relative is None else f"{100 * d.relative:+.1f}%"
    return (f"[{style}]{delta}[/]", f"[{style}]{rel}[/]") if style else (delta, rel)


def render_comparison(cmp: NcuComparison, *, top: int = DEFAULT_TOP, console: Console | None = None,
                      file: TextIO | None = None, width: int | None = None) -> None:
    """B against A: every metric with its delta, then the largest stall reasons of either."""
    out = _console(console, file, width)
    out.print(f"A  {escape(cmp.label_a)}  [dim]{escape(cmp.a.device or '')} {escape(cmp.a.arch or '')}[/]")
    out.print(f"B  {escape(cmp.label_b)}  [dim]{escape(cmp.b.device or '')} {escape(cmp.b.arch or '')}[/]")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    t.add_column("metric")
    for name, justify in (("unit", "left"), ("A", "right"), ("B", "right"), ("B - A", "right"),
                          ("change", "right")):
        t.add_column(name, justify=justify, no_wrap=True)
    by_metric = {d.metric: d for d in cmp.deltas}
    rows = _ordered(list(by_metric))
    for n, (short, info) in enumerate(rows):
        d = by_metric[short]
        last = n + 1 == len(rows) or rows[n + 1][1].group != info.group
        t.add_row(escape(info.label), escape(_unit(info)), _fmt(info, d.a), _fmt(info, d.b),
                  *_change(info, d), end_section=last)
    out.print(t)

    stalls = [d for d in cmp.stall_deltas if d.metric[len("stall_"):] not in ncu_metrics.NOT_A_STALL][:top]
    if stalls:
        out.print("top stall reasons (warp cycles per issued instruction)")
        s = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for name, justify in (("reason", "left"), ("A", "right"), ("B", "right"), ("B - A", "right")):
            s.add_column(name, justify=justify)
        for d in stalls:
            info = describe(d.metric)
            s.add_row(escape(d.metric[len("stall_"):].replace("_", " ")), _fmt(info, d.a), _fmt(info, d.b),
                      _change(info, d)[0])
        out.print(s)

    dur = by_metric.get("duration")
    if dur is not None and dur.relative is not None and dur.delta:
        faster = dur.delta < 0
        out.print(f"[{'green' if faster else 'red'}]B is {abs(100 * dur.relative):.1f}% "
                  f"{'faster' if faster else 'slower'} ({dur.a / 1e3:,.1f} -> {dur.b / 1e3:,.1f} µs)[/]")
    if not cmp.same_arch:
        out.print(f"[yellow]different architectures ({cmp.a.arch} vs {cmp.b.arch}): metrics named "
                  "differently are not compared[/]")
    for side, k in (("A", cmp.a), ("B", cmp.b)):
        for note in (_missing_note(k.missing), _arch_note(k)):
            if note:
                out.print(f"[dim]{side}: {escape(note)}[/]")


# ---- JSON ----------------------------------------------------------------------------------

def stalls_figure(kernels: Sequence[tuple[str, NcuKernel]], *, top: int = DEFAULT_TOP,
                  title: str = "warp stall reasons") -> "go.Figure":
    """Where a warp's cycles between two issued instructions go, one colour per kernel: the
    ``top`` stall reasons by their largest value in any of them, in warp cycles per issued
    instruction (ncu's unit, so kernels of different lengths compare)."""
    import plotly.graph_objects as go

    from jfa_prof.render.figures import ranked_bars_layout

    frames = [(label, stall_breakdown(k)) for label, k in kernels]
    frames = [(label, f[f["stall"]]) for label, f in frames if len(f)]
    if not frames:
        raise ValueError("no stall reasons to draw (collect them with --section WarpStateStats)")
    best: dict[str, float] = {}
    for _, f in frames:
        for r in f.itertuples(index=False):
            best[r.reason] = max(best.get(r.reason, 0.0), float(r.cycles))
    reasons = sorted(best, key=lambda k: -best[k])[:top]
    fig = go.Figure()
    for label, f in frames:
        by = {r.reason: r for r in f.itertuples(index=False)}
        fig.add_trace(go.Bar(
            y=[r.replace("_", " ") for r in reasons], x=[float(by[r].cycles) if r in by else 0.0 for r in reasons],
            customdata=[100 * float(by[r].share) if r in by else 0.0 for r in reasons], name=label, orientation="h",
            hovertemplate="%{y}: %{x:.2f} cycles per issued instruction<br>%{customdata:.1f}% of the warp's cycles"
                          "<extra>%{fullData.name}</extra>"))
    return ranked_bars_layout(fig, title=title, n_rows=len(reasons), n_groups=len(frames),
                              x_title="warp cycles per issued instruction", legend_title="report")


def _plain(v: Any) -> Any:
    if _missing(v):
        return None
    return v.item() if hasattr(v, "item") else v


def kernel_to_dict(k: NcuKernel) -> dict[str, Any]:
    metrics = {}
    for short, v in k.metrics.items():
        info = describe(short, k.arch)
        metrics[short] = {"value": _plain(v), "unit": info.unit, "label": info.label,
                          "ncu": k.ncu_names.get(short)}
    stalls = [{"reason": r.reason, "cycles": _plain(r.cycles), "share": _plain(r.share), "stall": bool(r.stall)}
              for r in stall_breakdown(k).itertuples(index=False)]
    return {
        "name": k.name, "report": k.source, "range": k.range_index, "action": k.action_index,
        "device": k.device, "arch": k.arch, "sm_count": k.sm_count,
        "arch_known": k.arch_known, "arch_verified": k.arch_verified,
        "metrics": metrics, "stalls": stalls, "missing": list(k.missing),
    }


def report_to_dict(report: NcuReport) -> dict[str, Any]:
    return {"report": report.path, "kernels": [kernel_to_dict(k) for k in report.kernels]}


def comparison_to_dict(cmp: NcuComparison) -> dict[str, Any]:
    def side(label: str, k: NcuKernel) -> dict[str, Any]:
        return {"label": label, "report": k.source, "kernel": k.name, "device": k.device, "arch": k.arch,
                "arch_verified": k.arch_verified, "missing": list(k.missing)}

    def row(d) -> dict[str, Any]:
        info = describe(d.metric)
        return {"metric": d.metric, "unit": info.unit, "a": _plain(d.a), "b": _plain(d.b),
                "delta": _plain(d.delta), "relative": _plain(d.relative), "improved": d.improved}

    return {"a": side(cmp.label_a, cmp.a), "b": side(cmp.label_b, cmp.b),
            "metrics": [row(d) for d in cmp.deltas], "stalls": [row(d) for d in cmp.stall_deltas]}


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
