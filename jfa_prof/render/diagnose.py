"""A diagnosis as a rich table (rank, cause, share, evidence, experiment) with the critical-path
line and the per-role breakdown, or as JSON for scripts."""
from __future__ import annotations

import json
import math
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof.analyses.critical_path import LANE_PARTS, CriticalPath
from jfa_prof.analyses.diagnose import Diagnosis

__all__ = ["diagnosis_table", "render", "roles_table", "to_dict", "to_json"]


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def diagnosis_table(diag: Diagnosis, console: Console, *, title: str = "diagnosis") -> None:
    """The causes, most time first; each with its evidence and the experiment that would confirm it."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_lines=True,
                  expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("cause", ratio=2, min_width=12)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("evidence", ratio=3)
    table.add_column("experiment", ratio=3)
    for rank, c in enumerate(diag.causes, 1):
        evidence = "\n".join(f"{escape(e.signal)}: {escape(e.figure)} [dim]({escape(e.source)})[/]" for e in c.evidence)
        table.add_row(str(rank), f"[bold]{escape(c.name)}[/]\n[dim]{escape(c.what)}[/]", _pct(c.share), evidence,
                      f"{escape(c.experiment)}\n[dim]{escape(c.expect)}[/]")
    console.print(table)
    if not diag.causes:
        console.print("no cause found: the recording holds no time to attribute")
    console.print(f"[dim]share: of {escape(diag.basis)}; time causes and compute add up to 100%[/]")


def roles_table(cp: CriticalPath, console: Console, *, title: str = "where each role's time went") -> None:
    """Per role, its parts as shares of its lane time (kernel × CTAs): waits by site, epilogue,
    compute, gaps, tail. Parts that are zero for every role are left out."""
    roles = list(dict.fromkeys(cp.roles["role"]))
    present = [p for p in dict.fromkeys(cp.roles["part"]) if (cp.roles[cp.roles["part"] == p]["ns"] > 0).any()]
    parts = [p for p in present if p not in LANE_PARTS] + [p for p in LANE_PARTS if p in present]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    for p in parts:
        table.add_column(p, justify="right", no_wrap=True)
    for role in roles:
        shares = cp.role_shares(role)
        table.add_row(escape(role), *(_pct(shares[p]) if p in shares else "" for p in parts))
    console.print(table)


def render(diag: Diagnosis, console: Console, *, title: str | None = None) -> None:
    """What ``jfa-prof diagnose`` prints: where the data comes from, the critical-path line, the
    ranked causes, the per-role breakdown and the notes."""
    console.print(f"source: {escape(diag.source)}")
    console.print(f"[bold]{escape(diag.summary)}[/]")
    cp = diag.critical
    counts = cp.critical_counts()
    if counts:
        console.print("critical path per tile: " + ", ".join(f"{escape(k)} {v}" for k, v in
                                                             sorted(counts.items(), key=lambda kv: -kv[1]))
                      + " of " + str(len(cp.tiles)) + " tiles")
    diagnosis_table(diag, console, title=title or f"why the {diag.pass_} kernel takes its time")
    roles_table(cp, console)
    for note in diag.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


def to_dict(diag: Diagnosis, **extra: Any) -> dict[str, Any]:
    return {**extra, **diag.to_dict()}


def to_json(diag: Diagnosis, **extra: Any) -> str:
    return json.dumps(to_dict(diag, **extra), indent=2)
