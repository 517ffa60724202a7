"""Jagged Flash Attention backward for Hopper (sm_90a): the first, correct version.

Plain Triton; `tl.dot` lowers to wgmma on sm_90. Two kernels:

- `_jfa_bwd_delta`: delta = rowsum(dO * O) in fp32, `[H, rows]` like the log-sum-exp. It is the
  row term of the softmax gradient, dS = P * (dP - delta), computed once instead of once per
  KV block.
- `_jfa_bwd`: one program per (batch, kv head, KV block of `BLOCK_N` keys). The program keeps
  its K and V block resident, walks the query heads of the kv head's group and, for each, the
  query blocks that can see this KV block, recomputing P from Q, K and the saved log-sum-exp.
  dK and dV are summed over the whole group in registers and written once, so GQA needs no
  second reduction pass. dQ is a sum over KV blocks (and, for broadcast-Q, over the batch too,
  since every sequence reads the same Q rows); it is accumulated with fp32 atomic adds into a
  zeroed `[rows_q, H, D]` buffer that the launcher converts to the input dtype.

The tiles are computed transposed (keys on the rows): P^T and dS^T are then the register
operand (A) of the dV and dK matmuls, the only operand wgmma can take from registers, and K, V,
Q and dO stay in shared memory.

Masks are the forward's (`fwd._tile_geometry`, `fwd._consume_block`): sequence end, symmetric
window |i - j| <= W, causal bottom-right j <= i + Lk - Lq. Every tile is masked here; peeling the
interior blocks, like the forward does, is left to the persistent warp-specialized version.
"""
import triton
import triton.language as tl

from jfa_prof.kernels.registry import KernelVariant, provider

BLOCK_N = 128  # keys per program: the dK/dV accumulators it owns
# Query rows per inner step. The [BLOCK_N, BLOCK_M] score tiles and the dQ tile live beside the two
# [BLOCK_N, D] fp32 accumulators; at D = 128, 64 rows no longer fit in 255 registers.
BLOCK_M = 32
NUM_WARPS = 8  # two warpgroups: each owns 64 of the block's keys in every wgmma
NUM_STAGES = 2  # the inner loop's lse/delta loads are issued one query block ahead
DELTA_ROWS = 16  # rows per program of the delta kernel
DELTA_WARPS = 4

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit(do_not_specialize=["total_rows", "H"])
def _jfa_bwd_delta(o_ptr, do_ptr, delta_ptr, total_rows, H, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    h = tl.program_id(1)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows < total_rows
    offs = (rows.to(tl.int64) * H + h)[:, None] * HEAD_DIM + cols[None, :]
    o = tl.load(o_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + h.to(tl.int64) * total_rows + rows, tl.sum(o * do, 1), mask=ok)


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


# Lengths, head counts and the window change from batch to batch: specializing on their values
# (== 1, divisible by 16) would recompile per batch and make the launched binary differ from the
# one `jfa-prof spills` compiles from the registry.
@triton.jit(do_not_specialize=["H", "GROUP", "n_kv_blocks", "Lq_bcast", "window", "total_rows", "dkv_heads"])
def _jfa_bwd(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, q_offsets, kv_offsets,
             sm_scale, H, GROUP, n_kv_blocks, Lq_bcast, window, total_rows, dkv_heads,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    dtype: tl.constexpr = q_ptr.dtype.element_ty
    # KV blocks innermost in the grid: neighbouring programs share the batch's Q rows in L2.
    pid = tl.program_id(0)
    blk = pid % n_kv_blocks
    b_kvh = pid // n_kv_blocks
    H_kv = H // GROUP
    b = b_kvh // H_kv
    kvh = b_kvh % H_kv
    kv_start = tl.load(kv_offsets + b)
    Lk = tl.load(kv_offsets + b + 1) - kv_start
    n0 = blk * BLOCK_N
    # The grid is sized by the longest sequence; shorter ones have nothing past their end.
    if n0 < Lk:
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
        kv_row_offs = _row_offsets(BLOCK_N, H_kv * HEAD_DIM, HEAD_DIM)
        kv_base = _head_base(kv_start + n0, H_kv, kvh, HEAD_DIM)
        k = tl.load(k_ptr + kv_base + kv_row_offs, mask=n_ok[:, None], other=0.0)
        v = tl.load(v_ptr + kv_base + kv_row_offs, mask=n_ok[:, None], other=0.0)
        m_lo, m_hi = _query_block_range(n0, Lq, Lk, window, CAUSAL, HAS_WINDOW, BLOCK_M, BLOCK_N)
        qk_scale = sm_scale * _LOG2E  # exponentials in base 2, as in the forward
        q_row_offs = _row_offsets(BLOCK_M, H * HEAD_DIM, HEAD_DIM)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        for g in range(GROUP):
            h = kvh * GROUP + g
            for m_blk in range(m_lo, m_hi):
                m0 = m_blk * BLOCK_M
                m_ids = m0 + tl.arange(0, BLOCK_M)
                m_ok = m_ids < Lq
                q_base = _head_base(q_row0 + m0, H, h, HEAD_DIM)
                o_base = _head_base(o_row0 + m0, H, h, HEAD_DIM)
                stat_offs = h.to(tl.int64) * total_rows + o_row0 + m_ids
                q = tl.load(q_ptr + q_base + q_row_offs, mask=m_ok[:, None], other=0.0)
                do = tl.load(do_ptr + o_base + q_row_offs, mask=m_ok[:, None], other=0.0)
                lse = tl.load(lse_ptr + stat_offs, mask=m_ok, other=0.0)
                delta = tl.load(delta_ptr + stat_offs, mask=m_ok, other=0.0)

                visible = n_ok[:, None] & m_ok[None, :]
                if HAS_WINDOW:
                    diff = m_ids[None, :] - n_ids[:, None]
                    visible = visible & (diff <= window) & (diff >= -window)
                if CAUSAL:
                    visible = visible & (n_ids[:, None] <= m_ids[None, :] + (Lk - Lq))
                # P recomputed from the saved log-sum-exp. A row that saw no key has lse = -inf
                # and no visible entry, so the select, not the exponential, makes its P zero.
                qk_t = tl.dot(k, tl.trans(q))
                p_t = tl.where(visible, tl.math.exp2(qk_t * qk_scale - lse[None, :] * _LOG2E), 0.0)
                dv += tl.dot(p_t.to(dtype), do)
                dp_t = tl.dot(v, tl.trans(do))
                ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)
                dk += tl.dot(ds_t, q)
                # dQ^T = K^T dS^T keeps the block's 128 keys as the reduction dimension and the head
                # dim as wgmma's M; dS^T dotted the other way round would have only BLOCK_M rows,
                # too few for wgmma, and fall back to mma.sync with K copied into registers.
                dq_t = tl.dot(tl.trans(k), ds_t) * sm_scale
                # Relaxed: only the sum matters, and it is read after the kernel ends.
                tl.atomic_add(dq_ptr + q_base + tl.trans(q_row_offs), dq_t, mask=m_ok[None, :], sem="relaxed")
        # Keys no query sees still get their (zero) rows written: dK and dV come from torch.empty.
        # The store's offsets and mask are built here from values the K/V load did not use (dK's
        # own head count, the rows left in the sequence), so the compiler cannot merge them with
        # the load's and keep a [BLOCK_N, HEAD_DIM] offset and mask tile alive across the loop,
        # where the dK/dV accumulators need the registers.
        dkv_offs = _row_offsets(BLOCK_N, dkv_heads * HEAD_DIM, HEAD_DIM)
        rows_left = tl.arange(0, BLOCK_N) < Lk - n0
        tl.store(dk_ptr + kv_base + dkv_offs, (dk * sm_scale).to(dtype), mask=rows_left[:, None])
        tl.store(dv_ptr + kv_base + dkv_offs, dv.to(dtype), mask=rows_left[:, None])


# ---------------------------------------------------------------------------------------------
# Variants: every constexpr combination the op can launch, by name.
# ---------------------------------------------------------------------------------------------
def bwd_signature(dtype: str) -> dict[str, str]:
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "do_ptr": f"*{dtype}",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": "*fp32", "dk_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}",
           "q_offsets": "*i32", "kv_offsets": "*i32", "sm_scale": "fp32"}
    for name in ("H", "GROUP", "n_kv_blocks", "Lq_bcast", "window", "total_rows", "dkv_heads"):
        sig[name] = "i32"
    for name in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BROADCAST_Q", "CAUSAL", "HAS_WINDOW"):
        sig[name] = "constexpr"
    return sig


def bwd_constexprs(*, head_dim, broadcast_q, causal, has_window) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BROADCAST_Q": broadcast_q,
            "CAUSAL": causal, "HAS_WINDOW": has_window}


def delta_signature(dtype: str) -> dict[str, str]:
    return {"o_ptr": f"*{dtype}", "do_ptr": f"*{dtype}", "delta_ptr": "*fp32", "total_rows": "i32", "H": "i32",
            "HEAD_DIM": "constexpr", "BLOCK_ROWS": "constexpr"}


def delta_constexprs(*, head_dim) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_ROWS": DELTA_ROWS}


# Every mask combination the op can launch (causal is jagged-only): (BROADCAST_Q, CAUSAL, HAS_WINDOW).
MODES = {"bcast": (True, False, False), "bcast-window": (True, False, True), "jagged": (False, False, False),
         "jagged-causal": (False, True, False), "jagged-window": (False, False, True),
         "jagged-causal-window": (False, True, True)}


@provider
def bwd_variants() -> list[KernelVariant]:
    """The main backward kernel per mask mode, dtype and head dim, plus the delta kernel per dtype
    and head dim (it has no mask, so one variant serves every mode)."""
    out = []
    for dtype in ("bf16", "fp16"):
        for head_dim in (64, 128):
            for mode, (broadcast_q, causal, has_window) in MODES.items():
                out.append(KernelVariant(
                    name=f"bwd/{mode}/{dtype}/d{head_dim}", kernel=_jfa_bwd, signature=bwd_signature(dtype),
                    constexprs=bwd_constexprs(head_dim=head_dim, broadcast_q=broadcast_q, causal=causal,
                                              has_window=has_window),
                    num_warps=NUM_WARPS, num_stages=NUM_STAGES,
                    tags={"pass": "bwd", "mode": mode, "dtype": dtype, "head_dim": str(head_dim)}))
            out.append(KernelVariant(
                name=f"bwd/delta/{dtype}/d{head_dim}", kernel=_jfa_bwd_delta, signature=delta_signature(dtype),
                constexprs=delta_constexprs(head_dim=head_dim), num_warps=DELTA_WARPS, num_stages=1,
                tags={"pass": "bwd", "mode": "delta", "dtype": dtype, "head_dim": str(head_dim)}))
    return out
