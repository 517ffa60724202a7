"""`jfa-prof record`: one instrumented launch on the GPU, written as a self-describing trace."""
from __future__ import annotations

from pathlib import Path

import typer

from jfa_prof.commands import options as opt


def record(
    out: Path = typer.Option(..., "-o", "--out", help="Trace file to write (.jfatrace)."),
    schedule: opt.Schedule = "lpt",
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    no_peel: bool = typer.Option(False, "--no-peel", help="Mask every KV block (no peeled mask tail)."),
    level: int = typer.Option(2, "--level", min=1, max=2,
                              help="1: tile records and warp-role spans; 2: also barrier waits (costs more)."),
    json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of text."),
) -> None:
    """Run the forward kernel with PROFILE=True on the GPU and write its tile records, warp-role
    spans and barrier waits, with the machine, versions and workload, to one trace file."""
    import json as _json

    from rich.console import Console

    from jfa_prof.recording import record_workload
    from jfa_prof.trace import write_trace

    opt.check_schedule(schedule)
    workload = opt.resolve_workload(grid, lq, max_kv, sparsity, seed)
    console = Console(stderr=True, highlight=False)
    with console.status(f"recording {workload.label} ({schedule}) on the GPU…"):
        tr = record_workload(workload, schedule, peel=not no_peel, level=level)
    path = write_trace(out, tr.buffer, tr.meta)
    summary = {"path": str(path), "workload": workload.label, "schedule": schedule, "tiles": len(tr.tiles),
               "dropped": tr.dropped, "kernel_ms": tr.meta["kernel_ms"],
               "makespan_vs_kernel": tr.makespan_ns / 1e6 / tr.meta["kernel_ms"] if tr.meta["kernel_ms"] else None,
               "makespan_ms": tr.makespan_ns / 1e6}
    if json:
        typer.echo(_json.dumps(summary))
    else:
        Console(highlight=False).print(
            f"wrote {path}: {summary['tiles']} tiles, makespan {summary['makespan_ms']:.3f} ms, "
            f"kernel {summary['kernel_ms']:.3f} ms ({tr.meta.get('kernel_ms_source')})"
            + (f", [red]{tr.dropped} tile records dropped (buffer full)[/]" if tr.dropped else ""))
