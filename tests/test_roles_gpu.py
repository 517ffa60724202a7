"""Level 3 (every warp role's window on every tile) on the GPU, forward and backward: outputs
bitwise equal to the uninstrumented kernel's, one event record per (tile, role), windows that do
not overlap within a role, per-tile waits that add up exactly to the level-2 totals, sampling and
a full buffer counted, and the planted bottlenecks leaving the results as they were."""
import math

import numpy as np
import pytest

from tests.bwd_cases import make_case, reference

pytestmark = pytest.mark.gpu

LENGTHS = [0, 1, 127, 128, 129, 300, 1000, 0, 5] * 30


def _fwd(device, **kw):
    import torch

    from jfa_prof.kernels.attention import fwd_launch

    torch.manual_seed(0)
    q, k, v, _, kv_off = make_case(device, LENGTHS, H=4, H_kv=4, D=128, Lq=256)
    o, lse, rec, launch = fwd_launch(q, k, v, None, kv_off, q.shape[0], sm_scale=1 / math.sqrt(128), window=None,
                                     causal=False, broadcast_q=True, **kw)
    torch.cuda.synchronize()
    return o, lse, rec, launch


def _decode(rec, launch, pass_):
    from jfa_prof import records
    from jfa_prof.trace import layout_meta, trace_from_buffer

    roles, sites = (records.FWD_ROLES, records.FWD_SITES) if pass_ == "fwd" else (records.BWD_ROLES,
                                                                                  records.BWD_SITES)
    meta = {"layout": layout_meta(launch.layout, roles, sites), "kernel": {"pass": pass_}, "profile_level": 3}
    return trace_from_buffer(rec.cpu().numpy(), meta)


def _check_windows(tr, n_tiles, outside_sites):
    """Every tile has a record per role, a role's windows follow one another, and per site the
    waits inside the windows are the level-2 total, except at sites also waited at outside any
    window (the last mailbox hand-off, which carries no tile)."""
    ev = tr.events
    assert tr.events_dropped == 0 and len(ev) == n_tiles * len(tr.roles)
    for role in tr.roles:
        assert sorted(ev.loc[ev["role"] == role, "pos"]) == list(range(n_tiles))
    for _, lane in ev.groupby(["cta", "role_id"]):
        assert (lane["start_ns"].to_numpy()[1:] >= lane["end_ns"].to_numpy()[:-1]).all()
    # Each record was written by the CTA that ran the tile (the tile record says which).
    with_tile = ev[ev["tile"] >= 0]
    tile_cta = tr.tiles.set_index("slot")["cta"]
    assert (with_tile["cta"].to_numpy() == tile_cta.reindex(with_tile["pos"]).to_numpy()).all()
    from jfa_prof.records import ROLE_SITES

    totals = tr.waits.groupby(["role", "site"])["cycles"].sum()
    for role, sites in ROLE_SITES[tr.pass_].items():
        for site in sites:
            inside = int(ev.loc[ev["role"] == role, f"wait_{site}"].sum())
            if site in outside_sites:
                assert inside <= totals[(role, site)]
            else:
                assert inside == totals[(role, site)], (role, site)


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_forward_roles_in_time(cuda_device, schedule):
    import torch

    from jfa_prof.records import Header

    o0, lse0, _, _ = _fwd(cuda_device, schedule=schedule)
    o3, lse3, rec, launch = _fwd(cuda_device, schedule=schedule, profile=3)
    assert torch.equal(o0, o3) and torch.equal(lse0, lse3)
    n_work = int(launch.work.n_work.item())
    tr = _decode(rec, launch, "fwd")
    _check_windows(tr, n_work, outside_sites={"queue"})
    # Every few tiles when sampled (under a static deal a sample coprime to the CTA count, which
    # the op demands); past a small buffer, the records are counted, not written.
    sample = 4 if schedule == "dynamic" else next(n for n in range(4, 64) if math.gcd(n, launch.n_ctas) == 1)
    *_, rec, launch = _fwd(cuda_device, schedule=schedule, profile=3, sample=sample)
    tr = _decode(rec, launch, "fwd")
    assert tr.sample == sample and sorted(set(tr.events["pos"])) == list(range(0, n_work, sample))
    *_, rec, launch = _fwd(cuda_device, schedule=schedule, profile=3, record_capacity=100)
    parts = launch.layout.split(rec.cpu().numpy())
    assert parts["header"][Header.EVENTS_DROPPED] == 3 * (n_work - 100)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_instrumented_launches_never_synchronize(cuda_device, level):
    # A synchronizing step before the launch (a header word copied from the host) leaves the
    # kernel to start on an idle GPU, which made it measurably slower: the buffer is set up on the
    # device, and its header still says what the decoder needs.
    import torch

    from jfa_prof.kernels.attention import bwd_launch_recorded, fwd_launch
    from jfa_prof.records import Header

    torch.manual_seed(0)
    q, k, v, _, kv_off = make_case(cuda_device, LENGTHS, H=2, H_kv=2, D=128, Lq=200)
    common = dict(sm_scale=1 / math.sqrt(128), window=None, causal=False, broadcast_q=True, profile=level)
    sample = 3 if level == 3 else 1

    def step():
        o, lse, rec, launch = fwd_launch(q, k, v, None, kv_off, q.shape[0], sample=sample, **common)
        *_, brec, blaunch = bwd_launch_recorded(q, k, v, o, lse, torch.ones_like(o), None, kv_off, q.shape[0],
                                                max(LENGTHS), **common)
        return rec, launch, brec, blaunch

    step()  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for rec, launch, want_sample in ((got[0], got[1], sample), (got[2], got[3], 1)):
        header = launch.layout.split(rec.cpu().numpy())["header"]
        assert header[Header.CAPACITY] == launch.layout.tile_capacity and header[Header.SAMPLE] == want_sample


def test_forward_plants_keep_the_output(cuda_device):
    import torch

    from jfa_prof.kernels import fwd

    o0, lse0, _, _ = _fwd(cuda_device, schedule="dynamic")
    for name, (bit, _) in fwd.PLANTS.items():
        o, lse, _, _ = _fwd(cuda_device, schedule="dynamic", ablate=bit)
        assert torch.equal(o0, o) and torch.equal(lse0, lse), name
    o, lse, _, _ = _fwd(cuda_device, schedule="dynamic", kv_stages=1)
    assert torch.equal(o0, o) and torch.equal(lse0, lse)


def _bwd(device, **kw):
    import torch

    from jfa_prof.kernels.attention import bwd_launch_recorded

    torch.manual_seed(0)
    q, k, v, q_off, kv_off = make_case(device, LENGTHS, H=2, H_kv=2, D=128, Lq=200)
    do = torch.randn(kv_off.numel() - 1, *q.shape, device=device).flatten(0, 1).to(q.dtype)
    o, lse, _ = reference(q, k, v, q_off, kv_off, do)
    out = bwd_launch_recorded(q, k, v, o.to(q.dtype), lse, do, None, kv_off, q.shape[0], max(LENGTHS),
                              sm_scale=1 / math.sqrt(128), window=None, causal=False, broadcast_q=True, **kw)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_backward_roles_in_time(cuda_device, schedule):
    import torch

    from jfa_prof.kernels import bwd

    plain = _bwd(cuda_device, schedule=schedule)
    *grads, rec, launch = _bwd(cuda_device, schedule=schedule, profile=3)
    assert torch.equal(plain[1], grads[1]) and torch.equal(plain[2], grads[2])
    # dQ's reduce-adds land in any order: its bf16 result may differ in the last bit.
    torch.testing.assert_close(plain[0].float(), grads[0].float(), rtol=2e-2, atol=2e-2)
    n_tiles = 2 * sum(-(-n // bwd.BLOCK_N) for n in LENGTHS)
    tr = _decode(rec, launch, "bwd")
    _check_windows(tr, n_tiles, outside_sites={"box", "dq_full", "dq_reduce"})
    # The tile count's staging waits: one per query block of every tile.
    assert tr.waits.loc[tr.waits["site"] == "dq_stage", "count"].sum() == n_tiles * -(-200 // bwd.BLOCK_M)


def test_backward_plants_keep_the_gradients(cuda_device):
    import torch

    from jfa_prof.kernels import bwd

    plain = _bwd(cuda_device)
    for name, (bit, _) in bwd.PLANTS.items():
        got = _bwd(cuda_device, ablate=bit)
        assert torch.equal(plain[1], got[1]) and torch.equal(plain[2], got[2]), name
        torch.testing.assert_close(plain[0].float(), got[0].float(), rtol=2e-2, atol=2e-2)


def test_level3_trace_covers_the_kernel_time(cuda_device, tmp_path):
    """Per CTA, the consumers' windows from the first start to the last end cover the kernel's
    CUPTI time within 2% on the busiest CTA (the rest is launch and the last tile's hand-off)."""
    from jfa_prof.inputs import Workload
    from jfa_prof.recording import record_bwd_workload, record_workload
    from jfa_prof.trace import read_trace, write_trace

    w = Workload("hsp", B=1024, H=4, H_kv=4, D=128, Lq=256, max_kv=2048, sparsity=0.5, broadcast_q=True)
    for tr in (record_workload(w, "dynamic", level=3), record_bwd_workload(w, "static", level=3)):
        back = read_trace(write_trace(tmp_path / f"{tr.pass_}.jfatrace", tr.buffer, tr.meta))
        assert back.level == 3 and len(back.events) == back.meta["n_work"] * len(back.roles)
        lanes = back.events.groupby("cta").agg(t0=("t_start", "min"), t1=("t_end", "max"))
        busiest_ms = float((lanes["t1"] - lanes["t0"]).max()) / 1e6
        assert abs(busiest_ms / back.kernel_ms - 1) < 0.02, (tr.pass_, busiest_ms, back.kernel_ms)
        assert np.isfinite(back.events.filter(like="_ns").to_numpy(np.float64)).all()
