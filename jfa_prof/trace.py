"""The trace file: one recording of an instrumented kernel launch, self-describing (SPEC §4).

A ``.jfatrace`` file is an npz archive (``np.savez_compressed``) with two members:

- ``records``: the raw int64 record buffer exactly as the kernel left it, laid out by
  :mod:`jfa_prof.records`;
- ``meta``: UTF-8 JSON (stored as uint8 so the file loads with ``allow_pickle=False``) naming the
  format and its version, the buffer layout with its role and site names, and what was run where.

Keys of ``meta`` (only ``format``, ``format_version`` and ``layout`` are required to read a file;
the rest make a trace useful weeks later):

    format, format_version            "jfa-prof-trace", FORMAT_VERSION
    layout                            {version, tile_capacity, n_ctas, n_roles, n_sites, roles, sites}
    gpu                               {name, sm_count, sm_clock_khz, capability}
    kernel                            {name, variant, config: {constexpr: value}}
    workload                          the shape: grid, B, H, H_kv, D, Lq, max_kv, sparsity, ...
    schedule                          "static" | "lpt" | "dynamic"
    schedule_mechanism                how the schedule ran, e.g. "global atomic tile counter"
    kernel_ms                         the launch's CUDA-event time, or null when not measured
    versions, date, command           package versions, ISO-8601 time, the command line

Decoding turns the buffer into DataFrames that analyses take; nothing here imports torch, so
traces recorded on a GPU machine render anywhere.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from jfa_prof.errors import BadInputError
from jfa_prof.files import write_atomic
from jfa_prof.records import (EVENT_FIXED_WORDS, FWD_ROLES, FWD_SITES, LAYOUT_VERSION, READ_LAYOUT_VERSIONS,
                              WAIT_COUNTER_LIMIT, Event, Header, Layout, Span, Tile, Wait)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "SUFFIX",
    "TILE_COLUMNS",
    "Trace",
    "bundled_dir",
    "bundled_traces",
    "find_bundled",
    "layout_meta",
    "layout_from_meta",
    "open_trace",
    "package_versions",
    "read_meta",
    "read_trace",
    "schedule_mechanism",
    "trace_from_buffer",
    "write_trace",
]

FORMAT = "jfa-prof-trace"
FORMAT_VERSION = 1
SUFFIX = ".jfatrace"

_RECORDS = "records"
_META = "meta"

# Tile fields in enum order, snake case, then the derived columns. Predicted schedules
# (analyses.predict) produce the same columns so every analysis and renderer takes either.
TILE_FIELD_COLUMNS = tuple(f.name.lower() for f in Tile)
TILE_COLUMNS = ("slot",) + TILE_FIELD_COLUMNS + ("role_name", "start_ns", "end_ns", "dur_ns", "dur_cycles")
SPAN_COLUMNS = ("cta", "role_id", "role", "smid", "t_start", "t_end", "c_start", "c_end", "n_tiles",
                "start_ns", "end_ns", "dur_ns", "dur_cycles")
WAIT_COLUMNS = ("cta", "smid", "role_id", "role", "site_id", "site", "cycles", "count")

_MECHANISMS = {
    "static": "grid order, dealt round-robin to persistent CTAs",
    "lpt": "longest tiles first, dealt zigzag to persistent CTAs",
    # Hopper has no Cluster Launch Control; the dynamic schedule there is a global atomic counter.
    "dynamic": "global atomic tile counter over the LPT-ordered list (Hopper has no CLC)",
}


@dataclass
class Trace:
    """A decoded recording.

    ``tiles``: one row per written tile record, ordered by ``slot`` (its position in the
    schedule's work list); columns ``slot``, the :class:`~jfa_prof.records.Tile` fields in
    snake case (raw ``t_start``/``t_end`` in ``%globaltimer`` ns, ``c_start``/``c_end`` in
    ``clock64`` cycles of that SM), ``role_name``, ``start_ns``/``end_ns`` relative to the
    kernel's first tile start (``t0_ns``), ``dur_ns`` and ``dur_cycles``.

    ``spans``: one row per written (CTA, role) span, times relative to the same ``t0_ns`` (a
    producer may start a little before the first tile, so its ``start_ns`` can be negative).

    ``waits``: one row per (CTA, role, site) accumulator: cycles waited and number of waits.

    ``dropped``: tile records the kernel could not write because the buffer was full. Anything
    computed from a trace with ``dropped > 0`` misses those tiles; say so wherever it is shown.

    ``events`` (level 3): one row per written (tile, role) event record, sorted by CTA, role and
    start: ``slot``, ``pos`` (the tile's list position), ``cta``, ``smid``, ``role_id``, ``role``,
    raw ``t_start``/``t_mark``/``t_end`` and ``c_start``/``c_end``, ``start_ns``/``mark_ns``/``end_ns``
    on the tiles' clock, ``dur_ns``, ``dur_cycles``, the tile's ``tile``, ``batch``, ``head``,
    ``block``, ``kv_len``, ``n_blocks`` (-1 without its tile record), and per site ``wait_<site>``
    (cycles waited there within the window) and ``wait_<site>_ns``. What the window and the mark
    are per role: ``records.ROLE_MARKS``. Empty below level 3.
    """

    meta: dict[str, Any]
    buffer: np.ndarray
    layout: Layout
    tiles: pd.DataFrame
    spans: pd.DataFrame
    waits: pd.DataFrame
    dropped: int
    t0_ns: int
    path: Path | None = None
    origin: str = "memory"  # "file", "bundled", "live" or "memory": where the trace came from
    warnings: list[str] = field(default_factory=list)
    events: pd.DataFrame = field(default_factory=lambda: _empty_events(()))
    events_dropped: int = 0
    sample: int = 1

    @property
    def level(self) -> int:
        """The instrumentation level recorded: 1 tiles and spans, 2 + wait totals, 3 + events."""
        lvl = self.meta.get("profile_level")
        if isinstance(lvl, int) and not isinstance(lvl, bool):
            return lvl
        return 3 if len(self.events) else (2 if self.waits["count"].any() else 1)

    @property
    def pass_(self) -> str:
        """"fwd" or "bwd": the kernel recorded."""
        kernel = self.meta.get("kernel") or {}
        name = str(kernel.get("pass") or kernel.get("name") or "")
        return "bwd" if name.endswith("bwd") else "fwd"

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.meta["layout"]["roles"])

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(self.meta["layout"]["sites"])

    @property
    def gpu_name(self) -> str:
        return str((self.meta.get("gpu") or {}).get("name") or "unknown GPU")

    @property
    def n_sms(self) -> int:
        """SMs of the GPU (meta), or enough rows for every SM id seen when meta lacks it."""
        seen = int(self.tiles["smid"].max()) + 1 if len(self.tiles) else 0
        return max(int((self.meta.get("gpu") or {}).get("sm_count") or 0), seen)

    @property
    def n_ctas(self) -> int:
        return self.layout.n_ctas

    @property
    def clock_khz(self) -> float | None:
        khz = (self.meta.get("gpu") or {}).get("sm_clock_khz")
        return float(khz) if khz else None

    @property
    def schedule(self) -> str:
        return str(self.meta.get("schedule") or "unknown")

    @property
    def schedule_mechanism(self) -> str:
        return schedule_mechanism(self.meta)

    @property
    def kernel_ms(self) -> float | None:
        ms = self.meta.get("kernel_ms")
        return float(ms) if ms is not None else None

    @property
    def makespan_ns(self) -> float:
        return float(self.tiles["end_ns"].max()) if len(self.tiles) else 0.0

    @property
    def kernel_label(self) -> str:
        kernel = self.meta.get("kernel") or {}
        return str(kernel.get("variant") or kernel.get("name") or "unknown kernel")

    @property
    def workload_label(self) -> str:
        """The workload's own label when recorded, else its main fields."""
        w = self.meta.get("workload") or {}
        if not isinstance(w, dict):
            return str(w)
        if w.get("label"):
            return str(w["label"])
        keys = ("grid", "B", "H", "D", "Lq", "max_kv", "sparsity")
        return " ".join(f"{k}={w[k]}" for k in keys if k in w) or "unknown workload"

    def describe_origin(self) -> str:
        """Where the data comes from, in the words the commands print."""
        if self.origin == "bundled":
            name = f": {self.path.name}" if self.path else ""
            gpu = self.gpu_name.removeprefix("NVIDIA ")
            return f"bundled {gpu} recording (not live){name}"
        if self.origin == "live":
            return f"live recording on {self.gpu_name}"
        if self.origin == "file":
            return f"{self.path} ({self.gpu_name}, recorded {self.meta.get('date', 'at an unknown date')})"
        return f"in-memory trace ({self.gpu_name})"


def schedule_mechanism(meta: Mapping[str, Any]) -> str:
    """How the trace's schedule was realized: the recorder's own words when it wrote them."""
    if meta.get("schedule_mechanism"):
        return str(meta["schedule_mechanism"])
    return _MECHANISMS.get(str(meta.get("schedule")), "unknown schedule")


# ---------------------------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------------------------

def layout_meta(layout: Layout, roles: Sequence[str] = FWD_ROLES, sites: Sequence[str] = FWD_SITES) -> dict:
    """The ``meta["layout"]`` entry for a buffer made with ``layout``."""
    if len(roles) != layout.n_roles or len(sites) != layout.n_sites:
        raise ValueError(f"layout has {layout.n_roles} roles and {layout.n_sites} sites, "
                         f"got names for {len(roles)} and {len(sites)}")
    return {
        "version": LAYOUT_VERSION,
        "tile_capacity": layout.tile_capacity,
        "n_ctas": layout.n_ctas,
        "n_roles": layout.n_roles,
        "n_sites": layout.n_sites,
        "event_capacity": layout.event_capacity,
        "roles": list(roles),
        "sites": list(sites),
    }


def layout_from_meta(meta: Mapping[str, Any], *, where: str = "trace") -> Layout:
    """The Layout a metadata dict describes, checked; BadInputError when it is unusable."""
    lay = meta.get("layout")
    if not isinstance(lay, Mapping):
        raise BadInputError(f"{where}: metadata has no 'layout' entry")
    if lay.get("version") not in READ_LAYOUT_VERSIONS:
        raise BadInputError(
            f"{where}: record layout version {lay.get('version')!r} is not supported "
            f"(this jfa-prof reads layout versions {', '.join(map(str, READ_LAYOUT_VERSIONS))})",
            hint="re-record it, or read it with the jfa-prof version that wrote it")
    dims = {}
    for key in ("tile_capacity", "n_ctas", "n_roles", "n_sites", "event_capacity"):
        v = lay.get(key, 0 if key == "event_capacity" else None)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BadInputError(f"{where}: layout.{key} must be a non-negative integer, got {v!r}")
        dims[key] = v
    for key, n in (("roles", dims["n_roles"]), ("sites", dims["n_sites"])):
        names = lay.get(key)
        if not isinstance(names, list) or len(names) != n or not all(isinstance(x, str) for x in names):
            raise BadInputError(f"{where}: layout.{key} must list {n} names, got {names!r}")
    return Layout(**dims)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a recording depends on, read without importing them."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in ("jfa-prof", "fbtriton", "triton", "torch", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _complete_meta(meta: Mapping[str, Any]) -> dict:
    full = dict(meta)
    full["format"] = FORMAT
    full["format_version"] = FORMAT_VERSION
    full.setdefault("date", _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds"))
    full.setdefault("command", shlex.join(sys.argv))
    full.setdefault("versions", package_versions())
    full.setdefault("kernel_ms", None)
    return full


def _json_default(x: Any) -> Any:
    # Config dicts often carry numpy scalars or paths; JSON has no type for them.
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"metadata value of type {type(x).__name__} is not JSON serializable")


# ---------------------------------------------------------------------------------------------
# writing and reading
# ---------------------------------------------------------------------------------------------

def _check_buffer(buffer: Any, layout: Layout, where: str) -> np.ndarray:
    buf = np.asarray(buffer)
    if buf.dtype != np.int64 or buf.ndim != 1:
        raise BadInputError(f"{where}: record buffer must be 1-D int64, got {buf.dtype} with shape {buf.shape}")
    if buf.size != layout.total_words:
        raise BadInputError(
            f"{where}: record buffer has {buf.size} words but its layout "
            f"(capacity {layout.tile_capacity}, {layout.n_ctas} CTAs, {layout.n_roles} roles, "
            f"{layout.n_sites} sites) needs {layout.total_words}")
    return buf


def write_trace(path: str | os.PathLike, buffer: np.ndarray, meta: Mapping[str, Any]) -> Path:
    """Write ``buffer`` (the host copy of the record buffer) and ``meta`` as one trace file.

    ``meta`` must hold ``layout`` (see :func:`layout_meta`); ``format``, ``format_version``,
    and, when absent, ``date``, ``command``, ``versions`` and ``kernel_ms`` are filled in. The
    file appears atomically: a reader never sees half of it.
    """
    path = Path(path)
    full = _complete_meta(meta)
    layout = layout_from_meta(full, where=str(path))
    buf = np.ascontiguousarray(_check_buffer(buffer, layout, str(path)))
    meta_bytes = np.frombuffer(json.dumps(full, default=_json_default, sort_keys=True).encode(), dtype=np.uint8)

    # A file object, not a name: given a name, numpy appends ".npz" to anything else.
    write_atomic(path, lambda f: np.savez_compressed(f, **{_RECORDS: buf, _META: meta_bytes}), what="trace")
    return path


def read_trace(path: str | os.PathLike, *, origin: str = "file") -> Trace:
    """Load and decode a trace file; BadInputError says what is wrong with a bad one."""
    path = Path(path)
    meta, buffer = _load(path, with_records=True)
    tr = trace_from_buffer(buffer, meta, path=path, origin=origin)
    if not len(tr.tiles) and not len(tr.spans) and not tr.dropped and not tr.waits["count"].any():
        raise BadInputError(f"{path} holds no records: its record buffer is all zeros, as if the kernel "
                            "never wrote to it", hint="re-record it")
    return tr


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """Only the metadata of a trace file (the records stay compressed on disk)."""
    return _load(Path(path), with_records=False)[0]


def _load(path: Path, *, with_records: bool) -> tuple[dict[str, Any], np.ndarray | None]:
    if not path.exists():
        raise BadInputError(f"trace file {path} does not exist")
    if not path.is_file():
        raise BadInputError(f"trace file {path} is not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise BadInputError(f"cannot read trace file {path}: {e.strerror or e}") from None
    if not magic.startswith(b"PK"):
        raise BadInputError(f"{path} is not a jfa-prof trace (expected a {SUFFIX} npz archive)")
    buffer = None
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in (_RECORDS, _META) if k not in npz.files]
            if missing:
                raise BadInputError(f"{path} is not a jfa-prof trace: no {' or '.join(missing)} in the archive "
                                    f"(it holds {', '.join(npz.files) or 'nothing'})")
            meta_raw = npz[_META]
            if with_records:
                buffer = npz[_RECORDS]
    except BadInputError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise BadInputError(f"{path} is corrupt: {_short_reason(e)}") from None

    if meta_raw.dtype != np.uint8 or meta_raw.ndim != 1:
        raise BadInputError(f"{path} is corrupt: metadata is {meta_raw.dtype}{list(meta_raw.shape)}, not bytes")
    try:
        meta = json.loads(meta_raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"{path} is corrupt: metadata is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        raise BadInputError(f"{path} is not a jfa-prof trace (format {fmt!r}, expected {FORMAT!r})")
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise BadInputError(
            f"{path}: trace format version {version!r} is not supported (this jfa-prof reads "
            f"versions 1 to {FORMAT_VERSION})", hint="upgrade jfa-prof, or re-record the trace")
    return meta, buffer


def _short_reason(err: Exception, limit: int = 160) -> str:
    """What numpy or zipfile said about a damaged archive, cut to one short line: their messages
    can quote a whole damaged header (hundreds of kilobytes)."""
    text = str(err)
    if "pickled" in text:
        # numpy's advice to allow pickles is the wrong one for a file that should hold none.
        return "an archive member is not a plain array (damaged, or not written by jfa-prof)"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first if len(first) <= limit else first[:limit].rstrip() + "…"


def trace_from_buffer(buffer: np.ndarray, meta: Mapping[str, Any], *, path: Path | None = None,
                      origin: str = "memory") -> Trace:
    """Decode a record buffer in memory (the live ``record`` path), exactly as read_trace does."""
    where = str(path) if path is not None else "record buffer"
    meta = dict(meta)
    layout = layout_from_meta(meta, where=where)
    buf = _check_buffer(buffer, layout, where)
    parts = layout.split(buf)

    capacity = int(parts["header"][Header.CAPACITY])
    if capacity not in (0, layout.tile_capacity):
        raise BadInputError(f"{where} is corrupt: header says {capacity} tile slots, "
                            f"layout says {layout.tile_capacity}")
    dropped = int(parts["header"][Header.DROPPED])
    if dropped < 0:
        raise BadInputError(f"{where} is corrupt: negative dropped-record count {dropped}")
    if int(parts["header"][Header.EVENTS_DROPPED]) < 0 or int(parts["header"][Header.SAMPLE]) < 0:
        raise BadInputError(f"{where} is corrupt: negative event header words")
    sample = int(parts["header"][Header.SAMPLE]) or 1
    expected = Layout.event_capacity_for(layout.tile_capacity, layout.n_roles, sample)
    if layout.event_capacity and layout.event_capacity != expected:
        # The slot of a record follows from the sample: another sample would join records to the wrong tiles.
        raise BadInputError(f"{where} is corrupt: {layout.event_capacity} event slots, but {layout.tile_capacity} "
                            f"tile slots recorded every {sample}th tile need {expected}")
    _check_records(parts, meta, layout, dropped, where)

    roles = tuple(meta["layout"]["roles"])
    sites = tuple(meta["layout"]["sites"])
    tiles = _decode_tiles(parts["tiles"], roles)
    span_rows = parts["spans"]
    span_valid = span_rows[:, :, Span.VALID] != 0
    if len(tiles):
        t0 = int(tiles["t_start"].min())
    elif span_valid.any():
        t0 = int(span_rows[:, :, Span.T_START][span_valid].min())
    else:
        t0 = 0
    if len(tiles):
        tiles["start_ns"] = tiles["t_start"] - t0
        tiles["end_ns"] = tiles["t_end"] - t0
    spans = _decode_spans(span_rows, roles, t0)
    waits = _decode_waits(parts["waits"], roles, sites, spans, tiles)

    sample = int(parts["header"][Header.SAMPLE]) or 1
    events_dropped = int(parts["header"][Header.EVENTS_DROPPED])
    events = _decode_events(parts["events"], roles, sites, sample, tiles, t0)

    warnings = []
    if dropped:
        warnings.append(f"{dropped} tile record(s) dropped: the record buffer "
                        f"({layout.tile_capacity} slots) was full; results miss those tiles")
    if events_dropped:
        warnings.append(f"{events_dropped} event record(s) dropped: the event section "
                        f"({layout.event_capacity} slots) was full; per-role results miss those tiles")
    return Trace(meta=meta, buffer=buf, layout=layout, tiles=tiles, spans=spans, waits=waits,
                 dropped=dropped, t0_ns=t0, path=path, origin=origin, warnings=warnings, events=events,
                 events_dropped=events_dropped, sample=sample)


# One launch of these kernels lasts milliseconds; a recording whose %globaltimer values spread
# over more than this is not of one launch.
MAX_LAUNCH_NS = 60 * 10**9
# clock64 ticks per %globaltimer ns must be near the SM clock: boost and throttling move it by
# tens of percent, never by these factors.
_CLOCK_RATIO_RANGE = (0.25, 4.0)


def _check_records(parts: dict[str, np.ndarray], meta: Mapping[str, Any], layout: Layout, dropped: int,
                   where: str) -> None:
    """Refuse records that cannot come from a launch the metadata describes: fields outside the
    GPU's SMs, the launch's CTAs, its roles or its tiles, times running backwards or spread
    beyond one launch, clock ticks that do not match the SM clock. Random or damaged words fail
    here, with the first field that is off, instead of in an analysis far downstream."""
    def corrupt(what: str) -> BadInputError:
        return BadInputError(f"{where} is corrupt: {what}",
                             hint="its records do not match its own metadata; re-record it")

    gpu = meta.get("gpu") if isinstance(meta.get("gpu"), Mapping) else {}
    sm_count = gpu.get("sm_count")
    sm_count = sm_count if isinstance(sm_count, int) and not isinstance(sm_count, bool) and sm_count > 0 else None
    n_work = meta.get("n_work")
    n_work = n_work if isinstance(n_work, int) and not isinstance(n_work, bool) and n_work >= 0 else None
    if n_work is not None and dropped > n_work:
        raise corrupt(f"{dropped:,} dropped tile records, but the launch had {n_work:,} tiles")

    def in_range(name: str, values: np.ndarray, hi: int | None, what: str) -> None:
        if not len(values):
            return
        lo_v, hi_v = int(values.min()), int(values.max())
        if lo_v < 0 or (hi is not None and hi_v >= hi):
            bad = lo_v if lo_v < 0 else hi_v
            raise corrupt(f"{name} {bad:,} in the records" + (f", {what} {hi:,}" if hi is not None else ""))

    def flags(name: str, values: np.ndarray) -> np.ndarray:
        odd = (values != 0) & (values != 1)
        if odd.any():
            raise corrupt(f"{int(odd.sum()):,} {name} with a valid flag other than 0 or 1")
        return values == 1

    rows = parts["tiles"]
    tiles = rows[flags("tile records", rows[:, Tile.VALID])]
    if n_work is not None and len(tiles) + dropped > n_work:
        raise corrupt(f"{len(tiles) + dropped:,} tile records, but the launch had {n_work:,} tiles")
    in_range("SM id", tiles[:, Tile.SMID], sm_count, f"the {gpu.get('name') or 'GPU'} has")
    in_range("CTA", tiles[:, Tile.CTA], layout.n_ctas, "the launch had")
    in_range("warp role", tiles[:, Tile.ROLE], layout.n_roles, "the layout names")
    in_range("tile id", tiles[:, Tile.TILE], n_work, "the launch had")
    for f in (Tile.BATCH, Tile.HEAD, Tile.BLOCK, Tile.KV_LEN, Tile.N_BLOCKS):
        in_range(f.name.lower(), tiles[:, f], None, "")

    span_rows = parts["spans"]
    spans = span_rows[flags("role spans", span_rows[:, :, Span.VALID])]
    in_range("span SM id", spans[:, Span.SMID], sm_count, f"the {gpu.get('name') or 'GPU'} has")
    in_range("span tile count", spans[:, Span.N_TILES], None, "")
    waits = parts["waits"]
    in_range("barrier wait cycles", waits[..., Wait.CYCLES].ravel(), WAIT_COUNTER_LIMIT, "its counters hold below")
    in_range("barrier wait count", waits[..., Wait.COUNT].ravel(), WAIT_COUNTER_LIMIT, "its counters hold below")
    if waits.any() and len(spans):
        longest = int((spans[:, Span.C_END] - spans[:, Span.C_START]).max())
        if longest >= WAIT_COUNTER_LIMIT:
            raise BadInputError(f"{where} has a warp role that ran {longest:,} cycles: its 32-bit wait counters "
                                "may have wrapped, so its barrier waits cannot be trusted",
                                hint="record waits (level 2 or 3) on a launch shorter than about two seconds")

    ev_rows = parts["events"]
    events = ev_rows[flags("event records", ev_rows[:, Event.VALID])]
    in_range("event SM id", events[:, Event.SMID], sm_count, f"the {gpu.get('name') or 'GPU'} has")
    in_range("event CTA", events[:, Event.CTA], layout.n_ctas, "the launch had")
    sample = int(parts["header"][Header.SAMPLE]) or 1
    ev_pos = (np.flatnonzero(ev_rows[:, Event.VALID] == 1) // max(layout.n_roles, 1)) * sample
    in_range("event tile position", ev_pos, n_work, "the launch had tiles")
    in_range("event wait cycles", events[:, EVENT_FIXED_WORDS:].ravel(), WAIT_COUNTER_LIMIT,
             "its counters hold below")
    n_sites = layout.n_sites
    if len(events) and ((events[:, Event.T_MARK] < events[:, Event.T_START])
                        | (events[:, Event.T_MARK] > events[:, Event.T_END])
                        | (events[:, EVENT_FIXED_WORDS + n_sites:] < events[:, EVENT_FIXED_WORDS:EVENT_FIXED_WORDS
                                                                              + n_sites]).any(axis=1)).any():
        raise corrupt("event records whose mark lies outside their window or whose waits run backwards")

    t0 = np.concatenate([tiles[:, Tile.T_START], spans[:, Span.T_START], events[:, Event.T_START]])
    t1 = np.concatenate([tiles[:, Tile.T_END], spans[:, Span.T_END], events[:, Event.T_END]])
    c0 = np.concatenate([tiles[:, Tile.C_START], spans[:, Span.C_START], events[:, Event.C_START]])
    c1 = np.concatenate([tiles[:, Tile.C_END], spans[:, Span.C_END], events[:, Event.C_END]])
    if not len(t0):
        return
    if (t1 < t0).any() or (c1 < c0).any():
        n = int(((t1 < t0) | (c1 < c0)).sum())
        raise corrupt(f"{n:,} record(s) end before they start")
    # Python ints: the spread of random words overflows int64.
    spread = int(t1.max()) - int(t0.min())
    if spread > MAX_LAUNCH_NS:
        raise corrupt(f"its %globaltimer values spread over {spread / 1e9:,.3g} s, not one launch")
    khz = gpu.get("sm_clock_khz")
    ns = (t1 - t0).sum(dtype=np.float64)
    if isinstance(khz, (int, float)) and khz > 0 and ns > 0:
        ratio = float((c1 - c0).sum(dtype=np.float64)) / ns / (khz / 1e6)
        lo, hi = _CLOCK_RATIO_RANGE
        if not lo <= ratio <= hi:
            raise corrupt(f"its clock64 cycles run at {ratio:.3g}x the {khz / 1e6:.3g} GHz SM clock")


def _role_names(ids: np.ndarray, names: Sequence[str]) -> np.ndarray:
    lookup = np.array(list(names) + ["?"], dtype=object)
    return lookup[np.where((ids >= 0) & (ids < len(names)), ids, len(names))]


def _decode_tiles(rows: np.ndarray, roles: Sequence[str]) -> pd.DataFrame:
    valid = rows[:, Tile.VALID] != 0
    slots = np.flatnonzero(valid)
    r = rows[valid]
    df = pd.DataFrame({"slot": slots.astype(np.int64)})
    for f in Tile:
        df[f.name.lower()] = r[:, f]
    df["role_name"] = _role_names(r[:, Tile.ROLE], roles)
    df["start_ns"] = np.zeros(len(r), dtype=np.int64)  # set once the kernel's t0 is known
    df["end_ns"] = np.zeros(len(r), dtype=np.int64)
    df["dur_ns"] = r[:, Tile.T_END] - r[:, Tile.T_START]
    df["dur_cycles"] = r[:, Tile.C_END] - r[:, Tile.C_START]
    return df


def _decode_spans(rows: np.ndarray, roles: Sequence[str], t0: int) -> pd.DataFrame:
    n_ctas, n_roles, _ = rows.shape
    cta, role = np.meshgrid(np.arange(n_ctas), np.arange(n_roles), indexing="ij")
    valid = rows[:, :, Span.VALID] != 0
    r = rows[valid]
    return pd.DataFrame({
        "cta": cta[valid].astype(np.int64),
        "role_id": role[valid].astype(np.int64),
        "role": _role_names(role[valid], roles),
        "smid": r[:, Span.SMID],
        "t_start": r[:, Span.T_START],
        "t_end": r[:, Span.T_END],
        "c_start": r[:, Span.C_START],
        "c_end": r[:, Span.C_END],
        "n_tiles": r[:, Span.N_TILES],
        "start_ns": r[:, Span.T_START] - t0,
        "end_ns": r[:, Span.T_END] - t0,
        "dur_ns": r[:, Span.T_END] - r[:, Span.T_START],
        "dur_cycles": r[:, Span.C_END] - r[:, Span.C_START],
    })


EVENT_COLUMNS = ("slot", "pos", "cta", "smid", "role_id", "role", "t_start", "t_mark", "t_end", "c_start", "c_end",
                 "start_ns", "mark_ns", "end_ns", "dur_ns", "dur_cycles", "tile", "batch", "head", "block", "kv_len",
                 "n_blocks")


def event_columns(sites: Sequence[str]) -> tuple[str, ...]:
    return EVENT_COLUMNS + tuple(f"wait_{s}" for s in sites) + tuple(f"wait_{s}_ns" for s in sites)


def _empty_events(sites: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c == "role" else np.float64 if c.endswith("_ns") and
                                      c.startswith("wait_") else np.int64) for c in event_columns(sites)})


def _decode_events(rows: np.ndarray, roles: Sequence[str], sites: Sequence[str], sample: int,
                   tiles: pd.DataFrame, t0: int) -> pd.DataFrame:
    valid = rows[:, Event.VALID] != 0
    if not valid.any():
        return _empty_events(sites)
    n_roles, n_sites = len(roles), len(sites)
    slots = np.flatnonzero(valid)
    r = rows[valid]
    pos = (slots // n_roles) * sample
    role_id = slots % n_roles
    df = pd.DataFrame({"slot": slots.astype(np.int64), "pos": pos.astype(np.int64), "cta": r[:, Event.CTA],
                       "smid": r[:, Event.SMID], "role_id": role_id.astype(np.int64),
                       "role": _role_names(role_id, roles)})
    for f, col in ((Event.T_START, "t_start"), (Event.T_MARK, "t_mark"), (Event.T_END, "t_end"),
                   (Event.C_START, "c_start"), (Event.C_END, "c_end")):
        df[col] = r[:, f]
    df["start_ns"] = df["t_start"] - t0
    df["mark_ns"] = df["t_mark"] - t0
    df["end_ns"] = df["t_end"] - t0
    df["dur_ns"] = df["t_end"] - df["t_start"]
    df["dur_cycles"] = df["c_end"] - df["c_start"]
    # The tile each record is about, from its tile record (the slot of both is the list position).
    info = ("tile", "batch", "head", "block", "kv_len", "n_blocks")
    by_slot = tiles.set_index("slot")[list(info)] if len(tiles) else pd.DataFrame(columns=list(info))
    joined = by_slot.reindex(df["pos"].to_numpy())
    for c in info:
        df[c] = joined[c].fillna(-1).to_numpy(np.int64)
    waited = r[:, EVENT_FIXED_WORDS + n_sites:EVENT_FIXED_WORDS + 2 * n_sites] - r[:, EVENT_FIXED_WORDS:
                                                                                  EVENT_FIXED_WORDS + n_sites]
    # Cycles to ns at each record's own clock: the SM clock moves with boost and throttling.
    ns_per_cycle = np.where(df["dur_cycles"] > 0, df["dur_ns"] / df["dur_cycles"].clip(lower=1), 0.0)
    for i, site in enumerate(sites):
        df[f"wait_{site}"] = waited[:, i]
    for i, site in enumerate(sites):
        df[f"wait_{site}_ns"] = waited[:, i] * ns_per_cycle
    return df.sort_values(["cta", "role_id", "start_ns"], kind="stable").reset_index(drop=True)


def _decode_waits(rows: np.ndarray, roles: Sequence[str], sites: Sequence[str],
                  spans: pd.DataFrame, tiles: pd.DataFrame) -> pd.DataFrame:
    n_ctas, n_roles, n_sites, _ = rows.shape
    cta, role, site = np.meshgrid(np.arange(n_ctas), np.arange(n_roles), np.arange(n_sites), indexing="ij")
    # A CTA never migrates, so any record of it names its SM: spans first, tiles otherwise.
    sm_of_cta = np.full(n_ctas, -1, dtype=np.int64)
    if len(tiles):
        ok = (tiles["cta"] >= 0) & (tiles["cta"] < n_ctas)
        sm_of_cta[tiles["cta"][ok].to_numpy()] = tiles["smid"][ok].to_numpy()
    if len(spans):
        ok = (spans["cta"] >= 0) & (spans["cta"] < n_ctas)
        sm_of_cta[spans["cta"][ok].to_numpy()] = spans["smid"][ok].to_numpy()
    flat_cta = cta.ravel()
    flat_role = role.ravel()
    flat_site = site.ravel()
    return pd.DataFrame({
        "cta": flat_cta.astype(np.int64),
        "smid": sm_of_cta[flat_cta],
        "role_id": flat_role.astype(np.int64),
        "role": _role_names(flat_role, roles),
        "site_id": flat_site.astype(np.int64),
        "site": _role_names(flat_site, sites),
        "cycles": rows[..., Wait.CYCLES].ravel(),
        "count": rows[..., Wait.COUNT].ravel(),
    })


# ---------------------------------------------------------------------------------------------
# bundled recordings
# ---------------------------------------------------------------------------------------------

def bundled_dir() -> Path:
    """Where the package keeps the H200 recordings that let CPU-only machines render something."""
    return Path(__file__).resolve().parent / "data"


def bundled_traces(pattern: str = f"*{SUFFIX}") -> list[Path]:
    d = bundled_dir()
    return sorted(d.glob(pattern)) if d.is_dir() else []


# File name endings of the bundled recordings, per side of the --clc axis, and of the static
# schedule alone (the baseline the heatmap shows beside both sides).
BUNDLED_SUFFIXES = {"off": ("_static" + SUFFIX, "_lpt" + SUFFIX), "on": ("_dynamic" + SUFFIX,),
                    "static": ("_static" + SUFFIX,)}


def find_bundled(clc: str, **workload: Any) -> Path | None:
    """The bundled recording for one side of ``--clc`` ("off" or "on"), or of the static
    schedule ("static"), or None.

    ``workload`` fields that are not None (``grid``, ``Lq``, ``max_kv``, ``sparsity``, ...) must
    match the recording's ``meta["workload"]``; among matches the first by name wins.
    """
    wanted = {k: v for k, v in workload.items() if v is not None}
    for path in bundled_traces("h200_*" + SUFFIX):
        if not path.name.endswith(BUNDLED_SUFFIXES[clc]):
            continue
        if wanted:
            recorded = read_meta(path).get("workload") or {}
            if any(recorded.get(k) != v for k, v in wanted.items()):
                continue
        return path
    return None


def open_trace(path: str | os.PathLike | None) -> Trace:
    """The trace file given, else a bundled recording (the dynamic one first)."""
    if path is not None:
        return read_trace(path)
    for clc in ("on", "off"):
        found = find_bundled(clc)
        if found is not None:
            return read_trace(found, origin="bundled")
    raise BadInputError(f"no trace file given and no bundled recording in {bundled_dir()}",
                        hint="pass --trace FILE (record one on a GPU with `jfa-prof record`)")
