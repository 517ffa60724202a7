"""Renders the spills analysis: a table of variants, or two variants side by side; or JSON."""
from __future__ import annotations

import json
import math
from typing import Any, TextIO

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from jfa_prof.analyses.spills import SpillComparison
from jfa_prof.ptxas import MUFU_WAITS

_LABELS = {
    "registers": "regs",
    "spill_store_bytes": "spill\nstores",
    "spill_load_bytes": "spill\nloads",
    "spill_bytes": "spill\nbytes",
    "stack_bytes": "stack",
    "smem_bytes": "smem\nKiB",
    "ldl": "LDL",
    "stl": "STL",
    "wgmma_in_flight": "mma\nflight",
    "barriers": "BAR",
    "loop_instructions": "loop\ninstr",
    "loop_shuffles": "loop\nPRMT",
    "loop_fences": "loop\nfence",
    "loop_local": "loop\nLDL/STL",
    "mufu_overlap": "exp\n\u2225mma",
}
# More is better for these: a rise is drawn green in a comparison.
_MORE_IS_BETTER = {"wgmma_in_flight", "mufu_overlap"}
# The table shows the spill total; its stores and loads, and the stack frame the spills live in, are
# in the JSON (80 columns hold no more).
_TABLE_METRICS = ("registers", "spill_bytes", "smem_bytes", "ldl", "stl", "wgmma_in_flight", "barriers",
                  "loop_instructions", "mufu_overlap")
_FLIGHT = _TABLE_METRICS.index("wgmma_in_flight")
_OVERLAP = _TABLE_METRICS.index("mufu_overlap")
# Hopper's register file gives each thread at most 255; a kernel at the cap is likely to spill
# on the next change.
_REG_CAP = 255


def _console(console: Console | None, file: TextIO | None, width: int | None) -> Console:
    return console if console is not None else Console(file=file, width=width, highlight=False)


def shared_prefix(names: list[str]) -> str:
    """The leading ``/``-separated components every name shares (``"fwd/bcast/"``), leaving each at
    least its last component; "" when there is one name or none is shared."""
    if len(names) < 2:
        return ""
    parts = [n.split("/") for n in names]
    shared = []
    for column in zip(*(p[:-1] for p in parts)):
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    return "/".join(shared) + "/" if shared else ""


def wrap_path(name: str, width: int) -> str:
    """``name`` on lines of at most ``width`` cells, each broken after a ``/``, so no component is
    cut in two (one longer than a line is left whole, for the table to fold)."""
    parts = name.split("/")
    tokens = [p + "/" for p in parts[:-1]] + [parts[-1]]
    lines = [""]
    for token in tokens:
        if lines[-1] and len(lines[-1]) + len(token) > width:
            lines.append("")
        lines[-1] += token
    return "\n".join(lines)


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _fmt(metric: str, v: Any) -> str:
    if _missing(v):
        return "-"
    if metric == "smem_bytes":
        return f"{int(v) / 1024:.1f}"
    if metric == "mufu_overlap":
        return f"{float(v):.0%}"
    return str(int(v))


def render_table(table: pd.DataFrame, *, target: str, console: Console | None = None,
                 file: TextIO | None = None, width: int | None = None) -> None:
    """One row per variant, spilling ones highlighted; ptxas's warnings and compile failures as
    numbered notes under the table, marked after the variant name.

    Byte columns are per thread (spills) or per CTA (smem). A kernel whose matmuls never
    overlap (one wgmma group in flight at most) has that count highlighted.
    """
    out = _console(console, file, width)
    n_spill = int((table["spill_bytes"].fillna(0) > 0).sum())
    n_failed = int(table["error"].notna().sum())
    # The components every variant shares go into the title once, not into every row.
    prefix = shared_prefix([str(v) for v in table["variant"]])
    title = f"registers and spills, {target}: {n_spill} of {len(table)} variants spill"
    if n_failed:
        title += f", {n_failed} failed to compile"
    if prefix:
        title += f" · variants {prefix}…"
    t = Table(title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
              collapse_padding=True, pad_edge=False)
    t.add_column(f"variant ({prefix}…)" if prefix else "variant", overflow="fold", min_width=14)
    for m in _TABLE_METRICS:
        t.add_column(_LABELS[m], justify="right", no_wrap=True)
    t.add_column("build\ns", justify="right", no_wrap=True)

    notes: dict[str, int] = {}  # note text -> its number; a warning shared by many variants is listed once

    def marks(texts: list[str]) -> str:
        return "".join(f" \\[{notes.setdefault(x, len(notes) + 1)}]" for x in texts)

    rows: list[tuple[str, str, list[str], str]] = []  # (variant shown, its style, metric cells, its marks)
    for row in table.itertuples(index=False):
        r = row._asdict()
        shown = str(r["variant"]).removeprefix(prefix)
        if not _missing(r["error"]):
            rows.append((shown, "bold red", [*["-"] * len(_TABLE_METRICS), "-"],
                         marks(["failed: " + str(r["error"])])))
            continue
        cells = [_fmt(m, r[m]) for m in _TABLE_METRICS]
        spills = not _missing(r["spill_bytes"]) and r["spill_bytes"] > 0
        if not _missing(r["registers"]) and r["registers"] >= _REG_CAP:
            cells[0] = f"[bold red]{cells[0]}[/]"
        if spills:
            for i, m in enumerate(_TABLE_METRICS):
                if m.startswith("spill") or m in ("ldl", "stl"):
                    cells[i] = f"[bold yellow]{cells[i]}[/]"
        if r["wgmma_in_flight"] == 1:
            cells[_FLIGHT] = f"[bold yellow]{cells[_FLIGHT]}[/]"
        held = []
        if not _missing(r["mufu_overlap"]) and r["mufu_overlap"] < 0.5:
            cells[_OVERLAP] = f"[bold yellow]{cells[_OVERLAP]}[/]"
            if not _missing(r["mufu_wait"]):
                held = [f"exp\u2225mma: the loop waits for its matmul before the exponentials; "
                        f"{MUFU_WAITS[r['mufu_wait']]}"]
        secs = "-" if _missing(r["compile_seconds"]) else f"{r['compile_seconds']:.1f}"
        if r["cached"]:
            secs = f"[dim]{secs}[/]"
        rows.append((shown, "yellow" if spills else "", [*cells, secs],
                     marks(held + ["ptxas: " + w for w in r["warnings"]])))
    # What the other columns leave the names, measured as rich lays them out, so a name breaks
    # after a "/" instead of mid-component.
    rest = Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    for c in t.columns[1:]:
        rest.add_column(c.header, justify="right", no_wrap=True)
    for _, _, cells, _ in rows:
        rest.add_row(*cells)
    name_width = max(14, out.width - out.measure(rest).maximum - 2)
    for shown, style, cells, mark in rows:
        name = escape(wrap_path(shown, max(8, name_width - Text.from_markup(mark).cell_len)))
        t.add_row((f"[{style}]{name}[/]" if style else name) + mark, *cells)
    out.print(t)
    out.print("[dim]mma flight: the most wgmma groups issued before a wait (1: every matmul waited for before "
              "the next, none overlap); BAR: barrier instructions, the compiler's included; loop instr: one "
              "iteration of the innermost wgmma loop (its longest copy); exp\u2225mma: share of that loop's "
              "exp2 (MUFU) issued while a matmul is in flight (JSON: the loop's PRMT, fences, LDL/STL)[/]",
              soft_wrap=False)
    if table["cached"].any():
        out.print("[dim]dim build times: from the compile cache, as measured when first built[/]")
    for text, n in notes.items():
        style = "bold red" if text.startswith("failed") else "yellow"
        out.print(f"[{style}]\\[{n}][/] {escape(text)}", soft_wrap=False)


def render_comparison(cmp: SpillComparison, *, console: Console | None = None, file: TextIO | None = None,
                      width: int | None = None) -> None:
    """B against A, metric by metric; a change is green when B needs less (or, for wgmma groups in
    flight, overlaps more)."""
    out = _console(console, file, width)
    out.print(f"A  {escape(cmp.a.variant)}")
    out.print(f"B  {escape(cmp.b.variant)}")
    for tag, (va, vb) in cmp.tag_differences.items():
        out.print(f"[dim]   {escape(tag)}: {escape(va)} -> {escape(vb)}[/]")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("metric")
    t.add_column("A", justify="right")
    t.add_column("B", justify="right")
    t.add_column("B - A", justify="right")
    for d in cmp.deltas:
        delta = d.delta
        if delta is None:
            change = "-"
        elif delta == 0:
            change = "0"
        else:
            if d.metric == "smem_bytes":
                shown = f"{delta / 1024:+.1f}"
            elif d.metric == "mufu_overlap":
                shown = f"{delta:+.0%}"
            else:
                shown = f"{int(delta):+d}"
            better = delta > 0 if d.metric in _MORE_IS_BETTER else delta < 0
            change = f"[{'green' if better else 'red'}]{shown}[/]"
        t.add_row(_LABELS[d.metric].replace("\n", " "), _fmt(d.metric, d.a), _fmt(d.metric, d.b), change)
    out.print(t)
    freed = cmp.delta("spill_bytes")
    if freed is not None and freed < 0:
        out.print(f"[green]B frees {-freed} spill bytes per thread[/]")
    elif freed is not None and freed > 0:
        out.print(f"[red]B spills {freed} bytes more per thread[/]")
    elif freed == 0:
        out.print("same spill bytes")
    a_flight, b_flight = (None if r.error is not None else r.wgmma_in_flight for r in (cmp.a, cmp.b))
    if a_flight == 1 and b_flight and b_flight > 1:
        out.print(f"[green]B overlaps its matmuls ({b_flight} wgmma groups in flight); A waits for each one[/]")
    elif b_flight == 1 and a_flight and a_flight > 1:
        out.print(f"[red]B waits for each matmul before the next ({a_flight} wgmma groups in flight in A)[/]")
    for label, ws in (("only A", cmp.warnings_only_in_a), ("only B", cmp.warnings_only_in_b)):
        for w in ws:
            out.print(f"[yellow]{label}:[/] ptxas: {escape(w)}")
    for r in (cmp.a, cmp.b):
        if r.error is not None:
            out.print(f"[bold red]{escape(r.variant)} failed:[/] {escape(r.error)}")


def _plain(v: Any) -> Any:
    if _missing(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def table_to_dict(table: pd.DataFrame, *, target: str) -> dict[str, Any]:
    rows = [{k: _plain(v) if not isinstance(v, list) else v for k, v in r.items()}
            for r in table.to_dict(orient="records")]
    return {"target": target, "variants": rows}


def comparison_to_dict(cmp: SpillComparison, *, target: str) -> dict[str, Any]:
    return {
        "target": target,
        "a": cmp.a.variant,
        "b": cmp.b.variant,
        "metrics": [{"metric": d.metric, "a": d.a, "b": d.b, "delta": d.delta} for d in cmp.deltas],
        "tag_differences": {k: list(v) for k, v in cmp.tag_differences.items()},
        "warnings_only_in_a": list(cmp.warnings_only_in_a),
        "warnings_only_in_b": list(cmp.warnings_only_in_b),
        "errors": {r.variant: r.error for r in (cmp.a, cmp.b) if r.error is not None},
    }


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
