"""``jfa-prof spills``: registers, spills, local memory and waits of every kernel variant, compiled here."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import typer


def spills(
    kernel: Optional[str] = typer.Option(
        None, "--kernel", help="Only this kernel: a name's first segment (fwd), its pass tag, or the "
                                     "jitted function's name."),
    variant: Optional[str] = typer.Option(
        None, "--variant", help="Only variants matching this glob (fwd/bcast/*/peel/*) or name prefix."),
    compare: Optional[Tuple[str, str]] = typer.Option(
        None, "--compare", metavar="A B", help="Show B against A, metric by metric (each may be a glob "
                                               "matching one variant), e.g. unpeeled then peeled."),
    target: str = typer.Option("sm_90a", "--target", help="Architecture to compile for: sm_90a, the only one "
                                                          "these Hopper kernels build for."),
    json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompile from source, ignoring (and not "
                                                            "filling) the compile cache."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Compiler processes for cache misses "
                                                             "(0: one per core, up to 8)."),
) -> None:
    """Registers, spills, local memory and waits of each kernel variant, compiled here (no GPU needed).

    Compiles the kernel variants for the target and reports registers, spill
    bytes, stack, shared memory and the LDL/STL instructions in the SASS, and how the SASS waits:
    the most wgmma groups it issues before a wait (1: no two matmuls ever overlap, whatever the
    source asked for) and its barriers, the compiler's included.

    Only the first run pays for compiling: results are cached in $JFA_PROF_CACHE/compile.

    Exits 1 when a variant fails to compile.
    """
    from jfa_prof.analyses import spills as analysis
    from jfa_prof.compile import CompileFailure, cache_misses, compile_many, parse_kernel_target
    from jfa_prof.errors import BadInputError, JfaProfError, TlxUnavailableError
    from jfa_prof.kernels import registry
    from jfa_prof.render import spills as report

    target, _ = parse_kernel_target(target)
    try:
        available = registry.all_variants()
    except ImportError as err:
        raise TlxUnavailableError(f"cannot import the kernels: {err}", hint="jfa-prof doctor says why") from None
    chosen = analysis.select_variants(available, kernel=kernel, pattern=variant)
    if not chosen:
        raise BadInputError("no kernel variant matches the filters",
                            hint=f"{len(available)} variants, e.g. {', '.join(v.name for v in available[:3])}")
    if compare is not None:
        chosen = [_one(analysis.select_variants(chosen, pattern=p), p) for p in compare]

    jobs = jobs or min(os.cpu_count() or 1, 8)
    misses = len(chosen) if no_cache else sum(cache_misses(chosen, target))
    _announce(chosen, len(available), misses, target, jobs, everything=kernel is None and variant is None
              and compare is None)
    outcomes = _compile_with_progress(chosen, target, use_cache=not no_cache, jobs=jobs,
                                      compile_many=compile_many)
    resources = [
        analysis.failed(o.variant, o.kernel, o.message, o.tags) if isinstance(o, CompileFailure)
        else analysis.from_result(o)
        for o in outcomes
    ]

    if compare is not None:
        cmp = analysis.compare(*resources)
        if json:
            typer.echo(report.to_json(report.comparison_to_dict(cmp, target=target)))
        else:
            report.render_comparison(cmp)
    else:
        table = analysis.spill_table(resources)
        if json:
            typer.echo(report.to_json(report.table_to_dict(table, target=target)))
        else:
            report.render_table(table, target=target)

    failures = [o for o in outcomes if isinstance(o, CompileFailure)]
    if failures:
        raise JfaProfError(f"{len(failures)} of {len(outcomes)} variants failed to compile",
                           hint=f"first: {failures[0].variant}")


def _one(matches: list, pattern: str):
    from jfa_prof.errors import BadInputError

    # A full name picks its variant even where longer names extend it (".../noprof" and ".../noprof/n64").
    exact = [v for v in matches if v.name == pattern]
    matches = exact or matches
    if len(matches) != 1:
        names = ", ".join(v.name for v in matches[:4]) or "none"
        raise BadInputError(f"--compare {pattern!r} must match exactly one variant, matched {len(matches)}",
                            hint=names)
    return matches[0]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _announce(chosen, n_available: int, misses: int, target: str, jobs: int, *, everything: bool) -> None:
    """Say before compiling what will compile and roughly for how long: a cold run of every
    variant takes about an hour on two cores, and nothing else would say so."""
    from rich.console import Console

    from jfa_prof.compile import COLD_SECONDS_PER_VARIANT

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    line = f"{len(chosen)} variant(s) for {target}: {len(chosen) - misses} cached, {misses} to compile"
    if misses:
        eta = misses * COLD_SECONDS_PER_VARIANT / max(1, min(jobs, misses))
        line += f", roughly {_duration(eta)} with {min(jobs, misses)} process(es)"
    err.print(line)
    if everything and misses:
        err.print(f"[yellow]no --kernel or --variant: every one of the {n_available} variants is selected[/] "
                  "(narrow it with e.g. --variant 'fwd/bcast/bf16/d128/*')")


def _compile_with_progress(variants, target, *, use_cache, jobs, compile_many):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from jfa_prof.compile import CompileFailure

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not err.is_terminal:
        # Logs (scripts/main.sh, CI) get a line per variant: a bar would print nothing there, and
        # a cold run is minutes of silence.
        done = []

        def line(variant, outcome):
            done.append(variant)
            if isinstance(outcome, CompileFailure):
                what = f"failed: {outcome.message}"
            else:
                what = "cached" if outcome.cached else f"compiled in {outcome.compile_seconds:.0f} s"
            err.print(f"[{len(done)}/{len(variants)}] {variant.name}: {what}", markup=False)

        return compile_many(variants, target, use_cache=use_cache, jobs=jobs, on_result=line)

    # On stderr, so that --json output stays parseable; gone once done, the table is what stays.
    progress = Progress(TextColumn("compiling for {task.fields[target]}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task("", total=len(variants), target=target)

        def step(variant, outcome):
            progress.update(task, advance=1, description=variant.name)

        return compile_many(variants, target, use_cache=use_cache, jobs=jobs, on_result=step)
