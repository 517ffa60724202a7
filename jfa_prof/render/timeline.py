"""Tile timelines: Chrome/Perfetto trace-event JSON, and a plotly Gantt of a range of SMs.

Trace-event layout: one process per SM (``pid`` = smid), one thread per (CTA, warp role)
(``tid`` = cta · n_roles + role), so Perfetto stacks the roles of a CTA under its SM. Tiles are
complete ("X") events on the thread of the role that recorded them; a role that records no
tiles (the producer) gets its span as one event. Barrier waits ride along as arguments of the
span events. Times are µs (the format's unit) from the kernel's first tile start.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jfa_prof.files import write_atomic

__all__ = ["chrome_trace", "gantt_figure", "gantt_bars", "write_chrome_trace"]

_TILE_ARGS = ("slot", "tile", "batch", "head", "block", "kv_len", "n_blocks", "dur_cycles")


def chrome_trace(tiles: pd.DataFrame, spans: pd.DataFrame | None = None, waits: pd.DataFrame | None = None, *,
                 roles: Sequence[str] = (), meta: Mapping[str, Any] | None = None,
                 sm_range: tuple[int, int] | None = None) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...], ...}``) of one recording.

    ``sm_range`` (first, last+1) keeps only those SMs, for traces too big for a viewer.
    """
    spans = spans if spans is not None else pd.DataFrame(columns=["cta", "role_id", "role", "smid"])
    if sm_range is not None:
        lo, hi = sm_range
        tiles = tiles[(tiles["smid"] >= lo) & (tiles["smid"] < hi)]
        spans = spans[(spans["smid"] >= lo) & (spans["smid"] < hi)]
    roles = list(roles) or sorted(set(tiles.get("role_name", pd.Series(dtype=object))) |
                                  set(spans.get("role", pd.Series(dtype=object))))
    n_roles = max(len(roles), 1)

    events: list[dict[str, Any]] = []
    lanes = pd.concat([
        tiles[["smid", "cta", "role"]].rename(columns={"role": "role_id"}),
        spans[["smid", "cta", "role_id"]],
    ]).drop_duplicates()
    for sm in sorted(lanes["smid"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(sm), "args": {"name": f"SM {int(sm)}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(sm), "args": {"sort_index": int(sm)}})
    for sm, cta, rid in lanes.sort_values(["smid", "cta", "role_id"]).itertuples(index=False):
        tid = int(cta) * n_roles + int(rid)
        name = roles[int(rid)] if 0 <= int(rid) < len(roles) else f"role {int(rid)}"
        events.append({"ph": "M", "name": "thread_name", "pid": int(sm), "tid": tid,
                       "args": {"name": f"CTA {int(cta)} {name}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(sm), "tid": tid,
                       "args": {"sort_index": tid}})

    if len(tiles):
        cols = {c: tiles[c].to_numpy() for c in _TILE_ARGS if c in tiles.columns}
        ts = tiles["start_ns"].to_numpy(np.float64) / 1e3
        dur = (tiles["end_ns"].to_numpy(np.float64) - tiles["start_ns"].to_numpy(np.float64)) / 1e3
        pid = tiles["smid"].to_numpy()
        tid = tiles["cta"].to_numpy() * n_roles + tiles["role"].to_numpy()
        arg_rows = [dict(zip(cols, vals)) for vals in zip(*[a.tolist() for a in cols.values()])]
        names = ("tile " + tiles["tile"].astype(str)).tolist()
        events.extend(
            {"ph": "X", "cat": "tile", "name": n, "pid": p, "tid": t, "ts": s, "dur": d, "args": a}
            for n, p, t, s, d, a in zip(names, pid.tolist(), tid.tolist(), ts.tolist(), dur.tolist(), arg_rows)
        )

    tile_roles = set(tiles["role"].tolist()) if len(tiles) else set()
    wait_args: dict[tuple[int, int], dict[str, Any]] = {}
    if waits is not None and len(waits):
        live = waits[waits["count"] > 0]
        for cta, rid, site, cyc, cnt in live[["cta", "role_id", "site", "cycles", "count"]].itertuples(index=False):
            wait_args.setdefault((int(cta), int(rid)), {})[f"wait {site}"] = {"cycles": int(cyc), "count": int(cnt)}
    for r in spans.itertuples(index=False):
        if int(r.role_id) in tile_roles:
            continue
        events.append({
            "ph": "X", "cat": "role", "name": f"{r.role} span", "pid": int(r.smid),
            "tid": int(r.cta) * n_roles + int(r.role_id), "ts": float(r.start_ns) / 1e3,
            "dur": float(r.end_ns - r.start_ns) / 1e3,
            "args": {"n_tiles": int(r.n_tiles), "cycles": int(r.dur_cycles),
                     **wait_args.get((int(r.cta), int(r.role_id)), {})},
        })
    # Tile roles' waits have no event of their own to ride on: one instant per (CTA, role).
    if wait_args and len(tiles):
        first = tiles.groupby(["cta", "role"]).agg(smid=("smid", "first"), ts=("start_ns", "min"))
        for (cta, rid), row in first.iterrows():
            args = wait_args.get((int(cta), int(rid)))
            if args:
                events.append({"ph": "i", "s": "t", "cat": "waits", "name": "barrier waits", "pid": int(row.smid),
                               "tid": int(cta) * n_roles + int(rid), "ts": float(row.ts) / 1e3, "args": args})

    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ns"}
    if meta is not None:
        doc["metadata"] = {k: meta[k] for k in ("gpu", "kernel", "workload", "schedule", "schedule_mechanism",
                                                "date", "kernel_ms") if k in meta}
    return doc


def write_chrome_trace(doc: Mapping[str, Any], path: str | os.PathLike) -> Path:
    # dumps, not dump: json.dump streams through the pure-Python encoder, 5x slower on 100k events
    return write_atomic(path, json.dumps(doc, separators=(",", ":")))


def gantt_bars(tiles: pd.DataFrame, *, sm_range: tuple[int, int] = (0, 16), max_bars: int = 4000) -> pd.DataFrame:
    """The bars of the Gantt: one per tile, or, past ``max_bars``, neighbouring tiles of a lane
    merged into fixed time buckets (``n_merged`` > 1) so the page stays light.

    Columns: ``lane`` (label), ``smid``, ``cta``, ``role``, ``start_ns``, ``end_ns``, ``n_merged``, and
    ``tile``, ``batch``, ``head``, ``kv_len`` of the bar's first tile.
    """
    lo, hi = sm_range
    t = tiles[(tiles["smid"] >= lo) & (tiles["smid"] < hi)]
    keys = ["smid", "cta", "role"]
    info = ["tile", "batch", "head", "kv_len"]
    if len(t) <= max_bars:
        bars = t[keys + info + ["start_ns", "end_ns"]].assign(n_merged=1)
    else:
        n_lanes = t.groupby(keys).ngroups
        span = float(t["end_ns"].max() - t["start_ns"].min())
        bucket_ns = max(span * n_lanes / max_bars, 1.0)
        t = t.sort_values(keys + ["start_ns"]).assign(bucket=(t["start_ns"] // bucket_ns).astype(np.int64))
        bars = t.groupby(keys + ["bucket"], sort=False).agg(
            **{c: (c, "first") for c in info},
            start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), n_merged=("tile", "size"),
        ).reset_index().drop(columns="bucket")
    role_name = dict(zip(tiles["role"], tiles["role_name"])) if "role_name" in tiles.columns else {}
    bars = bars.sort_values(keys + ["start_ns"]).reset_index(drop=True)
    bars["lane"] = ("SM " + bars["smid"].astype(str) + " · CTA " + bars["cta"].astype(str) + " · " +
                    bars["role"].map(lambda r: str(role_name.get(r, r))))
    return bars


def gantt_figure(bars: pd.DataFrame, *, util: pd.DataFrame | None = None, title: str | None = None) -> go.Figure:
    """Horizontal bars per lane (SM · CTA · role), coloured by the tile's KV length; with
    ``util`` (``analyses.occupancy.role_utilization``), the whole GPU's per-role utilization
    underneath on the same time axis."""
    lanes = list(dict.fromkeys(bars["lane"]))
    start_us = bars["start_ns"].to_numpy(np.float64) / 1e3
    dur_us = bars["end_ns"].to_numpy(np.float64) / 1e3 - start_us
    custom = np.column_stack([bars[c].to_numpy() for c in ("tile", "batch", "head", "kv_len", "n_merged")])
    gantt_px = max(300, 22 * len(lanes))
    util_px = 260 if util is not None else 0
    fig = make_subplots(rows=2 if util is not None else 1, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[gantt_px, util_px] if util is not None else None)
    fig.add_trace(go.Bar(
        orientation="h", y=bars["lane"], x=dur_us, base=start_us, customdata=custom, name="tiles", showlegend=False,
        marker={"color": bars["kv_len"].to_numpy(), "colorscale": "Viridis", "showscale": True,
                "colorbar": {"title": {"text": "kv_len"}, "len": 0.5, "y": 1.0, "yanchor": "top"},
                "line": {"width": 0}},
        hovertemplate=("%{y}<br>%{base:.1f} – %{x:.1f} µs long<br>tile %{customdata[0]} · batch %{customdata[1]}"
                       " · head %{customdata[2]} · kv_len %{customdata[3]}<br>%{customdata[4]} tile(s)<extra></extra>"),
    ), row=1, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, autorange="reversed", row=1, col=1)
    if util is not None:
        for role, part in util.groupby("role", sort=False):
            mid_us = 0.5 * (part["t0_ns"] + part["t1_ns"]).to_numpy() / 1e3
            for col, dash in (("busy", "solid"), ("active", "dot")):
                if part[col].notna().any():
                    fig.add_trace(go.Scatter(x=mid_us, y=part[col].to_numpy(), mode="lines", name=f"{role} {col}",
                                             line={"dash": dash}, legendgroup=str(role)), row=2, col=1)
        fig.update_yaxes(title_text="fraction of CTAs", range=[0, 1.05], tickformat=".0%", row=2, col=1)
    fig.update_xaxes(title_text="time since first tile (µs)", row=2 if util is not None else 1, col=1)
    fig.update_layout(title=title, bargap=0.15, height=160 + gantt_px + util_px,
                      legend={"orientation": "h", "y": -0.08})
    return fig
