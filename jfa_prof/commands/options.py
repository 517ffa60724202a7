"""Options and checks that several commands share, defined once.

Only typer and the standard library at import: command modules import this at start-up.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

Grid = Annotated[Optional[str], typer.Option("--grid", help="Workload grid (SPEC §6): hsp, jagged, dense.")]
Lq = Annotated[Optional[int], typer.Option("--lq", help="Queries per sequence (hsp grid).")]
MaxKv = Annotated[Optional[int], typer.Option("--max-kv", help="Longest KV sequence.")]
Sparsity = Annotated[Optional[float], typer.Option("--sparsity", help="Mean length / max (SPEC §6 density).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed of the sequence lengths.")]
Schedule = Annotated[str, typer.Option("--schedule", help="static, lpt or dynamic.")]


def resolve_workload(grid, lq, max_kv, sparsity, seed):
    """The benchmark workload the options name; a clear BadInputError when none matches."""
    from jfa_prof.errors import BadInputError
    from jfa_prof.inputs import select_workload

    try:
        return select_workload(grid, Lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed)
    except ValueError as e:
        raise BadInputError(str(e)) from None


def check_schedule(*schedules: str | None) -> None:
    from jfa_prof.errors import BadInputError
    from jfa_prof.schedule import SCHEDULES

    for s in schedules:
        if s is not None and s not in SCHEDULES:
            raise BadInputError(f"unknown schedule {s!r}", hint=f"one of {', '.join(SCHEDULES)}")
