"""The public op: `jagged_flash_attention` (SPEC §2), a torch custom op around the TLX kernels."""
from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jfa_prof import records
from jfa_prof.errors import BadInputError, NoGpuError
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


def tma_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` ([rows, heads, D]) itself when the kernels can read it through a 2-D TMA descriptor over
    `[rows, heads * D]` with its own row stride, else one contiguous copy. TMA needs the last
    dimension contiguous, 16-byte aligned base and row stride, and here the heads of a row packed
    back to back; views of a fused QKV / KV projection (`qkv.view(T, 3, H, D)[:, 0]`) and row slices
    qualify, permuted or stride-0 expanded tensors are copied."""
    rows, heads, dim = t.shape
    row_stride = t.stride(0)
    if (t.stride(2) == 1 and (heads == 1 or t.stride(1) == dim) and (rows <= 1 or row_stride >= heads * dim)
            and (row_stride * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0):
        return t
    # A fresh allocation: an unaligned but contiguous view would come back unchanged from .contiguous().
    return t.clone(memory_format=torch.contiguous_format)


def _row_stride(t: torch.Tensor) -> int:
    # A one-row tensor's stride(0) is arbitrary; TMA reads it as [rows, heads * D] all the same.
    rows, heads, dim = t.shape
    return t.stride(0) if rows > 1 else heads * dim


def _descriptor(t: torch.Tensor, block_rows: int, head_dim: int):
    """A host-made TMA descriptor over a `tma_ready` tensor, seen as `[rows, heads * D]` with its row
    stride (the kernels build their own unless asked for these, to compare the two)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, heads, dim = t.shape
    return TensorDescriptor(t, shape=[rows, heads * dim], strides=[_row_stride(t), 1],
                            block_shape=[block_rows, head_dim])


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[int, tuple[int, int]]:
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, (props.major, props.minor)


def _sm_count(device) -> int:
    # Triton's interpreter runs on the CPU: a few programs exercise the persistent loop there.
    return _device_facts(device.index if device.index is not None else torch.cuda.current_device())[0] \
        if device.type == "cuda" else 3


def require_hopper(device: torch.device) -> None:
    """The kernels are built for sm_90a: say so before torch or Triton fails in their own words."""
    if device.type != "cuda":
        raise NoGpuError(f"jagged_flash_attention runs on an sm_90 (Hopper) GPU; its inputs are on {device}",
                         hint="move q, k, v and the offsets to the GPU, or use jfa_prof.reference.reference_attention "
                              "on the CPU")
    major, minor = _device_facts(device.index if device.index is not None else torch.cuda.current_device())[1]
    if (major, minor) != (9, 0):
        raise NoGpuError(f"jagged_flash_attention's kernels are built for sm_90a (Hopper); {device} is "
                         f"sm_{major}{minor}")


def fwd_launch(q, k, v, q_offsets, kv_offsets, max_seq_len_q, *, sm_scale, window, causal, broadcast_q,
               schedule=DEFAULT_SCHEDULE, peel=True, profile=False, record_capacity=None, n_ctas=None, out=None,
               lse_out=None, work=None, queue=None, launch_hook=None, ablate=0, kv_stages=None, q_bufs=None,
               block_n=None, host_descriptors=False, sample=1, o_buf=None):
    """Launch the forward kernel; returns (o, lse, record buffer or None, FwdLaunch).

    q, k and v may be any strided views (`tma_ready`: read in place where TMA allows, else copied).
    `profile` is the instrumentation level (0/False off, 1 tile records and role spans, 2/True also
    barrier waits, 3 also an event record per tile and warp role, for every `sample`-th tile). The
    record buffer is allocated here when it is on, sized for every work-list slot unless
    `record_capacity` asks for fewer (then the kernel counts what it had to drop).
    `work` reuses a work list built earlier; `queue` is a zero int32 [1] tile counter for the dynamic
    schedule (default: the one a list built here brings, else a fresh one). `launch_hook(phase)` is
    called with "before" and "after" right around the kernel launch, so a caller can time the kernel
    alone. `ablate` is a bitmask of `fwd.ABLATIONS` for the waterfall, which make the output wrong on
    purpose, and of `fwd.PLANTS`, known delays that leave it right. `kv_stages`, `q_bufs` and
    `block_n` override the K/V ring depth, the Q buffers per consumer and the keys per KV block, for
    benchmarks of the choice (a `work` list must have been built for that `block_n`).
    `o_buf=False` stages the output through the Q buffers instead of buffers of its own
    (`fwd.O_BUF`), to compare the two. `host_descriptors` passes TMA descriptors made on the host
    instead of letting each CTA build its own, to compare the two. With no query rows or no keys
    nothing is launched: the output is zeros and the log-sum-exp -inf (no row sees a key), and
    FwdLaunch has n_ctas 0."""
    from jfa_prof.kernels import fwd

    H, D = q.shape[1], q.shape[2]
    H_kv = k.shape[1]
    B = kv_offsets.numel() - 1
    Lq = q.shape[0] if broadcast_q else None
    total_rows = B * q.shape[0] if broadcast_q else q.shape[0]
    # Callers (tests) may pass poisoned buffers so that unwritten elements show; one that is not
    # contiguous gets the result copied in.
    o = torch.empty((total_rows, H, D), dtype=q.dtype, device=q.device) if out is None or not out.is_contiguous() \
        else out
    lse = torch.empty((H, total_rows), dtype=torch.float32, device=q.device) if lse_out is None else lse_out
    if total_rows == 0 or k.shape[0] == 0:
        o.zero_()
        lse.fill_(float("-inf"))
        return _copied_into(out, o), lse, None, FwdLaunch(0, 0, None, work, block_n or 0)
    q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
    if n_ctas is None:
        n_ctas = _sm_count(q.device)
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
    if schedule != "dynamic":
        queue = work.n_work  # a placeholder the static and LPT kernels never touch
    elif queue is None:
        # The kernel counts taken tiles up from zero: a list built here brings a zeroed counter,
        # a reused one (whose counter an earlier launch used up) gets a fresh one.
        fresh = built_here and work.queue is not None
        queue = work.queue if fresh else torch.zeros(1, dtype=torch.int32, device=q.device)
    level = _profile_level(profile)
    layout, rec = _record_buffer(level, n_slots if record_capacity is None else record_capacity, grid,
                                 records.FWD_ROLES, records.FWD_SITES, sample, schedule == "dynamic", q.device)
    q_off = kv_offsets if q_offsets is None else q_offsets
    if host_descriptors:
        tma_args = (_descriptor(q, fwd.BLOCK_M // 2, D), _descriptor(k, block_n, D), _descriptor(v, block_n, D),
                    _descriptor(o, fwd.BLOCK_M // 2, D))
    else:  # the kernel builds them from the pointers and the row counts and strides below
        tma_args = (q, k, v, o)
    args = (
        *tma_args, o, lse, q_off, kv_offsets, work.tiles, work.n_work, queue, rec,
        sm_scale, H, H // H_kv, work.n_m_blocks, Lq or 0, window if window is not None else 0, total_rows,
        q.shape[0], _row_stride(q), k.shape[0], _row_stride(k), _row_stride(v),
        layout.tiles_offset if layout else 0, layout.tile_capacity if layout else 0,
        layout.spans_offset if layout else 0, layout.waits_offset if layout else 0)
    constexprs = _fwd_constexprs(D, broadcast_q, causal, window is not None, peel, schedule, level,
                                 ablate, kv_stages, q_bufs or fwd.NUM_Q_BUFS, block_n, sample,
                                 fwd.O_BUF if o_buf is None else bool(o_buf))
    if launch_hook:
        launch_hook("before")
    _launch(fwd._jfa_fwd, (grid, ), args, constexprs, fwd.NUM_WARPS, 1, q.device)
    if launch_hook:
        launch_hook("after")
    return _copied_into(out, o), lse, (rec if profile else None), FwdLaunch(grid, n_slots, layout, work, block_n)


def _launch(jit_fn, grid, args, constexprs, num_warps, num_stages, device) -> None:
    if device.type != "cuda":  # Triton's interpreter
        jit_fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
        return
    from jfa_prof.kernels.launch import launch

    launch(jit_fn, grid, args, constexprs, num_warps=num_warps, num_stages=num_stages, device_index=device.index,
           stream=torch._C._cuda_getCurrentRawStream(device.index))


@functools.lru_cache(maxsize=None)
def _unused_records(device: torch.device) -> torch.Tensor:
    # The record buffer argument of an uninstrumented launch, never read or written: one per
    # device, so such a call allocates nothing for it.
    return torch.empty(1, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=256)
def _fwd_constexprs(head_dim, broadcast_q, causal, has_window, peel, schedule, profile, ablate, kv_stages, q_bufs,
                    block_n, sample, o_buf) -> dict:
    # A dict per distinct launch configuration, built once: the call passes it on unchanged.
    from jfa_prof.kernels import fwd

    return fwd.fwd_constexprs(head_dim=head_dim, broadcast_q=broadcast_q, causal=causal, has_window=has_window,
                              peel=peel, schedule=schedule, profile=profile, ablate=ablate, kv_stages=kv_stages,
                              q_bufs=q_bufs, block_n=block_n, sample=sample if profile >= 3 else 1, o_buf=o_buf)


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
    # The offsets it was built from: weak references and their version counters, so that another
    # tensor (even one the allocator put at the same address) or an in-place change is refused.
    offsets: tuple = ()


def plan_attention(kv_offsets, q_offsets=None, *, max_seq_len_q: int, H: int, window_size=None, causal=False,
                   broadcast_q=False, schedule=DEFAULT_SCHEDULE, n_ctas=None) -> AttentionPlan:
    """Build the forward's work list on the offsets' device (no host sync) for `jagged_flash_attention(...,
    plan=)`. For broadcast-Q, `max_seq_len_q` is Lq."""
    from jfa_prof.kernels import fwd

    if n_ctas is None:
        n_ctas = _sm_count(kv_offsets.device)
    work = fwd_work_list(kv_offsets, None if broadcast_q else q_offsets, max_seq_len_q if broadcast_q else None, H,
                         max_seq_len_q, block_m=fwd.BLOCK_M, window=window_size, causal=causal,
                         schedule=schedule, n_ctas=n_ctas)
    return AttentionPlan(work, schedule, H, window_size, bool(causal), bool(broadcast_q), int(max_seq_len_q),
                         _identity(kv_offsets, None if broadcast_q else q_offsets))


def _identity(kv_offsets, q_offsets) -> tuple:
    from jfa_prof.kernels.offsets_cache import version

    return tuple((weakref.ref(t), version(t)) if t is not None else None for t in (kv_offsets, q_offsets))


def _check_plan(plan: AttentionPlan, kv_offsets, q_offsets, *, H, window_size, causal, broadcast_q, schedule,
                max_seq_len_q) -> None:
    """A plan built for other offsets, heads, mask or schedule would visit the wrong tiles."""
    from jfa_prof.kernels.offsets_cache import version

    given = (kv_offsets, None if broadcast_q else q_offsets)
    for name, t, built in zip(("kv_offsets", "q_offsets"), given, plan.offsets):
        if (t is None) != (built is None) or (t is not None and built[0]() is not t):
            raise BadInputError(f"plan was built for another {name} tensor",
                                hint="build one plan per batch with plan_attention(kv_offsets, ...) and pass that "
                                     "same offsets tensor to every layer")
        if t is not None and version(t) != built[1]:
            raise BadInputError(f"{name} was changed in place after its plan was built",
                                hint="build the plan again with plan_attention(...) after changing the offsets")
    wanted = {"H": H, "window": window_size, "causal": bool(causal), "broadcast_q": bool(broadcast_q),
              "schedule": schedule, "max_seq_len_q": int(max_seq_len_q)}
    for name, value in wanted.items():
        if getattr(plan, name) != value:
            raise BadInputError(f"plan was built with {name}={getattr(plan, name)!r}, this call has {name}={value!r}",
                                hint="build the plan with plan_attention(...) and the same arguments")


def _profile_level(profile) -> int:
    return 2 if profile is True else int(profile)


def _record_buffer(level, tile_capacity, n_ctas, roles, sites, sample, dynamic, device):
    """(Layout, zeroed record buffer) for an instrumented launch; (None, a placeholder) at level 0.
    Below level 3 the event section is empty; at 3 it has a slot per role of every sample-th tile
    (by list position)."""
    if not level:
        return None, _unused_records(device)
    if level >= 3 and (not isinstance(sample, int) or sample < 1):
        raise ValueError(f"sample must be a positive integer (record every Nth tile), got {sample!r}")
    if level >= 3 and not dynamic and math.gcd(sample, n_ctas) != 1:
        # Dealt round-robin, CTA c takes list positions c, c + n_ctas, ...: with a sample sharing a
        # factor with n_ctas, most CTAs would never reach a recorded position.
        ok = next(n for n in range(sample, sample + n_ctas + 1) if math.gcd(n, n_ctas) == 1)
        raise ValueError(f"sample {sample} shares a factor with the launch's {n_ctas} CTAs: under a static "
                         f"schedule whole CTAs would have no record; use one coprime to {n_ctas}, e.g. {ok}")
    events = records.Layout.event_capacity_for(tile_capacity, len(roles), sample) if level >= 3 else 0
    layout = records.Layout(tile_capacity=tile_capacity, n_ctas=n_ctas, n_roles=len(roles), n_sites=len(sites),
                            event_capacity=events)
    rec = torch.zeros(layout.total_words, dtype=torch.int64, device=device)
    # Header words by fill kernels: `rec[i] = value` copies from pageable host memory, which waits
    # for the GPU to drain, so the kernel then starts on an idle GPU, and that alone made the
    # forward 2-3% slower at short-tile points on the H200
    # (benchmarks/results/instrumentation/idle_start_*).
    _fill_word(rec, records.Header.CAPACITY, tile_capacity)
    _fill_word(rec, records.Header.SAMPLE, sample if level >= 3 else 1)
    return layout, rec


def _fill_word(t: torch.Tensor, i: int, value: int) -> None:
    t.narrow(0, int(i), 1).fill_(value)


def _on_device(fn):
    """Run `fn` with q's GPU current, as Triton's launches (and compiles) use the current device."""
    @functools.wraps(fn)
    def run(q, *args):
        if q.device.type == "cuda" and q.device.index != torch.cuda.current_device():
            with torch.cuda.device(q.device):
                return fn(q, *args)
        return fn(q, *args)
    return run


@_on_device
def _forward(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal, broadcast_q,
             schedule, work, validate, eager):
    """The op's forward on real tensors, shared by the eager path and the custom op: the offsets
    checks (on the device), the work list (a plan's, or one built here, kept for these offsets where
    that is safe: eager broadcast-Q, see `offsets_cache`), the launch. `window` is None or an int."""
    from jfa_prof.kernels import fwd, offsets_cache

    require_hopper(q.device)
    Lq = q.shape[0] if broadcast_q else 0
    key = (q.shape[1], window, causal, broadcast_q, schedule, max_seq_len_q, max_seq_len_kv, q.shape[0], k.shape[0])
    entry = offsets_cache.lookup(kv_offsets, q_offsets, key, keep=eager and broadcast_q)
    if validate:
        # Every call, also where the work list is reused: a write that bypasses the version counter
        # can change the values, and a few microseconds of checks cost less than a wrong answer.
        from jfa_prof.kernels.checks import check_offsets

        check_offsets(kv_offsets, q_offsets, kv_rows=k.shape[0], q_rows=q.shape[0],
                      max_seq_len_kv=max_seq_len_kv if max_seq_len_kv >= 0 else 2**31 - 1,
                      max_seq_len_q=max_seq_len_q, broadcast_q=broadcast_q, Lq=Lq)
    jagged_q = None if broadcast_q else q_offsets
    nonempty = q.shape[0] > 0 and k.shape[0] > 0  # else fwd_launch writes zeros and launches nothing
    queue = None
    if work is None and nonempty:
        if entry.work is None:
            entry.work = fwd_work_list(kv_offsets, jagged_q, Lq or None, q.shape[1], max_seq_len_q,
                                       block_m=fwd.BLOCK_M, window=window, causal=causal, schedule=schedule,
                                       n_ctas=_sm_count(q.device))
            queue = entry.work.queue  # zeroed with the list
        work = entry.work
    if nonempty and schedule == "dynamic" and queue is None:
        # A plan's list or one kept from an earlier call: a counter from the entry's block of zeros.
        queue = entry.counter(q.device)
    o, lse, _, _ = fwd_launch(q, k, v, jagged_q, kv_offsets, max_seq_len_q, sm_scale=sm_scale, window=window,
                              causal=causal, broadcast_q=broadcast_q, schedule=schedule, work=work, queue=queue)
    return o, lse


@_on_device
def _backward(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal,
              broadcast_q, deterministic):
    require_hopper(q.device)
    return bwd_launch(q, k, v, o, lse, do, None if broadcast_q else q_offsets, kv_offsets, max_seq_len_q,
                      max_seq_len_kv, sm_scale=sm_scale, window=window, causal=causal, broadcast_q=broadcast_q,
                      dq="deterministic" if deterministic else None)


# ---------------------------------------------------------------------------------------------
# The custom ops: what torch.compile sees. Eager calls skip their dispatch (see _Attention).
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("jfa_prof::jfa_fwd", mutates_args=())
def _jfa_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor | None,
                kv_offsets: torch.Tensor, max_seq_len_q: int, sm_scale: float, window: int, causal: bool,
                broadcast_q: bool, schedule: str, max_seq_len_kv: int = -1, work_tiles: torch.Tensor | None = None,
                work_n: torch.Tensor | None = None, work_m_blocks: int = 0,
                deterministic: bool = False, validate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    # max_seq_len_kv and deterministic are for the backward: its tile bound (-1: read from the
    # offsets then) and its dQ reduction.
    # work_*: a plan's work list (tiles, n_work, query blocks per head), or None to build one here.
    work = None if work_tiles is None else WorkList(tiles=work_tiles, n_work=work_n, costs=None,
                                                    n_m_blocks=work_m_blocks)
    # Under torch.compile a buffer may come back with new contents and the same version: nothing kept.
    return _forward(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale,
                    None if window == _NO_WINDOW else window, causal, broadcast_q, schedule, work, validate, False)


@_jfa_fwd_op.register_fake
def _(q, k, v, q_offsets, kv_offsets, max_seq_len_q, sm_scale, window, causal, broadcast_q, schedule,
      max_seq_len_kv=-1, work_tiles=None, work_n=None, work_m_blocks=0, deterministic=False, validate=False):
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
                        schedule=None, profile=0, record_capacity=None, n_ctas=None, ablate=0, block_m=None,
                        host_descriptors=False, sample=1):
    """`bwd_launch` that also returns the record buffer (None unless `profile`) and a `BwdLaunch`.

    `dq`: "tma" (TMA reduce-add, `dq_stages` staging buffers; the default), "atomic" or
    "deterministic";
    `schedule`: "static" (round-robin) or "dynamic" (atomic queue), default `bwd.default_schedule`
    (round-robin for broadcast-Q, the queue for jagged Q); `profile`: instrumentation
    level 0/1/2/3 (3: event records for every `sample`-th tile);
    `ablate`: a bitmask of `bwd.ABLATIONS` for the waterfall, which make the
    gradients wrong on purpose, and of `bwd.PLANTS`, known delays that leave them right; `block_m`: query rows per inner step (default `bwd.BLOCK_M`; 32 or
    64, for benchmarks of the choice); `host_descriptors`: TMA descriptors made on the host instead
    of in the kernel, to compare the two."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from jfa_prof.kernels import bwd

    dq_mode = dq or bwd.DEFAULT_DQ
    dq_stages = dq_stages or bwd.DEFAULT_DQ_STAGES
    schedule = schedule or bwd.default_schedule(broadcast_q)
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
    for name, given, like, like_name in (("dk_out", dk_out, k, "k"), ("dv_out", dv_out, v, "v")):
        if given is not None and given.shape != like.shape:
            raise ValueError(f"{name} must be shaped like {like_name}: {tuple(given.shape)} != {tuple(like.shape)}")
    # dK / dV are written row-major, by TMA (which needs a 16-byte aligned start); a given buffer that
    # is not either gets the result copied in.
    dk = dk_out if _tma_writable(dk_out) else torch.empty(k.shape, dtype=k.dtype, device=dev)
    dv = dv_out if _tma_writable(dv_out) else torch.empty(v.shape, dtype=v.dtype, device=dev)
    if rows_q == 0 or k.shape[0] == 0 or total_rows == 0:
        # No query row sees a key: every gradient is zero, and nothing is launched.
        dk.zero_()
        dv.zero_()
        dq_out = torch.zeros(q.shape, dtype=q.dtype, device=dev)
        return (dq_out, _copied_into(dk_out, dk), _copied_into(dv_out, dv), None,
                BwdLaunch(0, None, dq_mode, schedule))
    # Q, K, V are read through TMA in place where their strides allow (`tma_ready`); O, dO and the
    # log-sum-exp by pointer, row-major (autograd may hand over an expanded, stride-0 gradient).
    # For the usual layouts these are no-ops.
    q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
    o, lse = o.contiguous(), lse.contiguous()
    do = do.to(o.dtype).contiguous()
    if max_seq_len_kv < 0:
        max_seq_len_kv = int((kv_offsets[1:] - kv_offsets[:-1]).max()) if B > 0 else 0
    # dQ accumulates in fp32, [rows, H * D] (rows_q > 0 here); the delta kernel zeroes it and the
    # dynamic schedule's counter.
    dq_acc = None if dq_mode == "deterministic" else torch.empty((rows_q, H * D), dtype=torch.float32, device=dev)
    queue = torch.empty(1, dtype=torch.int32, device=dev) if schedule == "dynamic" else None
    delta, tile_cum = _bwd_delta(o, do, kv_offsets, dq_acc, queue)

    max_tiles = B * H_kv * ((max_seq_len_kv + bwd.BLOCK_N - 1) // bwd.BLOCK_N)
    grid = max(1, min(n_ctas or _sm_count(dev), max_tiles))
    if queue is None:
        queue = tile_cum  # a placeholder the static kernel never touches
    layout, rec = _record_buffer(int(profile), max_tiles if record_capacity is None else record_capacity, grid,
                                 records.BWD_ROLES, records.BWD_SITES, sample, schedule == "dynamic", dev)
    q_off = kv_offsets if q_offsets is None or broadcast_q else q_offsets
    win = window if window is not None else 0
    if max_tiles > 0:
        constexprs = bwd.bwd_constexprs(head_dim=D, broadcast_q=broadcast_q, causal=causal,
                                        has_window=window is not None, dq=dq_mode, dq_stages=dq_stages,
                                        schedule=schedule, profile=profile, ablate=ablate, block_m=block_m,
                                        sample=sample if int(profile) >= 3 else 1)
        dq_ptr = dq_acc if dq_acc is not None else delta  # deterministic: never read
        if host_descriptors:
            tma_args = (_descriptor(q, block_m, D), _descriptor(k, bwd.BLOCK_N, D), _descriptor(v, bwd.BLOCK_N, D),
                        _descriptor(do, block_m, D))
            dq_arg = dq_ptr if dq_acc is None else TensorDescriptor(dq_acc, shape=[rows_q, H * D], strides=[H * D, 1],
                                                                   block_shape=[block_m, D])
        else:  # the kernel builds them from the pointers and the row counts and strides below
            tma_args, dq_arg = (q, k, v, do), dq_ptr
        args = (*tma_args, lse, delta, dq_ptr, dq_arg, dk, dv,
                q_off, kv_offsets, tile_cum, queue, rec, sm_scale, H, H // H_kv, B, rows_q if broadcast_q else 0, win,
                total_rows, dk.shape[1], rows_q, _row_stride(q), k.shape[0], _row_stride(k), _row_stride(v),
                layout.tiles_offset if layout else 0, layout.tile_capacity if layout else 0,
                layout.spans_offset if layout else 0, layout.waits_offset if layout else 0)
        _launch(bwd._jfa_bwd, (grid, ), args, constexprs, bwd.NUM_WARPS, bwd.NUM_STAGES, dev)
    else:
        # No tiles: every dK / dV row is zero (there are none, or only empty sequences).
        dk.zero_()
        dv.zero_()
    if dq_mode == "deterministic":
        # This kernel reads Q, K and V by pointer, row-major.
        dq_acc = _deterministic_dq(q.contiguous(), k.contiguous(), v.contiguous(), do, lse, delta, q_off, kv_offsets,
                                   sm_scale, H, H_kv, B, rows_q, win, total_rows, max_seq_len_q, window, causal,
                                   broadcast_q)
    dq_out = dq_acc[:rows_q].view(rows_q, H, D).to(q.dtype)
    return (dq_out, _copied_into(dk_out, dk), _copied_into(dv_out, dv), (rec if profile else None),
            BwdLaunch(grid, layout, dq_mode, schedule))


def _tma_writable(t) -> bool:
    return t is not None and t.is_contiguous() and t.data_ptr() % 16 == 0


def _copied_into(given, result):
    """`result`, copied into the caller's buffer `given` where one was given and is not it."""
    if given is None or given is result:
        return result
    given.copy_(result)
    return given


def _bwd_delta(o, do, kv_offsets, dq_acc, queue):
    """delta = rowsum(dO * O), [H, rows] fp32, and the main kernel's tile list: KV blocks per
    sequence, prefix-summed on the device by the same kernel (no host sync). The same kernel
    zeroes `dq_acc` ([rows_q, H * D] fp32, rows_q <= rows) and `queue` where they are given."""
    from jfa_prof.kernels import bwd

    total_rows, H, D = o.shape
    B = kv_offsets.numel() - 1
    delta = torch.empty((H, total_rows), dtype=torch.float32, device=o.device)
    tile_cum = torch.empty(B + 1, dtype=torch.int32, device=o.device)
    grid = (max(1, (total_rows + bwd.DELTA_ROWS - 1) // bwd.DELTA_ROWS), H)
    dq_rows = 0 if dq_acc is None else dq_acc.shape[0]
    _launch(bwd._jfa_bwd_delta, grid,
            (o, do, delta, kv_offsets, tile_cum, delta if dq_acc is None else dq_acc,
             tile_cum if queue is None else queue, total_rows, H, B, dq_rows, int(queue is not None)),
            bwd.delta_constexprs(head_dim=D), bwd.DELTA_WARPS, 1, o.device)
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
                do: torch.Tensor, q_offsets: torch.Tensor | None, kv_offsets: torch.Tensor, max_seq_len_q: int,
                max_seq_len_kv: int, sm_scale: float, window: int, causal: bool,
                broadcast_q: bool, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale,
                     None if window == _NO_WINDOW else window, causal, broadcast_q, deterministic)


@_jfa_bwd_op.register_fake
def _(q, k, v, o, lse, do, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal,
      broadcast_q, deterministic=False):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, q_offsets, kv_offsets, max_seq_len_q, sm_scale, window, causal, broadcast_q, _schedule,
     max_seq_len_kv, _work_tiles, _work_n, _work_m_blocks, deterministic, _validate) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, q_offsets, kv_offsets, o, lse)
    ctx.args = (max_seq_len_q, max_seq_len_kv, sm_scale, window, causal, broadcast_q, deterministic)
    # The log-sum-exp is returned for inspection and for the backward; no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, grad_o, _grad_lse):
    q, k, v, q_offsets, kv_offsets, o, lse = ctx.saved_tensors
    dq, dk, dv = _jfa_bwd_op(q, k, v, o, lse, grad_o, q_offsets, kv_offsets, *ctx.args)
    return (dq, dk, dv) + (None, ) * 14


_jfa_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path: the same forward and backward as the custom ops, without their dispatch
    (in eager mode it costs more host time than a short kernel runs: benchmarks/host_path.py)."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal,
                broadcast_q, schedule, work, deterministic, validate):
        o, lse = _forward(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, sm_scale, window, causal,
                          broadcast_q, schedule, work, validate, True)
        ctx.save_for_backward(q, k, v, q_offsets, kv_offsets, o, lse)
        ctx.args = (max_seq_len_q, max_seq_len_kv, sm_scale, window, causal, broadcast_q, deterministic)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, _grad_lse):
        q, k, v, q_offsets, kv_offsets, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, grad_o, q_offsets, kv_offsets, *ctx.args)
        return (dq, dk, dv) + (None, ) * 12


def _traced(t) -> bool:
    """Inputs that only describe tensors (torch.compile, fake tensors): the custom op's path."""
    return torch.compiler.is_compiling() or isinstance(t, FakeTensor)


def jagged_flash_attention(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, *, sm_scale=None,
                           window_size=None, causal=False, broadcast_q=False, schedule=DEFAULT_SCHEDULE,
                           validate=True, return_lse=False, plan: AttentionPlan | None = None, deterministic=False):
    """Attention over packed variable-length sequences (SPEC §2).

    q, k and v may be views with any strides (of a fused QKV or KV projection, slices, permutes):
    they are read in place where TMA allows and copied once otherwise.

    `validate` (default on) checks the offsets values on the GPU, in the call's stream, without
    waiting for it: offsets start at 0, never decrease, end at the rows of k (and q), no sequence is
    longer than `max_seq_len_q` / `max_seq_len_kv`. A broken rule fails a device assertion naming it,
    reported by CUDA at the next synchronization (`jfa_prof.kernels.checks`). Shapes, dtypes and the
    other arguments are checked on the host at once. For broadcast-Q in eager mode the work list is
    kept for the offsets tensor and reused by later calls that pass the same tensor unchanged (every
    layer of a model): `jfa_prof.kernels.offsets_cache`, which says why only there. `plan` (from
    `plan_attention`) gives a work list explicitly; it is refused for other or changed offsets.

    `deterministic=True` makes the backward give the same bits every run: dQ is summed in a
    fixed order by a kernel of its own instead of by atomic reduce-adds (slower; see kernels/bwd.py)."""
    validate_attention_inputs(q, k, v, q_offsets, kv_offsets, broadcast_q=broadcast_q, causal=causal,
                              window_size=window_size, sm_scale=sm_scale, max_seq_len_q=max_seq_len_q,
                              max_seq_len_kv=max_seq_len_kv, schedule=schedule)
    if plan is not None and not _traced(q):
        _check_plan(plan, kv_offsets, q_offsets, H=q.shape[1], window_size=window_size, causal=causal,
                    broadcast_q=broadcast_q, schedule=schedule,
                    max_seq_len_q=q.shape[0] if broadcast_q else max_seq_len_q)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    window = None if window_size is None else int(window_size)
    if _traced(q):
        o, lse = _jfa_fwd_op(q, k, v, q_offsets, kv_offsets, int(max_seq_len_q), float(sm_scale),
                             _NO_WINDOW if window is None else window, bool(causal), bool(broadcast_q),
                             schedule, int(max_seq_len_kv), None if plan is None else plan.work.tiles,
                             None if plan is None else plan.work.n_work, 0 if plan is None else plan.work.n_m_blocks,
                             bool(deterministic), bool(validate))
    else:
        require_hopper(q.device)
        args = (q, k, v, q_offsets, kv_offsets, int(max_seq_len_q), int(max_seq_len_kv), float(sm_scale), window,
                bool(causal), bool(broadcast_q), schedule, None if plan is None else plan.work, bool(deterministic),
                bool(validate))
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            o, lse = _Attention.apply(*args)
        else:
            o, lse = _forward(*args[:12], args[12], args[14], True)
    return (o, lse) if return_lse else o
