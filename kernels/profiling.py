"""Device-side instrumentation helpers shared by the kernels.

PROFILE is a constexpr level: 0 = off, 1 = tile records and warp-role spans, 2 = also the
barrier-wait accumulators (a clock read on each side of every wait, so it costs more), 3 = also
one event record per (sampled tile, warp role): the role's window on that tile and its waits. Everything
here runs under `if PROFILE` checks, so at level 0 none of it reaches the compiled kernel: no
clock or timer reads in the PTX. The record layout itself lives
in `jfa_prof.records`; these constexprs mirror its enums so kernels never hard-code an offset.
"""
import os

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof.records import (BARRIER_WORDS, EVENT_FIXED_WORDS, SPAN_WORDS, TILE_WORDS, Event, Header, Span, Tile,
                              Wait)

TILE_WORDS_C = tl.constexpr(TILE_WORDS)
SPAN_WORDS_C = tl.constexpr(SPAN_WORDS)
WAIT_WORDS_C = tl.constexpr(BARRIER_WORDS)
H_DROPPED = tl.constexpr(int(Header.DROPPED))
T_CTA = tl.constexpr(int(Tile.CTA))
T_SMID = tl.constexpr(int(Tile.SMID))
T_TILE = tl.constexpr(int(Tile.TILE))
T_BATCH = tl.constexpr(int(Tile.BATCH))
T_HEAD = tl.constexpr(int(Tile.HEAD))
T_BLOCK = tl.constexpr(int(Tile.BLOCK))
T_KV_LEN = tl.constexpr(int(Tile.KV_LEN))
T_N_BLOCKS = tl.constexpr(int(Tile.N_BLOCKS))
T_T_START = tl.constexpr(int(Tile.T_START))
T_T_END = tl.constexpr(int(Tile.T_END))
T_C_START = tl.constexpr(int(Tile.C_START))
T_C_END = tl.constexpr(int(Tile.C_END))
T_ROLE = tl.constexpr(int(Tile.ROLE))
T_VALID = tl.constexpr(int(Tile.VALID))
S_SMID = tl.constexpr(int(Span.SMID))
S_T_START = tl.constexpr(int(Span.T_START))
S_T_END = tl.constexpr(int(Span.T_END))
S_C_START = tl.constexpr(int(Span.C_START))
S_C_END = tl.constexpr(int(Span.C_END))
S_N_TILES = tl.constexpr(int(Span.N_TILES))
S_VALID = tl.constexpr(int(Span.VALID))
W_CYCLES = tl.constexpr(int(Wait.CYCLES))
W_COUNT = tl.constexpr(int(Wait.COUNT))
H_EVENTS_DROPPED = tl.constexpr(int(Header.EVENTS_DROPPED))
E_CTA = tl.constexpr(int(Event.CTA))
E_SMID = tl.constexpr(int(Event.SMID))
E_T_START = tl.constexpr(int(Event.T_START))
E_T_MARK = tl.constexpr(int(Event.T_MARK))
E_T_END = tl.constexpr(int(Event.T_END))
E_C_START = tl.constexpr(int(Event.C_START))
E_C_END = tl.constexpr(int(Event.C_END))
E_VALID = tl.constexpr(int(Event.VALID))
E_FIXED = tl.constexpr(EVENT_FIXED_WORDS)


if os.environ.get("TRITON_INTERPRET") == "1":
    # Triton's interpreter has no inline asm, and no compiler hoisting to prevent either.
    @triton.jit
    def opaque(x):
        return x
else:
    @triton.jit
    def opaque(x):
        """x (int32), through an instruction the compiler may not move or fold: what is built from it
        is rebuilt where it is used instead of hoisted out of a loop into registers held throughout."""
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def counter():
    """A wait accumulator (cycles or count): 32 bits, unsigned, so it holds 2^32 cycles (over two
    seconds of waiting at one site) in one register. In 64 bits, the forward producer's eight of them
    spilled at level 2: it runs in 40 registers."""
    return tl.zeros([], tl.uint32)


@triton.jit
def clock32():
    """The SM clock's low 32 bits: a difference of two readings is exact (modulo 2^32) for any wait
    under two seconds, and costs one register where clock64 takes two. Read as the low half of
    %clock64, which ptxas makes a fixed-latency CS2R into an ordinary register; %clock became an
    S2UR into a uniform one, whose use waits on a scoreboard: with it the forward's level 2 cost
    3.6-5.7% at the HSP Lq=256 points, with this (in the KV loop, beside one read fewer there)
    1.2-1.8% (kernel alone, H100:
    benchmarks/results/instrumentation/fwd_l2_clock_ab_h100_2026-12-06.json)."""
    return tl.inline_asm_elementwise("{ .reg .u64 t; mov.u64 t, %clock64; cvt.u32.u64 $0, t; }", "=r", [],
                                     dtype=tl.uint32, is_pure=False, pack=1)


@triton.jit
def timed_wait(bar, phase, cycles, count, PROFILE: tl.constexpr):
    """barrier_wait that, at PROFILE level 2, adds the cycles spent waiting to a per-site accumulator."""
    if PROFILE >= 2:
        t0 = clock32()
        tlx.barrier_wait(bar, phase)
        cycles += clock32() - t0
        count += 1
    else:
        tlx.barrier_wait(bar, phase)
    return cycles, count


@triton.jit
def timed_named_wait(bar_id: tl.constexpr, n_threads: tl.constexpr, cycles, count, PROFILE: tl.constexpr):
    if PROFILE >= 2:
        t0 = clock32()
        tlx.named_barrier_wait(bar_id, n_threads)
        cycles += clock32() - t0
        count += 1
    else:
        tlx.named_barrier_wait(bar_id, n_threads)
    return cycles, count


@triton.jit
def write_tile(rec_ptr, tiles_off, tile_cap, slot, cta, sm, tile, batch, head, block, kv_len, n_blocks,
               t0, t1, c0, c1, role):
    """One tile record at its schedule slot; past the capacity only the drop counter moves."""
    if slot < tile_cap:
        base = rec_ptr + tiles_off + slot.to(tl.int64) * TILE_WORDS_C
        tl.store(base + T_CTA, cta.to(tl.int64))
        tl.store(base + T_SMID, sm.to(tl.int64))
        tl.store(base + T_TILE, tile.to(tl.int64))
        tl.store(base + T_BATCH, batch.to(tl.int64))
        tl.store(base + T_HEAD, head.to(tl.int64))
        tl.store(base + T_BLOCK, block.to(tl.int64))
        tl.store(base + T_KV_LEN, kv_len.to(tl.int64))
        tl.store(base + T_N_BLOCKS, n_blocks.to(tl.int64))
        tl.store(base + T_T_START, t0)
        tl.store(base + T_T_END, t1)
        tl.store(base + T_C_START, c0)
        tl.store(base + T_C_END, c1)
        tl.store(base + T_ROLE, role + tl.zeros([], tl.int64))
        tl.store(base + T_VALID, 1)
    else:
        # Relaxed: a counter needs no ordering, and a fenced atomic costs a GPU-wide membar.
        tl.atomic_add(rec_ptr + H_DROPPED, 1, sem="relaxed")


@triton.jit
def write_tile_fields(rec_ptr, tiles_off, tile_cap, slot, cta, sm, tile, batch, head, block, kv_len, n_blocks, t0,
                      c0, role):
    """A tile record without its end (`write_tile_end`), for a role that stores the two apart."""
    if slot < tile_cap:
        base = rec_ptr + tiles_off + slot.to(tl.int64) * TILE_WORDS_C
        tl.store(base + T_CTA, cta.to(tl.int64))
        tl.store(base + T_SMID, sm.to(tl.int64))
        tl.store(base + T_TILE, tile.to(tl.int64))
        tl.store(base + T_BATCH, batch.to(tl.int64))
        tl.store(base + T_HEAD, head.to(tl.int64))
        tl.store(base + T_BLOCK, block.to(tl.int64))
        tl.store(base + T_KV_LEN, kv_len.to(tl.int64))
        tl.store(base + T_N_BLOCKS, n_blocks.to(tl.int64))
        tl.store(base + T_T_START, t0)
        tl.store(base + T_C_START, c0)
        tl.store(base + T_ROLE, role + tl.zeros([], tl.int64))
    else:
        tl.atomic_add(rec_ptr + H_DROPPED, 1, sem="relaxed")


@triton.jit
def write_tile_end(rec_ptr, tiles_off, tile_cap, slot, t1, c1):
    """The end times of the record `write_tile_fields` began, and VALID; nothing for a slot < 0
    (no tile yet) or past the capacity (already counted as dropped)."""
    if (slot >= 0) & (slot < tile_cap):
        base = rec_ptr + tiles_off + slot.to(tl.int64) * TILE_WORDS_C
        tl.store(base + T_T_END, t1)
        tl.store(base + T_C_END, c1)
        tl.store(base + T_VALID, 1)


@triton.jit
def _span_base(rec_ptr, spans_off, cta, role, n_roles):
    return rec_ptr + spans_off + (cta * n_roles + role).to(tl.int64) * SPAN_WORDS_C


@triton.jit
def span_begin(rec_ptr, spans_off, cta, role, n_roles):
    """A warp role's span starts: its SM and start times go to the record now, so that nothing
    stays live until `span_end`. (Held in registers across the persistent loop, they made the
    forward's instrumented consumers spill 16-24 bytes.)"""
    base = _span_base(rec_ptr, spans_off, cta, role, n_roles)
    tl.store(base + S_SMID, smid().to(tl.int64))
    tl.store(base + S_T_START, globaltimer())
    tl.store(base + S_C_START, tlx.clock64())


@triton.jit
def span_end(rec_ptr, spans_off, cta, role, n_roles, n_tiles):
    """The span's end, its tile count, and VALID last."""
    base = _span_base(rec_ptr, spans_off, cta, role, n_roles)
    tl.store(base + S_T_END, globaltimer())
    tl.store(base + S_C_END, tlx.clock64())
    tl.store(base + S_N_TILES, n_tiles.to(tl.int64))
    tl.store(base + S_VALID, 1)


@triton.jit
def write_wait(rec_ptr, waits_off, cta, role, n_roles, site: tl.constexpr, n_sites: tl.constexpr, cycles, count):
    base = rec_ptr + waits_off + ((cta * n_roles + role).to(tl.int64) * n_sites + site) * WAIT_WORDS_C
    tl.store(base + W_CYCLES, cycles.to(tl.int64))
    tl.store(base + W_COUNT, count.to(tl.int64))


@triton.jit
def write_site_waits(rec_ptr, waits_off, cta, role, n_roles, sites: tl.constexpr, n_sites: tl.constexpr, cycles,
                     counts):
    """`write_wait` of several sites: `sites` a tuple of site ids, `cycles` and `counts` their accumulators."""
    for i in tl.static_range(len(sites)):
        write_wait(rec_ptr, waits_off, cta, role, n_roles, sites[i], n_sites, cycles[i], counts[i])


@triton.jit
def spin(cycles: tl.constexpr):
    """A planted delay: busy-wait `cycles` SM clock cycles."""
    end = tlx.clock64() + cycles
    now = tlx.clock64()
    while now < end:
        now = tlx.clock64()


# ---------------------------------------------------------------------------------------------
# Level 3: event records. The section follows the wait accumulators; its offset and capacity are
# derived here from the launch's own numbers (`records.Layout.event_capacity_for`), so no kernel
# argument carries them. Each record is written in three parts (start, mark, end) at the moment
# they happen: nothing but the slot stays live across the tile.
# ---------------------------------------------------------------------------------------------
@triton.jit
def event_base(rec_ptr, waits_off, tile_cap, pos, role, n_progs, n_roles: tl.constexpr, n_sites: tl.constexpr,
               SAMPLE: tl.constexpr):
    """The record of tile `pos` for `role`, or a null offset (-1) when the tile is not sampled or
    its slot is past the section's end (then the drop counter moves). A kernel whose record
    addresses, hoisted out of its persistent loop, would spill passes `waits_off` through `opaque`."""
    events_off = waits_off + n_progs * n_roles * n_sites * WAIT_WORDS_C
    cap = (tile_cap + SAMPLE - 1) // SAMPLE
    grp = pos // SAMPLE
    off = tl.full([], -1, tl.int64)
    if pos % SAMPLE == 0:
        if grp < cap:
            off = events_off + (grp * n_roles + role).to(tl.int64) * (E_FIXED + 2 * n_sites)
        else:
            tl.atomic_add(rec_ptr + H_EVENTS_DROPPED, 1, sem="relaxed")
    return off


@triton.jit
def event_start(rec_ptr, off, cta, t0, c0):
    if off >= 0:
        base = rec_ptr + off
        tl.store(base + E_CTA, cta.to(tl.int64))
        tl.store(base + E_SMID, smid().to(tl.int64))
        tl.store(base + E_T_START, t0)
        tl.store(base + E_C_START, c0)


@triton.jit
def event_waits(rec_ptr, off, n_sites: tl.constexpr, end: tl.constexpr, site: tl.constexpr, cycles):
    """One site's cumulative wait cycles at the window's start (end=False) or end."""
    if off >= 0:
        tl.store(rec_ptr + off + E_FIXED + end * n_sites + site, cycles)


@triton.jit
def event_site_waits(rec_ptr, off, n_sites: tl.constexpr, end: tl.constexpr, sites: tl.constexpr, cycles):
    """`event_waits` of several sites: `sites` a tuple of site ids, `cycles` their accumulators."""
    for i in tl.static_range(len(sites)):
        event_waits(rec_ptr, off, n_sites, end, sites[i], cycles[i])


@triton.jit
def event_mark(rec_ptr, off):
    if off >= 0:
        tl.store(rec_ptr + off + E_T_MARK, globaltimer())


@triton.jit
def event_end(rec_ptr, off):
    if off >= 0:
        base = rec_ptr + off
        tl.store(base + E_T_END, globaltimer())
        tl.store(base + E_C_END, tlx.clock64())
        tl.store(base + E_VALID, 1)
