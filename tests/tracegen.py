"""Synthetic record buffers, encoded the way the instrumented kernel writes them.

`encode` is the kernel's side of the record layout, spelled out with the enums of
`jfa_prof.records` (slot = list position, VALID = 1, records past the capacity only bump
DROPPED). `persistent_run` plays the persistent forward kernel on top of it: CTAs placed on SMs
in a scrambled order, a `%globaltimer` epoch and per-SM `clock64` offsets, both consumer warp
groups working on every tile (64 rows each) with the first one writing the tile record, a
producer span that starts before the first tile, barrier waits that grow with the tile size,
and queue waits under the dynamic schedule. It is written independently of
`analyses.predict` (loops, not a heap) so the simulator is checked against it rather than
against itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from jfa_prof.records import EVENT_FIXED_WORDS, FWD_ROLES, FWD_SITES, Event, Header, Layout, Span, Tile, Wait
from jfa_prof.trace import layout_meta

DATA_DIR = Path(__file__).parent / "data"
GLOBALTIMER_EPOCH = 1_764_547_200_000_000_000  # a plausible %globaltimer value: ns since 1970
CLOCK_KHZ = 1_980_000


def recorded_traces() -> list[Path]:
    """Real recordings committed anywhere under tests/data (none until a GPU run adds them)."""
    return sorted(DATA_DIR.rglob("*.jfatrace"))


def encode(layout: Layout, tiles: pd.DataFrame | None = None, spans: pd.DataFrame | None = None,
           waits: np.ndarray | None = None, dropped: int = 0) -> np.ndarray:
    """The buffer a kernel leaves behind.

    ``tiles``: columns ``slot`` and the Tile fields in snake case (``valid`` implied);
    ``spans``: columns ``cta``, ``role`` (index) and the Span fields in snake case;
    ``waits``: int array [n_ctas, n_roles, n_sites, 2] of (cycles, count).
    """
    buf = np.zeros(layout.total_words, dtype=np.int64)
    parts = layout.split(buf)
    parts["header"][Header.CAPACITY] = layout.tile_capacity
    parts["header"][Header.DROPPED] = dropped
    if tiles is not None and len(tiles):
        slots = tiles["slot"].to_numpy()
        fit = slots < layout.tile_capacity
        parts["header"][Header.DROPPED] += int((~fit).sum())
        rows = parts["tiles"]
        for f in Tile:
            if f is Tile.VALID:
                rows[slots[fit], f] = 1
            else:
                rows[slots[fit], f] = tiles[f.name.lower()].to_numpy()[fit]
    if spans is not None and len(spans):
        cta = spans["cta"].to_numpy()
        role = spans["role"].to_numpy()
        for f in Span:
            parts["spans"][cta, role, f] = 1 if f is Span.VALID else spans[f.name.lower()].to_numpy()
    if waits is not None:
        parts["waits"][..., Wait.CYCLES] = waits[..., 0]
        parts["waits"][..., Wait.COUNT] = waits[..., 1]
    return buf


def encode_events(layout: Layout, buf: np.ndarray, events: pd.DataFrame, waits_start: np.ndarray,
                  waits_end: np.ndarray, *, sample: int = 1) -> np.ndarray:
    """Event records (level 3) into a buffer made by `encode`: ``events`` has columns ``pos``,
    ``role_id`` and the Event fields in snake case; ``waits_start`` / ``waits_end`` are
    [len(events), n_sites] cumulative wait cycles, as the kernel stores them."""
    parts = layout.split(buf)
    parts["header"][Header.SAMPLE] = sample
    slots = (events["pos"].to_numpy() // sample) * layout.n_roles + events["role_id"].to_numpy()
    fit = slots < layout.event_capacity
    parts["header"][Header.EVENTS_DROPPED] += int((~fit).sum())
    rows = parts["events"]
    for f in Event:
        rows[slots[fit], f] = 1 if f is Event.VALID else events[f.name.lower()].to_numpy()[fit]
    n = layout.n_sites
    rows[slots[fit], EVENT_FIXED_WORDS:EVENT_FIXED_WORDS + n] = np.asarray(waits_start)[fit]
    rows[slots[fit], EVENT_FIXED_WORDS + n:EVENT_FIXED_WORDS + 2 * n] = np.asarray(waits_end)[fit]
    return buf


def make_meta(layout: Layout, *, n_sms: int = 132, schedule: str = "static", roles: Sequence[str] = FWD_ROLES,
              sites: Sequence[str] = FWD_SITES, **extra) -> dict:
    meta = {
        "layout": layout_meta(layout, roles, sites),
        "gpu": {"name": "NVIDIA H200", "sm_count": n_sms, "sm_clock_khz": CLOCK_KHZ, "capability": [9, 0]},
        "kernel": {"name": "jfa_fwd", "variant": f"fwd/bf16/d128/{schedule}/prof-on",
                   "config": {"BLOCK_M": 128, "BLOCK_N": 128, "PROFILE": True}},
        "workload": {"grid": "hsp", "B": 64, "H": 4, "D": 128, "Lq": 256, "max_kv": 2048,
                     "sparsity": 0.5, "label": "hsp Lq=256 max=2048 s=0.5"},
        "schedule": schedule,
        "kernel_ms": None,
    }
    meta.update(extra)
    return meta


def cta_to_sm(n_ctas: int, n_sms: int, seed: int = 0) -> np.ndarray:
    """Where the hardware put each CTA: a scrambled assignment (never cta == smid)."""
    perm = np.random.default_rng(seed).permutation(n_sms)
    return perm[np.arange(n_ctas) % n_sms]


def zigzag_list(n_blocks: np.ndarray, n_ctas: int) -> np.ndarray:
    """LPT work list written out by hand: longest first, odd full rounds reversed."""
    ranked = sorted(range(len(n_blocks)), key=lambda i: (-int(n_blocks[i]), i))
    out = []
    for r in range(0, len(ranked), n_ctas):
        chunk = ranked[r:r + n_ctas]
        if (r // n_ctas) % 2 == 1 and len(chunk) == n_ctas:
            chunk = chunk[::-1]
        out.extend(chunk)
    return np.array(out, dtype=np.int64)


def persistent_run(n_blocks: Sequence[int], *, n_ctas: int = 8, n_sms: int | None = None,
                   schedule: str = "static", a_ns: float = 2_000.0, b_ns: float = 500.0,
                   gap_ns: int = 0, capacity: int | None = None, seed: int = 0,
                   heads: int = 4) -> tuple[np.ndarray, dict, pd.DataFrame]:
    """Buffer, meta and the ground-truth tile table of a persistent forward kernel.

    Tile ``i`` (grid order) is batch ``i // heads``, head ``i % heads``; its KV length is
    ``128 * n_blocks`` and it takes ``a_ns + b_ns * n_blocks`` ns. CTAs start together, run
    their tiles back to back with ``gap_ns`` between them. ``schedule``: "static" (grid order),
    "lpt" (zigzag list) or "dynamic" (next entry to the CTA that frees first, lowest id on ties).
    """
    n_blocks = np.asarray(n_blocks, dtype=np.int64)
    n = n_blocks.size
    n_sms = n_sms or max(n_ctas, 1)
    capacity = n if capacity is None else capacity
    order = zigzag_list(n_blocks, n_ctas) if schedule == "lpt" else (
        np.array(sorted(range(n), key=lambda i: (-int(n_blocks[i]), i)), dtype=np.int64)
        if schedule == "dynamic" else np.arange(n))
    dur = np.rint(a_ns + b_ns * n_blocks).astype(np.int64)
    sm_of = cta_to_sm(n_ctas, n_sms, seed)
    clock_offset = np.random.default_rng(seed + 1).integers(10**9, 10**12, size=n_sms)

    free = np.zeros(n_ctas, dtype=np.int64)
    n_done = np.zeros(n_ctas, dtype=np.int64)
    rows = []
    for slot, tile in enumerate(order):
        if schedule == "dynamic":
            cta = int(np.argmin(free))  # argmin returns the lowest index on ties
        else:
            cta = slot % n_ctas
        start = int(free[cta])
        end = start + int(dur[tile])
        free[cta] = end + gap_ns
        rows.append((slot, cta, int(tile), start, end, 1))  # consumer0 writes the record
        n_done[cta] += 1
    truth = pd.DataFrame(rows, columns=["slot", "cta", "tile", "start_ns", "end_ns", "role"])
    truth["smid"] = sm_of[truth["cta"]]
    truth["batch"] = truth["tile"] // heads
    truth["head"] = truth["tile"] % heads
    truth["block"] = 0
    truth["n_blocks"] = n_blocks[truth["tile"]]
    truth["kv_len"] = 128 * truth["n_blocks"]
    truth["dur_ns"] = truth["end_ns"] - truth["start_ns"]

    def timer(t):
        return GLOBALTIMER_EPOCH + np.asarray(t, dtype=np.int64)

    def clock(t, sm):
        return np.rint(np.asarray(t) * CLOCK_KHZ / 1e6).astype(np.int64) + clock_offset[sm]

    recs = truth.copy()
    recs["t_start"] = timer(truth["start_ns"])
    recs["t_end"] = timer(truth["end_ns"])
    recs["c_start"] = clock(truth["start_ns"], truth["smid"])
    recs["c_end"] = clock(truth["end_ns"], truth["smid"])

    layout = Layout(tile_capacity=capacity, n_ctas=n_ctas, n_roles=len(FWD_ROLES), n_sites=len(FWD_SITES))
    span_rows = []
    waits = np.zeros((n_ctas, len(FWD_ROLES), len(FWD_SITES), 2), dtype=np.int64)
    site = {s: i for i, s in enumerate(FWD_SITES)}
    for cta, mine in truth.groupby("cta"):
        sm = int(sm_of[cta])
        lead = 300  # the producer issues its first loads before the consumers start computing
        first, last = int(mine["start_ns"].min()), int(mine["end_ns"].max())
        for role in range(len(FWD_ROLES)):
            t0 = first - lead if role == 0 else first
            t1 = last - 100 if role == 0 else last
            span_rows.append({"cta": cta, "role": role, "smid": sm, "t_start": timer(t0), "t_end": timer(t1),
                              "c_start": clock(t0, sm), "c_end": clock(t1, sm), "n_tiles": len(mine)})
        blocks, tiles = int(mine["n_blocks"].sum()), len(mine)
        waits[cta, 0, site["k_empty"]] = (40 * blocks, blocks)
        waits[cta, 0, site["v_empty"]] = (30 * blocks, blocks)
        # the two consumers take turns on the tensor cores, so they wait differently
        waits[cta, 1, site["k_full"]] = (100 * blocks, blocks)
        waits[cta, 2, site["k_full"]] = (80 * blocks, blocks)
        for role in (1, 2):
            waits[cta, role, site["v_full"]] = (20 * blocks, blocks)
        waits[cta, 1, site["mma_turn"]] = (60 * blocks, blocks)
        waits[cta, 2, site["mma_turn"]] = (90 * blocks, blocks)
        if schedule == "dynamic":
            waits[cta, 0, site["queue"]] = (50 * tiles, tiles)
            for role in (1, 2):
                waits[cta, role, site["queue"]] = (30 * tiles, tiles)
    spans = pd.DataFrame(span_rows)
    buf = encode(layout, recs, spans, waits)
    meta = make_meta(layout, n_sms=n_sms, schedule=schedule)
    return buf, meta, truth


def hand_trace(rows: Sequence[dict], *, n_sms: int, n_ctas: int | None = None, capacity: int | None = None,
               spans: Sequence[dict] = (), waits: np.ndarray | None = None, roles: Sequence[str] = FWD_ROLES,
               sites: Sequence[str] = FWD_SITES, dropped: int = 0, schedule: str = "static"):
    """A decoded Trace of hand-written tiles (times in ns from the first tile), through the
    same encode/decode path as a recording. Row keys: cta, smid, start, end and optionally
    slot, tile, batch, head, block, kv_len, n_blocks, role (default 1, the first consumer).
    Span keys: cta, role, start, end (ns) and optionally smid, cycles, n_tiles."""
    from jfa_prof.trace import trace_from_buffer

    n_ctas = n_ctas if n_ctas is not None else max([r["cta"] for r in rows] + [s["cta"] for s in spans] + [0]) + 1
    capacity = capacity if capacity is not None else len(rows)
    recs = []
    for i, r in enumerate(rows):
        start, end = int(r["start"]), int(r["end"])
        recs.append({
            "slot": r.get("slot", i), "cta": r["cta"], "smid": r["smid"], "tile": r.get("tile", i),
            "batch": r.get("batch", i), "head": r.get("head", 0), "block": r.get("block", 0),
            "kv_len": r.get("kv_len", 128), "n_blocks": r.get("n_blocks", 1),
            "t_start": GLOBALTIMER_EPOCH + start, "t_end": GLOBALTIMER_EPOCH + end,
            "c_start": 10**9 + 2 * start, "c_end": 10**9 + 2 * end, "role": r.get("role", 1),
        })
    span_recs = []
    for s in spans:
        start, end = int(s["start"]), int(s["end"])
        cycles = int(s.get("cycles", 2 * (end - start)))
        span_recs.append({"cta": s["cta"], "role": s["role"], "smid": s.get("smid", s["cta"]),
                          "t_start": GLOBALTIMER_EPOCH + start, "t_end": GLOBALTIMER_EPOCH + end,
                          "c_start": 10**9, "c_end": 10**9 + cycles, "n_tiles": s.get("n_tiles", 0)})
    layout = Layout(tile_capacity=capacity, n_ctas=n_ctas, n_roles=len(roles), n_sites=len(sites))
    buf = encode(layout, pd.DataFrame(recs) if recs else None, pd.DataFrame(span_recs) if span_recs else None,
                 waits, dropped)
    return trace_from_buffer(buf, make_meta(layout, n_sms=n_sms, schedule=schedule, roles=roles, sites=sites))


def recorded_id(path: Path) -> str:
    return str(path.relative_to(DATA_DIR))
