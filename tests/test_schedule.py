"""Work lists: costs from the tile geometry, the valid prefix, the LPT zigzag (CPU, tensor ops),
and the fused GPU plan against them."""
import pytest
import torch

from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.schedule import fwd_tile_costs, fwd_work_list, zigzag


def _costs_by_hand(kv_lens, q_lens, H, block_m, block_n, window, causal):
    """Visible KV blocks per (batch, head, query block), by brute force over positions."""
    n_m = max(1, -(-max(q_lens) // block_m))
    out = []
    for lk, lq in zip(kv_lens, q_lens):
        per_m = []
        for m in range(n_m):
            rows = range(m * block_m, min((m + 1) * block_m, lq))
            blocks = set()
            for i in rows:
                for j in range(lk):
                    if window is not None and abs(i - j) > window:
                        continue
                    if causal and j > i + lk - lq:
                        continue
                    blocks.add(j // block_n)
            # The kernel visits the contiguous range between the first and last visible block.
            per_m.append(max(blocks) - min(blocks) + 1 if blocks else 0)
        out += per_m * H
    return out


@pytest.mark.parametrize("window,causal", [(None, False), (5, False), (None, True), (9, True)])
def test_costs_match_brute_force(window, causal):
    kv_lens = [0, 1, 17, 40, 33, 8]
    q_lens = [3, 0, 17, 25, 40, 8]
    cost, has_rows = fwd_tile_costs(offsets_from_lengths(torch.tensor(kv_lens)), offsets_from_lengths(
        torch.tensor(q_lens)), None, 2, -(-max(q_lens) // 16), 16, 8, window, causal)
    assert cost.tolist() == _costs_by_hand(kv_lens, q_lens, 2, 16, 8, window, causal)
    n_m = -(-max(q_lens) // 16)
    expect_rows = [m * 16 < lq for lq in q_lens for _ in range(2) for m in range(n_m)]
    assert has_rows.tolist() == expect_rows


def test_zigzag_deals_rounds_back_and_forth_inside_the_valid_prefix():
    order = torch.arange(11)
    dealt = zigzag(order, torch.tensor([10]), n_ctas=3)
    # Rounds of 3: [0 1 2] forward, [3 4 5] reversed, [6 7 8] forward, [9] alone; 10 is invalid.
    assert dealt.tolist() == [0, 1, 2, 5, 4, 3, 6, 7, 8, 9, 10]
    # CTA c reads c, c+3, ...: CTA 0 gets the 1st and 6th longest, CTA 2 the 3rd and 4th.
    assert dealt[0::3].tolist() == [0, 5, 6, 9]


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_work_list_is_a_permutation_with_valid_tiles_first(schedule):
    g = torch.Generator().manual_seed(1)
    q_lens = torch.randint(0, 300, (50, ), generator=g)
    kv_lens = torch.randint(0, 700, (50, ), generator=g)
    wl = fwd_work_list(offsets_from_lengths(kv_lens), offsets_from_lengths(q_lens), None, 3, int(q_lens.max()),
                       block_m=128, block_n=128, window=None, causal=True, schedule=schedule, n_ctas=7)
    n = wl.tiles.numel()
    assert sorted(wl.tiles.tolist()) == list(range(n))
    n_work = int(wl.n_work)
    assert n_work == sum(-(-int(lq) // 128) for lq in q_lens) * 3
    cost, has_rows = fwd_tile_costs(offsets_from_lengths(kv_lens), offsets_from_lengths(q_lens), None, 3,
                                    wl.n_m_blocks, 128, 128, None, True)
    assert has_rows[wl.tiles[:n_work].long()].all() and not has_rows[wl.tiles[n_work:].long()].any()
    assert torch.equal(wl.costs, cost[wl.tiles.long()])
    if schedule == "static":
        assert (wl.tiles[:n_work].diff() > 0).all()  # grid order kept
    if schedule == "dynamic":
        # Longest sequence first, a sequence's tiles together in grid order; then each group of two
        # waves (14 positions) by the tiles' own cost, longest first, ties in that order.
        seq_blocks = (kv_lens + 127) // 128
        valid = torch.nonzero(has_rows).flatten().tolist()
        by_sequence = sorted(valid, key=lambda t: (-int(seq_blocks[t // (3 * wl.n_m_blocks)]), t))
        listed = wl.tiles[:n_work].tolist()
        for g in range(0, n_work, 14):
            group = by_sequence[g:g + 14]
            rank = {t: i for i, t in enumerate(group)}
            assert listed[g:g + 14] == sorted(group, key=lambda t: (-int(cost[t]), rank[t]))


@pytest.mark.parametrize("Lq,block_n", [(1, 64), (128, 64), (129, 128), (256, 128)])
def test_default_kv_block_follows_the_query_blocks(Lq, block_n):
    """Without a block size the list counts the forward kernel's own: 64-key blocks where a
    (batch, head) has one query block, 128 beyond; the costs are the KV blocks of that size."""
    from jfa_prof.kernels import fwd

    kv_lens = torch.tensor([0, 1, 64, 65, 128, 129, 1000])
    wl = fwd_work_list(offsets_from_lengths(kv_lens), None, Lq, 2, Lq, block_m=fwd.BLOCK_M, window=None,
                       causal=False, schedule="static", n_ctas=4)
    assert fwd.kv_block_n(wl.n_m_blocks) == block_n
    blocks = [-(-int(n) // block_n) for n in kv_lens]  # an empty sequence's tiles still run: they write zeros
    n_m = -(-Lq // fwd.BLOCK_M)
    expected = sorted(b for b in blocks for _ in range(2 * n_m))  # every head and query block of a sequence
    assert sorted(wl.costs[:int(wl.n_work)].tolist()) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
@pytest.mark.parametrize("broadcast,window,causal", [(True, None, False), (True, 100, False), (False, None, True)])
def test_gpu_plan_matches_the_reference(cuda_device, schedule, broadcast, window, causal):
    g = torch.Generator().manual_seed(2)
    kv_lens = torch.randint(0, 2000, (300, ), generator=g)
    q_lens = kv_lens if not broadcast else None
    kv_off = offsets_from_lengths(kv_lens).to(cuda_device)
    q_off = None if broadcast else offsets_from_lengths(q_lens).to(cuda_device)
    args = (kv_off, q_off, 256 if broadcast else None, 4, 256 if broadcast else int(kv_lens.max()))
    kw = dict(block_m=128, block_n=128, window=window, causal=causal, schedule=schedule, n_ctas=132)
    fast = fwd_work_list(*args, **kw)
    ref = fwd_work_list(*args, **kw, reference=True)
    assert torch.equal(fast.tiles, ref.tiles) and torch.equal(fast.n_work, ref.n_work)
    assert torch.equal(fast.costs, ref.costs)


_PLAN_CHILD = """
import itertools, json, torch
from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.kernels.plan import fwd_work_list_gpu
from jfa_prof.schedule import cost_group_size, fwd_work_list
g = torch.Generator().manual_seed(3)
for schedule, broadcast in itertools.product(["static", "lpt", "dynamic"], [True, False]):
    # Lengths 0, 1 and one past a block among random ones; jagged Q gives over 1024 tiles (two chunks).
    kv_lens = torch.cat([torch.tensor([0, 1, 129, 1400]), torch.randint(0, 1500, (46, ), generator=g)])
    rows = 256 if broadcast else int(kv_lens.max())
    Lq, q_off = (256, None) if broadcast else (None, offsets_from_lengths(kv_lens))
    kv_off = offsets_from_lengths(kv_lens)
    kw = dict(block_m=128, block_n=128, window=None, causal=not broadcast, schedule=schedule, n_ctas=7)
    ref = fwd_work_list(kv_off, q_off, Lq, 2, rows, **kw, reference=True)
    tiles, n_work, costs, queue = fwd_work_list_gpu(kv_off, q_off, Lq, 2, ref.n_m_blocks, **kw,
                                                    group_size=cost_group_size(schedule, not broadcast, None, 7))
    print(json.dumps({"case": f"{schedule} broadcast={broadcast}", "tiles": tiles.numel(),
                      "same": torch.equal(tiles, ref.tiles) and torch.equal(n_work, ref.n_work)
                      and torch.equal(costs, ref.costs) and int(queue) == 0}))
"""


def test_fused_plan_matches_the_reference_in_the_interpreter():
    """The two plan kernels (a counting sort in place of torch.sort) give the reference's list
    exactly, run by Triton's interpreter in a child process (it is chosen at decoration)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    run = subprocess.run([sys.executable, "-c", _PLAN_CHILD], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parent.parent, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 6, run.stdout[-2000:]
    assert max(r["tiles"] for r in results) > 1024  # at least one list spans two chunks
    assert all(r["same"] for r in results), results
