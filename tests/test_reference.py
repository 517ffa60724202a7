import math

import pytest
import torch
import torch.nn.functional as F

from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.reference import reference_attention


def _naive(q, k, v, q_lens, kv_lens, *, sm_scale=None, window=None, causal=False):
    """Row by row, head by head, in float64: softmax over the explicitly listed visible keys."""
    h, d = q.shape[1], q.shape[2]
    g = h // k.shape[1]
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    q, k, v = q.double(), k.double(), v.double()
    rows, lses = [], []
    q0 = kv0 = 0
    for lq, lk in zip(q_lens, kv_lens):
        for i in range(lq):
            keys = [j for j in range(lk)
                    if (window is None or abs(i - j) <= window)
                    and (not causal or j <= i + lk - lq)]
            out_row, lse_row = [], []
            for head in range(h):
                if not keys:
                    out_row.append(torch.zeros(d, dtype=torch.float64))
                    lse_row.append(torch.tensor(-math.inf, dtype=torch.float64))
                    continue
                kk = k[[kv0 + j for j in keys], head // g]
                vv = v[[kv0 + j for j in keys], head // g]
                s = (kk @ q[q0 + i, head]) * scale
                out_row.append(torch.softmax(s, 0) @ vv)
                lse_row.append(torch.logsumexp(s, 0))
            rows.append(torch.stack(out_row))
            lses.append(torch.stack(lse_row))
        q0 += lq
        kv0 += lk
    return torch.stack(rows), torch.stack(lses, dim=1)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _jagged(q_lens, kv_lens, h=2, h_kv=2, d=8, seed=0):
    q = _rand(sum(q_lens), h, d, seed=seed)
    k = _rand(sum(kv_lens), h_kv, d, seed=seed + 1)
    v = _rand(sum(kv_lens), h_kv, d, seed=seed + 2)
    return q, k, v, offsets_from_lengths(torch.tensor(q_lens)), \
        offsets_from_lengths(torch.tensor(kv_lens))


def _check(o, lse, o_ref, lse_ref):
    torch.testing.assert_close(o, o_ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,causal", [(None, False), (2, False), (None, True), (1, True)])
def test_matches_naive_on_unequal_lengths(window, causal):
    q_lens, kv_lens = [3, 5, 2, 4], [6, 5, 1, 3]
    q, k, v, qo, ko = _jagged(q_lens, kv_lens)
    o, lse = reference_attention(q, k, v, qo, ko, window_size=window, causal=causal)
    _check(o, lse, *_naive(q, k, v, q_lens, kv_lens, window=window, causal=causal))


def test_custom_scale_and_default_scale():
    q, k, v, qo, ko = _jagged([3, 4], [4, 2], d=16)
    o, lse = reference_attention(q, k, v, qo, ko, sm_scale=0.3)
    _check(o, lse, *_naive(q, k, v, [3, 4], [4, 2], sm_scale=0.3))
    o_default, _ = reference_attention(q, k, v, qo, ko)
    o_explicit, _ = reference_attention(q, k, v, qo, ko, sm_scale=1 / 4)
    assert torch.equal(o_default, o_explicit)


def test_gqa_reads_kv_head_h_over_group():
    q_lens, kv_lens = [4, 3], [5, 2]
    q, k, v, qo, ko = _jagged(q_lens, kv_lens, h=6, h_kv=2)
    o, lse = reference_attention(q, k, v, qo, ko)
    _check(o, lse, *_naive(q, k, v, q_lens, kv_lens))
    # Same as MHA on K/V with each kv head repeated for its 3 query heads.
    o_rep, lse_rep = reference_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                         qo, ko)
    _check(o, lse, o_rep, lse_rep)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa_on_equal_lengths(causal):
    b, n, h, h_kv, d = 3, 7, 4, 2, 16
    q, k, v, qo, ko = _jagged([n] * b, [n] * b, h=h, h_kv=h_kv, d=d)
    o, lse = reference_attention(q, k, v, qo, ko, causal=causal)

    def dense(x):  # [b*n, heads, d] -> [b, heads, n, d]
        return x.reshape(b, n, x.shape[1], d).transpose(1, 2)

    o_sdpa = F.scaled_dot_product_attention(dense(q), dense(k), dense(v), is_causal=causal,
                                            enable_gqa=True)
    torch.testing.assert_close(o, o_sdpa.transpose(1, 2).reshape(b * n, h, d),
                               atol=1e-5, rtol=1e-5)
    s = dense(q) @ dense(k).repeat_interleave(h // h_kv, 1).transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(lse, s.logsumexp(-1).permute(1, 0, 2).reshape(h, b * n))


def _uniform_case(lq, lk, **kw):
    """q = 0 makes attention uniform over the visible keys; v[j] = j + 1 reveals which."""
    q = torch.zeros(lq, 1, 8)
    k = _rand(lk, 1, 8)
    v = (torch.arange(lk, dtype=torch.float32) + 1).reshape(lk, 1, 1).expand(lk, 1, 8)
    return reference_attention(q, k, v, torch.tensor([0, lq]), torch.tensor([0, lk]), **kw)


def test_causal_is_aligned_bottom_right():
    # 3 queries, 5 keys: row i sees keys 0..i+2.
    o, lse = _uniform_case(3, 5, causal=True)
    torch.testing.assert_close(o[:, 0, 0], torch.tensor([2.0, 2.5, 3.0]))
    torch.testing.assert_close(lse[0], torch.log(torch.tensor([3.0, 4.0, 5.0])))
    # 4 queries, 2 keys: row i sees keys 0..i-2, so the first two rows see nothing.
    o, lse = _uniform_case(4, 2, causal=True)
    torch.testing.assert_close(o[:, 0, 0], torch.tensor([0.0, 0.0, 1.0, 1.5]))
    assert lse[0, :2].tolist() == [-math.inf, -math.inf]
    torch.testing.assert_close(lse[0, 2:], torch.log(torch.tensor([1.0, 2.0])))


def test_window_is_symmetric():
    o, lse = _uniform_case(5, 5, window_size=1)
    torch.testing.assert_close(o[:, 0, 0], torch.tensor([1.5, 2.0, 3.0, 4.0, 4.5]))
    torch.testing.assert_close(lse[0], torch.log(torch.tensor([2.0, 3.0, 3.0, 3.0, 2.0])))
    o, _ = _uniform_case(4, 4, window_size=0)
    torch.testing.assert_close(o[:, 0, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_empty_and_single_key_sequences():
    q_lens, kv_lens = [2, 3, 0, 1], [0, 1, 0, 3]
    q, k, v, qo, ko = _jagged(q_lens, kv_lens)
    o, lse = reference_attention(q, k, v, qo, ko)
    assert o.shape == (6, 2, 8) and lse.shape == (2, 6)
    assert torch.equal(o[:2], torch.zeros(2, 2, 8))
    assert torch.isneginf(lse[:, :2]).all()
    # A single key gets all the weight, whatever the score.
    torch.testing.assert_close(o[2:5], v[0].expand(3, 2, 8))
    assert torch.isfinite(lse[:, 2:]).all()
    _check(o, lse, *_naive(q, k, v, q_lens, kv_lens))


def test_gradients_match_naive_and_are_zero_for_rows_without_keys():
    q_lens, kv_lens = [2, 4, 3], [0, 2, 3]
    q, k, v, qo, ko = _jagged(q_lens, kv_lens)
    w = _rand(sum(q_lens), 2, 8, seed=9)

    def grads(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        o, lse = fn(*leaves)
        loss = (o * w.to(dtype)).sum() + torch.where(torch.isinf(lse), 0.0, lse).sum()
        return torch.autograd.grad(loss, leaves)

    # causal with Lq > Lk leaves rows 0-1 of the second sequence blind as well.
    got = grads(lambda q_, k_, v_: reference_attention(q_, k_, v_, qo, ko, causal=True),
                torch.float32)
    want = grads(lambda q_, k_, v_: _naive(q_, k_, v_, q_lens, kv_lens, causal=True),
                 torch.float64)
    for g in got:
        assert torch.isfinite(g).all()
    for g, g_ref in zip(got, want):
        torch.testing.assert_close(g, g_ref.float(), atol=1e-5, rtol=1e-5)
    blind_rows = [0, 1, 2, 3]  # empty-KV sequence, then the first two causal rows
    assert torch.equal(got[0][blind_rows], torch.zeros(4, 2, 8))
    assert got[0][4:].abs().sum() > 0


def test_all_sequences_empty():
    q, k, v, qo, ko = _jagged([2, 1], [0, 0])
    o, lse = reference_attention(q.requires_grad_(), k, v, qo, ko)
    o.sum().backward()
    assert torch.equal(o, torch.zeros(3, 2, 8)) and torch.isneginf(lse).all()
    assert torch.equal(q.grad, torch.zeros_like(q))


@pytest.mark.parametrize("window", [None, 1])
def test_broadcast_q_equals_repeated_jagged_q(window):
    lq, kv_lens = 3, [4, 0, 2, 5]
    b = len(kv_lens)
    q = _rand(lq, 4, 8, seed=3).requires_grad_()
    _, k, v, _, ko = _jagged([0] * b, kv_lens, h=4, h_kv=2)
    o, lse = reference_attention(q, k, v, None, ko, broadcast_q=True, window_size=window)

    q_rep = q.detach().repeat(b, 1, 1).requires_grad_()
    qo = torch.arange(b + 1, dtype=torch.int32) * lq
    o_rep, lse_rep = reference_attention(q_rep, k, v, qo, ko, window_size=window)
    assert o.shape == (b * lq, 4, 8)
    torch.testing.assert_close(o, o_rep)
    torch.testing.assert_close(lse, lse_rep)

    w = _rand(b * lq, 4, 8, seed=4)
    (o * w).sum().backward()
    (o_rep * w).sum().backward()
    # dQ of broadcast-Q is the batch sum of the repeated-Q dQ.
    torch.testing.assert_close(q.grad, q_rep.grad.reshape(b, lq, 4, 8).sum(0))


def test_low_precision_inputs_give_float32_results():
    q, k, v, qo, ko = _jagged([3], [4])
    o, lse = reference_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), qo.long(), ko.long())
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    _check(o, lse, *_naive(q.bfloat16(), k.bfloat16(), v.bfloat16(), [3], [4]))


def test_rejects_causal_broadcast_and_negative_window():
    q, k, v, qo, ko = _jagged([2], [2])
    with pytest.raises(ValueError, match="causal"):
        reference_attention(q, k, v, None, ko, broadcast_q=True, causal=True)
    with pytest.raises(ValueError, match="window_size"):
        reference_attention(q, k, v, qo, ko, window_size=-1)
