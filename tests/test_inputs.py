import dataclasses

import pytest
import torch

from jfa_prof.inputs import (
    GRIDS, Workload, attention_flops, find_workload, offsets_from_lengths, sample_lengths,
)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# Inclusive bounds worked out by hand from SPEC §6 (integers inside the real interval).
@pytest.mark.parametrize("max_len,s,lo,hi", [
    (1000, 0.1, 1, 200),
    (1000, 0.25, 1, 500),
    (100, 0.35, 1, 70),  # 2*0.35*100 is 69.999... in floating point
    (1000, 0.5, 0, 1000),
    (1000, 0.75, 500, 1000),
    (1000, 0.9, 800, 1000),
    (1024, 0.9, 820, 1024),  # 0.8 * 1024 = 819.2
    (1024, 0.1, 1, 204),  # 0.2 * 1024 = 204.8
    (7, 0.05, 1, 1),
    (7, 1.0, 7, 7),
])
def test_density_bounds_are_respected_and_reached(max_len, s, lo, hi):
    lengths = sample_lengths(20_000, max_len, s, generator=_gen())
    assert lengths.dtype == torch.int64 and lengths.shape == (20_000,)
    assert int(lengths.min()) == lo and int(lengths.max()) == hi
    assert abs(lengths.double().mean().item() - (lo + hi) / 2) < 0.02 * max_len + 0.5


def test_density_mean_tracks_sparsity():
    for s in (0.1, 0.5, 0.9):
        mean = sample_lengths(20_000, 2048, s, generator=_gen()).double().mean().item()
        assert abs(mean / 2048 - s) < 0.01


def test_sampling_is_seeded():
    a = sample_lengths(500, 512, 0.5, generator=_gen(1))
    assert torch.equal(a, sample_lengths(500, 512, 0.5, generator=_gen(1)))
    assert not torch.equal(a, sample_lengths(500, 512, 0.5, generator=_gen(2)))


def test_other_distributions():
    assert torch.equal(sample_lengths(5, 64, 0.3, generator=_gen(), distribution="equal"),
                       torch.full((5,), 64))

    z = sample_lengths(5000, 1000, 0.9, generator=_gen(), distribution="with_zeros")
    zero_fraction = (z == 0).double().mean().item()
    assert 0.08 < zero_fraction < 0.12
    assert int(z[z > 0].min()) >= 800 and int(z.max()) <= 1000

    t = sample_lengths(5000, 1000, 0.5, generator=_gen(), distribution="long_tail")
    assert int(t.min()) >= 1 and int(t.max()) == 1000
    assert t.median().item() < 250  # most are short...
    assert 0.03 < (t == 1000).double().mean().item() < 0.2  # ...and a few hit the clip

    with pytest.raises(ValueError, match="distribution"):
        sample_lengths(5, 64, 0.5, generator=_gen(), distribution="zipf")
    with pytest.raises(ValueError, match="sparsity"):
        sample_lengths(5, 64, 0.0, generator=_gen())


def test_offsets_from_lengths():
    offsets = offsets_from_lengths(torch.tensor([3, 0, 5, 1]))
    assert offsets.dtype == torch.int32
    assert offsets.tolist() == [0, 3, 3, 8, 9]
    assert offsets_from_lengths(torch.tensor([], dtype=torch.int64)).tolist() == [0]
    with pytest.raises(ValueError, match=">= 0"):
        offsets_from_lengths(torch.tensor([2, -1]))
    with pytest.raises(ValueError, match="int32"):
        offsets_from_lengths(torch.tensor([2**30, 2**30]))


def _brute_pairs(q_lens, kv_lens, window, causal):
    n = 0
    for lq, lk in zip(q_lens, kv_lens):
        for i in range(lq):
            for j in range(lk):
                if window is not None and abs(i - j) > window:
                    continue
                if causal and j > i + lk - lq:
                    continue
                n += 1
    return n


@pytest.mark.parametrize("window", [None, 0, 1, 3, 50])
@pytest.mark.parametrize("causal", [False, True])
def test_flops_count_visible_pairs_exactly(window, causal):
    q_lens = [5, 0, 7, 3, 1, 9, 4]
    kv_lens = [5, 4, 2, 8, 0, 9, 11]
    H, D = 3, 64
    fwd = attention_flops(q_lens, kv_lens, H, D, window=window, causal=causal)
    assert fwd == 4 * H * D * _brute_pairs(q_lens, kv_lens, window, causal)
    bwd = attention_flops(torch.tensor(q_lens), torch.tensor(kv_lens), H, D, window=window,
                          causal=causal, pass_="bwd")
    assert bwd == 2.5 * fwd


def test_flops_unmasked_and_large():
    assert attention_flops([256] * 4, [100, 0, 7, 2048], 4, 128) == 4 * 4 * 128 * 256 * 2155
    # SPEC §8 dense calibration point: 8 x 16 heads x 4096^2.
    assert attention_flops([4096] * 8, [4096] * 8, 16, 128) == 4 * 16 * 128 * 8 * 4096**2
    # Causal over equal lengths keeps the lower triangle with its diagonal.
    assert attention_flops([4096] * 8, [4096] * 8, 16, 128, causal=True) == \
        4 * 16 * 128 * 8 * 4096 * 4097 // 2
    with pytest.raises(ValueError, match="pass_"):
        attention_flops([1], [1], 1, 64, pass_="both")


def _small(**kw):
    base = dict(grid="t", B=6, H=4, H_kv=2, D=64, Lq=5, max_kv=12, sparsity=0.5,
                broadcast_q=True, seed=3)
    return Workload(**{**base, **kw})


def test_make_broadcast_q():
    x = _small().make("cpu")
    assert x.q.shape == (5, 4, 64) and x.q.dtype == torch.bfloat16
    assert x.q_offsets.tolist() == [0, 5, 10, 15, 20, 25, 30]
    assert x.kv_offsets.dtype == torch.int32
    assert x.kv_offsets.tolist() == offsets_from_lengths(x.kv_lens).tolist()
    assert x.k.shape == x.v.shape == (int(x.kv_lens.sum()), 2, 64)
    assert x.q_lens.tolist() == [5] * 6
    assert x.max_seq_len_q == 5 and x.max_seq_len_kv == int(x.kv_lens.max())
    assert x.total_q == 30 and x.total_kv == int(x.kv_offsets[-1])
    assert x.flops() == attention_flops([5] * 6, x.kv_lens, 4, 64)


def test_make_jagged_self_attention_shares_offsets():
    x = _small(broadcast_q=False, Lq=12, max_kv=12, causal=True, window=2).make("cpu",
                                                                                torch.float32)
    assert x.q.dtype == torch.float32
    assert torch.equal(x.q_offsets, x.kv_offsets)
    assert x.q.shape[0] == x.k.shape[0]
    assert torch.equal(x.q_lens, x.kv_lens)
    assert x.flops("bwd") == attention_flops(x.kv_lens, x.kv_lens, 4, 64, window=2, causal=True,
                                             pass_="bwd")


def test_make_is_deterministic_per_seed():
    a, b = _small().make("cpu"), _small().make("cpu")
    for name in ("q", "k", "v", "kv_offsets"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    c = _small(seed=4).make("cpu")
    assert not torch.equal(a.kv_lens, c.kv_lens)


def test_workload_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="causal"):
        _small(causal=True)
    with pytest.raises(ValueError, match="self-attention"):
        _small(broadcast_q=False)
    with pytest.raises(ValueError, match="multiple"):
        _small(H_kv=3)
    with pytest.raises(ValueError, match="dtype"):
        _small(dtype="fp8")


def test_grids_follow_spec():
    hsp, jagged, dense = GRIDS["hsp"], GRIDS["jagged"], GRIDS["dense"]
    assert len(hsp) == 18 and len(jagged) == 8 and len(dense) == 1
    assert {(w.Lq, w.max_kv, w.sparsity) for w in hsp} == {
        (lq, m, s) for lq in (128, 256) for m in (1024, 2048, 4096) for s in (0.1, 0.5, 0.9)}
    assert all((w.B, w.H, w.H_kv, w.D, w.broadcast_q) == (1024, 4, 4, 128, True) for w in hsp)
    assert {(w.max_kv, w.sparsity) for w in jagged} == {
        (m, s) for m in (256, 512, 1024, 2048) for s in (0.5, 1.0)}
    assert all((w.B, w.H, w.D, w.broadcast_q, w.Lq) == (1152, 4, 128, False, w.max_kv)
               for w in jagged)
    d = dense[0]
    assert (d.B, d.H, d.D, d.Lq, d.max_kv, d.sparsity, d.broadcast_q) == \
        (8, 16, 128, 4096, 4096, 1.0, False)
    assert [(w.B, w.Lq, w.max_kv, w.sparsity, w.broadcast_q) for w in GRIDS["long"]] == [
        (32, 512, 16384, 0.5, True), (32, 512, 16384, 0.9, True)]
    labels = [w.label for ws in GRIDS.values() for w in ws]
    assert len(set(labels)) == len(labels)
    assert "hsp Lq=256 max=2048 s=0.1" in labels
    assert find_workload("hsp Lq=256 max=2048 s=0.1") == dataclasses.replace(
        hsp[0], Lq=256, max_kv=2048, sparsity=0.1)
    with pytest.raises(KeyError):
        find_workload("hsp Lq=7 max=1 s=1")


def test_an_hsp_point_is_read_as_the_benchmark_scripts_take_it():
    from jfa_prof.inputs import hsp_point

    assert hsp_point("128,1024,0.1") == (128, 1024, 0.1)
    with pytest.raises(ValueError):
        hsp_point("128,1024")
