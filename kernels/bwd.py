"""Jagged Flash Attention backward for Hopper (sm_90a).

The main kernel is TLX: shared-memory buffers, mbarriers and asynchronous wgmma written out;
the two helper kernels are plain Triton. Kernels:

- `_jfa_bwd_delta`: delta = rowsum(dO * O) in fp32, `[H, rows]` like the log-sum-exp. It is the
  row term of the softmax gradient, dS = P * (dP - delta), computed once instead of once per
  KV block. Its first program also builds the main kernel's tile list (below).
- `_jfa_bwd`: persistent. Its tiles are the valid (batch, kv head, KV block of `BLOCK_N` keys)
  triples, block-innermost; the list is a prefix sum of KV blocks per sequence built on the GPU
  (no host sync), searched from the previous tile's batch on (`_find_tile`), so empty sequences
  make no tiles. Tiles are dealt round-robin, or (dynamic) taken from an atomic queue. A tile
  keeps its K and V block resident, walks the query heads of the kv head's group and, for each,
  the query blocks that can see this KV block, recomputing P from Q, K and the saved
  log-sum-exp. dK and dV are summed over the whole group in registers and written once, so GQA
  needs no second reduction pass.
  Per step (one query block of one head): S^T = K Q^T and dP^T = V dO^T go to the tensor cores
  together and P^T is computed while dP^T runs; dS^T goes to shared memory while dV += P^T dO and
  dK += dS^T Q run, then dQ^T = K^T dS^T; the next step's Q and dO are copied in meanwhile (two
  slots).
- dQ is a sum over KV blocks (and, for broadcast-Q, over the batch too, since every sequence
  reads the same Q rows), accumulated in fp32 `[rows, H * D]` and converted by the launcher.
  `DQ_MODE` picks how:
  tma (the default): the block is staged in shared memory and added by a TMA reduce-add
  (`cp.reduce.async.bulk`), `DQ_STAGES` buffers deep so the reduction of one block can overlap
  the next block's math;
  atomic: per-element fp32 atomic adds from registers;
  none: `_jfa_bwd` computes no dQ and `_jfa_bwd_dq` computes it deterministically (fixed order,
  no atomics; it recomputes P and dP, three more matmuls per block).

Q, dO, K and V arrive by TMA (descriptor loads into shared memory, one mbarrier for K and V,
one per Q / dO slot): no address or mask registers, and the rows a block reads past its
sequence's end (the next sequence's) are masked out of P.

The tiles are computed transposed (keys on the rows): P^T and dS^T are then the register
operand (A) of the dV and dK matmuls, the only operand wgmma can take from registers, and K, V,
Q and dO stay in shared memory.

Masks are the forward's (`fwd._tile_geometry`, `fwd._consume_block`): sequence end, symmetric
window |i - j| <= W, causal bottom-right j <= i + Lk - Lq. Peeled as in the forward, by a runtime
flag in the one loop: a block wholly inside both sequences, with no window or causal rule, skips
the mask arithmetic.

Instrumentation (`PROFILE`, `jfa_prof.records` layout): one tile record per tile (BLOCK is the
KV block, N_BLOCKS the query blocks visited), one span per program (role "compute"), and at
level 2 the cycles spent in the dQ staging's wait-and-refill (site "dq_stage").
"""
import os

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof.kernels import C_CACHE
from jfa_prof.kernels import profiling as prof
from jfa_prof.kernels.registry import KernelVariant, provider
from jfa_prof.records import BWD_ROLES, BWD_SITES

BLOCK_N = 128  # keys per tile: the dK/dV accumulators it owns
# Query rows per inner step: the N of the m64nNk16 wgmmas that make S^T, dP^T and dQ^T. With both
# operands in shared memory, N = 32 asks more of shared memory than it delivers (~1.5x of its 128
# B/clk per SM at the tensor cores' rate); N = 64 is at the limit. 64 was 1.21-1.28x faster on the
# H200 over three HSP points (benchmarks/results/bwd_variants_*.json). At D = 128 it leaves ptxas a few
# registers short: see the opaque buffer views in the step loop (`jfa-prof spills --kernel bwd`).
BLOCK_M = 64
NUM_WARPS = 8  # two warpgroups: each owns 64 of the block's keys in every wgmma
# Triton's software pipelining depth for the main kernel: 1, none. Its copies are written out, and
# at 2 the pipeliner, unable to pipeline the step loop's asynchronous wgmmas, waited for each right
# after issuing it (a wgmma wait(0) after every matmul in the SASS): S^T and dP^T ran one after the
# other, and P^T was not computed while dP^T ran. At 1 the waits are the ones written: 1.04-1.13x
# faster on the H200 (benchmarks/results/bwd_ab_stages1_*).
NUM_STAGES = 1
# The deterministic dQ kernel loads with tl.load and multiplies with tl.dot: the pipeliner's work.
DET_DQ_NUM_STAGES = 2
DELTA_ROWS = 16  # rows per program of the delta kernel
DELTA_WARPS = 4
DELTA_SCAN = 1024  # sequences per step of the tile-list prefix sum the delta kernel also builds
# The deterministic dQ kernel: a [64, D] fp32 accumulator, 64 keys per step; two warpgroups, since
# with one the offset tiles and accumulator spill.
DQ_BLOCK_M = 64
DQ_BLOCK_N = 64
DQ_WARPS = 8

DQ_MODES = {"atomic": 0, "tma": 1, "none": 2}
DQ_ATOMIC = tl.constexpr(DQ_MODES["atomic"])
DQ_TMA = tl.constexpr(DQ_MODES["tma"])
DQ_NONE = tl.constexpr(DQ_MODES["none"])
DEFAULT_DQ_STAGES = 2


# How the op reduces dQ, broadcast-Q (every tile adds into the same rows) and jagged Q alike: the TMA
# reduce-add. Per-element atomics took 1.2-1.5x longer on HSP points (bwd_variants_*).
DEFAULT_DQ = "tma"
SCHEDULES = ("static", "dynamic")  # round-robin, or an atomic queue
DEFAULT_SCHEDULE = "static"

# Switches for `jfa-prof waterfall --pass bwd`: they make the gradients wrong on purpose, so
# only `jfa_prof.ablations` reaches them (through `bwd_launch(ablate=)`), never the public op.
ABLATIONS = {
    "no_dq": (1, "no dQ at all: neither its matmul (dQ^T = K^T dS^T) nor its reduction; dK and dV still run"),
    "dq_no_reduce": (2, "dQ computed and written with plain stores instead of atomic / TMA adds: the same "
                        "bytes move, nothing is summed"),
    "no_mask": (4, "no mask arithmetic (sequence end, window, causal) on the recomputed P"),
}
assert tuple(BWD_ROLES) == ("compute", ) and tuple(BWD_SITES) == ("dq_stage", )

_LOG2E = tl.constexpr(1.4426950408889634)
_STORE_ROWS = tl.constexpr(16)  # dK / dV rows per store: 16 x 128 bf16 is one 16-byte vector per thread


@triton.jit(do_not_specialize=["total_rows", "H", "B"], c_cache=C_CACHE)
def _jfa_bwd_delta(o_ptr, do_ptr, delta_ptr, kv_offsets, tile_cum, total_rows, H, B, HEAD_DIM: tl.constexpr,
                   BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, SCAN: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    h = tl.program_id(1)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows < total_rows
    offs = (rows.to(tl.int64) * H + h)[:, None] * HEAD_DIM + cols[None, :]
    o = tl.load(o_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + h.to(tl.int64) * total_rows + rows, tl.sum(o * do, 1), mask=ok)
    # The main kernel's tile list: tile_cum[b] = KV blocks in the sequences before b. One program
    # scans it here rather than a chain of small tensor ops, each a launch of its own.
    if (tl.program_id(0) == 0) & (h == 0):
        tl.store(tile_cum, 0)
        carry = 0
        for start in range(0, B, SCAN):
            b = start + tl.arange(0, SCAN)
            in_batch = b < B
            lo = tl.load(kv_offsets + b, mask=in_batch, other=0)
            hi = tl.load(kv_offsets + b + 1, mask=in_batch, other=0)
            n_blocks = tl.cdiv(hi - lo, BLOCK_N).to(tl.int32)
            tl.store(tile_cum + 1 + b, carry + tl.cumsum(n_blocks, 0), mask=in_batch)
            carry += tl.sum(n_blocks, 0)


@triton.jit
def _head_base(row, n_heads, head, HEAD_DIM: tl.constexpr):
    """Element offset of (row, head, 0) in a contiguous [rows, heads, HEAD_DIM] tensor: 64-bit,
    since packed sequences can pass 2**31 elements."""
    return (row.to(tl.int64) * n_heads + head) * HEAD_DIM


@triton.jit
def _row_offsets(ROWS: tl.constexpr, row_stride, HEAD_DIM: tl.constexpr):
    """[ROWS, HEAD_DIM] offsets of a tile from its first element: 32-bit, half the registers of
    64-bit pointers for the whole tile."""
    return tl.arange(0, ROWS)[:, None] * row_stride + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _query_block_range(n0, Lq, Lk, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query blocks [m_lo, m_hi) with at least one row that may see a key of the KV block
    starting at n0 (the forward's `_tile_geometry`, solved for the query rows)."""
    n_last = tl.minimum(n0 + BLOCK_N, Lk) - 1
    q_lo = 0
    q_hi = Lq
    if HAS_WINDOW:
        # |i - j| <= W: rows within W of some key of the block.
        q_lo = tl.maximum(n0 - window, 0)
        q_hi = tl.minimum(q_hi, n_last + window + 1)
    if CAUSAL:
        # j <= i + Lk - Lq: the block's first key is seen from row n0 - (Lk - Lq) on.
        q_lo = tl.maximum(q_lo, n0 - (Lk - Lq))
    m_lo = q_lo // BLOCK_M
    m_hi = tl.where(q_hi > q_lo, tl.cdiv(q_hi, BLOCK_M), m_lo)
    return m_lo, m_hi


if os.environ.get("TRITON_INTERPRET") == "1":
    # Triton's interpreter has no inline asm, and no compiler hoisting to prevent either.
    @triton.jit
    def _opaque(x):
        return x
else:
    @triton.jit
    def _opaque(x):
        """x, through an instruction the compiler may not move: offset tiles built from it are
        rebuilt per tile instead of hoisted out of the persistent loop, where they would hold ~150
        registers for the whole kernel and push the accumulators into local memory."""
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


# Sequences whose prefix-sum entries one vector load fetches when decoding the next tile.
_SEARCH = tl.constexpr(32)


@triton.jit
def _find_tile(t, tile_cum, B, H_kv, b_from):
    """(batch, kv head, KV block) of tile `t` in the block-innermost order: `tile_cum[b]` is the
    number of KV blocks in sequences before b, so batch b owns tiles [tile_cum[b] * H_kv,
    tile_cum[b + 1] * H_kv); empty sequences own none.

    A program's tiles only move forward (round-robin and the queue both hand out increasing t), so
    t's batch is at or after `b_from`, the batch of the program's previous tile. One vector load of
    the next `_SEARCH` prefix-sum entries usually holds it: t's batch is the first whose tiles end
    past t. Only a jump beyond them falls back to a binary search of the rest, whose ten-odd
    dependent loads each wait a full memory latency. (A binary search for every tile had been
    1.05-1.09x slower on four HSP points: benchmarks/results/bwd_ab_window_decode_*.)"""
    pos = tl.arange(0, _SEARCH)
    idx = b_from + pos
    ends = tl.load(tile_cum + 1 + idx, mask=idx < B, other=0)
    before = (idx < B) & (ends * H_kv <= t)  # sequences that end at or before t
    n_before = tl.sum(before.to(tl.int32), 0)
    start = tl.load(tile_cum + b_from)
    if n_before < _SEARCH:
        b = b_from + n_before
        first = tl.where(n_before > 0, tl.sum(tl.where(pos == n_before - 1, ends, 0), 0), start)
        last = tl.sum(tl.where(pos == n_before, ends, 0), 0)
    else:
        # A binary search over the rest keeps lo the last batch starting at or before t.
        lo = b_from + _SEARCH - 1
        hi = B
        while hi - lo > 1:
            mid = (lo + hi) // 2
            go = tl.load(tile_cum + mid) * H_kv <= t
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        b = lo
        first = tl.load(tile_cum + lo)
        last = tl.load(tile_cum + lo + 1)
    r = t - first * H_kv
    n_blocks = last - first
    return b, r // n_blocks, r % n_blocks


@triton.jit
def _store_dq(dq_ptr, dq_desc, dq_stage, dq_t, H, h, q_row0, m0, m_ok, n_stored,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DQ_MODE: tl.constexpr, DQ_STAGES: tl.constexpr,
              NO_REDUCE: tl.constexpr):
    """Add a query block's dQ^T [HEAD_DIM, BLOCK_M] (fp32) into the [rows, H * HEAD_DIM] accumulator.
    NO_REDUCE (an ablation) overwrites instead: the bytes move, the sums are wrong."""
    if DQ_MODE == DQ_ATOMIC:
        offs = (q_row0 + m0 + tl.arange(0, BLOCK_M))[None, :].to(tl.int64) * (H * HEAD_DIM) \
            + (h * HEAD_DIM + tl.arange(0, HEAD_DIM))[:, None]
        if NO_REDUCE:
            tl.store(dq_ptr + offs, dq_t, mask=m_ok[None, :])
        else:
            # Relaxed: only the sum matters, and it is read after the kernel ends.
            tl.atomic_add(dq_ptr + offs, dq_t, mask=m_ok[None, :], sem="relaxed")
    else:
        # TMA reduce-add from shared memory, DQ_STAGES buffers deep: the bulk copy of one block
        # runs while the next block is computed. A buffer is refilled only once the copy that
        # last read it has (at most DQ_STAGES - 1 newer copies in flight); the thread that issued
        # the copies waits, and a CTA barrier holds the others until it has. Triton's shared-memory
        # hazard analysis places that barrier (and the one between the store and the copy) itself.
        # (Written out, in a build that still software-pipelined the step loop, they stopped the
        # pipeliner's prefetch of the step's loads: 4-9% slower, benchmarks/results/bwd_variants_*pipelined*.)
        # The buffer is [BLOCK_M, HEAD_DIM], like the accumulator's rows, so a box may start on any
        # row (a jagged sequence's first): dQ^T goes in through a transposed view. Rows past the
        # sequence end add exactly zero (their dS is zero), so the box needs no mask even where
        # those rows are the next sequence's; past the tensor's end TMA clips it.
        buf = tlx.local_view(dq_stage, n_stored % DQ_STAGES)
        tlx.async_descriptor_store_wait(DQ_STAGES - 1)
        tlx.local_store(tlx.local_trans(buf), dq_t)
        tlx.fence_async_shared()
        if NO_REDUCE:
            tlx.async_descriptor_store(dq_desc, buf, [q_row0 + m0, h * HEAD_DIM])
        else:
            tlx.async_descriptor_store(dq_desc, buf, [q_row0 + m0, h * HEAD_DIM], store_reduce="add")
    return n_stored + 1


@triton.jit
def _store_rows(buf, ptr, row_stride, n_rows, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [0, n_rows) of a [ROWS, HEAD_DIM] shared-memory tile to `ptr`, _STORE_ROWS rows at a time
    (a chunk's pointers fit in a few registers)."""
    cols = tl.arange(0, HEAD_DIM)
    for c in tl.static_range(ROWS // _STORE_ROWS):
        rows = c * _STORE_ROWS + tl.arange(0, _STORE_ROWS)
        chunk = tlx.local_load(tlx.local_slice(buf, [c * _STORE_ROWS, 0], [_STORE_ROWS, HEAD_DIM]))
        tl.store(ptr + rows[:, None] * row_stride + cols[None, :], chunk, mask=(rows < n_rows)[:, None])


@triton.jit
def _load_step(q_desc, do_desc, q_bufs, do_bufs, bars, slot, i, n_m, m_lo, kvh, GROUP, q_row0, o_row0,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Start the copies of step i's Q and dO blocks (query head kvh * GROUP + i // n_m, query block
    m_lo + i % n_m) into `slot`; one barrier counts both."""
    h = kvh * GROUP + i // n_m
    m0 = (m_lo + i % n_m) * BLOCK_M
    tlx.barrier_expect_bytes(bars[slot], 2 * BLOCK_M * HEAD_DIM * tlx.size_of(tlx.dtype_of(q_desc)))
    tlx.async_descriptor_load(q_desc, q_bufs[slot], [q_row0 + m0, h * HEAD_DIM], bars[slot])
    tlx.async_descriptor_load(do_desc, do_bufs[slot], [o_row0 + m0, h * HEAD_DIM], bars[slot])


# Lengths, head counts and the window change from batch to batch: specializing on their values
# (== 1, divisible by 16) would recompile per batch and make the launched binary differ from the
# one `jfa-prof spills` compiles from the registry.
@triton.jit(do_not_specialize=["H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "dkv_heads",
                               "tiles_off", "tile_cap", "spans_off", "waits_off"], c_cache=C_CACHE)
def _jfa_bwd(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, dq_desc, dk_ptr, dv_ptr, q_offsets, kv_offsets,
             tile_cum, queue, rec_ptr, sm_scale, H, GROUP, B, Lq_bcast, window, total_rows, dkv_heads,
             tiles_off, tile_cap, spans_off, waits_off,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             DQ_MODE: tl.constexpr, DQ_STAGES: tl.constexpr, DYNAMIC: tl.constexpr, PROFILE: tl.constexpr,
             ABLATE: tl.constexpr):
    dtype: tl.constexpr = tlx.dtype_of(q_desc)
    NO_DQ: tl.constexpr = (ABLATE & 1) != 0 or DQ_MODE == DQ_NONE
    NO_REDUCE: tl.constexpr = (ABLATE & 2) != 0
    NO_MASK: tl.constexpr = (ABLATE & 4) != 0
    H_kv = H // GROUP
    n_tiles = tl.load(tile_cum + B) * H_kv
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    # The tile's K and V stay resident; each step's Q and dO blocks arrive in one of two slots, the
    # next step's copy running while this one computes; dS^T goes through shared memory (two slots)
    # as the B operand of the dQ matmul.
    k_buf = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1)
    v_buf = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1)
    q_bufs = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, 2)
    do_bufs = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, 2)
    kv_bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    step_bars = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    if not NO_DQ:
        ds_bufs = tlx.local_alloc((BLOCK_N, BLOCK_M), dtype, 2)
    if DQ_MODE == DQ_TMA:
        dq_stage = tlx.local_alloc((BLOCK_M, HEAD_DIM), tl.float32, DQ_STAGES)
    else:
        dq_stage = 0
    n_stored = 0
    step = 0  # steps done by this program: slot and phase of step_bars
    n_tiles_done = 0  # phase of kv_bar
    if PROFILE:
        sm, span_t0, span_c0 = prof.span_start()
        dq_wait = tl.zeros([], tl.int64)
        dq_waits = tl.zeros([], tl.int64)
    # Tiles in block-innermost order: neighbouring tiles share the batch's Q / dO rows in L2.
    # Dealt round-robin, or (DYNAMIC) taken from a queue as programs free up (each program takes its
    # next tile when it starts one). Each tile is decoded while the one before it runs: the search's
    # loads then wait behind that tile's copies, not in front of them. (Also fetching the next tile's
    # K and V into L2 with a TMA prefetch, and storing whole dK / dV blocks by TMA, measured 1-3%
    # slower on three HSP points: benchmarks/results/bwd_variants_boundary_*.)
    if DYNAMIC:
        t = tl.atomic_add(queue, 1, sem="relaxed")
    else:
        t = pid
    b_next = 0
    kvh_next = 0
    blk_next = 0
    if t < n_tiles:
        b_next, kvh_next, blk_next = _find_tile(t, tile_cum, B, H_kv, 0)
    while t < n_tiles:
        if PROFILE:
            t0 = prof.globaltimer()
            c0 = tlx.clock64()
        b = b_next
        kvh = kvh_next
        blk = blk_next
        kv_start = tl.load(kv_offsets + b)
        Lk = tl.load(kv_offsets + b + 1) - kv_start
        n0 = blk * BLOCK_N
        if BROADCAST_Q:
            Lq = Lq_bcast
            q_row0 = 0  # every sequence reads Q rows [0, Lq) ...
            o_row0 = b * Lq_bcast  # ... and owns its own O / dO / lse rows
        else:
            q_row0 = tl.load(q_offsets + b)
            Lq = tl.load(q_offsets + b + 1) - q_row0
            o_row0 = q_row0
        n_ids = n0 + tl.arange(0, BLOCK_N)
        n_ok = n_ids < Lk
        kv_base = _head_base(kv_start + n0, H_kv, kvh, HEAD_DIM)
        m_lo, m_hi = _query_block_range(n0, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
        n_m = m_hi - m_lo
        n_steps = GROUP * n_m
        # Every warp is done with the previous tile's matmuls before its K and V are overwritten.
        tl.debug_barrier()
        # K, V and the first step's Q and dO: four copies in flight at once. Rows past the sequence
        # end hold the next sequence's keys (zeros past the tensor's end); the mask zeroes their
        # P, and their dK / dV rows are never stored.
        tlx.barrier_expect_bytes(kv_bar[0], 2 * BLOCK_N * HEAD_DIM * tlx.size_of(dtype))
        tlx.async_descriptor_load(k_desc, k_buf[0], [kv_start + n0, kvh * HEAD_DIM], kv_bar[0])
        tlx.async_descriptor_load(v_desc, v_buf[0], [kv_start + n0, kvh * HEAD_DIM], kv_bar[0])
        if n_steps > 0:
            _load_step(q_desc, do_desc, q_bufs, do_bufs, step_bars, step % 2, 0, n_m, m_lo, kvh, GROUP, q_row0,
                       o_row0, HEAD_DIM, BLOCK_M)
        if DYNAMIC:
            t_next = tl.atomic_add(queue, 1, sem="relaxed")
        else:
            t_next = t + n_progs
        if t_next < n_tiles:
            b_next, kvh_next, blk_next = _find_tile(t_next, tile_cum, B, H_kv, b)
        qk_scale = sm_scale * _LOG2E  # exponentials in base 2, as in the forward
        kv_full = n0 + BLOCK_N <= Lk
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        tlx.barrier_wait(kv_bar[0], n_tiles_done & 1)
        for i in range(n_steps):
            slot = step % 2
            h = kvh * GROUP + i // n_m
            m0 = (m_lo + i % n_m) * BLOCK_M
            m_ids = m0 + tl.arange(0, BLOCK_M)
            m_ok = m_ids < Lq
            stat_offs = h.to(tl.int64) * total_rows + o_row0 + m_ids
            lse = tl.load(lse_ptr + stat_offs, mask=m_ok, other=0.0)
            delta = tl.load(delta_ptr + stat_offs, mask=m_ok, other=0.0)
            tlx.barrier_wait(step_bars[slot], (step // 2) & 1)
            # Buffer views through an opaque index: the compiler then rebuilds each wgmma's shared-memory
            # descriptors inside the step (an add and a mask each) instead of computing ~40 of them
            # before the loop and keeping them, which left too few registers and spilled them to local
            # memory, reloaded every step: 240 -> 4 spilled bytes per thread at D = 128, and the
            # kernel 1.10-1.17x faster on the H200 (benchmarks/results/bwd_ab_*).
            slot_o = _opaque(slot)
            k_s = k_buf[_opaque(0)]
            v_s = v_buf[_opaque(0)]
            q_s = q_bufs[slot_o]
            do_s = do_bufs[slot_o]
            # S^T = K Q^T and dP^T = V dO^T go to the tensor cores together; P^T is computed while
            # dP^T runs. (Issuing dV before dP^T is waited for holds P^T's registers longer: more spills.)
            qk_t = tlx.async_dot(k_s, tlx.local_trans(q_s))
            dp_t = tlx.async_dot(v_s, tlx.local_trans(do_s))
            qk_t = tlx.async_dot_wait(1, qk_t)
            # P recomputed from the saved log-sum-exp. A row that saw no key has lse = -inf
            # and no visible entry, so the select, not the exponential, makes its P zero.
            p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :] * _LOG2E)
            # Peeled: a block wholly inside both sequences, with no window or causal rule,
            # skips the mask arithmetic (a runtime branch, one loop: see fwd's peeling note).
            if not NO_MASK:
                if HAS_WINDOW or CAUSAL or not kv_full or m0 + BLOCK_M > Lq:
                    visible = n_ok[:, None] & m_ok[None, :]
                    if HAS_WINDOW:
                        diff = m_ids[None, :] - n_ids[:, None]
                        visible = visible & (diff <= window) & (diff >= -window)
                    if CAUSAL:
                        visible = visible & (n_ids[:, None] <= m_ids[None, :] + (Lk - Lq))
                    p_t = tl.where(visible, p_t, 0.0)
            dp_t = tlx.async_dot_wait(0, dp_t)
            ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)
            dv = tlx.async_dot(p_t.to(dtype), do_s, dv)
            dk = tlx.async_dot(ds_t, q_s, dk)
            if not NO_DQ:
                ds_s = ds_bufs[slot_o]
                tlx.local_store(ds_s, ds_t)
                tlx.fence("async_shared")
            # Every warp has finished the previous step (its matmuls were waited for), so the next
            # step's Q and dO may overwrite the slot that step read; and this step's dS^T is whole.
            tl.debug_barrier()
            if i + 1 < n_steps:
                _load_step(q_desc, do_desc, q_bufs, do_bufs, step_bars, (step + 1) % 2, i + 1, n_m, m_lo, kvh,
                           GROUP, q_row0, o_row0, HEAD_DIM, BLOCK_M)
            if not NO_DQ:
                # dQ^T = K^T dS^T keeps the block's 128 keys as the reduction dimension and the
                # head dim as wgmma's M.
                dq_t = tlx.async_dot(tlx.local_trans(k_s), ds_s)
                dq_t = tlx.async_dot_wait(0, dq_t) * sm_scale
                if PROFILE >= 2 and DQ_MODE == DQ_TMA:
                    w0 = tlx.clock64()
                n_stored = _store_dq(dq_ptr, dq_desc, dq_stage, dq_t, H, h, q_row0, m0, m_ok, n_stored,
                                     HEAD_DIM, BLOCK_M, DQ_MODE, DQ_STAGES, NO_REDUCE)
                if PROFILE >= 2 and DQ_MODE == DQ_TMA:
                    dq_wait += tlx.clock64() - w0
                    dq_waits += 1
            dv = tlx.async_dot_wait(0, dv)
            dk = tlx.async_dot_wait(0, dk)
            step += 1
        n_tiles_done += 1
        # dK and dV leave through the K and V buffers, free once every warp is past the last
        # matmul: written from the accumulators' layout, read back in row chunks in a layout that
        # stores coalesced. (Converting in registers would take a 32 KB scratch buffer the kernel
        # has no room for.) Keys no query sees still get their (zero) rows written: dK and dV come
        # from torch.empty; rows past the sequence end belong to the next sequence and are skipped.
        tl.debug_barrier()
        tlx.local_store(k_buf[0], (dk * sm_scale).to(dtype))
        tlx.local_store(v_buf[0], dv.to(dtype))
        tl.debug_barrier()
        # The head count goes through `_opaque` so the chunks' offsets are built per tile, not
        # hoisted out of the persistent loop into registers the accumulators need.
        row_stride = _opaque(dkv_heads) * HEAD_DIM
        _store_rows(k_buf[0], dk_ptr + kv_base, row_stride, Lk - n0, BLOCK_N, HEAD_DIM)
        _store_rows(v_buf[0], dv_ptr + kv_base, row_stride, Lk - n0, BLOCK_N, HEAD_DIM)
        if PROFILE:
            prof.write_tile(rec_ptr, tiles_off, tile_cap, t, pid, sm, t, b, kvh, blk, Lk,
                            n_steps, t0, prof.globaltimer(), c0, tlx.clock64(), 0)
        t = t_next
    if DQ_MODE == DQ_TMA:
        tlx.async_descriptor_store_wait(0)  # the last copies read shared memory until they finish
    if PROFILE:
        prof.write_span(rec_ptr, spans_off, pid, 0, 1, sm, span_t0, prof.globaltimer(), span_c0, tlx.clock64(),
                        n_tiles_done)
        if PROFILE >= 2:
            prof.write_wait(rec_ptr, waits_off, pid, 0, 1, 0, 1, dq_wait, dq_waits)


@triton.jit(do_not_specialize=["H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "rows_q", "batch_chunk"],
            c_cache=C_CACHE)
def _jfa_bwd_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, q_offsets, kv_offsets, sm_scale, H, GROUP,
                B, Lq_bcast, window, total_rows, rows_q, batch_chunk,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Deterministic dQ: one program per (query block, head, part) sums dS K over its KV blocks in
    a fixed order and stores, no atomics. For broadcast-Q a part is a fixed run of `batch_chunk`
    sequences writing its own slice of `dq_ptr` ([parts, rows_q, H * HEAD_DIM]), which the
    launcher sums in a fixed order; for jagged Q a part is one sequence (its rows are its own)."""
    dtype: tl.constexpr = q_ptr.dtype.element_ty
    m_blk = tl.program_id(0)
    h = tl.program_id(1)
    part = tl.program_id(2)
    H_kv = H // GROUP
    kvh = h // GROUP
    m0 = m_blk * BLOCK_M
    m_ids = m0 + tl.arange(0, BLOCK_M)
    q_row_offs = _row_offsets(BLOCK_M, H * HEAD_DIM, HEAD_DIM)
    qk_scale = sm_scale * _LOG2E
    if BROADCAST_Q:
        b_lo = part * batch_chunk
        b_hi = tl.minimum(b_lo + batch_chunk, B)
        q_row0 = 0
        Lq = Lq_bcast
        slice_base = part.to(tl.int64) * rows_q * H * HEAD_DIM
    else:
        b_lo = part
        b_hi = part + 1
        q_row0 = tl.load(q_offsets + part)
        Lq = tl.load(q_offsets + part + 1) - q_row0
        slice_base = tl.zeros([], tl.int64)
    m_ok = m_ids < Lq
    if m0 < Lq:
        q = tl.load(q_ptr + _head_base(q_row0 + m0, H, h, HEAD_DIM) + q_row_offs, mask=m_ok[:, None], other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for b in range(b_lo, b_hi):
            kv_start = tl.load(kv_offsets + b)
            Lk = tl.load(kv_offsets + b + 1) - kv_start
            o_row0 = b * Lq_bcast if BROADCAST_Q else q_row0
            stat_offs = h.to(tl.int64) * total_rows + o_row0 + m_ids
            do = tl.load(do_ptr + _head_base(o_row0 + m0, H, h, HEAD_DIM)
                         + _row_offsets(BLOCK_M, _opaque(H * HEAD_DIM), HEAD_DIM), mask=m_ok[:, None], other=0.0)
            lse = tl.load(lse_ptr + stat_offs, mask=m_ok, other=0.0)
            delta = tl.load(delta_ptr + stat_offs, mask=m_ok, other=0.0)
            # KV blocks any row of this query block can see (the forward's `_tile_geometry`).
            n_lo = 0
            n_hi = Lk
            if HAS_WINDOW:
                n_lo = tl.maximum(m0 - window, 0)
                n_hi = tl.minimum(n_hi, m0 + BLOCK_M + window)
            if CAUSAL:
                n_hi = tl.minimum(n_hi, m0 + BLOCK_M + Lk - Lq)
            for n0 in range((n_lo // BLOCK_N) * BLOCK_N, n_hi, BLOCK_N):
                n_ids = n0 + tl.arange(0, BLOCK_N)
                n_ok = n_ids < Lk
                kv_base = _head_base(kv_start + n0, H_kv, kvh, HEAD_DIM)
                kv_row_offs = _row_offsets(BLOCK_N, _opaque(H_kv * HEAD_DIM), HEAD_DIM)
                k = tl.load(k_ptr + kv_base + kv_row_offs, mask=n_ok[:, None], other=0.0)
                v = tl.load(v_ptr + kv_base + kv_row_offs, mask=n_ok[:, None], other=0.0)
                visible = m_ok[:, None] & n_ok[None, :]
                if HAS_WINDOW:
                    diff = m_ids[:, None] - n_ids[None, :]
                    visible = visible & (diff <= window) & (diff >= -window)
                if CAUSAL:
                    visible = visible & (n_ids[None, :] <= m_ids[:, None] + (Lk - Lq))
                p = tl.where(visible, tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None] * _LOG2E), 0.0)
                dp = tl.dot(do, tl.trans(v))
                ds = (p * (dp - delta[:, None])).to(dtype)
                dq += tl.dot(ds, k)
        offs = (q_row0 + m_ids)[:, None].to(tl.int64) * (H * HEAD_DIM) + (h * HEAD_DIM + tl.arange(0, HEAD_DIM))[None, :]
        tl.store(dq_ptr + slice_base + offs, dq * sm_scale, mask=m_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Variants: every constexpr combination the op can launch, by name.
# ---------------------------------------------------------------------------------------------
def bwd_signature(dtype: str, head_dim: int) -> dict[str, str]:
    q_block = f"tensordesc<{dtype}[{BLOCK_M},{head_dim}]>"
    kv_block = f"tensordesc<{dtype}[{BLOCK_N},{head_dim}]>"
    sig = {"q_desc": q_block, "k_desc": kv_block, "v_desc": kv_block, "do_desc": q_block,
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": "*fp32",
           "dq_desc": f"tensordesc<fp32[{BLOCK_M},{head_dim}]>",
           "dk_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}", "q_offsets": "*i32", "kv_offsets": "*i32",
           "tile_cum": "*i32", "queue": "*i32", "rec_ptr": "*i64", "sm_scale": "fp32"}
    for name in ("H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "dkv_heads", "tiles_off",
                 "tile_cap", "spans_off", "waits_off"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BROADCAST_Q", "CAUSAL", "HAS_WINDOW", "DQ_MODE", "DQ_STAGES",
                 "DYNAMIC", "PROFILE", "ABLATE"):
        sig[name] = "constexpr"
    return sig


def bwd_constexprs(*, head_dim, broadcast_q, causal, has_window, dq="tma", dq_stages=DEFAULT_DQ_STAGES,
                   schedule=DEFAULT_SCHEDULE, profile=0, ablate=0, block_m=BLOCK_M) -> dict:
    """`dq`: "atomic", "tma" or "deterministic" (this kernel then leaves dQ to `_jfa_bwd_dq`)."""
    return {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": BLOCK_N, "BROADCAST_Q": broadcast_q,
            "CAUSAL": causal, "HAS_WINDOW": has_window,
            "DQ_MODE": DQ_MODES["none" if dq == "deterministic" else dq], "DQ_STAGES": dq_stages,
            "DYNAMIC": schedule == "dynamic", "PROFILE": int(profile), "ABLATE": ablate}


def dq_signature(dtype: str) -> dict[str, str]:
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "do_ptr": f"*{dtype}",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": "*fp32", "q_offsets": "*i32", "kv_offsets": "*i32",
           "sm_scale": "fp32"}
    for name in ("H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "rows_q", "batch_chunk"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BROADCAST_Q", "CAUSAL", "HAS_WINDOW"):
        sig[name] = "constexpr"
    return sig


def dq_constexprs(*, head_dim, broadcast_q, causal, has_window) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": DQ_BLOCK_M, "BLOCK_N": DQ_BLOCK_N, "BROADCAST_Q": broadcast_q,
            "CAUSAL": causal, "HAS_WINDOW": has_window}


def delta_signature(dtype: str) -> dict[str, str]:
    return {"o_ptr": f"*{dtype}", "do_ptr": f"*{dtype}", "delta_ptr": "*fp32", "kv_offsets": "*i32",
            "tile_cum": "*i32", "total_rows": "i32", "H": "i32", "B": "i32", "HEAD_DIM": "constexpr",
            "BLOCK_ROWS": "constexpr", "BLOCK_N": "constexpr", "SCAN": "constexpr"}


def delta_constexprs(*, head_dim) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_ROWS": DELTA_ROWS, "BLOCK_N": BLOCK_N, "SCAN": DELTA_SCAN}


# Every mask combination the op can launch (causal is jagged-only): (BROADCAST_Q, CAUSAL, HAS_WINDOW).
MODES = {"bcast": (True, False, False), "bcast-window": (True, False, True), "jagged": (False, False, False),
         "jagged-causal": (False, True, False), "jagged-window": (False, False, True),
         "jagged-causal-window": (False, True, True)}
# dQ reductions by variant-name part: (dq mode, staging buffers).
DQ_VARIANTS = {"tma2": ("tma", 2), "tma1": ("tma", 1), "atomic": ("atomic", 1), "det": ("deterministic", 1)}


def _main_variant(mode, dtype, head_dim, dq_name, schedule="static", profile=0) -> KernelVariant:
    broadcast_q, causal, has_window = MODES[mode]
    dq, stages = DQ_VARIANTS[dq_name]
    name = f"bwd/{mode}/{dtype}/d{head_dim}/{dq_name}"
    if schedule != DEFAULT_SCHEDULE:
        name += f"/{schedule}"
    if profile:
        name += f"/prof{profile}"
    return KernelVariant(
        name=name, kernel=_jfa_bwd, signature=bwd_signature(dtype, head_dim),
        constexprs=bwd_constexprs(head_dim=head_dim, broadcast_q=broadcast_q, causal=causal, has_window=has_window,
                                  dq=dq, dq_stages=stages, schedule=schedule, profile=profile),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        tags={"pass": "bwd", "mode": mode, "dtype": dtype, "head_dim": str(head_dim), "dq": dq_name,
              "schedule": schedule, "profile": str(profile)})


@provider
def bwd_variants() -> list[KernelVariant]:
    """Per mask mode, dtype and head dim: the main kernel with the op's dQ reduction (TMA, 2
    stages) and the deterministic pair (main kernel without dQ, dQ kernel); the delta kernel per dtype and head dim (no mask, so one serves every mode).
    For broadcast-Q bf16 D=128, the HSP case: every other dQ reduction, the dynamic queue, and
    both PROFILE levels."""
    out = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for mode, (broadcast_q, causal, has_window) in MODES.items():
                out.append(_main_variant(mode, dtype, head_dim, "tma2"))
                out.append(_main_variant(mode, dtype, head_dim, "det"))
                out.append(KernelVariant(
                    name=f"bwd/{mode}/{dtype}/d{head_dim}/dq-det", kernel=_jfa_bwd_dq, signature=dq_signature(dtype),
                    constexprs=dq_constexprs(head_dim=head_dim, broadcast_q=broadcast_q, causal=causal,
                                             has_window=has_window),
                    num_warps=DQ_WARPS, num_stages=DET_DQ_NUM_STAGES,
                    tags={"pass": "bwd", "mode": mode, "dtype": dtype, "head_dim": str(head_dim), "dq": "det-dq"}))
            out.append(KernelVariant(
                name=f"bwd/delta/{dtype}/d{head_dim}", kernel=_jfa_bwd_delta, signature=delta_signature(dtype),
                constexprs=delta_constexprs(head_dim=head_dim), num_warps=DELTA_WARPS, num_stages=1,
                tags={"pass": "bwd", "mode": "delta", "dtype": dtype, "head_dim": str(head_dim)}))
    out += [_main_variant("bcast", "bf16", 128, dq) for dq in ("tma1", "atomic")]
    out += [_main_variant("bcast", "bf16", 128, "tma2", schedule="dynamic")]
    out += [_main_variant("bcast", "bf16", 128, "tma2", profile=p) for p in (1, 2)]
    return out
