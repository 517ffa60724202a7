"""Forward kernel against the fp32 reference on the GPU (SPEC §2, §4).

Fresh random inputs every run, outputs poisoned with NaN first so unwritten elements show."""
import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BF16_TOL = 1e-2
FP16_TOL = 5e-3


def _case(device, lengths, H, H_kv, D, *, Lq=None, dtype="bf16", q_lengths=None):
    import torch

    from jfa_prof.inputs import offsets_from_lengths

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kv_lens = torch.tensor(lengths)
    kv_off = offsets_from_lengths(kv_lens).to(device)
    k = torch.randn(int(kv_lens.sum()), H_kv, D, device=device, dtype=dt)
    v = torch.randn_like(k)
    if Lq is not None:
        q = torch.randn(Lq, H, D, device=device, dtype=dt)
        q_off = None
    else:
        q_lens = torch.tensor(q_lengths if q_lengths is not None else lengths)
        q_off = offsets_from_lengths(q_lens).to(device)
        q = torch.randn(int(q_lens.sum()), H, D, device=device, dtype=dt)
    return q, k, v, q_off, kv_off


def _run(q, k, v, q_off, kv_off, *, window=None, causal=False, schedule="lpt", peel=True, profile=False,
         record_capacity=None, ablate=0):
    import torch

    from jfa_prof.kernels.attention import fwd_launch

    broadcast = q_off is None
    B = kv_off.numel() - 1
    rows = B * q.shape[0] if broadcast else q.shape[0]
    out = torch.full((rows, q.shape[1], q.shape[2]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], rows), float("nan"), dtype=torch.float32, device=q.device)
    max_q = q.shape[0] if broadcast else int((q_off[1:] - q_off[:-1]).max())
    o, lse, rec, launch = fwd_launch(q, k, v, q_off, kv_off, max_q, sm_scale=1 / math.sqrt(q.shape[2]),
                                     window=window, causal=causal, broadcast_q=broadcast, schedule=schedule,
                                     peel=peel, profile=profile, record_capacity=record_capacity, out=out,
                                     lse_out=lse, ablate=ablate)
    torch.cuda.synchronize()
    return o, lse, rec, launch


def _check(q, k, v, q_off, kv_off, o, lse, *, window=None, causal=False, tol=BF16_TOL):
    import torch

    from jfa_prof.reference import reference_attention

    ref_o, ref_lse = reference_attention(q, k, v, q_off, kv_off, window_size=window, causal=causal,
                                         broadcast_q=q_off is None)
    assert not torch.isnan(o).any(), "NaN in the output: an element was not written or a row blew up"
    err = (o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-6)
    assert err <= tol, f"relative error {err:.2e} > {tol}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "rows without keys must have lse = -inf, others finite"
    assert torch.allclose(lse[finite], ref_lse[finite], atol=2e-2, rtol=1e-3)
    # Rows that see no key are zeros.
    assert torch.all(o.float()[~finite.T] == 0)


LENGTHS = [0, 1, 127, 128, 129, 300, 1000, 2047, 0, 5]


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
@pytest.mark.parametrize("Lq", [1, 100, 128, 256])
def test_broadcast_q_matches_reference(cuda_device, schedule, Lq):
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=4, H_kv=4, D=128, Lq=Lq)
    o, lse, _, _ = _run(q, k, v, q_off, kv_off, schedule=schedule)
    _check(q, k, v, q_off, kv_off, o, lse)


@pytest.mark.parametrize("peel", [True, False])
@pytest.mark.parametrize("D,dtype", [(64, "bf16"), (128, "fp16"), (64, "fp16")])
def test_head_dims_dtypes_and_peeling(cuda_device, D, dtype, peel):
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=2, H_kv=2, D=D, Lq=200, dtype=dtype)
    o, lse, _, _ = _run(q, k, v, q_off, kv_off, peel=peel)
    _check(q, k, v, q_off, kv_off, o, lse, tol=BF16_TOL if dtype == "bf16" else FP16_TOL)


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_gqa_4_to_1(cuda_device, schedule):
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=8, H_kv=2, D=128, Lq=130)
    o, lse, _, _ = _run(q, k, v, q_off, kv_off, schedule=schedule)
    _check(q, k, v, q_off, kv_off, o, lse)


@pytest.mark.parametrize("window", [0, 37, 128, 500])
@pytest.mark.parametrize("broadcast", [True, False])
def test_window(cuda_device, window, broadcast):
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=2, H_kv=1, D=128, Lq=300 if broadcast else None)
    o, lse, _, _ = _run(q, k, v, q_off, kv_off, window=window)
    _check(q, k, v, q_off, kv_off, o, lse, window=window)


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
@pytest.mark.parametrize("window", [None, 64])
def test_jagged_causal(cuda_device, schedule, window):
    # Different q and kv lengths exercise the bottom-right alignment; Lq > Lk leaves blind rows.
    q_lengths = [0, 1, 200, 128, 129, 300, 10, 2047, 3, 0]
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=2, H_kv=2, D=128, q_lengths=q_lengths)
    o, lse, _, _ = _run(q, k, v, q_off, kv_off, causal=True, window=window, schedule=schedule)
    _check(q, k, v, q_off, kv_off, o, lse, causal=True, window=window)


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_single_query_block_takes_64_key_blocks_with_every_mask(cuda_device, schedule):
    """At most 128 queries per sequence: one query block per (batch, head), so the launch takes the
    64-key KV blocks; masks, GQA, D=64 and fp16 must hold there as with 128-key blocks."""
    from jfa_prof.kernels import fwd

    q_lengths = [0, 1, 100, 128, 64, 127, 10, 128, 3, 0]  # longest 128: still one query block
    cases = [
        (dict(q_lengths=q_lengths), dict(causal=True, window=None)),
        (dict(q_lengths=q_lengths), dict(causal=True, window=40)),
        (dict(q_lengths=q_lengths), dict(causal=False, window=0)),
        (dict(Lq=100), dict(causal=False, window=70)),
        (dict(Lq=128, D=64, dtype="fp16", H=8, H_kv=2), dict(causal=False, window=None)),
    ]
    for shape, mask in cases:
        kw = {"H": 2, "H_kv": 1, "D": 128, **shape}
        q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, **kw)
        o, lse, _, launch = _run(q, k, v, q_off, kv_off, schedule=schedule, **mask)
        assert launch.block_n == fwd.SHORT_Q_BLOCK_N
        _check(q, k, v, q_off, kv_off, o, lse, tol=FP16_TOL if kw.get("dtype") == "fp16" else BF16_TOL, **mask)
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=2, H_kv=1, D=128, Lq=129)  # two query blocks
    assert _run(q, k, v, q_off, kv_off, schedule=schedule)[3].block_n == fwd.BLOCK_N


def test_batch_of_one_and_large_batch(cuda_device):
    import torch

    for lengths in ([777], torch.randint(0, 600, (2000, )).tolist()):
        q, k, v, q_off, kv_off = _case(cuda_device, lengths, H=2, H_kv=2, D=128, Lq=64)
        o, lse, _, _ = _run(q, k, v, q_off, kv_off)
        _check(q, k, v, q_off, kv_off, o, lse)


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_profile_is_bitwise_free_and_records_every_tile(cuda_device, schedule, level):
    import torch

    from jfa_prof.records import Header, Span, Tile

    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS * 30, H=4, H_kv=4, D=128, Lq=256)
    o0, lse0, _, _ = _run(q, k, v, q_off, kv_off, schedule=schedule)
    o1, lse1, rec, launch = _run(q, k, v, q_off, kv_off, schedule=schedule, profile=level)
    assert torch.equal(o0, o1) and torch.equal(lse0, lse1)
    parts = launch.layout.split(rec.cpu().numpy())
    n_work = int(launch.work.n_work.item())
    tiles = parts["tiles"]
    assert parts["header"][Header.DROPPED] == 0
    assert tiles[:n_work, Tile.VALID].sum() == n_work and tiles[n_work:, Tile.VALID].sum() == 0
    assert np.all(tiles[:n_work, Tile.T_END] >= tiles[:n_work, Tile.T_START])
    assert np.all(tiles[:n_work, Tile.C_END] > tiles[:n_work, Tile.C_START])
    assert sorted(tiles[:n_work, Tile.TILE].tolist()) == sorted(launch.work.tiles[:n_work].tolist())
    assert np.all(parts["spans"][..., Span.VALID] == 1)
    # A buffer too small for every tile drops the rest and says how many.
    _, _, rec, launch = _run(q, k, v, q_off, kv_off, schedule=schedule, profile=level, record_capacity=100)
    parts = launch.layout.split(rec.cpu().numpy())
    assert parts["header"][Header.DROPPED] == n_work - 100
    assert parts["tiles"][:, Tile.VALID].sum() == 100


@pytest.mark.parametrize("schedule", ["lpt", "dynamic"])
def test_ablations_run_and_remove_what_they_say(cuda_device, schedule):
    import torch

    from jfa_prof.kernels.fwd import ABLATIONS

    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS, H=2, H_kv=2, D=128, Lq=200)
    for name, (bit, _) in ABLATIONS.items():
        o, lse, _, _ = _run(q, k, v, q_off, kv_off, schedule=schedule, ablate=bit)
        if name == "no_o_store":
            assert torch.isnan(o).all() and torch.isnan(lse).all(), "the poisoned outputs must stay untouched"
        else:
            assert not torch.isnan(o[:, :, :]).all(), f"{name}: the kernel must still write its output"
    # All together, as the cumulative waterfall runs them.
    _run(q, k, v, q_off, kv_off, schedule=schedule, ablate=sum(b for b, _ in ABLATIONS.values()))


def test_dynamic_tile_counter_starts_from_zero_on_every_launch(cuda_device):
    """The dynamic schedule counts taken tiles from zero: a list built inside a call brings its own
    zeroed counter, and a list reused across launches gets a fresh one each time. A counter left
    over from an earlier launch would skip tiles, and their NaN-poisoned rows would show."""
    import torch

    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch, jagged_flash_attention
    from jfa_prof.schedule import DEFAULT_SCHEDULE, fwd_work_list

    assert DEFAULT_SCHEDULE == "dynamic"
    q, k, v, q_off, kv_off = _case(cuda_device, LENGTHS * 30, H=4, H_kv=4, D=128, Lq=200)
    first = jagged_flash_attention(q, k, v, None, kv_off, 200, max(LENGTHS), broadcast_q=True)
    for _ in range(2):  # the op builds its list, and so its counter, on every call
        assert torch.equal(jagged_flash_attention(q, k, v, None, kv_off, 200, max(LENGTHS), broadcast_q=True), first)
    work = fwd_work_list(kv_off, None, 200, 4, 200, block_m=fwd.BLOCK_M, window=None, causal=False,
                         schedule="dynamic", n_ctas=torch.cuda.get_device_properties(cuda_device).multi_processor_count)
    for _ in range(3):  # one list, three launches
        out = torch.full_like(first, float("nan"))
        fwd_launch(q, k, v, None, kv_off, 200, sm_scale=1 / math.sqrt(128), window=None, causal=False,
                   broadcast_q=True, schedule="dynamic", work=work, out=out)
        assert torch.equal(out, first)
    o, lse = jagged_flash_attention(q, k, v, None, kv_off, 200, max(LENGTHS), broadcast_q=True, return_lse=True)
    _check(q, k, v, q_off, kv_off, o, lse)
