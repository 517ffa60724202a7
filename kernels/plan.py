"""Work lists built on the GPU in a handful of launches.

The same lists as `jfa_prof.schedule` builds with tensor ops (that version is the reference and
the CPU path), but with the per-tile geometry and the zigzag fused into two small kernels around
one `torch.sort`: a dozen tensor ops cost more host time than a short attention kernel runs.
The geometry is the forward kernel's own `_tile_geometry`, so the two cannot disagree.
"""
import torch
import triton
import triton.language as tl

from jfa_prof.kernels import C_CACHE
from jfa_prof.kernels.fwd import _tile_geometry

_BLOCK = 1024


@triton.jit(c_cache=C_CACHE)
def _plan_keys(kv_offsets, q_offsets, keys, costs, n_work, n_tiles, H, n_m_blocks, Lq_bcast, window,
               BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BY_COST: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = t < n_tiles
    b, h, m0, Lq, Lk, q_row0, o_row0, kv_start, blk_lo, n_blocks = _tile_geometry(
        tl.where(ok, t, 0), H, n_m_blocks, Lq_bcast, window, q_offsets, kv_offsets, BROADCAST_Q, CAUSAL, HAS_WINDOW,
        BLOCK_M, BLOCK_N)
    has_rows = (m0 < Lq) & ok
    if BY_COST:
        # Longest first; tiles with rows but no visible key still run (they write zeros).
        key = tl.where(has_rows, n_blocks + 1, 0)
    else:
        key = has_rows.to(tl.int32)
    tl.store(keys + t, key, mask=ok)
    tl.store(costs + t, n_blocks, mask=ok)
    tl.atomic_add(n_work, tl.sum(has_rows.to(tl.int32), 0), sem="relaxed")


@triton.jit(c_cache=C_CACHE)
def _plan_deal(order, costs, tiles_out, costs_out, n_work, n, n_ctas, ZIGZAG: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < n
    src = tl.load(order + p, mask=ok, other=0)
    dest = p
    if ZIGZAG:
        # Odd rounds run backwards, only where the whole round lies inside the valid prefix.
        rnd = p // n_ctas
        full = (rnd + 1) * n_ctas <= tl.load(n_work)
        dest = tl.where((rnd % 2 == 1) & full, rnd * n_ctas + (n_ctas - 1 - p % n_ctas), p)
    tl.store(tiles_out + dest, src.to(tl.int32), mask=ok)
    tl.store(costs_out + dest, tl.load(costs + src, mask=ok, other=0), mask=ok)


def fwd_work_list_gpu(kv_offsets, q_offsets, Lq, H, n_m_blocks, *, block_m, block_n, window, causal, schedule,
                      n_ctas):
    """(tiles, n_work, costs, queue) in execution order; see `jfa_prof.schedule.fwd_work_list`. queue is a
    zeroed tile counter for the dynamic schedule, allocated with n_work in one zero fill."""
    B = kv_offsets.numel() - 1
    n = B * H * n_m_blocks
    dev = kv_offsets.device
    keys = torch.empty(n, dtype=torch.int32, device=dev)
    costs = torch.empty(n, dtype=torch.int32, device=dev)
    counters = torch.zeros(2, dtype=torch.int32, device=dev)
    n_work, queue = counters[:1], counters[1:]
    grid = (triton.cdiv(n, _BLOCK), )
    _plan_keys[grid](kv_offsets, kv_offsets if q_offsets is None else q_offsets, keys, costs, n_work, n, H,
                     n_m_blocks, Lq or 0, window if window is not None else 0, BROADCAST_Q=q_offsets is None,
                     CAUSAL=causal, HAS_WINDOW=window is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                     BY_COST=schedule != "static", BLOCK=_BLOCK)
    order = torch.sort(keys, descending=True, stable=True).indices
    tiles = torch.empty(n, dtype=torch.int32, device=dev)
    costs_out = torch.empty(n, dtype=torch.int32, device=dev)
    _plan_deal[grid](order, costs, tiles, costs_out, n_work, n, n_ctas, ZIGZAG=schedule == "lpt", BLOCK=_BLOCK)
    return tiles, n_work, costs_out, queue
