"""``jfa-prof heatmap``: which SMs worked when, with the tile scheduler off or on.

``--clc off`` is the LPT schedule (longest tiles first, dealt zigzag to persistent CTAs once,
no queue); ``--clc on`` is the dynamic one, where CTAs take the next tile from a queue: Cluster
Launch Control on Blackwell, a global atomic counter on Hopper, which has no CLC. Where a
recording of the static schedule (grid order) of the same workload is at hand, it is shown too,
as the baseline both are compared with: LPT alone can be slower than static.

Where the tiles come from, first match wins: ``--trace`` files; a live recording when a GPU
and the recording module are there; the H200 recordings bundled with the package, announced
as such.
"""
from __future__ import annotations

import json as _json
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from jfa_prof.commands import options as opt


class Clc(str, Enum):
    off = "off"
    on = "on"
    both = "both"


_SCHEDULE_OF = {"static": "static", "off": "lpt", "on": "dynamic"}


def _side_label(side: str, tr) -> str:
    """What a side is, in the words every table, line and panel uses."""
    return "static" if side == "static" else f"clc {side} · {tr.schedule}"


def _side_name(side: str, tr) -> str:
    return "static" if side == "static" else f"{tr.schedule} (clc {side})"


def heatmap(
    clc: Optional[Clc] = typer.Option(
        None, "--clc", case_sensitive=False,
        help="off: LPT (cost-sorted, dealt once, no queue); on: dynamic tile queue (atomic counter on "
             "Hopper); both: side by side. The static schedule (grid order) is shown beside them where it "
             "is recorded. Default: both, or whatever the --trace files hold."),
    trace: Optional[list[Path]] = typer.Option(
        None, "--trace", help="Recorded .jfatrace file; repeat for more, all of one workload. Its schedule "
                              "(from its metadata) decides its side: dynamic on, lpt off, static off (or "
                              "the baseline beside an lpt one)."),
    trace_on: Optional[Path] = typer.Option(
        None, "--trace-on", help="Recorded .jfatrace file to show as the dynamic (--clc on) side."),
    predict: bool = typer.Option(
        False, "--predict", help="Also simulate each schedule on the CPU (cost model fitted to the "
                                 "recording) and show predicted next to measured."),
    out: Path = typer.Option(Path("heatmap.html"), "--out", help="Where to write the HTML page."),
    json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout instead of tables."),
    bins: int = typer.Option(400, "--bins", min=10, max=20000, help="Time columns of the heatmap."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    causal: opt.Causal = False,
) -> None:
    """SM × time heatmap of a forward launch, tile scheduler off and on.

    Under it the imbalance figures: makespan, busy max/mean, tail, idle fraction, the SMs on
    the tail and the tiles that end last. Without a GPU it reads --trace files or the bundled
    H200 recordings, and says so.
    """
    from rich.console import Console

    from jfa_prof.analyses.imbalance import imbalance
    from jfa_prof.analyses.occupancy import occupancy_matrix
    from jfa_prof.errors import BadInputError
    from jfa_prof.files import check_writable
    from jfa_prof.render import heatmap as render

    check_writable(out)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    # causal None when off: a bundled recording then matches whatever its mask.
    sides = _collect(clc, trace, trace_on, err, grid=grid, Lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed,
                     causal=causal or None)

    panels: list[dict[str, Any]] = []
    for side, tr in sides.items():
        panels.append({"side": side, "kind": "measured", "trace": tr, "tiles": tr.tiles,
                       "label": _side_label(side, tr)})
    if predict:
        from jfa_prof.analyses.predict import SCHEDULES, predict_trace

        for p in list(panels):
            tr = p["trace"]
            if not len(tr.tiles):
                raise BadInputError(f"{p['label']}: the recording holds no tiles to fit a cost model to")
            sched = tr.schedule if tr.schedule in SCHEDULES else _SCHEDULE_OF[p["side"]]
            pred = predict_trace(tr.tiles, tr.n_ctas, sched, clock_khz=tr.clock_khz)
            p["prediction"] = pred
            # A simulated CTA has no SM placement: its rows are CTAs, one per persistent program.
            panels.insert(panels.index(p) + 1, {"side": p["side"], "kind": "predicted", "trace": tr,
                                                "tiles": pred.tiles, "n_rows": tr.n_ctas,
                                                "label": ("static" if p["side"] == "static" else
                                                          f"clc {p['side']} · {sched}") + " · predicted"})

    t_end = max(float(p["tiles"]["end_ns"].max()) if len(p["tiles"]) else 0.0 for p in panels)
    for p in panels:
        tr = p["trace"]
        rows = p.get("n_rows", tr.n_sms)
        p["occ"] = occupancy_matrix(p["tiles"], rows, n_bins=bins, t_end_ns=t_end or None)
        p["imbalance"] = imbalance(p["tiles"], rows, dropped=tr.dropped if p["kind"] == "measured" else 0)

    first = next(iter(sides.values()))
    title = f"SM occupancy · {first.workload_label} · {first.gpu_name}"
    bundled = [tr for tr in sides.values() if tr.origin == "bundled"]
    if bundled:
        # The page travels without the terminal output that says so.
        title += f" · bundled {first.gpu_name.removeprefix('NVIDIA ')} recordings, not live"
    fig = render.heatmap_panels([(p["label"], p["occ"]) for p in panels], title=title,
                                cols=2 if predict else None, imbalances=[p["imbalance"] for p in panels],
                                levels=[p["trace"].meta.get("profile_level") if p["kind"] == "measured" else None
                                        for p in panels])
    render.write_html(fig, out)

    warnings = [w for tr in sides.values() for w in tr.warnings]
    for w in warnings:
        err.print(f"[bold red]warning:[/] {w}")
    if json:
        typer.echo(_json.dumps({**_to_json(panels, out, warnings), "bundled": bool(bundled)}, indent=2))
        return

    console = Console(highlight=False, soft_wrap=True)
    for side, tr in sides.items():
        what = "no tile scheduler, the baseline" if side == "static" else tr.schedule
        console.print(f"[bold]{'static' if side == 'static' else 'clc ' + side}[/]: {what} — {tr.schedule_mechanism}")
        console.print(f"  source: {tr.describe_origin()}")
        if tr.kernel_ms is not None:
            console.print(f"  kernel time: {tr.kernel_ms:.3f} ms ({tr.meta.get('kernel_ms_source') or 'CUDA events'})")
    render.summary_table([(p["label"], p["imbalance"]) for p in panels], console)
    measured = {p["side"]: p["imbalance"] for p in panels if p["kind"] == "measured"}
    # Each against the schedules before it: the static baseline first, so that what the queue
    # gains is not read off a comparison with LPT, which can be the slower of the two.
    for a, b in (("static", "off"), ("static", "on"), ("off", "on")):
        if a in measured and b in measured:
            console.print(render.contrast_line(measured[a], measured[b],
                                               names=(_side_name(a, sides[a]), _side_name(b, sides[b]))))
    render.tail_details([(p["label"], p["imbalance"]) for p in panels if p["kind"] == "measured"], console)
    if predict:
        render.comparison_table([(p["label"], p["prediction"].comparison, p["prediction"].cost_model)
                                 for p in panels if "prediction" in p], console)
        console.print("[dim]predicted panels: one row per persistent CTA, each running its tiles back to back; "
                      "the cost model is fitted to the recording's own tiles[/]")
    console.print(f"wrote {out}")


def _collect(clc: Optional[Clc], files: Optional[list[Path]], file_on: Optional[Path], err, **workload):
    """The traces to show, keyed "off" / "on", in that order."""
    from jfa_prof.errors import BadInputError
    from jfa_prof.trace import read_trace

    want = {"off", "on"} if clc in (None, Clc.both) else {clc.value}
    if files or file_on:
        opt.refuse_with_files("--trace", **workload)
        found: dict[str, Any] = {}
        given = [(read_trace(p), False) for p in files or []] + ([(read_trace(file_on), True)] if file_on else [])
        labels = list(dict.fromkeys(tr.workload_label for tr, _ in given))
        if len(labels) > 1:
            # Makespans of different workloads differ for reasons no schedule has a part in.
            raise BadInputError("the traces are of different workloads (" + "; ".join(labels) + "): "
                                "their schedules cannot be compared",
                                hint="pass recordings of one workload, or run heatmap once per trace")
        has_lpt = any(tr.schedule == "lpt" and not forced for tr, forced in given)
        for tr, forced in given:
            path = tr.path
            side = ("on" if forced or tr.schedule == "dynamic" else
                    "static" if tr.schedule == "static" and has_lpt else "off")
            if side in found:
                raise BadInputError(f"two --clc {side} traces: {found[side].path} and {path}",
                                    hint="pass one static/LPT and one dynamic recording, or use --trace-on")
            found[side] = tr
        if clc is not None:
            missing = want - set(found)
            if missing:
                side = missing.pop()
                raise BadInputError(f"--clc {clc.value} needs a clc {side} ({_SCHEDULE_OF[side]}) trace, "
                                    f"none of the given files is one")
            found = {s: t for s, t in found.items() if s in want or (s == "static" and "off" in want)}
        return {s: found[s] for s in ("static", "off", "on") if s in found}

    live = _record_live(want, err, **workload)
    if live is not None:
        return live
    return _bundled(want, **workload)


def _bundled(want: set[str], **workload) -> dict[str, Any]:
    from jfa_prof.errors import BadInputError
    from jfa_prof.trace import bundled_dir, find_bundled, read_meta, read_trace

    out = {}
    for side in ("off", "on"):
        if side not in want:
            continue
        path = find_bundled(side, **workload)
        if side == "off" and path is not None:
            # The static schedule of the same workload, where one is bundled: the baseline both
            # tile schedulers are measured against.
            static = find_bundled("static", **(read_meta(path).get("workload") or {}))
            if static is not None and static != path:
                out["static"] = read_trace(static, origin="bundled")
        if path is None:
            asked = ", ".join(f"{k}={v}" for k, v in workload.items() if v is not None)
            raise BadInputError(
                f"no GPU to record on and no bundled {_SCHEDULE_OF[side]} recording"
                + (f" for {asked}" if asked else "") + f" in {bundled_dir()}",
                hint="pass --trace FILE (record one on a GPU with `jfa-prof record`)")
        out[side] = read_trace(path, origin="bundled")
    return out


def _record_live(want: set[str], err, *, grid, Lq, max_kv, sparsity, seed, causal) -> dict[str, Any] | None:
    """Record each side on the GPU, or None when this machine cannot (then bundled data is used)."""
    import importlib.util
    import os
    import sys

    from jfa_prof.errors import NoGpuError, TlxUnavailableError

    # Checked before importing torch (seconds): a machine without the recording stack, or
    # without an NVIDIA driver, goes straight to the recordings.
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("jfa_prof.recording") is None:
        return None
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg")):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    workload = opt.resolve_workload(grid, Lq, max_kv, sparsity, seed, bool(causal))
    out = {}
    try:
        from jfa_prof.recording import record_workload

        for side in ("off", "on"):
            if side in want:
                with err.status(f"recording clc {side} ({_SCHEDULE_OF[side]}) on the GPU…"):
                    tr = record_workload(workload, _SCHEDULE_OF[side])
                tr.origin = "live"
                out[side] = tr
    except (ImportError, NoGpuError, TlxUnavailableError) as e:
        err.print(f"[yellow]cannot record live ({e}); falling back to bundled recordings[/]")
        return None
    return out


def _to_json(panels: list[dict[str, Any]], out: Path, warnings: list[str]) -> dict[str, Any]:
    res = []
    for p in panels:
        tr = p["trace"]
        entry: dict[str, Any] = {
            "clc": p["side"], "kind": p["kind"], "label": p["label"],
            "schedule": tr.schedule, "mechanism": tr.schedule_mechanism,
            "origin": tr.origin, "source": tr.describe_origin(),
            "trace": str(tr.path) if tr.path else None,
            "gpu": tr.gpu_name, "n_sms": tr.n_sms, "n_ctas": tr.n_ctas, "kernel_ms": tr.kernel_ms,
            "dropped": tr.dropped,
            "imbalance": p["imbalance"].to_dict(),
        }
        if p["kind"] == "predicted":
            entry["origin"] = "simulated"
            entry["source"] = f"CPU simulation of {tr.describe_origin()}"
            entry["kernel_ms"] = None
        if "prediction" in p:
            pred = p["prediction"]
            entry["prediction"] = {"cost_model": pred.cost_model.to_dict(), **pred.comparison.to_dict()}
        res.append(entry)
    return {"html": str(out), "panels": res, "warnings": warnings}
