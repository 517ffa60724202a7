"""Options and checks that several commands share, defined once.

Only typer and the standard library at import: command modules import this at start-up.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer



def _positive(flag: str):
    def check(value):
        from jfa_prof.errors import BadInputError

        if value is not None and value < 1:
            raise BadInputError(f"{flag} {value}: must be a positive number of tokens")
        return value
    return check


def _density(value):
    from jfa_prof.errors import BadInputError

    if value is not None and not 0 < value <= 1:
        raise BadInputError(f"--sparsity {value}: must be a fraction in (0, 1], the mean KV length over the longest")
    return value


def _seed(value):
    from jfa_prof.errors import BadInputError

    if value is not None and value < 0:
        raise BadInputError(f"--seed {value}: must be a non-negative integer")
    return value


# Checked while the options are parsed (a BadInputError there reaches the CLI's one-line
# handler like any other), so every command that takes them refuses the same values.
Grid = Annotated[Optional[str], typer.Option("--grid", help="Workload grid: hsp, jagged, dense or long.")]
Lq = Annotated[Optional[int], typer.Option("--lq", callback=_positive("--lq"),
                                           help="Queries per sequence (hsp grid).")]
MaxKv = Annotated[Optional[int], typer.Option("--max-kv", callback=_positive("--max-kv"),
                                              help="Longest KV sequence.")]
Sparsity = Annotated[Optional[float], typer.Option("--sparsity", callback=_density,
                                                   help="Mean KV length / longest, in (0, 1].")]
Seed = Annotated[Optional[int], typer.Option("--seed", callback=_seed,
                                             help="Seed of the sequence lengths (live recordings; the bundled "
                                                  "ones were made with seed 0).")]
Schedule = Annotated[str, typer.Option("--schedule", help="static, lpt or dynamic.")]
Causal = Annotated[bool, typer.Option("--causal", help="The workload with the causal mask (bottom-right; jagged-Q "
                                                       "grids: jagged, dense).")]


def refuse_with_files(flag: str, **workload) -> None:
    """Workload options choose what to record or which bundled recording to read; next to
    recorded files (``flag``) they would be ignored, so they are refused instead."""
    from jfa_prof.errors import BadInputError

    given = [f"--{k.lower().replace('_', '-')}" for k, v in workload.items() if v is not None]
    if given:
        raise BadInputError(f"{', '.join(given)} cannot apply to {flag} files: their workload is the one recorded",
                            hint=f"drop {' '.join(given)}, or drop {flag} to record live or pick a bundled recording")


def resolve_workload(grid, lq, max_kv, sparsity, seed, causal=False):
    """The benchmark workload the options name (with `causal`, its causal-mask variant); a clear
    BadInputError when none matches."""
    from jfa_prof.errors import BadInputError
    from jfa_prof.inputs import select_workload

    try:
        w = select_workload(grid, Lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed)
    except ValueError as e:
        raise BadInputError(str(e)) from None
    if causal:
        from jfa_prof.bench.run import causal_variants

        w = causal_variants(w.grid, [w])[0]
    return w


def check_schedule(*schedules: str | None) -> None:
    from jfa_prof.errors import BadInputError
    from jfa_prof.schedule import SCHEDULES

    for s in schedules:
        if s is not None and s not in SCHEDULES:
            raise BadInputError(f"unknown schedule {s!r}", hint=f"one of {', '.join(SCHEDULES)}")
