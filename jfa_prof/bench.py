"""Benchmarking the kernel against its peers (SPEC §6, §7), and reading the result files.

One point of a run: build the inputs of a workload, then for each implementation build what it
needs (padded tensors, a block mask, a work list: outside the timed region), run it once and
check its output, measure the memory one call allocates, and take the median time
(:mod:`jfa_prof.timing`). The first implementation (the baseline) is timed twice to show the
noise. On the first point every output is also checked against the fp32 reference; an
implementation that is wrong there is reported and not timed again, and one that raises is
reported for that point only. Neither stops the run.

Result files are JSON: ``{"meta": {...}, "peers": {...}, "results": [record, ...]}``. A record
(SPEC §6) holds the pass, the workload, ``flops`` (SPEC §2 convention), per implementation
``ms`` / ``tflops`` / ``ratio_vs_fa4`` (FA4 time over this time: above 1 is faster than FA4) /
``ratio_vs_best_peer`` / ``peak_mem_mb`` / relative errors or ``error``, the best peer, and
the machine, versions, date and command (``meta``, also at the top). A run with ``limits`` also
keeps per implementation ``gpu_ms`` (GPU work per call) and per point ``time_split`` (our kernel's
recorded time, split: `jfa_prof.analyses.limits`). :func:`load_results` reads these and the earlier
files that kept ``meta`` only at the top.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from jfa_prof.ablations import PASSES, check_pass
from jfa_prof.errors import BadInputError, read_json_file
from jfa_prof.schedule import DEFAULT_SCHEDULE

__all__ = ["PASSES", "PEERS", "TARGETS", "BenchResults", "Impl", "PeerStatus", "document_block_mask", "fwd_host_breakdown",
           "impl_kind", "impl_names", "jfa_impls", "load_results", "peer_impls", "peer_status", "reference_output",
           "record_split", "rel_err", "run_bench", "select_workloads", "upstream_grad"]

# CLI key -> implementation name in result files (the names earlier files used).
PEERS = {"fa4": "fa4", "varlen": "torch-varlen", "sdpa": "torch-sdpa", "flex": "torch-flex"}
PEER_NOTES = {
    "fa4": "FlashAttention-4 (flash_attn.cute); broadcast-Q through a stride-0 Q",
    "varlen": "torch.nn.attention.varlen.varlen_attn on repeated Q",
    "sdpa": "scaled_dot_product_attention on padded tensors with a mask",
    "flex": "torch.compile(flex_attention) with a document block mask",
}
# The speed-up over FA4 each pass aims for per grid (SPEC §8); grids not named here have none.
TARGETS = {("fwd", "hsp"): 1.15, ("fwd", "dense"): 1.0, ("bwd", "hsp"): 1.5, ("bwd", "dense"): 1.0}
# bf16 operands land between 1e-3 and 1e-2 against an fp32 reference; more is a wrong kernel.
DEFAULT_TOL = 1e-2
FORMAT = "jfa-prof bench 1"

# Tests replace this to pretend a peer is (not) installed.
_import = importlib.import_module


def __getattr__(name: str) -> Any:
    # upstream_grad and rows_seeing_keys live beside the workload, in jfa_prof.inputs; they are
    # still served from here for the callers that take them from this module, on first use
    # because jfa_prof.inputs imports torch and reading result files (`bench --results`) does not.
    if name in ("upstream_grad", "rows_seeing_keys"):
        from jfa_prof import inputs

        return getattr(inputs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def impl_kind(name: str) -> str:
    """"jfa" for this project's implementations, "peer" for the others."""
    return "jfa" if name.startswith("jfa") else "peer"


# ---------------------------------------------------------------------------------------------
# peers: which are there
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
# implementations
# ---------------------------------------------------------------------------------------------

@dataclass
class Impl:
    """One implementation at one point. ``build()`` does the setup that is not timed and returns
    ``(run, output)``: ``run()`` is what is timed; ``output(run())`` is the attention output as
    ``[rows, H, D]`` in packed order, for the checks (also not timed)."""

    name: str
    build: Callable[[], tuple[Callable[[], Any], Callable[[Any], Any]]]
    kind: str = ""
    note: str = ""

    def __post_init__(self):
        self.kind = self.kind or impl_kind(self.name)


def _scale(x) -> float:
    return 1.0 / math.sqrt(x.workload.D)


def jfa_impls(x, schedules: Sequence[str] = (DEFAULT_SCHEDULE,), pass_: str = "fwd") -> list[Impl]:
    """Per schedule: ``jfa-<s>``, the public op as a user calls it (default arguments, the
    schedule named only where it is not the default; for the backward, its gradient through
    autograd), and for the forward ``jfa-<s>-planned``, the op with a plan built beforehand and
    ``validate=False``, as a model that shares one plan across its attention layers runs it."""
    if pass_ == "bwd":
        return [Impl(f"jfa-{s}", (lambda s=s: _backward(x, lambda xg: _jfa_op(xg, s))),
                     note="backward of the public op as called (autograd)") for s in schedules]
    out = []
    for s in schedules:
        out.append(Impl(f"jfa-{s}", (lambda s=s: _jfa_op(x, s)), note=f"public op as called, {s} schedule"))
        out.append(Impl(f"jfa-{s}-planned", (lambda s=s: _jfa_op(x, s, planned=True)),
                        note=f"public op, {s} plan built beforehand, validate=False"))
    return out


def _jfa_op(x, schedule: str, planned: bool = False):
    """The public op as a model calls it: broadcast-Q without q_offsets, the mask's own arguments
    only, everything else at its default. ``planned``: with a plan and ``validate=False``."""
    from jfa_prof.kernels.attention import jagged_flash_attention, plan_attention

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    kw: dict[str, Any] = {}
    if w.broadcast_q:
        kw["broadcast_q"] = True
    if w.window is not None:
        kw["window_size"] = w.window
    if w.causal:
        kw["causal"] = True
    if schedule != DEFAULT_SCHEDULE:
        kw["schedule"] = schedule
    if planned:
        kw["plan"] = plan_attention(x.kv_offsets, q_off, max_seq_len_q=x.q.shape[0] if w.broadcast_q else x.max_seq_len_q,
                                    H=w.H, window_size=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
                                    schedule=schedule)
        kw["validate"] = False

    def run():
        return jagged_flash_attention(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv, **kw)
    return run, lambda o: o


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


def _backward(x, forward: Callable[[Any], tuple[Callable[[], Any], Callable[[Any], Any]]]):
    """``(run, output)`` of the backward pass of ``forward`` (a builder like the forward peers'):
    the forward runs once here, on leaf copies of q, k, v, and ``run()`` is the gradient of that
    output with a fixed upstream gradient (graph kept, so it can be timed again). ``output``
    gives ``(dq, dk, dv)`` in the inputs' layout: for broadcast-Q, dq is the sum over the batch.
    What the forward saved for the backward (a repeated Q, for peers without broadcast) is in
    the setup memory; what the backward allocates (a repeated dQ) in its peak."""
    import dataclasses

    import torch

    from jfa_prof.inputs import upstream_grad

    leaves = [t.detach().clone().requires_grad_(True) for t in (x.q, x.k, x.v)]
    xg = dataclasses.replace(x, q=leaves[0], k=leaves[1], v=leaves[2])
    run_fwd, output = forward(xg)
    o = output(run_fwd())
    do = upstream_grad(x, o)

    def run():
        return torch.autograd.grad(o, leaves, do, retain_graph=True)
    return run, lambda grads: grads


def impl_names(peers: Iterable[str], schedules: Sequence[str] = (DEFAULT_SCHEDULE,), pass_: str = "fwd") -> list[str]:
    """The implementation names :func:`run_bench` times by default, in order."""
    ours = (lambda s: (f"jfa-{s}",)) if pass_ == "bwd" else (lambda s: (f"jfa-{s}", f"jfa-{s}-planned"))
    return [n for s in schedules for n in ours(s)] + [PEERS[k] for k in peers]


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------

def rel_err(out, ref, rows=None) -> float:
    """‖out − ref‖ / ‖ref‖ in fp32 over ``rows`` (all when None); NaN when out has NaN there.
    For tuples (the backward's dq, dk, dv): the worst of the parts, over all their rows."""
    if isinstance(out, (tuple, list)):
        errs = [rel_err(o, r) for o, r in zip(out, ref, strict=True)]
        return float("nan") if any(math.isnan(e) for e in errs) else max(errs)
    out, ref = out.float(), ref.float()
    if rows is not None:
        out, ref = out[rows], ref[rows]
    denom = float(ref.norm())
    return float((out - ref).norm()) / denom if denom > 0 else float((out - ref).norm())


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

def select_workloads(grid: str, labels: Sequence[str] | None = None) -> list:
    """The workloads of a SPEC §6 grid, or those of it with the given labels."""
    from jfa_prof.inputs import GRIDS

    if grid not in GRIDS:
        raise BadInputError(f"unknown grid {grid!r}", hint=f"one of {', '.join(GRIDS)}")
    ws = GRIDS[grid]
    if not labels:
        return list(ws)
    by_label = {w.label: w for w in ws}
    missing = [lab for lab in labels if lab not in by_label]
    if missing:
        raise BadInputError(f"no {grid} workload labelled {', '.join(map(repr, missing))}",
                            hint=f"labels look like {ws[0].label!r}")
    return [by_label[lab] for lab in labels]


def fwd_host_breakdown(x, *, n: int = 20, schedule: str = DEFAULT_SCHEDULE) -> dict[str, dict[str, float]]:
    """Host time per call of the work-list build, of a launch with a list built beforehand, and
    of a whole call: how much of a call is host work when kernels are short."""
    import torch

    from jfa_prof import timing
    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    n_sms = torch.cuda.get_device_properties(x.q.device).multi_processor_count

    def build():
        return fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                             block_m=fwd.BLOCK_M, window=w.window, causal=w.causal,
                             schedule=schedule, n_ctas=n_sms)

    def launch(wl):
        return fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=_scale(x), window=w.window,
                          causal=w.causal, broadcast_q=w.broadcast_q, schedule=schedule, work=wl)

    wl = build()
    return timing.host_breakdown({"work_list": build, "launch_with_list": lambda: launch(wl),
                                  "full_call": lambda: launch(None)}, n=n)


def reference_output(x, pass_: str = "fwd"):
    """The fp32 reference's output (fwd) or its gradients ``(dq, dk, dv)`` for
    `jfa_prof.inputs.upstream_grad` (bwd)."""
    import torch

    from jfa_prof.inputs import upstream_grad
    from jfa_prof.reference import reference_attention

    w = x.workload
    leaves = [t.detach().float().requires_grad_(pass_ == "bwd") for t in (x.q, x.k, x.v)]
    o = reference_attention(*leaves, None if w.broadcast_q else x.q_offsets, x.kv_offsets, sm_scale=_scale(x),
                            window_size=w.window, causal=w.causal, broadcast_q=w.broadcast_q)[0]
    if pass_ == "fwd":
        return o
    return torch.autograd.grad(o, leaves, upstream_grad(x, o).float())


def _to_float(out):
    return tuple(t.float() for t in out) if isinstance(out, (tuple, list)) else out.float()


def _measure_impl(impl: Impl, *, ref, rows, first_out, tol: float, timer, twice: bool,
                  timer_kw: dict, per_call: bool = True) -> tuple[dict[str, Any], Any, str | None]:
    """(entry, output kept for comparing the later implementations or None, reason to drop the
    implementation from later points or None)."""
    import torch

    from jfa_prof import timing

    entry: dict[str, Any] = {}
    before = torch.cuda.memory_allocated()
    run, output = impl.build()
    entry["setup_mb"] = (torch.cuda.memory_allocated() - before) / 2**20
    result = run()
    out = output(result)
    torch.cuda.synchronize()
    if ref is not None:
        err = rel_err(out, ref, rows)
        entry["rel_err_vs_ref"] = err
        if not err <= tol:  # NaN fails too
            reason = (f"wrong output on the first point: relative error {err:.3g} against the fp32 reference "
                      f"(tolerance {tol:g})")
            entry["error"] = reason
            return entry, None, reason
    entry["rel_err_vs_first"] = 0.0 if first_out is None else rel_err(out, first_out, rows)
    keep = _to_float(out) if first_out is None else None
    del result, out
    # Memory one call allocates beyond what its inputs and setup hold (workspaces, outputs).
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = run()
    torch.cuda.synchronize()
    entry["peak_mem_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    del r
    if twice:
        t = timing.time_twice(run, timer=timer, **timer_kw)
        entry["ms"], entry["ms_repeat"] = t.ms, t.ms_repeat
    else:
        entry["ms"] = timer(run, **timer_kw)
    if per_call:
        # As a training loop sees a call: host time with calls enqueued back to back, and the GPU
        # work each call puts on the device (host gaps left out).
        entry["host_us"] = timing.host_us_per_call(run)
        entry["gpu_ms"] = timing.gpu_ms(run)
    return entry, keep, None


def _derive(impls: dict[str, dict[str, Any]], flops: float) -> str | None:
    """Fill tflops and the ratios in place; returns the best peer's name."""
    timed = {n: e for n, e in impls.items() if isinstance(e.get("ms"), (int, float)) and e["ms"] > 0}
    for e in timed.values():
        e.setdefault("tflops", flops / e["ms"] / 1e9)
    peers = {n: e["ms"] for n, e in timed.items() if impl_kind(n) == "peer"}
    best = min(peers, key=peers.get) if peers else None
    fa4 = timed.get("fa4")
    for e in timed.values():
        if fa4 is not None:
            e["ratio_vs_fa4"] = fa4["ms"] / e["ms"]
        if best is not None:
            e["ratio_vs_best_peer"] = peers[best] / e["ms"]
    return best


def run_bench(workloads: Sequence, *, pass_: str = "fwd", peers: Sequence[str] = tuple(PEERS),
              schedules: Sequence[str] = (DEFAULT_SCHEDULE,), impls: Callable[[Any], list[Impl]] | None = None,
              baseline: str | None = None, rep_ms: float | None = None, warmup_ms: float | None = None,
              tol: float = DEFAULT_TOL, check_reference: bool = True, host: bool = True,
              timer: Callable[..., float] | None = None, device=None,
              on_impl: Callable[[str, str], None] | None = None,
              on_point: Callable[[dict[str, Any]], None] | None = None, limits: bool = False,
              per_call: bool = True) -> list[dict[str, Any]]:
    """Time every implementation on every workload; returns the records (without ``meta``).

    ``impls(x)`` replaces the default list (``jfa_impls(x, schedules)`` then the available
    ``peers``); ``baseline`` names the implementation timed twice (default: the first).
    ``on_impl(label, name)`` is called before each implementation, ``on_point(record)`` after
    each point. Peers that are not installed are left out here; :func:`peer_status` says why.
    ``per_call`` (default on): also take each implementation's host time per call with calls
    enqueued back to back (``host_us``: `jfa_prof.timing.host_us_per_call`) and its GPU time per
    call (``gpu_ms``, host gaps left out: `jfa_prof.timing.gpu_ms`). ``limits``: record our kernel
    (the first schedule) at each point after the timings, and keep the split of its time
    (:func:`record_split`) as ``record["time_split"]`` (it needs ``gpu_ms``).
    """
    import torch

    from jfa_prof import timing
    from jfa_prof.inputs import rows_seeing_keys, workload_dict

    check_pass(pass_)
    device = device or timing.require_gpu("the benchmark")
    timer = timer or timing.bench
    timer_kw = {k: v for k, v in (("rep_ms", rep_ms), ("warmup_ms", warmup_ms)) if v is not None}
    usable = [k for k, st in peer_status(peers).items() if st.available]
    dropped: dict[str, str] = {}
    records = []
    for n_point, w in enumerate(workloads):
        x = w.make(device)
        flops = x.flops(pass_)
        point = impls(x) if impls is not None else jfa_impls(x, schedules, pass_) + peer_impls(x, usable, pass_)
        base_name = baseline or (point[0].name if point else None)
        # The backward's gradients cover every row (rows that see no key get zero upstream gradient).
        rows = rows_seeing_keys(x) if pass_ == "fwd" else None
        ref = reference_output(x, pass_) if check_reference and n_point == 0 else None
        entries: dict[str, dict[str, Any]] = {}
        first_out = None
        for impl in point:
            if on_impl:
                on_impl(w.label, impl.name)
            if impl.name in dropped:
                entries[impl.name] = {"error": dropped[impl.name], "skipped": True}
                continue
            try:
                entry, out, reason = _measure_impl(impl, ref=ref, rows=rows, first_out=first_out, tol=tol,
                                                   timer=timer, twice=impl.name == base_name, timer_kw=timer_kw,
                                                   per_call=per_call)
            except Exception as e:  # a peer that fails is reported, not fatal
                entry, out, reason = {"error": f"{type(e).__name__}: {e}"[:500]}, None, None
            if reason:
                dropped[impl.name] = reason
            if first_out is None and out is not None:
                first_out = out
            entries[impl.name] = entry
            torch.cuda.empty_cache()  # the next implementation's setup starts from the inputs alone
        best = _derive(entries, flops)
        record = {"pass": pass_, "workload": workload_dict(x), "flops": flops, "impls": entries,
                  "best_peer": best, "baseline": base_name}
        if host and pass_ == "fwd":
            try:
                record["host_ms"] = fwd_host_breakdown(x, schedule=schedules[0] if schedules else DEFAULT_SCHEDULE)
            except Exception as e:
                record["host_ms"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if limits:
            if on_impl:
                on_impl(w.label, "recording")
            try:
                record["time_split"] = record_split(w, pass_, schedules[0] if schedules else DEFAULT_SCHEDULE)
            except Exception as e:  # the timings stand without it
                record["time_split"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        records.append(record)
        if on_point:
            on_point(record)
        del x, ref, first_out, point
        torch.cuda.empty_cache()
    return records


def record_split(workload, pass_: str, schedule: str) -> dict[str, Any]:
    """Record one launch of our kernel on ``workload`` with tile records only (level 1, the
    cheapest) and split its time (`jfa_prof.analyses.limits.time_split`)."""
    from jfa_prof.analyses.limits import time_split
    from jfa_prof.recording import record_bwd_workload, record_workload

    trace = (record_workload(workload, schedule, level=1) if pass_ == "fwd"
             else record_bwd_workload(workload, schedule, level=1))
    if trace.dropped:
        raise RuntimeError(f"{trace.dropped} tile records dropped: the split would miss them")
    split = time_split(trace.tiles, trace.n_ctas, trace.makespan_ns)
    return {"schedule": schedule, "profile_level": 1, "variant": trace.meta["kernel"]["variant"],
            "kernel_ms": trace.kernel_ms, **split.to_dict()}


def results_document(records: list[dict[str, Any]], meta: dict[str, Any],
                     peers: dict[str, PeerStatus] | None = None) -> dict[str, Any]:
    """The file :func:`load_results` reads: meta at the top and in each record (SPEC §6)."""
    return {"format": FORMAT, "meta": meta, "peers": {k: s.to_dict() for k, s in (peers or {}).items()},
            "results": [{**r, "meta": meta} for r in records]}


# ---------------------------------------------------------------------------------------------
# reading result files
# ---------------------------------------------------------------------------------------------

FRAME_COLUMNS = ("pass", "grid", "label", "B", "H", "H_kv", "D", "Lq", "max_kv", "sparsity", "broadcast_q",
                 "total_q", "total_kv", "flops", "impl", "kind", "ms", "ms_repeat", "tflops", "ratio_vs_fa4",
                 "ratio_vs_best_peer", "best_peer", "rel_err", "peak_mem_mb", "host_us", "gpu_ms", "error", "bound",
                 "floor_ms", "roof")


@dataclass
class BenchResults:
    """A result file: its top-level ``meta`` and its records, each with its own ``meta``.
    ``pool``: the records time splits are fit over (:meth:`splits`), the whole file's even after
    :meth:`filter` (None: ``records``)."""

    meta: dict[str, Any]
    records: list[dict[str, Any]]
    peers: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    pool: list[dict[str, Any]] | None = None

    @property
    def gpu(self) -> str:
        return str(self.meta.get("gpu") or "an unknown GPU")

    @property
    def date(self) -> str:
        """The day of the measurement, ``YYYY-MM-DD``."""
        return str(self.meta.get("date") or "an unknown date")[:10]

    def provenance(self) -> str:
        """How charts and tables label these numbers: where and when they were measured."""
        return f"recorded on {self.gpu} on {self.date}"

    @property
    def baseline(self) -> str | None:
        """The implementation the run compared everything with (it was timed twice)."""
        return next((r["baseline"] for r in self.records if r.get("baseline")), None)

    def impl_names(self) -> list[str]:
        """Every implementation in the file, ours first, in order of first appearance."""
        names = list(dict.fromkeys(n for r in self.records for n in r["impls"]))
        return sorted(names, key=lambda n: (impl_kind(n) != "jfa", names.index(n)))

    def spec(self):
        """The measuring GPU's entry in `jfa_prof.hardware`, or None for a GPU it does not know."""
        from jfa_prof.hardware import lookup

        return lookup(self.meta.get("gpu"))

    def rooflines(self) -> list:
        """Per record, its `jfa_prof.analyses.roofline.Roofline` on the measuring GPU (None where
        the GPU or the record's shape is unknown)."""
        from jfa_prof.analyses.roofline import roofline_of_record

        spec = self.spec()
        return [roofline_of_record(r, spec) if spec else None for r in self.records]

    def frame(self):
        """One row per (point, implementation); see :data:`FRAME_COLUMNS`. ``bound``, ``floor_ms``
        and ``roof`` (the share of the roofline reached) are empty for a GPU the hardware table
        does not know."""
        import pandas as pd

        rows = []
        for r, roof in zip(self.records, self.rooflines()):
            w = r["workload"]
            for name, e in r["impls"].items():
                rows.append({
                    "pass": r.get("pass", "fwd"), "grid": w.get("grid"), "label": w.get("label"),
                    **{k: w.get(k) for k in ("B", "H", "H_kv", "D", "Lq", "max_kv", "sparsity", "broadcast_q",
                                             "total_q", "total_kv")},
                    "flops": r.get("flops"), "impl": name, "kind": impl_kind(name),
                    "ms": e.get("ms"), "ms_repeat": e.get("ms_repeat"), "tflops": e.get("tflops"),
                    "ratio_vs_fa4": e.get("ratio_vs_fa4"), "ratio_vs_best_peer": e.get("ratio_vs_best_peer"),
                    "best_peer": r.get("best_peer"),
                    "rel_err": e.get("rel_err_vs_ref", e.get("rel_err_vs_first")),
                    "peak_mem_mb": e.get("peak_mem_mb"), "host_us": e.get("host_us"), "gpu_ms": e.get("gpu_ms"),
                    "error": e.get("error"),
                    "bound": roof.bound if roof else None, "floor_ms": roof.floor_ms if roof else None,
                    "roof": roof.fraction(e.get("ms")) if roof else None,
                })
        df = pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
        for c in ("ms", "ms_repeat", "tflops", "ratio_vs_fa4", "ratio_vs_best_peer", "rel_err", "peak_mem_mb",
                  "host_us", "gpu_ms", "floor_ms", "roof"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        return df

    def labels(self) -> list[str | None]:
        """Each record's workload label, in order."""
        return [r["workload"].get("label") for r in self.records]

    def splits(self) -> list:
        """Per record, the `jfa_prof.analyses.limits.TimeSplit` recorded with ``--limits``, or None;
        fit over every point of :attr:`pool` (the whole file) that ran the same compiled kernel, so
        a filtered view splits its points as the whole file does."""
        from jfa_prof.analyses.limits import TimeSplit, pooled

        pool = self.pool if self.pool is not None else self.records
        raw = [r.get("time_split") for r in pool]
        ok = [isinstance(s, dict) and "error" not in s for s in raw]
        fitted = pooled([TimeSplit.from_dict(s) if good else None for s, good in zip(raw, ok)],
                        [(r.get("pass", "fwd"), s.get("variant") if good else None)
                         for r, s, good in zip(pool, raw, ok)])
        by_record = {id(r): s for r, s in zip(pool, fitted)}
        return [by_record.get(id(r)) for r in self.records]

    def limits(self, splits: list | None = None) -> list:
        """Per record, `jfa_prof.analyses.limits.PointLimit` of our fastest implementation of the
        recorded schedule against FA4 at the grid's target (:data:`TARGETS`), from :meth:`splits`
        (or the ``splits`` given); None where the record has no split, no FA4 time or no target.
        GPU times per call where the run took them: a short call's median is otherwise the host's."""
        from jfa_prof.analyses.limits import point_limit

        out = []
        for r, split in zip(self.records, self.splits() if splits is None else splits):
            target = TARGETS.get((r.get("pass", "fwd"), r["workload"].get("grid")))
            fa4_entry = r["impls"].get("fa4") or {}
            key = "gpu_ms" if fa4_entry.get("gpu_ms") else "ms"
            schedule = (r.get("time_split") or {}).get("schedule")
            ours = [e[key] for n, e in r["impls"].items()
                    if n in (f"jfa-{schedule}", f"jfa-{schedule}-planned") and e.get(key)]
            fa4 = fa4_entry.get(key)
            out.append(point_limit(split, min(ours), fa4, target, timer=key) if split and ours and fa4 and target
                       else None)
        return out

    def filter(self, *, grid: str | None = None, labels: Sequence[str] | None = None,
               pass_: str | None = None) -> BenchResults:
        keep = [r for r in self.records
                if (grid is None or r["workload"].get("grid") == grid)
                and (not labels or r["workload"].get("label") in labels)
                and (pass_ is None or r.get("pass", "fwd") == pass_)]
        return BenchResults(self.meta, keep, self.peers, self.path, self.pool if self.pool is not None else self.records)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "peers": self.peers, "results": self.records}


def _check_impls(path: Path, i: int, record: dict[str, Any]) -> None:
    """Each implementation's entry must be an object with a numeric (or absent) time: a point
    with none, or a null entry, would drop out of every table without a word."""
    where = f"{path}: record {i} ({record['workload'].get('label') or 'no label'})"
    if not record["impls"]:
        raise BadInputError(f"{where} times no implementation (\"impls\" is empty)")
    for name, e in record["impls"].items():
        if not isinstance(e, dict):
            shown = "null" if e is None else type(e).__name__
            raise BadInputError(f"{where}: implementation {name!r} is {shown}, not an object with its time")
        ms = e.get("ms")
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float))):
            raise BadInputError(f"{where}: implementation {name!r} has ms {ms!r}, not a number")


def load_results(path: str | Path) -> BenchResults:
    """A bench result file, of this module's format or the earlier one (``meta`` at the top
    only, no best peer): records get the top-level ``meta``, and TFLOPS and ratios are
    filled in where the file lacks them, so both read the same."""
    path = Path(path)
    doc = read_json_file(path, "a bench result file")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BadInputError(f"{path} is not a bench result file (no \"results\" list)",
                            hint="write one with `jfa-prof bench --out FILE`")
    meta = dict(doc.get("meta") or {})
    records = []
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not isinstance(r.get("workload"), dict) or not isinstance(r.get("impls"), dict):
            raise BadInputError(f"{path}: record {i} lacks a workload or impls")
        _check_impls(path, i, r)
        r = {**r, "impls": {n: dict(e) for n, e in r["impls"].items()}}
        r.setdefault("meta", meta)
        r.setdefault("pass", "fwd")
        best = _derive(r["impls"], float(r.get("flops") or 0.0)) if r.get("flops") else None
        if r.get("best_peer") is None:
            r["best_peer"] = best
        # Earlier files name no baseline; theirs is the implementation they timed twice.
        r.setdefault("baseline", next((n for n, e in r["impls"].items() if "ms_repeat" in e), None))
        records.append(r)
    return BenchResults(meta=meta, records=records, peers=dict(doc.get("peers") or {}), path=path)
