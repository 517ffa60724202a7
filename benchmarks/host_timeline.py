"""When the GPU gets its work in one call of the op: for the forward and the backward (autograd.grad
on a kept graph) at a few points, the host time (us after the call starts) at which each kernel launch
begins and ends, and when the op's own functions are entered and left. The GPU is kept busy by a sleep
kernel before each call, so the host never waits for it: the figures are the host path alone, median
over the calls. What they show is how much of a call's host time comes before its main kernel is
enqueued, which an idle GPU (a do_bench timing, the first layer of a step) waits for.

    python benchmarks/host_timeline.py --out FILE
"""
import argparse
import json
import statistics
import sys
import time
from dataclasses import replace

import torch
import triton

import jfa_prof.kernels.attention as att
from jfa_prof import timing
from jfa_prof.inputs import select_workload, upstream_grad

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--calls", type=int, default=40)
args = ap.parse_args()

marks = []


def _mark(label):
    marks.append((time.perf_counter(), label))


def _timed(fn, name):
    def run(*a, **k):
        _mark("start " + name)
        r = fn(*a, **k)
        _mark("end " + name)
        return r
    return run


# The kernels' launches (the op's own path and Triton's, which the checks and the work list use) and
# the op's functions, wrapped where the op looks them up at call time.
_launch = att._launch
att._launch = lambda fn, *a, **k: _timed(_launch, getattr(fn, "__name__", "?"))(fn, *a, **k)
_run = triton.runtime.jit.JITFunction.run
triton.runtime.jit.JITFunction.run = lambda self, *a, **k: _timed(_run, self.fn.__name__)(self, *a, **k)
for name in ("_forward", "_backward", "bwd_launch_recorded"):
    setattr(att, name, _timed(getattr(att, name), name))


def timeline(fn, n):
    per = {}
    for i in range(n + 5):  # the first five warm up
        torch.cuda._sleep(20_000_000)
        marks.clear()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i < 5:
            continue
        seen = {}
        for t, label in marks:
            key, j = label, 1
            while key in seen:
                j += 1
                key = f"{label} #{j}"
            seen[key] = 1e6 * (t - t0)
        seen["return"] = 1e6 * (t1 - t0)
        for key, us in seen.items():
            per.setdefault(key, []).append(us)
    torch.cuda.synchronize()
    med = {k: statistics.median(v) for k, v in per.items()}
    return {k: round(v, 1) for k, v in sorted(med.items(), key=lambda kv: kv[1])}


points = (("dense", select_workload("dense")), ("hsp Lq=256 max=2048 s=0.5", select_workload("hsp", Lq=256, max_kv=2048,
                                                                                             sparsity=0.5)),
          ("jagged max=1024 s=0.5 causal", replace(select_workload("jagged", max_kv=1024, sparsity=0.5), causal=True)))
out = {}
for label, w in points:
    x = w.make("cuda")
    kw = {"broadcast_q": True} if w.broadcast_q else {}
    if w.causal:
        kw["causal"] = True
    q_off = None if w.broadcast_q else x.q_offsets
    leaves = [t.detach().clone().requires_grad_(True) for t in (x.q, x.k, x.v)]
    o = att.jagged_flash_attention(*leaves, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv, **kw)
    do = upstream_grad(x, o)
    out[label] = {
        "fwd": timeline(lambda: att.jagged_flash_attention(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q,
                                                           x.max_seq_len_kv, **kw), args.calls),
        "bwd": timeline(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True), args.calls)}
    print(label, json.dumps(out[label], indent=1), flush=True)
meta = timing.measurement_meta(" ".join(["python"] + sys.argv))
meta["timer"] = (f"time.perf_counter around each launch and call, the GPU kept busy by torch.cuda._sleep; medians of "
                 f"{args.calls} calls after 5 warm-up calls (host time only)")
with open(args.out, "w") as f:
    json.dump({"meta": meta, "points": out}, f, indent=1)
