"""Jagged Flash Attention backward for Hopper (sm_90a).

The main kernel is TLX: shared-memory buffers, mbarriers and asynchronous wgmma written out;
the two helper kernels are plain Triton. Kernels:

- `_jfa_bwd_delta`: delta = rowsum(dO * O) in fp32, `[H, rows]` like the log-sum-exp. It is the
  row term of the softmax gradient, dS = P * (dP - delta), computed once instead of once per
  KV block. Its first program also builds the main kernel's tile list (below).
- `_jfa_bwd`: persistent and warp-specialized. Its tiles are the valid (batch, kv head, KV block of
  `BLOCK_N` keys) triples, block-innermost; the list is a prefix sum of KV blocks per sequence built
  on the GPU (no host sync), searched from the previous tile's batch on (`_find_tile`), so empty
  sequences make no tiles. Tiles are dealt round-robin (broadcast-Q's default), or taken from an
  atomic queue (dynamic; jagged Q's default, `default_schedule`). A tile keeps its K and V block
  resident, walks the query heads of the kv head's group and, for
  each, the query blocks that can see this KV block, recomputing P from Q, K and the saved
  log-sum-exp. dK and dV are summed over the whole group in registers and written once, so GQA
  needs no second reduction pass.
  Roles: a producer warpgroup (few registers) decodes the tiles and hands each to the consumers
  through a shared-memory mailbox, copies K / V per tile and Q / dO (with the rows' log-sum-exp
  and delta) per step into two slots, a step ahead, and issues the dQ reduce-adds. Two consumer
  warpgroups (240 registers each) own 64 of the tile's keys each. Per step (one query block of one
  head): S^T = K Q^T and dP^T = V dO^T go to the tensor cores together (the two consumers in
  turn, consumer 1 first) and P^T is computed while dP^T runs; dS^T goes to shared memory while
  dV += P^T dO runs, then dQ^T = K^T dS^T, which needs both consumers' halves of dS^T (a named
  barrier between the two), then dK += dS^T Q, which runs while dQ^T is staged for the producer.
  Against the same step run by two warpgroups that also issued the copies and the reduce-adds
  (8 warps, no producer): 1.06-1.14x faster on the H200
  (benchmarks/results/variants/bwd_ab_warp_specialized_*).
- dQ is a sum over KV blocks (and, for broadcast-Q, over the batch too, since every sequence
  reads the same Q rows), accumulated in fp32 `[rows, H * D]` and converted by the launcher.
  `DQ_MODE` picks how:
  tma (the default): the block is staged in shared memory and added by a TMA reduce-add
  (`cp.reduce.async.bulk`), `DQ_STAGES` buffers deep so the reduction of one block can overlap
  the next block's math;
  atomic: per-element fp32 atomic adds from registers;
  none: `_jfa_bwd` computes no dQ and `_jfa_bwd_dq` computes it deterministically (fixed order,
  no atomics; it recomputes P and dP, three more matmuls per block).

Q, dO, K and V arrive by TMA (descriptor loads into shared memory, full / empty mbarriers per
buffer): no address or mask registers in the consumers, and the rows a block reads past its
sequence's end (the next sequence's) are masked out of P.

The tiles are computed transposed (keys on the rows): P^T and dS^T are then the register
operand (A) of the dV and dK matmuls, the only operand wgmma can take from registers, and K, V,
Q and dO stay in shared memory.

Masks are the forward's (`fwd._tile_geometry`, `fwd._consume_block`): sequence end, symmetric
window |i - j| <= W, causal bottom-right j <= i + Lk - Lq. Peeled as in the forward, by a runtime
flag in the one loop: a block wholly inside both sequences, with no window and below the causal
diagonal, skips the mask arithmetic.

Instrumentation (`PROFILE`, `jfa_prof.records` layout): a span per program for the producer (role
"producer") and, from the first consumer, one for the consumers (role "compute"), one tile record
per tile (BLOCK is the KV block, N_BLOCKS the query blocks visited); at level 2 the cycles each
role spent at its wait sites (`records.ROLE_SITES`), at level 3 also one event record per tile and
role: its window, a mark and its waits within the tile.
"""
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof.kernels import C_CACHE
from jfa_prof.kernels import profiling as prof
from jfa_prof.kernels import tma
from jfa_prof.kernels.registry import KernelVariant, provider
from jfa_prof.records import BWD_ROLES, BWD_SITES, ROLE_SITES

BLOCK_N = 128  # keys per tile: the dK/dV accumulators it owns
# Query rows per inner step: the N of the m64nNk16 wgmmas that make S^T, dP^T and dQ^T. With both
# operands in shared memory, N = 32 asks more of shared memory than it delivers (~1.5x of its 128
# B/clk per SM at the tensor cores' rate); N = 64 is at the limit. 64 was 1.21-1.28x faster on the
# H200 over three HSP points (benchmarks/results/variants/bwd_variants_*.json). At D = 128 it leaves ptxas a few
# registers short: see the opaque buffer views in the step loop (`jfa-prof spills --kernel bwd`).
BLOCK_M = 64
NUM_WARPS = 4  # the producer (default task); each consumer adds 4 more
CONSUMER_REGS = tl.constexpr(240)  # per consumer thread (setmaxnreg); the producer keeps the rest
# Triton's software pipelining depth for the main kernel: 1, none. Its copies are written out, and
# at 2 the pipeliner, unable to pipeline the step loop's asynchronous wgmmas, waited for each right
# after issuing it (a wgmma wait(0) after every matmul in the SASS): S^T and dP^T ran one after the
# other, and P^T was not computed while dP^T ran. At 1 the waits are the ones written: 1.04-1.13x
# faster on the H200 (benchmarks/results/variants/bwd_ab_stages1_*).
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
DEFAULT_DQ_STAGES = 1


# How the op reduces dQ, broadcast-Q (every tile adds into the same rows) and jagged Q alike: the TMA
# reduce-add. Per-element atomics took 1.2-1.5x longer on HSP points (bwd_variants_*).
DEFAULT_DQ = "tma"
SCHEDULES = ("static", "dynamic")  # round-robin, or an atomic queue


def default_schedule(broadcast_q: bool) -> str:
    """The op's schedule. Jagged Q: the queue. Its tiles' costs follow their sequence's query count and,
    causal, their place on the diagonal (a KV block sees the query blocks from its own on), and
    round-robin deals them by a stride that repeats with the blocks per sequence: causal, the queue's
    kernel took 0.56-0.66 of round-robin's time, not causal 0.91 at s=0.5 and 1.00 at s=1, on the
    H200 (benchmarks/results/variants/bwd_schedule_ab_*). Broadcast-Q: round-robin, whose tiles of one
    sequence cost the same; the queue was 0.98-1.05 of its time over the HSP grid, 2-5% slower at five
    of its longest points."""
    return "static" if broadcast_q else "dynamic"

# Switches for `jfa-prof waterfall --pass bwd`: they make the gradients wrong on purpose, so
# only `jfa_prof.ablations` reaches them (through `bwd_launch(ablate=)`), never the public op.
ABLATIONS = {
    "no_dq": (1, "no dQ at all: neither its matmul (dQ^T = K^T dS^T) nor its reduction; dK and dV still run"),
    "dq_no_reduce": (2, "dQ computed and written with plain stores instead of atomic / TMA adds: the same "
                        "bytes move, nothing is summed"),
    "no_mask": (4, "no mask arithmetic (sequence end, window, causal) on the recomputed P"),
    "no_dkv_store": (32, "dK and dV staged in shared memory but never written to global memory"),
}
# Planted bottlenecks (a known cause for a diagnosis to find); same door as the ablations, the
# gradients stay right.
PLANT_CYCLES = 3000  # about 1.5 us at the H200's 1.98 GHz: above a step's time
_PLANT_CYCLES = tl.constexpr(PLANT_CYCLES)
PLANTS = {
    "slow_producer": (8, f"the producer spins {PLANT_CYCLES} cycles before each step's Q / dO loads"),
    "slow_dq": (16, f"the producer spins {PLANT_CYCLES} cycles before each dQ reduce-add (a contended reduction)"),
}
assert tuple(BWD_ROLES) == ("producer", "compute")
_N_ROLES = tl.constexpr(len(BWD_ROLES))
_N_SITES = tl.constexpr(len(BWD_SITES))
# Each role's sites in its records, in the order its accumulators are passed (records.ROLE_SITES).
_PRODUCER_SITES = tl.constexpr(tuple(BWD_SITES.index(s) for s in ROLE_SITES["bwd"]["producer"]))
_COMPUTE_SITES = tl.constexpr(tuple(BWD_SITES.index(s) for s in ROLE_SITES["bwd"]["compute"]))
_R_PRODUCER = tl.constexpr(0)
_R_COMPUTE = tl.constexpr(1)

_LOG2E = tl.constexpr(1.4426950408889634)
_STORE_ROWS = tl.constexpr(16)  # dK / dV rows per store: 16 x 128 bf16 is one 16-byte vector per thread


@triton.jit(do_not_specialize=["total_rows", "H", "B", "dq_rows", "zero_queue"], c_cache=C_CACHE)
def _jfa_bwd_delta(o_ptr, do_ptr, delta_ptr, kv_offsets, tile_cum, dq_ptr, queue, total_rows, H, B, dq_rows,
                   zero_queue, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                   SCAN: tl.constexpr):
    """Also zeroes the first `dq_rows` rows of the fp32 dQ accumulator (`[rows, H, HEAD_DIM]`; at
    most total_rows) and, where `zero_queue`, the dynamic schedule's counter: two fills fewer to
    launch before the main kernel."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    h = tl.program_id(1)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows < total_rows
    offs = (rows.to(tl.int64) * H + h)[:, None] * HEAD_DIM + cols[None, :]
    o = tl.load(o_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + h.to(tl.int64) * total_rows + rows, tl.sum(o * do, 1), mask=ok)
    tl.store(dq_ptr + offs, tl.zeros([BLOCK_ROWS, HEAD_DIM], tl.float32), mask=(rows < dq_rows)[:, None])
    # The main kernel's tile list: tile_cum[b] = KV blocks in the sequences before b. One program
    # scans it here rather than a chain of small tensor ops, each a launch of its own.
    if (tl.program_id(0) == 0) & (h == 0):
        if zero_queue != 0:
            tl.store(queue, 0)
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


# x through an instruction the compiler may not move: offset tiles built from it are rebuilt per tile
# instead of hoisted out of the persistent loop, where they would hold ~150 registers for the whole
# kernel and push the accumulators into local memory.
_opaque = prof.opaque


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
    1.05-1.09x slower on four HSP points: benchmarks/results/variants/bwd_ab_window_decode_*.)"""
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


# Named barriers (ids 0..8 are left to the compiler).
_STEP_BAR = tl.constexpr(9)  # + step parity: both consumers' halves of dS^T are in shared memory
_EPI_BAR = tl.constexpr(11)  # both consumers are past the tile's last dQ^T matmul, which reads all of K and dS^T
_WG_BAR = tl.constexpr(12)  # + consumer id: one consumer warpgroup's own barrier
_PRODUCER_BAR = tl.constexpr(14)  # the producer warpgroup's own barrier (mailbox hand-off)
_TURN_BAR = tl.constexpr(15)  # each step: consumer 1 has issued S^T and dP^T, consumer 0 may issue its own
_CONSUMER_THREADS = tl.constexpr(256)
_WARPGROUP_THREADS = tl.constexpr(128)
# The tile mailbox: four fields (batch, -1 once the tiles are exhausted; kv head; KV block; tile
# index) of 32 words each, so that each producer thread stores one word and no two store to one address.
_BOX_WORDS = tl.constexpr(128)
_FIELD_WORDS = tl.constexpr(32)


@triton.jit
def _post_tile(box, full, empty, n, b, kvh, blk, t, cycles, count, PROFILE: tl.constexpr):
    """Producer: hand the n-th tile (batch b < 0: none left) to both consumers through box slot n % 2."""
    cycles, count = prof.timed_wait(empty[n % 2], ((n // 2) & 1) ^ 1, cycles, count, PROFILE)
    word = tl.arange(0, _BOX_WORDS)
    field = word // _FIELD_WORDS
    vals = tl.where(field == 0, b, tl.where(field == 1, kvh, tl.where(field == 2, blk, t)))
    tlx.local_store(box[n % 2], vals)
    # Every producer thread's word is in before the one elected thread signals the box full.
    tlx.named_barrier_wait(_PRODUCER_BAR, _WARPGROUP_THREADS)
    tlx.barrier_arrive(full[n % 2], 1)
    return cycles, count


@triton.jit
def _take_tile(box, full, empty, n, cid: tl.constexpr):
    """Consumer: read the n-th tile, and give the slot back once every thread of the warpgroup has."""
    tlx.barrier_wait(full[n % 2], (n // 2) & 1)
    slot = box[n % 2]
    b = tl.sum(tlx.local_load(tlx.local_slice(slot, [0], [1])), 0)
    kvh = tl.sum(tlx.local_load(tlx.local_slice(slot, [_FIELD_WORDS], [1])), 0)
    blk = tl.sum(tlx.local_load(tlx.local_slice(slot, [2 * _FIELD_WORDS], [1])), 0)
    t = tl.sum(tlx.local_load(tlx.local_slice(slot, [3 * _FIELD_WORDS], [1])), 0)
    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
    tlx.barrier_arrive(empty[n % 2], 1)
    return b, kvh, blk, t


@triton.jit
def _sequence(b, q_offsets, kv_offsets, Lq_bcast, BROADCAST_Q: tl.constexpr):
    """(first key row, key count, query count, first Q row, first O / dO / lse row) of batch b."""
    kv_start = tl.load(kv_offsets + b)
    Lk = tl.load(kv_offsets + b + 1) - kv_start
    if BROADCAST_Q:
        return kv_start, Lk, Lq_bcast, 0, b * Lq_bcast  # every sequence reads Q rows [0, Lq)
    else:
        q_row0 = tl.load(q_offsets + b)
        return kv_start, Lk, tl.load(q_offsets + b + 1) - q_row0, q_row0, q_row0


@triton.jit
def _reduce_dq(dq_desc, dq_stage, fulls, empties, s, row, col, cycles, count, busy, n_busy, DQ_STAGES: tl.constexpr,
               NO_REDUCE: tl.constexpr, SLOW: tl.constexpr, PROFILE: tl.constexpr):
    """Producer: add step s's dQ block, staged by the consumers, into the fp32 accumulator with a
    TMA reduce-add; then give back the staging buffer whose copy has finished reading it (at most
    DQ_STAGES - 1 newer copies stay in flight). NO_REDUCE (an ablation) overwrites instead.
    At PROFILE level 2 the wait for the staged block is timed (site "dq_full") and so is the rest,
    issuing the reduce-add and waiting for older ones to finish (site "dq_reduce": a reduction that
    cannot keep up shows there)."""
    idx = s % DQ_STAGES
    cycles, count = prof.timed_wait(fulls[idx], (s // DQ_STAGES) & 1, cycles, count, PROFILE)
    if PROFILE >= 2:
        t0 = prof.clock32()
    if SLOW:
        prof.spin(_PLANT_CYCLES)
    # The box may start on any row (a jagged sequence's first): rows past the sequence end add
    # exactly zero (their dS is zero), so it needs no mask; past the tensor's end TMA clips it.
    if NO_REDUCE:
        tlx.async_descriptor_store(dq_desc, dq_stage[idx], [row, col])
    else:
        tlx.async_descriptor_store(dq_desc, dq_stage[idx], [row, col], store_reduce="add")
    tlx.async_descriptor_store_wait(DQ_STAGES - 1)
    if PROFILE >= 2:
        busy += prof.clock32() - t0
        n_busy += 1
    done = s - (DQ_STAGES - 1)
    if done >= 0:
        tlx.barrier_arrive(empties[done % DQ_STAGES], 1)
    return cycles, count, busy, n_busy


@triton.jit
def _stage_dq(dq_stage, fulls, empties, s, dq_t, col0, cid: tl.constexpr, cycles, count, ARRIVALS: tl.constexpr,
              DQ_STAGES: tl.constexpr, PROFILE: tl.constexpr):
    """Consumer: write dQ^T rows [col0, col0 + rows) of step s into its staging buffer for the
    producer's reduce-add. ARRIVALS: 1 when each consumer writes half, 2 when one writes it all.
    At PROFILE level 2, the wait for a free buffer is timed (site "dq_stage")."""
    idx = s % DQ_STAGES
    cycles, count = prof.timed_wait(empties[idx], ((s // DQ_STAGES) & 1) ^ 1, cycles, count, PROFILE)
    # The buffer is [BLOCK_M, HEAD_DIM] like the accumulator's rows; dQ^T goes in transposed.
    cols = tlx.local_slice(dq_stage[idx], [0, col0], [dq_t.shape[1], dq_t.shape[0]])
    tlx.local_store(tlx.local_trans(cols), dq_t)
    tlx.fence_async_shared()
    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
    for _ in tl.static_range(ARRIVALS):
        tlx.barrier_arrive(fulls[idx], 1)
    return cycles, count


@triton.jit
def _add_dq_atomic(dq_ptr, dq_t, H, h, col0, q_row, m_ok, HEAD_DIM: tl.constexpr, NO_REDUCE: tl.constexpr):
    """Consumer: add dQ^T rows [col0, col0 + rows) of one query block by per-element fp32 atomics."""
    ROWS: tl.constexpr = dq_t.shape[0]
    BLOCK_M: tl.constexpr = dq_t.shape[1]
    offs = (q_row + tl.arange(0, BLOCK_M))[None, :].to(tl.int64) * (H * HEAD_DIM) \
        + (h * HEAD_DIM + col0 + tl.arange(0, ROWS))[:, None]
    if NO_REDUCE:
        tl.store(dq_ptr + offs, dq_t, mask=m_ok[None, :])
    else:
        # Relaxed: only the sum matters, and it is read after the kernel ends.
        tl.atomic_add(dq_ptr + offs, dq_t, mask=m_ok[None, :], sem="relaxed")


@triton.jit
def _store_rows(buf, row0: tl.constexpr, ptr, row_stride, n_rows, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Rows [row0, row0 + min(n_rows, ROWS)) of a [*, COLS] shared-memory tile to `ptr`, _STORE_ROWS
    rows at a time (a chunk's pointers fit in a few registers)."""
    cols = tl.arange(0, COLS)
    for c in tl.static_range(ROWS // _STORE_ROWS):
        rows = c * _STORE_ROWS + tl.arange(0, _STORE_ROWS)
        chunk = tlx.local_load(tlx.local_slice(buf, [row0 + c * _STORE_ROWS, 0], [_STORE_ROWS, COLS]))
        tl.store(ptr + rows[:, None] * row_stride + cols[None, :], chunk, mask=(rows < n_rows)[:, None])


# Lengths, head counts and the window change from batch to batch: specializing on their values
# (== 1, divisible by 16) would recompile per batch and make the launched binary differ from the
# one `jfa-prof spills` compiles from the registry.
@triton.jit(do_not_specialize=["H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "dkv_heads",
                               "q_rows", "q_stride", "kv_rows", "k_stride", "v_stride",
                               "tiles_off", "tile_cap", "spans_off", "waits_off"], c_cache=C_CACHE)
def _jfa_bwd(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, dq_desc, dk_ptr, dv_ptr, q_offsets, kv_offsets,
             tile_cum, queue, rec_ptr, sm_scale, H, GROUP, B, Lq_bcast, window, total_rows, dkv_heads,
             q_rows, q_stride, kv_rows, k_stride, v_stride, tiles_off, tile_cap, spans_off, waits_off,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             DQ_MODE: tl.constexpr, DQ_STAGES: tl.constexpr, DYNAMIC: tl.constexpr, PROFILE: tl.constexpr,
             ABLATE: tl.constexpr, SAMPLE: tl.constexpr = 1):
    # Q, K, V, dO and the fp32 dQ accumulator come as pointers (the op) or as host-made descriptors
    # (a caller comparing the two); dO and dQ are row-major, [rows, H * HEAD_DIM].
    q_desc = tma.descriptor(q_desc, q_rows, H * HEAD_DIM, q_stride, BLOCK_M, HEAD_DIM)
    k_desc = tma.descriptor(k_desc, kv_rows, (H // GROUP) * HEAD_DIM, k_stride, BLOCK_N, HEAD_DIM)
    v_desc = tma.descriptor(v_desc, kv_rows, (H // GROUP) * HEAD_DIM, v_stride, BLOCK_N, HEAD_DIM)
    do_desc = tma.descriptor(do_desc, total_rows, H * HEAD_DIM, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    if DQ_MODE == DQ_TMA:
        dq_desc = tma.descriptor(dq_desc, q_rows, H * HEAD_DIM, H * HEAD_DIM, BLOCK_M, HEAD_DIM)
    # dK / dV: [kv_rows, dkv_heads * HEAD_DIM], row-major (made by the op).
    dk_desc = tma.descriptor(dk_ptr, kv_rows, dkv_heads * HEAD_DIM, dkv_heads * HEAD_DIM, BLOCK_N // 2, HEAD_DIM)
    dv_desc = tma.descriptor(dv_ptr, kv_rows, dkv_heads * HEAD_DIM, dkv_heads * HEAD_DIM, BLOCK_N // 2, HEAD_DIM)
    dtype: tl.constexpr = tlx.dtype_of(q_desc)
    NO_DQ: tl.constexpr = (ABLATE & 1) != 0 or DQ_MODE == DQ_NONE
    NO_REDUCE: tl.constexpr = (ABLATE & 2) != 0
    NO_MASK: tl.constexpr = (ABLATE & 4) != 0
    SLOW_PRODUCER: tl.constexpr = (ABLATE & 8) != 0
    SLOW_DQ: tl.constexpr = (ABLATE & 16) != 0
    NO_DKV_STORE: tl.constexpr = (ABLATE & 32) != 0
    # Where shared memory allows (not beside two fp32 dQ staging buffers), dK and dV leave through
    # buffers of their own, by TMA, so that K and V are released when the step loop ends: dK through
    # a [BLOCK_N, HEAD_DIM] buffer, dV through one of that shape over the dS^T slots. Else through the
    # K and V buffers, by the threads.
    STAGE_DKV: tl.constexpr = (not (DQ_MODE == DQ_TMA and DQ_STAGES > 1)) and BLOCK_M == 64
    HALF: tl.constexpr = BLOCK_N // 2  # keys per consumer
    # dQ^T [HEAD_DIM, BLOCK_M] = K^T dS^T: at HEAD_DIM = 128 each consumer computes half its rows
    # every step; at 64, too few rows to split, the consumers take turns computing all of it.
    SPLIT_DQ: tl.constexpr = HEAD_DIM >= 2 * 64
    H_kv = H // GROUP
    n_tiles = tl.load(tile_cum + B) * H_kv
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    # The tile's K and V stay resident; each step's Q and dO blocks arrive in one of two slots, the
    # next step's copies running while this one computes; dS^T goes through shared memory (two
    # slots) as the B operand of the dQ matmul, dQ through DQ_STAGES fp32 staging buffers; with
    # STAGE_DKV, dK leaves through a buffer of its own and dV through the dS^T slots.
    k_buf = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1)
    v_buf = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1)
    q_bufs = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, 2)
    do_bufs = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, 2)
    # The step's log-sum-exp and delta rows come with its Q and dO: read from shared memory where
    # they are used, they hold no registers across the step's first matmuls.
    lse_bufs = tlx.local_alloc((BLOCK_M, ), tl.float32, 2)
    delta_bufs = tlx.local_alloc((BLOCK_M, ), tl.float32, 2)
    box = tlx.local_alloc((_BOX_WORDS, ), tl.int32, 2)
    kv_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    kv_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=2)
    step_fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=2)  # the copies, and the statistics' stores
    step_empties = tlx.alloc_barriers(num_barriers=2, arrive_count=2)
    box_fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    box_empties = tlx.alloc_barriers(num_barriers=2, arrive_count=2)
    if not NO_DQ or STAGE_DKV:
        ds_bufs = tlx.local_alloc((BLOCK_N, BLOCK_M), dtype, 2)
    if STAGE_DKV:
        dk_stage = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1)
        # dV's staging is the dS^T slots' memory seen as one [BLOCK_N, HEAD_DIM] tile, so each consumer's
        # dV, like its dK, leaves in one copy whose 64-column boxes two warps issue side by side; as
        # column blocks of 64 in two slots, one warp issued them one after the other, each behind the
        # proxy fence before it (1.1-1.7% slower at HSP Lq=256 on the H100, kernel alone:
        # benchmarks/results/variants/bwd_ab_dv_one_box_*). Its 64-column blocks are the slots
        # themselves, so a consumer's dV rows are its own rows of each slot, as its dS^T rows are.
        dv_stage = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, 1, reuse=ds_bufs)
    if DQ_MODE == DQ_TMA:
        dq_stage = tlx.local_alloc((BLOCK_M, HEAD_DIM), tl.float32, DQ_STAGES)
        dq_fulls = tlx.alloc_barriers(num_barriers=DQ_STAGES, arrive_count=2)
        dq_empties = tlx.alloc_barriers(num_barriers=DQ_STAGES, arrive_count=1)

    with tlx.async_tasks():
        # ----------------------------------------------------------------------------------
        # Producer: decodes the tiles and hands them out; TMA copies of K / V per tile and Q / dO
        # per step; the dQ reduce-adds.
        # ----------------------------------------------------------------------------------
        with tlx.async_task("default"):
            if PROFILE:
                prof.span_begin(rec_ptr, spans_off, pid, _R_PRODUCER, _N_ROLES)
            # Tiles in block-innermost order: neighbouring tiles share the batch's Q / dO rows in L2.
            # Dealt round-robin, or (DYNAMIC) taken from a queue as producers ask for their next.
            if DYNAMIC:
                t = tl.atomic_add(queue, 1, sem="relaxed")
            else:
                t = pid
            b = 0
            step = 0
            n_posted = 0
            dq_row = 0
            dq_col = 0
            w_ke = prof.counter()
            n_ke = prof.counter()
            w_se = prof.counter()
            n_se = prof.counter()
            w_df = prof.counter()
            n_df = prof.counter()
            w_bx = prof.counter()
            n_bx = prof.counter()
            w_dr = prof.counter()  # cycles reduce-adding dQ (not a wait: the producer's own work)
            n_dr = prof.counter()
            while t < n_tiles:
                if PROFILE >= 3:
                    ev = prof.event_base(rec_ptr, waits_off, tile_cap, t, _R_PRODUCER, n_progs, _N_ROLES, _N_SITES,
                                         SAMPLE)
                    prof.event_start(rec_ptr, ev, pid, prof.globaltimer(), tlx.clock64())
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, False, _PRODUCER_SITES, (w_ke, w_se, w_df, w_bx, w_dr))
                b, kvh, blk = _find_tile(t, tile_cum, B, H_kv, b)
                w_bx, n_bx = _post_tile(box, box_fulls, box_empties, n_posted, b, kvh, blk, t, w_bx, n_bx, PROFILE)
                kv_start, Lk, Lq, q_row0, o_row0 = _sequence(b, q_offsets, kv_offsets, Lq_bcast, BROADCAST_Q)
                n0 = blk * BLOCK_N
                m_lo, m_hi = _query_block_range(n0, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
                n_m = m_hi - m_lo
                # K and V go where the consumers staged the previous tile's dK and dV. Rows past the
                # sequence end hold the next sequence's keys (zeros past the tensor's end): the mask
                # zeroes their P, and their dK / dV rows are never stored.
                w_ke, n_ke = prof.timed_wait(kv_empties[0], (n_posted & 1) ^ 1, w_ke, n_ke, PROFILE)
                tlx.barrier_expect_bytes(kv_fulls[0], 2 * BLOCK_N * HEAD_DIM * tlx.size_of(dtype))
                tlx.async_descriptor_load(k_desc, k_buf[0], [kv_start + n0, kvh * HEAD_DIM], kv_fulls[0])
                tlx.async_descriptor_load(v_desc, v_buf[0], [kv_start + n0, kvh * HEAD_DIM], kv_fulls[0])
                if PROFILE >= 3:
                    prof.event_mark(rec_ptr, ev)
                for i in range(GROUP * n_m):
                    slot = step % 2
                    h = kvh * GROUP + i // n_m
                    m0 = (m_lo + i % n_m) * BLOCK_M
                    if SLOW_PRODUCER:
                        prof.spin(_PLANT_CYCLES)
                    w_se, n_se = prof.timed_wait(step_empties[slot], ((step // 2) & 1) ^ 1, w_se, n_se, PROFILE)
                    tlx.barrier_expect_bytes(step_fulls[slot], 2 * BLOCK_M * HEAD_DIM * tlx.size_of(dtype))
                    tlx.async_descriptor_load(q_desc, q_bufs[slot], [q_row0 + m0, h * HEAD_DIM], step_fulls[slot])
                    tlx.async_descriptor_load(do_desc, do_bufs[slot], [o_row0 + m0, h * HEAD_DIM], step_fulls[slot])
                    # The rows' log-sum-exp and delta, one per producer thread. (Copied by 1-D TMA they
                    # failed on the H200 wherever the step's first row was not 16-byte aligned, as
                    # jagged sequences' rows are not.)
                    m_ids = m0 + tl.arange(0, BLOCK_M)
                    stat_offs = h.to(tl.int64) * total_rows + o_row0 + m_ids
                    tlx.local_store(lse_bufs[slot], tl.load(lse_ptr + stat_offs, mask=m_ids < Lq, other=0.0))
                    tlx.local_store(delta_bufs[slot], tl.load(delta_ptr + stat_offs, mask=m_ids < Lq, other=0.0))
                    tlx.named_barrier_wait(_PRODUCER_BAR, _WARPGROUP_THREADS)
                    tlx.barrier_arrive(step_fulls[slot], 1)
                    if DQ_MODE == DQ_TMA and not NO_DQ:
                        # The previous step's dQ, now that this step's copies are on their way.
                        if step > 0:
                            w_df, n_df, w_dr, n_dr = _reduce_dq(
                                dq_desc, dq_stage, dq_fulls, dq_empties, step - 1, dq_row, dq_col, w_df, n_df, w_dr,
                                n_dr, DQ_STAGES, NO_REDUCE, SLOW_DQ, PROFILE)
                        dq_row = q_row0 + m0
                        dq_col = h * HEAD_DIM
                    step += 1
                if PROFILE >= 3:
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, True, _PRODUCER_SITES, (w_ke, w_se, w_df, w_bx, w_dr))
                    prof.event_end(rec_ptr, ev)
                n_posted += 1
                if DYNAMIC:
                    t = tl.atomic_add(queue, 1, sem="relaxed")
                else:
                    t += n_progs
            w_bx, n_bx = _post_tile(box, box_fulls, box_empties, n_posted, -1, 0, 0, 0, w_bx, n_bx, PROFILE)
            if DQ_MODE == DQ_TMA and not NO_DQ:
                if step > 0:
                    w_df, n_df, w_dr, n_dr = _reduce_dq(dq_desc, dq_stage, dq_fulls, dq_empties, step - 1, dq_row,
                                                        dq_col, w_df, n_df, w_dr, n_dr, DQ_STAGES, NO_REDUCE, SLOW_DQ,
                                                        PROFILE)
                tlx.async_descriptor_store_wait(0)  # the last copies read shared memory until they finish
            if PROFILE:
                # The span's address rebuilt here, not kept from span_begin across the kernel in a
                # register (at level 2 that spilled).
                prof.span_end(rec_ptr, _opaque(spans_off), pid, _R_PRODUCER, _N_ROLES, n_posted)
                if PROFILE >= 2:
                    prof.write_site_waits(rec_ptr, waits_off, pid, _R_PRODUCER, _N_ROLES, _PRODUCER_SITES, _N_SITES,
                                          (w_ke, w_se, w_df, w_bx, w_dr), (n_ke, n_se, n_df, n_bx, n_dr))

        # ----------------------------------------------------------------------------------
        # Consumers: warpgroup `cid` owns keys [cid * HALF, (cid + 1) * HALF) of the tile: their
        # rows of S^T, dP^T, dS^T, dK and dV.
        # ----------------------------------------------------------------------------------
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=2):
            cid: tl.constexpr = tlx.async_task_replica_id()
            # The first consumer speaks for both ("compute"); the second times nothing.
            CPROF: tl.constexpr = PROFILE * (1 - cid)
            # At levels 1 and 2 consumer 0 stores each tile record at the next tile's start (below);
            # at level 3, whose event records close each tile anyway, as the tile ends.
            DEFER_RECORD: tl.constexpr = CPROF == 1 or CPROF == 2
            if CPROF:
                prof.span_begin(rec_ptr, spans_off, pid, _R_COMPUTE, _N_ROLES)
            dq_wait = prof.counter()
            dq_waits = prof.counter()
            w_kf = prof.counter()
            n_kf = prof.counter()
            w_sf = prof.counter()
            n_sf = prof.counter()
            w_ds = prof.counter()
            n_ds = prof.counter()
            qk_scale = sm_scale * _LOG2E  # exponentials in base 2, as in the forward
            step = 0
            n_done = 0
            b, kvh, blk, t = _take_tile(box, box_fulls, box_empties, 0, cid)
            if DEFER_RECORD:
                rec_t = -1  # the tile whose record's end is still to store
                rec_t1 = tl.zeros([], tl.int64)
                rec_c1 = tl.zeros([], tl.int64)
            while b >= 0:
                if CPROF:
                    t0 = prof.globaltimer()
                    c0 = tlx.clock64()
                if CPROF >= 3:
                    ev = prof.event_base(rec_ptr, waits_off, tile_cap, t, _R_COMPUTE, n_progs, _N_ROLES, _N_SITES,
                                         SAMPLE)
                    prof.event_start(rec_ptr, ev, pid, t0, c0)
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, False, _COMPUTE_SITES, (w_kf, w_sf, dq_wait, w_ds))
                kv_start, Lk, Lq, q_row0, o_row0 = _sequence(b, q_offsets, kv_offsets, Lq_bcast, BROADCAST_Q)
                n0 = blk * BLOCK_N
                k0 = n0 + cid * HALF  # this consumer's first key
                n_ids = k0 + tl.arange(0, HALF)
                n_ok = n_ids < Lk
                m_lo, m_hi = _query_block_range(n0, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
                n_m = m_hi - m_lo
                kv_whole = n0 + BLOCK_N <= Lk
                dk = tl.zeros([HALF, HEAD_DIM], tl.float32)
                dv = tl.zeros([HALF, HEAD_DIM], tl.float32)
                w_kf, n_kf = prof.timed_wait(kv_fulls[0], n_done & 1, w_kf, n_kf, CPROF)
                if DEFER_RECORD:
                    # The tile records are stored here, once this tile's K and V are in, where the
                    # consumer waits for the previous tile's dK / dV copies anyway: this tile's fields
                    # and the previous one's end, taken as it ended (the last one's after the loop).
                    # Stored as each tile ended, on the way to the next, level 1 cost +6 to +10% of
                    # the kernel against 0 to +1% on the H200; at level 3 the other way round, +9 to
                    # +16% deferred against +1 to +10% (benchmarks/results/instrumentation/
                    # bwd_l1_record_ab_*, roles_cost_bwd_*_2026-12-04b).
                    prof.write_tile_end(rec_ptr, tiles_off, tile_cap, rec_t, rec_t1, rec_c1)
                    prof.write_tile_fields(rec_ptr, tiles_off, tile_cap, t, pid, prof.smid(), t, b, kvh, blk, Lk,
                                           GROUP * n_m, t0, c0, _R_COMPUTE)
                if STAGE_DKV:
                    # The previous tile's dK / dV copies have read the staging buffers (the dS^T slots
                    # among them) before any thread of this warpgroup writes them again.
                    tlx.async_descriptor_store_wait(0)
                    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
                for i in range(GROUP * n_m):
                    slot = step % 2
                    h = kvh * GROUP + i // n_m
                    m0 = (m_lo + i % n_m) * BLOCK_M
                    m_ids = m0 + tl.arange(0, BLOCK_M)
                    m_ok = m_ids < Lq
                    w_sf, n_sf = prof.timed_wait(step_fulls[slot], (step // 2) & 1, w_sf, n_sf, CPROF)
                    # Buffer views through an opaque index: the compiler then rebuilds each wgmma's
                    # shared-memory descriptors inside the step (an add and a mask each) instead of
                    # computing them all before the loop and keeping them in registers the
                    # accumulators need (before warp specialization, at D = 128, that spilled and was
                    # 1.10-1.17x slower on the H200: benchmarks/results/variants/bwd_ab_opaque_views_*).
                    slot_o = _opaque(slot)
                    k_all = k_buf[_opaque(0)]
                    k_s = tlx.local_slice(k_all, [cid * HALF, 0], [HALF, HEAD_DIM])
                    v_s = tlx.local_slice(v_buf[_opaque(0)], [cid * HALF, 0], [HALF, HEAD_DIM])
                    q_s = q_bufs[slot_o]
                    do_s = do_bufs[slot_o]
                    # S^T = K Q^T and dP^T = V dO^T go to the tensor cores together; P^T is computed
                    # while dP^T runs.
                    # The consumers issue them in turn, consumer 1 first, rather than both at once:
                    # 1.01-1.06x faster on the H200 at HSP points and dense over three A/B runs
                    # (benchmarks/results/variants/bwd_ab_turn*; found because the instrumented build,
                    # whose clock reads delay consumer 0 alone, outran the plain one). Both wait at the
                    # barrier once per step, so neither can take a second turn before the other.
                    if cid == 0:
                        tlx.named_barrier_wait(_TURN_BAR, _CONSUMER_THREADS)
                    qk_t = tlx.async_dot(k_s, tlx.local_trans(q_s))
                    dp_t = tlx.async_dot(v_s, tlx.local_trans(do_s))
                    if cid == 1:
                        tlx.named_barrier_wait(_TURN_BAR, _CONSUMER_THREADS)
                    qk_t = tlx.async_dot_wait(1, qk_t)
                    # P recomputed from the saved log-sum-exp. A row that saw no key has lse = -inf
                    # and no visible entry, so the select, not the exponential, makes its P zero.
                    lse = tlx.local_load(lse_bufs[slot_o])
                    p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :] * _LOG2E)
                    # Peeled: a block wholly inside both sequences, with no window and no key of this
                    # consumer's half hidden by the causal rule, skips the mask arithmetic (a runtime
                    # branch, one loop: see fwd's peeling note). Causal, only the blocks the diagonal
                    # crosses need it: the block's first row sees every key of the half.
                    masked = (not kv_whole) | (m0 + BLOCK_M > Lq)
                    if CAUSAL:
                        masked = masked | (k0 + HALF - 1 > m0 + (Lk - Lq))
                    if not NO_MASK:
                        if HAS_WINDOW or masked:
                            visible = n_ok[:, None] & m_ok[None, :]
                            if HAS_WINDOW:
                                diff = m_ids[None, :] - n_ids[:, None]
                                visible = visible & (diff <= window) & (diff >= -window)
                            if CAUSAL:
                                visible = visible & (n_ids[:, None] <= m_ids[None, :] + (Lk - Lq))
                            p_t = tl.where(visible, p_t, 0.0)
                    dp_t = tlx.async_dot_wait(0, dp_t)
                    delta = tlx.local_load(delta_bufs[slot_o])
                    ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)
                    dv = tlx.async_dot(p_t.to(dtype), do_s, dv)
                    if NO_DQ:
                        dk = tlx.async_dot(ds_t, q_s, dk)
                    else:
                        ds_all = ds_bufs[slot_o]
                        tlx.local_store(tlx.local_slice(ds_all, [cid * HALF, 0], [HALF, BLOCK_M]), ds_t)
                        tlx.fence("async_shared")
                        if SPLIT_DQ or slot == cid:
                            # SPLIT_DQ: dQ^T rows [cid * HALF, ...) = K[:, those columns]^T dS^T; else
                            # this consumer's turn to compute all of dQ^T. Either way over all 128
                            # keys, so both halves of dS^T must be in.
                            w_ds, n_ds = prof.timed_named_wait(_STEP_BAR + slot, _CONSUMER_THREADS, w_ds, n_ds,
                                                               CPROF)
                            if SPLIT_DQ:
                                k_cols = tlx.local_slice(k_all, [0, cid * HALF], [BLOCK_N, HALF])
                            else:
                                k_cols = k_all
                            # dK goes after dQ^T, so that dQ^T's wait leaves dK in flight while dQ^T
                            # is staged (FA4's order). Against dK before the barrier: 1.00-1.02x
                            # faster on the H200, kernel alone; 1.016x at HSP Lq=128 s=0.1 in all
                            # three rounds, elsewhere inside the rounds' spread
                            # (benchmarks/results/variants/bwd_ab_fa4_order_*).
                            dq_t = tlx.async_dot(tlx.local_trans(k_cols), ds_all)
                            dk = tlx.async_dot(ds_t, q_s, dk)
                            dq_t = tlx.async_dot_wait(1, dq_t) * sm_scale
                            COL0: tl.constexpr = cid * HALF if SPLIT_DQ else 0
                            if DQ_MODE == DQ_TMA:
                                dq_wait, dq_waits = _stage_dq(dq_stage, dq_fulls, dq_empties, step, dq_t, COL0, cid,
                                                              dq_wait, dq_waits, 1 if SPLIT_DQ else 2, DQ_STAGES,
                                                              CPROF)
                            else:
                                _add_dq_atomic(dq_ptr, dq_t, H, h, COL0, q_row0 + m0, m_ok, HEAD_DIM, NO_REDUCE)
                        else:
                            # Not its turn: its half is in; on to the next step. (The barrier ids
                            # alternate with the step, so an early arrival cannot count twice.)
                            tlx.named_barrier_arrive(_STEP_BAR + slot, _CONSUMER_THREADS)
                            dk = tlx.async_dot(ds_t, q_s, dk)
                    dv = tlx.async_dot_wait(0, dv)
                    dk = tlx.async_dot_wait(0, dk)
                    tlx.barrier_arrive(step_empties[slot], 1)  # this step's Q and dO are read
                    step += 1
                if STAGE_DKV:
                    # This warpgroup's matmuls are all waited for: the producer may load the next K
                    # and V once the other consumer is done with them too. dK and dV are staged once
                    # the other consumer's last dQ^T has read the dS^T slots, and go out by TMA while
                    # the next tile starts. A half block that reaches past the sequence end would
                    # overwrite the next sequence's rows: stored by the threads, masked. Keys no
                    # query sees still get their (zero) rows written: dK and dV come from torch.empty.
                    if CPROF >= 3:
                        prof.event_mark(rec_ptr, ev)
                    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
                    tlx.barrier_arrive(kv_empties[0], 1)
                    if not NO_DQ:
                        tlx.named_barrier_wait(_EPI_BAR, _CONSUMER_THREADS)
                    dk_rows = tlx.local_slice(dk_stage[0], [cid * HALF, 0], [HALF, HEAD_DIM])
                    tlx.local_store(dk_rows, (dk * sm_scale).to(dtype))
                    dv_rows = tlx.local_slice(dv_stage[0], [cid * HALF, 0], [HALF, HEAD_DIM])
                    tlx.local_store(dv_rows, dv.to(dtype))
                    tlx.fence_async_shared()
                    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
                    if not NO_DKV_STORE:
                        if k0 + HALF <= Lk:
                            tlx.async_descriptor_store(dk_desc, dk_rows, [kv_start + k0, kvh * HEAD_DIM])
                            tlx.async_descriptor_store(dv_desc, dv_rows, [kv_start + k0, kvh * HEAD_DIM])
                        else:
                            row_stride = _opaque(dkv_heads) * HEAD_DIM
                            kv_base = _head_base(kv_start + k0, H_kv, kvh, HEAD_DIM)
                            _store_rows(dk_stage[0], cid * HALF, dk_ptr + kv_base, row_stride, Lk - k0, HALF,
                                        HEAD_DIM)
                            _store_rows(dv_stage[0], cid * HALF, dv_ptr + kv_base, row_stride, Lk - k0, HALF,
                                        HEAD_DIM)
                else:
                    # dK and dV leave through this consumer's rows of the K and V buffers, once the other
                    # consumer's dQ^T (which reads all of K) is done: written from the accumulators'
                    # layout, read back in row chunks in a layout that stores coalesced. Keys no query sees
                    # still get their (zero) rows written: dK and dV come from torch.empty; rows past the
                    # sequence end belong to the next sequence and are skipped.
                    if CPROF >= 3:
                        prof.event_mark(rec_ptr, ev)
                    if not NO_DQ:
                        tlx.named_barrier_wait(_EPI_BAR, _CONSUMER_THREADS)
                    k_rows = tlx.local_slice(k_buf[0], [cid * HALF, 0], [HALF, HEAD_DIM])
                    v_rows = tlx.local_slice(v_buf[0], [cid * HALF, 0], [HALF, HEAD_DIM])
                    tlx.local_store(k_rows, (dk * sm_scale).to(dtype))
                    tlx.local_store(v_rows, dv.to(dtype))
                    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
                    # The head count goes through `_opaque` so the chunks' offsets are built per tile,
                    # not hoisted out of the persistent loop into registers the accumulators need.
                    if not NO_DKV_STORE:
                        row_stride = _opaque(dkv_heads) * HEAD_DIM
                        kv_base = _head_base(kv_start + k0, H_kv, kvh, HEAD_DIM)
                        _store_rows(k_buf[0], cid * HALF, dk_ptr + kv_base, row_stride, Lk - k0, HALF, HEAD_DIM)
                        _store_rows(v_buf[0], cid * HALF, dv_ptr + kv_base, row_stride, Lk - k0, HALF, HEAD_DIM)
                    # Every thread has read its rows, and its writes are ordered before the copies (another
                    # proxy) that refill them, before the producer may load the next K and V.
                    tlx.fence_async_shared()
                    tlx.named_barrier_wait(_WG_BAR + cid, _WARPGROUP_THREADS)
                    tlx.barrier_arrive(kv_empties[0], 1)
                if DEFER_RECORD:
                    rec_t = t
                    rec_t1 = prof.globaltimer()
                    rec_c1 = tlx.clock64()
                elif CPROF:
                    prof.write_tile(rec_ptr, tiles_off, tile_cap, t, pid, prof.smid(), t, b, kvh, blk, Lk,
                                    GROUP * n_m, t0, prof.globaltimer(), c0, tlx.clock64(), _R_COMPUTE)
                if CPROF >= 3:
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, True, _COMPUTE_SITES, (w_kf, w_sf, dq_wait, w_ds))
                    prof.event_end(rec_ptr, ev)
                n_done += 1
                b, kvh, blk, t = _take_tile(box, box_fulls, box_empties, n_done, cid)
            if STAGE_DKV:
                tlx.async_descriptor_store_wait(0)  # the last copies read shared memory until they finish
            if DEFER_RECORD:
                prof.write_tile_end(rec_ptr, tiles_off, tile_cap, rec_t, rec_t1, rec_c1)
            if CPROF:
                prof.span_end(rec_ptr, _opaque(spans_off), pid, _R_COMPUTE, _N_ROLES, n_done)  # as the producer's
                if CPROF >= 2:
                    prof.write_site_waits(rec_ptr, waits_off, pid, _R_COMPUTE, _N_ROLES, _COMPUTE_SITES, _N_SITES,
                                          (w_kf, w_sf, dq_wait, w_ds), (n_kf, n_sf, dq_waits, n_ds))


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
    # As the op launches it: the TMA operands as pointers, their descriptors built in the kernel.
    sig = {"q_desc": f"*{dtype}", "k_desc": f"*{dtype}", "v_desc": f"*{dtype}", "do_desc": f"*{dtype}",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": "*fp32", "dq_desc": "*fp32",
           "dk_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}", "q_offsets": "*i32", "kv_offsets": "*i32",
           "tile_cum": "*i32", "queue": "*i32", "rec_ptr": "*i64", "sm_scale": "fp32"}
    for name in ("H", "GROUP", "B", "Lq_bcast", "window", "total_rows", "dkv_heads", "q_rows", "q_stride",
                 "kv_rows", "k_stride", "v_stride", "tiles_off", "tile_cap", "spans_off", "waits_off"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BROADCAST_Q", "CAUSAL", "HAS_WINDOW", "DQ_MODE", "DQ_STAGES",
                 "DYNAMIC", "PROFILE", "ABLATE", "SAMPLE"):
        sig[name] = "constexpr"
    return sig


def bwd_constexprs(*, head_dim, broadcast_q, causal, has_window, dq="tma", dq_stages=DEFAULT_DQ_STAGES,
                   schedule, profile=0, ablate=0, block_m=BLOCK_M, sample=1) -> dict:
    """`dq`: "atomic", "tma" or "deterministic" (this kernel then leaves dQ to `_jfa_bwd_dq`).
    `sample`: at profile level 3, event records for every `sample`-th tile."""
    return {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": BLOCK_N, "BROADCAST_Q": broadcast_q,
            "CAUSAL": causal, "HAS_WINDOW": has_window,
            "DQ_MODE": DQ_MODES["none" if dq == "deterministic" else dq], "DQ_STAGES": dq_stages,
            "DYNAMIC": schedule == "dynamic", "PROFILE": int(profile), "ABLATE": ablate,
            "SAMPLE": sample}


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
            "tile_cum": "*i32", "dq_ptr": "*fp32", "queue": "*i32", "total_rows": "i32", "H": "i32", "B": "i32",
            "dq_rows": "i32", "zero_queue": "i32", "HEAD_DIM": "constexpr",
            "BLOCK_ROWS": "constexpr", "BLOCK_N": "constexpr", "SCAN": "constexpr"}


def delta_constexprs(*, head_dim) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_ROWS": DELTA_ROWS, "BLOCK_N": BLOCK_N, "SCAN": DELTA_SCAN}


# Every mask combination the op can launch (causal is jagged-only): (BROADCAST_Q, CAUSAL, HAS_WINDOW).
MODES = {"bcast": (True, False, False), "bcast-window": (True, False, True), "jagged": (False, False, False),
         "jagged-causal": (False, True, False), "jagged-window": (False, False, True),
         "jagged-causal-window": (False, True, True)}
# dQ reductions by variant-name part: (dq mode, staging buffers).
DQ_VARIANTS = {"tma2": ("tma", 2), "tma1": ("tma", 1), "atomic": ("atomic", 1), "det": ("deterministic", 1)}


def _main_variant(mode, dtype, head_dim, dq_name, schedule=None, profile=0) -> KernelVariant:
    """The main kernel's variant; `schedule` defaults to the op's for the mode, and a name says any other."""
    broadcast_q, causal, has_window = MODES[mode]
    dq, stages = DQ_VARIANTS[dq_name]
    name = f"bwd/{mode}/{dtype}/d{head_dim}/{dq_name}"
    schedule = schedule or default_schedule(broadcast_q)
    if schedule != default_schedule(broadcast_q):
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
    """Per mask mode, dtype and head dim: the main kernel with the op's dQ reduction (TMA, 1
    stage) and the deterministic pair (main kernel without dQ, dQ kernel); the delta kernel per dtype and head dim (no mask, so one serves every mode).
    For broadcast-Q bf16 D=128, the HSP case: every other dQ reduction, the dynamic queue, and
    every PROFILE level."""
    out = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for mode, (broadcast_q, causal, has_window) in MODES.items():
                out.append(_main_variant(mode, dtype, head_dim, "tma1"))
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
    out += [_main_variant("bcast", "bf16", 128, dq) for dq in ("tma2", "atomic")]
    out += [_main_variant("bcast", "bf16", 128, "tma1", schedule="dynamic")]
    out += [_main_variant("bcast", "bf16", 128, "tma1", profile=p) for p in (1, 2, 3)]
    return out
