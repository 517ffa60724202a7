"""Work lists for the persistent kernels, built with tensor ops where the offsets live.

A forward tile is (batch, head, query block); its id in grid order is
``(b * H + h) * n_m_blocks + m``. A schedule is a permutation of those ids (the work list)
plus the number of leading entries that hold query rows (``n_work``, a 1-element device
tensor): jagged-Q grids are sized by the longest sequence, and tiles past a sequence's end are
moved behind ``n_work`` so the kernel never visits them. Nothing here reads a device value on
the host, so building a schedule never synchronizes.

- static: valid tiles in grid order.
- lpt: valid tiles by their sequence's KV blocks, longest first, the tiles of one sequence together
  in grid order; then, where the tiles of a sequence differ in cost (causal, a window), each run of
  ``GROUP_WAVES`` waves of the list (that many times G positions) by the tiles' own cost (KV
  blocks visited), longest first. Dealt to the persistent CTAs in a zigzag: round r gives CTA c
  list position r*G + c on even rounds and r*G + (G-1-c) on odd ones, so each CTA gets a mix of
  long and short tiles.
- dynamic: the same order without the zigzag; CTAs take positions from an atomic counter.

Why by sequence, in groups: ordered by tile cost alone (the order before), the causal tiles of one
sequence lie far apart in the list, so the CTAs running at once each read another sequence's K/V
from HBM. Whole sequences one after another fix that for long sequences but were slower for short
ones (why is not measured yet); a group of two waves keeps a sequence's K/V in L2 between its tiles
and runs the group's long tiles first. Tiles of one (batch, head) that cost the same stay side by
side: a wave apart instead, HSP Lq=256 took 1.03-1.16x longer
(benchmarks/results/variants/fwd_order_ab_split_h200_2026-12-04.json). Kernel alone, causal jagged
self-attention on the H200 (benchmarks/results/variants/fwd_order_ab_jagged_h200_2026-12-04.json):
0.80-0.89 of the tile-cost order's time from max=512 s=1 on (9.8 against 12.3 ms at max=2048 s=1),
0.98-1.02 at max=256 and at max=512 s=0.5; whole sequences without the groups take 1.19-1.27x the
groups' time up to max=512, 1.03-1.15x beyond. Where every tile of a sequence costs the same (no
mask but the sequence end: the HSP grid, non-causal jagged Q) the three orders are one list.

The forward's default is dynamic: timed kernel against kernel at level 0 on the H200
(`benchmarks/profile_overhead.py`), it is within 1% of LPT or faster at every point measured, by
up to 13% at HSP Lq=256 max=2048 s=0.1, where the fixed LPT deal starts every long tile at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCHEDULES = ("static", "lpt", "dynamic")
# Waves of the list (n_ctas positions each) ordered by tile cost together. One wave was up to 1.14x
# slower, four 0.97-1.05x and 1.11x with a window (benchmarks/results/variants/fwd_order_ab_waves_*).
GROUP_WAVES = 2
DEFAULT_SCHEDULE = "dynamic"  # the forward's; the backward's is kernels/bwd.py's


@dataclass
class WorkList:
    tiles: torch.Tensor  # int32 [n_slots]: tile ids in execution order
    n_work: torch.Tensor  # int32 [1]: leading entries that hold work
    costs: torch.Tensor  # int32 [n_slots]: KV blocks each listed tile visits
    n_m_blocks: int
    # int32 [1], zero: the dynamic schedule's tile counter for the one launch that built this list
    # (made with n_work, so it costs no launch of its own). A reused list needs a fresh counter.
    queue: torch.Tensor | None = None


def fwd_tile_costs(kv_offsets: torch.Tensor, q_offsets: torch.Tensor | None, Lq: int | None, H: int,
                   n_m_blocks: int, block_m: int, block_n: int, window: int | None, causal: bool):
    """(cost, has_rows) per tile in grid order; the same geometry as the kernel's `_tile_geometry`."""
    import torch

    kv_offsets = kv_offsets.to(torch.int64)
    Lk = (kv_offsets[1:] - kv_offsets[:-1])[:, None]  # [B, 1]
    if q_offsets is None:
        Lq_b = torch.full_like(Lk, Lq)
    else:
        q_offsets = q_offsets.to(torch.int64)
        Lq_b = (q_offsets[1:] - q_offsets[:-1])[:, None]
    m0 = torch.arange(n_m_blocks, device=kv_offsets.device)[None, :] * block_m  # [1, M]
    last_row = torch.minimum(m0 + block_m, Lq_b) - 1
    lo = torch.zeros_like(last_row)
    hi = Lk.expand_as(last_row)
    if window is not None:
        lo = torch.clamp(m0 - window, min=0).expand_as(last_row)
        hi = torch.minimum(hi, last_row + window + 1)
    if causal:
        hi = torch.minimum(hi, last_row + Lk - Lq_b + 1)
    blk_lo = lo // block_n
    has_rows = last_row >= m0
    cost = torch.where((hi > lo) & has_rows, (hi + block_n - 1) // block_n - blk_lo, 0)
    B = Lk.shape[0]
    # Every head of a (batch, block) costs the same: repeat over heads in grid order.
    cost = cost[:, None, :].expand(B, H, n_m_blocks).reshape(-1)
    has_rows = has_rows[:, None, :].expand(B, H, n_m_blocks).reshape(-1)
    return cost.to(torch.int32), has_rows


def sequence_blocks(kv_offsets: torch.Tensor, H: int, n_m_blocks: int, block_n: int) -> torch.Tensor:
    """Per tile in grid order, the KV blocks of its sequence: the cost orders' key."""
    import torch

    kv_offsets = kv_offsets.to(torch.int64)
    blocks = (kv_offsets[1:] - kv_offsets[:-1] + block_n - 1) // block_n
    return blocks.repeat_interleave(H * n_m_blocks)


def cost_group_size(schedule: str, causal: bool, window: int | None, n_ctas: int) -> int | None:
    """The list positions ordered by tile cost together: where the tiles of a sequence differ in cost
    (causal, a window) under a cost-ordered schedule; else None, no groups."""
    return GROUP_WAVES * n_ctas if schedule != "static" and (causal or window is not None) else None


def by_cost_in_groups(order: torch.Tensor, cost: torch.Tensor, n_valid: torch.Tensor, size: int) -> torch.Tensor:
    """`order` with each run of `size` positions inside the valid prefix sorted by `cost` (of the
    listed tiles, in list order), largest first, ties in list order; the rest kept."""
    import torch

    p = torch.arange(order.numel(), device=order.device)
    group = torch.where(p < n_valid, p // size, order.numel())
    by_cost = torch.sort(torch.where(p < n_valid, cost, 0), descending=True, stable=True).indices
    return order[by_cost[torch.sort(group[by_cost], stable=True).indices]]


def zigzag(order: torch.Tensor, n_valid: torch.Tensor, n_ctas: int) -> torch.Tensor:
    """Re-deal `order` (best first) so that CTA c, reading positions c, c+G, ..., gets a zigzag.

    Only full rounds inside the valid prefix are reversed, so the prefix stays the prefix."""
    import torch

    n = order.numel()
    p = torch.arange(n, device=order.device)
    rnd, lane = p // n_ctas, p % n_ctas
    full = (rnd + 1) * n_ctas <= n_valid
    dest = torch.where((rnd % 2 == 1) & full, rnd * n_ctas + (n_ctas - 1 - lane), p)
    out = torch.empty_like(order)
    out[dest] = order
    return out


def fwd_work_list(kv_offsets: torch.Tensor, q_offsets: torch.Tensor | None, Lq: int | None, H: int,
                  max_seq_len_q: int, *, block_m: int, block_n: int | None = None, window: int | None, causal: bool,
                  schedule: str, n_ctas: int, reference: bool = False) -> WorkList:
    """The work list for one launch. Offsets on a GPU go through the fused kernels in
    `jfa_prof.kernels.plan` unless `reference` asks for the tensor-op version below. `block_n`
    (keys per KV block) defaults to the forward kernel's choice for this many query blocks."""
    import torch

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    rows = Lq if q_offsets is None else max_seq_len_q
    n_m_blocks = max(1, -(-rows // block_m))
    if block_n is None:
        from jfa_prof.kernels.fwd import kv_block_n

        block_n = kv_block_n(n_m_blocks)
    group_size = cost_group_size(schedule, causal, window, n_ctas)
    if kv_offsets.is_cuda and not reference:
        from jfa_prof.kernels.plan import fwd_work_list_gpu

        tiles, n_work, costs, queue = fwd_work_list_gpu(kv_offsets, q_offsets, Lq, H, n_m_blocks, block_m=block_m,
                                                        block_n=block_n, window=window, causal=causal,
                                                        schedule=schedule, n_ctas=n_ctas, group_size=group_size)
        return WorkList(tiles=tiles, n_work=n_work, costs=costs, n_m_blocks=n_m_blocks, queue=queue)
    cost, has_rows = fwd_tile_costs(kv_offsets, q_offsets, Lq, H, n_m_blocks, block_m, block_n, window, causal)
    n_work = has_rows.sum().to(torch.int32).reshape(1)
    if schedule == "static":
        # Valid tiles first, grid order kept (the sort is stable).
        key = has_rows.to(torch.int32)
    else:
        # Longest sequence first, its tiles in grid order; tiles with rows but no visible key still
        # run (they write zeros).
        key = torch.where(has_rows, sequence_blocks(kv_offsets, H, n_m_blocks, block_n) + 1, 0)
    order = torch.sort(key, descending=True, stable=True).indices
    if group_size is not None:
        order = by_cost_in_groups(order, cost[order], n_work, group_size)
    if schedule == "lpt":
        order = zigzag(order, n_work, n_ctas)
    return WorkList(tiles=order.to(torch.int32), n_work=n_work, costs=cost[order].to(torch.int32),
                    n_m_blocks=n_m_blocks)
