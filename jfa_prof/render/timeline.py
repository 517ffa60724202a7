"""Tile timelines: Chrome/Perfetto trace-event JSON, and a plotly Gantt of a range of SMs.

Trace-event layout: one process per SM (``pid`` = smid), one thread per (CTA, warp role)
(``tid`` = cta · n_roles + role), so Perfetto stacks the roles of a CTA under its SM. Times are µs
(the format's unit) from the kernel's first tile start.

Below level 3, tiles are complete ("X") events on the thread of the role that recorded them; a
role that records no tiles (the producer) gets its span as one event, and barrier waits ride
along as arguments of the span events. At level 3 every role has an event record per tile: each
becomes a slice, with its waits and (for the roles that receive tiles) its epilogue as child
slices, and flow arrows lead from the producer's hand-off of a tile to each receiver.
"""
from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jfa_prof.files import write_atomic
from jfa_prof.records import ROLE_SITES

__all__ = ["EncodedEvents", "WAIT_PLACEMENT", "chrome_trace", "event_counts", "gantt_figure", "gantt_bars",
           "write_chrome_trace"]

_TILE_ARGS = ("slot", "tile", "batch", "head", "block", "kv_len", "n_blocks", "dur_cycles")


def chrome_trace(tiles: pd.DataFrame, spans: pd.DataFrame | None = None, waits: pd.DataFrame | None = None, *,
                 events: pd.DataFrame | None = None, sites: Sequence[str] = (), pass_: str = "fwd",
                 roles: Sequence[str] = (), meta: Mapping[str, Any] | None = None,
                 sm_range: tuple[int, int] | None = None) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...], ...}``) of one recording.

    With level-3 ``events`` (``Trace.events``; ``sites`` and ``pass_`` as in the trace) the
    document is built from them alone, its ``traceEvents`` an :class:`EncodedEvents`: write it
    with :func:`write_chrome_trace`. Without, from the tile records, spans and wait totals.
    ``sm_range`` (first, last+1) keeps only those SMs, for traces too big for a viewer.
    """
    if events is not None and len(events):
        return _role_event_trace(events, sites=sites, pass_=pass_, roles=roles, meta=meta, sm_range=sm_range)
    spans = spans if spans is not None else pd.DataFrame(columns=["cta", "role_id", "role", "smid"])
    if sm_range is not None:
        lo, hi = sm_range
        tiles = tiles[(tiles["smid"] >= lo) & (tiles["smid"] < hi)]
        spans = spans[(spans["smid"] >= lo) & (spans["smid"] < hi)]
    roles = list(roles) or sorted(set(tiles.get("role_name", pd.Series(dtype=object))) |
                                  set(spans.get("role", pd.Series(dtype=object))))
    n_roles = max(len(roles), 1)

    out: list[dict[str, Any]] = []
    lanes = pd.concat([
        tiles[["smid", "cta", "role"]].rename(columns={"role": "role_id"}),
        spans[["smid", "cta", "role_id"]],
    ]).drop_duplicates()
    for sm in sorted(lanes["smid"].unique()):
        out.append({"ph": "M", "name": "process_name", "pid": int(sm), "args": {"name": f"SM {int(sm)}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": int(sm), "args": {"sort_index": int(sm)}})
    for sm, cta, rid in lanes.sort_values(["smid", "cta", "role_id"]).itertuples(index=False):
        tid = int(cta) * n_roles + int(rid)
        name = roles[int(rid)] if 0 <= int(rid) < len(roles) else f"role {int(rid)}"
        out.append({"ph": "M", "name": "thread_name", "pid": int(sm), "tid": tid,
                       "args": {"name": f"CTA {int(cta)} {name}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": int(sm), "tid": tid,
                       "args": {"sort_index": tid}})

    if len(tiles):
        cols = {c: tiles[c].to_numpy() for c in _TILE_ARGS if c in tiles.columns}
        ts = tiles["start_ns"].to_numpy(np.float64) / 1e3
        dur = (tiles["end_ns"].to_numpy(np.float64) - tiles["start_ns"].to_numpy(np.float64)) / 1e3
        pid = tiles["smid"].to_numpy()
        tid = tiles["cta"].to_numpy() * n_roles + tiles["role"].to_numpy()
        arg_rows = [dict(zip(cols, vals)) for vals in zip(*[a.tolist() for a in cols.values()])]
        names = ("tile " + tiles["tile"].astype(str)).tolist()
        out.extend(
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
        out.append({
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
                out.append({"ph": "i", "s": "t", "cat": "waits", "name": "barrier waits", "pid": int(row.smid),
                               "tid": int(cta) * n_roles + int(rid), "ts": float(row.ts) / 1e3, "args": args})

    doc: dict[str, Any] = {"traceEvents": out, "displayTimeUnit": "ns"}
    if meta is not None:
        doc["metadata"] = _doc_metadata(meta)
    return doc


def _doc_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in ("gpu", "kernel", "workload", "schedule", "schedule_mechanism", "date", "kernel_ms")
            if k in meta}


def write_chrome_trace(doc: Mapping[str, Any], path: str | os.PathLike) -> Path:
    events = doc["traceEvents"]
    if not isinstance(events, EncodedEvents):
        # dumps, not dump: json.dump streams through the pure-Python encoder, 5x slower on 100k events
        return write_atomic(path, json.dumps(doc, separators=(",", ":")))
    rest = json.dumps({k: v for k, v in doc.items() if k != "traceEvents"}, separators=(",", ":"))

    def write(f: IO[bytes]) -> None:
        f.write(b'{"traceEvents":')
        events.write_json(f)
        f.write(("," + rest[1:] if rest != "{}" else "}").encode())

    return write_atomic(path, write)


def event_counts(doc: Mapping[str, Any]) -> dict[str, int]:
    """Tiles, SMs, event records and flow arrows of a document, without decoding its events."""
    counts = (doc.get("metadata") or {}).get("counts")
    if counts is not None:
        return dict(counts)
    events = doc["traceEvents"]
    return {"tiles": sum(1 for e in events if e.get("cat") == "tile"),
            "sms": sum(1 for e in events if e.get("name") == "process_name"), "events": 0, "flows": 0}


# ---------------------------------------------------------------------------------------------
# level 3: one slice per (tile, role) event record
# ---------------------------------------------------------------------------------------------

# A receiving role's window opens with its wait for the tile in the mailbox (forward consumers),
# so that wait is laid first and the flow from the producer ends where it ends. The backward has
# no such site: its compute role's window starts with the tile taken.
_MAILBOX_SITE = "queue"
_SENDER = "producer"
_FLOW_NAMES = {"fwd": "tile posted", "bwd": "tile handed over"}
WAIT_PLACEMENT = ("An event record holds, per site, the cycles its role waited there summed over the tile, not "
                  "when each wait happened. The 'wait <site>' slices lay these sums back to back from the tile's "
                  f"start ({_MAILBOX_SITE!r} first, then the recording's site order), cut where they would run "
                  "past the tile or into a consumer's epilogue; their args keep the recorded cycles.")
# Repeated in every wait slice: short, the metadata's "waits" entry says it in full.
_WAIT_NOTE = "per-tile sum, placed back to back"


class EncodedEvents(Sequence):
    """Trace events written as JSON text straight from their columns, behind a few decoded ones
    (metadata).

    A level-3 timeline has millions of events; formatting their text from the columns is several
    times faster than building a dict per event and encoding it, and it is the bulk of a write, so
    :meth:`write_json` spreads it over processes. Indexing and iterating format and decode, so a
    small document reads like the list of dicts it stands for.
    """

    def __init__(self, head: list[dict[str, Any]], jobs: list[_Lines], n_records: int):
        self.head = head
        self.jobs = jobs
        self.n_records = n_records
        self.n_lines = sum(len(j.at) for j in jobs)
        self._lines: list[str] | None = None

    def __len__(self) -> int:
        return len(self.head) + self.n_lines

    def _formatted(self) -> list[str]:
        if self._lines is None:
            self._lines = _format_part(self.jobs, _cuts(self.jobs, self.n_records, 1), 0)
        return self._lines

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, IndexError past the end
        return self.head[i] if i < len(self.head) else json.loads(self._formatted()[i - len(self.head)])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self.head
        for line in self._formatted():
            yield json.loads(line)

    def write_json(self, f: IO[bytes]) -> None:
        """Write the events as one JSON array: past ``_PARALLEL_LINES`` events, formatted by as
        many forked processes as this process may run on (at most ``_MAX_PARTS``), each writing its
        own stretch of the file."""
        head = ",\n".join(json.dumps(e, separators=(",", ":")) for e in self.head).encode()
        parts = _parts(self.n_lines)
        cuts = _cuts(self.jobs, self.n_records, parts)
        f.write(b"[" + head)
        if parts == 1:
            text = ",\n".join(_format_part(self.jobs, cuts, 0)).encode()
            f.write(_SEP + text if head and text else text)
        else:
            f.flush()
            f.seek(_write_parts(f.fileno(), f.tell(), self.jobs, cuts, after_head=bool(head)))
        f.write(b"]")


@dataclass(frozen=True)
class _Lines:
    """Events of one kind as text: ``fmt % row`` for each row of ``cols``; ``at`` (non-decreasing)
    holds the index of the event record each row comes from."""
    fmt: str
    at: np.ndarray
    cols: tuple[np.ndarray, ...]


# Below this many events one process formats them all: forking costs more than it saves.
_PARALLEL_LINES = 200_000
_MAX_PARTS = 8


def _parts(n_lines: int) -> int:
    if n_lines < _PARALLEL_LINES or sys.platform != "linux":
        return 1
    return max(1, min(_MAX_PARTS, len(os.sched_getaffinity(0))))


def _cuts(jobs: list[_Lines], n_records: int, parts: int) -> list[np.ndarray]:
    """Where each job's rows split into ``parts`` stretches of event records. Part k holds, job
    after job, the lines of the k-th stretch: a record's tile slice still comes before its wait
    slices (Perfetto nests slices of equal start in file order), and a flow's start before its end."""
    bounds = np.linspace(0, n_records, parts + 1).round().astype(np.int64)
    return [np.searchsorted(j.at, bounds) for j in jobs]


def _format_part(jobs: list[_Lines], cuts: list[np.ndarray], k: int) -> list[str]:
    lines: list[str] = []
    for job, cut in zip(jobs, cuts):
        lo, hi = cut[k], cut[k + 1]
        lines += [job.fmt % row for row in zip(*(np.asarray(c)[lo:hi].tolist() for c in job.cols))]
    return lines


def _write_parts(fd: int, offset: int, jobs: list[_Lines], cuts: list[np.ndarray], *, after_head: bool) -> int:
    """Format the parts in forked processes, each writing its text at its place in ``fd`` (from
    ``offset``), and return where the text ends. A part's place is known once every earlier part
    has its length, so each child formats, reports its length, is told its place and writes: the
    text is never copied between processes."""
    ctx = mp.get_context("fork")
    links = []
    gc.freeze()  # the children's collector then leaves the inherited heap's pages shared
    try:
        # The children only format text from inherited arrays and write it: they take no lock
        # another thread of this process could hold, so forking a threaded process is safe here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
            for k in range(len(cuts[0]) - 1):
                here, there = ctx.Pipe()
                child = ctx.Process(target=_write_part, args=(there, fd, jobs, cuts, k), daemon=True)
                child.start()
                there.close()
                links.append((here, child))
    finally:
        gc.unfreeze()
    try:
        first = not after_head
        sizes = [_reply(here) for here, _ in links]
        for (here, _), size in zip(links, sizes):
            if not size:
                here.send(None)
                continue
            sep = 0 if first else len(_SEP)
            here.send((offset, sep))
            offset += sep + size
            first = False
        for here, _ in links:
            _reply(here)
    finally:
        for here, child in links:
            here.close()
            child.join()
    return offset


_SEP = b",\n"


def _write_part(conn, fd: int, jobs: list[_Lines], cuts: list[np.ndarray], k: int) -> None:
    """A child's part: format, report the length, write where told (with a separator before it if
    told so), report done; an error goes back to the parent in place of a reply."""
    gc.disable()
    try:
        text = ",\n".join(_format_part(jobs, cuts, k)).encode()
        conn.send(len(text))
        place = conn.recv()
        if place is not None:
            at, sep = place
            _pwrite_all(fd, _SEP[:sep], at)
            _pwrite_all(fd, text, at + sep)
        conn.send(None)
    except BaseException as err:  # noqa: BLE001 - every failure is the parent's to raise
        try:
            conn.send(err)
        except OSError:
            pass  # the parent has gone, or given up on this part already


def _reply(conn):
    try:
        msg = conn.recv()
    except EOFError:
        raise RuntimeError("a trace-formatting process ended without its part") from None
    if isinstance(msg, BaseException):
        raise msg
    return msg


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _key(name: str) -> str:
    """A JSON string literal safe inside a %-format."""
    return json.dumps(name).replace("%", "%%")


def _role_event_trace(ev: pd.DataFrame, *, sites: Sequence[str], pass_: str, roles: Sequence[str],
                      meta: Mapping[str, Any] | None, sm_range: tuple[int, int] | None) -> dict[str, Any]:
    # without the trace's site list, its order is the columns' (the reader writes them in site order)
    sites = list(sites) or [c[len("wait_"):-len("_ns")] for c in ev.columns
                            if c.startswith("wait_") and c.endswith("_ns")]
    # tids from the whole recording's role ids, so a CTA's rows keep their tid under any SM range
    n_roles = max(len(roles), int(ev["role_id"].max()) + 1)
    if sm_range is not None:
        lo, hi = sm_range
        ev = ev[(ev["smid"] >= lo) & (ev["smid"] < hi)]
    ev = ev.reset_index(drop=True)
    cta = ev["cta"].to_numpy(np.int64)
    pid = ev["smid"].to_numpy(np.int64)
    tid = cta * n_roles + ev["role_id"].to_numpy(np.int64)
    mark = ev["mark_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    role = ev["role"].to_numpy(object)
    receiver = role != _SENDER

    head: list[dict[str, Any]] = []
    for sm in np.unique(pid).tolist():
        head.append({"ph": "M", "name": "process_name", "pid": sm, "args": {"name": f"SM {sm}"}})
        head.append({"ph": "M", "name": "process_sort_index", "pid": sm, "args": {"sort_index": sm}})
    lanes = pd.DataFrame({"pid": pid, "tid": tid, "cta": cta, "role": role}).drop_duplicates(["pid", "tid"])
    for p, t, c, r in lanes.sort_values(["pid", "tid"]).itertuples(index=False):
        head.append({"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": f"CTA {c} · {r}"}})
        head.append({"ph": "M", "name": "thread_sort_index", "pid": p, "tid": t, "args": {"sort_index": t}})

    # Parents before children: Perfetto nests slices of equal start in file order.
    jobs = _tile_slices(ev, pid, tid, sites, pass_)
    jobs += _wait_slices(ev, pid, tid, sites, limit=np.where(receiver, mark, end))
    # a receiver's mark is the end of its main loop
    rows = np.flatnonzero(receiver)
    jobs.append(_Lines('{"ph":"X","cat":"epilogue","name":"epilogue","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f}', rows,
                       (pid[rows], tid[rows], mark[rows] / 1e3, (end - mark)[rows] / 1e3)))
    flow_start, flow_end = _flows(ev, pid, tid, pass_)
    events = EncodedEvents(head, jobs + [flow_start, flow_end], len(ev))

    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ns"}
    doc["metadata"] = {**(_doc_metadata(meta) if meta is not None else {}), "waits": WAIT_PLACEMENT,
                       "counts": {"tiles": int(ev["pos"].nunique()), "sms": len(np.unique(pid)), "events": len(ev),
                                  "flows": len(flow_start.at)}}
    return doc


def _tile_slices(ev: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, sites: Sequence[str], pass_: str) -> list[_Lines]:
    """One "X" slice per event record, named by its tile, with its waits per site in µs."""
    col = {c: ev[c].to_numpy() for c in ("pos", "tile", "batch", "head", "block", "kv_len", "n_blocks", "dur_cycles")}
    known = col["tile"] >= 0
    start = ev["start_ns"].to_numpy(np.int64)
    dur_us = (ev["end_ns"].to_numpy(np.int64) - start) / 1e3
    mark_us = (ev["mark_ns"].to_numpy(np.int64) - start) / 1e3
    names = (('"tile %d (b %d h %d blk %d)"', ("tile", "batch", "head", "block"), known),
             ('"pos %d (no tile record)"', ("pos",), ~known))
    jobs: list[_Lines] = []
    for role, idx in ev.groupby("role", sort=False).indices.items():
        # each role's own sites: the others are zero for it by construction
        role_sites = [s for s in ROLE_SITES.get(pass_, {}).get(role, sites) if s in sites]
        waits = ",".join(f"{_key(s)}:%.3f" for s in role_sites)
        body = (',"pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"pos":%d,"batch":%d,"head":%d,"block":%d,'
                '"kv_len":%d,"n_blocks":%d,"dur_cycles":%d,"mark_us":%.3f,"wait_us":{' + waits + '}}}')
        for name, name_cols, has in names:
            rows = idx[has[idx]]
            jobs.append(_Lines('{"ph":"X","cat":"tile","name":' + name + body, rows, (
                *(col[c][rows] for c in name_cols), pid[rows], tid[rows], start[rows] / 1e3, dur_us[rows],
                *(col[c][rows] for c in ("pos", "batch", "head", "block", "kv_len", "n_blocks", "dur_cycles")),
                mark_us[rows], *(ev[f"wait_{s}_ns"].to_numpy()[rows] / 1e3 for s in role_sites))))
    return jobs


def _wait_slices(ev: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, sites: Sequence[str], *,
                 limit: np.ndarray) -> list[_Lines]:
    """A child slice per site a role waited at within a tile: the per-tile sums laid back to back
    from the tile's start (WAIT_PLACEMENT), cut at ``limit`` so they nest inside their parent and
    before a receiver's epilogue."""
    order = [s for s in sites if s == _MAILBOX_SITE] + [s for s in sites if s != _MAILBOX_SITE]
    if not order or not len(ev):
        return []
    start = ev["start_ns"].to_numpy(np.int64)
    # whole ns, so that the children's edges and their parent's compare exactly
    waited = np.rint(np.column_stack([ev[f"wait_{s}_ns"].to_numpy(np.float64) for s in order])).astype(np.int64)
    ends = start[:, None] + np.cumsum(waited, axis=1)
    hi = np.minimum(ends, limit[:, None])
    lo = np.minimum(ends - waited, hi)
    jobs: list[_Lines] = []
    for j, site in enumerate(order):
        rows = np.flatnonzero(hi[:, j] > lo[:, j])
        fmt = ('{"ph":"X","cat":"wait","name":' + _key(f"wait {site}") + ',"pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,'
               '"args":{"cycles":%d,"placed":' + _key(_WAIT_NOTE) + '}}')
        jobs.append(_Lines(fmt, rows, (pid[rows], tid[rows], lo[rows, j] / 1e3, (hi[rows, j] - lo[rows, j]) / 1e3,
                                       ev[f"wait_{site}"].to_numpy()[rows])))
    return jobs


def _flows(ev: pd.DataFrame, pid: np.ndarray, tid: np.ndarray, pass_: str) -> tuple[_Lines, _Lines]:
    """Flow arrows ("s" then "f" events, one id per pair) from the producer's hand-off of a tile
    to the moment each receiving role of its CTA has it. Forward: from the producer's mark (the
    tile posted to both mailboxes) to the end of the consumer's mailbox wait. Backward: the producer
    posts a tile as its window opens (its mark, the K/V load, comes later and may follow the
    compute role's start), so from the producer's start to the compute role's."""
    arrive = ev["start_ns"].to_numpy(np.int64)
    if f"wait_{_MAILBOX_SITE}_ns" in ev.columns:
        arrive = arrive + np.rint(ev[f"wait_{_MAILBOX_SITE}_ns"].to_numpy(np.float64)).astype(np.int64)
    posted = ev["mark_ns" if pass_ == "fwd" else "start_ns"].to_numpy(np.int64)
    ends = pd.DataFrame({"cta": ev["cta"].to_numpy(), "pos": ev["pos"].to_numpy(), "pid": pid, "tid": tid,
                         "mark": posted, "arrive": arrive, "row": np.arange(len(ev))})
    sender = (ev["role"] == _SENDER).to_numpy()
    pairs = ends[sender].merge(ends[~sender], on=["cta", "pos"], suffixes=("_s", "_f"))
    pairs = pairs.sort_values("row_s", kind="stable")
    # Forward: the mark follows the second post, so consumer 0 may have its tile already: an arrow
    # never points back in time.
    mark_s = np.minimum(pairs["mark_s"].to_numpy(), pairs["arrive_f"].to_numpy())
    ids = np.arange(1, len(pairs) + 1)
    at = pairs["row_s"].to_numpy()
    name = _key(_FLOW_NAMES.get(pass_, "tile handed over"))
    begin = '{"ph":"s","cat":"flow","name":' + name + ',"id":%d,"pid":%d,"tid":%d,"ts":%.3f}'
    # binding point "e": the arrow ends on the slice enclosing its time, not on the next one to start
    finish = '{"ph":"f","bp":"e","cat":"flow","name":' + name + ',"id":%d,"pid":%d,"tid":%d,"ts":%.3f}'
    return (_Lines(begin, at, (ids, pairs["pid_s"].to_numpy(), pairs["tid_s"].to_numpy(), mark_s / 1e3)),
            _Lines(finish, at, (ids, pairs["pid_f"].to_numpy(), pairs["tid_f"].to_numpy(),
                                pairs["arrive_f"].to_numpy() / 1e3)))


def gantt_bars(tiles: pd.DataFrame, *, events: pd.DataFrame | None = None, sm_range: tuple[int, int] = (0, 16),
               max_bars: int = 4000) -> pd.DataFrame:
    """The bars of the Gantt: one per tile, or, past ``max_bars``, neighbouring tiles of a lane
    merged into fixed time buckets (``n_merged`` > 1) so the page stays light.

    With level-3 ``events`` the bars are their records, a lane per (SM, CTA, role): the producer
    and every consumer show each tile they worked on, where the tile records hold one consumer's.

    Columns: ``lane`` (label), ``smid``, ``cta``, ``role``, ``start_ns``, ``end_ns``, ``n_merged``, and
    ``tile``, ``batch``, ``head``, ``kv_len`` of the bar's first tile.
    """
    if events is not None and len(events):
        tiles = events.rename(columns={"role_id": "role", "role": "role_name"})
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
