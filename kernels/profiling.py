"""Device-side instrumentation helpers shared by the kernels.

PROFILE is a constexpr level: 0 = off, 1 = tile records and warp-role spans, 2 = also the
barrier-wait accumulators (a clock read on each side of every wait, so it costs more). Everything
here runs under `if PROFILE` checks, so at level 0 none of it reaches the compiled kernel: no
clock or timer reads in the PTX. The record layout itself lives
in `jfa_prof.records`; these constexprs mirror its enums so kernels never hard-code an offset.
"""
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof.records import BARRIER_WORDS, SPAN_WORDS, TILE_WORDS, Header, Span, Tile, Wait

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


@triton.jit
def smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def timed_wait(bar, phase, cycles, count, PROFILE: tl.constexpr):
    """barrier_wait that, at PROFILE level 2, adds the cycles spent waiting to a per-site accumulator."""
    if PROFILE >= 2:
        t0 = tlx.clock64()
        tlx.barrier_wait(bar, phase)
        cycles += tlx.clock64() - t0
        count += 1
    else:
        tlx.barrier_wait(bar, phase)
    return cycles, count


@triton.jit
def timed_named_wait(bar_id: tl.constexpr, n_threads: tl.constexpr, cycles, count, PROFILE: tl.constexpr):
    if PROFILE >= 2:
        t0 = tlx.clock64()
        tlx.named_barrier_wait(bar_id, n_threads)
        cycles += tlx.clock64() - t0
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
