"""Backward kernels against the fp32 reference's autograd on the GPU (SPEC §2).

Fresh random inputs every run; dK and dV go into NaN-poisoned buffers so unwritten rows show.
Most tests feed the backward the reference's O and log-sum-exp (`tests/bwd_cases.py`), so they
compile backward kernels only; the end-to-end tests go through `jagged_flash_attention`.
Shapes are small and the parametrizations few: each kernel variant costs a compile."""
import math

import pytest

from tests.bwd_cases import REL_TOL, check_grads, make_case, reference, run_backward

pytestmark = pytest.mark.gpu

# Zero- and one-length sequences, lengths around and between multiples of the 128-key block.
LENGTHS = [0, 1, 127, 128, 129, 300, 1000, 0, 5]
# Jagged Q for causal: Lq != Lk both ways; Lq > Lk leaves rows that see no key.
Q_LENGTHS = [0, 1, 200, 128, 129, 300, 10, 3, 0]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _check(got, ref, dtype):
    import torch

    check_grads(got, ref, dtype, getattr(torch, _DTYPES[dtype]))


@pytest.mark.parametrize("Lq", [1, 200])
def test_broadcast_q_gqa(cuda_device, Lq):
    # dQ is [Lq, H, D], summed over the batch by atomics from every sequence's KV blocks.
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=8, H_kv=2, D=128, Lq=Lq)
    got, ref = run_backward(q, k, v, q_off, kv_off)
    assert got[0].shape == q.shape
    _check(got, ref, "bf16")


def test_jagged_gqa(cuda_device):
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=8, H_kv=2, D=128)
    _check(*run_backward(q, k, v, q_off, kv_off), "bf16")


@pytest.mark.parametrize("window", [0, 2, 33, 500])
@pytest.mark.parametrize("broadcast", [True, False], ids=["bcast", "jagged"])
def test_window(cuda_device, window, broadcast):
    # 33: a query block edge falls exactly on the first row that sees a KV block.
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=2, H_kv=1, D=64, Lq=300 if broadcast else None)
    _check(*run_backward(q, k, v, q_off, kv_off, window=window), "bf16")


@pytest.mark.parametrize("window", [None, 64])
def test_jagged_causal(cuda_device, window):
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=4, H_kv=2, D=128, q_lengths=Q_LENGTHS)
    _check(*run_backward(q, k, v, q_off, kv_off, causal=True, window=window), "bf16")


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_jagged_causal_self_attention(cuda_device, schedule):
    # Self-attention (Lq = Lk) over long sequences: most blocks lie below the diagonal and skip the
    # mask, the blocks it crosses keep it, and the first consumer's keys can be masked where the
    # second's are not. Lengths on and off the 64-row query blocks and 128-key KV blocks.
    lengths = [1000, 0, 513, 1, 256, 64, 777]
    q, k, v, q_off, kv_off = make_case(cuda_device, lengths, H=2, H_kv=1, D=128)
    _check(*run_backward(q, k, v, q_off, kv_off, causal=True, schedule=schedule), "bf16")


@pytest.mark.parametrize("D,dtype,broadcast", [(64, "bf16", True), (128, "fp16", True), (64, "fp16", False)])
def test_head_dims_and_dtypes(cuda_device, D, dtype, broadcast):
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=2, H_kv=2, D=D, dtype=dtype,
                                       Lq=200 if broadcast else None)
    _check(*run_backward(q, k, v, q_off, kv_off), dtype)


def test_large_batch_contended_dq(cuda_device):
    import torch

    # Many sequences adding into the same few dQ rows; max_seq_len_kv=-1 reads it from the offsets.
    lengths = torch.randint(0, 400, (600, )).tolist()
    q, k, v, q_off, kv_off = make_case(cuda_device, lengths, H=2, H_kv=2, D=128, Lq=64)
    _check(*run_backward(q, k, v, q_off, kv_off, max_kv=-1), "bf16")


# ---- end to end: the op's forward and its registered backward ---------------------------------

@pytest.mark.parametrize("mode", ["bcast-gqa", "jagged-causal"])
def test_autograd_through_the_op(cuda_device, mode):
    import torch

    from jfa_prof.kernels.attention import jagged_flash_attention

    if mode == "bcast-gqa":
        q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=4, H_kv=1, D=128, Lq=130)
        kw = dict(broadcast_q=True)
        max_q = q.shape[0]
    else:
        q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=2, H_kv=2, D=128, q_lengths=Q_LENGTHS)
        kw = dict(causal=True)
        max_q = max(Q_LENGTHS)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, lse = jagged_flash_attention(q, k, v, q_off, kv_off, max_q, max(LENGTHS), return_lse=True, **kw)
    assert not lse.requires_grad
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # the loss below differentiates again
    o_ref, _, ref = reference(q, k, v, q_off, kv_off, do, causal=kw.get("causal", False))
    assert (o.float() - o_ref).norm() <= REL_TOL["bf16"] * o_ref.norm()
    _check(got, ref, "bf16")
    # A loss that also reads the log-sum-exp still differentiates (lse contributes nothing).
    loss = o.float().square().sum() + lse[torch.isfinite(lse)].sum()
    dq, = torch.autograd.grad(loss, (q, ))
    assert torch.isfinite(dq).all()


@pytest.mark.parametrize("dq,stages,schedule", [("tma", 1, "static"), ("tma", 2, "dynamic"), ("atomic", 1, "static"),
                                                 ("deterministic", 1, "dynamic")])
@pytest.mark.parametrize("broadcast", [True, False], ids=["bcast", "jagged"])
def test_every_dq_reduction_and_schedule(cuda_device, dq, stages, schedule, broadcast):
    # Jagged sequences start on any dQ row: a TMA box then also covers the next sequence's first
    # rows, which must receive exactly zero.
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=4, H_kv=2, D=128, Lq=200 if broadcast else None)
    _check(*run_backward(q, k, v, q_off, kv_off, dq=dq, dq_stages=stages, schedule=schedule), "bf16")


def _bwd_args(cuda_device, lengths=LENGTHS):
    import torch

    q, k, v, q_off, kv_off = make_case(cuda_device, lengths, H=2, H_kv=2, D=128, Lq=200)
    do = torch.randn(kv_off.numel() - 1, *q.shape, device=cuda_device).flatten(0, 1).to(q.dtype)
    o, lse, _ = reference(q, k, v, q_off, kv_off, do)
    args = (q, k, v, o.to(q.dtype), lse, do, None, kv_off, q.shape[0], max(lengths))
    kw = dict(sm_scale=1 / math.sqrt(q.shape[2]), window=None, causal=False, broadcast_q=True)
    return args, kw


def test_deterministic_mode_gives_the_same_bits_every_run(cuda_device):
    import torch

    from jfa_prof.kernels.attention import bwd_launch

    args, kw = _bwd_args(cuda_device, torch.randint(0, 700, (300, )).tolist())
    runs = [bwd_launch(*args, **kw, dq="deterministic", schedule="dynamic") for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("level", [1, 2])
def test_instrumentation_records_every_tile_and_changes_no_bit(cuda_device, level):
    import torch

    from jfa_prof import records
    from jfa_prof.kernels import bwd
    from jfa_prof.kernels.attention import bwd_launch_recorded

    args, kw = _bwd_args(cuda_device)
    plain = bwd_launch_recorded(*args, **kw, dq="deterministic")
    dq, dk, dv, rec, launch = bwd_launch_recorded(*args, **kw, dq="deterministic", profile=level)
    assert all(torch.equal(a, b) for a, b in zip(plain[:3], (dq, dk, dv)))
    parts = launch.layout.split(rec.cpu().numpy())
    tiles = parts["tiles"][parts["tiles"][:, records.Tile.VALID] == 1]
    expected = {(b, h, blk) for b, n in enumerate(LENGTHS) for h in range(2) for blk in range(-(-n // bwd.BLOCK_N))}
    got = {(int(t[records.Tile.BATCH]), int(t[records.Tile.HEAD]), int(t[records.Tile.BLOCK])) for t in tiles}
    assert got == expected and len(tiles) == len(expected) and parts["header"][records.Header.DROPPED] == 0
    assert (tiles[:, records.Tile.T_END] > tiles[:, records.Tile.T_START]).all()
    assert (tiles[:, records.Tile.KV_LEN] == [LENGTHS[int(b)] for b in tiles[:, records.Tile.BATCH]]).all()
    # Each program's producer hands out, and its consumers compute, the same tiles.
    for role in records.BWD_ROLES:
        spans = parts["spans"][:, records.BWD_ROLES.index(role)]
        assert (spans[:, records.Span.VALID] == 1).all() and spans[:, records.Span.N_TILES].sum() == len(expected)


def test_tma_waits_are_recorded_at_level_2(cuda_device):
    from jfa_prof import records
    from jfa_prof.kernels.attention import bwd_launch_recorded

    args, kw = _bwd_args(cuda_device)
    *_, rec, launch = bwd_launch_recorded(*args, **kw, dq="tma", profile=2)
    waits = launch.layout.split(rec.cpu().numpy())["waits"][:, records.BWD_ROLES.index("compute"),
                                                          records.BWD_SITES.index("dq_stage")]
    from jfa_prof.kernels import bwd

    # One staging per query block of every tile (2 heads, Lq = 200).
    n_tiles = 2 * sum(-(-n // bwd.BLOCK_N) for n in LENGTHS)
    n_blocks = -(-200 // bwd.BLOCK_M)
    assert waits[:, records.Wait.COUNT].sum() == n_tiles * n_blocks and (waits[:, records.Wait.CYCLES] >= 0).all()


def test_a_full_record_buffer_counts_the_drops(cuda_device):
    from jfa_prof import records
    from jfa_prof.kernels.attention import bwd_launch_recorded

    args, kw = _bwd_args(cuda_device)
    *_, rec, launch = bwd_launch_recorded(*args, **kw, profile=1, record_capacity=5)
    parts = launch.layout.split(rec.cpu().numpy())
    n_tiles = 2 * sum(-(-n // 128) for n in LENGTHS)  # 2 heads, 128-key tiles (bwd.BLOCK_N)
    assert parts["header"][records.Header.DROPPED] == n_tiles - 5
    assert parts["tiles"][:, records.Tile.VALID].sum() == 5


def test_backward_is_deterministic_in_dk_dv(cuda_device):
    import torch

    from jfa_prof.kernels.attention import bwd_launch

    # dK/dV are plain sums inside one program: bitwise repeatable. dQ's atomics are not ordered,
    # so only its value is checked (above), not its bits.
    q, k, v, q_off, kv_off = make_case(cuda_device, LENGTHS, H=2, H_kv=2, D=128, Lq=200)
    do = torch.randn(kv_off.numel() - 1, *q.shape, device=cuda_device).flatten(0, 1).to(q.dtype)
    o, lse, _ = reference(q, k, v, q_off, kv_off, do)
    args = (q, k, v, o.to(q.dtype), lse, do, None, kv_off, q.shape[0], max(LENGTHS))
    kw = dict(sm_scale=1 / math.sqrt(q.shape[2]), window=None, causal=False, broadcast_q=True)
    _, dk0, dv0 = bwd_launch(*args, **kw)
    _, dk1, dv1 = bwd_launch(*args, **kw)
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)


def test_gradient_buffers_that_tma_cannot_write_still_get_the_result(cuda_device):
    import torch

    from jfa_prof.kernels.attention import bwd_launch

    # TMA stores need a 16-byte aligned start: dK / dV buffers one element into larger ones (NaN
    # around them) get the same bits as fresh ones, and nothing is written outside them.
    args, kw = _bwd_args(cuda_device)
    k, v = args[1], args[2]
    _, dk0, dv0 = bwd_launch(*args, **kw)
    dk_big = torch.full((k.numel() + 2, ), float("nan"), device=cuda_device, dtype=k.dtype)
    dv_big = torch.full((v.numel() + 2, ), float("nan"), device=cuda_device, dtype=v.dtype)
    dk_out, dv_out = dk_big[1:-1].view(k.shape), dv_big[1:-1].view(v.shape)
    _, dk1, dv1 = bwd_launch(*args, **kw, dk_out=dk_out, dv_out=dv_out)
    assert dk1.data_ptr() == dk_out.data_ptr() and dv1.data_ptr() == dv_out.data_ptr()
    assert torch.equal(dk1, dk0) and torch.equal(dv1, dv0)
    for big in (dk_big, dv_big):
        assert big[0].isnan() and big[-1].isnan()


def test_recorded_backward_trace_reads_back(cuda_device, tmp_path):
    from jfa_prof.inputs import Workload
    from jfa_prof.recording import record_bwd_workload
    from jfa_prof.trace import read_trace, write_trace

    w = Workload("hsp", B=64, H=4, H_kv=4, D=128, Lq=128, max_kv=1024, sparsity=0.5, broadcast_q=True)
    tr = record_bwd_workload(w, "dynamic", level=2)
    back = read_trace(write_trace(tmp_path / "bwd.jfatrace", tr.buffer, tr.meta))
    assert back.meta["kernel"]["pass"] == "bwd" and back.dropped == 0
    assert len(back.tiles) == back.meta["n_work"] > 0
    # The records span the kernel: the makespan is within a few percent of CUPTI's duration.
    assert 0.85 < back.makespan_ns / 1e6 / back.meta["kernel_ms"] <= 1.02
