"""The peers: which exist here (:func:`peer_status`), and how each is called on a point's inputs
(:func:`peer_impls`): the setup it needs (padded tensors, a block mask, a repeated Q) is built
outside the timed region.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from jfa_prof.ablations import check_pass
from jfa_prof.bench.impls import Impl, _backward, _scale
from jfa_prof.errors import BadInputError

__all__ = ["PEERS", "PEER_NOTES", "PeerStatus", "document_block_mask", "peer_impls", "peer_status"]

# CLI key -> implementation name in result files (the names earlier files used).
PEERS = {"fa4": "fa4", "varlen": "torch-varlen", "sdpa": "torch-sdpa", "flex": "torch-flex"}
PEER_NOTES = {
    "fa4": "FlashAttention-4 (flash_attn.cute); broadcast-Q through a stride-0 Q",
    "varlen": "torch.nn.attention.varlen.varlen_attn on repeated Q",
    "sdpa": "scaled_dot_product_attention on padded tensors with a mask",
    "flex": "torch.compile(flex_attention) with a document block mask",
}

# Tests replace this to pretend a peer is (not) installed.
_import = importlib.import_module


# ---------------------------------------------------------------------------------------------
# which are there
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerStatus:
    key: str
    impl: str
    available: bool
    reason: str | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dist_version(*names: str) -> str | None:
    from importlib import metadata

    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def _probe(key: str) -> tuple[str | None, str | None]:
    """(version, reason it is missing) for one peer; imports only the peer's own module."""
    if key == "fa4":
        mod = _import("flash_attn.cute")
        if not hasattr(mod, "flash_attn_varlen_func"):
            return None, "flash_attn.cute has no flash_attn_varlen_func"
        return _dist_version("flash-attn-4", "flash_attn_4", "flash-attn") or getattr(mod, "__version__", None), None
    if key == "varlen":
        mod = _import("torch.nn.attention.varlen")
        if not hasattr(mod, "varlen_attn"):
            return None, "torch.nn.attention.varlen has no varlen_attn"
    elif key == "sdpa":
        mod = _import("torch.nn.functional")
        if not hasattr(mod, "scaled_dot_product_attention"):
            return None, "torch has no scaled_dot_product_attention"
    elif key == "flex":
        mod = _import("torch.nn.attention.flex_attention")
        if not all(hasattr(mod, n) for n in ("flex_attention", "BlockMask")):
            return None, "torch.nn.attention.flex_attention lacks flex_attention or BlockMask"
    return _dist_version("torch"), None


def peer_status(keys: Iterable[str]) -> dict[str, PeerStatus]:
    """Per requested peer, whether it can run here and which version; unknown keys are an error."""
    keys = list(keys)
    unknown = [k for k in keys if k not in PEERS]
    if unknown:
        raise BadInputError(f"unknown peer(s): {', '.join(unknown)}", hint=f"known: {', '.join(PEERS)}")
    out = {}
    for k in keys:
        try:
            version, reason = _probe(k)
        except ImportError as e:
            version, reason = None, f"not importable: {e}"
        out[k] = PeerStatus(k, PEERS[k], reason is None, reason, version)
    return out


# ---------------------------------------------------------------------------------------------
# how each is called
# ---------------------------------------------------------------------------------------------

def _repeated_q(x):
    """Q as ``[B*Lq, H, D]``, one copy per sequence, for peers without broadcast support."""
    if not x.workload.broadcast_q:
        return x.q
    B = x.workload.B
    return x.q.unsqueeze(0).expand(B, *x.q.shape).reshape(B * x.q.shape[0], *x.q.shape[1:])


def _fa4(x, repeat_q: bool = False):
    from flash_attn.cute import flash_attn_varlen_func

    w = x.workload
    extra: dict[str, Any] = {}
    if w.causal:
        extra["causal"] = True
    if w.window is not None:
        extra["window_size"] = (w.window, w.window)
    if w.broadcast_q and not repeat_q:
        # SPEC §7: a stride-0 Q (no copy) works in FA4's forward; keyword arguments only (the
        # 4th positional is qv), and a Python int max length (a tensor recompiles every call).
        qb = x.q.unsqueeze(0).expand(w.B, *x.q.shape)

        def run():
            return flash_attn_varlen_func(q=qb, k=x.k, v=x.v, cu_seqlens_k=x.kv_offsets,
                                          max_seqlen_k=int(x.max_seq_len_kv), **extra)
        return run, lambda r: r[0].reshape(w.B * x.q.shape[0], *x.q.shape[1:])

    # Its backward fails on the stride-0 form (SPEC §7): the repeated Q, whose dQ autograd sums.
    q = _repeated_q(x)

    def run():
        return flash_attn_varlen_func(q=q, k=x.k, v=x.v, cu_seqlens_q=x.q_offsets, cu_seqlens_k=x.kv_offsets,
                                      max_seqlen_q=int(x.max_seq_len_q), max_seqlen_k=int(x.max_seq_len_kv), **extra)
    return run, lambda r: r[0]


def _varlen(x):
    from torch.nn.attention.varlen import varlen_attn

    w = x.workload
    q_rep = _repeated_q(x).contiguous()
    extra: dict[str, Any] = {}
    if w.window is not None:
        extra["window_size"] = (w.window, w.window)
    elif w.causal:
        # Jagged Q is self-attention (Lq_b == Lk_b), where top-left and bottom-right agree.
        extra["window_size"] = (-1, 0)
    if w.H != w.H_kv:
        extra["enable_gqa"] = True

    def run():
        return varlen_attn(q_rep, x.k, x.v, x.q_offsets, x.kv_offsets, int(x.max_seq_len_q), int(x.max_seq_len_kv),
                           **extra)
    return run, lambda o: o


def _padding_index(lengths, max_len: int):
    """Bool ``[B, max_len]``: which padded slots hold a packed row (row-major = packed order)."""
    import torch

    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def _sdpa(x):
    import torch
    import torch.nn.functional as F

    w = x.workload
    dev = x.q.device
    q_len, kv_len = x.q_lens.to(dev), x.kv_lens.to(dev)
    Lq = int(x.max_seq_len_q)
    # Keys padded to a multiple of 16: the memory-efficient kernel needs an aligned mask and
    # would otherwise pad the mask itself on every call, inside the timed region.
    Lk = -(-int(x.max_seq_len_kv) // 16) * 16
    kv_slots = _padding_index(kv_len, Lk)

    def pad_kv(t):
        p = t.new_zeros(w.B, Lk, *t.shape[1:])
        p[kv_slots] = t
        return p.transpose(1, 2).contiguous()  # [B, H_kv, Lk, D]

    k, v = pad_kv(x.k), pad_kv(x.v)
    if w.broadcast_q:
        q = x.q.transpose(0, 1).unsqueeze(0).expand(w.B, -1, -1, -1).contiguous()
        q_slots = None
    else:
        q_slots = _padding_index(q_len, Lq)
        qp = x.q.new_zeros(w.B, Lq, *x.q.shape[1:])
        qp[q_slots] = x.q
        q = qp.transpose(1, 2).contiguous()
    full = bool((kv_len == Lk).all()) and bool((q_len == Lq).all())
    if full and w.window is None and not w.causal:
        # Nothing to mask (dense): without a mask SDPA can pick its fastest kernel, as a user would.
        mask = None
    else:
        i = torch.arange(Lq, device=dev)[None, :, None]
        j = torch.arange(Lk, device=dev)[None, None, :]
        mask = j < kv_len[:, None, None]
        if w.window is not None:
            mask = mask & ((i - j).abs() <= w.window)
        if w.causal:
            mask = mask & (j <= i + (kv_len - q_len)[:, None, None])
        mask = mask.unsqueeze(1)  # [B, 1, Lq, Lk], broadcast over heads
    extra = {"enable_gqa": True} if w.H != w.H_kv else {}
    scale = _scale(x)

    def run():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **extra)

    def output(o):
        o = o.transpose(1, 2)  # [B, Lq, H, D]
        return o.reshape(-1, *o.shape[2:]) if q_slots is None else o[q_slots]
    return run, output


def document_block_mask(q_offsets, kv_offsets, total_q: int, total_kv: int, *, block: int = 128,
                        window: int | None = None, causal: bool = False):
    """A FlexAttention ``BlockMask`` where query row r of sequence b sees the keys of sequence b
    only (the document mask), with the window / causal rule on positions within the sequence.

    Built from the offsets block by block (``BlockMask.from_kv_blocks``), never from a dense
    ``total_q × total_kv`` mask, which at benchmark sizes would not fit: a query block that lies
    in one sequence gets that sequence's KV blocks, the ones wholly inside it as full blocks
    (no mask_mod call) when there is no window or causal rule, the edge ones as partial; a
    query block spanning several sequences gets all their KV blocks as partial ones.
    """
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    dev = kv_offsets.device
    q_off = q_offsets.to(device=dev, dtype=torch.int64)
    kv_off = kv_offsets.to(torch.int64)
    B = kv_off.numel() - 1
    n_qb, n_kvb = -(-total_q // block), -(-total_kv // block)

    # Sequence of each query row and key, and where each sequence starts, for the mask_mod.
    q_len, kv_len = q_off[1:] - q_off[:-1], kv_off[1:] - kv_off[:-1]
    doc_q = torch.repeat_interleave(torch.arange(B, device=dev), q_len, output_size=total_q)
    doc_kv = torch.repeat_interleave(torch.arange(B, device=dev), kv_len, output_size=total_kv)

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        keep = d == doc_kv[kv_idx]
        if window is not None or causal:
            i = q_idx - q_off[d]
            j = kv_idx - kv_off[d]
            if window is not None:
                keep = keep & ((i - j).abs() <= window)
            if causal:
                keep = keep & (j <= i + kv_len[d] - q_len[d])
        return keep

    # Per query block: first and last sequence, and the KV rows they cover.
    r0 = torch.arange(n_qb, device=dev) * block
    r1 = torch.clamp(r0 + block, max=total_q) - 1
    d0 = torch.searchsorted(q_off, r0, right=True) - 1
    d1 = torch.searchsorted(q_off, r1, right=True) - 1
    s, e = kv_off[d0], kv_off[d1 + 1]
    all_lo = s // block
    all_hi = torch.where(e > s, -(-e // block), all_lo)
    full_lo, full_hi = -(-s // block), e // block
    has_full = (d0 == d1) & (full_hi > full_lo) & (window is None) & (not causal)
    zero = torch.zeros_like(all_lo)
    f_lo = torch.where(has_full, full_lo, zero)
    f_n = torch.where(has_full, full_hi - full_lo, zero)
    # Partial blocks: [all_lo, full_lo) and [full_hi, all_hi) around the full ones, or all of them.
    p1_lo, p1_n = all_lo, torch.where(has_full, full_lo - all_lo, all_hi - all_lo)
    p2_lo, p2_n = full_hi, torch.where(has_full, all_hi - full_hi, zero)

    col = torch.arange(n_kvb, device=dev)[None, :]
    part_idx = torch.where(col < p1_n[:, None], p1_lo[:, None] + col, p2_lo[:, None] + col - p1_n[:, None])
    full_idx = f_lo[:, None] + col

    def as_mask(n, idx):
        # Entries past a row's count are never read; clamped so every index stays in range.
        return (n.to(torch.int32)[None, None], idx.clamp(0, max(n_kvb - 1, 0)).to(torch.int32)[None, None])

    kv_num, kv_idx = as_mask(p1_n + p2_n, part_idx)
    full_num, full_i = as_mask(f_n, full_idx)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_i, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(total_q, total_kv))


def _flex(x):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    w = x.workload
    q = _repeated_q(x).transpose(0, 1).unsqueeze(0).contiguous()  # [1, H, total_q, D]
    k = x.k.transpose(0, 1).unsqueeze(0).contiguous()
    v = x.v.transpose(0, 1).unsqueeze(0).contiguous()
    bm = document_block_mask(x.q_offsets, x.kv_offsets, q.shape[2], k.shape[2], window=w.window, causal=w.causal)
    # Uncompiled flex_attention materializes the full score matrix: only the compiled one is a peer.
    # Every point has new shapes and new mask tensors, so it recompiles; dynamo's cache is per
    # code object and past its recompile limit it silently runs eager (out of memory at these
    # sizes). Starting each point from an empty cache keeps every point compiled.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    extra = {"enable_gqa": True} if w.H != w.H_kv else {}
    scale = _scale(x)

    def run():
        return compiled(q, k, v, block_mask=bm, scale=scale, **extra)
    return run, lambda o: o[0].transpose(0, 1)


_PEER_BUILDERS = {"fa4": _fa4, "varlen": _varlen, "sdpa": _sdpa, "flex": _flex}
_BWD_BUILDERS = {**_PEER_BUILDERS, "fa4": lambda x: _fa4(x, repeat_q=True)}


def peer_impls(x, keys: Iterable[str], pass_: str = "fwd") -> list[Impl]:
    """The peers ``keys`` (CLI keys of :data:`PEERS`) as implementations of ``pass_`` on ``x``."""
    check_pass(pass_)
    if pass_ == "bwd":
        return [Impl(PEERS[k], (lambda k=k: _backward(x, _BWD_BUILDERS[k])),
                     kind="peer", note=PEER_NOTES[k] + "; backward of the repeated-Q form, autograd sums dQ")
                for k in keys]
    return [Impl(PEERS[k], (lambda k=k: _PEER_BUILDERS[k](x)), kind="peer", note=PEER_NOTES[k]) for k in keys]
