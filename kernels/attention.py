"""The public op: `jagged_flash_attention` (SPEC §2), a torch custom op around the TLX kernels."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from jfa_prof import records
from jfa_prof.errors import BadInputError
from jfa_prof.schedule import DEFAULT_SCHEDULE, WorkList, fwd_work_list
from jfa_prof.validation import validate_attention_inputs

_NO_WINDOW = -1  # custom ops take plain ints: -1 stands for "no window"


@dataclass
class FwdLaunch:
    """What one forward launch used, kept for the instrumentation readers."""
    n_ctas: int
    n_slots: int
    layout: records.Layout | None
    work: object
    block_n: int  # keys per KV block


def _descriptor(t: torch.Tensor, block_rows: int, head_dim: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, heads, dim = t.shape
    flat = t.view(rows, heads * dim)
    return TensorDescriptor(flat, shape=[rows, heads * dim], strides=[heads * dim, 1],
                            block_shape=[block_rows, head_dim])


def fwd_launch(q, k, v, q_offsets, kv_offsets, max_seq_len_q, *, sm_scale, window, causal, broadcast_q,
               schedule=DEFAULT_SCHEDULE, peel=True, profile=False, record_capacity=None, n_ctas=None, out=None,
               lse_out=None, work=None, launch_hook=None, ablate=0, kv_stages=None, q_bufs=None, block_n=None):
    """Launch the forward kernel; returns (o, lse, record buffer or None, FwdLaunch).

    `profile` is the instrumentation level (0/False off, 1 tile records and role spans, 2/True also
    barrier waits). The record buffer is allocated here when it is on, sized for every work-list slot
    unless `record_capacity` asks for fewer (then the kernel counts what it had to drop).
    `work` reuses a work list built earlier; `launch_hook(phase)` is called with "before" and
    "after" right around the kernel launch, so a caller can time the kernel alone. `ablate` is a
    bitmask of `fwd.ABLATIONS` for the waterfall; it makes the output wrong on purpose. `kv_stages`,
    `q_bufs` and `block_n` override the K/V ring depth, the Q buffers per consumer and the keys per
    KV block, for benchmarks of the choice (a `work` list must have been built for that `block_n`)."""
    from jfa_prof.kernels import fwd

    H, D = q.shape[1], q.shape[2]
    H_kv = k.shape[1]
    B = kv_offsets.numel() - 1
    Lq = q.shape[0] if broadcast_q else None
    total_rows = B * q.shape[0] if broadcast_q else q.shape[0]
    # Callers (tests) may pass poisoned buffers so that unwritten elements show.
    o = torch.empty((total_rows, H, D), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((H, total_rows), dtype=torch.float32, device=q.device) if lse_out is None else lse_out
    if n_ctas is None:
        n_ctas = torch.cuda.get_device_properties(q.device).multi_processor_count
    built_here = work is None
    if work is None:
        work = fwd_work_list(kv_offsets, None if broadcast_q else q_offsets, Lq, H, max_seq_len_q,
                             block_m=fwd.BLOCK_M, block_n=block_n, window=window, causal=causal,
                             schedule=schedule, n_ctas=n_ctas)
    # The work list counts KV blocks of this size: the default one for its query blocks, unless
    # the caller built it (and asks here) for another.
    block_n = block_n or fwd.kv_block_n(work.n_m_blocks)
    n_slots = work.tiles.numel()
    grid = max(1, min(n_ctas, n_slots))
    queue = work.n_work  # a placeholder the static and LPT kernels never touch
    if schedule == "dynamic":
        # The kernel counts taken tiles up from zero: a list built here brings a zeroed counter,
        # a reused one (whose counter an earlier launch used up) gets a fresh one.
        fresh = built_here and work.queue is not None
        queue = work.queue if fresh else torch.zeros(1, dtype=torch.int32, device=q.device)
    layout = None
    if profile:
        cap = n_slots if record_capacity is None else record_capacity
        layout = records.Layout(tile_capacity=cap, n_ctas=grid, n_roles=len(records.FWD_ROLES),
                                n_sites=len(records.FWD_SITES))
        rec = torch.zeros(layout.total_words, dtype=torch.int64, device=q.device)
        rec[records.Header.CAPACITY] = cap
    else:
        # Never read or written at PROFILE=0: empty, so the uninstrumented call launches no memset for it.
        rec = torch.empty(1, dtype=torch.int64, device=q.device)
    q_off = kv_offsets if q_offsets is None else q_offsets
    args = (
        _descriptor(q, fwd.BLOCK_M // 2, D), _descriptor(k, block_n, D), _descriptor(v, block_n, D),
        _descriptor(o, fwd.BLOCK_M // 2, D), o, lse, q_off, kv_offsets, work.tiles, work.n_work, queue, rec,
        sm_scale, H, H // H_kv, work.n_m_blocks, Lq or 0, window if window is not None else 0, total_rows,
        layout.tiles_offset if layout else 0, layout.tile_capacity if layout else 0,
        layout.spans_offset if layout else 0, layout.waits_offset if layout else 0)
    constexprs = fwd.fwd_constexprs(head_dim=D, broadcast_q=broadcast_q, causal=causal,
                                    has_window=window is not None, peel=peel, schedule=schedule,
                                    profile=_profile_level(profile), ablate=ablate,
                                    kv_stages=kv_stages, q_bufs=q_bufs or fwd.NUM_Q_BUFS, block_n=block_n)
    if launch_hook:
        launch_hook("before")
    fwd._jfa_fwd[(grid, )](*args, **constexprs, num_warps=fwd.NUM_WARPS, num_stages=1)
    if launch_hook:
        launch_hook("after")
    return o, lse, (rec if profile else None), FwdLaunch(grid, n_slots, layout, work, block_n)


@dataclass(frozen=True)
class AttentionPlan:
    """A forward work list built once for one batch's offsets and reused by every attention layer
    that sees them (the list depends on the offsets and the mask, not on Q, K or V)."""
    work: WorkList
    schedule: str
    H: int
    window: int | None
    causal: bool
    broadcast_q: bool
    max_seq_len_q: int
    kv_offsets_ptr: int  # the plan belongs to the offsets tensor it was built from


def plan_attention(kv_offsets, q_offsets=None, *, max_seq_len_q: int, H: int, window_size=None, causal=False,
                   broadcast_q=False, schedule=DEFAULT_SCHEDULE, n_ctas=None) -> AttentionPlan:
    """Build the forward's work list on the offsets' device (no host sync) for `jagged_flash_attention(...,
    plan=)`. For broadcast-Q, `max_seq_len_q` is Lq."""
    from jfa_prof.kernels import fwd

    if n_ctas is None:
        n_ctas = torch.cuda.get_device_properties(kv_offsets.device).multi_processor_count
    work = fwd_work_list(kv_offsets, None if broadcast_q else q_offsets, max_seq_len_q if broadcast_q else None, H,
                         max_seq_len_q, block_m=fwd.BLOCK_M, window=window_size, causal=causal,
                         schedule=schedule, n_ctas=n_ctas)
    return AttentionPlan(work, schedule, H, window_size, bool(causal), bool(broadcast_q), int(max_seq_len_q),
                         kv_offsets.data_ptr())


def _check_plan(plan: AttentionPlan, kv_offsets, *, H, window_size, causal, broadcast_q, schedule,
                max_seq_len_q) -> None:
    """A plan built for other offsets, heads, mask or schedule would visit the wrong tiles."""
    if kv_offsets.data_ptr() != plan.kv_offsets_ptr:
        raise BadInputError("plan was built for another kv_offsets tensor",
                            hint="build one plan per batch with plan_attention(kv_offsets, ...) and pass that "
                                 "same kv_offsets tensor to every layer")
    wanted = {"H": H, "window": window_size, "causal": bool(causal), "broadcast_q": bool(broadcast_q),
              "schedule": schedule, "max_seq_len_q": int(max_seq_len_q)}
    for name, value in wanted.items():
        if getattr(plan, name) != value:
            raise BadInputError(f"plan was built with {name}={getattr(plan, name)!r}, this call has {name}={value!r}",
                                hint="build the plan with plan_attention(...) and the same arguments")


def _profile_level(profile) -> int:
    return 2 if profile is True else int(profile)


@torch.library.custom_op("jfa_prof::jfa_fwd", mutates_args=())
def _jfa_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                kv_offsets: torch.Tensor, max_seq_len_q: int, sm_scale: float, window: int, causal: bool,
                broadcast_q: bool, schedule: str, max_seq_len_kv: int = -1, work_tiles: torch.Tensor | None = None,
                work_n: torch.Tensor | None = None, work_m_blocks: int = 0,
                deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    # max_seq_len_kv and deterministic are for the backward: its tile bound (-1: read from the
    # offsets then) and its dQ reduction.
    # work_*: a plan's work list (tiles, n_work, query blocks per head), or None to build one here.
    work = None if work_tiles is None else WorkList(tiles=work_tiles, n_work=work_n, costs=None,
                                                    n_m_blocks=work_m_blocks)
    o, lse, _, _ = fwd_launch(q, k, v, None if broadcast_q else q_offsets, kv_offsets, max_seq_len_q,
                              sm_scale=sm_scale, window=None if window == _NO_WINDOW else window, causal=causal,
                              broadcast_q=broadcast_q, schedule=schedule, work=work)
    return o, lse


@_jfa_fwd_op.register_fake
def _(q, k, v, q_offsets, kv_offsets, max_seq_len_q, sm_scale, window, causal, broadcast_q, schedule,
      max_seq_len_kv=-1, work_tiles=None, work_n=None, work_m_blocks=0, deterministic=False):
    H, D = q.shape[1], q.shape[2]
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]
    return q.new_empty((rows, H, D)), q.new_empty((H, rows), dtype=torch.float32)


@dataclass
class BwdLaunch:
    """What one backward launch used, kept for the instrumentation readers."""
    n_ctas: int
    layout: records.Layout | None
    dq: str
    schedule: str


def _sm_count(device) -> int:
    # Triton's interpreter runs on the CPU: a few programs exercise the persistent loop there.
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 3


def bwd_launch(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, *, sm_scale, window,
               causal, broadcast_q, dk_out=None, dv_out=None, **options):
    """Launch the backward kernels; returns (dq, dk, dv) in the input dtype.

    `o` and `lse` are the forward's outputs. For broadcast-Q, dq is `[Lq, H, D]`: the sum over the
    batch. `max_seq_len_kv` bounds the tile count and must be at least every KV length (-1: read it
    from `kv_offsets`, one host sync); `max_seq_len_q` sizes the deterministic dQ grid for jagged Q
    (-1: read it from `q_offsets`). `dk_out`/`dv_out` let callers (tests) pass poisoned buffers so
    unwritten rows show. `options` are those of `bwd_launch_recorded`."""
    dq, dk, dv, _, _ = bwd_launch_recorded(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
                                           sm_scale=sm_scale, window=window, causal=causal, broadcast_q=broadcast_q,
                                           dk_out=dk_out, dv_out=dv_out, **options)
    return dq, dk, dv


def bwd_launch_recorded(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, *, sm_scale,
                        window, causal, broadcast_q, dk_out=None, dv_out=None, dq=None, dq_stages=None,
                        schedule=None, profile=0, record_capacity=None, n_ctas=None, ablate=0, block_m=None):
    """`bwd_launch` that also returns the record buffer (None unless `profile`) and a `BwdLaunch`.

    `dq`: "tma" (TMA reduce-add, `dq_stages` staging buffers; the default), "atomic" or
    "deterministic";
    `schedule`: "static" (round-robin) or "dynamic" (atomic queue); `profile`: instrumentation
    level 0/1/2; `ablate`: a bitmask of `bwd.ABLATIONS` for the waterfall, which makes the
    gradients wrong on purpose; `block_m`: query rows per inner step (default `bwd.BLOCK_M`; 32 or
    64, for benchmarks of the choice)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from jfa_prof.kernels import bwd

    dq_mode = dq or bwd.DEFAULT_DQ
    dq_stages = dq_stages or bwd.DEFAULT_DQ_STAGES
    schedule = schedule or bwd.DEFAULT_SCHEDULE
    if dq_mode not in ("tma", "atomic", "deterministic"):
        raise BadInputError(f"unknown dq reduction {dq_mode!r}", hint="tma, atomic or deterministic")
    if schedule not in bwd.SCHEDULES:
        raise BadInputError(f"unknown backward schedule {schedule!r}",
                            hint="static (round-robin) or dynamic (atomic queue)")
    if dq_stages not in (1, 2, 3):
        raise BadInputError(f"dq_stages must be 1, 2 or 3, got {dq_stages}")
    block_m = block_m or bwd.BLOCK_M
    if block_m not in (32, 64):
        raise BadInputError(f"block_m must be 32 or 64, got {block_m}")
    H, D = q.shape[1], q.shape[2]
    H_kv = k.shape[1]
    B = kv_offsets.numel() - 1
    total_rows = o.shape[0]
    rows_q = q.shape[0]
    dev = q.device
    # The kernels assume dense [rows, heads, D] layouts; autograd may hand over an expanded
    # (stride-0) gradient. For everything else these are no-ops.
    q, k, v, o, lse = (t.contiguous() for t in (q, k, v, o, lse))
    do = do.to(o.dtype).contiguous()
    if max_seq_len_kv < 0:
        max_seq_len_kv = int((kv_offsets[1:] - kv_offsets[:-1]).max()) if B > 0 else 0
    delta, tile_cum = _bwd_delta(o, do, kv_offsets)
    dk = torch.empty_like(k) if dk_out is None else dk_out
    dv = torch.empty_like(v) if dv_out is None else dv_out
    if not (dk.is_contiguous() and dv.is_contiguous() and dk.shape == k.shape and dv.shape == v.shape):
        raise ValueError("dk_out and dv_out must be contiguous and shaped like k and v")

    # dQ accumulates in fp32, [rows, H * D] (at least one row, so that the descriptor has a shape).
    rows_acc = max(rows_q, 1)
    if dq_mode == "deterministic":
        dq_acc = None
        dq_desc = TensorDescriptor(torch.empty((block_m, D), dtype=torch.float32, device=dev), shape=[block_m, D],
                                   strides=[D, 1], block_shape=[block_m, D])  # never read
    else:
        dq_acc = torch.zeros((rows_acc, H * D), dtype=torch.float32, device=dev)
        dq_desc = TensorDescriptor(dq_acc, shape=[rows_acc, H * D], strides=[H * D, 1], block_shape=[block_m, D])

    max_tiles = B * H_kv * ((max_seq_len_kv + bwd.BLOCK_N - 1) // bwd.BLOCK_N)
    grid = max(1, min(n_ctas or _sm_count(dev), max_tiles))
    queue = torch.zeros(1, dtype=torch.int32, device=dev) if schedule == "dynamic" else tile_cum
    layout = None
    if profile:
        cap = max_tiles if record_capacity is None else record_capacity
        layout = records.Layout(tile_capacity=cap, n_ctas=grid, n_roles=len(records.BWD_ROLES),
                                n_sites=len(records.BWD_SITES))
        rec = torch.zeros(layout.total_words, dtype=torch.int64, device=dev)
        rec[records.Header.CAPACITY] = cap
    else:
        rec = torch.empty(1, dtype=torch.int64, device=dev)  # never touched at PROFILE=0
    q_off = kv_offsets if q_offsets is None or broadcast_q else q_offsets
    win = window if window is not None else 0
    if max_tiles > 0:
        constexprs = bwd.bwd_constexprs(head_dim=D, broadcast_q=broadcast_q, causal=causal,
                                        has_window=window is not None, dq=dq_mode, dq_stages=dq_stages,
                                        schedule=schedule, profile=profile, ablate=ablate, block_m=block_m)
        bwd._jfa_bwd[(grid, )](_descriptor(q, block_m, D), _descriptor(k, bwd.BLOCK_N, D),
                               _descriptor(v, bwd.BLOCK_N, D), _descriptor(do, block_m, D), lse, delta,
                               dq_acc if dq_acc is not None else delta, dq_desc, dk, dv, q_off, kv_offsets,
                               tile_cum, queue, rec, sm_scale, H, H // H_kv, B,
                               rows_q if broadcast_q else 0, win, total_rows, dk.shape[1],
                               layout.tiles_offset if layout else 0, layout.tile_capacity if layout else 0,
                               layout.spans_offset if layout else 0, layout.waits_offset if layout else 0,
                               **constexprs, num_warps=bwd.NUM_WARPS, num_stages=bwd.NUM_STAGES)
    else:
        # No tiles: every dK / dV row is zero (there are none, or only empty sequences).
        dk.zero_()
        dv.zero_()
    if dq_mode == "deterministic":
        dq_acc = _deterministic_dq(q, k, v, do, lse, delta, q_off, kv_offsets, sm_scale, H, H_kv, B, rows_q,
                                   win, total_rows, max_seq_len_q, window, causal, broadcast_q)
    dq_out = dq_acc[:rows_q].view(rows_q, H, D).to(q.dtype)
    return dq_out, dk, dv, (rec if profile else None), BwdLaunch(grid, layout, dq_mode, schedule)


def _bwd_delta(o, do, kv_offsets):
    """delta = rowsum(dO * O), [H, rows] fp32, and the main kernel's tile list: KV blocks per
    sequence, prefix-summed on the device by the same kernel (no host sync)."""
    from jfa_prof.kernels import bwd

    total_rows, H, D = o.shape
    B = kv_offsets.numel() - 1
    delta = torch.empty((H, total_rows), dtype=torch.float32, device=o.device)
    tile_cum = torch.empty(B + 1, dtype=torch.int32, device=o.device)
    grid = (max(1, (total_rows + bwd.DELTA_ROWS - 1) // bwd.DELTA_ROWS), H)
    bwd._jfa_bwd_delta[grid](o, do, delta, kv_offsets, tile_cum, total_rows, H, B, **bwd.delta_constexprs(head_dim=D),
                             num_warps=bwd.DELTA_WARPS, num_stages=1)
    return delta, tile_cum


def _deterministic_dq(q, k, v, do, lse, delta, q_off, kv_offsets, sm_scale, H, H_kv, B, rows_q, win,
                      total_rows, max_seq_len_q, window, causal, broadcast_q):
    """dQ without atomics: per (query block, head, part) in a fixed order, then a fixed-order sum
    of the broadcast-Q parts. Parts split the batch so that about two programs run per SM."""
    from jfa_prof.kernels import bwd

    D = q.shape[2]
    if broadcast_q:
        n_m = -(-rows_q // bwd.DQ_BLOCK_M)
        want = max(1, -(-2 * _sm_count(q.device) // max(1, n_m * H)))
        chunk = max(1, -(-B // min(want, max(B, 1))))
        n_parts = max(1, -(-B // chunk))
    else:
        if max_seq_len_q < 0:
            max_seq_len_q = int((q_off[1:] - q_off[:-1]).max()) if B > 0 else 0
        n_m, chunk, n_parts = -(-max_seq_len_q // bwd.DQ_BLOCK_M), 1, B
    parts = torch.zeros((n_parts if broadcast_q else 1, rows_q, H * D), dtype=torch.float32, device=q.device)
    if n_m > 0 and n_parts > 0 and B > 0:
        bwd._jfa_bwd_dq[(n_m, H, n_parts)](q, k, v, do, lse, delta, parts, q_off, kv_offsets, sm_scale, H, H // H_kv, B,
                                           rows_q if broadcast_q else 0, win, total_rows, rows_q, chunk,
                                           **bwd.dq_constexprs(head_dim=D, broadcast_q=broadcast_q, causal=causal,
                                                               has_window=window is not None),
                                           num_warps=bwd.DQ_WARPS, num_stages=bwd.DET_DQ_NUM_STAGES)
    # torch's sum over a leading dimension of a fixed size is the same every run.
    return parts.sum(0) if parts.shape[0] > 1 else parts[0]


@torch.library.custom_op("jfa_prof::jfa_bwd", mutates_args=())
def _jfa_bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                do: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_seq_len_q: int,
                max_seq_len_kv: int, sm_scale: float, window: int, causal: bool,
                broadcast_q: bool, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return bwd_launch(q, k, v, o, lse, do, None if broadcast_q else q_offsets, kv_offsets, max_seq_len_q,
                      max_seq_len_kv, sm_scale=sm_scale, window=None if window == _NO_WINDOW else window,
                      causal=causal, broadcast_q=broadcast_q, dq="deterministic" if deterministic else None)


@_jfa_bwd_op.register_fake
def _(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal,
      broadcast_q, deterministic=False):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, q_offsets, kv_offsets, max_seq_len_q, sm_scale, window, causal, broadcast_q, _schedule,
     max_seq_len_kv, _work_tiles, _work_n, _work_m_blocks, deterministic) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, q_offsets, kv_offsets, o, lse)
    ctx.args = (max_seq_len_q, max_seq_len_kv, sm_scale, window, causal, broadcast_q, deterministic)
    # The log-sum-exp is returned for inspection and for the backward; no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, grad_o, _grad_lse):
    q, k, v, q_offsets, kv_offsets, o, lse = ctx.saved_tensors
    dq, dk, dv = _jfa_bwd_op(q, k, v, o, lse, grad_o, q_offsets, kv_offsets, *ctx.args)
    return (dq, dk, dv) + (None, ) * 13


_jfa_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


def jagged_flash_attention(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, *, sm_scale=None,
                           window_size=None, causal=False, broadcast_q=False, schedule=DEFAULT_SCHEDULE,
                           validate=True, return_lse=False, plan: AttentionPlan | None = None, deterministic=False):
    """Attention over packed variable-length sequences (SPEC §2).

    `deterministic=True` makes the backward give the same bits every run: dQ is summed in a
    fixed order by a kernel of its own instead of by atomic reduce-adds (slower; see kernels/bwd.py).

    `validate=False` skips the checks that read offsets values (one host sync on a GPU). `plan`
    (from `plan_attention`) reuses a work list built once for these offsets; without it the call
    builds one (a few small kernels). Both together give the kernel's own speed."""
    validate_attention_inputs(q, k, v, q_offsets, kv_offsets, broadcast_q=broadcast_q, causal=causal,
                              window_size=window_size, sm_scale=sm_scale, check_values=validate)
    if plan is not None:
        _check_plan(plan, kv_offsets, H=q.shape[1], window_size=window_size, causal=causal, broadcast_q=broadcast_q,
                    schedule=schedule, max_seq_len_q=q.shape[0] if broadcast_q else max_seq_len_q)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    q_off = q_offsets if q_offsets is not None else kv_offsets
    o, lse = _jfa_fwd_op(q, k, v, q_off, kv_offsets, int(max_seq_len_q), float(sm_scale),
                         _NO_WINDOW if window_size is None else int(window_size), bool(causal), bool(broadcast_q),
                         schedule, int(max_seq_len_kv), None if plan is None else plan.work.tiles,
                         None if plan is None else plan.work.n_work, 0 if plan is None else plan.work.n_m_blocks,
                         bool(deterministic))
    return (o, lse) if return_lse else o
