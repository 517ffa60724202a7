"""Live recording: run a workload's kernel (forward or backward) with PROFILE on the GPU and keep its records.

The recorded launch is timed on its own with CUDA events (the work list and buffers are made
before the first event), so a trace's makespan can be checked against the kernel time.
"""
from __future__ import annotations

import math

from jfa_prof.errors import NoGpuError
from jfa_prof.inputs import Workload, upstream_grad, workload_dict
from jfa_prof.records import BWD_ROLES, BWD_SITES
from jfa_prof.timing import kernel_durations_ms
from jfa_prof.trace import Trace, layout_meta, trace_from_buffer

MECHANISMS = {
    "static": "persistent CTAs walk the work list in grid order",
    "lpt": "persistent CTAs walk a cost-sorted zigzag work list",
    "dynamic": "global atomic tile counter over the LPT order (Hopper has no CLC)",
}


def require_gpu():
    import torch

    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible: live recording needs an sm_90 GPU",
                         hint="record on an H100/H200 machine; heatmap, timeline, barriers and report read the "
                              "file there or here with --trace, or show the bundled H200 recordings")
    return torch.device("cuda", torch.cuda.current_device())


def record_workload(workload: Workload, schedule: str, *, peel: bool = True, warmup: int = 3,
                    record_capacity: int | None = None, level: int = 2, sample: int = 1, ablate: int = 0,
                    kv_stages: int | None = None) -> Trace:
    """One instrumented forward launch of `workload` with `schedule`, as a Trace.

    `level` 1 records tiles and warp-role spans only (cheapest); 2 adds the barrier waits; 3 adds
    an event record per warp role for every `sample`-th tile. `ablate` (a bitmask of `fwd.ABLATIONS`
    and `fwd.PLANTS`) and `kv_stages` (the K/V ring's depth) record a modified build on purpose."""
    import torch

    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    device = require_gpu()
    x = workload.make(device)
    q_off = None if workload.broadcast_q else x.q_offsets
    props = torch.cuda.get_device_properties(device)
    work = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if workload.broadcast_q else None, workload.H,
                         x.max_seq_len_q, block_m=fwd.BLOCK_M, window=workload.window,
                         causal=workload.causal, schedule=schedule, n_ctas=props.multi_processor_count)
    kwargs = dict(sm_scale=1.0 / math.sqrt(workload.D), window=workload.window, causal=workload.causal,
                  broadcast_q=workload.broadcast_q, schedule=schedule, peel=peel, profile=level,
                  record_capacity=record_capacity, work=work, sample=sample, ablate=ablate, kv_stages=kv_stages)
    for _ in range(warmup):
        fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, **kwargs)
    # The kernel's own duration comes from the profiler; the CUDA events also count the launch.
    events = {p: torch.cuda.Event(enable_timing=True) for p in ("before", "after")}
    kernel_ms, (_, _, rec, launch) = kernel_durations_ms(
        lambda: fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, **kwargs,
                           launch_hook=lambda phase: events[phase].record()), "_jfa_fwd")
    constexprs = fwd.fwd_constexprs(head_dim=workload.D, broadcast_q=workload.broadcast_q, causal=workload.causal,
                                    has_window=workload.window is not None, peel=peel, schedule=schedule,
                                    profile=level, block_n=launch.block_n, ablate=ablate, kv_stages=kv_stages,
                                    sample=sample if level >= 3 else 1)
    level_name = {v: k for k, v in fwd.PROFILE_LEVELS.items()}[level]
    variant = (f"fwd/{'bcast' if workload.broadcast_q else 'jagged'}/{workload.dtype}/d{workload.D}/{schedule}/"
               f"{'peel' if peel else 'nopeel'}/{level_name}"
               + ("" if launch.block_n == fwd.BLOCK_N else f"/n{launch.block_n}"))
    meta = _meta(x, props, "fwd", constexprs, variant, layout_meta(launch.layout), schedule, MECHANISMS[schedule],
                 level, int(launch.work.n_work.item()), kernel_ms)
    meta["launch_ms_cuda_events"] = events["before"].elapsed_time(events["after"])
    return trace_from_buffer(rec.cpu().numpy(), meta)


BWD_MECHANISMS = {
    "static": "persistent CTAs deal the valid (batch, kv head, KV block) tiles round-robin",
    "dynamic": "global atomic tile counter over the block-innermost tile list",
}


def record_bwd_workload(workload: Workload, schedule: str | None = None, *, dq: str | None = None, warmup: int = 3,
                        record_capacity: int | None = None, level: int = 2, sample: int = 1,
                        ablate: int = 0) -> Trace:
    """One instrumented backward launch of `workload` (fed by one plain forward and a fixed
    upstream gradient), as a Trace. Tiles are KV blocks; a tile's N_BLOCKS counts the query
    blocks it walked. `schedule` and `dq` (the reduction, `jfa_prof.ablations.BWD_DQ`) default to the op's;
    `level` and `sample` as in `record_workload`; `ablate` a bitmask of `bwd.ABLATIONS` / `bwd.PLANTS`."""
    import torch

    from jfa_prof.ablations import DEFAULT_DQ_NAME, bwd_dq, pass_options
    from jfa_prof.kernels import bwd
    from jfa_prof.kernels.attention import bwd_launch_recorded, fwd_launch

    schedule = pass_options("bwd", schedule, dq, broadcast_q=workload.broadcast_q)
    dq_mode, stages = bwd_dq(dq or DEFAULT_DQ_NAME)
    device = require_gpu()
    x = workload.make(device)
    w = workload
    q_off = None if w.broadcast_q else x.q_offsets
    props = torch.cuda.get_device_properties(device)
    scale = 1.0 / math.sqrt(w.D)
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=w.window,
                              causal=w.causal, broadcast_q=w.broadcast_q)
    do = upstream_grad(x, o)

    def launch():
        return bwd_launch_recorded(x.q, x.k, x.v, o, lse, do, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv,
                                   sm_scale=scale, window=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
                                   dq=dq_mode, dq_stages=stages, schedule=schedule, profile=level,
                                   record_capacity=record_capacity, sample=sample, ablate=ablate)
    for _ in range(warmup):
        launch()
    kernel_ms, (*_, rec, info) = kernel_durations_ms(launch, "_jfa_bwd")
    constexprs = bwd.bwd_constexprs(head_dim=w.D, broadcast_q=w.broadcast_q, causal=w.causal,
                                    has_window=w.window is not None, dq=dq_mode, dq_stages=stages, schedule=schedule,
                                    profile=level, ablate=ablate, sample=sample if level >= 3 else 1)
    n_tiles = int(((x.kv_lens + bwd.BLOCK_N - 1) // bwd.BLOCK_N).sum()) * w.H_kv
    variant = (f"bwd/{'bcast' if w.broadcast_q else 'jagged'}/{w.dtype}/d{w.D}/"
               f"{dq_mode}{stages if dq_mode == 'tma' else ''}/{schedule}/prof{level}")
    meta = _meta(x, props, "bwd", constexprs, variant, layout_meta(info.layout, BWD_ROLES, BWD_SITES), schedule,
                 BWD_MECHANISMS[schedule], level, n_tiles, kernel_ms)
    return trace_from_buffer(rec.cpu().numpy(), meta)


def _meta(x, props, pass_: str, constexprs: dict, variant: str, layout: dict, schedule: str, mechanism: str,
          level: int, n_work: int, kernel_ms: list[float]) -> dict:
    """A recording's metadata: layout, machine, kernel, workload, schedule, CUPTI kernel time."""
    return {
        "layout": layout,
        "gpu": {"name": props.name, "sm_count": props.multi_processor_count, "sm_clock_khz": _sm_clock_khz(),
                "capability": f"{props.major}.{props.minor}"},
        "kernel": {"name": f"_jfa_{pass_}", "pass": pass_, "config": constexprs, "variant": variant},
        "workload": {**workload_dict(x), "flops": x.flops(pass_)},
        "schedule": schedule,
        "profile_level": level,
        "schedule_mechanism": mechanism,
        "n_work": n_work,
        "kernel_ms": kernel_ms[0] if kernel_ms else None,
        "kernel_ms_source": "torch.profiler (CUPTI kernel duration)" if kernel_ms else None,
    }


def _sm_clock_khz() -> float | None:
    """The SM clock now, read through NVML when it is there (torch does not expose it)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)) * 1000.0
    except Exception:
        return None
