"""``jfa-prof timeline``: a recording as a Perfetto / chrome://tracing timeline, and a Gantt page."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def parse_sm_range(text: str) -> tuple[int, int]:
    """"0:16" -> (0, 16); "5" -> (5, 6). The end is exclusive, like a Python slice."""
    from jfa_prof.errors import BadInputError

    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            rng = (int(lo) if lo.strip() else 0, int(hi) if hi.strip() else 1 << 30)
        else:
            rng = (int(text), int(text) + 1)
    except ValueError:
        raise BadInputError(f"--sm-range {text!r} is not FIRST:END (e.g. 0:16)") from None
    if rng[0] < 0 or rng[1] <= rng[0]:
        raise BadInputError(f"--sm-range {text!r} is empty or negative")
    return rng


def _bundled_roles_trace():
    """The bundled level-3 forward recording (every warp role in time), else any bundled one."""
    from jfa_prof.report import level3_recordings
    from jfa_prof.trace import bundled_dir, open_trace, read_trace

    found = [p for p in level3_recordings("fwd", modified=False) if bundled_dir() in p.parents]
    return read_trace(found[0], origin="bundled") if found else open_trace(None)


def timeline(
    trace: Optional[Path] = typer.Option(
        None, "--trace", help="Recorded .jfatrace file (default: the bundled H200 level-3 recording of the forward, "
                              "every role's every tile)."),
    sm_range: Optional[str] = typer.Option(
        None, "--sm-range", help="SMs FIRST:END (end excluded) to keep. Default: every SM in the JSON, 0:16 in the Gantt."),
    out: Path = typer.Option(Path("trace.json"), "--out", help="Trace-event JSON for ui.perfetto.dev or chrome://tracing."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a plotly Gantt of the SM range here."),
    max_bars: int = typer.Option(4000, "--max-bars", min=100, help="Gantt bars before neighbouring tiles are merged."),
    json: bool = typer.Option(False, "--json", help="Print what was written (files, tiles, SMs, source) as JSON "
                                                    "on stdout instead of text."),
) -> None:
    """Per-SM, per-warp-role timeline of a recording for Perfetto, and optionally a Gantt page.

    Tiles are events with their batch, head, block and KV length; the producer's span and the
    barrier waits ride along. The Gantt page adds each role's utilization over the whole GPU.

    A level-3 recording has a record per tile for every role: each role of each CTA gets its own
    row with every tile it worked on, arrows lead from the producer handing a tile over to each
    consumer taking it, and a consumer's epilogue is a slice of its own. The waits inside a tile
    are per-site sums over the tile: they are drawn back to back from the tile's start, not where
    each wait happened.
    """
    import json as _json

    from rich.console import Console

    from jfa_prof.files import check_writable
    from jfa_prof.render import timeline as render
    from jfa_prof.trace import open_trace

    for path in (out, html):
        if path is not None:
            check_writable(path)
    # With --json, stdout carries only the JSON document.
    console = Console(highlight=False, soft_wrap=True, stderr=json)
    rng = parse_sm_range(sm_range) if sm_range else None
    tr = open_trace(trace) if trace is not None else _bundled_roles_trace()
    if rng is not None and rng[0] >= tr.n_sms:
        from jfa_prof.errors import BadInputError

        raise BadInputError(f"--sm-range {sm_range}: the recording's {tr.gpu_name} has SMs 0 to {tr.n_sms - 1}",
                            hint=f"e.g. --sm-range 0:{min(16, tr.n_sms)}")
    for w in tr.warnings:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]warning:[/] {w}")
    if not json:
        console.print(f"source: {tr.describe_origin()}")
    bundled = tr.origin == "bundled"

    has_events = len(tr.events) > 0
    gaps = []
    if tr.level >= 3 and tr.sample > 1:
        gaps.append(f"only 1 tile in {tr.sample} has event records")
    if tr.level >= 3 and tr.events_dropped:
        gaps.append(f"{tr.events_dropped:,} event record(s) were dropped")
    if gaps:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]warning:[/] {' and '.join(gaps)}: the role rows and flow arrows miss those tiles")

    doc = render.chrome_trace(tr.tiles, tr.spans, tr.waits, events=tr.events, sites=tr.sites, pass_=tr.pass_,
                              roles=tr.roles, meta=tr.meta, sm_range=rng)
    # The file travels without the terminal line that says where its data came from.
    doc.setdefault("metadata", {}).update({"origin": tr.origin, "source": tr.describe_origin(), "bundled": bundled})
    if has_events:
        doc["metadata"].update({"level": tr.level, "sample": tr.sample, "events_dropped": tr.events_dropped})
    render.write_chrome_trace(doc, out)
    counts = render.event_counts(doc)
    summary = {"json": str(out), "tiles": counts["tiles"], "sms": counts["sms"], "sm_range": list(rng) if rng else None,
               "origin": tr.origin, "source": tr.describe_origin(), "bundled": bundled,
               "trace": str(tr.path) if tr.path else None, "schedule": tr.schedule, "dropped": tr.dropped,
               "roles": list(tr.roles), "level": tr.level, "events": counts["events"], "sample": tr.sample,
               "events_dropped": tr.events_dropped, "flows": counts["flows"], "warnings": tr.warnings, "html": None}
    if not json:
        what = (f"{counts['events']:,} role records of {counts['tiles']:,} tiles, {counts['flows']:,} flow arrows,"
                if has_events else f"{counts['tiles']:,} tiles")
        console.print(f"wrote {out}: {what} on {counts['sms']} SMs (open in https://ui.perfetto.dev or "
                      "chrome://tracing)")
    if html is not None:
        from jfa_prof.analyses.occupancy import role_utilization

        bars = render.gantt_bars(tr.tiles, events=tr.events, sm_range=rng or (0, 16), max_bars=max_bars)
        util = role_utilization(tr.tiles, tr.spans, tr.roles, n_ctas=tr.n_ctas, n_bins=200)
        lo, hi = rng or (0, 16)
        title = f"tiles on SMs {lo}–{min(hi, tr.n_sms) - 1} · {tr.workload_label} · {tr.schedule}"
        if bundled:
            title += f" · bundled {tr.gpu_name.removeprefix('NVIDIA ')} recording, not live"
        fig = render.gantt_figure(bars, util=util, title=title)
        from jfa_prof.render.heatmap import write_html

        write_html(fig, html)
        merged = int((bars["n_merged"] > 1).sum())
        summary.update({"html": str(html), "bars": len(bars), "merged_bars": merged})
        note = f" ({merged:,} bars merge neighbouring tiles)" if merged else ""
        if not json:
            console.print(f"wrote {html}: {len(bars):,} bars{note}")
    if json:
        typer.echo(_json.dumps(summary, indent=2))
