"""Renders a ``jfa_prof.doctor.Environment``: a table of checks, or JSON for scripts."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jfa_prof.doctor import Environment, Mode, Status

_STATUS_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}
_MODE_STYLE = {Mode.LIVE: "bold green", Mode.COMPILE_ONLY: "bold yellow", Mode.BROKEN: "bold red"}


def render(env: Environment, file: TextIO | None = None, *, width: int | None = None) -> None:
    console = Console(file=file, width=width, highlight=False)
    table = Table(title=f"jfa-prof {env.jfa_prof_version} doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in env.checks:
        style = _STATUS_STYLE[check.status]
        detail = escape(check.detail)
        if check.fix:
            detail += f"\n[bold]fix:[/] {escape(check.fix)}"
        table.add_row(check.name, f"[{style}]{check.status.value}[/]", detail)
    console.print(table)

    verdict = env.verdict
    console.print(f"[{_MODE_STYLE[verdict.mode]}]{escape(verdict.summary)}[/]")
    console.print(f"[dim]{escape(verdict.note)}[/]")


def to_dict(env: Environment) -> dict[str, Any]:
    """Plain data: every probed fact, the checks, and the verdict."""
    data = dataclasses.asdict(env)
    tri = env.triton
    data["triton"].update(importable=tri.importable, is_tlx_fork=tri.is_tlx_fork, conflict=tri.conflict,
                          shadows_upstream=tri.shadows_upstream)
    if env.gpu is not None:
        data["gpu"]["sm_arch"] = env.gpu.sm_arch
    for name, tool in env.tools.items():
        data["tools"][name]["found"] = tool.found
    data["checks"] = [
        {"name": c.name, "status": c.status.value, "detail": c.detail, "fix": c.fix}
        for c in env.checks
    ]
    verdict = env.verdict
    data["verdict"] = {
        "mode": verdict.mode.value,
        "summary": verdict.summary,
        "reasons": list(verdict.reasons),
        "note": verdict.note,
        "healthy": env.healthy,
    }
    return data


def to_json(env: Environment, *, indent: int | None = 2) -> str:
    return json.dumps(to_dict(env), indent=indent)
