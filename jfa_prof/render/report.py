"""One self-contained HTML page of a :class:`~jfa_prof.report.Report`.

The page shows the same figures and tables the commands print: plotly figures from the
heatmap, waterfall and bench renderers, and the commands' rich tables recorded into HTML
(``Console(record=True).export_html``), so the page and the terminal never disagree. plotly.js
is inlined once in the head, not per figure, and nothing is fetched when the page opens: it
can be mailed, attached to an issue or opened offline.
"""
from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from rich.console import Console

from jfa_prof.files import write_atomic
from jfa_prof.report import Report, TraceResult

__all__ = ["FIGURE_CLASS", "finish_figure", "figures", "report_html", "rich_html", "write_report"]

# Every figure sits in a <div class="FIGURE_CLASS" data-figure="name">: the browser test finds
# them by it, and checks plotly drew into each.
FIGURE_CLASS = "jfa-figure"

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1800px;
       padding: 0 24px 48px; color: #1b1b1b; }
header { border-bottom: 1px solid #ddd; margin-bottom: 12px; }
h1 { font-size: 1.5em; margin: 18px 0 6px; }
h2 { font-size: 1.2em; margin-top: 32px; border-bottom: 1px solid #eee; padding-bottom: 4px; }
h3 { font-size: 1em; margin: 18px 0 6px; }
p.source { padding: 6px 10px; background: #eef5ff; border-left: 4px solid #3b7dd8; }
p.source.bundled { background: #fff6e0; border-left-color: #e0a000; }
p.note { padding: 6px 10px; background: #fdecea; border-left: 4px solid #d62728; }
p.meta, p.intro { color: #555; }
p.scope { margin: 2px 0 6px; font-weight: 600; color: #333; }
nav ul { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 14px; }
pre.rich { font-family: Menlo, "DejaVu Sans Mono", Consolas, monospace; font-size: 12.5px; line-height: 1.3;
           background: #fafafa; border: 1px solid #eee; padding: 8px 10px; overflow-x: auto; }
div.jfa-figure { overflow-x: auto; margin: 8px 0 16px; }
div.printed { overflow-x: auto; }
table.data { border-collapse: collapse; font-size: 13px; margin: 12px 0 4px; font-variant-numeric: tabular-nums; }
table.data caption { text-align: left; font-weight: bold; padding: 4px 0; caption-side: top; }
table.data th { border-bottom: 2px solid #ccc; padding: 3px 10px; text-align: left; white-space: pre-line;
                vertical-align: bottom; }
table.data td { border-bottom: 1px solid #eee; padding: 2px 10px; white-space: nowrap; }
table.data tbody + tbody { border-top: 2px solid #ddd; }
table.data .num { text-align: right; } table.data .mid { text-align: center; }
p.line { margin: 2px 0 4px; font-size: 13px; max-width: 110ch; }
table.checks { border-collapse: collapse; font-size: 13px; }
table.checks th, table.checks td { border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; text-align: left; }
td.ok { color: #1a7f37; } td.warn { color: #9a6700; } td.fail { color: #cf222e; font-weight: bold; }
"""

_INTROS = {
    "diagnosis": "Why the kernel takes its time, from the per-tile event records of each level-3 recording: the "
                 "causes ranked by their share of the tensor roles' time, each with its evidence and the experiment "
                 "that would confirm it.",
    "environment": "What can run on the machine that made this page (jfa-prof doctor).",
    "heatmap": "Which SMs worked when under each schedule, and how unevenly: makespan, busy max/mean, the tail "
               "after a typical SM is done, idle fraction, the tiles that end last.",
    "barriers": "Barrier wait sites ranked by the cycles the warp roles spent blocked in them.",
    "spills": "Registers, spill bytes, stack and the LDL/STL instructions of the forward's main variants, "
              "compiled for the target here with the ptxas bundled in fbtriton.",
    "ncu": "Nsight Compute counters of the forward kernel: tensor-pipe use, throughput, local-memory "
           "(spill) traffic, SM imbalance, warp stall reasons.",
    "waterfall": "Where the kernel's time goes, from ablations: each bar is the time one component's "
                 "removal saved.",
    "bench": "TFLOPS against FlashAttention-4 and PyTorch's attention, FLOPs by the FA4 convention.",
}
_TITLES = {"environment": "Environment", "heatmap": "SM heatmap and imbalance", "barriers": "Barrier waits",
           "spills": "Registers and spills", "ncu": "Nsight Compute counters", "waterfall": "Time by component",
           "bench": "Against FlashAttention-4", "diagnosis": "Diagnosis"}


def rich_html(draw: Callable[[Console], Any]) -> str:
    """What ``draw(console)`` prints, as HTML tables and paragraphs (:mod:`jfa_prof.render.html`)."""
    from jfa_prof.render.html import capture_html

    return capture_html(draw)


def finish_figure(results: Sequence[TraceResult], *, title: str | None = None) -> go.Figure:
    """Every SM's last tile end, latest first, one line per trace: a balanced schedule is a
    flat line, a tail is the few SMs at the left standing above the rest."""
    fig = go.Figure()
    for r in results:
        finish = r.imbalance.per_sm["finish_ns"].to_numpy(np.float64)
        smid = r.imbalance.per_sm.index.to_numpy()
        order = np.argsort(-np.nan_to_num(finish, nan=-np.inf), kind="stable")
        fig.add_trace(go.Scatter(
            x=np.arange(len(order)).tolist(), y=(finish[order] / 1e3).tolist(), mode="lines", name=r.label,
            customdata=smid[order].tolist(),
            hovertemplate="SM %{customdata}<br>last tile ends %{y:.1f} µs<extra>%{fullData.name}</extra>"))
    fig.update_layout(
        title=title or "SM finish times, latest first",
        xaxis={"title": {"text": "SMs, by finish time"}}, yaxis={"title": {"text": "last tile end (µs)"}},
        height=380, autosize=True, legend={"title": {"text": "trace"}}, margin={"l": 60, "r": 30, "t": 60, "b": 50})
    return fig


def figures(report: Report) -> list[tuple[str, go.Figure]]:
    """(name, figure) of every figure the page shows, in page order."""
    from jfa_prof.render import heatmap

    out: list[tuple[str, go.Figure]] = []
    if report.traces:
        first = report.traces[0].trace
        out.append(("heatmap", heatmap.heatmap_panels(
            [(r.label, r.occupancy) for r in report.traces],
            title=f"SM occupancy · {report.workload_label} · {first.gpu_name}",
            imbalances=[r.imbalance for r in report.traces], levels=[r.level for r in report.traces])))
        out.append(("finish", finish_figure(report.traces)))
    waits = [(r.label, r.barriers) for r in report.traces if r.barriers is not None and len(r.barriers.table)]
    if waits:
        from jfa_prof.render import barriers

        out.append(("barriers", barriers.barriers_figure(
            waits, title=f"barrier waits · {report.workload_label} · {_trace_pass(report)}")))
    if report.ncu:
        from jfa_prof.analyses.ncu import stall_breakdown
        from jfa_prof.render import ncu

        kernels = [(Path(rep.path).name if len(rep.kernels) == 1 else f"{Path(rep.path).name} · {k.name}", k)
                   for rep in report.ncu for k in rep.kernels]
        if any(stall_breakdown(k)["stall"].any() for _, k in kernels if len(stall_breakdown(k))):
            out.append(("ncu-stalls", ncu.stalls_figure(
                kernels, title=f"warp stall reasons · {', '.join(_ncu_passes(report))} kernel")))
    if report.waterfall is not None:
        from jfa_prof.render import waterfall

        rec, wf = report.waterfall
        tflops = rec.baseline_tflops
        out.append(("waterfall", waterfall.waterfall_figure(
            wf, title=f"{wf.pass_} kernel time by component · {rec.label or '?'} · {rec.variant}",
            subtitle=(report.waterfall_source or "") + (f" · baseline {tflops:.0f} TFLOPS" if tflops else ""))))
    if report.bench is not None:
        from jfa_prof.render import bench

        res = report.bench
        for pass_ in dict.fromkeys(r.get("pass", "fwd") for r in res.records):
            view = res.filter(pass_=pass_)
            frame = view.frame()
            grids = "/".join(dict.fromkeys(str(g) for g in frame["grid"]))
            out.append((f"bench-{pass_}", bench.tflops_figure(
                frame, title=f"{pass_} TFLOPS by sparsity · {grids} grid",
                subtitle=f"{res.provenance()} · {res.meta.get('timer', 'median')}")))
            limits = view.limits()
            if any(limits):
                out.append((f"bench-limits-{pass_}", bench.limits_figure(
                    view.labels(), limits,
                    title=f"{pass_}: what limits each point", subtitle=res.provenance())))
    return out


# ---- sections ------------------------------------------------------------------------------

def _trace_pass(report: Report) -> str:
    return " / ".join(dict.fromkeys(r.trace.kernel_label.split("/")[0] for r in report.traces)) or "?"


def _ncu_passes(report: Report) -> list[str]:
    # The kernels are named _jfa_fwd / _jfa_bwd; a report of another kernel keeps its own name.
    return list(dict.fromkeys(k.name.removeprefix("_jfa_") for rep in report.ncu for k in rep.kernels))


def _scope(report: Report, key: str) -> str | None:
    """The workload and pass a section shows, in the words the page prints under its heading."""
    if key == "diagnosis":
        return " / ".join(f"{label} · pass {d.pass_} · level {d.critical.level}" for label, d in report.diagnoses)
    if key in ("heatmap", "barriers"):
        return f"workload {report.workload_label} · pass {_trace_pass(report)} · {len(report.traces)} recording(s)"
    if key == "spills":
        passes = " / ".join(dict.fromkeys(str(v).split("/")[0] for v in report.spills["variant"]))
        return f"no workload: compiled, not run (for {report.spills_target}) · pass {passes}"
    if key == "ncu":
        return ("workload as profiled (an ncu report does not record it) · pass "
                + " / ".join(_ncu_passes(report)) + " · " + ", ".join(Path(r.path).name for r in report.ncu))
    if key == "waterfall":
        rec, wf = report.waterfall
        return f"workload {rec.label or '?'} · pass {wf.pass_} · {rec.schedule} schedule"
    if key == "bench":
        frame = report.bench.frame()
        grids = "/".join(dict.fromkeys(str(g) for g in frame["grid"]))
        passes = " / ".join(dict.fromkeys(str(r.get("pass", "fwd")) for r in report.bench.records))
        return f"workloads: the {frame['label'].nunique()} points of the {grids} grid · pass {passes}"
    return None


def _environment(report: Report) -> list[str]:
    from jfa_prof.render import doctor

    data = doctor.to_dict(report.environment)
    rows = []
    for c in data["checks"]:
        detail = html.escape(c["detail"]) + (f"<br><b>fix:</b> {html.escape(c['fix'])}" if c["fix"] else "")
        rows.append(f"<tr><td>{html.escape(c['name'])}</td><td class=\"{html.escape(c['status'])}\">"
                    f"{html.escape(c['status'])}</td><td>{detail}</td></tr>")
    verdict = data["verdict"]
    return ['<table class="checks"><tr><th>check</th><th>status</th><th>detail</th></tr>' + "".join(rows) + "</table>",
            f"<p><b>{html.escape(verdict['summary'])}</b><br>{html.escape(verdict['note'])}</p>"]


def _heatmap_tables(report: Report) -> str:
    from jfa_prof.render import heatmap

    def draw(console: Console) -> None:
        for r in report.traces:
            tr = r.trace
            console.print(f"[bold]{r.label}[/]: {tr.schedule_mechanism}; source: {tr.describe_origin()}"
                          + (f"; kernel time {tr.kernel_ms:.3f} ms" if tr.kernel_ms is not None else ""))
        heatmap.summary_table([(r.label, r.imbalance) for r in report.traces], console)
        ons = [r for r in report.traces if r.trace.schedule == "dynamic"]
        if ons:
            for off in (r for r in report.traces if r.trace.schedule != "dynamic"):
                console.print(heatmap.contrast_line(off.imbalance, ons[0].imbalance,
                                                    names=(off.trace.schedule, ons[0].trace.schedule)))
        heatmap.tail_details([(r.label, r.imbalance) for r in report.traces], console)
        predicted = [(r.label, r.prediction.comparison, r.prediction.cost_model)
                     for r in report.traces if r.prediction is not None]
        if predicted:
            heatmap.comparison_table(predicted, console)

    return rich_html(draw)


def _barrier_tables(report: Report) -> list[str]:
    from jfa_prof.render import barriers

    out = []
    for r in report.traces:
        if r.barriers is None:
            continue
        title = f"barrier waits · {r.label} · {r.trace.kernel_label}"
        out.append(rich_html(lambda c, r=r, title=title: barriers.barriers_table(r.barriers, c, top=12, title=title)))
    skipped = [r.label for r in report.traces if r.barriers is None]
    if skipped:
        out.append(f"<p class=\"meta\">no barrier waits recorded for {html.escape(', '.join(skipped))} "
                   "(level-1 recordings carry tile records only)</p>")
    return out


def _diagnosis_tables(report: Report) -> list[str]:
    from jfa_prof.render import diagnose

    return [rich_html(lambda c, label=label, d=d: diagnose.render(d, c, title=f"diagnosis · {label}"))
            for label, d in report.diagnoses]


def _ncu_tables(report: Report) -> list[str]:
    from jfa_prof.analyses.ncu import compare
    from jfa_prof.render import ncu

    each = [rich_html(lambda c, rep=rep: ncu.render_report(rep, console=c)) for rep in report.ncu]
    # Two one-kernel reports are nearly always a before/after pair: show the deltas first.
    if len(report.ncu) == 2 and all(len(rep.kernels) == 1 for rep in report.ncu):
        a, b = (rep.kernels[0] for rep in report.ncu)
        return ["<h3>B against A</h3>", rich_html(lambda c: ncu.render_comparison(compare(a, b), console=c)),
                "<h3>each report</h3>", *each]
    return each


def _bench_tables(report: Report) -> str:
    from jfa_prof.render import bench

    res = report.bench

    def draw(console: Console) -> None:
        for pass_ in dict.fromkeys(r.get("pass", "fwd") for r in res.records):
            view = res.filter(pass_=pass_)
            frame = view.frame()
            if frame["label"].nunique() <= 4:
                bench.bench_table(frame, console, title=f"{pass_} · {res.provenance()}")
            bench.summary_table(frame, console, ours=res.baseline, title=f"{pass_} TFLOPS · {res.provenance()}")
            splits = view.splits()
            bench.limits_table(view.labels(), view.limits(splits), splits, console,
                               title=f"{pass_} · what limits each point · {res.provenance()}")

    return rich_html(draw)


def _figure_div(n: int, name: str, fig: go.Figure) -> str:
    from jfa_prof.render.figures import CONFIG

    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{n}", config=CONFIG,
                       default_width="100%")
    return f'<div class="{FIGURE_CLASS}" data-figure="{html.escape(name)}">{body}</div>'


def report_html(report: Report) -> str:
    """The whole page."""
    from plotly.offline import get_plotlyjs

    figs = dict(figures(report))
    counter = iter(range(1, len(figs) + 1))

    def fig(name: str) -> str:
        return _figure_div(next(counter), name, figs[name])

    body: dict[str, list[str]] = {}
    for key in report.sections():
        blocks: list[str] = []
        if key == "diagnosis":
            blocks = _diagnosis_tables(report)
        elif key == "environment":
            blocks = _environment(report)
        elif key == "heatmap":
            blocks = [fig("heatmap"), fig("finish"), _heatmap_tables(report)]
        elif key == "barriers":
            blocks = ([fig("barriers")] if "barriers" in figs else []) + _barrier_tables(report)
        elif key == "spills":
            from jfa_prof.render import spills

            blocks = [rich_html(lambda c: spills.render_table(report.spills, target=report.spills_target, console=c))]
        elif key == "ncu":
            blocks = [*([fig("ncu-stalls")] if "ncu-stalls" in figs else []), *_ncu_tables(report)]
        elif key == "waterfall":
            from jfa_prof.render import waterfall

            blocks = [f"<p class=\"meta\">{html.escape(report.waterfall_source or '')}</p>", fig("waterfall"),
                      rich_html(lambda c: waterfall.waterfall_table(report.waterfall[1], c))]
        elif key == "bench":
            blocks = [f"<p class=\"meta\">{html.escape(str(report.bench.path or ''))} · "
                      f"{html.escape(report.bench.provenance())}</p>",
                      *[fig(n) for n in figs if n.startswith("bench-")], _bench_tables(report)]
        body[key] = blocks

    intros = dict(_INTROS)
    if any(r.prediction is not None for r in report.traces):
        intros["heatmap"] += (" The prediction re-runs each recording's own work list through the CPU simulator, "
                              "with a cost model fitted to that recording.")
    nav = "".join(f'<li><a href="#{k}">{html.escape(_TITLES[k])}</a></li>' for k in body)
    scopes = {k: _scope(report, k) for k in body}
    sections = "".join(
        f'<section id="{k}"><h2>{html.escape(_TITLES[k])}</h2>'
        + (f'<p class="scope">{html.escape(scopes[k])}</p>' if scopes[k] else "")
        + f'<p class="intro">{html.escape(intros[k])}</p>'
        + "".join(blocks) + "</section>" for k, blocks in body.items())
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in report.notes)
    source_class = "source bundled" if report.origin == "bundled" else "source"
    title = html.escape(report.title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{title}</title>\n<style>{_CSS}</style>\n"
        # plotly.js once, before any figure's script calls Plotly.newPlot.
        f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>\n<body>\n"
        f"<header><h1>{title}</h1>"
        f"<p class=\"{source_class}\"><b>traces:</b> {html.escape(report.source)}</p>{notes}"
        f"<p class=\"meta\">made {html.escape(report.created)} by jfa-prof {html.escape(report.version)}</p>"
        f"<nav><ul>{nav}</ul></nav></header>\n{sections}\n</body>\n</html>\n")


def write_report(report: Report, path: str | os.PathLike) -> Path:
    return write_atomic(path, report_html(report))
