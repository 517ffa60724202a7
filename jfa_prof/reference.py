"""fp32 oracle for jagged attention (SPEC §2): a per-sequence loop, slow but obviously right.

Every kernel and peer is checked against this. It runs on CPU or GPU, accepts any floating
dtype (computing in float32), and is differentiable through plain autograd, so it is also the
oracle for the backward — including the broadcast-Q case, where dQ is the sum over the batch
simply because the same ``q`` feeds every sequence.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch

__all__ = ["reference_attention", "visible_mask"]


def visible_mask(
    lq: int, lk: int, *, window_size: int | None = None, causal: bool = False, device=None
) -> torch.Tensor:
    """Bool ``[lq, lk]``: True where query row i may attend to key j of the same sequence.

    ``causal`` is aligned bottom-right (FlashAttention): j <= i + lk - lq.
    """
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    mask = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if window_size is not None:
        mask &= (i - j).abs() <= window_size
    if causal:
        mask &= j <= i + (lk - lq)
    return mask


@contextmanager
def _full_fp32_matmul():
    # A caller that enabled TF32 for speed must not silently degrade the oracle.
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def _attend(q, k, v, mask, sm_scale):
    """One sequence. q [Lq, H, D], k/v [Lk, H_kv, D] (float32), mask [Lq, Lk].

    Returns o [Lq, H, D] and lse [H, Lq]. Rows with no visible key give o = 0, lse = -inf and
    zero gradients: masked scores are replaced by -inf *before* the exp, the row max used for
    stability is made finite and detached, and the normaliser is replaced by 1 where it is 0,
    so no 0/0 or inf-inf ever enters the graph.
    """
    lq, h, d = q.shape
    lk, h_kv, _ = k.shape
    g = h // h_kv
    # Query head h = kv_head * g + r reads kv head h // g; grouping avoids materialising
    # repeated K/V.
    s = torch.einsum("qhrd,nhd->hrqn", q.reshape(lq, h_kv, g, d), k).reshape(h, lq, lk)
    s = torch.where(mask, s * sm_scale, float("-inf"))
    if lk > 0:
        m = s.amax(dim=-1, keepdim=True)
    else:
        m = s.new_full((h, lq, 1), float("-inf"))
    # Shifting by any constant leaves softmax and lse unchanged, so m needs no gradient.
    m = torch.where(torch.isfinite(m), m, 0.0).detach()
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    seen = l > 0
    l_safe = torch.where(seen, l, 1.0)
    p = p / l_safe
    o = torch.einsum("hrqn,nhd->qhrd", p.reshape(h_kv, g, lq, lk), v).reshape(lq, h, v.shape[-1])
    lse = torch.where(seen, m + torch.log(l_safe), float("-inf")).squeeze(-1)
    return o, lse


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor | None,
    kv_offsets: torch.Tensor,
    *,
    sm_scale: float | None = None,
    window_size: int | None = None,
    causal: bool = False,
    broadcast_q: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged attention in float32, one sequence at a time.

    Shapes as in SPEC §2: k, v ``[total_kv, H_kv, D]``; jagged Q: q ``[total_q, H, D]`` with
    ``q_offsets``; broadcast-Q: q ``[Lq, H, D]`` shared by all B sequences and ``q_offsets``
    ignored. Positions for the window/causal masks are counted from each sequence's start (for
    broadcast-Q, the query position is its row in ``[0, Lq)``).

    Returns ``(o, lse)``: o float32 ``[total_q, H, D]`` (``[B*Lq, H, D]`` for broadcast-Q);
    lse float32 ``[H, total_q]`` in natural log, ``-inf`` for rows that see no key.
    """
    if causal and broadcast_q:
        raise ValueError("causal=True is only defined for jagged Q, not broadcast_q=True")
    if window_size is not None and window_size < 0:
        raise ValueError(f"window_size must be >= 0, got {window_size}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])

    kv_bounds = kv_offsets.tolist()
    batch = len(kv_bounds) - 1
    if broadcast_q:
        lq = q.shape[0]
        q_bounds = [b * lq for b in range(batch + 1)]
    else:
        if q_offsets is None:
            raise ValueError("q_offsets is required for jagged Q (broadcast_q=False)")
        q_bounds = q_offsets.tolist()
        if len(q_bounds) != batch + 1:
            raise ValueError(
                f"q_offsets has {len(q_bounds)} entries but kv_offsets has {batch + 1}")

    qf, kf, vf = q.float(), k.float(), v.float()
    outs, lses = [], []
    with _full_fp32_matmul():
        for b in range(batch):
            kb = kf[kv_bounds[b]:kv_bounds[b + 1]]
            vb = vf[kv_bounds[b]:kv_bounds[b + 1]]
            qb = qf if broadcast_q else qf[q_bounds[b]:q_bounds[b + 1]]
            mask = visible_mask(qb.shape[0], kb.shape[0], window_size=window_size,
                                causal=causal, device=q.device)
            o, lse = _attend(qb, kb, vb, mask, sm_scale)
            outs.append(o)
            lses.append(lse)

    if not outs:
        h, d = q.shape[1], v.shape[-1]
        return qf.new_zeros(0, h, d), qf.new_zeros(h, 0)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)
