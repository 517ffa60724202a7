"""`jfa-prof record`: one instrumented launch on the GPU, written as a self-describing trace."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jfa_prof.commands import options as opt


def record(
    out: Path = typer.Option(..., "-o", "--out", help="Trace file to write (.jfatrace)."),
    pass_: str = typer.Option("fwd", "--pass", help="fwd, or bwd: the backward kernel (its tiles are KV blocks)."),
    schedule: Optional[str] = typer.Option(
        None, "--schedule", help="fwd: static, lpt or dynamic (default); bwd: static (round-robin, broadcast-Q's "
                                 "default) or dynamic (the queue, jagged Q's)."),
    dq: Optional[str] = typer.Option(None, "--dq", help="bwd: the dQ reduction: tma, tma1 or atomic (default: the "
                                                        "op's, tma for broadcast-Q, atomic for jagged)."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    causal: opt.Causal = False,
    no_peel: bool = typer.Option(False, "--no-peel", help="Mask every KV block (no peeled mask tail)."),
    level: int = typer.Option(2, "--level", min=1, max=3,
                              help="1: tile records and warp-role spans; 2: also barrier waits (costs more); 3: also "
                                   "every warp role's window and waits on each tile (timeline per role, diagnose)."),
    sample: int = typer.Option(1, "--sample", min=1, help="Level 3: event records for every Nth tile of the work "
                                                          "list only (fewer records to read on long runs; the kernel "
                                                          "costs about the same). Under a static schedule N must "
                                                          "share no factor with the CTA count, or whole CTAs would "
                                                          "go unrecorded."),
    json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of text."),
) -> None:
    """One instrumented launch on the GPU, written as a self-describing trace file.

    Runs the forward (or backward) kernel with PROFILE on and writes its tile records, warp-role
    spans and barrier waits, with the machine, versions and workload. heatmap, timeline, barriers
    and report read the file with --trace, on any machine."""
    import json as _json

    from rich.console import Console

    from jfa_prof import ablations
    from jfa_prof.errors import BadInputError
    from jfa_prof.files import check_writable
    from jfa_prof.recording import record_bwd_workload, record_workload
    from jfa_prof.trace import write_trace

    check_writable(out, "trace")
    ablations.pass_options(pass_, schedule, dq)  # bad options before the workload is built
    if sample != 1 and level != 3:
        raise BadInputError(f"--sample {sample} applies to --level 3 only (this is --level {level})")
    if pass_ == "bwd" and no_peel:
        raise BadInputError("--no-peel applies to the forward only: the backward's peeling has no switch")
    workload = opt.resolve_workload(grid, lq, max_kv, sparsity, seed, causal)
    schedule = ablations.pass_options(pass_, schedule, dq, broadcast_q=workload.broadcast_q)
    console = Console(stderr=True, highlight=False)
    with console.status(f"recording the {pass_} of {workload.label} ({schedule}) on the GPU…"):
        try:
            if pass_ == "fwd":
                tr = record_workload(workload, schedule, peel=not no_peel, level=level, sample=sample)
            else:
                tr = record_bwd_workload(workload, schedule, dq=dq, level=level, sample=sample)
        except ValueError as e:  # a --sample the launch cannot record faithfully
            raise BadInputError(f"--sample {sample}: {e}") from None
    path = write_trace(out, tr.buffer, tr.meta)
    summary = {"path": str(path), "workload": workload.label, "schedule": schedule, "tiles": len(tr.tiles),
               "dropped": tr.dropped, "kernel_ms": tr.meta["kernel_ms"],
               "makespan_vs_kernel": tr.makespan_ns / 1e6 / tr.meta["kernel_ms"] if tr.meta["kernel_ms"] else None,
               "makespan_ms": tr.makespan_ns / 1e6, "level": level, "sample": sample, "events": len(tr.events),
               "events_dropped": tr.events_dropped}
    if json:
        typer.echo(_json.dumps(summary))
    else:
        Console(highlight=False).print(
            f"wrote {path}: {summary['tiles']} tiles, makespan {summary['makespan_ms']:.3f} ms, "
            f"kernel {summary['kernel_ms']:.3f} ms ({tr.meta.get('kernel_ms_source')})"
            + (f", [red]{tr.dropped} tile records dropped (buffer full)[/]" if tr.dropped else ""))
