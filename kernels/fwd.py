"""Jagged Flash Attention forward for Hopper (sm_90a), written in TLX.

Persistent and warp-specialized:
- one producer warpgroup issues TMA loads of Q (once per tile) and of K/V blocks into a ring of
  shared-memory stages, each guarded by a full/empty mbarrier pair;
- two consumer warpgroups each own 64 of the tile's 128 query rows and take turns on the tensor
  cores (ping-pong through two named barriers), so one's softmax overlaps the other's matmuls;
  inside a consumer, the P·V matmul of block j-1 runs while the softmax of block j is computed.

A tile is (batch, head, query block). The persistent CTAs walk a work list of tile ids built on
the device (`jfa_prof.schedule`): in list order with a stride (static / LPT-zigzag lists) or by
taking the next list position from a global atomic counter (dynamic; Hopper has no CLC). The
producer walks the list and decodes each tile; the consumers get it through a shared-memory
mailbox, so they never wait on a global load between two tiles.

Masking is peeled: KV blocks that every valid row of a consumer sees in full run without the
mask arithmetic; only the boundary blocks (sequence end, window edges, causal diagonal) pay for
it. PEEL=False masks every block so the effect can be measured.
"""
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import libdevice

from jfa_prof.kernels import C_CACHE
from jfa_prof.kernels import profiling as prof
from jfa_prof.kernels import tma
from jfa_prof.kernels.registry import KernelVariant, provider
from jfa_prof.records import FWD_ROLES, FWD_SITES, ROLE_SITES

PLANT_CYCLES = 3000  # the planted delays' length: about 1.5 us at the H200's 1.98 GHz, above a block's time
_PLANT_CYCLES = tl.constexpr(PLANT_CYCLES)
BLOCK_M = 128  # query rows per tile: two consumer warpgroups of 64
BLOCK_N = 128  # keys per KV block
NUM_CONSUMERS = 2
NUM_KV_STAGES = 2
NUM_Q_BUFS = 2  # Q buffers per consumer
# Where each (batch, head) has a single query block (at most BLOCK_M rows), every K/V block is read
# for that block alone and the kernel waits on memory: 64-key blocks four deep take the shared memory
# of 128 x 2, keep more bytes in flight and waste less at the end of short sequences (H200, HSP
# Lq = 128: 1.01-1.17x; at Lq = 256, where the work per byte doubles, 0.95-0.98x, so 128 there:
# benchmarks/results/variants/fwd_variants_h200_*).
SHORT_Q_BLOCK_N = 64
KV_STAGES = {BLOCK_N: NUM_KV_STAGES, SHORT_Q_BLOCK_N: 4}  # K/V ring depth by keys per block
O_BUF = True  # each consumer stages its output tile in a buffer of its own (see the kernel's epilogue)
CONSUMER_REGS = 232
NUM_WARPS = 4  # the producer (default task); each consumer adds 4 more


def kv_block_n(n_m_blocks: int) -> int:
    """Keys per KV block for launches whose (batch, head)s have `n_m_blocks` query blocks."""
    return SHORT_Q_BLOCK_N if n_m_blocks == 1 else BLOCK_N


# Named barriers for the consumers' turns on the tensor cores (ids 0..7 are left to the compiler).
_TURN_0 = tl.constexpr(9)
_TURN_1 = tl.constexpr(10)
_CONSUMER_THREADS = tl.constexpr(256)  # both consumer warpgroups meet at the turn barriers
_STAGE_BAR = tl.constexpr(11)  # + consumer id: one warpgroup's barrier around output staging
_WARPGROUP_THREADS = tl.constexpr(128)
_STORE_ROWS = tl.constexpr(8)  # output rows stored per chunk
_MASK_NEVER = tl.constexpr(0)
_MASK_ALWAYS = tl.constexpr(1)
_MASK_IF_FLAGGED = tl.constexpr(2)
_PRODUCER_BAR = tl.constexpr(13)  # the producer warpgroup's own barrier (mailbox hand-off)
_BOX_WORDS = tl.constexpr(128)  # one word per producer thread: no two threads store to one address
_BOX_COPIES = tl.constexpr(8)  # words per mailbox field: 16 fields
# Mailbox fields: a tile as the producer decoded it.
_F_POS = tl.constexpr(0)
_F_TILE = tl.constexpr(1)
_F_BATCH = tl.constexpr(2)
_F_HEAD = tl.constexpr(3)
_F_M0 = tl.constexpr(4)
_F_LQ = tl.constexpr(5)
_F_LK = tl.constexpr(6)
_F_O_ROW0 = tl.constexpr(7)
_F_BLK_LO = tl.constexpr(8)
_F_N_BLOCKS = tl.constexpr(9)

# Ablations: each removes one piece of work so its share of the time can be measured (the
# waterfall). Reachable only through `fwd_launch(ablate=...)`; the public op never sets them,
# and each makes the output wrong on purpose.
ABLATIONS = {
    "no_o_store": (1, "skips the output and log-sum-exp stores; everything before them still runs"),
    "no_exp": (2, "softmax without the exponentials: P = S - rowmax and no rescale; the matmuls, "
                  "row max and row sums still run"),
    "reuse_kv": (4, "loads K/V for a tile's first block only; later blocks reuse the resident tiles, "
                    "so the barriers still cycle but no bytes move"),
    "no_mask": (8, "no mask arithmetic on any block (sequence end, window, causal), peeled or not"),
}
# Planted bottlenecks: each adds a known delay, so that a diagnosis can be checked against a cause
# known in advance. Same bitmask and the same door as the ablations (`fwd_launch(ablate=...)`); the
# output stays right, only slower.
PLANTS = {
    "slow_producer": (16, f"the producer spins {PLANT_CYCLES} cycles before each K/V block's load"),
    "slow_epilogue": (32, f"each consumer spins {2 * PLANT_CYCLES} cycles in every tile's epilogue"),
}

# Barrier-wait site ids, positions in records.FWD_SITES.
_S_Q_EMPTY = tl.constexpr(FWD_SITES.index("q_empty"))
_S_K_EMPTY = tl.constexpr(FWD_SITES.index("k_empty"))
_S_V_EMPTY = tl.constexpr(FWD_SITES.index("v_empty"))
_S_Q_FULL = tl.constexpr(FWD_SITES.index("q_full"))
_S_K_FULL = tl.constexpr(FWD_SITES.index("k_full"))
_S_V_FULL = tl.constexpr(FWD_SITES.index("v_full"))
_S_TURN = tl.constexpr(FWD_SITES.index("mma_turn"))
_S_QUEUE = tl.constexpr(FWD_SITES.index("queue"))
_N_SITES = tl.constexpr(len(FWD_SITES))
# Each role's sites in its event records, in the order its accumulators are passed (records.ROLE_SITES).
_PRODUCER_SITES = tl.constexpr(tuple(FWD_SITES.index(s) for s in ROLE_SITES["fwd"]["producer"]))
_CONSUMER_SITES = tl.constexpr(tuple(FWD_SITES.index(s) for s in ROLE_SITES["fwd"]["consumer0"]))
_N_ROLES = tl.constexpr(len(FWD_ROLES))

SCHEDULE_IDS = {"static": 0, "lpt": 1, "dynamic": 2}


# ---------------------------------------------------------------------------------------------
# Tile geometry: the producer derives a tile's rows and KV blocks from its id, loads what they need
# and hands the numbers to the consumers through the mailbox (`_post_tile` / `_take_tile`).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_geometry(tile, H, n_m_blocks, Lq_bcast, window, q_offsets, kv_offsets,
                   BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tile // n_m_blocks
    m_blk = tile % n_m_blocks
    b = bh // H
    h = bh % H
    kv_start = tl.load(kv_offsets + b)
    Lk = tl.load(kv_offsets + b + 1) - kv_start
    if BROADCAST_Q:
        Lq = Lq_bcast
        q_row0 = 0  # Q rows are shared: every sequence reads rows [0, Lq)
        o_row0 = b * Lq_bcast
    else:
        q_row0 = tl.load(q_offsets + b)
        Lq = tl.load(q_offsets + b + 1) - q_row0
        o_row0 = q_row0
    m0 = m_blk * BLOCK_M
    last_row = tl.minimum(m0 + BLOCK_M, Lq) - 1
    lo = 0
    hi = Lk
    if HAS_WINDOW:
        lo = tl.maximum(m0 - window, 0)
        hi = tl.minimum(hi, last_row + window + 1)
    if CAUSAL:
        hi = tl.minimum(hi, last_row + Lk - Lq + 1)
    blk_lo = lo // BLOCK_N
    n_blocks = tl.where((hi > lo) & (last_row >= m0), tl.cdiv(hi, BLOCK_N) - blk_lo, 0)
    return b, h, m0, Lq, Lk, q_row0, o_row0, kv_start, blk_lo, n_blocks


@triton.jit
def _next_position(pos, n_progs, queue, DYNAMIC: tl.constexpr):
    if DYNAMIC:
        # Relaxed: the counter only hands out positions; it publishes no data for an acquire to order.
        return tl.atomic_add(queue, 1, sem="relaxed") + n_progs
    else:
        return pos + n_progs


@triton.jit
def _load_kv(desc, bufs, fulls, empties, cnt, row, col, n_bytes: tl.constexpr, cycles, count,
             NUM_STAGES: tl.constexpr, PROFILE: tl.constexpr, SKIP_LOAD: tl.constexpr = False):
    idx = cnt % NUM_STAGES
    phase = (cnt // NUM_STAGES) & 1
    cycles, count = prof.timed_wait(empties[idx], phase ^ 1, cycles, count, PROFILE)
    if SKIP_LOAD:
        tlx.barrier_arrive(fulls[idx], 1)  # ablation: hand over the stale tile, move no bytes
    else:
        tlx.barrier_expect_bytes(fulls[idx], n_bytes)
        tlx.async_descriptor_load(desc, bufs[idx], [row, col], fulls[idx])
    return cycles, count


@triton.jit
def _post_tile(box, full, empty, phase, pos, tile, b, h, m0, Lq, Lk, o_row0, blk_lo, n_blocks, cycles, count,
               PROFILE: tl.constexpr):
    """Producer side of the tile mailbox: hand a consumer the next tile as the producer decoded it
    (its list position; past the list's end, the signal to stop), so that the consumers, whose
    tensor-core turns wait for each other, load nothing from global memory between two tiles."""
    cycles, count = prof.timed_wait(empty, phase, cycles, count, PROFILE)
    field = tl.arange(0, _BOX_WORDS) // _BOX_COPIES
    words = tl.where(field == _F_POS, pos, 0)
    words = tl.where(field == _F_TILE, tile, words)
    words = tl.where(field == _F_BATCH, b, words)
    words = tl.where(field == _F_HEAD, h, words)
    words = tl.where(field == _F_M0, m0, words)
    words = tl.where(field == _F_LQ, Lq, words)
    words = tl.where(field == _F_LK, Lk, words)
    words = tl.where(field == _F_O_ROW0, o_row0, words)
    words = tl.where(field == _F_BLK_LO, blk_lo, words)
    words = tl.where(field == _F_N_BLOCKS, n_blocks, words)
    tlx.local_store(box, words)
    # Every producer thread's word is in before the one elected thread signals the box full.
    tlx.named_barrier_wait(_PRODUCER_BAR, _WARPGROUP_THREADS)
    tlx.barrier_arrive(full, 1)
    return cycles, count


@triton.jit
def _box_field(box, field: tl.constexpr):
    return tl.sum(tlx.local_load(tlx.local_slice(box, [field * _BOX_COPIES], [1])), 0)


@triton.jit
def _take_tile(box, full, empty, phase, cid: tl.constexpr, cycles, count, PROFILE: tl.constexpr):
    """Consumer side: read the tile, and give the box back only once every thread has read it."""
    cycles, count = prof.timed_wait(full, phase, cycles, count, PROFILE)
    pos = _box_field(box, _F_POS)
    tile = _box_field(box, _F_TILE)
    b = _box_field(box, _F_BATCH)
    h = _box_field(box, _F_HEAD)
    m0 = _box_field(box, _F_M0)
    Lq = _box_field(box, _F_LQ)
    Lk = _box_field(box, _F_LK)
    o_row0 = _box_field(box, _F_O_ROW0)
    blk_lo = _box_field(box, _F_BLK_LO)
    n_blocks = _box_field(box, _F_N_BLOCKS)
    tlx.named_barrier_wait(_STAGE_BAR + cid, _WARPGROUP_THREADS)
    tlx.barrier_arrive(empty, 1)
    return pos, tile, b, h, m0, Lq, Lk, o_row0, blk_lo, n_blocks, cycles, count


@triton.jit
def _apply_mask(qk, blk, row_ids, Lq, Lk, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                BLOCK_N: tl.constexpr):
    cols = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    visible = cols[None, :] < Lk
    if HAS_WINDOW:
        diff = row_ids[:, None] - cols[None, :]
        visible = visible & (diff <= window) & (diff >= -window)
    if CAUSAL:
        visible = visible & (cols[None, :] <= row_ids[:, None] + (Lk - Lq))
    return tl.where(visible, qk, float("-inf"))


# ---------------------------------------------------------------------------------------------
# Consumer: one KV block of online softmax. FIRST has no previous P·V to issue; MASK_MODE says
# whether the sequence-end / window / causal mask applies: never, always, or where `masked` is
# set (peeling: one loop whose boundary blocks branch into the mask, so the tensor-core pipeline
# is not split across several loops, which made ptxas serialize the wgmma chain).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _consume_block(q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, cnt, blk,
                   p, acc, m_i, l_i, qk_scale, row_ids, Lq, Lk, window, cid: tl.constexpr,
                   w_k, n_k, w_turn, n_turn, masked,
                   FIRST: tl.constexpr, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                   PROFILE: tl.constexpr, NO_EXP: tl.constexpr):
    idx = cnt % NUM_STAGES
    phase = (cnt // NUM_STAGES) & 1
    # Ping-pong: consumer 0 issues its QK^T first, then consumer 1, alternating every block. At level 2
    # the turn's wait starts where K's ends, so one clock read serves both (level 2 at HSP Lq=256: 2.9-4.0%
    # against 3.6-5.7% with four reads: benchmarks/results/instrumentation/fwd_l2_clock_ab_h100_2026-12-06.json).
    if PROFILE >= 2:
        t0 = prof.clock32()
        tlx.barrier_wait(k_fulls[idx], phase)
        t1 = prof.clock32()
        w_k += t1 - t0
        n_k += 1
        tlx.named_barrier_wait(_TURN_0 if cid == 0 else _TURN_1, _CONSUMER_THREADS)
        w_turn += prof.clock32() - t1
        n_turn += 1
    else:
        tlx.barrier_wait(k_fulls[idx], phase)
        tlx.named_barrier_wait(_TURN_0 if cid == 0 else _TURN_1, _CONSUMER_THREADS)
    qk = tlx.async_dot(q_buf, tlx.local_trans(k_tiles[idx]))
    if cid == 0:
        tlx.named_barrier_arrive(_TURN_1, _CONSUMER_THREADS)
    else:
        tlx.named_barrier_arrive(_TURN_0, _CONSUMER_THREADS)
    if not FIRST:
        # P·V of the previous block, issued behind QK^T so it overlaps this block's softmax.
        prev = (cnt - 1) % NUM_STAGES
        prev_phase = ((cnt - 1) // NUM_STAGES) & 1
        # Untimed at every level (only the tile's last V wait is): timed, a clock read on each side of
        # it once per block cost level 3 up to 3 points (hsp Lq=256 max=1024 s=0.5: +9.2% with it, +5.8%
        # without: benchmarks/results/instrumentation/roles_cost_h200_2026-12-02{,b}.json).
        tlx.barrier_wait(v_fulls[prev], prev_phase)
        acc = tlx.async_dot(p, v_tiles[prev], acc)
        qk = tlx.async_dot_wait(1, qk)
    else:
        qk = tlx.async_dot_wait(0, qk)
    tlx.barrier_arrive(k_empties[idx], 1)

    if MASK_MODE == _MASK_ALWAYS:
        qk = _apply_mask(qk, blk, row_ids, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_N)
    elif MASK_MODE == _MASK_IF_FLAGGED:
        if masked:
            qk = _apply_mask(qk, blk, row_ids, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_N)
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASK_MODE != _MASK_NEVER:
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_sub = m_new
    if NO_EXP:
        p_f32 = qk * qk_scale - m_sub[:, None]
        alpha = tl.full([qk.shape[0]], 1.0, tl.float32)
    else:
        p_f32 = tl.math.exp2(qk * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p_f32, 1)
    # Carried to the next block's P·V in the input dtype: half the registers of fp32.
    p = p_f32.to(q_buf.dtype)
    m_i = m_new
    if not FIRST:
        acc = tlx.async_dot_wait(0, acc)
        tlx.barrier_arrive(v_empties[prev], 1)
        if BLOCK_N >= 128:
            # P reaches the registers the next block's P·V reads only through this copy: the
            # compiler then rounds it to bf16 straight into that matmul's operand layout instead of
            # permuting the bytes of each register before every P·V (`jfa-prof spills`: 32 PRMT per
            # iteration without it): the HSP Lq=256 points 0.7-4.5% faster; with 64-key blocks (16
            # PRMT) 0.97-1.02x, so not there (benchmarks/results/variants/fwd_moved_p_*).
            p = _moved(p)
    acc = acc * alpha[:, None]
    return p, acc, m_i, l_i, w_k, n_k, w_turn, n_turn


@triton.jit
def _moved(x):
    """x, a 16-bit tensor, copied register by register (two values per register)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)


@triton.jit
def _consume_range(q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, cnt, blk_start,
                   blk_end, mid_lo, mid_hi, p, acc, m_i, l_i, qk_scale, row_ids, Lq, Lk, window, cid: tl.constexpr,
                   w_k, n_k, w_turn, n_turn, MASK_MODE: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                   PROFILE: tl.constexpr, NO_EXP: tl.constexpr):
    """Blocks [blk_start, blk_end); with MASK_MODE == _MASK_IF_FLAGGED only those outside
    [mid_lo, mid_hi), which every valid row sees in full, pay for the mask."""
    for blk in range(blk_start, blk_end):
        masked = (blk < mid_lo) | (blk >= mid_hi)
        p, acc, m_i, l_i, w_k, n_k, w_turn, n_turn = _consume_block(
            q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, cnt, blk, p, acc, m_i,
            l_i, qk_scale, row_ids, Lq, Lk, window, cid, w_k, n_k, w_turn, n_turn, masked, False, MASK_MODE,
            CAUSAL, HAS_WINDOW, BLOCK_N, NUM_STAGES, PROFILE, NO_EXP)
        cnt += 1
    return cnt, p, acc, m_i, l_i, w_k, n_k, w_turn, n_turn


# Integer arguments are left to Triton's specialization (unlike the backward's). Unspecialized, the
# uninstrumented kernel timed 1.04x slower at hsp Lq=128 max=1024 s=0.1 (both schedules), 0.94x at
# Lq=256 max=4096 s=0.9 (static), the same elsewhere: mixed, so not kept
# (benchmarks/results/variants/fwd_unspecialized_ints_h200_2026-11-30_*.json).
# The row counts and strides of Q, K and V only feed the descriptors the kernel builds: unspecialized,
# a new batch's row count never compiles another binary.
@triton.jit(do_not_specialize=["q_rows", "q_stride", "kv_rows", "k_stride", "v_stride"], c_cache=C_CACHE)
def _jfa_fwd(desc_q, desc_k, desc_v, desc_o, o_ptr, lse_ptr, q_offsets, kv_offsets,
             work_list, n_work_ptr, queue_ptr, rec_ptr,
             sm_scale, H, GROUP, n_m_blocks, Lq_bcast, window, total_rows,
             q_rows, q_stride, kv_rows, k_stride, v_stride, rec_tiles_off, rec_tile_cap, rec_spans_off, rec_waits_off,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             PEEL: tl.constexpr, SCHEDULE: tl.constexpr, PROFILE: tl.constexpr,
             NUM_STAGES: tl.constexpr, Q_BUFS: tl.constexpr, ABLATE: tl.constexpr = 0, SAMPLE: tl.constexpr = 1,
             O_BUF: tl.constexpr = True):
    SPLIT_M: tl.constexpr = BLOCK_M // 2
    NO_O_STORE: tl.constexpr = (ABLATE & 1) != 0
    NO_EXP: tl.constexpr = (ABLATE & 2) != 0
    REUSE_KV: tl.constexpr = (ABLATE & 4) != 0
    NO_MASK: tl.constexpr = (ABLATE & 8) != 0
    SLOW_PRODUCER: tl.constexpr = (ABLATE & 16) != 0
    SLOW_EPILOGUE: tl.constexpr = (ABLATE & 32) != 0
    DYNAMIC: tl.constexpr = SCHEDULE == 2
    K_LEAD: tl.constexpr = 1 if NUM_STAGES == 2 else 0  # blocks the producer's K copies run ahead of V's
    # q, k, v and o come as pointers (the op) or as host-made descriptors (a caller comparing the two).
    desc_q = tma.descriptor(desc_q, q_rows, H * HEAD_DIM, q_stride, SPLIT_M, HEAD_DIM)
    desc_k = tma.descriptor(desc_k, kv_rows, (H // GROUP) * HEAD_DIM, k_stride, BLOCK_N, HEAD_DIM)
    desc_v = tma.descriptor(desc_v, kv_rows, (H // GROUP) * HEAD_DIM, v_stride, BLOCK_N, HEAD_DIM)
    desc_o = tma.descriptor(desc_o, total_rows, H * HEAD_DIM, H * HEAD_DIM, SPLIT_M, HEAD_DIM)
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    TILE_BYTES_Q: tl.constexpr = tlx.size_of(dtype) * SPLIT_M * HEAD_DIM
    TILE_BYTES_KV: tl.constexpr = tlx.size_of(dtype) * BLOCK_N * HEAD_DIM

    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    n_work = tl.load(n_work_ptr)

    # Q_BUFS (two) Q buffers per consumer: the producer loads the next tile's Q while this one
    # computes. (One buffer and a third K/V stage fit too; that was slower where Lq = 256 and faster
    # only on the most memory-bound point: benchmarks/results/variants/fwd_variants_*.)
    # Without O_BUF a consumer also stages its output tile through its current Q buffer (see the epilogue).
    q_tiles = tlx.local_alloc((SPLIT_M, HEAD_DIM), dtype, 2 * Q_BUFS)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_STAGES)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_STAGES)
    if O_BUF:
        # A staging buffer per consumer for its output tile (see the epilogue): 32 KB, what the
        # shared memory had left (231,428 of 232,448 bytes with D=128). 0.3-3.6% faster kernels
        # at every HSP point (benchmarks/results/variants/fwd_o_buf*_h200_2026-12-02.json): each
        # 128-key block 6% faster without the loop's proxy fence, each tile 0.1-0.3 us slower
        # (benchmarks/results/limits/tile_cost_lq256_o_buf_*).
        o_tiles = tlx.local_alloc((SPLIT_M, HEAD_DIM), dtype, 2)
    q_fulls = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=2 * Q_BUFS, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=2)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=2)
    # The producer walks the work list (the dynamic schedule: takes positions from the global
    # queue), decodes each tile and hands it to both consumers through a one-slot shared-memory
    # mailbox per consumer.
    box = tlx.local_alloc((_BOX_WORDS, ), tl.int32, 2)
    box_fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    box_empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)

    with tlx.async_tasks():
        # ----------------------------------------------------------------------------------
        # Producer: TMA loads of Q and K/V; in the dynamic schedule also the work queue.
        # ----------------------------------------------------------------------------------
        with tlx.async_task("default"):
            if PROFILE:
                prof.span_begin(rec_ptr, rec_spans_off, pid, 0, _N_ROLES)
            w_qe = prof.counter()
            n_qe = prof.counter()
            w_ke = prof.counter()
            n_ke = prof.counter()
            w_ve = prof.counter()
            n_ve = prof.counter()
            w_pe = prof.counter()
            n_pe = prof.counter()
            kv_cnt = 0
            q_cnt = 0
            n_done = 0
            # Tiles are claimed and decoded a tile ahead: a tile's position (the queue's atomic), its
            # list entry and its offsets are three dependent global round trips, which, taken between
            # two tiles, put the producer on the critical path of most short tiles (the consumers
            # waiting for the next tile in the mailbox and for its Q). So the next tile is decoded
            # while this one's first K / V copies are on their way, and the one after it claimed then
            # (its position is read a tile later). Kernel alone 0.92-0.98x of the time at the HSP
            # points with short tiles on the H100, most of it from the relaxed atomic; decoding two
            # ahead gained no more (benchmarks/results/variants/fwd_ab_decode_ahead_*).
            pos = pid
            tile = tl.load(work_list + pos, mask=pos < n_work, other=0)
            b, h, m0, Lq, Lk, q_row0, o_row0, kv_start, blk_lo, n_blocks = _tile_geometry(
                tile, H, n_m_blocks, Lq_bcast, window, q_offsets, kv_offsets, BROADCAST_Q,
                CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
            nxt = _next_position(pos, n_progs, queue_ptr, DYNAMIC)
            while pos < n_work:
                if PROFILE >= 3:
                    # The event offset through an opaque move (here and in the consumers), so the record addresses
                    # are rebuilt per record instead of hoisted out of the persistent loop: hoisted, they spilled
                    # (the 128-key build: 180 bytes, 32 local loads, some at every tile); rebuilt, none. Kernel
                    # alone, H100, level 3 over level 0 at three HSP Lq=256 points: 1.119 / 1.050 / 1.041x against
                    # 1.124 / 1.059 / 1.067x (benchmarks/results/instrumentation/l3_opaque_events_ab_fwd_*). The
                    # backward's spilled more with it (48 bytes against 24): not there.
                    ev = prof.event_base(rec_ptr, prof.opaque(rec_waits_off), rec_tile_cap, pos, 0, n_progs, _N_ROLES,
                                         _N_SITES, SAMPLE)
                    prof.event_start(rec_ptr, ev, pid, prof.globaltimer(), tlx.clock64())
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, False, _PRODUCER_SITES, (w_qe, w_ke, w_ve, w_pe))
                for c in tl.static_range(2):
                    w_pe, n_pe = _post_tile(box[c], box_fulls[c], box_empties[c], (n_done & 1) ^ 1, pos, tile, b, h,
                                            m0, Lq, Lk, o_row0, blk_lo, n_blocks, w_pe, n_pe, PROFILE)
                if PROFILE >= 3:
                    prof.event_mark(rec_ptr, ev)
                kv_col = (h // GROUP) * HEAD_DIM
                if n_blocks > 0:
                    qb = q_cnt % Q_BUFS
                    q_phase = (q_cnt // Q_BUFS) & 1
                    # Q for consumer 0, first K, Q for consumer 1, first V: consumer 0 starts early.
                    w_qe, n_qe = prof.timed_wait(q_empties[qb], q_phase ^ 1, w_qe, n_qe, PROFILE)
                    tlx.barrier_expect_bytes(q_fulls[qb], TILE_BYTES_Q)
                    tlx.async_descriptor_load(desc_q, q_tiles[qb], [q_row0 + m0, h * HEAD_DIM], q_fulls[qb])
                    w_ke, n_ke = _load_kv(desc_k, k_tiles, k_fulls, k_empties, kv_cnt,
                                          kv_start + blk_lo * BLOCK_N, kv_col, TILE_BYTES_KV, w_ke, n_ke,
                                          NUM_STAGES, PROFILE)
                    w_qe, n_qe = prof.timed_wait(q_empties[Q_BUFS + qb], q_phase ^ 1, w_qe, n_qe, PROFILE)
                    tlx.barrier_expect_bytes(q_fulls[Q_BUFS + qb], TILE_BYTES_Q)
                    tlx.async_descriptor_load(desc_q, q_tiles[Q_BUFS + qb], [q_row0 + m0 + SPLIT_M, h * HEAD_DIM],
                                              q_fulls[Q_BUFS + qb])
                    w_ve, n_ve = _load_kv(desc_v, v_tiles, v_fulls, v_empties, kv_cnt,
                                          kv_start + blk_lo * BLOCK_N, kv_col, TILE_BYTES_KV, w_ve, n_ve,
                                          NUM_STAGES, PROFILE)
                    kv_cnt += 1
                # The next tile (a position past the list's end reads entry 0: decoded, never used).
                nxt_after = _next_position(nxt, n_progs, queue_ptr, DYNAMIC)
                tile_n = tl.load(work_list + nxt, mask=nxt < n_work, other=0)
                b_n, h_n, m0_n, Lq_n, Lk_n, q_row0_n, o_row0_n, kv_start_n, blk_lo_n, n_blocks_n = _tile_geometry(
                    tile_n, H, n_m_blocks, Lq_bcast, window, q_offsets, kv_offsets, BROADCAST_Q,
                    CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
                if n_blocks > 0:
                    # Block j's K slot is freed by block j-2's QK^T, its V slot only once block j-2's P.V
                    # is done, about half a block later: in a ring two deep, K copies issued in (K, V)
                    # pairs each waited behind the V slot before them, so there K runs a block ahead
                    # (kernel alone 0.98-0.99x at HSP Lq=256 with short tiles, H100:
                    # benchmarks/results/variants/fwd_ab_k_ahead_ring2_*).
                    row0 = kv_start + blk_lo * BLOCK_N
                    for j in range(1, n_blocks + K_LEAD):
                        if j < n_blocks:
                            if SLOW_PRODUCER:
                                prof.spin(_PLANT_CYCLES)
                            w_ke, n_ke = _load_kv(desc_k, k_tiles, k_fulls, k_empties, kv_cnt + j - 1,
                                                  row0 + j * BLOCK_N, kv_col, TILE_BYTES_KV, w_ke, n_ke, NUM_STAGES,
                                                  PROFILE, REUSE_KV)
                        if j - K_LEAD >= 1:
                            w_ve, n_ve = _load_kv(desc_v, v_tiles, v_fulls, v_empties, kv_cnt + j - K_LEAD - 1,
                                                  row0 + (j - K_LEAD) * BLOCK_N, kv_col, TILE_BYTES_KV, w_ve, n_ve,
                                                  NUM_STAGES, PROFILE, REUSE_KV)
                    kv_cnt += n_blocks - 1
                    q_cnt += 1
                if PROFILE >= 3:
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, True, _PRODUCER_SITES, (w_qe, w_ke, w_ve, w_pe))
                    prof.event_end(rec_ptr, ev)
                n_done += 1
                pos = nxt
                nxt = nxt_after
                tile = tile_n
                b, h, m0, Lq, Lk, q_row0, o_row0 = b_n, h_n, m0_n, Lq_n, Lk_n, q_row0_n, o_row0_n
                kv_start, blk_lo, n_blocks = kv_start_n, blk_lo_n, n_blocks_n
            # Tell both consumers the list is done.
            for c in tl.static_range(2):
                w_pe, n_pe = _post_tile(box[c], box_fulls[c], box_empties[c], (n_done & 1) ^ 1, pos, 0, 0, 0, 0, 0, 0,
                                        0, 0, 0, w_pe, n_pe, PROFILE)
            if PROFILE:
                prof.span_end(rec_ptr, rec_spans_off, pid, 0, _N_ROLES, n_done)
                prof.write_wait(rec_ptr, rec_waits_off, pid, 0, _N_ROLES, _S_Q_EMPTY, _N_SITES, w_qe, n_qe)
                prof.write_wait(rec_ptr, rec_waits_off, pid, 0, _N_ROLES, _S_K_EMPTY, _N_SITES, w_ke, n_ke)
                prof.write_wait(rec_ptr, rec_waits_off, pid, 0, _N_ROLES, _S_V_EMPTY, _N_SITES, w_ve, n_ve)
                prof.write_wait(rec_ptr, rec_waits_off, pid, 0, _N_ROLES, _S_QUEUE, _N_SITES, w_pe, n_pe)

        # ----------------------------------------------------------------------------------
        # Consumers: online softmax over the tile's KV blocks, 64 query rows each.
        # ----------------------------------------------------------------------------------
        with tlx.async_task(num_warps=4, registers=232, replicate=2):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if PROFILE:
                prof.span_begin(rec_ptr, rec_spans_off, pid, 1 + cid, _N_ROLES)
            w_qf = prof.counter()
            n_qf = prof.counter()
            w_kf = prof.counter()
            n_kf = prof.counter()
            w_vf = prof.counter()
            n_vf = prof.counter()
            w_turn = prof.counter()
            n_turn = prof.counter()
            w_pf = prof.counter()
            n_pf = prof.counter()
            qk_scale = sm_scale * 1.44269504088896  # softmax in base 2: exp(x) = exp2(x * log2(e))
            kv_cnt = 0
            q_cnt = 0
            n_done = 0
            if cid == 1:
                # Consumer 0 takes the first turn on the tensor cores.
                tlx.named_barrier_arrive(_TURN_0, _CONSUMER_THREADS)
            if PROFILE >= 3:
                # A consumer's window on a tile opens with its wait for the tile in the mailbox.
                t_take = prof.globaltimer()
                c_take = tlx.clock64()
                w_pf_take = w_pf
            pos, tile, b, h, m0, Lq, Lk, o_row0, blk_lo, n_blocks, w_pf, n_pf = _take_tile(
                box[cid], box_fulls[cid], box_empties[cid], 0, cid, w_pf, n_pf, PROFILE)
            while pos < n_work:
                if PROFILE:
                    t0 = prof.globaltimer()
                    c0 = tlx.clock64()
                if PROFILE >= 3:
                    ev = prof.event_base(rec_ptr, prof.opaque(rec_waits_off), rec_tile_cap, pos, 1 + cid, n_progs,
                                         _N_ROLES, _N_SITES, SAMPLE)
                    prof.event_start(rec_ptr, ev, pid, t_take, c_take)
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, False, _CONSUMER_SITES,
                                          (w_qf, w_kf, w_vf, w_turn, w_pf_take))
                r0 = m0 + cid * SPLIT_M
                row_ids = r0 + tl.arange(0, SPLIT_M)
                m_i = tl.full([SPLIT_M], float("-inf"), tl.float32)
                l_i = tl.zeros([SPLIT_M], tl.float32)
                acc = tl.zeros([SPLIT_M, HEAD_DIM], tl.float32)
                q_slot = cid * Q_BUFS + q_cnt % Q_BUFS
                q_buf = q_tiles[q_slot]
                if n_blocks > 0:
                    # Blocks every valid row of this consumer sees in full need no mask.
                    r_first = r0
                    r_last = tl.minimum(r0 + SPLIT_M, Lq) - 1
                    full_lo = 0
                    full_hi = Lk
                    if HAS_WINDOW:
                        full_lo = tl.maximum(r_last - window, 0)
                        full_hi = tl.minimum(full_hi, r_first + window + 1)
                    if CAUSAL:
                        full_hi = tl.minimum(full_hi, r_first + Lk - Lq + 1)
                    blk_hi = blk_lo + n_blocks
                    if NO_MASK:
                        mid_lo = blk_lo
                        mid_hi = blk_hi
                    elif PEEL:
                        mid_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N), blk_lo), blk_hi)
                        mid_hi = tl.minimum(tl.maximum(full_hi // BLOCK_N, mid_lo), blk_hi)
                        mid_hi = tl.where(r_last >= r_first, mid_hi, mid_lo)
                    else:
                        mid_lo = blk_hi
                        mid_hi = blk_hi
                    w_qf, n_qf = prof.timed_wait(q_fulls[q_slot], (q_cnt // Q_BUFS) & 1, w_qf, n_qf, PROFILE)
                    p = tl.zeros([SPLIT_M, BLOCK_N], dtype)
                    if NO_MASK:
                        MODE: tl.constexpr = _MASK_NEVER
                    elif PEEL:
                        MODE: tl.constexpr = _MASK_IF_FLAGGED
                    else:
                        MODE: tl.constexpr = _MASK_ALWAYS
                    p, acc, m_i, l_i, w_kf, n_kf, w_turn, n_turn = _consume_block(
                        q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_cnt, blk_lo,
                        p, acc, m_i, l_i, qk_scale, row_ids, Lq, Lk, window, cid, w_kf, n_kf, w_turn,
                        n_turn, (blk_lo < mid_lo) | (blk_lo >= mid_hi), True, MODE, CAUSAL, HAS_WINDOW, BLOCK_N,
                        NUM_STAGES, PROFILE, NO_EXP)
                    kv_cnt += 1
                    kv_cnt, p, acc, m_i, l_i, w_kf, n_kf, w_turn, n_turn = _consume_range(
                        q_buf, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_cnt, blk_lo + 1,
                        blk_hi, mid_lo, mid_hi, p, acc, m_i, l_i, qk_scale, row_ids, Lq, Lk, window, cid, w_kf, n_kf,
                        w_turn, n_turn, MODE, CAUSAL, HAS_WINDOW, BLOCK_N, NUM_STAGES, PROFILE, NO_EXP)
                    # The last block's P·V.
                    last = (kv_cnt - 1) % NUM_STAGES
                    w_vf, n_vf = prof.timed_wait(v_fulls[last], ((kv_cnt - 1) // NUM_STAGES) & 1, w_vf, n_vf,
                                                 PROFILE)
                    acc = tlx.async_dot(p, v_tiles[last], acc)
                    acc = tlx.async_dot_wait(0, acc)
                    tlx.barrier_arrive(v_empties[last], 1)
                if O_BUF:
                    if n_blocks > 0:
                        # No matmul reads this Q any more: the producer may load the next tile's now.
                        tlx.barrier_arrive(q_empties[q_slot], 1)
                        q_cnt += 1
                if PROFILE >= 3:
                    prof.event_mark(rec_ptr, ev)
                if SLOW_EPILOGUE:
                    prof.spin(2 * _PLANT_CYCLES)
                # Epilogue: rows that saw no key get zeros and lse = -inf.
                seen = l_i > 0.0
                l_safe = tl.where(seen, l_i, 1.0)
                # One division per row and a multiply per element: an fp32 division is a sequence of
                # a dozen instructions, and a consumer holds 64 elements per thread. O bit for bit as
                # before; kernel alone 0.98-0.99x at the HSP points with short tiles (H100,
                # benchmarks/results/variants/fwd_ab_k_ahead_recip_*).
                out = (acc * (1.0 / l_safe)[:, None]).to(dtype)
                # lg2.approx (relative error below 2^-22) where libdevice's log2f is two dozen instructions and a
                # branch per row: kernel alone 0.994-0.999x at the HSP points, H100
                # (benchmarks/results/variants/fwd_ab_log2_lse_*).
                lse = tl.where(seen, (m_i + libdevice.fast_log2f(l_safe)) * 0.6931471805599453, float("-inf"))
                row_ok = row_ids < Lq
                o_rows = (o_row0 + row_ids).to(tl.int64)
                if not NO_O_STORE:
                    tl.store(lse_ptr + h.to(tl.int64) * total_rows + o_rows, lse, mask=row_ok)
                # The tile goes out through shared memory (the compiler then needs no 32 KB scratch
                # per consumer for the layout change): with O_BUF through a buffer of the
                # consumer's own, whose TMA store is waited for only before the next tile writes
                # it, so the store overlaps the next tile; else through its Q buffer, whose Q is
                # no longer needed, waited for at once (the Q buffer goes back only then, and a
                # proxy fence precedes every QK^T, since Q's buffer also takes generic writes).
                # A half tile whose 64 rows all belong to the sequence goes out with one TMA
                # store; a ragged one in row chunks, masked, whose pointers fit in a few
                # registers. A tile without keys writes zeros from registers (without O_BUF its Q
                # buffer may be filling for the next tile).
                whole = (r0 + SPLIT_M <= Lq) & (n_blocks > 0)
                if O_BUF:
                    stage = o_tiles[cid]
                    # The previous tile's store (issued by one thread) has read the buffer once
                    # that thread's wait returns; the barrier holds the others until then.
                    tlx.async_descriptor_store_wait(0)
                    tlx.named_barrier_wait(_STAGE_BAR + cid, _WARPGROUP_THREADS)
                else:
                    stage = q_buf
                if n_blocks > 0:
                    tlx.local_store(stage, out)
                    tlx.fence("async_shared")
                tlx.named_barrier_wait(_STAGE_BAR + cid, _WARPGROUP_THREADS)
                cols = tl.arange(0, HEAD_DIM)
                if whole:
                    if not NO_O_STORE:
                        tlx.async_descriptor_store(desc_o, stage, [o_row0 + r0, h * HEAD_DIM])
                        if not O_BUF:
                            tlx.async_descriptor_store_wait(0)
                else:
                    for c in tl.static_range(SPLIT_M // _STORE_ROWS):
                        rows = r0 + c * _STORE_ROWS + tl.arange(0, _STORE_ROWS)
                        if n_blocks > 0:
                            chunk = tlx.local_load(tlx.local_slice(stage, [c * _STORE_ROWS, 0],
                                                                   [_STORE_ROWS, HEAD_DIM]))
                        else:
                            chunk = tl.zeros([_STORE_ROWS, HEAD_DIM], dtype)
                        ptrs = (o_ptr + (o_row0 + rows).to(tl.int64)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM
                                + cols[None, :])
                        if not NO_O_STORE:
                            tl.store(ptrs, chunk, mask=(rows < Lq)[:, None])
                if not O_BUF:
                    tlx.named_barrier_wait(_STAGE_BAR + cid, _WARPGROUP_THREADS)
                    if n_blocks > 0:
                        tlx.barrier_arrive(q_empties[q_slot], 1)
                        q_cnt += 1
                if PROFILE:
                    if cid == 0:
                        prof.write_tile(rec_ptr, rec_tiles_off, rec_tile_cap, pos, pid, prof.smid(), tile, b, h,
                                        m0 // BLOCK_M, Lk, n_blocks, t0, prof.globaltimer(), c0, tlx.clock64(),
                                        1 + cid)
                if PROFILE >= 3:
                    prof.event_site_waits(rec_ptr, ev, _N_SITES, True, _CONSUMER_SITES,
                                          (w_qf, w_kf, w_vf, w_turn, w_pf))
                    prof.event_end(rec_ptr, ev)
                    t_take = prof.globaltimer()
                    c_take = tlx.clock64()
                    w_pf_take = w_pf
                n_done += 1
                pos, tile, b, h, m0, Lq, Lk, o_row0, blk_lo, n_blocks, w_pf, n_pf = _take_tile(
                    box[cid], box_fulls[cid], box_empties[cid], n_done & 1, cid, w_pf, n_pf, PROFILE)
            if O_BUF:
                tlx.async_descriptor_store_wait(0)  # the last tile's store reads shared memory
            if PROFILE:
                role = 1 + cid
                prof.span_end(rec_ptr, rec_spans_off, pid, role, _N_ROLES, n_done)
                prof.write_wait(rec_ptr, rec_waits_off, pid, role, _N_ROLES, _S_Q_FULL, _N_SITES, w_qf, n_qf)
                prof.write_wait(rec_ptr, rec_waits_off, pid, role, _N_ROLES, _S_K_FULL, _N_SITES, w_kf, n_kf)
                prof.write_wait(rec_ptr, rec_waits_off, pid, role, _N_ROLES, _S_V_FULL, _N_SITES, w_vf, n_vf)
                prof.write_wait(rec_ptr, rec_waits_off, pid, role, _N_ROLES, _S_TURN, _N_SITES, w_turn, n_turn)
                prof.write_wait(rec_ptr, rec_waits_off, pid, role, _N_ROLES, _S_QUEUE, _N_SITES, w_pf, n_pf)


# ---------------------------------------------------------------------------------------------
# Variants: every constexpr combination the op can launch, by name.
# ---------------------------------------------------------------------------------------------
_DTYPES = {"bf16": "bf16", "fp16": "fp16"}


def fwd_signature(dtype: str, head_dim: int, block_n: int = BLOCK_N) -> dict[str, str]:
    # As the op launches it: q, k, v and o as pointers, their descriptors built in the kernel.
    sig = {"desc_q": f"*{dtype}", "desc_k": f"*{dtype}", "desc_v": f"*{dtype}", "desc_o": f"*{dtype}",
           "o_ptr": f"*{dtype}", "lse_ptr": "*fp32",
           "q_offsets": "*i32", "kv_offsets": "*i32", "work_list": "*i32", "n_work_ptr": "*i32",
           "queue_ptr": "*i32", "rec_ptr": "*i64", "sm_scale": "fp32"}
    for name in ("H", "GROUP", "n_m_blocks", "Lq_bcast", "window", "total_rows", "q_rows", "q_stride", "kv_rows",
                 "k_stride", "v_stride", "rec_tiles_off", "rec_tile_cap",
                 "rec_spans_off", "rec_waits_off"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BROADCAST_Q", "CAUSAL", "HAS_WINDOW", "PEEL", "SCHEDULE",
                 "PROFILE", "NUM_STAGES", "Q_BUFS", "ABLATE", "SAMPLE", "O_BUF"):
        sig[name] = "constexpr"
    return sig


def fwd_constexprs(*, head_dim, broadcast_q, causal, has_window, peel, schedule, profile, ablate=0,
                   kv_stages=None, q_bufs=NUM_Q_BUFS, block_n=BLOCK_N, sample=1, o_buf=O_BUF) -> dict:
    """`block_n`: keys per KV block; the K/V ring depth follows it (`KV_STAGES`) unless `kv_stages`
    overrides it. `kv_stages` and `q_bufs` (Q buffers per consumer) exist for benchmarks of the choice.
    `sample`: at profile level 3, event records for every `sample`-th tile of the list. `o_buf`: the
    output staged through a buffer of its own (default) or through the Q buffer, to compare."""
    return {"HEAD_DIM": head_dim, "BLOCK_M": BLOCK_M, "BLOCK_N": block_n, "BROADCAST_Q": broadcast_q,
            "CAUSAL": causal, "HAS_WINDOW": has_window, "PEEL": peel, "SCHEDULE": SCHEDULE_IDS[schedule],
            "PROFILE": int(profile), "NUM_STAGES": kv_stages or KV_STAGES[block_n], "Q_BUFS": q_bufs, "ABLATE": ablate,
            "SAMPLE": sample, "O_BUF": o_buf}


# PROFILE levels by the name they carry in variant names.
PROFILE_LEVELS = {"noprof": 0, "prof-tiles": 1, "prof": 2, "prof-roles": 3}


@provider
def fwd_variants() -> list[KernelVariant]:
    """The forward variants worth compiling on their own: the broadcast-Q production path across
    dtypes, head dims, schedules, peeling and profiling levels, plus the jagged-Q mask modes; each
    peeled one also with the 64-key blocks of single-query-block launches (name suffix /n64)."""
    out = []
    modes = [("bcast", True, False, False), ("jagged", False, False, False), ("jagged-causal", False, True, False),
             ("jagged-window", False, False, True)]
    for dtype in _DTYPES:
        for head_dim in (64, 128):
            for mode, broadcast_q, causal, has_window in modes:
                for schedule in SCHEDULE_IDS:
                    for peel in (True, False):
                        for prof_name, level in PROFILE_LEVELS.items():
                            if mode != "bcast" and (schedule == "static" or not peel or level == 1):
                                continue  # mask modes share the schedule/peeling/profiling code with bcast
                            if level == 3 and (mode != "bcast" or not peel or dtype != "bf16"):
                                continue  # the role events are the same code in every mode and dtype
                            for block_n in (BLOCK_N, SHORT_Q_BLOCK_N):
                                if block_n != BLOCK_N and not peel:
                                    continue
                                name = (f"fwd/{mode}/{dtype}/d{head_dim}/{schedule}/{'peel' if peel else 'nopeel'}/"
                                        f"{prof_name}" + ("" if block_n == BLOCK_N else f"/n{block_n}"))
                                out.append(KernelVariant(
                                    name=name, kernel=_jfa_fwd, signature=fwd_signature(dtype, head_dim, block_n),
                                    constexprs=fwd_constexprs(head_dim=head_dim, broadcast_q=broadcast_q,
                                                              causal=causal, has_window=has_window, peel=peel,
                                                              schedule=schedule, profile=level, block_n=block_n),
                                    num_warps=NUM_WARPS, num_stages=1,
                                    tags={"pass": "fwd", "mode": mode, "dtype": dtype, "head_dim": str(head_dim),
                                          "schedule": schedule, "peel": str(peel).lower(), "profile": prof_name,
                                          "block_n": str(block_n)}))
    return out
