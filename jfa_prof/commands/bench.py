"""``jfa-prof bench``: the kernel against FlashAttention-4 and PyTorch's attention, on the
benchmark grids of ``jfa_prof.inputs``, in TFLOPS by FlashAttention-4's FLOP convention
(4·H·D·Σ Lq·Lk, ×2.5 for the backward).

Live on a GPU, or, with ``--results FILE``, from a result file recorded elsewhere (then every
table and chart says where and when it was recorded).
"""
from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Optional

import typer

from jfa_prof.schedule import DEFAULT_SCHEDULE

DEFAULT_PEERS = "fa4,varlen,sdpa,flex"


def bench(
    pass_: str = typer.Option("fwd", "--pass", help="fwd, or bwd: the backward of each (gradient of a fixed "
                                                    "upstream gradient; peers on repeated Q, autograd summing dQ)."),
    grid: Optional[str] = typer.Option(None, "--grid", help="Workload grid: hsp, jagged, dense, long. Live default: "
                                                            "hsp; with --results: every grid in the file."),
    label: Optional[list[str]] = typer.Option(None, "--label", help="Only this workload, e.g. 'hsp Lq=256 max=2048 "
                                                                    "s=0.5'; repeat for more."),
    causal: bool = typer.Option(False, "--causal", help="Each workload with the causal mask (bottom-right; jagged-Q "
                                                        "grids: jagged, dense). FLOPs count the visible pairs only."),
    peers: str = typer.Option(DEFAULT_PEERS, "--peers", help="Comma-separated peers to time when installed: "
                                                             "fa4, varlen, sdpa, flex; '' for none."),
    schedule: str = typer.Option(DEFAULT_SCHEDULE, "--schedule", help="Schedules of this kernel to time, comma-separated."),
    rep_ms: int = typer.Option(100, "--rep-ms", min=1, help="Milliseconds of repeats per timing (median taken)."),
    rounds: int = typer.Option(3, "--rounds", min=1, help="Time every implementation this many times per point, "
                                                          "in turn, and report the median round: a GPU clock that "
                                                          "drifts over a point then weighs on all of them alike."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the results (JSON: one record per point, "
                                                                   "readable with --results) here."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write TFLOPS-vs-sparsity charts (HTML) here; with time "
                                                             "splits, what limits each point beside it (NAME-limits.html)."),
    json: bool = typer.Option(False, "--json", help="Print the results as JSON instead of a table."),
    detail: Optional[bool] = typer.Option(None, "--detail/--no-detail",
                                          help="Every implementation's ms, ratios, memory and error per point. "
                                               "Default: only for up to 4 points."),
    results: Optional[Path] = typer.Option(None, "--results", help="Render a recorded result file instead of "
                                                                   "measuring; no GPU needed."),
    limits: bool = typer.Option(False, "--limits", help="Also record our kernel at each point (tile records) "
                                                        "and say what keeps it from the target against FA4."),
    against: Optional[Path] = typer.Option(None, "--against", help="An earlier result file: each point both hold, "
                                                                   "the op as called before and after (ms, ÷fa4), "
                                                                   "and whether the two runs' GPUs and ceilings let "
                                                                   "them be compared."),
) -> None:
    """Time this kernel and its peers over a benchmark grid: median ms, TFLOPS, ratios, memory.

    Outputs are checked against the fp32 reference on the first point before any timing.
    A peer that fails is reported, not fatal.
    """
    from rich.console import Console
    from rich.markup import escape

    from jfa_prof.bench import TARGETS, load_results
    from jfa_prof.errors import BadInputError
    from jfa_prof.files import check_writable
    from jfa_prof.render import bench as render

    # Before any timing: a run of many minutes must not end on a path it cannot write.
    for path in (out if results is None else None, html, html and html.with_name(f"{html.stem}-limits{html.suffix}")):
        if path:
            check_writable(path)
    # Read before a live run, so that minutes of timing do not end on a file that cannot be read.
    earlier = load_results(against).filter(grid=grid, labels=label, pass_=pass_) if against is not None else None
    if earlier is not None and not earlier.records:
        raise BadInputError(_holds_none(against, pass_, grid, label), hint="pass a result file of the same pass")
    if results is not None:
        if out is not None or limits:
            flag = "--out" if out is not None else "--limits"
            raise BadInputError(f"{flag} applies to a live run; with --results nothing is measured",
                                hint=f"drop {flag} (--html and --json render the file)")
        if causal:
            raise BadInputError("--causal applies to a live run; a result file's causal points carry "
                                "'causal' in their labels", hint="drop --causal, or pass --label '... causal'")
        res = load_results(results).filter(grid=grid, labels=label, pass_=pass_)
        if not res.records:
            raise BadInputError(_holds_none(results, pass_, grid, label))
        origin, provenance = "recorded", res.provenance()
    else:
        res = _measure(pass_, grid or "hsp", label, peers, schedule, rep_ms, out, limits, causal, rounds)
        origin, provenance = "live", f"measured on {res.gpu} on {res.date}"

    change = None
    if earlier is not None:
        from jfa_prof.analyses.runs import compare_runs

        change = compare_runs(res, earlier)
        if not change.points:
            raise BadInputError(f"{against} holds none of these {pass_} points",
                                hint="pass a result file of the same pass and grid")
    frame = res.frame()
    grids = "/".join(dict.fromkeys(str(g) for g in frame["grid"]))
    splits = res.splits()
    point_limits = res.limits(splits)
    limits_html = html.with_name(f"{html.stem}-limits{html.suffix}") if html and any(point_limits) else None
    if html is not None:
        from jfa_prof.render.heatmap import write_html

        fig = render.tflops_figure(frame, title=f"{pass_} TFLOPS by sparsity · {grids} grid",
                                   subtitle=f"{provenance} · {res.meta.get('timer', 'median')} · "
                                            "FLOPs by the FA4 convention (4·H·D·Σ Lq·Lk"
                                            + (", ×2.5 for the backward)" if pass_ == "bwd" else ")"))
        write_html(fig, html)
        if limits_html is not None:
            write_html(render.limits_figure(res.labels(), point_limits,
                                            title=f"{pass_}: what limits each point", subtitle=provenance),
                       limits_html)
    if json:
        # Each record's time_split is its own fit; time_splits are the pooled fits the verdicts use.
        typer.echo(_json.dumps({"origin": origin, "provenance": provenance,
                                "file": str(res.path) if res.path else None,
                                "html": str(html) if html else None,
                                "limits_html": str(limits_html) if limits_html else None, **res.to_dict(),
                                "rooflines": [r.to_dict() if r else None for r in res.rooflines()],
                                "roofline_ceilings": res.ceilings(),
                                "time_splits": [s.to_dict() if s else None for s in splits],
                                "point_limits": [lim.to_dict() if lim else None for lim in point_limits],
                                "against": change.to_dict() if change else None},
                               indent=1))
        return
    console = Console(highlight=False, soft_wrap=True)
    if detail if detail is not None else frame["label"].nunique() <= 4:
        render.bench_table(frame, console, title=f"{pass_} · {grids} · {provenance}")
    render.summary_table(frame, console, ours=res.baseline, title=f"{pass_} TFLOPS · {grids} · {provenance}")
    render.roofline_table(frame, console, ours=res.baseline, title=f"{pass_} roofline · {grids} · {res.gpu}",
                          ceilings=res.ceilings())
    render.limits_table(res.labels(), point_limits, splits, console,
                        title=f"{pass_} · what limits each point · {provenance}")
    if change is not None:
        render.runs_change_table(change, console,
                                 title=f"{pass_} · {grids} · the op as called against {against.name}")
    if any(splits) and not any(point_limits):
        console.print("[yellow]time splits recorded, but no verdict: one needs FA4's time at the point and a target "
                      f"for its grid ({', '.join(f'{p} {g}' for p, g in TARGETS)})[/]")
    for r in res.records:
        if isinstance(r.get("time_split"), dict) and "error" in r["time_split"]:
            console.print(f"[yellow]{escape(r['workload'].get('label'))}: no time split:[/] "
                          f"{escape(r['time_split']['error'])}")
    unavailable = {k: p for k, p in res.peers.items() if not p.get("available", True)}
    for k, p in unavailable.items():
        console.print(f"[yellow]peer {k} not run:[/] {p.get('reason')}")
    if out is not None and results is None:
        console.print(f"wrote {out}")
    for page in (html, limits_html):
        if page is not None:
            console.print(f"wrote {page}")


def _holds_none(path: Path, pass_: str, grid: Optional[str], labels) -> str:
    """What a result file filtered to nothing lacks, for the error that says so."""
    return (f"{path} holds no {pass_} results" + (f" for grid {grid}" if grid else "")
            + (" with those labels" if labels else ""))


def _measure(pass_: str, grid: str, labels, peers: str, schedule: str, rep_ms: int, out: Optional[Path],
             limits: bool = False, causal: bool = False, rounds: int = 1):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from jfa_prof import bench as lib
    from jfa_prof import timing
    from jfa_prof.errors import BadInputError
    from jfa_prof.files import write_atomic
    from jfa_prof.schedule import SCHEDULES

    lib.check_pass(pass_)
    schedules = [s.strip() for s in schedule.split(",") if s.strip()]
    bad = [s for s in schedules if s not in SCHEDULES]
    if bad or not schedules:
        raise BadInputError(f"unknown schedule(s): {', '.join(bad) or '(none given)'}",
                            hint=f"one or more of {', '.join(SCHEDULES)}")
    keys = [k.strip() for k in peers.split(",") if k.strip()]
    workloads = lib.select_workloads(grid, labels, causal=causal)
    status = lib.peer_status(keys)  # unknown peer names fail here, before any GPU work
    timing.require_gpu("jfa-prof bench", hint="pass --results FILE to render a recorded run")
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    usable = [k for k, s in status.items() if s.available]
    for k, s in status.items():
        if not s.available:
            err.print(f"[yellow]peer {k} left out:[/] {s.reason}")

    names = lib.impl_names(usable, schedules, pass_)
    progress = Progress(TextColumn("{task.fields[point]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task("", total=len(workloads) * (len(names) + limits + rounds - 1), point="")
        started = []

        def on_impl(point_label: str, name: str) -> None:
            if started:
                progress.advance(task)
            started.append(name)
            progress.update(task, description=name, point=point_label)

        fa4 = status.get("fa4")
        done: list[dict] = []
        # The ceilings the roofline holds each point to, measured in this run before and after the points.
        progress.update(task, description="streaming read, matrix product", point="ceilings")
        stream = {"before_tb_s": timing.stream_read_tb_s(), "method": timing.STREAM_READ_METHOD}
        matmul = {"before_tflops": timing.matmul_tflops(), "method": timing.MATMUL_METHOD}

        def write(records: list[dict]) -> dict:
            meta = timing.measurement_meta(flash_attn_4=fa4.version if fa4 and fa4.available else None)
            if rounds > 1:
                meta["timer"] += f", median of {rounds} rounds timing every implementation in turn"
            # The higher reading of each is the ceiling (the other saw the clock lower or the GPU busier).
            meta["stream_read"] = {**stream, "tb_s": max(stream["before_tb_s"], stream.get("after_tb_s", 0.0))}
            meta["matmul_peak"] = {**matmul, "tflops": max(matmul["before_tflops"], matmul.get("after_tflops", 0.0))}
            doc = lib.results_document(records, meta, status)
            if out is not None:
                # Written aside and moved in whole: an interrupted write leaves the last good file.
                write_atomic(out, _json.dumps(doc, indent=1))
            return doc

        def on_point(record: dict) -> None:
            # Every finished point goes into the file at once: a run cut short keeps what it measured.
            done.append(record)
            write(done)

        records = lib.run_bench(workloads, pass_=pass_, peers=usable, schedules=schedules, rep_ms=rep_ms,
                                on_impl=on_impl, limits=limits, on_point=on_point, rounds=rounds)
        progress.advance(task)
        stream["after_tb_s"] = timing.stream_read_tb_s()
        matmul["after_tflops"] = timing.matmul_tflops()
    doc = write(records)
    return lib.BenchResults(meta=doc["meta"], records=doc["results"], peers=doc["peers"], path=out)
