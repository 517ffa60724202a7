"""Live recording: run a workload's kernel with PROFILE=True on the GPU and keep its records.

The recorded launch is timed on its own with CUDA events (the work list and buffers are made
before the first event), so a trace's makespan can be checked against the kernel time.
"""
from __future__ import annotations

import math
from dataclasses import asdict

from jfa_prof.errors import NoGpuError
from jfa_prof.inputs import Workload
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
                         hint="use --trace FILE, or the bundled H200 recordings")
    return torch.device("cuda", torch.cuda.current_device())


def record_workload(workload: Workload, schedule: str, *, peel: bool = True, warmup: int = 3,
                    record_capacity: int | None = None, level: int = 2) -> Trace:
    """One instrumented forward launch of `workload` with `schedule`, as a Trace.

    `level` 1 records tiles and warp-role spans only (cheapest); 2 adds the barrier waits."""
    import torch

    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    device = require_gpu()
    x = workload.make(device)
    q_off = None if workload.broadcast_q else x.q_offsets
    props = torch.cuda.get_device_properties(device)
    work = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if workload.broadcast_q else None, workload.H,
                         x.max_seq_len_q, block_m=fwd.BLOCK_M, block_n=fwd.BLOCK_N, window=workload.window,
                         causal=workload.causal, schedule=schedule, n_ctas=props.multi_processor_count)
    kwargs = dict(sm_scale=1.0 / math.sqrt(workload.D), window=workload.window, causal=workload.causal,
                  broadcast_q=workload.broadcast_q, schedule=schedule, peel=peel, profile=level,
                  record_capacity=record_capacity, work=work)
    for _ in range(warmup):
        fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, **kwargs)
    # The kernel's own duration comes from the profiler; the CUDA events also count the launch.
    events = {p: torch.cuda.Event(enable_timing=True) for p in ("before", "after")}
    kernel_ms, (_, _, rec, launch) = kernel_durations_ms(
        lambda: fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, **kwargs,
                           launch_hook=lambda phase: events[phase].record()), "_jfa_fwd")
    constexprs = fwd.fwd_constexprs(head_dim=workload.D, broadcast_q=workload.broadcast_q, causal=workload.causal,
                                    has_window=workload.window is not None, peel=peel, schedule=schedule,
                                    profile=level)
    meta = {
        "layout": layout_meta(launch.layout),
        "gpu": {"name": props.name, "sm_count": props.multi_processor_count,
                "sm_clock_khz": _sm_clock_khz(), "capability": f"{props.major}.{props.minor}"},
        "kernel": {"name": "_jfa_fwd", "pass": "fwd", "config": constexprs,
                   "variant": f"fwd/{'bcast' if workload.broadcast_q else 'jagged'}/{workload.dtype}/"
                              f"d{workload.D}/{schedule}/{'peel' if peel else 'nopeel'}/"
                              f"{'prof' if level == 2 else 'prof-tiles'}"},
        "workload": {**asdict(workload), "label": workload.label, "total_q": x.total_q, "total_kv": x.total_kv,
                     "flops": x.flops("fwd")},
        "schedule": schedule,
        "profile_level": level,
        "schedule_mechanism": MECHANISMS[schedule],
        "n_work": int(launch.work.n_work.item()),
        "kernel_ms": kernel_ms[0] if kernel_ms else None,
        "kernel_ms_source": "torch.profiler (CUPTI kernel duration)" if kernel_ms else None,
        "launch_ms_cuda_events": events["before"].elapsed_time(events["after"]),
    }
    return trace_from_buffer(rec.cpu().numpy(), meta)


def _sm_clock_khz() -> float | None:
    """The SM clock now, read through NVML when it is there (torch does not expose it)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)) * 1000.0
    except Exception:
        return None
