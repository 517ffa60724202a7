"""Where one call's host time goes, piece by piece, as a training loop spends it: microseconds per
call with 50 calls enqueued back to back (`jfa_prof.timing.host_us_per_call`), for the public op
as called (default arguments), its planned launch, each piece under them (argument checks, the
offsets checks, the work list, descriptors, the kernel launch, autograd), a forward+backward step,
FlashAttention-4's calls when it is importable, and what a bare launch costs on this host (an empty
Triton kernel, torch.empty), which bounds every figure above it. Also each call's do_bench median
and GPU time per call, a cProfile of the op as called, and both kernels' time with the TMA
descriptors they build themselves against host-made ones.

    python benchmarks/host_path.py --out benchmarks/results/host_path_<gpu>_<date>.json
"""
import argparse
import dataclasses
import cProfile
import io
import json
import math
import pstats
import statistics
import sys

import torch
import triton

from jfa_prof import timing
from jfa_prof.inputs import hsp_point, select_workload
from jfa_prof.kernels import attention, fwd, offsets_cache
from jfa_prof.kernels.attention import _descriptor, bwd_launch, fwd_launch, jagged_flash_attention, plan_attention
from jfa_prof.kernels.checks import check_offsets
from jfa_prof.schedule import fwd_work_list
from jfa_prof.validation import validate_attention_inputs


@triton.jit
def _empty_kernel(x):
    pass


def profile_text(fn, calls=50, top=20):
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def host_us_idle_gpu(fn, n=50):
    """Median host microseconds of one call started on an idle GPU."""
    import time

    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def fa4_calls(x):
    """FA4's forward (stride-0 Q) and forward+backward (repeated Q) on the same inputs, or {}."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError:
        return {}
    w = x.workload
    qb = x.q.unsqueeze(0).expand(w.B, *x.q.shape)
    q_rep = qb.reshape(w.B * x.q.shape[0], *x.q.shape[1:]).detach().requires_grad_()
    k, v = (t.detach().requires_grad_() for t in (x.k, x.v))
    cu_q = torch.arange(w.B + 1, device=x.q.device, dtype=torch.int32) * x.q.shape[0]

    def fwd_call():
        return flash_attn_varlen_func(q=qb, k=x.k, v=x.v, cu_seqlens_k=x.kv_offsets, max_seqlen_k=int(x.max_seq_len_kv))

    do = torch.randn(q_rep.shape, device=x.q.device, dtype=x.q.dtype)

    def step():
        o = flash_attn_varlen_func(q=q_rep, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=x.kv_offsets,
                                   max_seqlen_q=int(x.max_seq_len_q), max_seqlen_k=int(x.max_seq_len_kv))[0]
        return torch.autograd.grad(o, (q_rep, k, v), do)
    return {"fa4_fwd": fwd_call, "fa4_fwd_bwd": step}


def point(w):
    x = w.make("cuda")
    kv_off, H, D, Lq = x.kv_offsets, w.H, w.D, x.q.shape[0]
    scale = 1 / math.sqrt(D)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = plan_attention(kv_off, max_seq_len_q=Lq, H=H, broadcast_q=True)
    qg, kg, vg = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    do = torch.randn(w.B * Lq, H, D, device="cuda", dtype=x.q.dtype)
    fresh_offsets = [kv_off.clone() for _ in range(timing.HOST_CALLS + 1)]
    fresh = iter(fresh_offsets * 20)

    def op():
        return jagged_flash_attention(x.q, x.k, x.v, None, kv_off, Lq, x.max_seq_len_kv, broadcast_q=True)

    def op_new_offsets():
        # A new offsets tensor every call (a model whose batches each bring their own): checks and
        # work list run every time.
        return jagged_flash_attention(x.q, x.k, x.v, None, next(fresh), Lq, x.max_seq_len_kv, broadcast_q=True)

    def op_planned():
        return jagged_flash_attention(x.q, x.k, x.v, None, kv_off, Lq, x.max_seq_len_kv, broadcast_q=True,
                                      plan=plan, validate=False)

    def step():
        o = jagged_flash_attention(qg, kg, vg, None, kv_off, Lq, x.max_seq_len_kv, broadcast_q=True)
        return torch.autograd.grad(o, (qg, kg, vg), do)

    # One forward launch's arguments, caught on their way to the kernel: relaunching them measures
    # the launch alone (specialization key, descriptor encoding, cuLaunchKernel).
    caught = {}
    real_launch = attention._launch
    attention._launch = lambda *a: caught.setdefault("args", a) and real_launch(*a)
    try:
        op_planned()
    finally:
        attention._launch = real_launch

    o_saved, lse_saved = jagged_flash_attention(x.q, x.k, x.v, None, kv_off, Lq, x.max_seq_len_kv, broadcast_q=True,
                                                return_lse=True)

    def fwd_piece(host_descriptors):
        return lambda: fwd_launch(x.q, x.k, x.v, None, kv_off, Lq, sm_scale=scale, window=None, causal=False,
                                  broadcast_q=True, schedule="dynamic", work=plan.work,
                                  host_descriptors=host_descriptors)

    def bwd_piece(host_descriptors):
        return lambda: bwd_launch(x.q, x.k, x.v, o_saved, lse_saved, do, None, kv_off, Lq, x.max_seq_len_kv,
                                  sm_scale=scale, window=None, causal=False, broadcast_q=True,
                                  host_descriptors=host_descriptors)

    # The work list's sort alone, on as many keys as it sorts (one per tile slot).
    sort_keys = torch.randint(0, 9, (plan.work.tiles.numel(), ), device="cuda", dtype=torch.int32)
    calls = {
        "fwd_op": op,
        "fwd_op_new_offsets": op_new_offsets,
        "fwd_op_planned": op_planned,
        "fwd_bwd_step": step,
        "piece:argument_checks": lambda: validate_attention_inputs(x.q, x.k, x.v, None, kv_off, broadcast_q=True,
                                                                   causal=False, window_size=None,
                                                                   max_seq_len_q=Lq, max_seq_len_kv=x.max_seq_len_kv),
        "piece:offsets_checks": lambda: check_offsets(kv_off, None, kv_rows=x.k.shape[0], q_rows=Lq,
                                                      max_seq_len_kv=x.max_seq_len_kv, max_seq_len_q=Lq,
                                                      broadcast_q=True, Lq=Lq),
        "piece:cache_lookup": lambda: offsets_cache.lookup(kv_off, None, (H, None, False, True, "dynamic", Lq,
                                                                          x.max_seq_len_kv, Lq, x.k.shape[0])),
        "piece:work_list": lambda: fwd_work_list(kv_off, None, Lq, H, Lq, block_m=fwd.BLOCK_M, window=None,
                                                 causal=False, schedule="dynamic", n_ctas=n_sms),
        "piece:work_list_sort": lambda: torch.sort(sort_keys, descending=True, stable=True),
        # Host-made descriptors: what the kernels' own (the default) save, and what host_descriptors=True pays.
        "piece:descriptors": lambda: [_descriptor(t, 64, D) for t in (x.q, x.k, x.v, o_saved)],
        "piece:kernel_launch_prebuilt_args": lambda: real_launch(*caught["args"]),
        "piece:fwd_launch": fwd_piece(False),
        "piece:fwd_launch_host_descriptors": fwd_piece(True),
        "piece:bwd_launch": bwd_piece(False),
        "piece:bwd_launch_host_descriptors": bwd_piece(True),
        "host:empty_triton_launch": lambda: _empty_kernel[(1, )](x.q),
        "host:torch_empty": lambda: torch.empty(16, device="cuda"),
        "host:torch_add": lambda: x.q.add(1),
        **fa4_calls(x),
    }
    host_us = {name: round(timing.host_us_per_call(fn), 1) for name, fn in calls.items()}
    # The same from an idle GPU, one call at a time: where this is much lower than the figure above,
    # calls enqueued back to back wait for the GPU (a full launch queue), not for the host.
    host_us_idle = {name: round(host_us_idle_gpu(fn), 1) for name, fn in calls.items()}
    timed = {n: calls[n] for n in ("fwd_op", "fwd_op_planned", "fwd_bwd_step", "fa4_fwd", "fa4_fwd_bwd") if n in calls}
    do_bench_ms = {n: timing.bench(fn) for n, fn in timed.items()}
    gpu_ms = {n: timing.gpu_ms(fn) for n, fn in timed.items()}
    # The kernels with the descriptors they build themselves against host-made ones: kernel time
    # alone (CUPTI), alternated rounds.
    kernel_calls = {"fwd_device_descriptors": ("_jfa_fwd", fwd_piece(False)),
                    "fwd_host_descriptors": ("_jfa_fwd", fwd_piece(True)),
                    "bwd_device_descriptors": ("_jfa_bwd", bwd_piece(False)),
                    "bwd_host_descriptors": ("_jfa_bwd", bwd_piece(True))}
    kernel_rounds = {name: [] for name in kernel_calls}
    for _ in range(5):
        for name, (kernel, fn) in kernel_calls.items():
            kernel_rounds[name].append(timing.kernel_median_ms(fn, kernel))
    kernel_ms = {name: statistics.median(r) for name, r in kernel_rounds.items()}
    print("  kernel ms", {k: round(v, 4) for k, v in kernel_ms.items()}, flush=True)
    for name, us in host_us.items():
        print(f"  {name:34s} {us:8.1f} us  (idle GPU {host_us_idle[name]:8.1f})", flush=True)
    print("  do_bench ms", {k: round(v, 4) for k, v in do_bench_ms.items()}, flush=True)
    print("  gpu ms", {k: round(v, 4) for k, v in gpu_ms.items()}, flush=True)
    return {"workload": w.label, "host_us": host_us, "host_us_idle_gpu": host_us_idle, "do_bench_ms": do_bench_ms,
            "gpu_ms": gpu_ms, "kernel_ms": kernel_ms, "kernel_ms_rounds": kernel_rounds,
            "profile_fwd_op": profile_text(op), "profile_fwd_bwd_step": profile_text(step, top=30)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", nargs="*", default=["128,1024,0.1", "256,2048,0.5"],
                    help="HSP points as Lq,max_kv,sparsity")
    ap.add_argument("--batch", type=int, default=None, help="sequences per point (default: the grid's)")
    a = ap.parse_args()
    results = []
    for p in a.points:
        lq, mkv, s = hsp_point(p)
        w = select_workload("hsp", Lq=lq, max_kv=mkv, sparsity=s)
        if a.batch:
            w = dataclasses.replace(w, B=a.batch)
        print(w.label, flush=True)
        results.append(point(w))
    meta = timing.measurement_meta(" ".join(["python"] + sys.argv))
    meta["timer"] = ("host: time.perf_counter over 50 calls enqueued back to back from an idle GPU, median of 5 "
                     "rounds; do_bench median; GPU time per call from CUPTI (every kernel, copy and fill)")
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "points": results}, f, indent=1)


if __name__ == "__main__":
    main()
