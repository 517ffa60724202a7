"""``jfa-prof barriers``: where the warp roles wait, ranked by cycles."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def barriers(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Recorded .jfatrace file (default: a bundled H200 recording)."),
    json: bool = typer.Option(False, "--json", help="Print the attribution as JSON on stdout."),
    top: int = typer.Option(20, "--top", min=0, help="Rows to show (0: all)."),
) -> None:
    """Barrier waits per site and warp role, ranked by cycles.

    Each row's share of the kernel's warp-role time shows who starves where: a producer
    waiting on k_empty, consumers waiting on k_full, ...
    """
    from rich.console import Console

    from jfa_prof.analyses.barriers import barrier_attribution
    from jfa_prof.render import barriers as render
    from jfa_prof.trace import open_trace

    tr = open_trace(trace)
    if tr.meta.get("profile_level") == 1:
        from jfa_prof.errors import BadInputError

        raise BadInputError(f"{tr.describe_origin()} was recorded at level 1: tile records only, no barrier waits",
                            hint="re-record with `jfa-prof record --level 2`")
    for w in tr.warnings:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]warning:[/] {w}")
    kernel_cycles = tr.makespan_ns * tr.clock_khz / 1e6 if tr.clock_khz else None
    attr = barrier_attribution(tr.waits, tr.spans, kernel_cycles=kernel_cycles)
    if json:
        typer.echo(render.to_json(attr, source=tr.describe_origin(), origin=tr.origin,
                                  trace=str(tr.path) if tr.path else None, schedule=tr.schedule,
                                  dropped=tr.dropped, warnings=tr.warnings))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"source: {tr.describe_origin()}")
    render.barriers_table(attr, console, top=top or None,
                          title=f"barrier waits · {tr.kernel_label} · {tr.workload_label}")
