"""``jfa-prof report``: one self-contained HTML page for a workload.

The environment, the SM heatmap and imbalance figures of every schedule, the barrier waits,
and, when asked, the forward's registers and spills, ncu counters, a recorded waterfall and
bench results: the same figures and tables the commands print, on one page to attach or mail.
"""
from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Optional

import typer

from jfa_prof.commands import options as opt


def report(
    out: Path = typer.Option(Path("report.html"), "-o", "--out", help="Where to write the page."),
    trace: Optional[list[Path]] = typer.Option(
        None, "--trace", help="Recorded .jfatrace file; repeat for each schedule. Default: record every schedule "
                              "live on a GPU, else the bundled H200 recordings."),
    ncu: Optional[list[Path]] = typer.Option(
        None, "--ncu", help="An .ncu-rep to show; a second one is compared against the first."),
    waterfall: Optional[Path] = typer.Option(
        None, "--waterfall", help="A waterfall recorded by `jfa-prof waterfall --save`."),
    bench: Optional[Path] = typer.Option(None, "--bench", help="A result file of `jfa-prof bench --out`."),
    spills: bool = typer.Option(
        False, "--spills", help="Compile the forward's main variants here (no GPU needed; cached after the "
                                "first run) and show their registers and spills."),
    variant: Optional[str] = typer.Option(
        None, "--variant", help="With --spills: the variants to compile, a glob such as 'fwd/bcast/bf16/d128/*'."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Compiler processes for --spills (0: one per core, "
                                                             "up to 8)."),
    predict: bool = typer.Option(True, "--predict/--no-predict",
                                 help="Compare each recording with the CPU simulation of its schedule."),
    doctor: bool = typer.Option(True, "--doctor/--no-doctor", help="Include the environment checks."),
    bins: int = typer.Option(200, "--bins", min=10, max=20000, help="Time columns of the heatmap (the page "
                                                                   "grows with them)."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    json: bool = typer.Option(False, "--json", help="Print what the page holds as JSON."),
) -> None:
    """One self-contained HTML page for a workload: the figures and tables of the other commands.

    Environment, SM heatmap and imbalance, barrier waits; with options, spills, ncu, a waterfall, bench results.

    Without --trace and without a GPU it shows the bundled H200 recordings, and says so at the top.
    """
    import os

    from rich.console import Console

    from jfa_prof.errors import BadInputError
    from jfa_prof.files import check_writable
    from jfa_prof.render import report as render
    from jfa_prof.report import gather

    if variant is not None and not spills:
        raise BadInputError("--variant chooses what --spills compiles", hint="add --spills")
    given = (("--trace", trace or []), ("--ncu", ncu or []), ("--waterfall", [waterfall] if waterfall else []),
             ("--bench", [bench] if bench else []))
    # Checked before anything slow (probing tools, compiling) so a typo fails at once.
    for flag, paths in given:
        for p in paths:
            if not p.is_file():
                raise BadInputError(f"{flag} {p}: no such file")
    if trace:
        opt.refuse_with_files("--trace", grid=grid, lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed)
    check_writable(out)

    import contextlib

    err = Console(stderr=True, highlight=False, soft_wrap=True)

    class _Lines:
        """A log gets a line per step: a spinner shows nothing there, and --spills can take minutes."""

        def update(self, text: str) -> None:
            err.print(text.removesuffix("…"), markup=False)

    # Progress on stderr, so --json output stays parseable; gone once done.
    with err.status("gathering…") if err.is_terminal else contextlib.nullcontext(_Lines()) as status:
        compiled: list[str] = []

        def on_compiled(v, outcome) -> None:
            compiled.append(v.name)
            status.update(f"compiled {len(compiled)}: {v.name}")

        rep = gather(traces=trace, workload={"grid": grid, "Lq": lq, "max_kv": max_kv, "sparsity": sparsity,
                                             "seed": seed},
                     ncu=ncu or (), waterfall=waterfall, bench=bench, spills=spills, variants=variant,
                     jobs=jobs or min(os.cpu_count() or 1, 8), environment=doctor, bins=bins, predict=predict,
                     on_step=lambda desc: status.update(desc + "…"), on_compiled=on_compiled)
        status.update("writing the page…")
        path = render.write_report(rep, out)

    names = [n for n, _ in render.figures(rep)]
    size_mb = path.stat().st_size / 1e6
    if json:
        typer.echo(_json.dumps({"html": str(path), "bytes": path.stat().st_size, "origin": rep.origin,
                                "source": rep.source, "workload": rep.workload_label, "sections": rep.sections(),
                                "figures": names, "notes": rep.notes}, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    style = "yellow" if rep.origin == "bundled" else "default"
    console.print(f"[{style}]traces: {rep.source}[/]")
    for n in rep.notes:
        console.print(f"[bold red]warning:[/] {n}")
    console.print(f"sections: {', '.join(rep.sections())}; {len(names)} figures")
    console.print(f"wrote {path} ({size_mb:.1f} MB)")
