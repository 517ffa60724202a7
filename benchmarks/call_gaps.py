"""Where a call's do_bench time goes on the GPU: per call, the kernels it runs and the idle time
between them, with the L2 flushed before each call (as do_bench and `jfa-prof bench` time it),
without the flush, and the call captured in a CUDA graph. The calls are timed exactly as `bench`
builds them (`jfa_prof.bench.impls`), so the figures explain the gap between a bench file's `ms`
(do_bench median) and its `gpu_ms` (the sum of the call's GPU work).

Each call is preceded by a marker kernel (`torch.cuda._sleep`) so the profiler's kernel list splits
into calls; "lead" is the time from the marker's end to the call's first kernel (the GPU idle,
waiting for the host to enqueue it), "gaps" the idle time between the call's kernels.

    python benchmarks/call_gaps.py --out FILE [--points dense 256,2048,0.5] [--passes fwd bwd]

Points as `kernel_ab.py` takes them: "LQ,MAX_KV,SPARSITY" (HSP), "jagged,MAX_KV,SPARSITY[,causal]", "dense".
"""
import argparse
import json
import statistics
import sys

import torch
import triton

from jfa_prof import timing
from jfa_prof.bench.impls import jfa_impls
from kernel_ab import point_workload  # this folder is on the path when a script here runs

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--points", nargs="+", default=["dense", "256,2048,0.5"])
ap.add_argument("--passes", nargs="+", default=["fwd", "bwd"])
ap.add_argument("--calls", type=int, default=20)
args = ap.parse_args()

MARKER = "spin_kernel"


def profiled_calls(fn, *, flush: bool, n: int):
    """Per call: event ms, lead (us), busy (us), gaps (us), span (us), the kernels (name, us)."""
    from torch.profiler import ProfilerActivity, profile

    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            if flush:
                triton.runtime.driver.active.clear_cache(cache)
            torch.cuda._sleep(100)
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    calls, cur = [], None
    for start, end, name in kernels:
        if MARKER in name:
            cur = {"marker_end": end, "kernels": []}
            calls.append(cur)
        elif cur is not None:
            cur["kernels"].append((start, end, name))
    out = []
    for i, c in enumerate(calls):
        ks = c["kernels"]
        if flush and i + 1 < len(calls):
            ks = ks[:-1]  # the next call's L2 flush, enqueued before its marker
        if not ks:
            continue
        busy = sum(e - s for s, e, _ in ks)
        span = ks[-1][1] - c["marker_end"]
        out.append({"event_ms": starts[i].elapsed_time(ends[i]), "lead_us": ks[0][0] - c["marker_end"],
                    "busy_us": busy, "gaps_us": span - busy - (ks[0][0] - c["marker_end"]), "span_us": span,
                    "kernels": [(n.split("(")[0][:60], round(e - s, 1)) for s, e, n in ks]})
    return out


def syncs(fn):
    """The synchronizing CUDA calls one call of fn makes, as torch's sync debug mode reports them."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return [str(w.message)[:200] for w in caught]


def summary(calls):
    keys = ("event_ms", "lead_us", "busy_us", "gaps_us", "span_us")
    s = {k: round(statistics.median(c[k] for c in calls), 4) for k in keys}
    s["kernels"] = calls[len(calls) // 2]["kernels"]
    return s


results = {}
for text in args.points:
    w = point_workload(text)
    x = w.make("cuda")
    for pass_ in args.passes:
        for impl in jfa_impls(x, pass_=pass_):
            run, _ = impl.build()
            key = f"{pass_} {w.label} {impl.name}"
            row = {"syncs": syncs(run), "bench_ms": timing.bench(run), "gpu_ms": timing.gpu_ms(run),
                   "flush": summary(profiled_calls(run, flush=True, n=args.calls)),
                   "noflush": summary(profiled_calls(run, flush=False, n=args.calls))}
            try:
                graphed = timing.cuda_graphed(run)
            except RuntimeError as e:  # autograd's backward replays on the forward's stream, which capture refuses
                graphed = None
                row["graphed_error"] = f"{type(e).__name__}: {e}"[:200]
            if graphed is not None:
                row["graphed_bench_ms"] = timing.bench(graphed)
                row["graphed_flush"] = summary(profiled_calls(graphed, flush=True, n=args.calls))
            row["bench_ms_repeat"] = timing.bench(run)
            results[key] = row
            print(key, json.dumps(row, default=str)[:1500], flush=True)
            del graphed, run
            torch.cuda.empty_cache()

meta = timing.measurement_meta(" ".join(["python"] + sys.argv))
meta["timer"] = ("bench_ms: do_bench median (L2 flushed before each call); gpu_ms: profiler sum of GPU work per call; "
                 f"flush / noflush / graphed_flush: {args.calls} profiled calls, each after a marker kernel, medians")
with open(args.out, "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
