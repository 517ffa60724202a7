"""``jfa-prof doctor``: what can run here, and what to fix when nothing can."""
from __future__ import annotations

import typer


def doctor(
    json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Check what can run here: triton/TLX, GPU, ptxas, ncu, compute-sanitizer.

    Says whether live profiling or only compile-only work (spills, recorded traces) is possible.

    Exits 1 when TLX cannot be imported or upstream triton is installed beside fbtriton.
    """
    from jfa_prof.doctor import probe_environment
    from jfa_prof.render import doctor as report

    env = probe_environment()
    if json:
        typer.echo(report.to_json(env))
    else:
        report.render(env)
    if not env.healthy:
        raise typer.Exit(1)
