"""Work lists built on the GPU in two launches (three where a sequence's tiles differ in cost).

The same lists as `jfa_prof.schedule` builds with tensor ops (that version is the reference and
the CPU path), with the per-tile geometry, the sort and the zigzag fused into small kernels: a
dozen tensor ops, `torch.sort` alone among them, cost more host time than a short attention kernel
runs (benchmarks/host_path.py). The sort is a counting sort: a tile's key is small (its sequence's
KV block count + 1), so the first kernel counts each key per chunk of tiles and the second places
every tile from those counts, in torch.sort's stable descending order. Causal or with a window, a
third kernel sorts each group of list positions by the tiles' own cost. The geometry is the
forward kernel's own `_tile_geometry`, so the two cannot disagree.
"""
import torch
import triton
import triton.language as tl

from jfa_prof.kernels import C_CACHE
from jfa_prof.kernels.fwd import _tile_geometry

_BLOCK = 1024


# Keys 0 .. _KEYS - 1: a tile's key is its sequence's KV block count + 1, capped here, so tiles of
# sequences over 510 blocks (65,280 keys at 128 per block) are ordered as equals among themselves.
_KEYS = 512


@triton.jit
def _zigzag(p, n_ctas, n_work, listed):
    """LPT's zigzag: list position p of a listed tile moves so that odd rounds of n_ctas positions run
    backwards, only where the whole round lies inside the n_work listed positions."""
    rnd = p // n_ctas
    full = (rnd + 1) * n_ctas <= n_work
    return tl.where((rnd % 2 == 1) & full & listed, rnd * n_ctas + (n_ctas - 1 - p % n_ctas), p)


@triton.jit(c_cache=C_CACHE)
def _plan_keys(kv_offsets, q_offsets, keys, costs, counts, n_tiles, H, n_m_blocks, Lq_bcast, window,
               BROADCAST_Q: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BY_COST: tl.constexpr, KEYS: tl.constexpr, BLOCK: tl.constexpr):
    """Each tile's sort key and cost; each chunk's count of every key into `counts[chunk, :]`."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = t < n_tiles
    b, h, m0, Lq, Lk, q_row0, o_row0, kv_start, blk_lo, n_blocks = _tile_geometry(
        tl.where(ok, t, 0), H, n_m_blocks, Lq_bcast, window, q_offsets, kv_offsets, BROADCAST_Q, CAUSAL, HAS_WINDOW,
        BLOCK_M, BLOCK_N)
    has_rows = (m0 < Lq) & ok
    if BY_COST:
        # Longest sequence first, its tiles in grid order (`jfa_prof.schedule`); tiles with rows but
        # no visible key still run (they write zeros).
        key = tl.where(has_rows, tl.minimum(tl.cdiv(Lk, BLOCK_N) + 1, KEYS - 1), 0)
    else:
        key = has_rows.to(tl.int32)
    tl.store(keys + t, key, mask=ok)
    tl.store(costs + t, n_blocks, mask=ok)
    tl.store(counts + tl.program_id(0) * KEYS + tl.arange(0, KEYS), tl.histogram(key, KEYS, mask=ok))


@triton.jit(c_cache=C_CACHE)
def _plan_deal(keys, costs, counts, tiles_out, costs_out, counters, n, n_chunks, n_ctas, ZIGZAG: tl.constexpr,
               KEYS: tl.constexpr, BLOCK: tl.constexpr):
    """Places chunk `program_id`'s tiles: by key, largest first, and in tile order within a key
    (torch.sort(descending=True, stable=True)); LPT then runs odd rounds backwards. Also writes
    n_work (the tiles with rows: every key but 0) and zeroes the dynamic schedule's counter."""
    chunk = tl.program_id(0)
    bins = tl.arange(0, KEYS)
    total = tl.zeros([KEYS], tl.int32)
    before = tl.zeros([KEYS], tl.int32)  # tiles of each key in the chunks before this one
    for c in range(0, n_chunks):
        count = tl.load(counts + c * KEYS + bins)
        total += count
        before += tl.where(c < chunk, count, 0)
    n_work = tl.sum(tl.where(bins > 0, total, 0), 0)
    if chunk == 0:
        tl.store(counters, n_work)
        tl.store(counters + 1, 0)
    # Where each key's run starts: after every tile of a larger key, then after this key's tiles
    # in earlier chunks.
    start = tl.cumsum(total, 0, reverse=True) - total + before
    # Inside the chunk: sort (key descending, position ascending) packed in one int32, then each
    # tile's rank among its key's tiles is its sorted position minus the chunk's tiles of larger keys.
    idx = tl.arange(0, BLOCK)
    t = chunk * BLOCK + idx
    ok = t < n
    key = tl.load(keys + t, mask=ok, other=0)
    in_chunk = tl.histogram(key, KEYS, mask=ok)
    larger = tl.cumsum(in_chunk, 0, reverse=True) - in_chunk
    packed = tl.sort(tl.where(ok, (KEYS - 1 - key) * BLOCK + idx, 2147483647))
    placed = packed != 2147483647
    s_key = tl.where(placed, KEYS - 1 - packed // BLOCK, 0)
    src = chunk * BLOCK + packed % BLOCK
    p = tl.gather(start, s_key, 0) + idx - tl.gather(larger, s_key, 0)
    dest = _zigzag(p, n_ctas, n_work, placed) if ZIGZAG else p
    tl.store(tiles_out + dest, src, mask=placed)
    tl.store(costs_out + dest, tl.load(costs + src, mask=placed, other=0), mask=placed)


@triton.jit(c_cache=C_CACHE)
def _plan_group(tiles_in, costs_in, tiles_out, costs_out, counters, n, n_ctas, size, ZIGZAG: tl.constexpr,
                KEYS: tl.constexpr, SEG: tl.constexpr):
    """Group `program_id` (`size` list positions): its listed tiles by their own cost, largest
    first, ties in list order (`jfa_prof.schedule.by_cost_in_groups`); LPT's zigzag then. Positions
    past n_work are copied as they are."""
    idx = tl.arange(0, SEG)
    p = tl.program_id(0) * size + idx
    n_work = tl.load(counters)
    inside = (idx < size) & (p < n)
    listed = inside & (p < n_work)
    key = tl.minimum(tl.load(costs_in + p, mask=listed, other=0), KEYS - 1)
    # (cost descending, position ascending) packed in one int32; the unlisted sort last.
    packed = tl.sort(tl.where(listed, (KEYS - 1 - key) * SEG + idx, 2147483647))
    src = tl.where(listed, tl.program_id(0) * size + packed % SEG, p)
    dest = _zigzag(p, n_ctas, n_work, listed) if ZIGZAG else p
    tl.store(tiles_out + dest, tl.load(tiles_in + src, mask=inside), mask=inside)
    tl.store(costs_out + dest, tl.load(costs_in + src, mask=inside), mask=inside)


def fwd_work_list_gpu(kv_offsets, q_offsets, Lq, H, n_m_blocks, *, block_m, block_n, window, causal, schedule,
                      n_ctas, group_size):
    """(tiles, n_work, costs, queue) in execution order; see `jfa_prof.schedule.fwd_work_list`. queue is a
    zeroed tile counter for the dynamic schedule, written with n_work by the second kernel. `group_size`:
    the list positions a third kernel orders by tile cost together, or None for no such groups."""
    B = kv_offsets.numel() - 1
    n = B * H * n_m_blocks
    n_chunks = triton.cdiv(n, _BLOCK)
    grouped = group_size is not None
    lists = 4 if grouped else 2
    # One allocation, cut into the lists and the scratch the kernels share.
    buf = torch.empty((2 + lists) * n + n_chunks * _KEYS + 2, dtype=torch.int32, device=kv_offsets.device)
    keys, costs, tiles, costs_out = buf[:n], buf[n:2 * n], buf[2 * n:3 * n], buf[3 * n:4 * n]
    end = (2 + lists) * n
    counts, counters = buf[end:end + n_chunks * _KEYS], buf[end + n_chunks * _KEYS:]
    grid = (n_chunks, )
    _plan_keys[grid](kv_offsets, kv_offsets if q_offsets is None else q_offsets, keys, costs, counts, n, H,
                     n_m_blocks, Lq or 0, window if window is not None else 0, BROADCAST_Q=q_offsets is None,
                     CAUSAL=causal, HAS_WINDOW=window is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                     BY_COST=schedule != "static", KEYS=_KEYS, BLOCK=_BLOCK)
    _plan_deal[grid](keys, costs, counts, tiles, costs_out, counters, n, n_chunks, n_ctas,
                     ZIGZAG=schedule == "lpt" and not grouped, KEYS=_KEYS, BLOCK=_BLOCK)
    if grouped:
        out, costs_grouped = buf[4 * n:5 * n], buf[5 * n:6 * n]
        _plan_group[(triton.cdiv(n, group_size), )](tiles, costs_out, out, costs_grouped, counters, n, n_ctas,
                                                    group_size, ZIGZAG=schedule == "lpt", KEYS=_KEYS,
                                                    SEG=triton.next_power_of_2(group_size))
        tiles, costs_out = out, costs_grouped
    return tiles, counters[:1], costs_out, counters[1:]
